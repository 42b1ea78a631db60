"""Training distilled draft models for the embedded targets: ``specops distill``. The drafts
(classes, loading, the shipped ones) are run-time code in :mod:`specops.draft_models` and
:mod:`specops.models`; this package re-exports their loaders."""
from ..draft_models import DRAFTS_DIR, SUFFIX, SubsetLMHead, load_draft_dir, shipped_draft_dir
from ..models import load_draft, load_draft_path, target_embedding
from .cli import add_arguments, main, run_args
from .pipeline import UnsupportedTarget, run

__all__ = ["main", "add_arguments", "run_args", "run", "load_draft", "load_draft_dir", "load_draft_path",
           "shipped_draft_dir", "target_embedding", "SubsetLMHead", "UnsupportedTarget", "DRAFTS_DIR", "SUFFIX"]
