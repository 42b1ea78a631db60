"""specops: kernels for speculative decoding of LLMs (torch / CPU C++ / Triton / CUDA C++ backends).
``python -m specops`` prints which backends are available here and why."""
from . import extension  # noqa: F401  (loads the compiled extensions and their op registrations)
from .backend import BackendUnavailable, CallUnsupported, available, default_backend, use_backend
from .ops.tree_attention import tree_attention, tree_attention_paged
from .ops.kv_compact import kv_compact, kv_compact_paged
from .ops.layout import KvLayout
from .ops.linear import linear
from .ops.token_bitmask import apply_token_bitmask
from .ops.kv_compact.plan import KVCompactPlan
from .ops.sampling import warp_probs
from .ops.topn import select_topn_subtree, topn_expand
from .ops.tree_attention.plan import TreeAttentionPlan
from .ops.tree_mask import build_tree_mask, pack_mask, unpack_mask
from .ops.verify import verify_greedy, verify_joint, verify_tree
from .ops.verify.logits import verify_joint_logits, verify_tree_logits
from .integrations import flashinfer as _flashinfer  # noqa: F401  (registers the optional provider)

__version__ = "0.1.0"


def __getattr__(name):
    # The decoding loop (and through it transformers) loads on first use, not at import.
    if name == "generate":
        from .decoding.api import generate

        return generate
    raise AttributeError(f"module 'specops' has no attribute {name!r}")


__all__ = [
    "BackendUnavailable", "CallUnsupported", "KVCompactPlan", "KvLayout", "TreeAttentionPlan",
    "apply_token_bitmask", "available", "build_tree_mask", "default_backend", "generate", "kv_compact",
    "kv_compact_paged", "linear", "pack_mask", "select_topn_subtree", "topn_expand", "tree_attention",
    "tree_attention_paged", "unpack_mask", "use_backend", "verify_greedy", "verify_joint", "verify_joint_logits",
    "verify_tree", "verify_tree_logits", "warp_probs"
]
