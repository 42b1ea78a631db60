"""verify_tree_logits and verify_joint_logits (R6) equal their meaning bit for bit on every backend:
verify_tree on warp_probs' rows (the two-op composition); verify_joint's test on det_log of those rows
with verify_tree's bonus draw from the bonus warp (the joint torch reference, checked against that
composition). Bad input: the battery of tests/test_bad_input.py."""
import zlib

import numpy as np
import pytest
import torch
from _cudasim import assert_order_independent, needs_sim
from _op_checks import assert_same, needs_cpp

import specops
from specops.ops.verify import MODES, NEEDS_DRAFT
from specops.ops.verify import logits as verify_logits
from specops.ops.verify import ref as verify_ref
from specops.testing import random_verify_case

I32 = torch.int32
SLOW = ("triton",)  # interpreted on CPU here: seconds per top-p row


def per_row_warps(device):
    """Two warps' per-row parameters for B = 4, with a greedy row in each: (t, k, p, t2, k2, p2)."""
    values = ([0.7, 0.0, 1.5, 1.0], [0, 4, 9, 60], [0.9, 1.0, 0.6, 0.3], [1.0, 0.5, 0.0, 2.0], [3, 0, 0, 1],
              [1.0, 0.7, 0.9, 0.99])
    dtypes = (None, I32, None, None, torch.int64, None)
    return [torch.tensor(v, dtype=d, device=device) for v, d in zip(values, dtypes)]


def kernel_warp(N):
    """One warp's per-row arguments of the ops' schemas: (temperature, top_k, top_p) [N]."""
    return torch.full((N,), 0.8), torch.full((N,), 3, dtype=I32), torch.full((N,), 0.9)


@pytest.fixture
def warp_calls(monkeypatch):
    """The shapes of the logits the torch reference warps, call by call."""
    calls = []
    real = verify_logits.warp_probs_torch
    monkeypatch.setattr(verify_logits, "warp_probs_torch", lambda x, *a: calls.append(x.shape) or real(x, *a))
    return calls


def fused(backend, c, mode, X, Y, t, k, p, dt=None, dk=0, dp=1.0, bitmask=None):
    return specops.verify_tree_logits(c["tokens"], c["parents"], X, c["uniforms"], temperature=t, top_k=k, top_p=p,
                                      draft_logits=Y, draft_temperature=dt, draft_top_k=dk, draft_top_p=dp, mode=mode,
                                      num_nodes=c["num_nodes"], bitmask=bitmask, backend=backend)


def case(B, T, V, seed, *, chain=False, device="cpu", dtype=torch.float32, sharpness=3.0):
    g = torch.Generator().manual_seed(seed)
    c = random_verify_case(B, T, V, generator=g, chain=chain, sharpness=sharpness)
    X = c["target_logits"]
    Y = X + torch.randn(X.shape, generator=g) * 2.0  # a correlated draft
    c = {k: v.to(device) for k, v in c.items()}
    return c, X.to(dtype).to(device), Y.to(dtype).to(device)


def check(backend, c, mode, X, Y, t, k, p, dt=None, dk=0, dp=1.0):
    """The fused op equals verify_tree(warp_probs(target), draft_probs=warp_probs(draft)), the [B]
    parameters repeated per row; -> its outputs."""
    B, T, V = X.shape

    def warp(Z, *params):
        params = [v.repeat_interleave(T) if isinstance(v, torch.Tensor) else v for v in params]
        return specops.warp_probs(Z.reshape(B * T, V), *params, backend=backend).view(B, T, V)

    Q = warp(Y, t if dt is None else dt, dk, dp) if mode in NEEDS_DRAFT else None
    want = specops.verify_tree(c["tokens"], c["parents"], warp(X, t, k, p), c["uniforms"], draft_probs=Q,
                               mode=mode, num_nodes=c["num_nodes"], backend=backend)
    got = fused(backend, c, mode, X, Y, t, k, p, dt, dk, dp)
    assert_same(got, want, I32)
    return got


# Warping settings: (temperature, top_k, top_p, draft_temperature, draft_top_k, draft_top_p).
SETTINGS = {
    "plain": (0.7, 0, 1.0, None, 0, 1.0),
    "topk-topp": (1.3, 5, 0.9, 0.9, 0, 0.8),
    "topp-half": (0.8, 0, 0.5, None, 3, 1.0),
    "greedy-target": (0.0, 0, 1.0, 1.0, 0, 1.0),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(3, 9, 7, False), (2, 6, 33, True), (2, 12, 301, False)],
                         ids=["tree-V7", "chain-V33", "tree-V301"])
def test_equals_the_composition(backend, device, mode, setting, shape):
    B, T, V, chain = shape
    if backend in SLOW and V > 100:
        B, T = 1, 6  # interpreted: top-p costs seconds per row here
    seed = zlib.crc32(f"{mode}-{setting}-{V}".encode()) % 1000  # hash() of a str is salted per process
    c, X, Y = case(B, T, V, seed, chain=chain, device=device)
    check(backend, c, mode, X, Y, *SETTINGS[setting])


@pytest.mark.parametrize("target, draft", [("bfloat16",) * 2, ("float16",) * 2, ("bfloat16", "float32")])
@pytest.mark.parametrize("mode", MODES)
def test_low_precision_logits(backend, device, mode, target, draft):
    B, T = (2, 6) if backend in SLOW else (3, 8)  # interpreted: half the rows, a ragged batch still
    c, X, Y = case(B, T, 129, 11, device=device)
    X, Y = X.to(getattr(torch, target)), Y.to(getattr(torch, draft))
    check(backend, c, mode, X, Y, 0.9, 7, 0.85, dt=1.1, dk=0, dp=0.95)


@pytest.mark.parametrize("mode", MODES)
def test_per_row_parameters_with_a_greedy_row(backend, device, mode):
    c, X, Y = case(4, 7, 50, 13, device=device)
    check(backend, c, mode, X, Y, *per_row_warps(device))


@pytest.mark.parametrize("mode", MODES)
def test_ties_at_the_top_k_and_top_p_boundaries(backend, device, mode):
    # Logits on a coarse grid: many tokens share the k-th value and the top-p crossing value.
    B, T = (2, 6) if backend in SLOW else (3, 8)  # interpreted: half the rows, a ragged batch still
    c, X, Y = case(B, T, 41, 14, device=device)
    X, Y = (torch.round(v / 2).clamp(-3, 3) for v in (X, Y))
    for k, p in ((5, 1.0), (0, 0.6), (3, 0.5), (8, 0.97)):
        check(backend, c, mode, X, Y, 1.0, k, p, dt=1.0, dk=k, dp=p)


@pytest.mark.parametrize("mode", MODES)
def test_minus_inf_logits_and_top_p_keeping_one_token(backend, device, mode):
    B, T = (2, 6) if backend in SLOW else (3, 8)  # interpreted: half the rows, a ragged batch still
    c, X, Y = case(B, T, 37, 15, device=device)
    g = torch.Generator().manual_seed(5)
    X, Y = (v.masked_fill(torch.rand(v.shape, generator=g).to(device) < 0.4, float("-inf")) for v in (X, Y))
    X[..., 0] = Y[..., 0] = 0.0  # every row keeps a finite logit
    check(backend, c, mode, X, Y, 0.9, 0, 1e-6, dt=1.0, dk=0, dp=1e-6)  # one token per row
    check(backend, c, mode, X, Y, 1.0, 4, 0.95)


def test_sharp_rows_reach_deep_and_share_nothing_with_the_draft(backend, device):
    # A peaked target and a draft that disagrees: long accepted paths and residual resampling.
    c, X, Y = case(2, 10, 90, 16, chain=True, device=device, sharpness=8.0)
    for mode in MODES:
        check(backend, c, mode, X, -Y, 0.6, 0, 0.95)


@pytest.mark.parametrize("mode", ["mss", "sample_match", "mss_noreplace"])
def test_vocabulary_past_2_to_the_23(backend, device, mode):
    if backend in SLOW:
        pytest.skip(f"{backend} runs interpreted here: V = 2**23 + 5 is too slow (covered by cpp, cudasim, torch)")
    V = 2**23 + 5
    g = torch.Generator().manual_seed(17)
    X = torch.randn(1, 2, V, generator=g) * 4
    Y = X + torch.randn(1, 2, V, generator=g)
    top = int(X[0, 0].argmax())
    c = {"tokens": torch.tensor([[0, top]], dtype=I32), "parents": torch.tensor([[-1, 0]], dtype=I32),
         "uniforms": torch.rand(1, 2, 2, generator=g), "num_nodes": torch.tensor([2], dtype=I32)}
    c = {k: v.to(device) for k, v in c.items()}
    check(backend, c, mode, X.to(device), Y.to(device), 1.0, 0, 0.9)


@pytest.mark.parametrize("mode", ["mss", "mss_pointmass", "gsd"])
def test_few_long_rows_take_warp_probs_split_plan(backend, device, mode):
    # CUDA's warp_probs splits rows of V >= 32768 over several blocks when there are few rows (its
    # normaliser is then summed in another order): the statistics must follow the same plan.
    if backend in SLOW:
        pytest.skip(f"{backend} runs interpreted here: V = 40961 top-p rows are too slow (one-row plan: above)")
    c, X, Y = case(1, 5, 40961, 20, device=device)
    check(backend, c, mode, X, Y, 0.8, 0, 0.9, dt=1.0, dk=30, dp=1.0)


# ---- under a grammar: the bitmask fused into the walk (issue #33) ----------------------------------

def masked_case(B, T, V, seed, *, device="cpu", dtype=torch.float32, chain=False):
    """A case with a bitmask that keeps ~40 % of each row and often drops its top tokens, NaN / +inf
    planted at disallowed logits of both tensors (the mask turns them into -inf), and children
    that often carry a token their parent's row allows, so that masked walks go deep."""
    c, X, Y = case(B, T, V, seed, chain=chain)
    g = torch.Generator().manual_seed(seed + 1)
    allowed = torch.rand(B, T, V, generator=g) < 0.4
    allowed.scatter_(-1, X.topk(min(3, V), -1).indices, torch.rand(B, T, min(3, V), generator=g) < 0.3)
    allowed.scatter_(-1, torch.randint(0, V, (B, T, 1), generator=g), True)  # every row allows a token
    mask = specops.pack_mask(allowed)
    par = c["parents"].long()
    for b in range(B):
        for i in range(1, int(c["num_nodes"][b])):
            ok = allowed[b, int(par[b, i])].nonzero().flatten()
            if 0 <= par[b, i] < i and torch.rand((), generator=g) < 0.7:
                c["tokens"][b, i] = int(ok[torch.randint(0, len(ok), (), generator=g)])
    par = torch.where((par >= 0) & (par < torch.arange(T)), par, 0)  # the root and padding: row 0
    at_parent = allowed.gather(1, par[..., None].expand(-1, -1, V))
    weird = torch.rand(B, T, V, generator=g) < 0.1
    X = X.masked_fill(~allowed & weird, float("nan"))
    Y = Y.masked_fill(~at_parent & weird, float("inf"))
    c = {k: v.to(device) for k, v in c.items()}
    return c, X.to(dtype).to(device), Y.to(dtype).to(device), mask.to(device), at_parent.to(device)


def masked_composition(backend, case, mode, *params):
    """The unfused meaning of a masked_case: both logits masked first (the draft's by its parents' rows)."""
    c, X, Y, mask, at_parent = case
    Xm = specops.apply_token_bitmask(X.clone(), mask, backend=backend)
    return fused(backend, c, mode, Xm, Y.masked_fill(~at_parent, float("-inf")), *params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("setting", ["plain", "topk-topp", "greedy-target"])
@pytest.mark.parametrize("mode", MODES)
def test_bitmask_equals_verify_on_masked_logits(backend, device, mode, setting, dtype):
    params = SETTINGS[setting]
    shapes = [(3, 9, 7, False), (2, 6, 70, True), (2, 12, 301, False)]
    if backend in SLOW:
        shapes = [(2, 6, 70, True), (1, 6, 301, False)]
    for i, (B, T, V, chain) in enumerate(shapes):
        c, X, Y, mask, _ = masked = masked_case(B, T, V, 40 + i, device=device, dtype=dtype, chain=chain)
        got = fused(backend, c, mode, X, Y, *params, bitmask=mask)
        on_cpu = masked_case(B, T, V, 40 + i, dtype=dtype, chain=chain)
        assert_same(got, masked_composition("torch", on_cpu, mode, *params), I32)
        if backend not in ("torch",) + SLOW:  # and the unfused composition on this backend agrees
            assert_same(got, masked_composition(backend, masked, mode, *params), I32)


def test_bitmask_walks_reach_deep_and_reject_disallowed_drafts(backend, device):
    # Accepted paths past the root under the mask, and a draft token its parent's row disallows
    # is never accepted (its masked target probability is 0).
    deep = 0
    for seed in range(4):
        c, X, Y, mask, _ = masked_case(2, 8, 40, 60 + seed, device=device, chain=True)
        for mode in ("mss", "sample_match"):
            idx, lens, bonus = fused(backend, c, mode, X * 4, Y * 4, 1.0, 0, 1.0, bitmask=mask)
            allowed = specops.ops.token_bitmask.allowed_tokens(mask, 40).cpu()
            for b in range(2):
                path = idx[b, :int(lens[b])].tolist()
                deep += len(path) > 1
                for u, v in zip(path, path[1:]):
                    assert allowed[b, u, int(c["tokens"][b, v])]
                assert allowed[b, path[-1], int(bonus[b])]
    assert deep > 0


@needs_sim
def test_cudasim_thread_order_does_not_change_the_result():
    c, X, Y = case(3, 9, 601, 21)
    cm, Xm, Ym, mask, _ = masked_case(3, 9, 601, 22)  # and under a grammar bitmask

    def run(mode):
        return (*fused("cudasim", c, mode, X, Y, 0.9, 5, 0.9, dt=1.1, dk=0, dp=0.8),
                *fused("cudasim", cm, mode, Xm, Ym, 0.9, 5, 0.9, dt=1.1, dp=0.8, bitmask=mask))

    for mode in MODES:
        assert_order_independent(lambda m=mode: run(m), [("reverse", 0), ("shuffle", 1), ("shuffle", 2)])


def test_uniforms_select_every_outcome(backend, device):
    # Across seeds the outputs vary (the op is not constant) and still match the composition.
    seen = set()
    for seed in range(6):
        c, X, Y = case(2, 6, 23, 100 + seed, device=device)
        _, lens, bonus = check(backend, c, "mss", X, Y, 1.0, 0, 0.9)
        seen.add((tuple(lens.tolist()), tuple(bonus.tolist())))
    assert len(seen) > 3


def test_torch_reference_never_builds_an_n_by_v_tensor(warp_calls):
    # The reference warps only the rows its walk reads: a chain rejected at the root reads one.
    c, X, Y = case(1, 8, 19, 18, chain=True)
    c["tokens"][0, 1:] = int(X[0, 0].argmin())  # a token top-k 1 removes: rejected at once
    fused("torch", c, "sample_match", X, Y, 1.0, 1, 1.0)
    assert warp_calls == [(1, 19)]


@needs_cpp
def test_opcheck():
    c, X, Y = case(2, 5, 17, 19)
    warp = kernel_warp(10)  # [B * T]
    for mode in MODES:
        torch.library.opcheck(torch.ops.specops.verify_tree_logits.default,
                              (c["tokens"], c["parents"], X.bfloat16(), c["uniforms"], *warp, Y, *warp,
                               c["num_nodes"], mode))
    c, X, Y, mask, _ = masked_case(2, 5, 17, 19)
    args = (c["tokens"], c["parents"], X, c["uniforms"], *warp, Y, *warp, c["num_nodes"], "mss", mask)
    torch.library.opcheck(torch.ops.specops.verify_tree_logits.default, args)


# ---- verify_joint_logits (R6) -------------------------------------------------------------------------

# (temperature, top_k, top_p, bonus_temperature, bonus_top_k, bonus_top_p); MJSD's own: 1, 20, 0.9.
JOINT_SETTINGS = {
    "mjsd": (1.0, 20, 0.9, 0.8, 0, 1.0),
    "plain": (0.7, 0, 1.0, None, 0, 1.0),
    "topk-topp": (1.3, 5, 0.6, 1.0, 3, 0.9),
    "greedy-test": (0.0, 0, 1.0, 1.0, 0, 1.0),
    "greedy-bonus": (1.0, 4, 0.95, 0.0, 0, 1.0),
}
TAUS = (0.0, 0.05, 0.3, 1.0)


def joint_case(B, g, V, seed, *, device="cpu", dtype=torch.float32, ragged=True):
    """Logits, drafts that are often the target's top tokens (so prefixes pass and fail), draft joint
    log-probs near the target's, ragged chain lengths and uniforms."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(B, g + 1, V, generator=gen) * 3
    top = X[:, :g].argmax(-1)
    tok = torch.where(torch.rand(B, g, generator=gen) < 0.7, top, torch.randint(0, V, (B, g), generator=gen))
    lp = torch.log_softmax(X[:, :g], -1).gather(-1, tok[..., None])[..., 0]
    lq = torch.cumsum(lp + torch.randn(B, g, generator=gen) * 0.5, 1).clamp(max=0.0)
    n = torch.randint(1, g + 2, (B,), generator=gen, dtype=I32) if ragged else torch.full((B,), g + 1, dtype=I32)
    c = {"draft_tokens": tok.to(I32), "target_logits": X.to(dtype), "draft_joint_logprobs": lq.float(),
         "uniforms": torch.rand(B, generator=gen), "num_nodes": n}
    return {k: v.to(device) for k, v in c.items()}


def run_joint(backend, c, tau, setting, **kw):
    t, k, p, bt, bk, bp = JOINT_SETTINGS[setting] if isinstance(setting, str) else setting
    return specops.verify_joint_logits(c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], tau,
                                       c["uniforms"], temperature=t, top_k=k, top_p=p, bonus_temperature=bt,
                                       bonus_top_k=bk, bonus_top_p=bp, num_nodes=c["num_nodes"],
                                       backend=backend, **kw)


def joint_check(backend, c, setting, taus=TAUS):
    """``backend`` on the case ``c`` equals the torch reference on CPU copies, for every tau."""
    def _cpu(v):
        return v.cpu() if isinstance(v, torch.Tensor) else v

    setting = JOINT_SETTINGS[setting] if isinstance(setting, str) else setting
    cpu_c, cpu_setting = {k: v.cpu() for k, v in c.items()}, [_cpu(v) for v in setting]
    for tau in taus:
        want = run_joint("torch", cpu_c, _cpu(tau), cpu_setting)
        assert_same(run_joint(backend, c, tau, setting), want, I32)


@pytest.mark.parametrize("setting", list(JOINT_SETTINGS))
def test_joint_equals_the_reference(fast_backend, device, setting):
    grid = [(3, 4, 7), (2, 1, 33), (4, 6, 301), (1, 9, 1000), (2, 0, 5)]
    if fast_backend == "triton":  # interpreted here
        grid = [(3, 4, 7), (2, 5, 33), (1, 3, 301)]
    for i, (B, g, V) in enumerate(grid):
        joint_check(fast_backend, joint_case(B, g, V, 10 + i, device=device), setting)


def test_joint_per_row_parameters_and_tau(fast_backend, device):
    joint_check(fast_backend, joint_case(4, 5, 50, 3, device=device), per_row_warps(device),
                taus=[torch.tensor([0.0, 0.2, 0.6, 1.0], device=device)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_joint_low_precision_logits(fast_backend, device, dtype):
    joint_check(fast_backend, joint_case(3, 4, 129, 4, device=device, dtype=dtype), "mjsd")


def test_joint_ties_and_minus_inf_logits(fast_backend, device):
    c = joint_case(3, 5, 41, 5)
    X = torch.round(c["target_logits"] / 2).clamp(-3, 3)  # many ties at the top-k / top-p boundaries
    X = X.masked_fill(torch.rand(X.shape, generator=torch.Generator().manual_seed(1)) < 0.3, float("-inf"))
    X[..., 0] = 0.0  # every row keeps a finite logit
    c["target_logits"] = X
    for setting in ((1.0, 5, 1.0, 1.0, 0, 1e-6), (1.0, 0, 0.6, 1.0, 3, 0.5), (1.0, 8, 0.97, 1.0, 8, 0.97)):
        joint_check(fast_backend, {k: v.to(device) for k, v in c.items()}, setting)


def test_joint_reference_is_the_composition():
    # The spec in plain terms: verify_joint's test on det_log of warp_probs' rows (the chain cut at
    # num_nodes), the bonus drawn from warp_probs of row eta with the bonus warp.
    for seed, setting in enumerate(JOINT_SETTINGS):
        c = joint_case(3, 5, 23, 20 + seed)
        t, k, p, bt, bk, bp = JOINT_SETTINGS[setting]
        B, T, V = c["target_logits"].shape
        S = verify_ref.fix_shift(V)
        P, Pb = (specops.warp_probs(c["target_logits"].view(B * T, V), *warp, backend="torch").view(B, T, V)
                 for warp in ((t, k, p), (t if bt is None else bt, bk, bp)))
        L = torch.tensor(np.vectorize(verify_ref.det_log, otypes=[np.float32])(P.numpy()))
        for tau in TAUS:
            idx, lens, bonus = run_joint("torch", c, tau, setting)
            for b in range(B):
                n = int(c["num_nodes"][b])
                one = specops.verify_joint(c["draft_tokens"][b:b + 1, :n - 1].contiguous(), L[b:b + 1, :n].contiguous(),
                                           c["draft_joint_logprobs"][b:b + 1, :n - 1].contiguous(), tau,
                                           c["uniforms"][b:b + 1], backend="torch", check=False)
                assert int(lens[b]) == int(one[1][0]) and idx[b, :n].tolist() == one[0][0].tolist()
                weights = verify_ref.fix_weights(Pb[b, int(lens[b]) - 1], S)  # the bonus row: eta
                assert int(bonus[b]) == verify_ref.sample_weights(weights, c["uniforms"][b])


def test_joint_outcomes_vary_and_tau_ends():
    # tau = 0 accepts every tested draft, tau = 1 none; in between the prefixes vary.
    seen = set()
    for seed in range(8):
        c = joint_case(3, 6, 30, 40 + seed)
        n = c["num_nodes"]
        assert run_joint("torch", c, 0.0, "mjsd")[1].tolist() == n.tolist()
        assert run_joint("torch", c, 1.0, "mjsd")[1].tolist() == [1] * 3
        seen.update(run_joint("torch", c, 0.05, "plain")[1].tolist())
    assert len(seen) > 2


def test_det_log_is_within_an_ulp_of_log():
    det_log = verify_ref.det_log
    xs = np.float32(np.concatenate([np.logspace(-37.9, 0, 5000), [1.0, 0.5, 2.0**-126, 0.999999, 1e-3]]))
    got = np.array([det_log(x) for x in xs], dtype=np.float64)
    want = np.log(xs.astype(np.float64))
    assert np.all(np.abs(got - want) <= 2 * np.spacing(np.float32(np.abs(want))).astype(np.float64) + 1e-45)
    assert det_log(0.0) == -np.inf and det_log(1e-40) == -np.inf and det_log(1.0) == 0.0
    assert np.isnan(det_log(float("nan")))


def test_joint_torch_reference_warps_rows_one_at_a_time(warp_calls):
    run_joint("torch", joint_case(2, 4, 19, 6, ragged=False), 0.0, "mjsd")
    assert set(warp_calls) == {(1, 19)} and len(warp_calls) == 2 * (4 + 1)  # 4 tested rows + the bonus row


def test_joint_padding_past_num_nodes_is_not_checked(backend):
    c = joint_case(2, 4, 9, 8, ragged=False)
    c["num_nodes"] = torch.tensor([3, 5], dtype=I32)
    c["draft_tokens"][0, 2:] = -7  # padding of the 3-node chain
    c["draft_joint_logprobs"][0, 2:] = float("nan")
    c["target_logits"][0, 3:] = float("nan")
    assert_same(run_joint(backend, c, 0.2, "mjsd"), run_joint("torch", c, 0.2, "mjsd"), I32)


@needs_cpp
def test_joint_check_false_does_not_sync(monkeypatch):
    c = joint_case(2, 4, 9, 9)
    for name in ("item", "tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, lambda *a: pytest.fail("host sync"))
    monkeypatch.setattr(verify_logits, "raise_flags", lambda *a: pytest.fail("value checks"))
    run_joint("cpp", c, 0.3, (1.0, 4, 1.0, None, 0, 1.0), check=False)


@needs_cpp
def test_joint_opcheck():
    for B, g, V, seed, dtype in ((3, 4, 17, 11, torch.float32), (3, 4, 17, 11, torch.bfloat16),
                                 (2, 0, 5, 12, torch.float32)):
        c = joint_case(B, g, V, seed, dtype=dtype)
        warp = kernel_warp(B * (g + 1))
        torch.library.opcheck(torch.ops.specops.verify_joint_logits.default,
                              (c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"],
                               torch.log(torch.full((B,), 0.3)), c["uniforms"], *warp, *warp, c["num_nodes"]))


@needs_cpp
def test_joint_torch_compile_fullgraph():
    c = joint_case(3, 4, 17, 13)

    def step(tok, x, lq, u, n):
        return specops.verify_joint_logits(tok, x, lq, 0.2, u, temperature=1.0, top_k=5, top_p=0.9, num_nodes=n,
                                           check=False, backend="cpp")

    args = (c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], c["uniforms"], c["num_nodes"])
    assert_same(torch.compile(step, fullgraph=True)(*args), step(*args), I32)
