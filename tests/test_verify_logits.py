"""verify_tree_logits: bit-identical to verify_tree on warp_probs' rows (the two-op composition) on
every backend, for every mode, over a grid of odd vocabularies, ragged and padded trees, dtypes,
scalar and per-row warping parameters, and the edge cases of the warping rule (ties at the top-k
and top-p boundaries, -inf logits, a top-p set of one token, greedy rows, V past 2**23)."""
import zlib

import pytest
import torch
from _cudasim import assert_order_independent, needs_sim
from _op_checks import assert_same, needs_cpp

import specops
from specops.ops.verify import MODES, NEEDS_DRAFT
from specops.testing import random_verify_case

I32 = torch.int32
SLOW = ("triton",)  # interpreted on CPU here: seconds per top-p row


def composition(backend, c, mode, X, Y, t, k, p, dt=None, dk=0, dp=1.0):
    """verify_tree(warp_probs(target), draft_probs=warp_probs(draft)) with [B] parameters repeated per row."""
    B, T, V = X.shape

    def warp(Z, *params):
        params = [v.repeat_interleave(T) if isinstance(v, torch.Tensor) else v for v in params]
        return specops.warp_probs(Z.reshape(B * T, V), *params, backend=backend).view(B, T, V)

    Q = warp(Y, t if dt is None else dt, dk, dp) if mode in NEEDS_DRAFT else None
    return specops.verify_tree(c["tokens"], c["parents"], warp(X, t, k, p), c["uniforms"], draft_probs=Q,
                               mode=mode, num_nodes=c["num_nodes"], backend=backend)


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


def check(backend, c, mode, X, Y, *params, **kw):
    want = composition(backend, c, mode, X, Y, *params, **kw)
    got = fused(backend, c, mode, X, Y, *params, **kw)
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
    t = torch.tensor([0.7, 0.0, 1.5, 1.0], device=device)
    k = torch.tensor([0, 4, 9, 60], dtype=I32, device=device)
    p = torch.tensor([0.9, 1.0, 0.6, 0.3], device=device)
    dt = torch.tensor([1.0, 0.5, 0.0, 2.0], device=device)
    dk = torch.tensor([3, 0, 0, 1], dtype=torch.int64, device=device)
    check(backend, c, mode, X, Y, t, k, p, dt=dt, dk=dk, dp=torch.tensor([1.0, 0.7, 0.9, 0.99], device=device))


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
    """The unfused meaning of a masked_case: both logits tensors masked first (the draft's by its
    parents' rows)."""
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


def test_torch_reference_never_builds_an_n_by_v_tensor(monkeypatch):
    # The reference warps only the rows its walk reads: a chain rejected at the root reads one.
    from specops.ops.verify import logits as verify_logits

    c, X, Y = case(1, 8, 19, 18, chain=True)
    calls = []
    real = verify_logits.warp_probs_torch
    monkeypatch.setattr(verify_logits, "warp_probs_torch", lambda x, *a: calls.append(x.shape) or real(x, *a))
    c["tokens"][0, 1:] = int(X[0, 0].argmin())  # a token top-k 1 removes: rejected at once
    fused("torch", c, "sample_match", X, Y, 1.0, 1, 1.0)
    assert calls == [(1, 19)]


@needs_cpp
def test_opcheck():
    c, X, Y = case(2, 5, 17, 19)
    t, k, p = torch.full((10,), 0.8), torch.full((10,), 3, dtype=I32), torch.full((10,), 0.9)  # [B * T]
    for mode in MODES:
        torch.library.opcheck(torch.ops.specops.verify_tree_logits.default,
                              (c["tokens"], c["parents"], X.bfloat16(), c["uniforms"], t, k, p, Y, t, k, p,
                               c["num_nodes"], mode))
    c, X, Y, mask, _ = masked_case(2, 5, 17, 19)
    torch.library.opcheck(torch.ops.specops.verify_tree_logits.default,
                          (c["tokens"], c["parents"], X, c["uniforms"], t, k, p, Y, t, k, p, c["num_nodes"], "mss",
                           mask))
