"""StaticKVCache: one preallocated K/V buffer for all layers, per-sequence lengths, in-place
compaction after acceptance — and a transformers ``Cache``, so a stock HF model writes into it.

Layout: ``k``, ``v`` [L, B, Hkv, S, D]; ``k[l]`` is the per-layer [B, Hkv, S, D] view that
``tree_attention`` reads and HF's attention receives. ``lens`` int32 [B] counts the committed rows
of every sequence. A forward appends its T new rows at ``lens[b] + offset`` (``offset`` = rows of
the current draft block already written); they stay uncommitted until ``compact`` (keep the
accepted path) or ``commit`` (keep all).

Two ways to drive it:
- the specops runner (:class:`specops.engine.ModelRunner`) opens a block
  (``begin_block``), runs the model, then compacts: lengths may be ragged across the batch;
- a plain HF forward with ``past_key_values=cache`` and no block open appends and commits like
  ``DynamicCache`` (lengths then stay equal across the batch).
"""
import torch

from ...ops.kv_compact import check_values as _check_values
from .base import KVCacheBase, check_sizes


class StaticKVCache(KVCacheBase):
    """Preallocated K/V for ``num_layers`` layers of ``batch_size`` sequences of ``max_len`` rows.

    Shape: k, v [L, B, Hkv, S, D]; lens int32 [B].

    Every method validates its arguments before it writes anything: a rejected call leaves
    ``k``, ``v`` and ``lens`` bit-identical. ``dtype`` is fp32, fp16 or bf16 (what
    ``kv_compact`` moves)."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, dtype=torch.float32,
                 device="cpu"):
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        check_sizes("StaticKVCache", ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim"), shape,
                    dtype)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_layers, self.num_kv_heads, self.max_len, self.head_dim = num_layers, num_kv_heads, max_len, head_dim
        self.dtype = dtype
        self._init_base(batch_size, device)

    def _layer_storage(self, layer):
        return (self.k, self.v) if layer is None else (self.k[layer], self.v[layer])

    def _layer_view(self, layer):
        # [B, Hkv, S, D] views: what tree_attention (and HF's own attention functions) read.
        return self.k[layer], self.v[layer]

    def _write_target(self, offset, T):
        # Computed once per forward, reused by every layer: ("slice", start, T) when every sequence writes
        # at the same row, else ("scatter", index [B, Hkv, T, D], T). The host mirror of lens is fresh
        # here (the room check just read it), so this costs no extra sync.
        host = self.host_lens()
        if all(n == host[0] for n in host):
            return ("slice", host[0] + offset, T)
        B, H, D = self.batch_size, self.num_kv_heads, self.head_dim
        rows = (self.lens.to(torch.int64) + offset)[:, None] + torch.arange(T, device=self.lens.device)
        return ("scatter", rows[:, None, :, None].expand(B, H, T, D), T)

    def _write_rows(self, layer, k, v):
        kind, where, T = self._write
        if kind == "slice":
            self.k[layer, :, :, where:where + T].copy_(k)
            self.v[layer, :, :, where:where + T].copy_(v)
        else:
            self.k[layer].scatter_(2, where, k.to(self.k.dtype))
            self.v[layer].scatter_(2, where, v.to(self.v.dtype))

    _COMPACT_OP = "kv_compact"

    def _compact_values(self, accept_idx, accept_lens):
        _check_values(self.lens, accept_idx, accept_lens, self.max_len)

    def _compact_args(self, accept_idx, accept_lens):
        return self.k, self.v, self.lens, accept_idx, accept_lens

    def _reorder(self, beam_idx):
        self.k.copy_(self.k[:, beam_idx])
        self.v.copy_(self.v[:, beam_idx])
