"""tree_attention's kernels against the reference: the cpp grid, every CPU instruction set, the
split-K schedules, Triton's tiles and split heuristic; both KV layouts where a kernel has a paged
variant (the ``layout`` axis of test_tree_attention.py). The emulated CUDA kernels' thread order
(paged too): test_cudasim.py."""
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tree_attention import assert_close, make_case, needs_cpp, run, to_paged

import specops
from specops import backend as _backend


def triton_kernels(device):
    """specops.triton_kernels.tree_attention; skips where the triton backend cannot run on ``device``."""
    if "triton" not in _backend.implementations("tree_attention") or not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    return kernels


LAYOUTS = pytest.mark.parametrize("layout", ["contiguous", "paged"])  # as test_tree_attention.py's fixture
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
@needs_cpp
def test_cpp_matches_reference_on_the_grid(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded):
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B * Tq + L + P + D)
    want = specops.tree_attention(*args, backend="torch", **kw)
    got = specops.tree_attention(*args, backend="cpp", **kw)
    assert_close(got, want, dtype)
    if padded:
        for b in range(B):
            assert not got[b, int(kw["q_lens"][b]):].any()


@LAYOUTS
@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", GRID_DTYPES)
@needs_cpp
def test_cpp_every_instruction_set_variant_matches_reference(monkeypatch, isa, dtype, layout):
    # SPECOPS_CPU_ISA caps the variant the CPU kernel picks, so this machine runs them all
    # (where it supports them; a lower cap than the machine's is always possible). Paged: bf16 with
    # AVX512_BF16 packs V rows in pairs, which may straddle two pages (page size 1).
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    cases = [(3, 7, 40, 129, 9, 3, 64, "dag"), (2, 17, 17, 100, 4, 1, 80, "tree"), (1, 5, 33, 0, 2, 2, 67, "chain")]
    if layout == "paged":
        cases = [(2, 5, 30, 100, 6, 2, 64, "dag")] * 2
    for n, (B, Tq, L, P, Hq, Hkv, D, kind) in enumerate(cases):
        args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=n == 0 or layout == "paged", seed=n)
        assert_close(run(layout, args, "cpp", page_size=(1, 16)[n % 2], **kw),
                     specops.tree_attention(*args, backend="torch", **kw), dtype)


@LAYOUTS
@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv", [(1, 3, 3, 3000, 4, 2), (1, 2, 40, 2000, 9, 3), (3, 1, 1, 4000, 8, 8)])
@needs_cpp
def test_cpp_splits_along_the_prefix_and_combines(B, Tq, L, P, Hq, Hkv, layout):
    # Few (sequence, kv head, query tile) items leave threads idle: the kernel splits the keys
    # and merges the partials by log-sum-exp (paged: each split walking its pages); with one thread it
    # must not split (same result).
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, 128, torch.float32, kind="dag", seed=P)
    want = specops.tree_attention(*args, backend="torch", **kw)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3, 5):
            torch.set_num_threads(n)
            assert_close(run(layout, args, "cpp", **kw), want, torch.float32)
    finally:
        torch.set_num_threads(threads)


@needs_cpp
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 3), Tq=st.integers(1, 40), extra=st.integers(0, 40), P=st.integers(0, 300),
       G=st.sampled_from([1, 2, 3, 7]), Hkv=st.integers(1, 3), D=st.sampled_from([16, 33, 64, 96]),
       dtype=st.sampled_from(GRID_DTYPES), kind=st.sampled_from(["tree", "dag", "chain", "none"]),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_property_cpp_matches_reference(B, Tq, extra, P, G, Hkv, D, dtype, kind, padded, seed):
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
    triton_kernels(device)
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B + Tq + P, device=device)
    want = specops.tree_attention(*args, backend="torch", **kw)
    assert_close(specops.tree_attention(*args, backend="triton", **kw), want, dtype)


@LAYOUTS
@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_triton_split_k_matches_reference(num_splits, device, layout):
    # The flash-decoding variant: kv splits merged by a second kernel; more splits than tiles
    # leaves some splits empty (their partials must carry no weight). Paged: also the sm_80 tiles.
    kernels = triton_kernels(device)
    args, kw = make_case(2, 3, 7, 200, 6, 2, 64, torch.float32, kind="dag", padded=True, seed=num_splits,
                         device=device)
    want = specops.tree_attention(*args, sm_scale=0.125, backend="torch", **kw)
    if layout == "contiguous":
        got = kernels.tree_attention(*args, kw["q_lens"], 0.125, num_splits=num_splits)
    else:
        got = kernels.tree_attention_paged(*to_paged(args), kw["q_lens"], 0.125, num_splits=num_splits,
                                           arch=80 if num_splits == 1 else None)
    assert_close(got, want, torch.float32)


@pytest.mark.parametrize("dtype, D, Tq, G", [
    (torch.bfloat16, 256, 9, 2),  # block tiles BLOCK_M 64, BLOCK_N 32 (table 80 only)
    (torch.float32, 200, 3, 8),  # block tiles BLOCK_M 16, BLOCK_N 32
    (torch.float16, 96, 2, 4),  # decode tiles BLOCK_M 16, BLOCK_N 64
    (torch.float32, 128, 5, 4),  # block tiles BLOCK_M 32, BLOCK_N 32, 2 stages
])
def test_triton_sm80_tiles_match_reference(dtype, D, Tq, G):
    # The sm_80 table's tiles, run by the interpreter: 2 mask words per tile when BLOCK_N = 64,
    # tiles that start mid-word never happen (BLOCK_N % 32 == 0), a block crossing words.
    kernels = triton_kernels("cpu")
    args, kw = make_case(2, Tq, 45, 37, 2 * G, 2, D, dtype, kind="dag", padded=True, seed=D)
    got = kernels.tree_attention(*args, kw["q_lens"], D ** -0.5, arch=80)
    assert_close(got, specops.tree_attention(*args, backend="torch", **kw), dtype)


def test_triton_splits_a_small_decode_by_itself(device):
    # One (sequence, kv head) program over a long prefix leaves the device idle: the launcher plans
    # a split-K launch plus the combine kernel without being asked.
    kernels = triton_kernels(device)
    args, _ = make_case(1, 1, 1, 900, 4, 1, 64, torch.float32, kind="chain", device=device)
    _, launches = kernels.plan(*args, None, 0.125)
    assert len(launches) == 2 and launches[0].grid[1] > 1
    got = specops.tree_attention(*args, sm_scale=0.125, backend="triton")
    assert_close(got, specops.tree_attention(*args, sm_scale=0.125, backend="torch"), torch.float32)


def test_triton_supports_says_why_before_launching(device):
    kernels = triton_kernels(device)
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
