"""warp_probs: golden rules and tie-breaking, every backend vs the reference, HF equivalence,
errors, registration."""
import math

import pytest
import torch
from _cudasim import assert_order_independent, needs_sim
from _op_checks import needs_cpp

import specops
from specops import backend as _backend

INF = float("inf")


def warp(logits, t, k=0, p=1.0, backend="torch", device="cpu"):
    x = torch.atleast_2d(torch.as_tensor(logits, dtype=torch.float32, device=device))
    return specops.warp_probs(x, t, k, p, backend=backend).cpu()


def assert_probs(got, want):
    # Kept sets compared above 1e-30: backends may flush exp() results that would be denormal.
    assert torch.equal(got > 1e-30, want > 1e-30), f"kept sets differ:\n{got}\n{want}"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


# ---- golden rules, each on every backend ---------------------------------------------------

X5 = [0.1, 2.0, -1.0, 1.5, 0.7]
P4 = [math.log(v) for v in (0.15, 0.5, 0.05, 0.3)]
# name: (logits rows, temperature, top_k, top_p, kept tokens). Temperature 0: the exact one-hot rows;
# otherwise the softmax of logits / temperature over the kept tokens.
GOLDEN = {
    "t0-one-hot-at-the-first-maximum": ([[1.0, 3.0, 3.0, 0.0], [-INF, -2.0, -1.0, -1.0]], 0.0, 0, 1.0,
                                        [[0, 1, 0, 0], [0, 0, 1, 0]]),
    "t0-ignores-top-k-and-top-p": ([[0.5, 2.0, 1.0]], 0.0, 1, 0.1, [[0, 1, 0]]),
    **{f"temperature-{t}-divides-logits": ([[0.3, -1.2, 2.5, 0.0, 1.1]], t, 0, 1.0, [[1] * 5])
       for t in (0.25, 1.0, 3.0)},
    "top_k-keeps-the-k-largest": ([X5], 1.0, 2, 1.0, [[0, 1, 0, 1, 0]]),
    "top_k-keeps-every-tie-at-the-kth-value": ([[5.0, 3.0, 1.0, 3.0, 3.0]], 1.0, 2, 1.0, [[1, 1, 0, 1, 1]]),
    "top_k-minus-zero-and-zero-tie": ([[1.0, 0.0, -0.0, -1.0]], 1.0, 2, 1.0, [[1, 1, 1, 0]]),
    **{f"top_k={k}-zero-or-at-least-v-disables-it": ([X5], 1.0, k, 1.0, [[1] * 5]) for k in (0, 5, 6, 10**9)},
    "top_p-smallest-prefix-reaching-0.75": ([P4], 1.0, 0, 0.75, [[0, 1, 0, 1]]),
    "top_p-smallest-prefix-reaching-0.85": ([P4], 1.0, 0, 0.85, [[1, 1, 0, 1]]),
    # probabilities 0.4 | 0.2 0.2 0.2 (tied) | 0.0...: p = 0.5 crosses inside the tie
    "top_p-keeps-every-tie-at-the-boundary": ([[math.log(v) for v in (0.2, 0.4, 0.2, 0.2)] + [-30.0]], 1.0, 0, 0.5,
                                              [[1, 1, 1, 1, 0]]),
    "tiny-top_p-keeps-only-the-maximal-tokens": ([[1.0, 4.0, 4.0, 3.9]], 1.0, 0, 1e-9, [[0, 1, 1, 0]]),
    # top-2 renormalises 0.4, 0.3 to 0.571, 0.429: p = 0.5 then keeps one token (top-p on the
    # original distribution first would keep two).
    "top_p-acts-on-the-top_k-renormalised-distribution": ([[math.log(v) for v in (0.4, 0.3, 0.2, 0.1)]], 1.0, 2, 0.5,
                                                          [[1, 0, 0, 0]]),
    "minus-inf-get-zero-and-top_k-beyond-the-finite-ones-keeps-all": ([[-INF, 1.0, -INF, 0.0, -INF]], 1.0, 3, 0.999,
                                                                      [[0, 1, 0, 1, 0]]),
}


@pytest.mark.parametrize("x, t, k, p, keep", GOLDEN.values(), ids=GOLDEN)
def test_golden_rule(backend, device, x, t, k, p, keep):
    got = warp(x, t, k, p, backend=backend, device=device)
    if t == 0:
        assert got.tolist() == keep
    else:
        z = torch.tensor([[v / t for v in row] for row in x])
        assert_probs(got, torch.softmax(z.masked_fill(~torch.tensor(keep, dtype=torch.bool), -INF), dim=-1))


def test_per_row_tensor_parameters_equal_row_by_row_calls(backend, device):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(3)) * 2
    t = torch.tensor([0.0, 0.5, 1.0, 1.7, 0.9])
    k = torch.tensor([0, 3, 0, 40, 10], dtype=torch.int64)
    p = torch.tensor([0.3, 1.0, 0.6, 0.95, 1e-6], dtype=torch.float64)
    got = specops.warp_probs(x.to(device), t.to(device), k.to(device), p.to(device), backend=backend).cpu()
    for r in range(5):
        assert_probs(got[r:r + 1], warp(x[r].tolist(), float(t[r]), int(k[r]), float(p[r])))


# ---- every backend vs the reference ----------------------------------------------------------

PARAMS = [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.9), (0.8, 50, 0.8), (1.0, 0, 1e-6), (0.0, 0, 1.0)]


def _compare(x, params, fast_backend, device):
    """``fast_backend`` equals the reference on the logits ``x`` with each (t, k, p) of ``params``
    (scalars or per-row tensors)."""
    for t, k, p in params:
        want = specops.warp_probs(x, t, k, p, backend="torch")
        args = [v.to(device) if isinstance(v, torch.Tensor) else v for v in (t, k, p)]
        got = specops.warp_probs(x.to(device), *args, backend=fast_backend).cpu()
        assert got.dtype == torch.float32
        assert_probs(got, want)
        torch.testing.assert_close(got.sum(-1), torch.ones(x.shape[0]), rtol=0, atol=1e-5)


FP32 = torch.float32
GRID = ([(N, V, FP32) for N in (1, 3, 33) for V in (11, 1000, 32000)]
        + [(3, V, torch.bfloat16) for V in (11, 1000, 32000)] + [(33, 1000, torch.bfloat16), (3, 1000, torch.float16)])
INTERPRETED_GRID = [(1, 11, FP32), (3, 11, FP32), (3, 1000, FP32), (3, 11, torch.bfloat16)]


def _interpreted(backend, device):
    return backend == "triton" and device == "cpu"


@pytest.mark.parametrize("N,V,dtype", GRID, ids=lambda v: str(v).replace("torch.", ""))
def test_matches_reference(fast_backend, device, N, V, dtype):
    if _interpreted(fast_backend, device) and (N, V, dtype) not in INTERPRETED_GRID:
        pytest.skip("the Triton interpreter is slow: INTERPRETED_GRID covers it")
    x = torch.randn(N, V, generator=torch.Generator().manual_seed(N * V)) * 3
    _compare(x.to(dtype), PARAMS, fast_backend, device)  # bf16 rounding makes many exact ties


@pytest.mark.parametrize("N,V", [(3, 11), (33, 1000)])
def test_matches_reference_with_per_row_parameters(fast_backend, device, N, V):
    if _interpreted(fast_backend, device) and N > 3:
        pytest.skip("the Triton interpreter is slow: N = 3 covers it")
    g = torch.Generator().manual_seed(N + V)
    x = torch.randn(N, V, generator=g) * 2
    t = torch.rand(N, generator=g) * 1.5
    t[::4] = 0.0
    k = torch.randint(0, V + 3, (N,), generator=g, dtype=torch.int32)
    p = torch.rand(N, generator=g).clamp(min=1e-6)
    p[1::3] = 1.0
    _compare(x, [(t, k, p)], fast_backend, device)


@pytest.mark.parametrize("scale", [0.0, 0.3, 3.0, 30.0], ids=["flat", "mild", "normal", "peaked"])
def test_top_p_near_one_and_far_from_it_on_many_shapes_of_distribution(fast_backend, device, scale):
    # cpp drops tokens too light to matter before its top-p select: the kept set must not change.
    V = 1000 if fast_backend == "triton" else 32000
    x = torch.randn(2, V, generator=torch.Generator().manual_seed(V)) * scale
    _compare(x, [(1.0, 0, 0.999), (1.0, 0, 0.9999), (0.5, 0, 0.5), (2.0, 0, 0.97)], fast_backend, device)


def test_strided_rows(fast_backend, device):
    x = torch.randn(4, 3, 50)[:, 1, :]  # rows 150 apart
    _compare(x, [(0.9, 7, 0.8)], fast_backend, device)


# ---- large vocabularies, ties and concentrated keys (issue #15 item 6) -------------------------
# V >= 32768 with few rows takes the CUDA kernel's split plan ((chunk, row) blocks, one launch per
# digit pass); the ties put every token in one histogram bin per digit (the radix select's worst
# case). Triton interpreted runs only the V = 131072 cases (a few seconds each).

LARGE_PARAMS = [(1.0, 0, 0.9), (0.8, 50, 0.8), (1.2, 3000, 0.95), (0.7, 700, 1.0), (0.0, 0, 1.0)]


@pytest.mark.parametrize("per_row", [False, True], ids=["scalar-params", "per-row-params"])
@pytest.mark.parametrize("V", [131072, 262144])
def test_matches_reference_at_large_vocabularies(fast_backend, device, V, per_row):
    interpreted = _interpreted(fast_backend, device)
    if interpreted and V > 131072:
        pytest.skip("the Triton interpreter is slow: V = 131072 covers it")
    g = torch.Generator().manual_seed(V + per_row)
    if per_row:
        x = (torch.randn(3, V, generator=g) * 2).to(torch.bfloat16)  # bf16: many exact ties
        params = [(torch.tensor([0.9, 0.0, 1.1]), torch.tensor([0, 5, 40], dtype=torch.int32),
                   torch.tensor([0.85, 0.5, 1.0]))]
    else:
        x = torch.randn(2, V, generator=g) * 3
        x[1] = torch.distributions.Gumbel(0.0, 2.0).sample((V,))  # a heavier upper tail, like LLM logits
        params = LARGE_PARAMS[:2] if interpreted else LARGE_PARAMS
    _compare(x, params, fast_backend, device)


TIE_CASES = {
    # every token equal: top-k and top-p keep all of them
    "all_equal": lambda V, g: torch.zeros(1, V),
    # a few distinct values, each shared by many tokens: boundaries fall inside ties
    "four_values": lambda V, g: torch.randint(0, 4, (1, V), generator=g).float() * 0.25,
    # one exponent for all z (z in (-2, -1]): the first digits of every key agree
    "one_exponent": lambda V, g: -1.0 - torch.rand(1, V, generator=g) * 0.999,
    # a small head over a flat tail of ties holding ~0.3% of the mass: top-p 0.999 ends inside the tail
    "head_and_flat_tail": lambda V, g: torch.cat([torch.randn(1, 64, generator=g) + 6, torch.full((1, V - 64), -6.0)],
                                                 1),
}


@pytest.mark.parametrize("case", list(TIE_CASES))
@pytest.mark.parametrize("V", [40000, 131072])
def test_ties_and_concentrated_keys(fast_backend, device, case, V):
    if _interpreted(fast_backend, device) and V > 40000:
        pytest.skip("the Triton interpreter is slow: V = 40000 covers it")
    x = TIE_CASES[case](V, torch.Generator().manual_seed(7))
    _compare(x, [(1.0, 0, 0.5), (1.0, 1, 1.0), (1.0, 5000, 0.9), (0.5, 30000, 0.999), (1.0, 0, 1e-6)], fast_backend,
             device)


def test_ties_at_the_top_k_boundary_keep_every_tied_token(fast_backend, device):
    # 100 tokens at the maximum, k = 10 inside the tie: all 100 survive, in the split plan too.
    x = torch.full((1, 65536), -5.0)
    x[0, torch.randperm(65536, generator=torch.Generator().manual_seed(1))[:100]] = 2.0
    got = specops.warp_probs(x.to(device), 1.0, 10, 1.0, backend=fast_backend).cpu()
    assert int((got > 0).sum()) == 100
    assert_probs(got, specops.warp_probs(x, 1.0, 10, 1.0, backend="torch"))


@needs_sim
@pytest.mark.parametrize("order, seed", [("reverse", 0), ("shuffle", 3)])
def test_cudasim_split_plan_does_not_depend_on_the_thread_order(order, seed):
    x = (torch.randn(3, 40000, generator=torch.Generator().manual_seed(5)) * 3).to(torch.bfloat16)
    t, k, p = torch.tensor([0.8, 0.0, 1.0]), torch.tensor([40, 0, 0], dtype=torch.int32), torch.tensor([0.9, 1.0, 0.7])
    assert_order_independent(lambda: specops.warp_probs(x, t, k, p, backend="cudasim"), [(order, seed)])


# ---- overflow: huge logits, vanishing temperatures, huge vocabularies (issue #16 items 3, 4) ----

@pytest.mark.parametrize("t", [1e-40, 1e-45, 2.0**-127, 0.0])
def test_temperature_below_the_smallest_normal_float_is_greedy(backend, device, t):
    # Denormal temperatures made logits / t overflow to inf - inf = NaN on every backend.
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    got = warp(x, t, k=4, p=0.9, backend=backend, device=device)
    assert torch.equal(got, torch.nn.functional.one_hot(x.argmax(-1), 50).float())


def test_the_smallest_normal_temperature_is_the_limit_of_sampling(backend, device):
    # t = 2**-126 divides: every token but the (tied) maximum vanishes, none turns NaN.
    x = torch.tensor([[1.0, 3.0, 3.0, 2.9999998, -INF]])
    got = warp(x, 2.0**-126, backend=backend, device=device)
    assert got.tolist() == [[0.0, 0.5, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("scale, t, k, p", [(1e37, 0.01, 4, 0.9), (3e38, 1.0, 0, 1.0), (1e30, 1e-9, 0, 0.5),
                                            (1.0, 1e-38, 3, 0.9)])
def test_huge_logits_and_tiny_temperatures_give_no_nan_and_agree(backend, device, scale, t, k, p):
    # The row max is subtracted before dividing by t (torch gave 22 NaNs and cpp 11 on the first row).
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(2)) * scale).clamp(-3e38, 3e38)
    got = warp(x, t, k=k, p=p, backend=backend, device=device)
    assert not got.isnan().any()
    torch.testing.assert_close(got.sum(-1), torch.ones(4))
    assert_probs(got, warp(x, t, k=k, p=p))
    z = (x - x.max(-1, keepdim=True).values) / t  # the spec: finite differences, scaled
    assert_probs(warp(x, t, k=k, p=p), warp(z, 1.0, k=k, p=p))


def test_huge_vocabulary_top_p_counts_mass_without_overflow(backend, device):
    # 2**40 fixed point overflowed 64 bits from V ~ 2**23 (cpp kept 10485760 tokens, torch all).
    if _interpreted(backend, device):
        pytest.skip("20M-token rows take ~50 min in the Triton interpreter; see the next test, and the GPU run")
    V = 20971520
    x = torch.zeros(1, V)
    # Half the tokens tie at z = -0.5: top_p = 0.7 needs every one of them; at z = -2.0 the top half
    # alone holds 0.88 > 0.7 of the mass.
    for tail, kept in ((-0.5, V), (-2.0, V // 2)):
        x[0, V // 2:] = tail
        assert int((warp(x, 1.0, 0, 0.7, backend=backend, device=device) > 0).sum()) == kept


def test_fixed_point_scale_shrinks_with_the_vocabulary_and_triton_honours_it(monkeypatch, device):
    from specops.triton_kernels import sampling as tk

    assert [tk.mass_scale(v) for v in (1, 2**22, 2**22 + 1, 20971520, 2**31 - 1)] == \
        [2.0**40, 2.0**40, 2.0**39, 2.0**37, 2.0**31]
    for v in (2, 1000, 2**22, 2**22 + 1, 2**31 - 1):  # the worst row total stays below 2**62
        assert v * tk.mass_scale(v) <= 2.0**62
    if not _backend.available("triton", device)[0]:
        pytest.skip("triton unavailable")
    # The coarsest scale (V = 2**31 - 1) on a small row keeps the kept sets of the reference.
    monkeypatch.setattr(tk, "mass_scale", lambda V: 2.0**31)
    x = torch.randn(3, 300, generator=torch.Generator().manual_seed(4)) * 3
    for t, k, p in [(1.0, 0, 0.9), (0.7, 40, 0.5), (1.3, 0, 0.999)]:
        assert_probs(warp(x, t, k=k, p=p, backend="triton", device=device), warp(x, t, k=k, p=p))


# ---- the rule is HF transformers' warper chain -----------------------------------------------

def test_reference_equals_hf_temperature_top_k_top_p_chain():
    lp = pytest.importorskip("transformers.generation.logits_process")
    x = torch.randn(6, 500, generator=torch.Generator().manual_seed(11)) * 2
    for t, k, p in [(0.7, 20, 0.9), (1.0, 0, 0.8), (1.5, 100, 1.0), (0.5, 0, 0.3)]:
        z = lp.TemperatureLogitsWarper(t)(None, x.clone())
        if k:
            z = lp.TopKLogitsWarper(k)(None, z)
        if p < 1.0:
            z = lp.TopPLogitsWarper(p)(None, z)
        assert_probs(specops.warp_probs(x, t, k, p, backend="torch"), torch.softmax(z, dim=-1))


# ---- errors (bad input: the battery of tests/test_bad_input.py) ------------------------------

def test_check_false_skips_value_checks():
    got = specops.warp_probs(torch.tensor([[0.0, 1.0]]), torch.tensor([-1.0]), check=False)
    assert got.tolist() == [[0.0, 1.0]]  # a non-positive temperature is greedy


# ---- registration ----------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    t, k = torch.tensor([0.0, 0.8, 1.2]), torch.tensor([0, 5, 60], dtype=torch.int32)
    args = (torch.randn(3, 50).to(dtype), t, k, torch.tensor([1.0, 0.9, 0.5]))
    torch.library.opcheck(torch.ops.specops.warp_probs.default, args)


@needs_cpp
def test_torch_compile_fullgraph():
    x = torch.randn(4, 300)
    t = torch.tensor([0.0, 0.7, 1.0, 1.3])

    def f(logits, temp):
        return specops.warp_probs(logits * 2, temp, 40, 0.9, check=False, backend="cpp").log()

    got = torch.compile(f, fullgraph=True)(x, t)
    want = specops.warp_probs(x * 2, t, 40, 0.9, backend="torch").log()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
