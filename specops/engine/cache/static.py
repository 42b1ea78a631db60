"""StaticKVCache: a :class:`~specops.engine.cache.KVCache` over one preallocated contiguous K/V
buffer for all layers, ``k``, ``v`` [L, B, Hkv, S, D]; ``k[l]`` is the per-layer [B, Hkv, S, D] view
that ``tree_attention`` reads and HF's attention receives."""
import torch

from ...ops.layout import KvLayout
from .base import KVCache, check_sizes


class StaticKVCache(KVCache):
    """Preallocated K/V for ``num_layers`` layers of ``batch_size`` sequences of ``max_len`` rows.

    Shape: k, v [L, B, Hkv, S, D] (S = max_len); lens int32 [B]. ``dtype`` is fp32, fp16 or bf16
    (what ``kv_compact`` moves). Semantics: :class:`~specops.engine.cache.KVCache`."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, dtype=torch.float32,
                 device="cpu"):
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        # Checked before allocating, so the error names this constructor's arguments.
        check_sizes("StaticKVCache", ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim"), shape,
                    dtype)
        super().__init__(KvLayout.contiguous(*(torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")),
                         max_len)
