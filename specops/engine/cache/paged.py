"""PagedKVCache: a :class:`~specops.engine.cache.KVCache` over a pool of fixed-size pages addressed
through a page table (the layout of serving engines, and of :func:`specops.tree_attention_paged` /
:func:`specops.kv_compact_paged`), with the semantics of :class:`~specops.engine.cache.StaticKVCache`.

Layout: ``k_pages``, ``v_pages`` [L, num_pages, page_size, Hkv, D]; ``page_table`` int32
[B, ceil(max_len / page_size)]. Row ``r`` of sequence ``b`` is slot ``r % page_size`` of page
``page_table[b, r // page_size]``. Every sequence owns its pages from construction on (no
allocator: the table is fixed), in a scattered order (``page_order``), so code and tests run on
non-contiguous pages as an engine's would.
"""
import torch

from ...ops import checks
from ...ops.layout import KvLayout
from .base import KVCache, check_sizes

DEFAULT_PAGE_ORDER_SEED = 0  # page_order=None: a fixed permutation of the pool, the same every run


class PagedKVCache(KVCache):
    """Preallocated paged K/V for ``num_layers`` layers of ``batch_size`` sequences of up to
    ``max_len`` rows.

    Shape: k_pages, v_pages [L, num_pages, page_size, Hkv, D]; page_table int32 [B, max_pages]
    (max_pages = ceil(max_len / page_size)); lens int32 [B].

    ``page_size``: a power of two (the kernels split rows with shifts). ``num_pages``: the pool
    size, at least ``B * max_pages`` (the default; more leaves spare pages no sequence uses).
    ``page_order``: which pool pages the sequences get, in table order: None (a fixed scattered
    permutation), a ``torch.Generator`` (a random permutation from it) or an int tensor
    [num_pages] holding a permutation of ``0..num_pages-1``. Every method validates its
    arguments before it writes anything, as :class:`StaticKVCache` does."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, page_size=16, num_pages=None,
                 page_order=None, dtype=torch.float32, device="cpu"):
        # Checked before allocating, so the errors name this constructor's arguments.
        names = ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim", "page_size")
        check_sizes("PagedKVCache", names, (num_layers, batch_size, num_kv_heads, max_len, head_dim, page_size), dtype)
        checks.power_of_two("PagedKVCache page_size", page_size)
        max_pages = -(-max_len // page_size)
        needed = batch_size * max_pages
        num_pages = needed if num_pages is None else checks.integer("num_pages", num_pages)
        if num_pages < needed:
            raise ValueError(f"PagedKVCache num_pages must be >= batch_size * ceil(max_len / page_size) = "
                             f"{batch_size} * {max_pages} = {needed}, got {num_pages}")
        table = _page_order(page_order, num_pages)[:needed].view(batch_size, max_pages).to(torch.int32).to(device)
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        pools = (torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")
        super().__init__(KvLayout.paged(*pools, table, page_size), max_len)


def _page_order(page_order, num_pages):
    """The pool pages in table order: int64 [num_pages] (a permutation)."""
    if page_order is None:
        return torch.randperm(num_pages, generator=torch.Generator().manual_seed(DEFAULT_PAGE_ORDER_SEED))
    if isinstance(page_order, torch.Generator):
        return torch.randperm(num_pages, generator=page_order, device=page_order.device).cpu()
    checks.tensor("page_order", page_order, dtype=(torch.int32, torch.int64), shape=(num_pages,))
    order = page_order.cpu().long()
    if not torch.equal(order.sort().values, torch.arange(num_pages)):
        raise ValueError(f"page_order must be a permutation of 0..num_pages-1 = 0..{num_pages - 1}, got "
                         f"{order.tolist()[:16]}{' ...' if num_pages > 16 else ''}")
    return order
