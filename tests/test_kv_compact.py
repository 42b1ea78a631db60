"""kv_compact on both KV layouts (contiguous, and paged: kv_compact_paged): golden moves on every
backend and layout, overlap patterns, every backend vs a gather-then-scatter reference, strided views,
pages shared and scattered, unchecked input, registration (bad input: tests/test_bad_input.py)."""
import functools

import pytest
import torch
from _op_args import valid_args
from _op_checks import needs_cpp

import specops
from specops import backend as _backend
from specops.ops.kv_compact.ref import moves
from specops.ops.layout import KvLayout
from specops.testing import from_pages, random_accept, to_pages

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "paged")  # the contiguous op, or the paged one on the same rows in scattered pages


def need(op, backend):
    if backend not in _backend.implementations(op):
        pytest.skip(f"{op} has no {backend} implementation")


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def expected(cache, prefix_lens, accept_idx, accept_lens):
    """Every accepted source gathered from the untouched ``cache``, scattered into a copy, per sequence."""
    out = cache.clone()
    for b in range(cache.shape[1]):
        p, n = int(prefix_lens[b]), int(accept_lens[b])
        out[:, b, :, p:p + n] = cache[:, b][:, :, [p + int(j) for j in accept_idx[b, :n]]]
    return out


def caches(L, B, H, S, D, dtype=torch.float32, device="cpu", view="contiguous"):
    """K and V filled with distinct random values, as contiguous tensors or as views of bigger ones."""
    rnd = functools.partial(torch.randn, dtype=dtype, device=device)
    if view == "contiguous":
        return rnd(L, B, H, S, D), rnd(L, B, H, S, D)
    if view == "sliced":  # padded head dim; a batch and a strided head slice of a bigger cache
        return tuple(rnd(L, B + 2, 2 * H, S + 3, D + 5)[:, 1:B + 1, ::2, :S, :D] for _ in range(2))
    if view == "interleaved":  # one [L, 2, B, H, S, D] tensor: K and V share a storage
        return rnd(L, 2, B, H, S, D).unbind(1)
    if view == "seq_major":  # stored [L, B, S, H, D], viewed as [L, B, H, S, D]
        return tuple(rnd(L, B, S, H, D).transpose(2, 3) for _ in range(2))
    raise ValueError(view)


def random_moves(B, A, S, pattern, g, last_row=False):
    """Valid moves over S cache rows, on cpu: (prefix_lens, accept_idx, accept_lens), the last two drawn by
    ``random_accept`` (``pattern``), prefixes up to the largest that keeps every source inside S
    (``last_row``: sequence 0's last source is the cache's last row)."""
    idx, lens = random_accept(B, A, generator=g, pattern=pattern)
    top = S - 1 - torch.where(lens > 0, idx.gather(1, (lens.long() - 1).clamp(min=0)[:, None])[:, 0], 0)
    prefix = (torch.rand(B, generator=g) * (top + 1).float()).long().clamp(max=top).to(torch.int32)
    if last_row:
        prefix[0] = top[0]
    return prefix, idx, lens


def compaction_case(B, A, pattern, page_size, dtype, seed, L=2, H=2, D=8, extra=5, device="cpu"):
    """A contiguous cache [L, B, H, S, D] with S = A + extra, its paged layout and valid moves."""
    g = torch.Generator().manual_seed(seed)
    S = A + extra
    prefix, idx, lens = random_moves(B, A, S, pattern, g)
    cache = torch.randn(L, B, H, S, D, generator=g).to(dtype)
    k_pages, table = to_pages(cache, page_size, generator=g, fill=7.0)
    v_pages = -k_pages  # V = -K, in the same pages
    lens_args = [t.to(device) for t in (prefix, idx, lens)]
    return cache.to(device), k_pages.to(device), v_pages.to(device), table.to(device), lens_args


def geometry(cache, **kw):
    """KVCompactPlan's geometry arguments for a contiguous cache [L, B, H, S, D] (``kw``: any others)."""
    L, _, H, _, D = cache.shape
    return dict(num_layers=L, num_kv_heads=H, head_dim=D, dtype=cache.dtype, **kw)


def run_and_compare(k, v, prefix_lens, accept_idx, accept_lens, backend):
    want_k, want_v = (expected(t, prefix_lens, accept_idx, accept_lens) for t in (k, v))
    strides = (k.stride(), v.stride())
    assert specops.kv_compact(k, v, prefix_lens, accept_idx, accept_lens, backend=backend) is None
    assert (k.stride(), v.stride()) == strides
    assert torch.equal(k, want_k) and torch.equal(v, want_v), "caches differ from gather-then-scatter"


# ---- golden moves, each on every backend -----------------------------------------------------------

# name: ((L, H, D, page_size), prefix_lens, accept_idx, accept_lens, rows): row r of sequence b ends up
# holding what row rows[b][r] held
GOLDEN = {
    # prefix 3, block rows 3..8; accept nodes 0, 2, 5 -> rows 3, 5, 8 move to rows 3, 4, 5
    "next_to_prefix": ((2, 2, 4, 4), [3], [[0, 2, 5, 1, 1, 1]], [3], [[0, 1, 2, 3, 5, 8, 6, 7, 8, 9]]),
    # accept nodes 1..30 after a prefix of 3: destination j is the source of move j - 1 (paged: all
    # inside one 64-row page), so every source must be read before it is overwritten
    "shift_chain": ((1, 1, 4, 64), [3], [list(range(1, 31))], [30],
                    [[*range(3), *range(4, 34), *range(33, 64)]]),
    # accept the last node only; accept_lens 0: nothing moves, padding ignored
    "last_only_and_nothing": ((1, 1, 3, 4), [2, 0], [[6, 0, 0], [4, 4, 4]], [1, 0],
                              [[0, 1, 8, 3, 4, 5, 6, 7, 8], list(range(9))]),
    "everything_is_identity": ((2, 2, 8, 4), [0, 4, 7], [list(range(5))] * 3, [5] * 3, [list(range(12))] * 3),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", GOLDEN.values(), ids=GOLDEN)
def test_golden_moves(backend, device, layout, case):
    need("kv_compact", backend)
    (L, H, D, page_size), prefix, idx, lens, rows = case
    B, S = len(rows), len(rows[0])
    k = torch.arange(L * B * H * S * D, dtype=torch.float32).view(L, B, H, S, D).to(device)
    v, before, accept = -k, k.clone(), [i32(t, device) for t in (prefix, idx, lens)]
    if layout == "contiguous":
        specops.kv_compact(k, v, *accept, backend=backend)
    else:  # the same rows in scattered pages, read back
        need("kv_compact_paged", backend)
        (kp, table), (vp, _) = (to_pages(t, page_size, generator=torch.Generator().manual_seed(0), fill=7.0)
                                for t in (k, v))
        specops.kv_compact_paged(kp, vp, table, *accept, backend=backend)
        k, v = from_pages(kp, table, S), from_pages(vp, table, S)
    assert torch.equal(k, torch.stack([before[:, b][:, :, r] for b, r in enumerate(rows)], 1))
    assert torch.equal(v, -k)


# ---- paged placement: scattered and shared pages ---------------------------------------------------

def test_kv_compact_paged_pages_outside_the_moves_are_untouched(backend, device):
    # Spare pages, the slots past S and other sequences' pages keep their bytes.
    need("kv_compact_paged", backend)
    cache, kp, vp, table, accept = compaction_case(3, 24, "random", 4, torch.float32, seed=11, device=device)
    S, before = cache.shape[3], kp.clone()
    n = -(-S // 4)  # pages per sequence, the last holding S - (n - 1) * 4 rows
    used = set(table[:, :n].flatten().tolist())
    specops.kv_compact_paged(kp, vp, table, *accept, backend=backend)
    spare = [p for p in range(kp.shape[1]) if p not in used]
    assert spare and torch.equal(kp[:, spare], before[:, spare])
    for last in table[:, n - 1].tolist():
        assert torch.equal(kp[:, last, S - (n - 1) * 4:], before[:, last, S - (n - 1) * 4:])


def test_kv_compact_paged_golden_moves_within_and_across_pages(backend, device):
    # page_size 2; the sequence's rows 0..7 live in pages [3, 0, 2, 1]: rows 2,3 in page 0, 4,5 in
    # page 2, 6,7 in page 1. prefix 2, accept nodes 1, 2, 5 -> rows 3, 4, 7 move to rows 2, 3, 4:
    # row 3 -> 2 inside page 0, row 4 (page 2) -> 3 (page 0), row 7 (page 1) -> 4 (page 2).
    need("kv_compact_paged", backend)
    kp = torch.arange(4 * 2 * 3, dtype=torch.float32).view(1, 4, 2, 1, 3).to(device)
    vp, before = -kp, kp.clone()
    table, idx = i32([[3, 0, 2, 1]], device), i32([[1, 2, 5, 0]], device)
    specops.kv_compact_paged(kp, vp, table, i32([2], device), idx, i32([3], device), backend=backend)
    want = before.clone()  # rows 2, 3, 4 <- rows 3, 4, 7; every other slot untouched
    want[0, 0, 0], want[0, 0, 1], want[0, 2, 0] = before[0, 0, 1], before[0, 2, 0], before[0, 1, 1]
    assert torch.equal(kp, want) and torch.equal(vp, -kp)


def test_kv_compact_paged_sequences_may_share_untouched_prefix_pages(backend, device):
    # Sequences 1 and 2 read sequence 0's first page (a shared prompt); the moves touch only rows past
    # it, so the check passes and every sequence compacts its own pages.
    need("kv_compact_paged", backend)
    g = torch.Generator().manual_seed(0)
    kp, table = to_pages(torch.randn(2, 3, 2, 40, 4, generator=g), 16, generator=g, fill=0.0,
                         shared_prefix_pages=1)
    kp, vp, table = kp.to(device), -kp.to(device), table.to(device)
    prefix, lens = i32([20, 17, 25], device), i32([3, 3, 2], device)
    idx = i32([[0, 3, 9], [1, 2, 4], [0, 1, 2]], device)
    want = expected(from_pages(kp, table, 40), prefix, idx, lens)
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, backend=backend)
    assert torch.equal(from_pages(kp, table, 40), want) and torch.equal(vp, -kp)


def test_kv_compact_paged_interleaved_k_and_v_views(backend, device):
    need("kv_compact_paged", backend)
    _, kp, vp, table, accept = compaction_case(2, 12, "random", 4, torch.float32, seed=5, device=device)
    kv = torch.stack([kp, vp], dim=2)  # [L, N, 2, page, H, D]: K and V of a page side by side
    specops.kv_compact_paged(kv[:, :, 0], kv[:, :, 1], table, *accept, backend=backend)
    specops.kv_compact_paged(kp, vp, table, *accept, backend="torch")
    assert torch.equal(kv[:, :, 0], kp) and torch.equal(kv[:, :, 1], vp)


def test_kv_compact_paged_unchecked_garbage_never_writes_outside(backend, device):
    # The pool is the middle of a bigger buffer; garbage page ids, lengths and indices never reach the
    # guard pages, and the valid sequence 0 still compacts.
    need("kv_compact_paged", backend)
    big = torch.randn(2, 12, 4, 2, 8, device=device)
    kp, vp, before = big[:, 2:10], -big[:, 2:10], big.clone()
    table = i32([[1, 0, 2, 3], [-3, 8, 2**31 - 1, 5], [4, 4, 4, 4], [6, 7, -1, 9]], device)
    prefix = i32([3, 2, -4, 2**31 - 3], device)
    idx = i32([[1, 2, 4], [0, 5, 9], [0, 30, 1], [5, 2**31 - 1, 0]], device)
    lens = i32([3, 3, -2, 3], device)
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, check=False, backend=backend)
    assert torch.equal(big[:, :2], before[:, :2]) and torch.equal(big[:, 10:], before[:, 10:])
    # sequence 0: rows 4, 5, 7 (page 0 slots 0, 1, 3) -> rows 3, 4, 5 (page 1 slot 3, page 0 slots 0, 1)
    assert torch.equal(kp[:, [1, 0, 0], [3, 0, 1]], before[:, 2:10][:, 0, [0, 1, 3]])


def test_moves_are_the_spec():
    # Row 3 <- 5 and 4 <- 6 of sequence 0 (node 0 an identity), row 0 <- 1 of sequence 1.
    k = torch.zeros(1, 2, 1, 7, 1)
    moving, src, dst, _, _ = moves(KvLayout.contiguous(k, k), i32([2, 0]), i32([[0, 3, 4], [1, 2, 9]]), i32([3, 1]))
    assert moving.tolist() == [[False, True, True], [True, False, False]]
    assert src[moving].tolist() == [5, 6, 1] and dst[moving].tolist() == [3, 4, 0]


# ---- errors: the kv_compact / kv_compact_paged cases of tests/test_bad_input.py --------------------

@pytest.mark.parametrize("op", ["kv_compact", "kv_compact_paged"])
def test_good_input_passes_the_checks(op):
    getattr(specops, op)(**valid_args(op))  # the base of the bad-input cases is valid


def test_padding_entries_are_not_validated(backend):
    need("kv_compact", backend)
    args = valid_args("kv_compact")
    args.update(accept_idx=i32([[0, 1, -7], [0, 100, -100]]), accept_lens=i32([2, 1]))
    k0 = args["k_cache"].clone()
    specops.kv_compact(**args, backend=backend)
    assert torch.equal(args["k_cache"], k0)  # both moves are identities (node j -> row j)


# ---- every backend vs the gather-then-scatter reference: test_kv_compact_grid.py -----------------

PATTERNS = ("random", "all", "last", "alternating", "shift")


def grid_case(B, L, A, pattern, dtype, view, device, seed, H=2, D=8):
    """K and V [L, B, H, S = A + 9, D] as ``view`` (``caches``) and valid moves (``random_moves``)."""
    S = A + 9
    prefix, idx, lens = random_moves(B, A, S, pattern, torch.Generator().manual_seed(seed), last_row=True)
    k, v = caches(L, B, H, S, D, dtype=dtype, device=device, view=view)
    return k, v, prefix.to(device), idx.to(device), lens.to(device)


# ---- dispatch and registration -----------------------------------------------------------------

@needs_cpp
def test_cpu_tensors_default_to_cpp(monkeypatch):
    calls = []
    impls = _backend._IMPLS["kv_compact"]
    monkeypatch.setitem(impls, "cpp", lambda *a, _f=impls["cpp"]: calls.append("cpp") or _f(*a))
    k, v = caches(1, 1, 1, 4, 2)
    specops.kv_compact(k, v, i32([0]), i32([[1]]), i32([1]))
    assert calls == ["cpp"]


@needs_cpp
@pytest.mark.parametrize("op, names", [("kv_compact", ["k_cache", "v_cache"]),
                                       ("kv_compact_paged", ["k_pages", "v_pages"])])
def test_schema_marks_both_caches_mutated(op, names):
    schema = getattr(torch.ops.specops, op).default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == names and len(schema.returns) == 0


@needs_cpp
@pytest.mark.parametrize("view", ["contiguous", "sliced", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck(view, dtype):
    if view == "paged":
        _, kp, vp, table, lens = compaction_case(3, 9, "random", 4, dtype, seed=3)
        op, args = torch.ops.specops.kv_compact_paged, (kp, vp, table, *lens)
    else:
        op, args = torch.ops.specops.kv_compact, grid_case(3, 2, 9, "random", dtype, view, "cpu", seed=3)
    torch.library.opcheck(op.default, args)


@needs_cpp
@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_compile_fullgraph(layout):
    k, v, prefix, idx, lens = grid_case(3, 2, 11, "random", torch.float32, "contiguous", "cpu", seed=5)
    want_k, want_v = (expected(t, prefix, idx, lens) for t in (k, v))
    cache, op = (k, v), specops.kv_compact
    if layout == "paged":
        (kp, table), (vp, _) = (to_pages(t, 4, generator=torch.Generator().manual_seed(0), fill=0.0) for t in (k, v))
        cache, op = (kp, vp, table), specops.kv_compact_paged

    def step(*args):
        op(*args, check=False, backend="cpp")
        return args[-3] + args[-1]

    new_prefix = torch.compile(step, fullgraph=True)(*cache, prefix, idx, lens)
    assert torch.equal(new_prefix, prefix + lens)
    if layout == "paged":
        k, v = (from_pages(t, table, k.shape[3]) for t in cache[:2])
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
