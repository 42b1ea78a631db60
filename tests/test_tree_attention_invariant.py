"""tree_attention's batch-invariant schedule (invariant=True) on every backend: docs/batch_invariance.md,
"Invariant attention" and "What is tested". Each backend's cases sit just before, on and past its key tiles,
with odd head dims inside the CUDA buckets (67: rows not 16-byte aligned, no cp.async) and blocks long
enough that a row's block keys fill a tile of their own (Triton: interpreted on CPU, so small cases)."""
import functools

import pytest
import torch
from _cudasim import assert_order_independent, needs_sim, racecheck_built, restored, sim
from test_plan import tree_plan
from test_tree_attention import assert_close, make_case, to_paged

import specops
from specops import backend as _backend
from specops.testing import ar_view

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as conftest's device fixture (Triton's tensors)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPES = [F32, BF16, F16]
CPU_TILE = 96


def usable(backend):
    if backend == "cudasim":
        return sim is not None
    device = DEVICE if backend == "triton" else "cpu"
    return backend in _backend.implementations("tree_attention") and _backend.available(backend, device)[0]


def need(backend):
    if not usable(backend):
        pytest.skip(f"{backend} backend unavailable")


def key_tile(dtype, D):  # keys per tile of csrc/cuda/tree_attention.cu (fp32 kernel; tensor-core TcCfg::kBN)
    return 32 if dtype == F32 else (64 if D <= 64 else 32)


# (backend, B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, seed): odd head dims, GQA, ragged batches,
# q_lens padding, prefixes on both sides of a key tile, blocks over several tiles and mask words.
CASES = [(be, *s[:7], dt, *s[7:], len(s[7]) + s[3]) for be in ("torch", "cpp") for dt in DTYPES for s in [
    (3, 7, 9, CPU_TILE - 3, 6, 2, 24, "tree", True),
    (2, 5, 5, CPU_TILE, 4, 4, 64, "chain", False),
    (3, 6, 11, CPU_TILE + 1, 9, 3, 80, "dag", True),
    (1, 12, 40, 2 * CPU_TILE - 20, 2, 1, 67, "tree", False),  # a block spilling into a second virtual tile
    (2, 4, 4, 0, 6, 3, 32, "tree", True)]]
CASES += [("cudasim", 3, 4, L, prefix(key_tile(dt, D)), 6, 2, D, dt, kind, padded, prefix(key_tile(dt, D)))
          for dt in DTYPES for D, kind, prefix, L, padded in [  # B, Tq, Hq, Hkv = 3, 4, 6, 2: G = 3 heads a row tile
              (24, "tree", lambda bn: bn - 1, 7, True),
              (64, "chain", lambda bn: bn, 7, False),
              (80, "dag", lambda bn: bn + 1, 7, True),
              (64, "tree", lambda bn: 2 * bn + 5, 7, True),
              (67, "chain", lambda bn: bn + 3, 45, True),
              (80, "dag", lambda bn: 2 * bn - 9, 70, False)]]
# G = 18 heads per kv head: two 16-row tiles per query in the fp32 kernel (its heads split the same way
# in the AR view), 18 of the tensor-core kernel's 64 rows.
CASES += [("cudasim", 2, 3, 5, 31, 18, 1, 24, dt, "tree", True, 4) for dt in (F32, BF16)]
CASES += [("triton", *c, n) for n, c in enumerate([
    (3, 5, 9, 31, 6, 2, 24, F32, "tree", True),  # P = BLOCK_N - 1
    (3, 4, 40, 32, 4, 4, 80, F32, "dag", False),  # P = BLOCK_N, a block over two mask words (+1 spare)
    (3, 5, 12, 65, 6, 2, 64, BF16, "chain", True),  # P = BLOCK_N + 1
    (3, 3, 7, 133, 4, 4, 64, F16, "tree", False),  # P = 2 * BLOCK_N + 5
    (3, 4, 20, 69, 6, 2, 80, F32, "chain", True),  # P = 2 * BLOCK_N + 5, rows ending in several tiles
    (2, 3, 70, 5, 4, 2, 40, F32, "chain", False)])]  # block keys over three tiles and three mask words
IDS = [f"{c[0]}-{str(c[8])[6:]}-{c[9]}-B{c[1]}-H{c[5]}x{c[6]}-D{c[7]}-P{c[4]}-L{c[3]}" for c in CASES]


def invariant(backend, *args, **kw):
    return specops.tree_attention(*args, backend=backend, invariant=True, **kw)


@functools.cache
def _case(n):
    """(args, kw, the invariant call's output) of CASES[n], computed once for every test."""
    backend, B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, seed = CASES[n]
    need(backend)
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=seed,
                         device=DEVICE if backend == "triton" else "cpu")
    return args, kw, invariant(backend, *args, **kw)


def check_rows_equal_ar_view(backend, args, kw, out, every_form=True):
    B, Tq = args[0].shape[:2]
    q_lens = [Tq] * B if kw["q_lens"] is None else kw["q_lens"].tolist()
    valid = [(b, i) for b in range(B) for i in range(q_lens[b])]
    for k, (b, i) in enumerate(valid):
        # The interpreted Triton kernels are slow: both AR forms on its first two rows, then alternate.
        for own in ((True, False) if every_form or k < 2 else ((k % 2) == 0,)):
            want = invariant(backend, *ar_view(*args, b, i, self_in_block=own))[0, 0]
            assert torch.equal(out[b, i], want), (backend, b, i, own, (out[b, i] - want).abs().max())
    assert all((out[b, q_lens[b]:] == 0).all() for b in range(B))  # padding rows


@pytest.mark.parametrize("n", range(len(CASES)), ids=IDS)
def test_every_row_equals_its_ar_view_bit_for_bit(n):
    args, kw, out = _case(n)
    check_rows_equal_ar_view(CASES[n][0], args, kw, out, every_form=CASES[n][0] != "triton")


@pytest.mark.parametrize("n", range(len(CASES)), ids=IDS)
def test_values_match_the_torch_reference(n):
    # Both references: the op's (invariant=False) and the invariant schedule's, within the usual tolerances.
    args, kw, out = _case(n)
    for mode in (False, True):
        assert_close(out, specops.tree_attention(*args, backend="torch", invariant=mode, **kw), args[0].dtype)


FIRST = {be: next(n for n, c in enumerate(CASES) if c[0] == be) for be in ("cudasim", "triton")}
# cudasim: the prefix 2 BN + 5 case (SHAPES[3] of the list above) in each dtype; triton: cases 0, 2, 4.
PAGED = [(FIRST["cudasim"] + 6 * d + 3, ps) for d in range(3) for ps in (4, 16)]
PAGED += [(FIRST["triton"] + m, ps) for m, ps in ((0, 16), (2, 8), (4, 32))]


@pytest.mark.parametrize("n, page_size", PAGED, ids=[f"{IDS[n]}-ps{ps}" for n, ps in PAGED])
def test_paged_gives_the_contiguous_bits(n, page_size):
    args, kw, out = _case(n)
    got = specops.tree_attention_paged(*to_paged(args, page_size, n), backend=CASES[n][0], invariant=True, **kw)
    assert torch.equal(got, out)


# ---- the CPU kernel: instruction sets, threads, batch composition --------------------------------

def _cpu_case(n, dtype, seed):
    B, Tq, L, P, Hq, Hkv, D, kind, padded = CASES[n][1:8] + CASES[n][9:11]
    return make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=seed)


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
def test_cpp_every_isa_variant_keeps_the_property(monkeypatch, isa):
    need("cpp")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for dtype in (F32, BF16):
        args, kw = _cpu_case(2, dtype, seed=3)
        out = invariant("cpp", *args, **kw)
        check_rows_equal_ar_view("cpp", args, kw, out)
        assert_close(out, invariant("torch", *args, **kw), dtype)


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("mode", [False, True])
def test_cpp_narrow_items_on_every_isa_variant(monkeypatch, isa, mode):
    # Items of <= 4 query rows (a decode step's GQA group, a 2-query block at G = 2, every invariant item
    # at G <= 4) take the CPU kernel's narrow path (head dims in lanes): masked block keys, prefixes
    # across a tile, head dims with a tail past the last whole vector.
    need("cpp")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for n, (B, Tq, L, P, Hq, Hkv, D, kind) in enumerate([(2, 1, 1, CPU_TILE + 54, 9, 3, 67, "chain"),
                                                         (3, 2, 9, CPU_TILE + 1, 4, 2, 40, "tree"),
                                                         (1, 4, 4, 5, 4, 4, 19, "dag")]):
        for dtype in (F32, BF16):
            args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=n == 1, seed=n)
            got = specops.tree_attention(*args, backend="cpp", invariant=mode, **kw)
            assert_close(got, specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_batch_composition_threads_and_layout_change_no_bit(backend):
    need(backend)
    args, kw = _cpu_case(0, BF16, seed=11)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = invariant(backend, *args, **kw)
        torch.set_num_threads(2)
        assert torch.equal(one, invariant(backend, *args, **kw))
    finally:
        torch.set_num_threads(threads)
    # Each sequence alone (its own batch of 1, its own cache length) and the rows reversed.
    for b in range(len(args[0])):
        sub = [a[b:b + 1] for a in args]
        sub[1], sub[2] = sub[1][:, :, :int(args[3][b] + args[4][b])], sub[2][:, :, :int(args[3][b] + args[4][b])]
        ql = None if kw["q_lens"] is None else kw["q_lens"][b:b + 1]
        assert torch.equal(invariant(backend, *sub, q_lens=ql)[0], one[b])
    rev = invariant(backend, args[0].flip(1), *args[1:5], args[5].flip(1))
    assert torch.equal(rev.flip(1), invariant(backend, *args))
    # Paged: the same bits as contiguous.
    paged = specops.tree_attention_paged(*to_paged(args, 16, 0), q_lens=kw["q_lens"], backend=backend, invariant=True)
    assert torch.equal(paged, one)


def test_plan_runs_the_invariant_schedule_unsplit():
    backend = "cpp" if usable("cpp") else "torch"
    args, kw = _cpu_case(3, F32, seed=5)
    plan = tree_plan(args, kw, backend=backend, invariant=True, max_len=args[1].shape[2])
    assert plan.num_splits == 1 and plan.workspace is None
    assert torch.equal(plan.run(*args[:3]), invariant(backend, *args, **kw))


def test_bad_input_names_the_argument():  # a non-bool invariant: test_tree_attention.py's BAD cases
    need("cpp")
    args, _ = make_case(1, 2, 3, 4, 2, 1, 8, F32, kind="chain")
    with pytest.raises(ValueError, match="invariant=True runs unsplit"):
        torch.ops.specops.tree_attention(*args, None, 0.5, 2, None, True)


# ---- the CUDA kernels in the emulator: thread order, cp.async landing, racecheck, shared memory --

@needs_sim
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_thread_order_and_cp_async_landing_change_no_bit_and_racecheck_is_clean(dtype):
    args, kw, _ = _case(FIRST["cudasim"] + 6 * DTYPES.index(dtype) + 5)  # 3+ key tiles: both buffers refilled
    paged = to_paged(args, 8, 5)
    calls = [lambda: invariant("cudasim", *args, **kw),
             lambda: specops.tree_attention_paged(*paged, backend="cudasim", invariant=True, **kw)]
    want = [c() for c in calls]
    assert torch.equal(want[0], want[1])
    for c, w in zip(calls, want):
        assert_order_independent(c, [("reverse", 0), ("shuffle", 1), ("shuffle", 2), ("warp_ahead", 1)], w)
    if not racecheck_built():
        pytest.skip("cudasim built without racecheck's instrumentation")
    with restored() as emulator:
        emulator.set_racecheck(True)  # a hazard raises naming both accesses
        for landing in ("late", "early"):
            emulator.set_cp_async(landing)
            for c, w in zip(calls, want):
                assert torch.equal(c(), w), landing


@needs_sim
def test_visible_keys_that_cannot_fit_in_shared_memory_raise():
    # The key list needs min(32 W, S) entries of shared memory: past the limit the launcher raises.
    W, S = 2048, 65536
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, S, 8)
    mask = torch.zeros(1, 1, W, dtype=torch.int32)
    mask[0, 0, 0] = 1
    lens = lambda x: torch.tensor([x], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"invariant=True lists a query's visible block keys.*W = 2048"):
        invariant("cudasim", q, k, k, lens(0), lens(1), mask)


# ---- Triton: never split ---------------------------------------------------------------------------

def test_triton_refuses_a_kv_split():
    need("triton")
    from specops.triton_kernels import tree_attention as kernels

    args, kw, out = _case(FIRST["triton"])
    with pytest.raises(ValueError, match="num_splits must be None or 1 with invariant=True.*got 2"):
        kernels.tree_attention(*args, kw["q_lens"], 0.125, num_splits=2, invariant=True)
    one = kernels.tree_attention(*args, kw["q_lens"], args[0].shape[-1] ** -0.5, num_splits=1, invariant=True)
    assert torch.equal(one, out)
    _, launches = kernels.plan(*args, kw["q_lens"], 0.125, invariant=True)
    B, Tq = args[0].shape[:2]
    assert len(launches) == 1 and launches[0].grid == (B * Tq * args[1].shape[1], 1)
    assert launches[0].kwargs["INVARIANT"] and launches[0].kwargs["BLOCK_M"] == 16
