"""Sampling: the lossless modes keep the target's warped distribution.

A V = 8 target, a draft that often disagrees, one prompt over a batch of rows, each an independent
run (its own draft, tree and uniforms). The empirical joint of the first three tokens (one from
prefill, two from speculative verification) meets the target's exact warped joint in a chi-square
test, Bonferroni-corrected over this file. Negative control: the same test rejects MJSD with tau = 0
(the draft's beam accepted unconditionally); GSD's reference rule R5 has its deviation measured.
"""
import pytest
import torch

from specops.decoding import SamplingConfig, generate
from specops.testing import perturbed_copy, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread", "kernel_checks")

V = 8
ROWS = 1500
PROMPT = [3, 1, 4, 1, 5]
ALPHA = 1e-3 / 14  # family-wise over this file's chi-square tests


@pytest.fixture(scope="module")
def models():
    target = tiny_causal_lm("llama", vocab_size=V, hidden_size=32, seed=11, sharpness=3.0)
    return target, perturbed_copy(target, 0.6, seed=12)


def exact_joint(target, cfg):
    """P(t1, t2, t3) under the target's warped distribution. Shape: -> [V, V, V]."""
    warp = cfg.warp
    with torch.no_grad():
        p1 = warp(target(torch.tensor([PROMPT])).logits[0, -1:])[0]  # [V]
        ids2 = torch.tensor([PROMPT + [a] for a in range(V)])
        p2 = warp(target(ids2).logits[:, -1])  # [V, V]
        ids3 = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = warp(target(ids3).logits[:, -1]).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def empirical(out):
    """How often each (t1, t2, t3) starts a row. Shape: -> [V, V, V]."""
    return torch.zeros(V, V, V).index_put_(tuple(out[:, :3].T), torch.ones(len(out)), accumulate=True)


def chi_square_pvalue(counts, probs, min_expected=5.0):
    """Pearson chi-square with cells of expected count < ``min_expected`` pooled into one."""
    exp, obs = probs.flatten() * counts.sum(), counts.flatten()
    assert float(obs[exp == 0].sum()) == 0, "a token of zero target probability was emitted"
    big = exp >= min_expected
    e, o = (torch.cat([x[big], x[~big].sum()[None]]) for x in (exp, obs))
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


CONFIGS = {"t1": SamplingConfig(1.0, 0, 1.0), "warped": SamplingConfig(0.8, 5, 0.9)}

LOSSLESS = [
    ("sd", {"gamma": 3}),
    ("specinfer", {"num_drafts": 3, "gamma": 2}),
    ("specinfer", {"num_drafts": 2, "gamma": 2, "ngram": True}),
    ("tsd", {"k": 3, "theta_prob": 0.05, "theta_sib": 0.05, "max_depth": 2}),
    ("gsd", {"k": 3, "theta_prob": 0.05, "theta_sib": 0.05, "max_depth": 2, "tau": 0, "verify": "mss_pointmass"}),
    ("opt-tree", {"n": 6, "delta": 0.0, "max_depth": 2}),
    ("ouroboros", {"gamma": 2, "window": 2, "ngram": 3, "guesses": 2, "branches": 2, "reuse_pool": False}),
    ("ngram", {"gamma": 3, "branches": 2, "min_ngram": 1}),
    ("ouroboros", {"gamma": 2, "ngram": 3, "branches": 2, "reuse_pool": False, "model_free": True}),
]


def sample(models, method, cfg, params):
    target, draft = models
    return generate(target, [PROMPT] * ROWS, draft=draft, method=method, max_new_tokens=3, eos_token_id=[],
                    temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=0, **params)


# Every drafter at temperature 1; under temperature + top-k + top-p, one drafter per rule (R2/R3 with
# draft rows, R3 mixing a point-mass proposer, R3p, R4 on a tree, R4 on Ouroboros' comb).
CASES = [(m, p, "t1") for m, p in LOSSLESS] + [(m, p, "warped") for m, p in (LOSSLESS[i] for i in (0, 2, 4, 5, 6))]


@pytest.mark.parametrize("method, params, cfg_name", CASES,
                         ids=[f"{m}-{LOSSLESS.index((m, p))}-{c}" for m, p, c in CASES])
def test_lossless_modes_keep_the_warped_target_distribution(models, method, params, cfg_name):
    cfg = CONFIGS[cfg_name]
    out, m = sample(models, method, cfg, params)
    if method != "ngram":
        assert m.num_draft_tokens > 0 and 0 < m.draft_acceptance_rate < 1  # rejections happened
    p = chi_square_pvalue(empirical(out), exact_joint(models[0], cfg))
    assert p > ALPHA, f"{method} {params}: chi-square p = {p:.2e}"


def test_the_chi_square_test_rejects_a_lossy_method(models):
    # MJSD with tau = 0 emits the draft's beam unconditionally: its output follows the draft.
    cfg = CONFIGS["t1"]
    out, _ = sample(models, "mjsd", cfg, {"tau": 0.0, "gamma": 2, "beams": 2})
    assert chi_square_pvalue(empirical(out), exact_joint(models[0], cfg)) < 1e-6


def test_gsd_reference_rule_deviation_is_measured(models):
    # R5 (an independent min(1, p/q) coin per edge, longest passing path, bonus without residual) is
    # GSD's reference rule. On top-k children (deterministic, not drawn from q) nearly every edge
    # passes, so the output follows the draft tree: the 3-token joint's total-variation distance is
    # about 0.9, against the noise floor of about 0.2 that lossless R3p reaches on the same trees.
    cfg = CONFIGS["t1"]
    exact = exact_joint(models[0], cfg)
    # adaptive=False: max_depth 3 from the first step (the controller's first step is a shallow probe)
    params = {"k": 3, "theta_prob": 0.05, "theta_sib": 0.05, "max_depth": 3, "tau": 0, "verify": "gsd",
              "adaptive": False}
    out, m = sample(models, "gsd", cfg, params)
    counts = empirical(out)
    assert 0.5 * float((counts / ROWS - exact).abs().sum()) > 0.5  # total variation
    assert chi_square_pvalue(counts, exact) < 1e-6
    assert m.mean_acceptance_length > 3.5  # nearly every tree fully accepted
