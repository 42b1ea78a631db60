"""KV-cache compaction after acceptance: move the accepted draft rows next to the committed prefix.

Terms: the cache holds every layer stacked, ``[L, B, Hkv, S, D]``. Sequence ``b`` has a committed
prefix of ``prefix_lens[b]`` rows followed by the rows of its last draft block. Verification accepted
``accept_lens[b]`` of those nodes, listed in ``accept_idx[b]`` (strictly increasing block offsets,
usually starting with the root 0). Compaction moves, in every layer and head, row
``prefix_lens[b] + accept_idx[b, j]`` to row ``prefix_lens[b] + j`` for ``j < accept_lens[b]``.

Sources and destinations overlap (destination ``j`` may be the source of an earlier ``j'``); every
backend produces what a gather of all sources followed by a scatter to all destinations produces.
Rows past the accepted ones keep whatever they held. Truncation needs no op: lower the lengths.
"""
import torch

from .. import extension
from ..backend import register, register_compiled, resolve
from . import checks
from .tree_attention import check_page_pool, page_rules

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens, *, check=True, backend=None):
    """Compacts the accepted rows of the last draft block of every sequence, all layers in one call.

    Shape: k_cache, v_cache [L, B, Hkv, S, D] (fp32/fp16/bf16, same shape and dtype, stride 1 in D,
    modified in place; views into bigger tensors are fine), prefix_lens int32 [B],
    accept_idx int32 [B, A], accept_lens int32 [B] -> None.

    For every layer, sequence b, head and ``j < accept_lens[b]``, row ``prefix_lens[b] + accept_idx[b, j]``
    moves to row ``prefix_lens[b] + j``. Entries ``accept_idx[b, j]`` with ``j >= accept_lens[b]`` are
    padding and ignored. ``prefix_lens`` is not changed: the caller adds ``accept_lens``.

    ``check=True`` also validates the values (one host sync): ``0 <= accept_lens[b] <= A``,
    ``0 <= prefix_lens[b] <= S``, ``accept_idx[b, :accept_lens[b]]`` strictly increasing from ``>= 0``
    with ``prefix_lens[b] + accept_idx[b, j] < S``. Any error is raised before a byte is written.
    ``check=False`` skips those value checks: the kernels then skip rows whose source or destination
    falls outside ``[0, S)`` (never writing out of bounds), but the result is otherwise unspecified.
    """
    check_caches(k_cache, v_cache)
    L, B, H, S, D = k_cache.shape
    dev = k_cache.device
    check_accept(prefix_lens, accept_idx, accept_lens, B, dev)
    if check:
        check_values(prefix_lens, accept_idx, accept_lens, S)
    impl = resolve("kv_compact", dev, backend)
    if k_cache.numel() and accept_idx.shape[1]:
        impl(k_cache, v_cache, prefix_lens, accept_idx, accept_lens)
    return None


def check_caches(k_cache, v_cache):
    """The metadata rules of :func:`kv_compact`'s caches [L, B, Hkv, S, D] (no host sync)."""
    checks.tensor("k_cache", k_cache, dtype=CACHE_DTYPES, rank=5, last_stride_one=True)
    checks.tensor("v_cache", v_cache, dtype=k_cache.dtype, shape=tuple(k_cache.shape), device=k_cache.device,
                  last_stride_one=True)
    _check_no_overlap(k_cache, v_cache)


def check_pools(k_pages, v_pages):
    """The metadata rules of :func:`kv_compact_paged`'s page pools [L, num_pages, page_size, Hkv, D]
    (no host sync); returns (num_pages, page_size)."""
    checks.tensor("k_pages", k_pages, dtype=CACHE_DTYPES, rank=5, last_stride_one=True)
    N, page_size, _ = check_page_pool("k_pages", k_pages, lead=1)
    checks.tensor("v_pages", v_pages, dtype=k_pages.dtype, shape=tuple(k_pages.shape), device=k_pages.device,
                  last_stride_one=True)
    _check_no_overlap(k_pages, v_pages, "k_pages", "v_pages")
    return N, page_size


def check_accept(prefix_lens, accept_idx, accept_lens, B, dev, lens_name="prefix_lens"):
    """The metadata rules of the acceptance (int32 [B], [B, A], [B]; no host sync); ``lens_name``
    names the committed lengths in errors (the plan's ``lens``)."""
    checks.lengths(lens_name, prefix_lens, B, dev)
    checks.tensor("accept_idx", accept_idx, dtype=torch.int32, rank=2, shape=(B, None), device=dev)
    checks.lengths("accept_lens", accept_lens, B, dev)


# ---- validation ----------------------------------------------------------------------------------

def _no_self_overlap(sizes, strides):
    """Sufficient condition for distinct indices to address distinct elements: ordered by stride,
    every stride exceeds the span of all smaller ones. Every slice / permute / select of a dense
    tensor satisfies it; an expanded (stride 0) view does not."""
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1)
    span = 0  # largest element offset reachable with the dims seen so far
    for st, sz in dims:
        if st <= span:
            return False
        span += st * (sz - 1)
    return True


def _span_bytes(t):
    """Bytes from the first to one past the last element a (non-empty) tensor addresses."""
    if t.is_contiguous():
        return t.numel() * t.element_size()
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()


def _check_no_overlap(k_cache, v_cache, k_name="k_cache", v_name="v_cache"):
    """Each cache's rows must be distinct memory (else writes race), and K must not share memory
    with V (else moving K moves V too). Metadata only: shapes, strides and data addresses."""
    for name, t in ((k_name, k_cache), (v_name, v_cache)):
        if not t.is_contiguous() and not _no_self_overlap(t.shape, t.stride()):
            raise ValueError(f"{name} must not address one element twice (e.g. an expanded view), "
                             f"got shape {tuple(t.shape)} with strides {t.stride()}")
    if torch.compiler.is_compiling() or k_cache.numel() == 0:
        return  # fake tensors have no storage address to compare
    k_lo, v_lo = k_cache.data_ptr(), v_cache.data_ptr()
    k_hi, v_hi = k_lo + _span_bytes(k_cache), v_lo + _span_bytes(v_cache)
    if k_hi <= v_lo or v_hi <= k_lo:
        return  # disjoint address ranges: the common case, decided without touching storages
    # Interleaved ranges (e.g. K and V are kv[:, 0] and kv[:, 1] of one [L, 2, ...] tensor). With
    # equal strides the pair is one tensor with an extra dim of size 2 and stride |address gap|.
    es = k_cache.element_size()
    gap, rem = divmod(abs(v_lo - k_lo), es)
    if k_cache.stride() == v_cache.stride() and rem == 0 and gap > 0 and _no_self_overlap(
            tuple(k_cache.shape) + (2,), k_cache.stride() + (gap,)):
        return
    raise ValueError(f"{v_name} must not share memory with {k_name}, got address ranges that interleave "
                     f"{abs(v_lo - k_lo)} bytes apart with strides {k_cache.stride()} and {v_cache.stride()}")


def check_values(prefix_lens, accept_idx, accept_lens, S):
    """Value rules of the contract, one host sync; the message names the first broken rule."""
    if accept_idx.shape[0]:
        checks.raise_first(_accept_rules(prefix_lens, accept_idx, accept_lens, S, f"S={S}"))


def _accept_rules(prefix_lens, accept_idx, accept_lens, rows, label):
    """The value rules both layouts share (:mod:`specops.ops.checks` rules):
    accept_lens in [0, A], prefix_lens in [0, rows], accept_idx strictly increasing from 0, rows
    addressed < rows (``label`` names that limit)."""
    A = accept_idx.shape[1]
    j = torch.arange(A, device=accept_idx.device)
    valid = j[None, :] < accept_lens[:, None]  # [B, A]
    idx = accept_idx.to(torch.int64)
    prev = torch.cat([torch.full_like(idx[:, :1], -1), idx[:, :-1]], dim=1)
    src = prefix_lens.to(torch.int64)[:, None] + idx
    lens_bad = (accept_lens < 0) | (accept_lens > A)
    prefix_bad = (prefix_lens < 0) | (prefix_lens > rows)
    order_bad, past_bad = valid & (idx <= prev), valid & (src >= rows)

    def order():
        b, i = checks.first_index(order_bad)
        want = ">= 0" if i == 0 else f"> accept_idx[{b}, {i - 1}] = {int(accept_idx[b, i - 1])}"
        return (f"accept_idx[{b}, :accept_lens[{b}]] must be strictly increasing from >= 0: "
                f"accept_idx[{b}, {i}] must be {want}, got {int(accept_idx[b, i])}")

    def past():
        b, i = checks.first_index(past_bad)
        return (f"accept_idx[{b}, {i}] = {int(accept_idx[b, i])} plus prefix_lens[{b}] = "
                f"{int(prefix_lens[b])} must address a row < {label}")

    return [checks.rule("accept_lens", accept_lens, lens_bad, f"lie in [0, A={A}]"),
            checks.rule("prefix_lens", prefix_lens, prefix_bad, f"lie in [0, {label}]"), (order_bad, order),
            (past_bad, past)]


# ---- torch reference -------------------------------------------------------------------------------

def source_rows(prefix_lens, accept_idx, accept_lens, S):
    """Where every cache row takes its value from: the spec of the op as a gather map.

    Shape: prefix_lens, accept_lens int32 [B], accept_idx int32 [B, A] -> int64 [B, S].
    Row ``p + j`` (``j < n``) takes row ``p + accept_idx[j]``; every other row keeps its own value.
    Rows whose source or destination leaves ``[0, S)`` (only possible unchecked) keep their own."""
    B, A = accept_idx.shape
    dev = accept_idx.device
    rows = torch.arange(S, device=dev)
    j = rows[None, :] - prefix_lens.to(torch.int64)[:, None]  # [B, S] offset into the block
    n = accept_lens.to(torch.int64).clamp(0, A)[:, None]
    moved = (j >= 0) & (j < n)
    idx = accept_idx.to(torch.int64).gather(1, j.clamp(0, max(A - 1, 0)))
    src = prefix_lens.to(torch.int64)[:, None] + idx
    moved &= (src >= 0) & (src < S)
    return torch.where(moved, src, rows[None, :])


@register("kv_compact", "torch")
def _kv_compact_torch(k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
    # Gather every row from its source first, then write the whole result back: overlap-safe by
    # construction, so this is the reference the kernels are held to. It rewrites the whole cache
    # through a full-size temporary: the spec, not a fast path.
    L, B, H, S, D = k_cache.shape
    src = source_rows(prefix_lens, accept_idx, accept_lens, S)
    index = src[None, :, None, :, None].expand(L, B, H, S, D)
    for cache in (k_cache, v_cache):
        cache.copy_(cache.gather(3, index))


@register_compiled("kv_compact")
def _compiled(ns, k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
    ns.kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens)


@register("kv_compact", "triton")
def _kv_compact_triton(k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
    from ..triton_kernels import kv_compact as kernels

    kernels.kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens)


if extension.cpu_ext is not None or extension.cuda_ext is not None:

    @torch.library.register_fake("specops::kv_compact")
    def _(k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
        return None


# ---- paged KV cache ------------------------------------------------------------------------------

def kv_compact_paged(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens, *, check=True,
                     backend=None):
    """:func:`kv_compact` on a paged KV cache, all layers in one call.

    Shape: k_pages, v_pages [L, num_pages, page_size, Hkv, D] (fp32/fp16/bf16, same shape and
    dtype, stride 1 in D, page_size a power of two >= 1, modified in place; views are fine),
    page_table int32 [B, max_pages], prefix_lens int32 [B], accept_idx int32 [B, A],
    accept_lens int32 [B] -> None.

    Row ``r`` of sequence ``b`` is slot ``r % page_size`` of page ``page_table[b, r // page_size]``
    (see :func:`specops.tree_attention_paged`); with that placement the semantics are those of
    :func:`kv_compact`: in every layer and head, row ``prefix_lens[b] + accept_idx[b, j]`` moves
    to row ``prefix_lens[b] + j`` for ``j < accept_lens[b]``, as a gather of all sources followed
    by a scatter, so sources and destinations may share pages.

    ``check=True`` validates the values (one host sync): the rules of :func:`kv_compact` with
    S = max_pages * page_size rows; ``0 <= page_table[b, i] < num_pages`` for every page holding
    one of the sequence's first ``prefix_lens[b] + accept_idx[b, accept_lens[b] - 1] + 1`` rows
    (``prefix_lens[b]`` when nothing is accepted): the pages the call addresses; and a page a move
    writes is addressed once, by its own sequence (a page shared with another sequence or listed
    twice would be overwritten under the other entry too, and writes to it would race). Pages the
    moves only read, such as a shared prompt's, may be shared freely. Any error is raised before a
    byte is written. ``check=False`` skips them: moves whose rows or pages are out of range are
    skipped (never writing out of bounds), the result is otherwise unspecified.
    """
    dev = k_pages.device
    N, page_size = check_pools(k_pages, v_pages)
    checks.tensor("page_table", page_table, dtype=torch.int32, rank=2, device=dev)
    B = page_table.shape[0]
    check_accept(prefix_lens, accept_idx, accept_lens, B, dev)
    if check:
        check_paged_values(page_table, N, page_size, prefix_lens, accept_idx, accept_lens)
    impl = resolve("kv_compact_paged", dev, backend)
    if k_pages.numel() and accept_idx.shape[1] and B:
        impl(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens)
    return None


def paged_moves(page_table, page_size, prefix_lens, accept_idx, accept_lens):
    """Every row a compaction touches, as pool rows: the spec of the paged placement.

    Shape: page_table int32 [B, max_pages], prefix_lens / accept_lens int32 [B], accept_idx int32
    [B, A] -> (moving bool [B, A], src / dst logical rows int64 [B, A], src / dst pool pages int64
    [B, A] (-1 where the table cannot place the row), src / dst slots int64 [B, A]). ``moving``
    marks the moves that copy (not identities, rows inside the table's range)."""
    B, A = accept_idx.shape
    M = page_table.shape[1]
    rows = M * page_size
    j = torch.arange(A, device=accept_idx.device)
    p = prefix_lens.long()[:, None]
    src, dst = p + accept_idx.long(), p + j[None, :]
    moving = (j[None, :] < accept_lens.long().clamp(0, A)[:, None]) & (src != dst)
    moving &= (src >= 0) & (src < rows) & (dst >= 0) & (dst < rows)

    def place(r):
        if M == 0:  # no row can be placed (and none moves)
            return torch.full_like(r, -1), r % page_size
        page = page_table.long().gather(1, r.clamp(0, rows - 1) // page_size)
        return torch.where(moving, page, -1), r % page_size

    return (moving, src, dst, *place(src), *place(dst))


def check_paged_values(page_table, num_pages, page_size, prefix_lens, accept_idx, accept_lens):
    """Value rules of kv_compact_paged, one host sync; the message names the first broken rule."""
    B, A = accept_idx.shape
    M = page_table.shape[1]
    rows = M * page_size
    if B == 0:
        return
    idx = accept_idx.to(torch.int64)
    n = accept_lens.long().clamp(0, A)
    last = idx.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0] if A else torch.zeros_like(n)
    needed = prefix_lens.long() + torch.where(n > 0, last + 1, 0)
    needed = needed.clamp(max=rows)
    clash = _aliased_writes(page_table, num_pages, page_size, needed, prefix_lens, accept_idx, accept_lens)
    checks.raise_first(_accept_rules(prefix_lens, accept_idx, accept_lens, rows, f"max_pages * page_size = {rows}")
                       + [page_rules(page_table, needed, num_pages, page_size),
                          (clash, lambda: _aliased_message(clash, page_table, page_size, needed))])


def _aliased_writes(page_table, num_pages, page_size, needed, prefix_lens, accept_idx, accept_lens):
    """[B, max_pages] bool: page_table[b, i] holds a row the compaction writes, and the same pool page
    is also another addressed entry (another sequence's, or another page index of this one), among
    the first ceil(needed[b] / page_size) entries of every row. No host sync: entries sorted by
    pool page, counted per group."""
    B, M = page_table.shape
    dev = page_table.device
    moving, _, dst, _, _, dp, _ = paged_moves(page_table, page_size, prefix_lens, accept_idx, accept_lens)
    written = torch.zeros(B, M + 1, dtype=torch.long, device=dev)  # column M: moves that write nothing
    col = torch.where(moving & (dp >= 0) & (dp < num_pages), dst // page_size, M).clamp(0, M)
    written = written.scatter_add(1, col, torch.ones_like(col))[:, :M] > 0
    addressed = torch.arange(M, device=dev)[None, :] < ((needed.clamp(min=0) + page_size - 1) // page_size)[:, None]
    addressed &= (page_table >= 0) & (page_table < num_pages)
    n = B * M
    if n == 0:
        return written
    pool = torch.where(addressed, page_table.long(), -1 - torch.arange(n, device=dev).view(B, M)).flatten()
    order = torch.argsort(pool)
    ps = pool[order]
    group = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long, device=dev), (ps[1:] != ps[:-1]).long()]), 0)
    count = torch.zeros(n, dtype=torch.long, device=dev).scatter_add(0, group, torch.ones_like(group))
    shared = torch.zeros(n, dtype=torch.bool, device=dev)
    shared[order] = count[group] > 1
    return shared.view(B, M) & written & addressed


def _aliased_message(clash, page_table, page_size, needed):
    """The error for a written page that is addressed twice (error path: host syncs are fine)."""
    b, i = (int(x) for x in clash.nonzero()[0])
    page = int(page_table[b, i])
    pages_needed = (needed.clamp(min=0) + page_size - 1) // page_size
    for b2, i2 in (page_table == page).nonzero().tolist():
        if (b2, i2) != (b, i) and i2 < int(pages_needed[b2]):
            break
    return (f"page_table[{b}, {i}] = {page} holds rows the compaction writes (rows [{i * page_size}, "
            f"{(i + 1) * page_size}) of sequence {b}), so it must be no other entry the moves address, "
            f"got page_table[{b2}, {i2}] = {page} too")


@register("kv_compact_paged", "torch")
def _kv_compact_paged_torch(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens):
    # Gather every moving row's source first, then scatter to the destinations: overlap-safe by
    # construction. Moves whose pages leave the pool (unchecked input) are skipped, as the kernels do.
    N = k_pages.shape[1]
    moving, _, _, sp, ss, dp, ds = paged_moves(page_table, k_pages.shape[2], prefix_lens, accept_idx, accept_lens)
    moving = moving & (sp >= 0) & (sp < N) & (dp >= 0) & (dp < N)
    sel = moving.nonzero(as_tuple=True)
    for cache in (k_pages, v_pages):
        rows = cache[:, sp[sel], ss[sel]]  # [L, moves, Hkv, D], a copy
        cache[:, dp[sel], ds[sel]] = rows


@register_compiled("kv_compact_paged")
def _compiled_paged(ns, k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens):
    ns.kv_compact_paged(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens)


@register("kv_compact_paged", "triton")
def _kv_compact_paged_triton(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens):
    from ..triton_kernels import kv_compact as kernels

    kernels.kv_compact_paged(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens)


if (extension.cpu_ext is not None or extension.cuda_ext is not None) and extension.has_op("kv_compact_paged"):

    @torch.library.register_fake("specops::kv_compact_paged")
    def _(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens):
        return None
