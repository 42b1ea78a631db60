"""Distilled draft models for the embedded targets: ``specops distill`` and the shipped drafts.

``load_draft("smollm2-135m-draft")`` loads the draft that ships in ``specops/drafts/`` onto its
target's embedding (read from the target's converted cache, created on first use).
"""
import os

from .cli import add_arguments, main, run_args
from .model import SubsetLMHead, load_draft_dir
from .pipeline import UnsupportedTarget, run

DRAFTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "drafts")
SUFFIX = "-draft"


def shipped_draft_dir(name):
    """The package folder of the shipped draft ``name`` ("<target>-draft"), or None if none ships."""
    path = os.path.join(DRAFTS_DIR, name)
    return path if os.path.exists(os.path.join(path, "model.safetensors")) else None


def target_embedding(target):
    """The embedded target's input embedding [V, H] and tokenizer, from its converted cache."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from .. import models

    dest = os.path.join(models.cache_dir(), target)
    weights = os.path.join(dest, "model.safetensors")
    if not os.path.exists(weights):
        models.load(target)  # converts the GGUF into the cache once
    with safe_open(weights, framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    with models._quiet():
        tok = AutoTokenizer.from_pretrained(dest)
    return emb, tok


def load_draft(name="smollm2-135m-draft", dtype=None):
    """Loads a shipped draft by name. Returns ``(model, tokenizer)`` (the target's tokenizer).

    ``dtype``: a torch dtype or "bf16"/"fp32" (default bf16; use the target's dtype)."""
    import torch

    from .. import models

    if not name.endswith(SUFFIX):
        raise ValueError(f"a distilled draft name ends in {SUFFIX!r}, got {name!r}")
    target = name[: -len(SUFFIX)]
    path = shipped_draft_dir(name)
    if path is None:
        shipped = sorted(d for d in os.listdir(DRAFTS_DIR) if shipped_draft_dir(d)) if os.path.isdir(DRAFTS_DIR) else []
        raise ValueError(f"no distilled draft ships for {target!r} (shipped: {', '.join(shipped) or 'none'}); "
                         f"train one with: specops distill --target {target} --out DIR")
    emb, tok = target_embedding(target)
    model = load_draft_dir(path, emb, dtype=models.resolve_dtype(dtype, torch.bfloat16))
    model.specops_name = name
    return model, tok


def load_draft_path(path, dtype=None):
    """A draft directory exported by ``specops distill`` (``OUT/draft``), onto the embedding of the
    target it records (an embedded name, or the HF model directory it was trained against).
    Returns ``(model, tokenizer)``."""
    import torch

    from .. import models
    from .model import read_config

    _, meta = read_config(path)
    target = meta.get("target")
    if target and models.is_embedded_name(target):
        emb, tok = target_embedding(target)
    elif target and os.path.isdir(target):
        tmodel, tok = models.load_path(target, torch.float32)
        emb = tmodel.get_input_embeddings().weight.detach()
    else:
        raise ValueError(f"the draft in {path} was trained against {target!r}, which is neither an embedded "
                         f"target nor a model directory here; load it with load_draft_dir(path, embedding)")
    model = load_draft_dir(path, emb, dtype=models.resolve_dtype(dtype, torch.bfloat16))
    model.specops_name = path
    return model, tok


__all__ = ["main", "add_arguments", "run_args", "run", "load_draft", "load_draft_dir", "load_draft_path",
           "shipped_draft_dir", "SubsetLMHead", "UnsupportedTarget"]
