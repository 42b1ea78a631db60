"""Plans: validate, dispatch and schedule (kv split count, partials workspace) once per step, run per
layer (:class:`TreeAttentionPlan` here, :class:`specops.ops.kv_compact.plan.KVCompactPlan` alike).
Why, and what a plan checks when: docs/plans.md."""
import torch

from ...backend import incapable, resolve_named
from .. import checks
from .. import tree_attention as _ta
from ..layout import KvLayout, Spec, check_heads, check_paging


class TreeAttentionPlan:
    """One decoding step's :func:`specops.tree_attention` (or ``tree_attention_paged``): ``plan.run(q, k,
    v)`` per layer.

    Shape: prefix_lens / block_lens / q_lens int32 [B], mask int32 [B, Tq, W]; contiguous layout
    (``page_table=None``): run(q [B, Tq, Hq, D], k, v [B, Hkv, S, D]); paged: page_table int32
    [B, max_pages], page_size (a power of two), run(q, k_pages, v_pages [num_pages, page_size, Hkv,
    D]); -> out [B, Tq, Hq, D] in ``dtype``. Hq = num_heads, Hkv = num_kv_heads, D = head_dim.

    ``max_len`` (S) / ``num_pages``, where given, let ``check=True`` check the values here, else at the
    first run; ``num_splits=`` overrides the split count; ``workspace=`` (or ``plan.workspace = ...``)
    replaces the plan's fp32 partials and must share no byte with the plan's tensors nor a run's q / k /
    v. An explicit ``backend=`` that cannot take the declared shapes raises BackendUnavailable here.
    ``invariant=True``: :func:`specops.tree_attention`'s batch-invariant schedule (``num_splits`` 1).
    When what is checked, the schedule and the workspace's size: docs/plans.md."""

    def __init__(self, prefix_lens, block_lens, mask, *, q_lens=None, sm_scale=None, page_table=None, page_size=None,
                 head_dim, num_heads, num_kv_heads, dtype, device=None, check=True, backend=None, max_len=None,
                 num_pages=None, num_splits=None, workspace=None, invariant=False):
        checks.tensor("prefix_lens", prefix_lens, dtype=torch.int32, rank=1)
        dev = prefix_lens.device if device is None else torch.device(device)
        B = prefix_lens.shape[0]
        checks.tensor("mask", mask, dtype=torch.int32, rank=3, device=dev)
        Tq = mask.shape[1]
        _ta.check_block(prefix_lens, block_lens, mask, q_lens, B, Tq, dev)
        D, Hq, Hkv = (checks.integer(name, v, 1) for name, v in
                      (("head_dim", head_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)))
        check_heads(Hq, Hkv, D, "num_kv_heads")
        if dtype not in _ta.FLOAT_DTYPES:
            raise TypeError(f"dtype must be one of {_ta.FLOAT_DTYPES}, got {dtype!r}")
        self.paged = page_table is not None
        if self.paged:
            page_size, num_pages = check_paging(page_table, page_size, num_pages, B, dev)
        elif page_size is not None:
            raise ValueError(f"page_size is for the paged layout: pass page_table too (got page_size={page_size} "
                             "and page_table=None)")
        if max_len is not None:
            max_len = checks.integer("max_len", max_len, 1)
        self.prefix_lens, self.block_lens, self.mask, self.q_lens = prefix_lens, block_lens, mask, q_lens
        self.page_table, self.page_size, self.max_len, self.num_pages = page_table, page_size, max_len, num_pages
        self.B, self.Tq, self.num_heads, self.num_kv_heads, self.head_dim = B, Tq, Hq, Hkv, D
        self.dtype, self.device, self.check, self._backend = dtype, dev, check, backend
        self.sm_scale = _ta.scale(sm_scale, D)
        self.invariant = _ta.check_invariant(invariant)
        if invariant and num_splits not in (None, 1):
            raise ValueError(f"num_splits must be None or 1 with invariant=True (the invariant schedule is unsplit), "
                             f"got {num_splits!r}")
        self._table = (page_table,) if self.paged else ()  # the layout's argument after k, v
        self.op = "tree_attention_paged" if self.paged else "tree_attention"
        self._names = ("q", "k_pages", "v_pages") if self.paged else ("q", "k_cache", "v_cache")
        size = num_pages if self.paged else max_len
        # The backend (name) and kernel (what run and the compiled step call) chosen for the declared shapes.
        self.backend, self.kernel = resolve_named(self.op, dev, backend, self._args(Spec((B, Tq, Hq, D), dtype, dev),
                                                                                  self._declared_layout(size or 1)))
        if num_splits is not None:
            num_splits = checks.integer("num_splits", num_splits, 1, _ta.splits.MAX_SPLITS, "the combine's limit")
        self._forced_splits, self._num_splits, self._workspace, self._given = num_splits, None, None, None
        self._shapes = None  # (q, k, v) shapes of the first run: what every later run must pass
        self._recheck = False  # the next run checks only a newly assigned workspace
        if num_splits is not None or size is not None:
            self._schedule(self._declared_layout(size or 0).rows())
        self._values_pending = check and size is None  # the first run checks the values against its cache
        if check and size is not None:
            _ta.length_values(prefix_lens, block_lens, q_lens, self._declared_layout(size), mask.shape[2], Tq)
        self._first = True
        if workspace is not None:
            self.workspace = workspace

    def _declared_layout(self, size):
        """The layout the plan was declared with, ``size`` rows (contiguous) or pool pages (paged)."""
        if self.paged:
            pool = Spec((size, self.page_size, self.num_kv_heads, self.head_dim), self.dtype, self.device)
            return KvLayout.paged(pool, pool, self.page_table)
        cache = Spec((self.B, self.num_kv_heads, size, self.head_dim), self.dtype, self.device)
        return KvLayout.contiguous(cache, cache)

    def _args(self, q, kv):
        return (q, *kv.tensors(), self.prefix_lens, self.block_lens, self.mask, self.q_lens, self.sm_scale)

    @property
    def num_splits(self):
        """The kv split count of every ``run`` (None until chosen: at construction or the first run)."""
        return self._num_splits

    @property
    def workspace(self):
        """The fp32 partials buffer every ``run`` hands its kernel (None without splits); the plan's
        own unless one was assigned."""
        return self._workspace

    @workspace.setter
    def workspace(self, ws):
        if ws is not None:
            checks.tensor("workspace", ws, dtype=torch.float32, device=self.device)
            if not ws.is_contiguous():
                raise ValueError(f"workspace must be contiguous, got shape {tuple(ws.shape)} with strides "
                                 f"{ws.stride()}")
            checks.disjoint("workspace", ws, {"prefix_lens": self.prefix_lens, "block_lens": self.block_lens,
                                              "mask": self.mask, "q_lens": self.q_lens, "page_table": self.page_table})
        self._given = ws
        if self._num_splits is not None:
            self._allocate()
        if ws is not None and not self._first:  # a run already passed: the next checks it against its q / k / v
            self._first, self._recheck = True, True

    def _allocate(self):
        """The partials of the chosen split count: the buffer passed in (size checked), or the plan's own."""
        size = _ta.splits.workspace_size(self._num_splits, self.B, self.Tq, self.num_heads, self.head_dim)
        if self._given is not None:
            if self._given.numel() < size:
                raise ValueError(f"workspace must have >= num_splits * B * Tq * Hq * (D + 1) = {size} elements "
                                 f"(num_splits={self._num_splits}), got {self._given.numel()}")
            self._workspace = self._given
        else:
            self._workspace = torch.empty(size, dtype=torch.float32, device=self.device) if size else None

    def _schedule(self, rows):
        """Chooses the split count for ``rows`` addressable rows per sequence, then the workspace."""
        q = Spec((self.B, self.Tq, self.num_heads, self.head_dim), self.dtype, self.device)
        self._num_splits = self._forced_splits or _ta.choose_splits(
            self.backend, q, self.num_kv_heads, rows, self.prefix_lens, self.block_lens, self.mask.shape[2],
            self.paged, invariant=self.invariant)
        self._allocate()

    def _first_run(self, q, k, v):
        """The op's metadata rules on the first run's q / k / v, reconciled with every declared size; after
        a workspace assigned later, only the shapes and that workspace."""
        if self._recheck:
            checks.same_shapes(self._names, (q.shape, k.shape, v.shape), self._shapes)
        else:
            checks.tensor("q", q, dtype=self.dtype, shape=(self.B, self.Tq, self.num_heads, self.head_dim),
                          device=self.device)
            kv = KvLayout(k, v, *self._table)
            kv.check(dtype=q.dtype, rank=4, device=q.device, B=self.B, D=self.head_dim, Hq=self.num_heads)
            name = kv.names[0]
            if self.paged:
                checks.declared(name, "page_size", kv.page_size, "page_size", self.page_size)
            checks.declared(name, "Hkv", kv.num_kv_heads, "num_kv_heads", self.num_kv_heads)
            if self.paged:
                checks.declared(name, "num_pages", kv.num_pages, "num_pages", self.num_pages)
            else:
                checks.declared(name, "S", kv.rows(), "max_len", self.max_len)
            if self._values_pending:
                _ta.length_values(self.prefix_lens, self.block_lens, self.q_lens, kv, self.mask.shape[2],
                                  self.Tq)
            args = self._args(q, kv)
            if incapable(self.op, self.backend, args) is not None:
                self.backend, self.kernel = resolve_named(self.op, self.device, self._backend, args)
                self._num_splits = None
            if self._num_splits is None:
                self._schedule(kv.rows())
        if self._given is not None and self._workspace is self._given:  # the plan's own cannot overlap
            checks.disjoint("workspace", self._given, dict(zip(self._names, (q, k, v))))
        self._shapes, self._first, self._recheck = (q.shape, k.shape, v.shape), False, False

    def run(self, q, k, v):
        """One layer (shapes: the class's); after the first run only the shapes are compared with its."""
        if self._first:
            self._first_run(q, k, v)
        elif (q.shape, k.shape, v.shape) != self._shapes:
            checks.same_shapes(self._names, (q.shape, k.shape, v.shape), self._shapes)
        return self.kernel(q, k, v, *self._table, self.prefix_lens, self.block_lens, self.mask, self.q_lens,
                          self.sm_scale, self._num_splits, self._workspace, self.invariant)
