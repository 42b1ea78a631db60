"""PagedKVCache: the K/V of every layer in a pool of fixed-size pages, addressed through a page
table (the layout of serving engines, and of :func:`specops.tree_attention_paged` /
:func:`specops.kv_compact_paged`), with the semantics of :class:`~specops.engine.cache.StaticKVCache`.

Layout: ``k_pages``, ``v_pages`` [L, num_pages, page_size, Hkv, D]; ``page_table`` int32
[B, ceil(max_len / page_size)]. Row ``r`` of sequence ``b`` is slot ``r % page_size`` of page
``page_table[b, r // page_size]``. Every sequence owns its pages from construction on (no
allocator: the table is fixed), in a scattered order (``page_order``), so code and tests run on
non-contiguous pages as an engine's would.

What a layer hands to attention: inside a specops block (the runner) the layer's page pools
[num_pages, page_size, Hkv, D], which the ``"specops"`` attention runs through a paged
:class:`specops.TreeAttentionPlan`; in a plain HF forward (no block open) the rows gathered into
a contiguous [B, Hkv, max_len, D] copy, so any attention implementation reads them correctly.
"""
import torch

from ...ops import checks
from ...ops.kv_compact import check_paged_values as _check_paged_values
from ...ops.tree_attention import gather_pages
from .base import KVCacheBase, check_sizes

DEFAULT_PAGE_ORDER_SEED = 0  # page_order=None: a fixed permutation of the pool, the same every run


class PagedKVCache(KVCacheBase):
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
        names = ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim", "page_size")
        check_sizes("PagedKVCache", names, (num_layers, batch_size, num_kv_heads, max_len, head_dim, page_size), dtype)
        checks.power_of_two("PagedKVCache page_size", page_size)
        max_pages = -(-max_len // page_size)
        needed = batch_size * max_pages
        if num_pages is None:
            num_pages = needed
        num_pages = checks.integer("num_pages", num_pages)
        if num_pages < needed:
            raise ValueError(f"PagedKVCache num_pages must be >= batch_size * ceil(max_len / page_size) = "
                             f"{batch_size} * {max_pages} = {needed}, got {num_pages}")
        order = _page_order(page_order, num_pages)
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k_pages = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pages = torch.zeros(shape, dtype=dtype, device=device)
        self.page_table = order[:needed].view(batch_size, max_pages).to(torch.int32).to(device)
        self.page_size, self.num_pages = page_size, num_pages
        self.num_layers, self.num_kv_heads, self.max_len, self.head_dim = num_layers, num_kv_heads, max_len, head_dim
        self.dtype = dtype
        self._init_base(batch_size, device)

    def _layer_storage(self, layer):
        return (self.k_pages, self.v_pages) if layer is None else (self.k_pages[layer], self.v_pages[layer])

    def _layer_view(self, layer):
        if self._block is not None:  # the specops runner: pools [num_pages, page_size, Hkv, D]
            return self.k_pages[layer], self.v_pages[layer]
        return self.gather(layer)

    def gather(self, layer):
        """The layer's rows as a contiguous cache (a copy). Shape: -> k, v [B, Hkv, max_len, D]."""
        return tuple(gather_pages(pool[layer], self.page_table)[:, :, :self.max_len] for pool in
                     (self.k_pages, self.v_pages))

    def _write_target(self, offset, T):
        # Computed once per forward, reused by every layer: the pool row (page * page_size + slot) of
        # every new row, int64 [B * T] in (b, t) order. No host sync.
        ps = self.page_size
        rows = (self.lens.to(torch.int64) + offset)[:, None] + torch.arange(T, device=self.lens.device)  # [B, T]
        pages = self.page_table.long().gather(1, rows // ps)
        return ((pages * ps + rows % ps).flatten(), T)

    def _write_rows(self, layer, k, v):
        flat, T = self._write
        B, H, D = self.batch_size, self.num_kv_heads, self.head_dim
        for pool, new in ((self.k_pages, k), (self.v_pages, v)):
            rows = new.to(pool.dtype).transpose(1, 2).reshape(B * T, H, D)  # [B * T, Hkv, D]
            pool[layer].view(-1, H, D).index_copy_(0, flat, rows)

    _COMPACT_OP = "kv_compact_paged"

    def _compact_values(self, accept_idx, accept_lens):
        _check_paged_values(self.page_table, self.num_pages, self.page_size, self.lens, accept_idx, accept_lens)

    def _compact_args(self, accept_idx, accept_lens):
        return self.k_pages, self.v_pages, self.page_table, self.lens, accept_idx, accept_lens

    def _reorder(self, beam_idx):
        # Copy pages (not table rows): two sequences sharing pages would overwrite each other's rows.
        dst = self.page_table.long()
        src = dst[beam_idx.long()]
        for pool in (self.k_pages, self.v_pages):
            pool[:, dst] = pool[:, src]


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
