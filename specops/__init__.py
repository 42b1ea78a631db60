"""specops: kernels for speculative decoding of LLMs (torch / CPU C++ / Triton / CUDA C++ backends).

``python -m specops`` prints which backends are available here and why.
"""
from . import _ext  # noqa: F401  (loads the compiled extensions and their op registrations)
from .backend import BackendUnavailable, available, use_backend
from .ops.tree_attention import tree_attention
from .ops.kv_compact import kv_compact
from .ops.tree_mask import build_tree_mask, pack_mask, unpack_mask

__version__ = "0.1.0"


def __getattr__(name):
    # The decoding loop (and through it transformers) loads on first use, not at import.
    if name == "generate":
        from .decoding.api import generate

        return generate
    raise AttributeError(f"module 'specops' has no attribute {name!r}")


__all__ = [
    "BackendUnavailable",
    "available",
    "build_tree_mask",
    "generate",
    "kv_compact",
    "pack_mask",
    "tree_attention",
    "unpack_mask",
    "use_backend",
]
