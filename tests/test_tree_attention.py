"""tree_attention: golden semantics of the reference, every backend vs the reference on a grid,
errors (nothing written), registration (opcheck, torch.compile)."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specops
from specops import backend as _backend
from specops.testing import random_num_nodes, random_parents

# Tolerances vs the fp32 reference computed from the same (rounded) inputs: fp32 differs only by
# summation order; fp16/bf16 add the rounding of the output (and of P before P @ V in the
# low-precision kernels), i.e. a few ulp of the output dtype.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4),
       torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.2e-2, rtol=1.6e-2)}


@pytest.fixture
def backend(backend):
    """conftest's backend, skipped where this op has no implementation registered."""
    if backend not in _backend.implementations("tree_attention"):
        pytest.skip(f"tree_attention has no {backend} implementation")
    return backend


@pytest.fixture
def fast_backend(fast_backend):
    if fast_backend not in _backend.implementations("tree_attention"):
        pytest.skip(f"tree_attention has no {fast_backend} implementation")
    return fast_backend


def make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind="tree", padded=False, seed=0, device="cpu",
              strided=True, ragged=True):
    """Random inputs of one case; the cache holds a few rows past the block (never visible).

    kind: "tree" (queries are the last nodes of a random tree), "dag" (random visibility),
    "chain" (causal), "none" (no block key visible). ``padded`` makes q_lens ragged; ``ragged``
    makes prefix/block lengths differ across the batch. Garbage bits are set past each block and
    in padding rows: a kernel must ignore them."""
    g = torch.Generator().manual_seed(seed)
    S = P + L + 3
    W = max(1, (L + 31) // 32) + (1 if kind == "dag" else 0)  # a mask wider than needed is legal
    prefix = torch.full((B,), P, dtype=torch.int32)
    block = torch.full((B,), L, dtype=torch.int32)
    if ragged and B > 1:
        prefix[1:] = torch.randint(0, P + 1, (B - 1,), generator=g, dtype=torch.int32)
        block[1:] = torch.randint(Tq, L + 1, (B - 1,), generator=g, dtype=torch.int32)
    qlens = torch.full((B,), Tq, dtype=torch.int32)
    if padded:
        qlens = torch.randint(0, Tq + 1, (B,), generator=g, dtype=torch.int32)
        qlens[0] = max(Tq - 1, 0)
    vis = torch.zeros(B, Tq, 32 * W, dtype=torch.bool)
    for b in range(B):
        n = int(block[b])
        if kind == "tree":
            parents = random_parents(1, n, generator=g)
            full = specops.unpack_mask(specops.build_tree_mask(parents, backend="torch")[0], n)[0]
            vis[b, :, :n] = full[n - Tq:]
        elif kind == "dag":
            vis[b, :, :n] = torch.rand(Tq, n, generator=g) < 0.5
        elif kind == "chain":
            vis[b, :, :n] = torch.ones(n, n, dtype=torch.bool).tril()[n - Tq:]
        vis[b, :, n:] = torch.rand(Tq, 32 * W - n, generator=g) < 0.5  # garbage past the block
        pad = torch.arange(Tq) >= qlens[b]
        vis[b, pad] = torch.rand(int(pad.sum()), 32 * W, generator=g) < 0.5  # garbage in padding rows
    mask = specops.pack_mask(vis)
    q = torch.randn(B, Tq, Hq, D, generator=g).to(dtype)
    if strided:  # a [B, S, Hkv, D] buffer seen as [B, Hkv, S, D]: last-dim stride 1 only
        k = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
        v = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
    else:
        k = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
        v = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    args = [t.to(device) for t in (q, k, v, prefix, block, mask)]
    return args, dict(q_lens=qlens.to(device) if padded else None)


def assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), **TOL[dtype])


# ---- golden semantics (every backend) ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chain_mask_equals_causal_sdpa(backend, device, dtype):
    # With no prefix and a lower-triangular mask over the whole block, this is causal attention.
    B, T, Hq, Hkv, D = 2, 37, 6, 2, 64
    args, kw = make_case(B, T, T, 0, Hq, Hkv, D, dtype, kind="chain", device=device, ragged=False)
    q, k, v = args[:3]
    out = specops.tree_attention(*args, backend=backend, **kw)
    want = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float()[:, :, :T], v.float()[:, :, :T],
                                          is_causal=True, enable_gqa=True).transpose(1, 2)
    assert_close(out, want, dtype)


def test_chain_after_prefix_equals_causal_sdpa_over_the_whole_sequence(backend, device):
    B, P, T, Hq, Hkv, D = 1, 45, 9, 4, 4, 64
    args, kw = make_case(B, T, T, P, Hq, Hkv, D, torch.float32, kind="chain", device=device)
    q, k, v = args[:3]
    out = specops.tree_attention(*args, backend=backend, **kw)
    causal = torch.ones(T, P + T, dtype=torch.bool, device=device).tril(P)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k[:, :, :P + T], v[:, :, :P + T],
                                          attn_mask=causal).transpose(1, 2)
    assert_close(out, want, torch.float32)


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (8, 2), (9, 3)])
def test_single_query_equals_plain_decode(backend, device, Hq, Hkv):
    # Tq = 1 seeing prefix + itself is one decode step over P + 1 keys.
    B, P, D = 3, 130, 64
    args, kw = make_case(B, 1, 1, P, Hq, Hkv, D, torch.float32, kind="chain", device=device, ragged=False)
    q, k, v = args[:3]
    out = specops.tree_attention(*args, backend=backend, **kw)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k[:, :, :P + 1], v[:, :, :P + 1],
                                          enable_gqa=True).transpose(1, 2)
    assert_close(out, want, torch.float32)


def test_query_that_sees_nothing_gives_zero(backend, device):
    # No prefix and an empty mask row: 0, never NaN; a row seeing one key returns that value.
    B, Tq, L, Hq, D = 1, 3, 3, 2, 64
    args, kw = make_case(B, Tq, L, 0, Hq, Hq, D, torch.float32, kind="none", device=device)
    args[5] = torch.tensor([[[0], [0b10], [0]]], dtype=torch.int32, device=device)
    out = specops.tree_attention(*args, backend=backend, **kw).cpu()
    assert torch.equal(out[0, 0], torch.zeros(Hq, D)) and torch.equal(out[0, 2], torch.zeros(Hq, D))
    torch.testing.assert_close(out[0, 1], args[2][0, :, 1].cpu(), atol=1e-6, rtol=1e-6)


def test_padding_rows_are_zero_and_do_not_change_valid_rows(backend, device):
    args, _ = make_case(2, 7, 9, 20, 4, 2, 64, torch.float32, kind="tree", device=device)
    q_lens = torch.tensor([4, 0], dtype=torch.int32, device=device)
    out = specops.tree_attention(*args, q_lens=q_lens, backend=backend).cpu()
    full = specops.tree_attention(*args, backend=backend).cpu()
    assert torch.equal(out[0, 4:], torch.zeros_like(out[0, 4:])) and torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0, :4], full[0, :4], atol=0, rtol=0)


def test_keys_past_the_block_and_past_the_prefix_are_never_read(backend, device):
    # Poison every cache row outside [0, P + L): NaN there would leak into the output.
    args, kw = make_case(2, 5, 8, 11, 4, 2, 64, torch.float32, kind="dag", device=device)
    for t in args[1:3]:
        for b in range(2):
            t[b, :, int(args[3][b] + args[4][b]):] = float("nan")
    out = specops.tree_attention(*args, backend=backend, **kw)
    assert not out.isnan().any()
    assert_close(out, specops.tree_attention(*args, backend="torch", **kw), torch.float32)


def test_sm_scale_is_applied(backend, device):
    args, kw = make_case(1, 4, 6, 10, 2, 1, 64, torch.float32, kind="tree", device=device)
    out = specops.tree_attention(*args, sm_scale=0.3, backend=backend, **kw)
    q = args[0]
    want = specops.tree_attention(q * (0.3 * math.sqrt(64)), *args[1:], backend="torch", **kw)
    assert_close(out, want, torch.float32)


def test_length_vectors_with_any_strides(backend, device):
    # prefix_lens / block_lens / q_lens may be views: a stride-2 slice, a stride-0 broadcast. Every
    # backend reads element b at b * stride (a kernel that assumed stride 1 read prefix 0 for
    # sequence 1 here, and past the storage of the broadcast).
    args, _ = make_case(2, 3, 6, 7, 4, 2, 64, torch.float32, kind="tree", ragged=False, device=device)
    args[3] = torch.tensor([5, 0, 7, 0], dtype=torch.int32, device=device)[::2]
    args[4] = torch.tensor([6], dtype=torch.int32, device=device).expand(2)
    q_lens = torch.tensor([3, 9, 2, 9], dtype=torch.int32, device=device)[::2]
    assert args[3].stride() == (2,) and args[4].stride() == (0,)
    want = specops.tree_attention(*[a.contiguous() for a in args], q_lens=q_lens.contiguous(), backend="torch")
    got = specops.tree_attention(*args, q_lens=q_lens, backend=backend)
    assert_close(got, want, torch.float32)
    assert not got[1, 2:].any()  # q_lens[1] = 2 read from the strided view


# ---- errors: raise naming the argument, nothing written ----------------------------------------

def _good():
    args, _ = make_case(2, 3, 5, 4, 4, 2, 64, torch.float32, kind="tree")
    return args


def _bad(i, value, *more):
    """Good args with args[i] replaced by value(args) (and so on for further (i, value) pairs)."""
    def f():
        a = _good()
        for j, val in [(i, value), *zip(more[::2], more[1::2])]:
            a[j] = val(a) if callable(val) else val
        return a
    return f


@pytest.mark.parametrize("make, kw, exc, match", [
    (_bad(0, lambda a: a[0].double()), {}, TypeError, "q must have dtype"),
    (_bad(0, lambda a: a[0][0]), {}, ValueError, "q must have rank 4"),
    (_bad(0, "q"), {}, TypeError, "q must be a torch.Tensor"),
    (_bad(1, lambda a: a[1].half()), {}, TypeError, "k_cache must have dtype torch.float32"),
    (_bad(1, lambda a: a[1][:, :, :, :32]), {}, ValueError, r"k_cache must have shape \[B=2, Hkv, S, D=64\]"),
    (_bad(1, lambda a: a[1][:1]), {}, ValueError, "k_cache must have shape"),
    (_bad(2, lambda a: a[2][:, :, :-1]), {}, ValueError, "v_cache must have shape"),
    (_bad(2, lambda a: a[2].bfloat16()), {}, TypeError, "v_cache must have dtype"),
    (_bad(1, lambda a: torch.randn(2, 64, 12, 3).permute(0, 3, 2, 1)), {}, ValueError, "k_cache must have stride 1"),
    (_bad(1, lambda a: torch.randn(2, 3, 12, 64), 2, lambda a: torch.randn(2, 3, 12, 64)), {}, ValueError, r"Hq % Hkv == 0"),
    (_bad(3, lambda a: a[3].long()), {}, TypeError, "prefix_lens must have dtype torch.int32"),
    (_bad(4, lambda a: a[4][:1]), {}, ValueError, r"block_lens must have shape \[2\]"),
    (_bad(5, lambda a: a[5][:, :2]), {}, ValueError, r"mask must have shape \[B=2, Tq=3, W\]"),
    (_bad(5, lambda a: a[5].bool()), {}, TypeError, "mask must have dtype torch.int32"),
    (_bad(3, lambda a: torch.tensor([4, -1], dtype=torch.int32)), {}, ValueError, "prefix_lens must be >= 0"),
    (_bad(4, lambda a: torch.tensor([5, -2], dtype=torch.int32)), {}, ValueError, "block_lens must be >= 0"),
    (_bad(4, lambda a: torch.tensor([5, 33], dtype=torch.int32)), {}, ValueError, "mask too narrow"),
    (_bad(3, lambda a: torch.tensor([4, 10], dtype=torch.int32)), {}, ValueError,
     r"prefix_lens \+ block_lens must be <= S = 12"),
    (_good, dict(q_lens=torch.tensor([3, 4], dtype=torch.int32)), ValueError, r"q_lens must lie in \[0, Tq=3\]"),
    (_good, dict(q_lens=torch.tensor([3], dtype=torch.int32)), ValueError, r"q_lens must have shape \[2\]"),
    (_good, dict(sm_scale="0.1"), TypeError, "sm_scale must be a finite real number"),
    (_good, dict(sm_scale=float("nan")), TypeError, "sm_scale must be a finite real number"),
])
def test_bad_input_raises_naming_the_argument_and_writes_nothing(backend, make, kw, exc, match):
    args = make()
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(exc, match=match):
        specops.tree_attention(*args, backend=backend, **kw)
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))


def test_device_mismatch_raises():
    args = _good()
    args[4] = args[4].to("meta")
    with pytest.raises(ValueError, match="block_lens must be on cpu"):
        specops.tree_attention(*args)


def test_check_false_skips_value_checks_without_reading_out_of_bounds(fast_backend, device):
    # Lengths past the cache are clamped by the kernels: no crash, finite output.
    args, _ = make_case(2, 3, 5, 4, 4, 2, 64, torch.float32, kind="tree", device=device)
    args[3] = torch.tensor([100, -7], dtype=torch.int32, device=device)
    args[4] = torch.tensor([1000, -3], dtype=torch.int32, device=device)
    out = specops.tree_attention(*args, q_lens=torch.tensor([9, -1], dtype=torch.int32, device=device),
                                 check=False, backend=fast_backend)
    assert out.shape == args[0].shape and out.isfinite().all()


# ---- every backend vs the reference on the grid ----------------------------------------------

GRID_HEADS = [(4, 4), (8, 2), (9, 3), (32, 8)]
GRID_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def grid_cases():
    """A covering subset of B x Tq x block x prefix x heads x D x dtype x mask kind x padding:
    every (prefix, heads, dtype) triple once, the other axes cycled so each value meets many."""
    cases = []
    for n, (P, (Hq, Hkv), dtype) in enumerate(itertools.product([0, 1, 129, 1000], GRID_HEADS, GRID_DTYPES)):
        B = (1, 3)[n % 2]
        Tq = (1, 7, 64)[n % 3]
        L = min(130, Tq + (0, 5, 66, 130)[(n // 3) % 4])
        D = (64, 128)[(n // 2) % 2]
        kind = ("tree", "dag", "chain")[(n // 6) % 3] if L > Tq or n % 5 else "dag"
        padded = n % 4 == 1
        cases.append(pytest.param(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded,
                                  id=f"B{B}-T{Tq}-L{L}-P{P}-H{Hq}x{Hkv}-D{D}-{str(dtype)[6:]}-{kind}{'-pad' if padded else ''}"))
    return cases


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded", grid_cases())
def test_cpp_matches_reference_on_the_grid(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded):
    if "cpp" not in _backend.implementations("tree_attention") or not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B * Tq + L + P + D)
    want = specops.tree_attention(*args, backend="torch", **kw)
    got = specops.tree_attention(*args, backend="cpp", **kw)
    assert_close(got, want, dtype)
    if padded:
        for b in range(B):
            assert not got[b, int(kw["q_lens"][b]):].any()


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", GRID_DTYPES)
def test_cpp_every_instruction_set_variant_matches_reference(monkeypatch, isa, dtype):
    # SPECOPS_CPU_ISA caps the variant the CPU kernel picks, so this machine runs them all
    # (where it supports them; a lower cap than the machine's is always possible).
    if not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for n, (B, Tq, L, P, Hq, Hkv, D, kind) in enumerate([(3, 7, 40, 129, 9, 3, 64, "dag"),
                                                         (2, 17, 17, 100, 4, 1, 80, "tree"),
                                                         (1, 5, 33, 0, 2, 2, 67, "chain")]):
        args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=n == 0, seed=n)
        assert_close(specops.tree_attention(*args, backend="cpp", **kw),
                     specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv", [(1, 3, 3, 3000, 4, 2), (1, 2, 40, 2000, 9, 3), (3, 1, 1, 4000, 8, 8)])
def test_cpp_splits_along_the_prefix_and_combines(B, Tq, L, P, Hq, Hkv):
    # Few (sequence, kv head, query tile) items leave threads idle: the kernel splits the keys
    # and merges the partials by log-sum-exp; with one thread it must not split (same result).
    if not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, 128, torch.float32, kind="dag", seed=P)
    want = specops.tree_attention(*args, backend="torch", **kw)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3, 5):
            torch.set_num_threads(n)
            assert_close(specops.tree_attention(*args, backend="cpp", **kw), want, torch.float32)
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 3), Tq=st.integers(1, 40), extra=st.integers(0, 40), P=st.integers(0, 300),
       G=st.sampled_from([1, 2, 3, 7]), Hkv=st.integers(1, 3), D=st.sampled_from([16, 33, 64, 96]),
       dtype=st.sampled_from(GRID_DTYPES), kind=st.sampled_from(["tree", "dag", "chain", "none"]),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_property_cpp_matches_reference(B, Tq, extra, P, G, Hkv, D, dtype, kind, padded, seed):
    if not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    args, kw = make_case(B, Tq, Tq + extra, P, G * Hkv, Hkv, D, dtype, kind=kind, padded=padded, seed=seed,
                         strided=seed % 2 == 0)
    assert_close(specops.tree_attention(*args, backend="cpp", **kw),
                 specops.tree_attention(*args, backend="torch", **kw), dtype)


TRITON_CASES = [  # small and odd: the interpreter is slow
    (1, 7, 9, 0, 4, 4, 64, torch.float32, "tree", False),
    (3, 5, 12, 129, 9, 3, 64, torch.float32, "dag", True),
    (2, 1, 1, 1000, 8, 2, 64, torch.float32, "chain", False),
    (2, 16, 20, 33, 4, 2, 128, torch.bfloat16, "tree", True),
    (1, 3, 40, 1, 2, 1, 64, torch.float16, "dag", False),
    # 128 < D <= 256 (Gemma's D = 256, odd sizes padded to the 256 tile), GQA, ragged batches
    (2, 3, 9, 40, 8, 2, 256, torch.bfloat16, "tree", True),
    (2, 5, 37, 20, 6, 3, 160, torch.float32, "dag", False),
    (3, 2, 33, 70, 4, 1, 200, torch.float16, "chain", True),
    (1, 4, 70, 65, 2, 2, 256, torch.float32, "dag", False),
]


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded", TRITON_CASES)
def test_triton_matches_reference(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, device):
    if "triton" not in _backend.implementations("tree_attention") or not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B + Tq + P, device=device)
    want = specops.tree_attention(*args, backend="torch", **kw)
    assert_close(specops.tree_attention(*args, backend="triton", **kw), want, dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_triton_split_k_matches_reference(num_splits, device):
    # The flash-decoding variant: kv splits merged by a second kernel; more splits than tiles
    # leaves some splits empty (their partials must carry no weight).
    if not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    args, kw = make_case(2, 3, 7, 200, 6, 2, 64, torch.float32, kind="dag", padded=True, seed=num_splits,
                         device=device)
    got = kernels.tree_attention(*args, kw["q_lens"], 0.125, num_splits=num_splits)
    assert_close(got, specops.tree_attention(*args, sm_scale=0.125, backend="torch", **kw), torch.float32)


@pytest.mark.parametrize("dtype, D, Tq, G", [
    (torch.bfloat16, 256, 9, 2),  # block tiles BLOCK_M 64, BLOCK_N 32 (table 80 only)
    (torch.float32, 200, 3, 8),  # block tiles BLOCK_M 16, BLOCK_N 32
    (torch.float16, 96, 2, 4),  # decode tiles BLOCK_M 16, BLOCK_N 64
    (torch.float32, 128, 5, 4),  # block tiles BLOCK_M 32, BLOCK_N 32, 2 stages
])
def test_triton_sm80_tiles_match_reference(dtype, D, Tq, G):
    # The sm_80 table's tiles, run by the interpreter: 2 mask words per tile when BLOCK_N = 64,
    # tiles that start mid-word never happen (BLOCK_N % 32 == 0), a block crossing words.
    if not _backend.available("triton", "cpu")[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    args, kw = make_case(2, Tq, 45, 37, 2 * G, 2, D, dtype, kind="dag", padded=True, seed=D)
    got = kernels.tree_attention(*args, kw["q_lens"], D ** -0.5, arch=80)
    assert_close(got, specops.tree_attention(*args, backend="torch", **kw), dtype)


def test_triton_splits_a_small_decode_by_itself(device):
    # One (sequence, kv head) program over a long prefix leaves the device idle: the launcher plans
    # a split-K launch plus the combine kernel without being asked.
    if not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    args, kw = make_case(1, 1, 1, 900, 4, 1, 64, torch.float32, kind="chain", device=device)
    _, launches = kernels.plan(*args, None, 0.125)
    assert len(launches) == 2 and launches[0].grid[1] > 1
    got = specops.tree_attention(*args, sm_scale=0.125, backend="triton")
    assert_close(got, specops.tree_attention(*args, sm_scale=0.125, backend="torch"), torch.float32)


def test_triton_supports_says_why_before_launching(device):
    if not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    args, _ = make_case(1, 2, 3, 4, 4, 2, 64, torch.float32, device=device)
    assert kernels.supports(*args) == (True, "ok")
    wide, _ = make_case(1, 2, 3, 4, 4, 2, 272, torch.float32, device=device)
    ok, why = kernels.supports(*wide)
    assert not ok and "D=272 > 256" in why
    ok, why = kernels.supports(args[0].double(), args[1].double())
    assert not ok and "torch.float64" in why
    # An explicit request for a shape the backend cannot take raises with the reason before any
    # launch; the automatic choice takes another backend.
    with pytest.raises(specops.BackendUnavailable, match=r"backend 'triton' \(backend=\) cannot run this call: .*D=272 > 256"):
        specops.tree_attention(*wide, backend="triton")


def test_triton_supports_needs_the_interpreter_for_cpu_tensors(monkeypatch):
    from specops.triton_kernels import tree_attention as kernels

    args, _ = make_case(1, 2, 3, 4, 4, 2, 64, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = kernels.supports(*args)
    assert not ok and "TRITON_INTERPRET=1" in why


def _splits(B, Tq, Hq, Hkv, S, D, elem=2, arch=90):
    from specops.triton_kernels import tree_attention as kernels

    rows = Tq * Hq // Hkv
    cfg = kernels.config(arch, torch.float16 if elem == 2 else torch.float32, D, rows)
    n_programs = -(-rows // cfg.block_m) * B * Hkv
    R = B * Tq * Hq
    kv, part = 2 * B * Hkv * S * D * elem, R * (D + 1) * 4
    ns = kernels.auto_splits(n_programs, kernels.SMS[arch], kv, part, 4 * R * S * D,
                             kernels.BALANCE[arch, elem == 4], -(-S // cfg.block_n))
    return ns, n_programs, kv, part


def test_split_heuristic_charges_the_partials():
    # Decode over a long cache: 8 programs on 132 SMs, tiny partials -> split to fill the device.
    ns, n_programs, kv, part = _splits(B=1, Tq=1, Hq=32, Hkv=8, S=4096, D=128)
    assert n_programs * ns >= 100 and 2 * ns * part < kv / 10
    # Enough programs already: no split.
    assert _splits(B=64, Tq=1, Hq=32, Hkv=8, S=4096, D=128)[0] == 1
    # 64 queries over a 1024-row cache: a split's partials (1 MB each, written and read back)
    # outweigh what idle SMs cost; splitting by program count alone took 4 splits, 8.5 MB of
    # partial traffic for 4 MB of K/V.
    ns, n_programs, kv, part = _splits(B=1, Tq=64, Hq=32, Hkv=8, S=1024, D=128)
    assert ns == 1 and 2 * 4 * part > 2 * kv
    # More partial bytes never buy more splits.
    from specops.triton_kernels import tree_attention as kernels

    for n_programs in (1, 8, 40):
        picked = [kernels.auto_splits(n_programs, 132, 8e6, part, 1e9, 295.0, 64) for part in (1e3, 1e4, 1e5, 1e6, 1e7)]
        assert picked == sorted(picked, reverse=True) and picked[-1] == 1


# ---- registration -----------------------------------------------------------------------------

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0] or not hasattr(torch.ops.specops, "tree_attention"),
                               reason="cpp backend unavailable")


@needs_cpp
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype, padded):
    args, kw = make_case(2, 5, 9, 30, 4, 2, 64, dtype, kind="tree", padded=padded)
    torch.library.opcheck(torch.ops.specops.tree_attention.default, (*args, kw["q_lens"], 0.125))


@needs_cpp
def test_torch_compile_fullgraph():
    args, kw = make_case(3, 7, 20, 50, 8, 2, 64, torch.float32, kind="dag", padded=True)

    def f(q, k, v, p, n, m, ql):
        return specops.tree_attention(q * 2, k, v, p, n, m, q_lens=ql, check=False, backend="cpp") + 1

    got = torch.compile(f, fullgraph=True)(*args, kw["q_lens"])
    want = specops.tree_attention(args[0] * 2, *args[1:], backend="torch", **kw) + 1
    assert_close(got, want, torch.float32)
