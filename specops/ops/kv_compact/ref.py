"""The torch reference of kv_compact: the moves (:func:`moves`, which the paged rules also check) and
the op as one gather then one scatter."""
import torch

from ..layout import KvLayout


def moves(kv, prefix_lens, accept_idx, accept_lens):
    """The copies a compaction makes on the layout ``kv``: the op's spec. Move ``j`` of sequence ``b``
    copies row ``prefix_lens[b] + accept_idx[b, j]`` to row ``prefix_lens[b] + j``; ``moving`` marks
    those made: ``j < accept_lens[b]``, not an identity, both rows within the capacity and (paged) on
    pool pages (the kernels skip the others, possible only unchecked). Shape: prefix_lens /
    accept_lens int32 [B], accept_idx int32 [B, A] -> (moving bool [B, A], src / dst rows int64
    [B, A], their :meth:`~specops.ops.layout.KvLayout.address` pairs of int64 [B, A])."""
    B, A = accept_idx.shape
    rows = kv.capacity()
    dev = accept_idx.device
    j = torch.arange(A, device=dev)
    p = prefix_lens.long()[:, None]
    src, dst = p + accept_idx.long(), p + j[None, :]
    moving = (j[None, :] < accept_lens.long().clamp(0, A)[:, None]) & (src != dst)
    moving &= (src >= 0) & (src < rows) & (dst >= 0) & (dst < rows)
    b = torch.arange(B, device=dev)[:, None]
    at = kv.address(b, src), kv.address(b, dst)
    if kv.is_paged:
        for page, _ in at:
            moving &= (page >= 0) & (page < kv.num_pages)
    return (moving, src, dst, *at)


def kv_compact(*args):
    """The op on the registered op's positional arguments (the layout's tensors, prefix_lens,
    accept_idx, accept_lens) -> None: all sources gathered, then scattered (overlap-safe by construction)."""
    kv, (prefix_lens, accept_idx, accept_lens) = KvLayout(*args[:-3]), args[-3:]
    moving, _, _, src, dst = moves(kv, prefix_lens, accept_idx, accept_lens)
    sel = moving.nonzero(as_tuple=True)
    src, dst = kv.index(*(t[sel] for t in src)), kv.index(*(t[sel] for t in dst))
    for cache in (kv.k, kv.v):
        rows = cache[src]  # a copy
        cache[dst] = rows
