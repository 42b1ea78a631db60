"""The plan of kv_compact: the op's checks and dispatch once per step, ``run`` per call (why, and
what is checked when: docs/plans.md)."""
import torch

from ...backend import resolve
from .. import checks
from .. import kv_compact as _kvc
from ..layout import KvLayout, Spec, check_paging


class KVCompactPlan:
    """One step's :func:`specops.kv_compact` (or ``kv_compact_paged``): ``plan.run(k, v)``.

    Shape: lens int32 [B] (the op's ``prefix_lens``), accept_idx int32 [B, A], accept_lens int32 [B];
    contiguous (``max_len`` = S): run(k, v [L, B, Hkv, S, D]); paged (``page_table`` int32
    [B, max_pages], ``page_size``): run(k_pages, v_pages [L, num_pages, page_size, Hkv, D]);
    L = num_layers, Hkv = num_kv_heads, D = head_dim. Both modified in place; nothing is written by a
    call that raises (the checks, and when they run: docs/plans.md §What a plan checks, and when)."""

    def __init__(self, lens, accept_idx, accept_lens, *, num_layers, num_kv_heads, head_dim, max_len=None,
                 page_table=None, page_size=None, num_pages=None, dtype, device=None, check=True, backend=None):
        checks.tensor("lens", lens, dtype=torch.int32, rank=1)
        dev = lens.device if device is None else torch.device(device)
        B = lens.shape[0]
        _kvc.check_accept(lens, accept_idx, accept_lens, B, dev, lens_name="lens")
        L, Hkv, D = (checks.integer(name, v, 1) for name, v in
                     (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)))
        if dtype not in _kvc.CACHE_DTYPES:
            raise TypeError(f"dtype must be one of {_kvc.CACHE_DTYPES}, got {dtype!r}")
        self.paged = page_table is not None
        if self.paged:
            if max_len is not None:
                raise ValueError(f"max_len is for the contiguous layout, got max_len={max_len} with a page_table")
            page_size, num_pages = check_paging(page_table, page_size, num_pages, B, dev)
        else:
            if max_len is None:
                raise TypeError("KVCompactPlan needs max_len (contiguous layout) or page_table and page_size (paged)")
            max_len = checks.integer("max_len", max_len, 1)
        self.lens, self.accept_idx, self.accept_lens = lens, accept_idx, accept_lens
        self.page_table, self.page_size, self.max_len, self.num_pages = page_table, page_size, max_len, num_pages
        self.num_layers, self.B, self.num_kv_heads, self.head_dim = L, B, Hkv, D
        self.dtype, self.device = dtype, dev
        self._table = (page_table,) if self.paged else ()  # the layout's argument after k, v
        self.op = "kv_compact_paged" if self.paged else "kv_compact"
        self._impl = resolve(self.op, dev, backend)
        # The kernels are never launched for an empty acceptance (the ops' rule).
        self._noop = accept_idx.shape[1] == 0 or B == 0
        size = num_pages if self.paged else max_len  # None: the pool's, known at the first run
        self._values_pending = check and size is None
        if check and size is not None:
            _kvc.accept_values(self._declared_layout(size), lens, accept_idx, accept_lens)
        self._first, self._shape = True, None

    def _declared_layout(self, size):
        """The layout the plan was declared with: ``size`` rows (contiguous) or pool pages (paged)."""
        L, B, H, D = self.num_layers, self.B, self.num_kv_heads, self.head_dim
        shape = (L, size, self.page_size, H, D) if self.paged else (L, B, H, size, D)
        cache = Spec(shape, self.dtype, self.device)
        return KvLayout(cache, cache, *self._table)

    def _first_run(self, k, v):
        kv = KvLayout(k, v, *self._table)
        kv.check(dtype=_kvc.CACHE_DTYPES, rank=5, distinct=True, table=False)
        want = self._declared_layout(kv.num_pages if self.paged else self.max_len).k.shape
        name = kv.names[0]
        if tuple(k.shape) != want or k.dtype != self.dtype or k.device != self.device:
            raise ValueError(f"{name} must be a {self.dtype} tensor of shape {list(want)} on {self.device} (the "
                             f"plan's), got {k.dtype} {tuple(k.shape)} on {k.device}")
        if self.paged:
            checks.declared(name, "num_pages", kv.num_pages, "num_pages", self.num_pages)
        if self._values_pending:
            _kvc.accept_values(kv, self.lens, self.accept_idx, self.accept_lens)
        self._shape, self._first = k.shape, False

    def run(self, k, v):
        """Compacts ``k`` and ``v`` in place (all layers). Shape: see the class. -> None."""
        if self._first:
            self._first_run(k, v)
        elif k.shape != self._shape or v.shape != self._shape:
            checks.same_shapes(KvLayout(k, v, *self._table).names, (k.shape, v.shape), (self._shape, self._shape))
        if not self._noop:
            self._impl(k, v, *self._table, self.lens, self.accept_idx, self.accept_lens)
