"""specops' KV cache: :class:`KVCache`, a transformers ``Cache`` (a stock HF model writes into it) over
a :class:`~specops.ops.layout.KvLayout` of all layers; :class:`StaticKVCache` (contiguous) and
:class:`PagedKVCache` (a page pool and a page table) allocate one of each layout.

``lens`` int32 [B] counts each sequence's committed rows. A forward appends its T rows at ``lens[b] +
offset`` (``offset``: rows of the current draft block already written), uncommitted until ``compact``
(keep the accepted path) or ``commit`` (keep all). Row addresses and the compaction op are the
layout's (:meth:`KvLayout.address` / :meth:`KvLayout.op`), never copies of them. Two drivers:
- :class:`specops.engine.ModelRunner` opens a block (``begin_block``), runs the model, then compacts
  (ragged lengths); a layer's attention gets the layer's storage ([B, Hkv, S, D], or the page pools
  [num_pages, page_size, Hkv, D] that the ``"specops"`` attention reads through the page table);
- a plain HF forward (no block open) appends and commits like ``DynamicCache`` (equal lengths); a
  paged layer hands attention a contiguous [B, Hkv, max_len, D] copy of its rows, which any attention reads.
"""
import numbers

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ...backend import resolve
from ...ops import checks, kv_compact
from ...ops.kv_compact import CACHE_DTYPES
from ...ops.layout import KvLayout
from ...parallel import local_kv_heads, text_config


class _Layer(CacheLayerMixin):
    """One layer's face of the shared buffer, for code that walks ``cache.layers``."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner, index):
        super().__init__()
        self.owner, self.index = owner, index
        self.keys, self.values = owner.layout.k[index], owner.layout.v[index]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner.append_block(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length):
        return self.owner.max_len, 0

    def get_seq_length(self):
        return self.owner.get_seq_length()

    def get_max_length(self):
        return self.owner.max_len


SIZE_NAMES = ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim")


def check_sizes(cls_name, sizes, dtype, names=SIZE_NAMES):
    """Constructor arguments: positive ints and a KV dtype, named in the error."""
    for name, size in zip(names, sizes):
        checks.scalar(f"{cls_name} {name}", size, numbers.Integral, "an int")
    if min(sizes) < 1:
        raise ValueError(f"{cls_name} sizes must be >= 1, got [{', '.join(names)}] = {list(sizes)}")
    if dtype not in CACHE_DTYPES:
        want = " or ".join(str(d) for d in CACHE_DTYPES)
        raise TypeError(f"{cls_name} dtype must be {want}, got {dtype!r}")


def rows_index(kv, b, r):
    """The index of ``kv.k`` / ``kv.v`` selecting row ``r[i, j]`` of sequence ``b[i, j]`` (int64,
    broadcast together) in flattened (i, j) order."""
    return kv.index(*(a.flatten() for a in kv.address(b, r)))


class KVCache(Cache):
    """The KV cache of ``max_len`` rows per sequence (None: all the layout holds) over ``layout``, a
    :class:`KvLayout` of all layers, contiguous (S >= max_len) or paged (page_table int32 [B, max_pages],
    max_pages * page_size >= max_len, each sequence on its own pages); fp32, fp16 or bf16, stride 1 in
    D, K and V apart. The layout's tensors are the storage, written in place.

    Shape: lens int32 [B]. Attributes: ``k``, ``v`` (contiguous) or ``k_pages``, ``v_pages``,
    ``page_table``, ``num_pages`` (paged); ``page_size`` (None contiguous), ``num_layers``,
    ``num_kv_heads``, ``head_dim``, ``max_len``, ``dtype``, ``layout``. Every method validates before
    it writes: a rejected call leaves the storage and ``lens`` bit-identical."""

    def __init__(self, layout, max_len=None):
        name = type(self).__name__
        if not isinstance(layout, KvLayout):
            raise TypeError(f"{name} layout must be a specops.ops.layout.KvLayout, got {type(layout).__name__}")
        layout.check(dtype=CACHE_DTYPES, rank=5, distinct=True)
        k, cap = layout.k, layout.capacity()
        max_len = cap if max_len is None else max_len
        sizes = (k.shape[0], layout.batch(), layout.num_kv_heads, max_len, k.shape[-1])
        check_sizes(name, sizes, k.dtype)
        if max_len > cap:
            raise ValueError(f"{name} max_len must be <= {cap} (the rows the layout holds per sequence), got {max_len}")
        self.layout, self.dtype, self.page_size = layout, k.dtype, layout.page_size
        self.num_layers, batch_size, self.num_kv_heads, self.max_len, self.head_dim = sizes
        if layout.is_paged:
            self.k_pages, self.v_pages, self.page_table = layout.tensors()
            self.num_pages = layout.num_pages
        else:
            self.k, self.v = layout.k, layout.v
        self.lens = torch.zeros(batch_size, dtype=torch.int32, device=k.device)
        self._host_lens = [0] * batch_size  # mirror of lens for overflow checks; None when stale
        self._block = None  # (offset, T) of the draft block being written, or None in plain mode
        self._write = None  # where the current forward's rows go, computed once per forward (not per layer)
        Cache.__init__(self, layers=[_Layer(self, i) for i in range(self.num_layers)])

    @classmethod
    def for_model(cls, model, batch_size, max_len, *, dtype=None, device=None, **kwargs):
        """Sized from an HF model's (text) config, on :class:`StaticKVCache` / :class:`PagedKVCache`,
        with this rank's KV heads under tensor parallelism (``specops.parallel.local_kv_heads``, which
        raises ValueError for heads that do not divide). ``kwargs`` go to the constructor (``page_size``)."""
        cfg = text_config(model)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        param = next(model.parameters())
        return cls(cfg.num_hidden_layers, batch_size, local_kv_heads(model, cfg), max_len, head_dim,
                   dtype=dtype or param.dtype, device=device or param.device, **kwargs)

    # ---- sizes and views --------------------------------------------------------------------
    @property
    def batch_size(self):
        return self.lens.shape[0]

    @property
    def device(self):
        return self.lens.device

    def layer_kv(self, layer):
        """The layout of one layer: k, v [B, Hkv, S, D], or [num_pages, page_size, Hkv, D] with the
        cache's page table (views of the storage)."""
        return KvLayout(self.layout.k[layer], self.layout.v[layer], self.layout.page_table)

    def host_lens(self):
        """Committed lengths as a Python list (one host sync if they changed on the device)."""
        if self._host_lens is None:
            self._host_lens = self.lens.tolist()
        return self._host_lens

    def get_seq_length(self, layer_idx=0):
        return max(self.host_lens())

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self.max_len, 0

    def get_max_length(self, layer_idx=None):
        return self.max_len

    def _check_room(self, rows, what):
        longest = max(self.host_lens())
        if longest + rows > self.max_len:
            raise ValueError(f"{what}: cache overflow: the longest sequence holds {longest} rows, "
                             f"{rows} more would exceed max_len={self.max_len}")

    # ---- writing ------------------------------------------------------------------------------
    def begin_block(self, offset, rows):
        """The next forward writes ``rows`` (>= 1) new rows at ``lens + offset`` (>= 0; a growing draft
        block's current size); raises before anything is written if a sequence would overflow."""
        offset = checks.integer("offset", offset, 0)
        rows = checks.integer("rows", rows, 1)
        self._check_room(offset + rows, "begin_block")
        self._block = (offset, rows)
        self._write = self._write_target(offset, rows)

    def end_block(self):
        self._block = self._write = None

    def append_block(self, layer, k, v):
        """Writes one layer's new rows: at ``lens + offset``, uncommitted, in a block (``begin_block``);
        else at ``lens``, committed after the last layer. Shape: k, v [B, Hkv, T, D] -> what the layer's
        attention reads (see the module)."""
        L, B, H, D = self.num_layers, self.batch_size, self.num_kv_heads, self.head_dim
        dev = self.lens.device
        layer = checks.integer("layer", layer, 0, L - 1, f"the cache has num_layers={L}")
        T = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
        if (T < 1 or not isinstance(v, torch.Tensor) or k.shape != (B, H, T, D) or v.shape != k.shape
                or k.device != dev or v.device != dev or k.dtype not in CACHE_DTYPES or v.dtype != k.dtype):
            checks.tensor("k", k, dtype=CACHE_DTYPES, shape=(B, H, None, D), device=dev)
            checks.tensor("v", v, dtype=k.dtype, shape=(B, H, T, D), device=dev)
            if T < 1:
                raise ValueError(f"k must hold at least one row (T >= 1), got shape {tuple(k.shape)}")
        # New rows must not be views of the cache: a slice copy from overlapping memory would read rows it
        # has already overwritten (a check of metadata only).
        if not torch.compiler.is_compiling():
            own = {t.untyped_storage().data_ptr() for t in (self.layout.k, self.layout.v)}
            for name, t in (("k", k), ("v", v)):
                if t.untyped_storage().data_ptr() in own:
                    raise ValueError(f"{name} must not share memory with the cache's own k/v buffers "
                                     f"(got a view at storage offset {t.storage_offset()}); pass a copy")
        if self._block is not None:
            if self._block[1] != T:
                raise ValueError(f"append_block: the open block has {self._block[1]} rows per sequence, got T={T}")
        elif layer == 0 or self._write is None or self._write[-1] != T:
            # Plain mode: the first layer of each forward checks room and computes the write target.
            self._check_room(T, "append_block")
            self._write = self._write_target(0, T)
        index, flat, _ = self._write
        kv = self.layer_kv(layer)
        for cache, new in ((kv.k, k), (kv.v, v)):
            cache[index] = new.transpose(1, 2).flatten(0, 1).to(cache.dtype) if flat else new
        if self._block is None and layer == L - 1:
            self._write = None
            self.commit(torch.full_like(self.lens, T), host_counts=[T] * B)
        if kv.is_paged and self._block is None:  # plain mode: a contiguous copy [B, Hkv, max_len, D]
            kv = kv.gather()
            return kv.k[:, :, :self.max_len], kv.v[:, :, :self.max_len]
        return kv.k, kv.v

    def _write_target(self, offset, T):
        # Once per forward, for every layer: (index of a layer's k / v, flat, T). Equal lengths on a
        # contiguous cache take one slice [B, Hkv, T, D] (plain decoding); else the rows' addresses
        # select [B * T, Hkv, D] in (b, t) order (flat). The host mirror is fresh here: no sync.
        if not self.layout.is_paged and len(set(self.host_lens())) == 1:
            start = self.host_lens()[0] + offset
            return (slice(None), slice(None), slice(start, start + T)), False, T
        rows = (self.lens.long() + offset)[:, None] + torch.arange(T, device=self.device)  # [B, T]
        return rows_index(self.layer_kv(0), torch.arange(self.batch_size, device=self.device)[:, None], rows), True, T

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.append_block(layer_idx, key_states, value_states)

    # ---- after verification ----------------------------------------------------------------
    def _host_count_list(self, host_counts):
        if host_counts is None:
            return None
        if isinstance(host_counts, torch.Tensor):
            raise TypeError("host_counts / host_lens must be a list of ints (already on the host), got a tensor")
        host_counts = [int(c) for c in host_counts]
        if len(host_counts) != self.batch_size:
            raise ValueError(f"host_counts / host_lens must have {self.batch_size} entries, got {len(host_counts)}")
        return host_counts

    def commit(self, counts, host_counts=None, *, check=True):
        """Keeps the first ``counts[b]`` (int32 [B]) rows written after ``lens[b]``: lens += counts.

        ``host_counts``: the same counts as a list, keeping the host mirror of ``lens`` fresh without
        a sync. ``check=True`` requires ``0 <= counts[b] <= max_len - lens[b]``; without
        ``host_counts`` that costs one sync, which refreshes the mirror. ``check=False``: no checks,
        no sync, an unspecified result for bad counts."""
        checks.lengths("counts", counts, self.batch_size, self.lens.device)
        host_counts = self._host_count_list(host_counts)
        if check:
            if host_counts is None and self._host_lens is None:  # both from the device in one sync
                self._host_lens, host_counts = torch.stack([self.lens, counts]).tolist()
            elif host_counts is None:
                host_counts = counts.tolist()
            for b, (n, c) in enumerate(zip(self.host_lens(), host_counts)):
                if c < 0 or n + c > self.max_len:
                    raise ValueError(f"counts[{b}] must lie in [0, max_len - lens[{b}]] = [0, {self.max_len - n}] "
                                     f"(max_len={self.max_len}, lens[{b}]={n}), got {c}")
        self.lens += counts
        if host_counts is not None and self._host_lens is not None:
            self._host_lens = [n + c for n, c in zip(self._host_lens, host_counts)]
        else:
            self._host_lens = None

    def compact(self, accept_idx, accept_lens, *, check=True, backend=None, host_counts=None):
        """Keeps the accepted block rows: row ``lens + accept_idx[b, j]`` moves to ``lens + j`` in every
        layer (one call of the layout's compiled op; only the acceptance is checked, the storage was
        at construction), then ``lens += accept_lens``. ``host_counts``: accept_lens as a list (the
        loop's packed read), keeping the host mirror fresh; trusted, like ``check=False``.

        Shape: accept_idx int32 [B, A], accept_lens int32 [B]."""
        host_counts = self._host_count_list(host_counts)  # before anything is written
        kv_compact.check_accept(self.lens, accept_idx, accept_lens, self.batch_size, self.device, lens_name="lens")
        if check:
            kv_compact.accept_values(self.layout, self.lens, accept_idx, accept_lens)
        impl = resolve(self.layout.op("kv_compact"), self.device, backend)
        if accept_idx.shape[1]:  # the kernels are never launched for an empty acceptance
            impl(*self.layout.tensors(), self.lens, accept_idx, accept_lens)
        # No second check: check=True verified lens + accept_idx[b, j] < capacity (rows the sequence
        # owns) for strictly increasing accept_idx[b, j] >= j, so lens + accept_lens stays within it.
        self.commit(accept_lens, host_counts, check=False)

    def truncate(self, new_lens, host_lens=None):
        """Metadata only: ``lens = new_lens`` (int32 [B], each <= the current length). The check costs
        one sync (refreshing the mirror), none given ``host_lens`` (the same as a list) and a fresh mirror."""
        checks.lengths("new_lens", new_lens, self.batch_size, self.lens.device)
        host_lens = self._host_count_list(host_lens)
        if host_lens is None or self._host_lens is None:  # both from the device in one sync
            host_lens, self._host_lens = torch.stack([new_lens, self.lens]).tolist()
        for b, (n, old) in enumerate(zip(host_lens, self._host_lens)):
            if n < 0 or n > old:
                raise ValueError(f"new_lens must lie in [0, lens], got new_lens[{b}] = {n} "
                                 f"for lens[{b}] = {old}")
        self.lens.copy_(new_lens)
        self._host_lens = host_lens

    def reset(self):
        self.lens.zero_()
        self._host_lens = [0] * self.batch_size
        self._block = self._write = None

    def crop(self, tokens_to_remove):
        """HF's crop: drop the last ``|tokens_to_remove|`` rows of every sequence (transformers passes
        ``crop(-n)``); lengths stop at 0."""
        n = abs(checks.integer("tokens_to_remove", tokens_to_remove))
        self.truncate((self.lens - n).clamp(min=0))

    def reorder_cache(self, beam_idx):
        """Sequence ``b`` takes the K/V and length of sequence ``beam_idx[b]`` (int32/int64 [B] in
        [0, B); one host sync)."""
        B = self.batch_size
        checks.tensor("beam_idx", beam_idx, dtype=(torch.int32, torch.int64), shape=(B,), device=self.lens.device)
        checks.range_values("beam_idx", beam_idx, 0, B - 1, f"a sequence of the batch of B={B}")
        # Every row of every layer, copied to the rows of sequence b (paged: into b's own pages; its
        # table row stays, else two sequences would share pages and overwrite each other's rows).
        r = torch.arange(self.layout.capacity(), device=self.device)[None, :]
        dst = rows_index(self.layout, torch.arange(B, device=self.device)[:, None], r)
        src = rows_index(self.layout, beam_idx.long()[:, None], r)
        for t in (self.layout.k, self.layout.v):
            t[dst] = t[src]  # the right side is a copy: sources are read before any write
        self.lens.copy_(self.lens[beam_idx])
        self._host_lens = None


class StaticKVCache(KVCache):
    """Preallocated contiguous K/V. Shape: k, v [L, B, Hkv, S, D] (S = max_len); lens int32 [B].
    ``dtype``: fp32, fp16 or bf16."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, dtype=torch.float32,
                 device="cpu"):
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        # Checked before allocating, so the error names this constructor's arguments.
        check_sizes("StaticKVCache", shape, dtype)
        super().__init__(KvLayout.contiguous(*(torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")),
                         max_len)


DEFAULT_PAGE_ORDER_SEED = 0  # page_order=None: a fixed permutation of the pool, the same every run


class PagedKVCache(KVCache):
    """Preallocated paged K/V: row ``r`` of sequence ``b`` is slot ``r % page_size`` of page
    ``page_table[b, r // page_size]``. The table is fixed at construction (no allocator) and scattered,
    so code and tests run on non-contiguous pages as an engine's would.

    Shape: k_pages, v_pages [L, num_pages, page_size, Hkv, D]; page_table int32 [B, max_pages]
    (max_pages = ceil(max_len / page_size)); lens int32 [B]. ``page_size``: a power of two (the
    kernels shift). ``num_pages`` >= ``B * max_pages`` (the default; more are spare). ``page_order``:
    the pool pages in table order: None (a fixed scattered permutation), a ``torch.Generator`` (a
    random one) or an int tensor [num_pages], a permutation of ``0..num_pages-1``."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, page_size=16, num_pages=None,
                 page_order=None, dtype=torch.float32, device="cpu"):
        # Checked before allocating, so the errors name this constructor's arguments.
        sizes = (num_layers, batch_size, num_kv_heads, max_len, head_dim, page_size)
        check_sizes("PagedKVCache", sizes, dtype, SIZE_NAMES + ("page_size",))
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
