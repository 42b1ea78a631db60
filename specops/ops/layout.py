"""The KV layout of the attention and compaction ops, one type for both cache layouts (the Python twin
of the C++ ``KvView``, csrc/tree_attention_args.h): paging is a field (a page table), not a second op.

- contiguous: k, v [*lead, B, Hkv, S, D]; row ``r`` of sequence ``b`` is ``k[..., b, :, r]``.
- paged: k, v [*lead, num_pages, page_size, Hkv, D] (page_size a power of two), page_table int32
  [B, max_pages]; row ``r`` of sequence ``b`` is slot ``r % page_size`` of page ``page_table[b, r //
  page_size]``. ``lead``: none for tree_attention, the layers for kv_compact."""
import math

import torch

from . import checks


class Spec:
    """A stand-in tensor (declared shape, dtype, device; dense strides; no storage) that plans validate
    and schedule against before the caches exist."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, device
        # dense: a dim's stride is the product of the later sizes (empty dims count as 1, as torch's)
        self.strides = tuple(math.prod(max(n, 1) for n in self.shape[i + 1:]) for i in range(len(self.shape)))

    def dim(self):
        return len(self.shape)

    def element_size(self):
        return torch.empty((), dtype=self.dtype).element_size()

    def stride(self, dim=None):
        return self.strides if dim is None else self.strides[dim]


class KvLayout:
    """K and V of a KV cache in one of the two layouts (see the module). ``page_size``: the size a
    paged layout was declared with (None: the pool's, ``k.shape[-3]``); :meth:`check` compares them."""

    def __init__(self, k, v, page_table=None, page_size=None):
        self.k, self.v, self.page_table, self.declared_page_size = k, v, page_table, page_size
        self.is_paged = page_table is not None

    @classmethod
    def contiguous(cls, k, v):
        return cls(k, v)

    @classmethod
    def paged(cls, k_pages, v_pages, page_table, page_size=None):
        if page_table is None:
            raise TypeError("page_table must be a torch.Tensor for a paged layout, got None")
        return cls(k_pages, v_pages, page_table, page_size)

    @property
    def names(self):
        """The argument names of K and V in errors."""
        return ("k_pages", "v_pages") if self.is_paged else ("k_cache", "v_cache")

    def op(self, stem):
        """The registered op of this layout: ``stem`` or ``stem + "_paged"`` (separate compiled ops)."""
        return stem + "_paged" if self.is_paged else stem

    def tensors(self):
        """The layout's leading positional arguments of its compiled op: (k, v[, page_table])."""
        return (self.k, self.v, self.page_table) if self.is_paged else (self.k, self.v)

    @property
    def lead(self):
        return self.k.dim() - 4

    @property
    def num_kv_heads(self):
        return self.k.shape[self.lead + (2 if self.is_paged else 1)]

    @property
    def page_size(self):
        return self.k.shape[self.lead + 1] if self.is_paged else None

    @property
    def num_pages(self):
        return self.k.shape[self.lead] if self.is_paged else None

    def batch(self):
        """B: the sequences the layout holds (paged: the page table's rows)."""
        return self.page_table.shape[0] if self.is_paged else self.k.shape[self.lead]

    def capacity(self):
        """Rows a sequence can hold, as the value rules bound them: S, or max_pages * page_size."""
        return self.page_table.shape[1] * self.page_size if self.is_paged else self.k.shape[-2]

    def rows(self):
        """Rows a sequence can address as the kernels count them (KvView's S): :meth:`capacity`, 0 for
        an empty pool, at most int32's largest."""
        if not self.is_paged:
            return self.k.shape[-2]
        return min(self.capacity(), 2**31 - 1) if self.num_pages else 0

    def address(self, b, r):
        """Where row ``r`` of sequence ``b`` lives (int64 tensors, broadcast together): indices into k's dims
        (lead, lead + 2) = (b, r) contiguous, (lead, lead + 1) = (page, slot) paged. Paged rows past the table
        read its last entry: callers mask them (page ids not clamped). Tensors pass through (no host data)."""
        b, r = (x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in (b, r))
        b, r = torch.broadcast_tensors(b.long(), r.long())
        if not self.is_paged:
            return b, r
        ps = self.page_size
        col = (r // ps).clamp(0, max(self.page_table.shape[1] - 1, 0))
        return self.page_table.long()[b, col], r % ps

    def index(self, x, y):
        """The index of k / v selecting the rows at an :meth:`address` ``(x, y)``: ``k[index]`` is
        [n, *lead, Hkv, D] contiguous, [*lead, n, Hkv, D] paged (x, y int64 [n])."""
        lead = (slice(None),) * self.lead
        return lead + ((x, y) if self.is_paged else (x, slice(None), y))

    def gather(self):
        """The contiguous layout this one stands for (the references' view, page ids clamped into the
        pool as the kernels clamp them): [*lead, B, Hkv, max_pages * page_size, D]; zeros from an empty
        pool; a contiguous layout is itself."""
        if not self.is_paged:
            return self
        B, M = self.page_table.shape
        out = []
        for pages in (self.k, self.v):
            *lead, N, P, H, D = pages.shape
            if N == 0:  # an empty pool reads as one page of zeros
                pages, N = pages.new_zeros(*lead, 1, P, H, D), 1
            rows = pages[(slice(None),) * len(lead) + (self.page_table.long().clamp(0, N - 1),)]  # [*lead, B, M, P, H, D]
            out.append(rows.reshape(*lead, B, M * P, H, D).transpose(-3, -2))
        return KvLayout.contiguous(*out)

    # ---- validation ------------------------------------------------------------------------------

    def check(self, *, dtype, rank, device=None, B=None, D=None, Hq=None, distinct=False, table=True):
        """The metadata rules (no host sync): K a ``dtype`` tensor of ``rank``, stride 1 in D, a power-of-two
        page size; where given, on ``device``, the query's batch ``B`` and head dim ``D``, kv heads dividing
        ``Hq``; V like K; ``distinct`` (they are written): separate memory, no element addressed twice;
        the page table int32 [B, max_pages] on K's device (``table=False``: checked already)."""
        k_name, v_name = self.names
        k = checks.tensor(k_name, self.k, dtype=dtype, rank=rank, device=device, last_stride_one=True)
        lead = rank - 4
        if self.is_paged:
            checks.power_of_two(f"{k_name} page_size (dim {lead + 1})", k.shape[lead + 1], f" (shape {tuple(k.shape)})")
            checks.declared(k_name, "page_size", self.page_size, "page_size", self.declared_page_size, "layout")
        if D is not None and (k.shape[-1] != D or not (self.is_paged or k.shape[lead] == B)):
            want = "[num_pages, page_size, Hkv, D={D}]" if self.is_paged else "[B={B}, Hkv, S, D={D}]"
            raise ValueError(f"{k_name} must have shape {want.format(B=B, D=D)} (q is [B, Tq, Hq, D]), "
                             f"got {tuple(k.shape)}")
        if Hq is not None:
            check_heads(Hq, self.num_kv_heads, k.shape[-1], k_name)
        checks.tensor(v_name, self.v, dtype=k.dtype, shape=tuple(k.shape), device=k.device, last_stride_one=True)
        if distinct:
            check_distinct(k, self.v, k_name, v_name)
        if self.is_paged and table:
            check_table(self.page_table, B, k.device)
        return self

    def page_rule(self, rows_needed):
        """The :mod:`specops.ops.checks` rule that a page holding one of sequence b's first
        ``rows_needed[b]`` rows is a pool page, ``0 <= page_table[b, i] < num_pages``. Shape: rows_needed
        int64 [B] (<= :meth:`capacity`: more is another rule's error) -> (bool [B, max_pages], message())."""
        page_table, page_size, num_pages = self.page_table, self.page_size, self.num_pages
        max_pages = page_table.shape[1]
        pages_needed = (rows_needed.clamp(min=0) + page_size - 1) // page_size  # [B]
        used = torch.arange(max_pages, device=page_table.device)[None, :] < pages_needed[:, None]
        bad = used & ((page_table < 0) | (page_table >= num_pages))

        def message():
            b, i = checks.first_index(bad)
            return (f"page_table[{b}, {i}] must lie in [0, num_pages={num_pages}) (page {i} holds rows "
                    f"[{i * page_size}, {(i + 1) * page_size}) of sequence {b}, which uses "
                    f"{int(rows_needed[b])} rows), got {int(page_table[b, i])}")

        return bad, message


def check_table(page_table, B, device):
    """A page table int32 [B, max_pages] (B None: any) on ``device``."""
    return checks.tensor("page_table", page_table, dtype=torch.int32, rank=2,
                         shape=None if B is None else (B, None), device=device)


def check_paging(page_table, page_size, num_pages, B, device):
    """A plan's paged-layout arguments: page_table int32 [B, max_pages], page_size a power of two,
    num_pages (optional) >= 1. -> (page_size, num_pages)."""
    check_table(page_table, B, device)
    page_size = checks.power_of_two("page_size", checks.integer("page_size", page_size, 1))
    return page_size, (None if num_pages is None else checks.integer("num_pages", num_pages, 1))


def check_heads(Hq, Hkv, D, kv_name):
    """GQA/MQA: the kv heads divide the query heads; a non-empty head dim."""
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{kv_name} heads must divide q heads (Hq % Hkv == 0), got Hq={Hq}, Hkv={Hkv}")
    if D == 0:
        raise ValueError("q must have a non-empty head dimension D, got D=0")


def no_self_overlap(sizes, strides):
    """Sufficient for distinct indices to address distinct elements: ordered by stride, each stride
    exceeds the span of the smaller ones (true of any slice / permute / select of a dense tensor, not of
    an expanded view)."""
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1)
    span = 0  # largest element offset reachable with the dims seen so far
    for st, sz in dims:
        if st <= span:
            return False
        span += st * (sz - 1)
    return True


def check_distinct(k, v, k_name, v_name):
    """Each cache's rows are distinct memory (else writes race) and K shares none with V (else moving K
    moves V too). Metadata only: shapes, strides and data addresses."""
    for name, t in ((k_name, k), (v_name, v)):
        if not t.is_contiguous() and not no_self_overlap(t.shape, t.stride()):
            raise ValueError(f"{name} must not address one element twice (e.g. an expanded view), "
                             f"got shape {tuple(t.shape)} with strides {t.stride()}")
    if torch.compiler.is_compiling() or k.numel() == 0:
        return  # fake tensors have no storage address to compare
    (k_lo, k_hi), (v_lo, v_hi) = checks.byte_range(k), checks.byte_range(v)
    if k_hi <= v_lo or v_hi <= k_lo:
        return  # disjoint address ranges: the common case, decided without touching storages
    # Interleaved ranges (e.g. K and V are kv[:, 0] and kv[:, 1] of one [L, 2, ...] tensor). With
    # equal strides the pair is one tensor with an extra dim of size 2 and stride |address gap|.
    gap, rem = divmod(abs(v_lo - k_lo), k.element_size())
    if k.stride() == v.stride() and rem == 0 and gap > 0 and no_self_overlap(tuple(k.shape) + (2,),
                                                                              k.stride() + (gap,)):
        return
    raise ValueError(f"{v_name} must not share memory with {k_name}, got address ranges that interleave "
                     f"{abs(v_lo - k_lo)} bytes apart with strides {k.stride()} and {v.stride()}")


__all__ = ["KvLayout", "Spec"]
