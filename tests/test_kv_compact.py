"""kv_compact: golden moves, overlap patterns, every backend vs a gather-then-scatter reference,
strided views, unchecked input, errors leave the caches untouched, registration."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specops
from specops import backend as _backend
from specops.ops.kv_compact import moves
from specops.ops.layout import KvLayout
from specops.testing import random_accept

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def need(backend):
    if backend not in _backend.implementations("kv_compact"):
        pytest.skip(f"kv_compact has no {backend} backend")


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def expected(cache, prefix_lens, accept_idx, accept_lens):
    """Gather every accepted source first (from an untouched copy), scatter second, row by row."""
    out = cache.clone()
    for b in range(cache.shape[1]):
        p, n = int(prefix_lens[b]), int(accept_lens[b])
        rows = [cache[:, b, :, p + int(accept_idx[b, j])].clone() for j in range(n)]
        for j in range(n):
            out[:, b, :, p + j] = rows[j]
    return out


def caches(L, B, H, S, D, dtype=torch.float32, device="cpu", layout="contiguous"):
    """K and V filled with distinct random values, as contiguous tensors or as views of bigger ones."""
    def rnd(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    if layout == "contiguous":
        return rnd(L, B, H, S, D), rnd(L, B, H, S, D)
    if layout == "sliced":  # padded head dim; a batch and a strided head slice of a bigger cache
        return tuple(rnd(L, B + 2, 2 * H, S + 3, D + 5)[:, 1:B + 1, ::2, :S, :D] for _ in range(2))
    if layout == "interleaved":  # one [L, 2, B, H, S, D] tensor: K and V share a storage
        kv = rnd(L, 2, B, H, S, D)
        return kv[:, 0], kv[:, 1]
    if layout == "seq_major":  # stored [L, B, S, H, D], viewed as [L, B, H, S, D]
        return tuple(rnd(L, B, S, H, D).transpose(2, 3) for _ in range(2))
    raise ValueError(layout)


def run_and_compare(k, v, prefix_lens, accept_idx, accept_lens, backend):
    want_k = expected(k.cpu(), prefix_lens.cpu(), accept_idx.cpu(), accept_lens.cpu())
    want_v = expected(v.cpu(), prefix_lens.cpu(), accept_idx.cpu(), accept_lens.cpu())
    strides = (k.stride(), v.stride())
    assert specops.kv_compact(k, v, prefix_lens, accept_idx, accept_lens, backend=backend) is None
    assert (k.stride(), v.stride()) == strides
    assert torch.equal(k.cpu(), want_k), "k_cache differs from gather-then-scatter"
    assert torch.equal(v.cpu(), want_v), "v_cache differs from gather-then-scatter"


# ---- golden moves, each on every backend -----------------------------------------------------------

def test_moves_accepted_rows_next_to_the_prefix(backend, device):
    need(backend)
    L, B, H, S, D = 2, 1, 2, 10, 4
    k = torch.arange(L * B * H * S * D, dtype=torch.float32).view(L, B, H, S, D).to(device)
    v = -k.clone()
    before = k.clone()
    # prefix 3, block rows 3..8; accept nodes 0, 2, 5 -> rows 3, 5, 8 move to rows 3, 4, 5
    specops.kv_compact(k, v, i32([3], device), i32([[0, 2, 5, 1, 1, 1]], device), i32([3], device),
                       backend=backend)
    assert torch.equal(k[:, :, :, 3], before[:, :, :, 3])
    assert torch.equal(k[:, :, :, 4], before[:, :, :, 5])
    assert torch.equal(k[:, :, :, 5], before[:, :, :, 8])
    untouched = [0, 1, 2, 6, 7, 8, 9]
    assert torch.equal(k[:, :, :, untouched], before[:, :, :, untouched])
    assert torch.equal(v, -k)


def test_shift_chain_reads_every_source_before_it_is_overwritten(backend, device):
    need(backend)
    # accept 1..5 of a 6-node block: destination j is the source of move j - 1
    k = torch.arange(8, dtype=torch.float32).view(1, 1, 1, 8, 1).expand(1, 1, 1, 8, 4).contiguous().to(device)
    v = k.clone()
    specops.kv_compact(k, v, i32([1], device), i32([[1, 2, 3, 4, 5, 0]], device), i32([5], device),
                       backend=backend)
    assert k[0, 0, 0, :, 0].tolist() == [0, 2, 3, 4, 5, 6, 6, 7]
    assert torch.equal(v, k)


def test_accept_last_only_and_accept_nothing(backend, device):
    need(backend)
    k = torch.arange(2 * 9, dtype=torch.float32).view(1, 2, 1, 9, 1).repeat(1, 1, 1, 1, 3).to(device)
    v = k.clone()
    before = k.clone()
    specops.kv_compact(k, v, i32([2, 0], device), i32([[6, 0, 0], [4, 4, 4]], device), i32([1, 0], device),
                       backend=backend)
    assert k[0, 0, 0, :, 0].tolist() == [0, 1, 8, 3, 4, 5, 6, 7, 8]
    assert torch.equal(k[:, 1], before[:, 1])  # accept_lens 0: nothing moves, padding ignored
    assert torch.equal(v, k)


def test_accept_everything_is_identity(backend, device):
    need(backend)
    k, v = caches(2, 3, 2, 12, 8, device=device)
    before = k.clone(), v.clone()
    idx = torch.arange(5, dtype=torch.int32, device=device).expand(3, 5).contiguous()
    specops.kv_compact(k, v, i32([0, 4, 7], device), idx, i32([5, 5, 5], device), backend=backend)
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])


def test_moves_are_the_spec():
    # Row 3 <- 5 and 4 <- 6 of sequence 0 (node 0 an identity), row 0 <- 1 of sequence 1.
    k = torch.zeros(1, 2, 1, 7, 1)
    moving, src, dst, _, _ = moves(KvLayout.contiguous(k, k), i32([2, 0]), i32([[0, 3, 4], [1, 2, 9]]), i32([3, 1]))
    assert moving.tolist() == [[False, True, True], [True, False, False]]
    assert src[moving].tolist() == [5, 6, 1] and dst[moving].tolist() == [3, 4, 0]


# ---- errors ----------------------------------------------------------------------------------------

def _good():
    k, v = caches(2, 2, 3, 10, 4)
    return dict(k_cache=k, v_cache=v, prefix_lens=i32([2, 5]), accept_idx=i32([[0, 1, 3], [0, 2, 9]]),
                accept_lens=i32([3, 1]))


BAD = [
    ("k_cache", lambda a: a["k_cache"].double(), TypeError, "k_cache must have dtype"),
    ("k_cache", lambda a: [1.0], TypeError, "k_cache must be a torch.Tensor"),
    ("k_cache", lambda a: a["k_cache"][0], ValueError, "k_cache must have rank 5"),
    ("k_cache", lambda a: a["k_cache"].transpose(3, 4).contiguous().transpose(3, 4), ValueError,
     "k_cache must have stride 1 in its last dimension"),
    ("v_cache", lambda a: a["v_cache"].half(), TypeError, "v_cache must have dtype torch.float32"),
    ("v_cache", lambda a: a["v_cache"][:, :, :, :9], ValueError, r"v_cache must have shape \[2, 2, 3, 10, 4\]"),
    ("v_cache", lambda a: a["k_cache"], ValueError, "v_cache must not share memory with k_cache"),
    ("v_cache", lambda a: a["k_cache"][:, :, :, :].transpose(1, 1), ValueError, "v_cache must not share memory"),
    ("k_cache", lambda a: a["k_cache"][:, :, :1].expand(2, 2, 3, 10, 4), ValueError,
     "k_cache must not address one element twice"),
    ("prefix_lens", lambda a: a["prefix_lens"].long(), TypeError, "prefix_lens must have dtype torch.int32"),
    ("prefix_lens", lambda a: i32([2]), ValueError, r"prefix_lens must have shape \[2\]"),
    ("prefix_lens", lambda a: i32([-1, 5]), ValueError, r"prefix_lens must lie in \[0, S=10\]"),
    ("prefix_lens", lambda a: i32([2, 11]), ValueError, r"prefix_lens must lie in \[0, S=10\]"),
    ("accept_idx", lambda a: a["accept_idx"][0], ValueError, "accept_idx must have rank 2"),
    ("accept_idx", lambda a: a["accept_idx"][:1], ValueError, r"accept_idx must have shape \[2, \*\]"),
    ("accept_idx", lambda a: a["accept_idx"].float(), TypeError, "accept_idx must have dtype torch.int32"),
    ("accept_idx", lambda a: i32([[0, 1, 1], [0, 2, 9]]), ValueError,
     r"accept_idx\[0, 2\] must be > accept_idx\[0, 1\] = 1, got 1"),
    ("accept_idx", lambda a: i32([[0, 3, 2], [0, 2, 9]]), ValueError, r"accept_idx\[0, 2\] must be > "),
    ("accept_idx", lambda a: i32([[0, 1, 3], [-1, 2, 9]]), ValueError, r"accept_idx\[1, 0\] must be >= 0, got -1"),
    ("accept_idx", lambda a: i32([[0, 1, 8], [0, 2, 9]]), ValueError,
     r"accept_idx\[0, 2\] = 8 plus prefix_lens\[0\] = 2 must address a row < S=10"),
    ("accept_lens", lambda a: i32([4, 1]), ValueError, r"accept_lens must lie in \[0, A=3\], got accept_lens\[0\] = 4"),
    ("accept_lens", lambda a: i32([3, -1]), ValueError, r"accept_lens must lie in \[0, A=3\]"),
    ("accept_lens", lambda a: i32([3, 1, 1]), ValueError, r"accept_lens must have shape \[2\]"),
    ("accept_lens", lambda a: i32([3, 1]).to("meta"), ValueError, "accept_lens must be on cpu"),
]


@pytest.mark.parametrize("arg, make, exc, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_naming_the_argument_and_leaves_caches_untouched(backend, arg, make, exc, match):
    need(backend)
    args = _good()
    args[arg] = make(args)
    k, v = args["k_cache"], args["v_cache"]
    before = [t.clone() for t in (k, v) if isinstance(t, torch.Tensor)]
    with pytest.raises(exc, match=match):
        specops.kv_compact(**args, backend=backend)
    after = [t for t in (k, v) if isinstance(t, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_padding_entries_are_not_validated(backend):
    need(backend)
    args = _good()
    args["accept_idx"] = i32([[0, 1, -7], [0, 100, -100]])
    args["accept_lens"] = i32([2, 1])
    k0 = args["k_cache"].clone()
    specops.kv_compact(**args, backend=backend)
    assert torch.equal(args["k_cache"], k0)  # both moves are identities (node j -> row j)


def test_interleaved_k_and_v_views_of_one_tensor_are_accepted(backend):
    need(backend)
    k, v = caches(2, 2, 3, 10, 4, layout="interleaved")
    run_and_compare(k, v, i32([1, 0]), i32([[1, 3, 4], [2, 5, 6]]), i32([3, 2]), backend)


# ---- every backend vs the gather-then-scatter reference -----------------------------------------

PATTERNS = ("random", "all", "last", "alternating", "shift")


def _grid_case(B, L, A, pattern, dtype, layout, device, seed, H=2, D=8):
    g = torch.Generator().manual_seed(seed)
    idx, lens = random_accept(B, A, generator=g, pattern=pattern)
    S = A + 9
    # prefixes from 0 to the largest that keeps every accepted source inside S
    top = (S - 1 - torch.where(lens > 0, idx.gather(1, (lens.long() - 1).clamp(min=0)[:, None])[:, 0], 0)).clamp(min=0)
    prefix = (torch.rand(B, generator=g) * (top + 1).float()).long().clamp(max=top).to(torch.int32)
    prefix[0] = top[0]  # one sequence's last source is the last row of the cache
    k, v = caches(L, B, H, S, D, dtype=dtype, device=device, layout=layout)
    return k, v, prefix.to(device), idx.to(device), lens.to(device)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("L", [1, 4])
def test_matches_gather_then_scatter(backend, device, pattern, B, L):
    need(backend)
    A = 64
    case = _grid_case(B, L, A, pattern, torch.float32, "contiguous", device, seed=B * 100 + L)
    run_and_compare(*case, backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "interleaved", "seq_major"])
def test_matches_reference_for_every_dtype_and_layout(backend, device, dtype, layout):
    need(backend)
    A = 33
    for seed, pattern in enumerate(PATTERNS):
        case = _grid_case(3, 2, A, pattern, dtype, layout, device, seed=seed, H=3, D=5)
        run_and_compare(*case, backend)


def test_rows_of_64_kib_slices_move_in_parallel_and_stay_correct(backend, device):
    need(backend)
    # 63 rows of 512 B per slice and cache: big enough that cpp splits the slices across threads;
    # "shift" makes every destination the source of the previous move, in one overlapping run.
    for pattern in ("shift", "alternating", "random"):
        case = _grid_case(3, 2, 64, pattern, torch.float32, "contiguous", device, seed=7, H=4, D=128)
        run_and_compare(*case, backend)


def test_empty_inputs_are_no_ops(backend, device):
    need(backend)
    k, v = caches(2, 2, 1, 6, 4, device=device)
    before = k.clone(), v.clone()
    z = i32([0, 0], device)
    specops.kv_compact(k, v, z, torch.zeros(2, 0, dtype=torch.int32, device=device), z, backend=backend)
    specops.kv_compact(k, v, i32([1, 2], device), i32([[1, 2], [3, 4]], device), z, backend=backend)
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])
    e = torch.zeros(0, 2, 1, 6, 4, device=device)
    specops.kv_compact(e, e.clone(), z, i32([[1, 2], [3, 4]], device), i32([2, 2], device), backend=backend)


def test_unchecked_garbage_never_writes_outside_the_caches(backend, device):
    need(backend)
    # The caches are the middle of bigger buffers; whatever unchecked garbage says, the guard
    # regions around them stay untouched and in-range accepted rows of valid sequences still move.
    L, B, H, S, D = 2, 4, 2, 12, 8
    big_k, big_v = (torch.randn(L, B, H, S + 10, D, device=device) for _ in range(2))
    k, v = big_k[:, :, :, 5:5 + S], big_v[:, :, :, 5:5 + S]
    guard = [t[:, :, :, i].clone() for t in (big_k, big_v) for i in (slice(0, 5), slice(5 + S, None))]
    prefix = i32([3, 10, -4, 2**31 - 3], device)
    idx = i32([[1, 2, 4], [-9, 5, 6], [0, 30, 1], [5, 2**31 - 1, 0]], device)
    lens = i32([3, 9, -2, 3], device)
    k0 = k.clone()
    specops.kv_compact(k, v, prefix, idx, lens, check=False, backend=backend)
    after = [t[:, :, :, i] for t in (big_k, big_v) for i in (slice(0, 5), slice(5 + S, None))]
    assert all(torch.equal(a, g) for a, g in zip(after, guard))
    # sequence 0 is valid: rows 4, 5, 7 moved to 3, 4, 5
    assert torch.equal(k[:, 0, :, 3:6].cpu(), k0[:, 0, :, [4, 5, 7]].cpu())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 5), A=st.integers(1, 40), extra=st.integers(0, 6), seed=st.integers(0, 2**31 - 1),
       pattern=st.sampled_from(PATTERNS), layout=st.sampled_from(["contiguous", "sliced", "seq_major"]))
def test_property_every_backend_equals_gather_then_scatter(B, A, extra, seed, pattern, layout, device):
    g = torch.Generator().manual_seed(seed)
    idx, lens = random_accept(B, A, generator=g, pattern=pattern)
    S = A + extra
    last = torch.where(lens > 0, idx.gather(1, (lens.long() - 1).clamp(min=0)[:, None])[:, 0], 0)
    prefix = torch.minimum((torch.rand(B, generator=g) * (S - last).float()).long(), S - 1 - last).to(torch.int32)
    base = caches(2, B, 3, S, 6, layout=layout, device=device)
    want = [expected(t.cpu(), prefix, idx, lens) for t in base]
    for name in _backend.implementations("kv_compact"):
        if not _backend.available(name, device)[0]:
            continue
        k, v = (t.clone() for t in base)  # clone() keeps the strides of dense views
        specops.kv_compact(k, v, prefix.to(device), idx.to(device), lens.to(device), backend=name)
        assert torch.equal(k.cpu(), want[0]) and torch.equal(v.cpu(), want[1]), name


# ---- dispatch and registration -----------------------------------------------------------------

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0], reason=_backend.available("cpp")[1])


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
def test_direct_call_with_bad_index_dtype_is_refused():
    k, v = caches(1, 1, 1, 4, 2)
    before = k.clone(), v.clone()
    with pytest.raises(TypeError, match="prefix_lens must be"):
        torch.ops.specops.kv_compact(k, v, torch.zeros(1, dtype=torch.int64), i32([[1]]), i32([1]))
    with pytest.raises(ValueError, match="v_cache must match k_cache"):
        torch.ops.specops.kv_compact(k, v.half(), i32([0]), i32([[1]]), i32([1]))
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])


@needs_cpp
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck(layout, dtype):
    k, v, prefix, idx, lens = _grid_case(3, 2, 9, "random", dtype, layout, "cpu", seed=3)
    torch.library.opcheck(torch.ops.specops.kv_compact.default, (k, v, prefix, idx, lens))


@needs_cpp
def test_torch_compile_fullgraph():
    k, v, prefix, idx, lens = _grid_case(3, 2, 11, "random", torch.float32, "contiguous", "cpu", seed=5)
    want_k, want_v = (expected(t, prefix, idx, lens) for t in (k, v))

    def step(k, v, prefix, idx, lens):
        specops.kv_compact(k, v, prefix, idx, lens, check=False, backend="cpp")
        return prefix + lens

    new_prefix = torch.compile(step, fullgraph=True)(k, v, prefix, idx, lens)
    assert torch.equal(new_prefix, prefix + lens)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
