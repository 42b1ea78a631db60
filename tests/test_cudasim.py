"""The CUDA emulation itself (warp collectives against their PTX definitions, barriers, shared memory,
atomics, launch limits per arch, failures that raise instead of hanging), racecheck catching each planted
hazard, and every CUDA kernel hazard-free, with the same bits in any thread order and cp.async landing."""
import functools
import pathlib
import re

import pytest
import torch
from _cudasim import (
    assert_order_independent,
    assert_same_bits,
    needs_racecheck,
    needs_sim,
    restored,
    sim,
)
from test_kv_compact import compaction_case, i32
from test_tree_attention import make_case, to_paged

import specops
from specops.testing import random_accept, random_parents, random_verify_case

pytestmark = needs_sim


@pytest.fixture
def emulator():
    """The emulator, its controls restored after the test."""
    with restored() as s:
        yield s


@pytest.fixture
def racecheck(emulator):
    """The emulator with racecheck on for one test."""
    emulator.set_racecheck(True)
    return emulator


# ---- the emulator's semantics ------------------------------------------------------------------------

def expected_collectives(arg, threads=64):
    """The PTX definitions: a source lane outside the lane's width segment yields the lane's own value."""
    out = []
    for t in range(threads):
        lane, base = t % 32, t - t % 32

        def seg(width, src_pos):  # the thread at src_pos of this lane's width segment
            return base + lane - lane % width + src_pos if 0 <= src_pos < width else t

        warp = range(base, base + 32)
        ballot = sum(1 << (u - base) for u in warp if u % 3 == 0)
        ballot = ballot - (1 << 32) if ballot >= 1 << 31 else ballot  # returned as int32
        out += [
            base + ((lane * 7 + arg) & 31),
            seg(32, (lane % 32) ^ (arg & 31)),
            seg(32, lane + (arg & 31)),
            seg(32, lane - (arg & 31)),
            ballot,
            2 * any(u == arg for u in warp) + 1,
            seg(8, lane % 8 + (arg & 7)),
            seg(8, (lane % 8) ^ (arg & 7)),
        ]
    return out


@pytest.mark.parametrize("arg", [0, 1, 5, 16, 31, 37])
def test_warp_collectives_follow_the_ptx_definitions(arg):
    assert sim.selftest("collectives", arg) == expected_collectives(arg)


@pytest.mark.parametrize("checked", [False, pytest.param(True, marks=needs_racecheck, id="racecheck")])
def test_static_shared_memory_barriers_and_shared_atomics(emulator, checked):
    emulator.set_racecheck(checked)  # racecheck accepts the atomics of many threads
    out = sim.selftest("shared_and_atomics")
    threads, blocks = 128, 3
    for b in range(blocks):
        for t in range(threads):
            assert out[b * threads + t] == (t // 32 + 1) % 4 + 100 * b  # another warp's write, after the barrier
        assert out[blocks * threads + b] == sum(1 + t for t in range(threads))


def test_exited_threads_do_not_block_a_barrier():
    assert sim.selftest("early_exit_barrier") == [2] * 32 + [0] * 32


def test_dynamic_shared_memory_starts_as_garbage():
    assert sim.selftest("uninitialised_smem") == [-1] * 32  # 0xFF bytes: reads before writes show


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_tensor_core_fragments_follow_the_ptx_layouts(seed):
    """ldmatrix (plain, as attention reads K; .trans, as it reads V) into mma.sync m16n8k16: both
    give A @ B exactly for small integers."""
    out = sim.selftest("mma", seed)
    a, b = (torch.tensor(out[i:i + 256], dtype=torch.float64).view(16, 16) for i in (512, 768))
    assert out[:256] == out[256:512] == (a @ b).to(torch.int64).flatten().tolist()


def test_cp_async_lands_only_at_the_wait():
    out = sim.selftest("cp_async")
    assert out[:32] == [-1] * 32  # read before the wait: still the 0xFF fill
    assert out[32:64] == [1000 + 4 * t + 3 for t in range(32)]
    assert out[64:96] == [0] * 32  # zero fill


def test_divergent_barrier_raises_naming_both_sites():
    with pytest.raises(RuntimeError, match=r"divergent __syncthreads in divergent_barrier block \(0, 0, 0\): "
                                           r"threads 0-15 wait at __syncthreads selftest.cpp:\d+; "
                                           r"threads 16-63 wait at __syncthreads selftest.cpp:\d+"):
        sim.selftest("divergent_barrier", 16)


def test_a_shuffle_missing_a_lane_raises_instead_of_hanging():
    with pytest.raises(RuntimeError, match=r"missing a lane.*thread 5 exited"):
        sim.selftest("missing_lane", 5)


@pytest.mark.parametrize("name, edge, why", [
    ("grid_y", 65535, "grid y and z must be <= 65535"),
    ("block_threads", 1024, "a block holds 1..1024 threads"),
    ("dynamic_smem", 48 * 1024, "needs cudaFuncSetAttribute"),
])
def test_launches_past_a_device_limit_raise_and_at_the_edge_pass(name, edge, why):
    sim.selftest(name, edge)
    with pytest.raises(RuntimeError, match=why):
        sim.selftest(name, edge + (16 if name == "dynamic_smem" else 1))


@pytest.mark.parametrize("device_arch, limit", [(90, 227 * 1024), (80, 163 * 1024)])
def test_opt_in_shared_memory_per_arch(emulator, device_arch, limit):
    emulator.set_arch(device_arch)
    assert sim.arch() == device_arch
    assert sim.selftest("dynamic_smem_optin", limit) == [0]  # cudaSuccess, and the launch runs
    assert sim.selftest("dynamic_smem_optin", limit + 16) == [1]  # cudaErrorInvalidValue


def test_bad_controls_raise():
    with pytest.raises(RuntimeError, match="schedule must be forward, reverse, shuffle or warp_ahead"):
        sim.set_schedule("sideways")
    with pytest.raises(RuntimeError, match="cp.async landing must be late or early"):
        sim.set_cp_async("never")
    with pytest.raises(RuntimeError, match="arch must be 80 or 90"):
        sim.set_arch(75)


# ---- racecheck: planted hazards ---------------------------------------------------------------------

SELFTEST = (pathlib.Path(__file__).parents[1] / "csrc" / "cudasim" / "selftest.cpp").read_text().splitlines()


def line_of(text, kernel=None):
    """The number of selftest.cpp's first line holding `text` (after the line holding "kernel(")."""
    start = 0 if kernel is None else next(i for i, t in enumerate(SELFTEST) if kernel + "(" in t)
    return next(i + 1 for i, t in enumerate(SELFTEST) if i >= start and text in t)


def hazard_pattern(kind, kernel, where, now, now_line, before, before_line):
    names = {"RAW": "read-after-write", "WAR": "write-after-read", "WAW": "write-after-write"}
    return (rf"cudasim racecheck: {names[kind]} \({kind}\) hazard in {kernel} block \(0, 0, 0\).* on {where}: "
            rf"thread \d+ \(warp \d, lane \d+\) {now} it at selftest.cpp:{now_line}\b.* after "
            rf"thread \d+ \(warp \d, lane \d+\) {before} it at selftest.cpp:{before_line}\b")


EXTERN = r"extern __shared__ \+ \d+"
PLANTED = {  # name: (kind, shared memory, what the thread that trips it did and its line's text; the same of
    # the earlier thread; what the kernel computes with its barrier in place (hazard_war: only that it runs))
    "hazard_raw": ("RAW", EXTERN, "read", "out[t] = s[t - 32]", "wrote", "s[t] = t + 1",
                   lambda out: out[32:] == list(range(1, 33))),
    "hazard_war": ("WAR", EXTERN, "wrote", "if (t >= 32) s[t] = t;", "read", "out[t] = s[t + 32]",
                   lambda out: True),
    "hazard_waw": ("WAW", r"static __shared__ s \(in hazard_waw\) \+ \d+", "wrote", "s[t - 32] = t", "wrote",
                   "if (t < 32) s[t] = t;", lambda out: out == list(range(32, 64)) * 2),
    "hazard_atomic": ("WAW", r"static __shared__ hist \(in hazard_atomic\) \+ \d+", r"wrote \(atomically\)",
                      "atomicAdd(&hist", "wrote", "if (t < 4) hist[t] = 0;", lambda out: out[:4] == [16] * 4),
    "hazard_warp": ("WAR", r"static __shared__ s \(in hazard_warp\) \+ \d+", "wrote", "if (t < 32) s[t] = t;",
                    "read", "out[t] = s[(t + 1) % 32]", lambda out: out[:32] == list(range(1, 32)) + [0]),
}


@needs_racecheck
@pytest.mark.parametrize("barrier", [False, True], ids=["reported", "accepted-with-its-barrier"])
@pytest.mark.parametrize("name", list(PLANTED))
def test_racecheck_reports_each_planted_hazard_and_accepts_it_behind_its_barrier(racecheck, name, barrier):
    kind, where, now, now_at, before, before_at, computes = PLANTED[name]
    if barrier:  # a __syncthreads (a __syncwarp in one warp) between the two accesses
        assert computes(sim.selftest(name, 1))
        return
    pattern = hazard_pattern(kind, name, where, now, line_of(now_at, name), before, line_of(before_at, name))
    with pytest.raises(RuntimeError, match=pattern):
        sim.selftest(name, 0)


def test_without_racecheck_the_planted_hazards_run(emulator):
    emulator.set_racecheck(False)
    assert sim.selftest("hazard_raw", 0)[32:] == list(range(1, 33))  # the forward order hides it


@needs_racecheck
def test_racecheck_reports_ldmatrix_rows_other_lanes_wrote_without_a_barrier(racecheck):
    # lane 0 reads its row by ldmatrix before lane 1 (running next) writes into it
    pattern = (r"write-after-read \(WAR\) hazard in mma_16x16x16 .* on extern __shared__ \+ \d+: thread 1 "
               rf".* wrote it at selftest.cpp:{line_of('as[r * LD + c] = T(a[e])')}\b.* after thread 0 .* read it at "
               rf"selftest.cpp:{line_of('ldsm_x4(af', 'mma_16x16x16')}\b")
    with pytest.raises(RuntimeError, match=pattern):
        sim.selftest("mma_nosync", 0)
    sim.selftest("mma", 0)  # with the barrier


@needs_racecheck
def test_cp_async_refill_under_a_read_shows_early_and_is_reported(racecheck):
    """Warp 0 refills its words by cp.async while warp 1 still reads them: landing at the wait hides
    the bug, landing at issue shows it, racecheck reports it whenever the copy lands."""
    old = list(range(32))
    src = [1000 + t for t in range(32)]
    sim.set_racecheck(False)
    assert sim.selftest("hazard_cp_async", 0)[32:64] == old  # late: the read still sees the old words
    sim.set_cp_async("early")
    assert sim.selftest("hazard_cp_async", 0)[32:64] == src  # early: the refill is visible
    sim.set_racecheck(True)
    issue = line_of("cp_async16(s + t, src + t, true)", "hazard_cp_async")
    read = line_of("old = s[t - 32];  // the refill", "hazard_cp_async")
    for landing in ("early", "late"):
        sim.set_cp_async(landing)
        with pytest.raises(RuntimeError, match=hazard_pattern("RAW", "hazard_cp_async", EXTERN, "read", read,
                                                              "wrote", issue)):
            sim.selftest("hazard_cp_async", 0)
        out = sim.selftest("hazard_cp_async", 1)  # the reads before a barrier, then the refill
        assert out[32:64] == old and out[64:96] == src


@needs_racecheck
def test_warp_ahead_lets_one_warp_reach_the_barrier_first(racecheck):
    sim.set_schedule("warp_ahead", 1)  # warp 1 runs to its exit before warp 0 starts: the read comes first
    with pytest.raises(RuntimeError, match=r"write-after-read \(WAR\) hazard in hazard_raw"):
        sim.selftest("hazard_raw", 0)


def test_the_backend_is_test_only():
    ok, why = specops.backend.available("cudasim", "cpu")
    assert ok and "test-only" in why
    assert specops.backend.resolve("kv_compact", "cpu") is not specops.backend._IMPLS["kv_compact"]["cudasim"]
    assert "cudasim" not in specops.backend.PREFERENCE["cpu"]


# ---- every kernel, every thread order, both cp.async landings, racecheck -------------------------------

# warp_ahead: warp 0, then the last warp of a 4-warp block, runs to each barrier before the others start.
ORDERS = [("reverse", 0), ("shuffle", 1), ("shuffle", 2), ("warp_ahead", 0), ("warp_ahead", 3)]


def op_cases():
    """One call per CUDA kernel (and per verify mode), on shapes with several warps and ragged rows."""
    g = torch.Generator().manual_seed(0)
    cases = {}
    parents = random_parents(3, 37, generator=g)
    cases["build_tree_mask"] = lambda: specops.build_tree_mask(parents, i32([37, 20, 1]), backend="cudasim")
    q = torch.randn(2, 9, 6, 40, generator=g)
    # a cache long enough to split the keys over blocks (combine_kernel)
    k, v = torch.randn(2, 2, 300, 40, generator=g), torch.randn(2, 2, 300, 40, generator=g)
    mask, _ = specops.build_tree_mask(random_parents(2, 9, generator=g))
    lens = i32([250, 61]), i32([9, 5])
    cases["tree_attention"] = lambda: specops.tree_attention(q, k, v, *lens, mask, backend="cudasim")
    split = specops.TreeAttentionPlan(*lens, mask, head_dim=40, num_heads=6, num_kv_heads=2, dtype=q.dtype,
                                      num_splits=3, backend="cudasim")
    cases["tree_attention_split"] = lambda: split.run(q, k, v)  # partials and their combine_kernel
    qh, kh, vh = (x.to(torch.bfloat16) for x in (q, k, v))  # the tensor-core kernel, its cp.async tiles
    cases["tree_attention_tc"] = lambda: specops.tree_attention(qh, kh, vh, *lens, mask, backend="cudasim")
    for dtype, D in ((torch.float32, 40), (torch.bfloat16, 64)):  # both kernels again, on scattered pages
        a, kw = make_case(2, 9, 14, 50, 6, 2, D, dtype, kind="dag", padded=True, seed=7)
        call = functools.partial(specops.tree_attention_paged, *to_paged(a, 16, 8), backend="cudasim", **kw)
        cases[f"tree_attention_paged[{str(dtype)[6:]}]"] = call

    def in_place(op, *args):  # an op writing its first two arguments: run on fresh copies, which it returns
        def case():
            out = tuple(a.clone() for a in args[:2])
            op(*out, *args[2:], backend="cudasim")
            return out
        return case
    kk, vv = (torch.randn(2, 3, 2, 40, 24, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    accept = random_accept(3, 9, generator=torch.Generator().manual_seed(3))
    cases["kv_compact"] = in_place(specops.kv_compact, kk, vv, i32([3, 20, 0]), *accept)
    # a shift chain through shared pages: every destination the previous source
    _, kp, vp, table, moves = compaction_case(3, 30, "shift", 16, torch.float32, seed=2, D=24)
    cases["kv_compact_paged"] = in_place(specops.kv_compact_paged, kp, vp, table, *moves)
    logits = torch.randn(5, 3001, generator=g)
    cases["warp_probs"] = lambda: specops.warp_probs(logits, 0.8, 40, 0.9, backend="cudasim")
    wide = torch.randn(1, 32768, generator=g)  # one row this wide is split over blocks (warp_probs_*_kernel)
    cases["warp_probs_split"] = lambda: specops.warp_probs(wide, 0.8, 40, 0.9, backend="cudasim")
    ps, cl = torch.randn(2, 3, generator=g), torch.randn(2, 3, 700, generator=g).log_softmax(-1)
    cases["topn_expand"] = lambda: specops.topn_expand(ps, cl, 11, backend="cudasim")
    scores = torch.randn(2, 37, generator=g)
    cases["select_topn_subtree"] = lambda: specops.select_topn_subtree(parents[:2], scores, 9, backend="cudasim")
    c = random_verify_case(2, 23, 601, generator=g)
    tree, nn = (c["tokens"], c["parents"]), c["num_nodes"]
    cases["verify_greedy"] = lambda: specops.verify_greedy(*tree, c["target_logits"], nn, backend="cudasim")
    tokens = torch.randint(0, 601, (2, 5), generator=g, dtype=torch.int32)
    lp = torch.randn(2, 6, 601, generator=g).log_softmax(-1)
    lq = -torch.rand(2, 5, generator=g).cumsum(-1)
    uj = torch.rand(2, generator=g)
    cases["verify_joint"] = lambda: specops.verify_joint(tokens, lp, lq, 0.3, uj, backend="cudasim")
    jl = torch.randn(2, 6, 601, generator=g)
    cases["verify_joint_logits"] = lambda: specops.verify_joint_logits(
        tokens, jl, lq, 0.3, uj, temperature=0.8, top_k=40, top_p=0.9, bonus_temperature=0.7,
        num_nodes=torch.tensor([6, 4], dtype=torch.int32), backend="cudasim")
    for mode in specops.ops.verify.MODES:
        cases[f"verify_tree[{mode}]"] = lambda m=mode: specops.verify_tree(
            *tree, c["target_probs"], c["uniforms"], draft_probs=c["draft_probs"], mode=m, num_nodes=nn,
            backend="cudasim")
    warp = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "num_nodes": nn, "backend": "cudasim"}
    for mode in ("mss", "sample_match"):
        cases[f"verify_tree_logits[{mode}]"] = lambda m=mode: specops.verify_tree_logits(
            *tree, c["target_logits"], c["uniforms"], draft_logits=c["target_logits"] if m == "mss" else None,
            mode=m, **warp)
    # under a grammar's bitmask (issue #33): the statistics passes and the walk read the mask words
    words = torch.randint(-2**31, 2**31 - 1, (2, 23, 19), generator=g, dtype=torch.int32)
    for mode in ("mss", "sample_match", "gsd"):
        cases[f"verify_tree_logits_masked[{mode}]"] = lambda m=mode: specops.verify_tree_logits(
            *tree, c["target_logits"], c["uniforms"], draft_logits=c["target_logits"].flip(-1), mode=m,
            bitmask=words, check=False, **warp)
    cw = random_verify_case(1, 3, 32768, generator=g)  # few long rows: warp_probs' split plan
    wide_words = torch.randint(-2**31, 2**31 - 1, (1, 3, 1024), generator=g, dtype=torch.int32)
    cases["verify_tree_logits_masked_split"] = lambda: specops.verify_tree_logits(
        cw["tokens"], cw["parents"], cw["target_logits"], cw["uniforms"], temperature=0.8, top_p=0.9, mode="mss",
        draft_logits=cw["target_logits"].flip(-1), num_nodes=cw["num_nodes"], bitmask=wide_words, backend="cudasim")
    xl, wl, bl = (torch.randn(*n, generator=g).to(torch.bfloat16) for n in ((21, 530), (19, 530), (19,)))
    cases["linear"] = lambda: specops.linear(xl, wl, bl, backend="cudasim")
    lg = torch.randn(3, 5, 1000, generator=torch.Generator().manual_seed(4))
    bm = torch.randint(-2**31, 2**31 - 1, (3, 5, 32), generator=torch.Generator().manual_seed(5),
                       dtype=torch.int32)
    cases["apply_token_bitmask"] = lambda: specops.apply_token_bitmask(lg.clone(), bm, backend="cudasim")
    return cases


CASES = op_cases() if sim is not None else {}


@pytest.mark.parametrize("name", list(CASES))
def test_result_does_not_depend_on_the_thread_order(name):
    assert_order_independent(CASES[name], ORDERS)


@needs_racecheck
def test_every_kernel_is_hazard_free_under_racecheck_and_early_cp_async(racecheck):
    """Every CUDA kernel once under racecheck, with copies landing late and early: no hazard, and the
    results of the plain forward run. The launches cover every __global__ function in csrc/cuda/."""
    racecheck.set_racecheck(False)
    want = {name: case() for name, case in CASES.items()}
    racecheck.set_racecheck(True)
    for landing in ("late", "early"):
        sim.set_cp_async(landing)
        for name, case in CASES.items():
            assert_same_bits(want[name], case(), f"{name}: differs under racecheck, cp.async landing {landing}")
    sources = pathlib.Path(__file__).parents[1] / "csrc" / "cuda"
    kernels = set()
    for f in list(sources.glob("*.cu")) + list(sources.glob("*.cuh")):
        kernels |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", f.read_text()))
    missing = kernels - set(sim.racechecked())
    assert len(kernels) >= 16 and not missing, missing
