"""verify_joint_logits (R6 from logits): the torch reference is verify_joint's test on det_log of
warp_probs' rows, with verify_tree's bonus draw from the bonus warp; cpp, cudasim (the CUDA
kernels), cuda and triton equal it bit for bit over odd vocabularies and chain lengths, ragged
chains, scalar and per-row warps, greedy rows, bf16 / fp16 logits and every tau; the schema passes
opcheck. Bad input: the battery of tests/test_bad_input.py."""
import numpy as np
import pytest
import torch
from _op_checks import assert_same, needs_cpp

import specops
from specops.ops.verify import logits as verify_logits
from specops.ops.verify import ref as verify_ref
from specops.ops.verify.ref import det_log

I32 = torch.int32

# (temperature, top_k, top_p, bonus_temperature, bonus_top_k, bonus_top_p); MJSD's own: 1, 20, 0.9.
SETTINGS = {
    "mjsd": (1.0, 20, 0.9, 0.8, 0, 1.0),
    "plain": (0.7, 0, 1.0, None, 0, 1.0),
    "topk-topp": (1.3, 5, 0.6, 1.0, 3, 0.9),
    "greedy-test": (0.0, 0, 1.0, 1.0, 0, 1.0),
    "greedy-bonus": (1.0, 4, 0.95, 0.0, 0, 1.0),
}
TAUS = (0.0, 0.05, 0.3, 1.0)


def case(B, g, V, seed, *, device="cpu", dtype=torch.float32, ragged=True):
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


def run(backend, c, tau, setting, **kw):
    t, k, p, bt, bk, bp = SETTINGS[setting] if isinstance(setting, str) else setting
    return specops.verify_joint_logits(c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], tau,
                                       c["uniforms"], temperature=t, top_k=k, top_p=p, bonus_temperature=bt,
                                       bonus_top_k=bk, bonus_top_p=bp, num_nodes=c["num_nodes"], backend=backend,
                                       **kw)


def _cpu(v):
    return v.cpu() if isinstance(v, torch.Tensor) else v


def check(backend, c, setting, taus=TAUS):
    """``backend`` on the case ``c`` equals the torch reference on CPU copies, for every tau."""
    setting = SETTINGS[setting] if isinstance(setting, str) else setting
    cpu_c, cpu_setting = {k: v.cpu() for k, v in c.items()}, [_cpu(v) for v in setting]
    for tau in taus:
        assert_same(run(backend, c, tau, setting), run("torch", cpu_c, _cpu(tau), cpu_setting), I32)


GRID = [(3, 4, 7), (2, 1, 33), (4, 6, 301), (1, 9, 1000), (2, 0, 5)]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_equals_the_reference(fast_backend, device, setting):
    grid = GRID if fast_backend != "triton" else [(3, 4, 7), (2, 5, 33), (1, 3, 301)]  # interpreted here
    for i, (B, g, V) in enumerate(grid):
        check(fast_backend, case(B, g, V, 10 + i, device=device), setting)


def test_per_row_parameters_and_tau(fast_backend, device):
    c = case(4, 5, 50, 3, device=device)
    t = torch.tensor([0.7, 0.0, 1.5, 1.0], device=device)
    k = torch.tensor([0, 4, 9, 60], dtype=I32, device=device)
    p = torch.tensor([0.9, 1.0, 0.6, 0.3], device=device)
    bt = torch.tensor([1.0, 0.5, 0.0, 2.0], device=device)
    bk = torch.tensor([3, 0, 0, 1], dtype=torch.int64, device=device)
    bp = torch.tensor([1.0, 0.7, 0.9, 0.99], device=device)
    check(fast_backend, c, (t, k, p, bt, bk, bp), taus=[torch.tensor([0.0, 0.2, 0.6, 1.0], device=device)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits(fast_backend, device, dtype):
    check(fast_backend, case(3, 4, 129, 4, device=device, dtype=dtype), "mjsd")


def test_ties_and_minus_inf_logits(fast_backend, device):
    c = case(3, 5, 41, 5)
    X = torch.round(c["target_logits"] / 2).clamp(-3, 3)  # many ties at the top-k / top-p boundaries
    X = X.masked_fill(torch.rand(X.shape, generator=torch.Generator().manual_seed(1)) < 0.3, float("-inf"))
    X[..., 0] = 0.0  # every row keeps a finite logit
    c["target_logits"] = X
    for setting in ((1.0, 5, 1.0, 1.0, 0, 1e-6), (1.0, 0, 0.6, 1.0, 3, 0.5), (1.0, 8, 0.97, 1.0, 8, 0.97)):
        check(fast_backend, {k: v.to(device) for k, v in c.items()}, setting)


def test_reference_is_the_composition():
    # The spec in plain terms: verify_joint's test on det_log of warp_probs' rows (the chain cut at
    # num_nodes), the bonus drawn from warp_probs of row eta with the bonus warp.
    for seed, setting in enumerate(SETTINGS):
        c = case(3, 5, 23, 20 + seed)
        t, k, p, bt, bk, bp = SETTINGS[setting]
        B, T, V = c["target_logits"].shape
        S = verify_ref.fix_shift(V)
        P, Pb = (specops.warp_probs(c["target_logits"].view(B * T, V), *warp, backend="torch").view(B, T, V)
                 for warp in ((t, k, p), (t if bt is None else bt, bk, bp)))
        L = torch.tensor(np.vectorize(det_log, otypes=[np.float32])(P.numpy()))
        for tau in TAUS:
            idx, lens, bonus = run("torch", c, tau, setting)
            for b in range(B):
                n = int(c["num_nodes"][b])
                one = specops.verify_joint(c["draft_tokens"][b:b + 1, :n - 1].contiguous(), L[b:b + 1, :n].contiguous(),
                                           c["draft_joint_logprobs"][b:b + 1, :n - 1].contiguous(), tau,
                                           c["uniforms"][b:b + 1], backend="torch", check=False)
                assert int(lens[b]) == int(one[1][0]) and idx[b, :n].tolist() == one[0][0].tolist()
                weights = verify_ref.fix_weights(Pb[b, int(lens[b]) - 1], S)  # the bonus row: eta
                assert int(bonus[b]) == verify_ref.sample_weights(weights, c["uniforms"][b])


def test_outcomes_vary_and_tau_ends():
    # tau = 0 accepts every tested draft, tau = 1 none; in between the prefixes vary.
    seen = set()
    for seed in range(8):
        c = case(3, 6, 30, 40 + seed)
        n = c["num_nodes"]
        assert run("torch", c, 0.0, "mjsd")[1].tolist() == n.tolist()
        assert run("torch", c, 1.0, "mjsd")[1].tolist() == [1] * 3
        seen.update(run("torch", c, 0.05, "plain")[1].tolist())
    assert len(seen) > 2


def test_det_log_is_within_an_ulp_of_log():
    xs = np.float32(np.concatenate([np.logspace(-37.9, 0, 5000), [1.0, 0.5, 2.0**-126, 0.999999, 1e-3]]))
    got = np.array([det_log(x) for x in xs], dtype=np.float64)
    want = np.log(xs.astype(np.float64))
    assert np.all(np.abs(got - want) <= 2 * np.spacing(np.float32(np.abs(want))).astype(np.float64) + 1e-45)
    assert det_log(0.0) == -np.inf and det_log(1e-40) == -np.inf and det_log(1.0) == 0.0
    assert np.isnan(det_log(float("nan")))


def test_torch_reference_warps_rows_one_at_a_time(monkeypatch):
    calls = []
    real = verify_logits.warp_probs_torch
    monkeypatch.setattr(verify_logits, "warp_probs_torch", lambda x, *a: calls.append(x.shape) or real(x, *a))
    run("torch", case(2, 4, 19, 6, ragged=False), 0.0, "mjsd")
    assert calls and set(calls) == {(1, 19)} and len(calls) == 2 * (4 + 1)  # 4 tested rows + the bonus row


# ---- unchecked padding, check=False (bad input: the battery of tests/test_bad_input.py) -------------

def test_padding_past_num_nodes_is_not_checked(backend):
    c = case(2, 4, 9, 8, ragged=False)
    c["num_nodes"] = torch.tensor([3, 5], dtype=I32)
    c["draft_tokens"][0, 2:] = -7  # padding of the 3-node chain
    c["draft_joint_logprobs"][0, 2:] = float("nan")
    c["target_logits"][0, 3:] = float("nan")
    assert_same(run(backend, c, 0.2, "mjsd"), run("torch", c, 0.2, "mjsd"), I32)


@needs_cpp
def test_check_false_does_not_sync(monkeypatch):
    c = case(2, 4, 9, 9)
    monkeypatch.setattr(torch.Tensor, "item", lambda *a: pytest.fail("host sync"))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda *a: pytest.fail("host sync"))
    monkeypatch.setattr(torch.Tensor, "cpu", lambda *a: pytest.fail("host sync"))
    monkeypatch.setattr(verify_logits, "raise_flags", lambda *a: pytest.fail("value checks"))
    specops.verify_joint_logits(c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], 0.3, c["uniforms"],
                                temperature=1.0, top_k=4, num_nodes=c["num_nodes"], check=False, backend="cpp")


# ---- registration ------------------------------------------------------------------------------------

def _kernel_args(c, g):
    B = c["draft_tokens"].shape[0]
    N = B * (g + 1)
    t, k, p = torch.full((N,), 0.8), torch.full((N,), 3, dtype=I32), torch.full((N,), 0.9)
    return (c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], torch.log(torch.full((B,), 0.3)),
            c["uniforms"], t, k, p, t, k, p, c["num_nodes"])


@needs_cpp
def test_opcheck():
    for dtype in (torch.float32, torch.bfloat16):
        c = case(3, 4, 17, 11, dtype=dtype)
        torch.library.opcheck(torch.ops.specops.verify_joint_logits.default, _kernel_args(c, 4))
    c = case(2, 0, 5, 12)
    torch.library.opcheck(torch.ops.specops.verify_joint_logits.default, _kernel_args(c, 0))


@needs_cpp
def test_torch_compile_fullgraph():
    c = case(3, 4, 17, 13)

    def step(tok, x, lq, u, n):
        return specops.verify_joint_logits(tok, x, lq, 0.2, u, temperature=1.0, top_k=5, top_p=0.9, num_nodes=n,
                                           check=False, backend="cpp")

    args = (c["draft_tokens"], c["target_logits"], c["draft_joint_logprobs"], c["uniforms"], c["num_nodes"])
    assert_same(torch.compile(step, fullgraph=True)(*args), step(*args), I32)
