"""The torch reference of kv_compact: the moves a compaction makes (:func:`moves`, also what the
paged rules check against) and the op as one gather then one scatter (:func:`kv_compact`)."""
import torch

from ..layout import KvLayout


def moves(kv, prefix_lens, accept_idx, accept_lens):
    """The copies a compaction makes: the spec of the op on the layout ``kv``.

    Shape: prefix_lens / accept_lens int32 [B], accept_idx int32 [B, A] -> (moving bool [B, A],
    src / dst rows int64 [B, A], src / dst addresses (:meth:`~specops.ops.layout.KvLayout.address`
    of those rows, each a pair of int64 [B, A])). Move ``j`` of sequence ``b`` copies row
    ``prefix_lens[b] + accept_idx[b, j]`` to row ``prefix_lens[b] + j``; ``moving`` marks the
    copies: ``j < accept_lens[b]``, not an identity, both rows within the layout's capacity and
    (paged) on pool pages. Others (only possible unchecked) are skipped, as the kernels skip them."""
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
    accept_idx, accept_lens) -> None. Every moving row's source is gathered first, then scattered to
    the destinations: overlap-safe by construction, so this is the reference the kernels are held to."""
    kv, (prefix_lens, accept_idx, accept_lens) = KvLayout(*args[:-3]), args[-3:]
    moving, _, _, src, dst = moves(kv, prefix_lens, accept_idx, accept_lens)
    sel = moving.nonzero(as_tuple=True)
    src, dst = kv.index(*(t[sel] for t in src)), kv.index(*(t[sel] for t in dst))
    for cache in (kv.k, kv.v):
        rows = cache[src]  # a copy
        cache[dst] = rows
