"""KV-cache compaction after acceptance: move the accepted draft rows next to the committed prefix.

The cache stacks every layer, ``[L, B, Hkv, S, D]``. Sequence ``b`` has ``prefix_lens[b]`` committed
rows, then its last draft block, whose nodes ``accept_idx[b, :accept_lens[b]]`` (strictly increasing
offsets, usually from the root 0) were accepted. In every layer and head, row ``prefix_lens[b] +
accept_idx[b, j]`` moves to row ``prefix_lens[b] + j``: all sources gathered, then scattered (they
overlap), on every backend. Later rows keep what they held; truncation needs no op (lower the lengths)."""

import torch

from ...backend import register_op, resolve
from .. import checks
from ..layout import KvLayout
from . import ref

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def compact(kv, prefix_lens, accept_idx, accept_lens, *, check=True, backend=None):
    """The op on the :class:`~specops.ops.layout.KvLayout` ``kv`` of all layers (both entries call it)."""
    kv.check(dtype=CACHE_DTYPES, rank=5, distinct=True)
    B, dev = kv.batch(), kv.k.device
    check_accept(prefix_lens, accept_idx, accept_lens, B, dev)
    if check:
        accept_values(kv, prefix_lens, accept_idx, accept_lens)
    impl = resolve(kv.op("kv_compact"), dev, backend)
    if kv.k.numel() and accept_idx.shape[1] and B:
        impl(*kv.tensors(), prefix_lens, accept_idx, accept_lens)


def kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens, *, check=True, backend=None):
    """Compacts the accepted rows of the last draft block of every sequence, all layers in one call.

    Shape: k_cache, v_cache [L, B, Hkv, S, D] (fp32/fp16/bf16, alike, stride 1 in D, modified in place;
    views are fine), prefix_lens int32 [B], accept_idx int32 [B, A], accept_lens int32 [B] -> None.
    ``accept_idx[b, j >= accept_lens[b]]`` is padding; the caller adds ``accept_lens`` to ``prefix_lens``.

    ``check=True`` (one host sync; a call that raises writes nothing): ``0 <= accept_lens[b] <= A``,
    ``0 <= prefix_lens[b] <= S``, ``accept_idx[b, :accept_lens[b]]`` strictly increasing from ``>= 0``
    with ``prefix_lens[b] + accept_idx[b, j] < S``. ``check=False``: the kernels skip moves whose source
    or destination is outside ``[0, S)`` (never writing out of bounds); the result is unspecified."""
    return compact(KvLayout.contiguous(k_cache, v_cache), prefix_lens, accept_idx, accept_lens, check=check,
                   backend=backend)


def kv_compact_paged(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens, *, check=True,
                     backend=None):
    """:func:`kv_compact` on a paged KV cache, all layers in one call.

    Shape: k_pages, v_pages [L, num_pages, page_size, Hkv, D] (fp32/fp16/bf16, alike, stride 1 in D,
    page_size a power of two, modified in place; views are fine), page_table int32 [B, max_pages],
    prefix_lens int32 [B], accept_idx int32 [B, A], accept_lens int32 [B] -> None.

    Rows map to pages as in :mod:`specops.ops.layout`; the moves are :func:`kv_compact`'s, so sources and
    destinations may share pages. ``check=True``: :func:`kv_compact`'s rules with S = max_pages * page_size;
    ``0 <= page_table[b, i] < num_pages`` for the pages the call addresses (those holding the first
    ``prefix_lens[b] + accept_idx[b, accept_lens[b] - 1] + 1`` rows, ``prefix_lens[b]`` when nothing is
    accepted); and a page a move writes is addressed once, by its own sequence (else another entry's rows
    are overwritten too, in a race); pages only read (a shared prompt's) may be shared. ``check=False``: as
    :func:`kv_compact`'s."""
    return compact(KvLayout.paged(k_pages, v_pages, page_table), prefix_lens, accept_idx, accept_lens,
                   check=check, backend=backend)


def check_accept(prefix_lens, accept_idx, accept_lens, B, dev, lens_name="prefix_lens"):
    """The acceptance's metadata rules (int32 [B], [B, A], [B]; no host sync); ``lens_name``: the
    committed lengths' name in errors."""
    checks.lengths(lens_name, prefix_lens, B, dev)
    checks.tensor("accept_idx", accept_idx, dtype=torch.int32, rank=2, shape=(B, None), device=dev)
    checks.lengths("accept_lens", accept_lens, B, dev)


# ---- validation ----------------------------------------------------------------------------------

def accept_values(kv, prefix_lens, accept_idx, accept_lens):
    """The ``check=True`` rules of both entries on the layout ``kv`` (one host sync; the first broken
    rule raises)."""
    B, A = accept_idx.shape
    if B == 0:
        return
    rows = kv.capacity()
    label = f"max_pages * page_size = {rows}" if kv.is_paged else f"S={rows}"  # names the limit in errors
    j = torch.arange(A, device=accept_idx.device)
    valid = j[None, :] < accept_lens[:, None]  # [B, A]
    idx = accept_idx.to(torch.int64)
    prev = torch.cat([torch.full_like(idx[:, :1], -1), idx[:, :-1]], dim=1)
    p = prefix_lens.to(torch.int64)[:, None]
    src = p + idx
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

    rules = [checks.rule("accept_lens", accept_lens, lens_bad, f"lie in [0, A={A}]"),
             checks.rule("prefix_lens", prefix_lens, prefix_bad, f"lie in [0, {label}]"), (order_bad, order),
             (past_bad, past)]
    if kv.is_paged:  # the rows addressed: to the last accepted source (exact once the rules above pass)
        needed = torch.cat([p, torch.where(valid, src + 1, 0)], 1).amax(1).clamp(max=rows)
        clash, addressed = _aliased_writes(kv, needed, prefix_lens, accept_idx, accept_lens)
        rules += [kv.page_rule(needed),
                  (clash, lambda: _aliased_message(clash, addressed, kv.page_table, kv.page_size))]
    checks.raise_first(rules)


def _aliased_writes(kv, needed, prefix_lens, accept_idx, accept_lens):
    """(clash, addressed), bool [B, max_pages]: entry (b, i) is a pool page among the first
    ceil(needed[b] / page_size) of its row (addressed), and holds a row the compaction writes while its
    page is another addressed entry too (clash). No host sync."""
    page_table, page_size, N = kv.page_table, kv.page_size, kv.num_pages
    B, M = page_table.shape
    dev = page_table.device
    moving, _, dst, _, _ = ref.moves(kv, prefix_lens, accept_idx, accept_lens)
    col = torch.where(moving, dst // page_size, M)  # column M: moves that write nothing
    written = torch.zeros(B, M + 1, dtype=torch.bool, device=dev).scatter(1, col, moving)[:, :M]
    pages = (needed.clamp(min=0) + page_size - 1) // page_size  # [B]: the entries each row addresses
    addressed = torch.arange(M, device=dev)[None, :] < pages[:, None]
    addressed &= (page_table >= 0) & (page_table < N)
    page = torch.where(addressed, page_table.long(), N).flatten()  # page N: entries not addressed
    count = torch.zeros(N + 1, dtype=torch.long, device=dev).scatter_add(0, page, torch.ones_like(page))
    return (count[page] > 1).view(B, M) & written & addressed, addressed


def _aliased_message(clash, addressed, page_table, page_size):
    """The error for a written page addressed twice (the error path: host syncs are fine)."""
    b, i = (int(x) for x in clash.nonzero()[0])
    page = int(page_table[b, i])
    b2, i2 = next(e for e in ((page_table == page) & addressed).nonzero().tolist() if e != [b, i])
    return (f"page_table[{b}, {i}] = {page} holds rows the compaction writes (rows [{i * page_size}, "
            f"{(i + 1) * page_size}) of sequence {b}), so it must be no other entry the moves address, "
            f"got page_table[{b2}, {i2}] = {page} too")


# ---- backends ---------------------------------------------------------------------------------------

def _triton(name):
    """The Triton kernel ``name`` (its module imported at the first call)."""
    def call(*args):
        from ...triton_kernels import kv_compact

        return getattr(kv_compact, name)(*args)

    return call


for _op in ("kv_compact", "kv_compact_paged"):
    register_op(_op, ref.kv_compact, _triton(_op), lambda *args: None)
