"""Adaptive speculation (docs/methods.md §Adaptive speculation): the controller's rule without a
model (acceptance histories and fixed costs in, budgets out), then the loop: every method stays
lossless whatever the budgets (greedy token identity under the real controller and under forced
budget schedules with AR steps in between, the draft caches catching up; sampling keeps the target's
distribution), ``adaptive=False`` is the fixed-budget loop, and the metrics report the budgets."""
import argparse
import itertools
import math
from types import SimpleNamespace

import pytest
import test_decoding_sampling as ts
import torch
from test_decoding import N_NEW

from specops.cli import _adaptive_flag, main
from specops.decoding import AdaptiveConfig, generate, methods
from specops.decoding.adaptive import Controller, CostModel, expected_tokens, resolve
from specops.decoding.methods.ngram import longest_matches
from specops.engine import Stager
from specops.ops.linear import machine_layout
from specops.testing import reference_greedy

pytestmark = pytest.mark.usefixtures("one_thread")


def fixed(target_per_token=0.0, draft_per_level=0.0, **kw):
    """Costs in units of a 1-token target step (``kw``: the other settings)."""
    return AdaptiveConfig(target_cost=lambda T: 1.0 + target_per_token * (T - 1),
                          draft_cost=lambda g: draft_per_level * g, **kw)


def step(ctl, g, accepted, depth=None, T=None):
    """Feeds one step's outcome (one sequence per entry of ``accepted``)."""
    depth = [g] * len(accepted) if depth is None else depth
    ctl.observe(g, depth, accepted, T if T is not None else g + 1, t_target=1.0, t_draft=0.0)


# ---- the rule -----------------------------------------------------------------------------------

def test_expected_tokens_is_the_geometric_sum():
    for alpha in (0.0, 0.3, 0.9):
        for g in range(6):
            assert expected_tokens(alpha, g) == pytest.approx(sum(alpha ** j for j in range(g + 1)))
    assert expected_tokens(1.0, 5) == 6.0 and expected_tokens(0.7, 0) == 1.0


def test_the_estimate_is_censored_geometric_with_decay():
    cfg = AdaptiveConfig(decay=0.5, alpha0=0.6, prior_levels=2.0)
    ctl = Controller(cfg, 1, 4, 1, 16)
    assert ctl.alpha(0) == pytest.approx(0.6)
    step(ctl, 4, [4])  # fully accepted: 4 successes, no failure (the 5th level was never tried)
    assert ctl.alpha(0) == pytest.approx((4 + 1.2) / (4 + 2))
    step(ctl, 4, [1])  # one success, one failure; older evidence halves
    S, N = 0.5 * 4 + 1, 0.5 * 4 + 2
    assert ctl.alpha(0) == pytest.approx((S + 1.2) / (N + 2))
    step(ctl, 6, [3], depth=[2])  # a tree that reached depth 2 only: accepted is capped at it
    S, N = 0.5 * S + 2, 0.5 * N + 2
    assert ctl.alpha(0) == pytest.approx((S + 1.2) / (N + 2))


def test_budget_grows_after_full_accepts_within_the_cap():
    ctl = Controller(fixed(0.01, 0.05), 1, 4, 1, 16)
    assert ctl.decide([True]) == 2  # the first step is a probe: the configured budget, at most probe_budget
    g = 2
    for _ in range(6):
        step(ctl, g, [g])
        new = ctl.decide([True])
        assert g < new <= min(2 * g, 16) or new == g == 16
        g = new
    assert g == 16  # never above the range


def test_budget_falls_after_rejections_down_to_ar_steps():
    # draft levels cost 0.3 target steps: R(1) = (1 + alpha) / 1.3 < 1.05 once alpha < 0.365
    ctl = Controller(fixed(0.0, 0.3), 1, 6, 1, 16)
    g = ctl.decide([True])
    budgets = [g]
    while g and len(budgets) < 20:
        step(ctl, g, [0])
        g = ctl.decide([True])
        budgets.append(g)
    assert budgets[-1] == 0, budgets
    assert all(b2 <= b1 for b1, b2 in itertools.pairwise(budgets)), budgets
    assert ctl.alpha(0) < 0.365 and ctl.rate(1, [True]) * ctl.costs.step_cost(0) < 1.05


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_ar_threshold_is_one_ar_step_per_unit_of_cost_plus_the_margin(margin):
    # one level at cost 0.5: R(1) = (1 + alpha) / 1.5, so speculation pays iff alpha >= 0.5 + 1.5 margin
    edge = 0.5 + 1.5 * margin
    for alpha, want in ((edge - 0.03, 0), (edge + 0.03, 1)):
        ctl = Controller(fixed(0.0, 0.5, alpha0=alpha, prior_levels=1e9, margin=margin), 1, 1, 1, 1)
        step(ctl, 1, [0])
        assert ctl.decide([True]) == want
        r = ctl.rate(1, [True]) * ctl.costs.step_cost(0)
        assert r == pytest.approx((1 + alpha) / 1.5, rel=1e-6)


def test_probing_after_ar_steps_with_a_doubling_wait():
    # explore=10: a probe's extra cost (1.2 steps) asks for no longer wait than the doubling
    ctl = Controller(fixed(0.0, 0.6, probe_after=3, probe_max=12, explore=10.0), 1, 2, 1, 8)
    g = ctl.decide([True])
    while g:
        step(ctl, g, [0])
        g = ctl.decide([True])
    # entered AR: 3 AR steps in all, then a probe; failed probes double the wait (6, 12, 12)
    for wait in (3, 6, 12, 12):
        run = 1  # the decision just made was the first AR step of this stretch
        while True:
            step(ctl, 0, [0], T=1)
            g = ctl.decide([True])
            if g:
                break
            run += 1
        assert run == wait
        assert g <= 2  # probes are shallow (probe_budget)
        step(ctl, g, [0])  # the probe fails
        assert ctl.decide([True]) == 0
    # fully accepted probes raise the estimate until speculation pays again: the wait resets
    for _ in range(100):
        step(ctl, g, [g])  # g = 0: an AR step (T = 1)
        g = ctl.decide([True])
        if ctl.mode == "spec":
            break
    assert g >= 1 and ctl.mode == "spec" and ctl.wait == 3
    assert ctl.alpha(0) >= 0.6  # R(1) = (1 + alpha) / 1.6 >= 1


@pytest.mark.parametrize("explore, want", [(0.1, 12), (0.3, 4), (1.0, 2)])
def test_a_failed_probe_waits_until_its_extra_cost_is_the_explore_share(explore, want):
    # a probe at budget 2 costs 1 + 0.6 * 2 = 2.2 steps: 1.2 more than an AR step, which the next
    # ceil(1.2 / explore) AR steps must cover (at least double the last wait, at most probe_max);
    # budgets 2..8: the probes draft 2 levels
    ctl = Controller(fixed(0.0, 0.6, probe_after=1, probe_max=40, explore=explore), 1, 2, 2, 8)
    assert ctl.decide([True]) == 2
    step(ctl, 2, [0])  # the first step fails: one AR step (probe_after 1), then a probe that fails
    assert ctl.decide([True]) == 0
    step(ctl, 0, [0], T=1)
    assert ctl.decide([True]) == 2 and ctl.mode == "probe"
    step(ctl, 2, [0])
    assert ctl.decide([True]) == 0
    assert ctl.wait == want == max(2, math.ceil(1.2 / explore - 1e-9)) and ctl.explore_wait() == math.ceil(1.2 / explore - 1e-9)


def test_a_batch_shares_the_budget_with_the_most_expected_tokens_per_second():
    ctl = Controller(fixed(0.05, 0.1), 3, 4, 1, 8)
    ctl.decide([True] * 3)
    step(ctl, 4, [4, 0, 4])
    g = ctl.decide([True, True, True])
    rates = {h: ctl.rate(h, [True] * 3) for h in range(1, 9)}
    assert g == max(rates, key=rates.get)
    # an inactive sequence no longer counts: the two good ones alone want a longer block
    assert ctl.best([True, False, True])[0] >= ctl.best([True, True, True])[0]
    assert ctl.rate(3, [True, False, True]) == pytest.approx(
        (expected_tokens(ctl.alpha(0), 3) + expected_tokens(ctl.alpha(2), 3)) / ctl.costs.step_cost(3))


def test_a_step_without_proposals_counts_as_an_ar_step():
    ctl = Controller(AdaptiveConfig(), 1, 12, 1, 48)
    ctl.observe(12, [0], [0], 1, t_target=0.04, t_draft=0.001)  # an n-gram miss
    assert ctl.alpha(0) == pytest.approx(0.6) and ctl.costs.target.mean == {1: 0.04}
    assert ctl.costs.draft.mean == {}


def test_cost_fits():
    cm = CostModel(AdaptiveConfig(prior_slope=0.02, slope_weight=8.0))
    cm.observe(4, 5, t_target=1.08, t_draft=0.4)  # one size seen: the prior slope, draft per level
    assert cm.target_cost(1) == pytest.approx(1.0)
    assert cm.target_cost(9) == pytest.approx(1.16)
    assert cm.draft_cost(2) == pytest.approx(0.2) and cm.draft_cost(0) == 0.0
    assert cm.block_size(4) == 5 and cm.block_size(8) == pytest.approx(9.0)
    cm.observe(0, 1, t_target=1.0, t_draft=0.0)
    cm.observe(8, 9, t_target=1.4, t_draft=0.9)
    # the target: least squares over T = 1, 5, 9 (slope 0.05), shrunk toward the prior slope
    mk, mv = 5.0, (1.0 + 1.08 + 1.4) / 3
    cov, var = (-4) * (1.0 - mv) + 4 * (1.4 - mv), 32.0
    prior = 0.02 * mv / (1 + 0.02 * 4)
    slope = (cov + 8 * prior) / (var + 8)
    assert 0.02 < slope < 0.05
    line = lambda T: mv + slope * (T - mk)
    # the level: the pace of the latest steps (each step's time over its size's shape), weight 0.25 newest
    pace = 0.75 * 1.0 + 0.25 * 1.4 / (line(9) / line(1))
    for T in (1, 3, 17):
        assert cm.target_cost(T) == pytest.approx(pace * line(T) / line(1))
    assert cm.draft_cost(6) == pytest.approx(0.65)  # the draft: plain least squares (0.4 @ 4, 0.9 @ 8)
    cm.observe(8, 7, t_target=1.3, t_draft=0.9)  # the mean size budget 8 produced
    assert 7 < cm.block_size(8) < 9
    # two neighbouring sizes with a steep difference barely move the slope off the prior
    near = CostModel(AdaptiveConfig())
    near.observe(1, 2, t_target=1.0, t_draft=0.1)
    near.observe(2, 3, t_target=1.3, t_draft=0.2)
    assert near.target_cost(1) > 0.9


def test_a_drift_in_pace_moves_every_size():
    # one row timed in a slow stretch, then many two-row blocks in a fast one: the one-row cost follows
    # the blocks' pace instead of keeping its old mean (the sizes' fit gives only the ratio between them)
    cm = CostModel(AdaptiveConfig(prior_slope=0.02))
    cm.observe(0, 1, t_target=1.2, t_draft=0.0)
    for _ in range(20):
        cm.observe(1, 2, t_target=1.02, t_draft=0.1)
    assert cm.target.mean[1] == 1.2
    assert cm.target_cost(2) == pytest.approx(1.02, abs=2e-3)
    assert 1.0 < cm.target_cost(2) / cm.target_cost(1) < 1.02  # the prior slope, barely moved
    assert cm.target_cost(1) < 1.02


def test_config_and_argument_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="decay"):
        AdaptiveConfig(decay=1.5)
    with pytest.raises(ValueError, match="probe_max"):
        AdaptiveConfig(probe_after=8, probe_max=4)
    with pytest.raises(TypeError, match="target_cost"):
        AdaptiveConfig(target_cost=3.0)
    with pytest.raises(TypeError, match="adaptive must be"):
        resolve("yes")
    assert resolve(False) is None and isinstance(resolve(True), AdaptiveConfig)
    with pytest.raises(ValueError, match="min_budget 9 > max_budget 4"):
        methods.make("sd").enable_adaptive(AdaptiveConfig(min_budget=9, max_budget=4))


def test_each_drafter_exposes_one_depth_knob_and_sizes_caches_for_its_cap():
    knobs = {"sd": "gamma", "specinfer": "gamma", "tsd": "max_depth", "gsd": "max_depth",
             "opt-tree": "max_depth", "ouroboros": "gamma", "mjsd": "gamma", "ngram": "gamma"}
    for name, knob in knobs.items():
        fixed_budget, d = methods.make(name), methods.make(name)
        initial, lo, hi = d.enable_adaptive(AdaptiveConfig())
        assert d.budget_param == knob and initial == getattr(fixed_budget, knob) and lo == 1 and hi > initial
        assert getattr(d, knob) == hi and d.tree_budget() >= fixed_budget.tree_budget()
        assert d.draft_budget() >= fixed_budget.draft_budget()
    assert methods.make("ar").enable_adaptive(AdaptiveConfig()) is None
    assert methods.make("ngram").enable_adaptive(AdaptiveConfig())[2] == 48  # max_gamma


def test_shallow_steps_verify_small_trees():
    # A shallow step (a probe) of a wide drafter must cost little: OPT-Tree keeps 2 nodes per layer
    # plus one, Ouroboros gamma guesses and gamma - 1 phrase branches; fixed budgets keep the widths.
    tree, ouro = methods.make("opt-tree"), methods.make("ouroboros")
    assert tree.nodes() == tree.n and ouro.widths() == (ouro.guesses, ouro.branches)
    tree.enable_adaptive(AdaptiveConfig())
    ouro.enable_adaptive(AdaptiveConfig())
    for g, nodes, widths in [(1, 3, (1, 0)), (2, 5, (2, 1)), (8, tree.n, (ouro.guesses, ouro.branches))]:
        tree.set_budget(g)
        ouro.set_budget(g)
        assert (tree.nodes(), ouro.widths()) == (nodes, widths)


# ---- the loop -----------------------------------------------------------------------------------

LOSSLESS = {
    "sd": {}, "sd-exit": {"method": "sd", "exit_threshold": 0.3}, "specinfer": {},
    "specinfer-ngram": {"method": "specinfer", "num_drafts": 2, "ngram": True}, "tsd": {},
    "gsd-merging": {"method": "gsd", "tau": 1, "theta_prob": 0.05, "theta_sib": 0.05}, "opt-tree": {},
    "ouroboros": {}, "ouroboros-model-free": {"method": "ouroboros", "model_free": True}, "ngram": {},
}


def _generate(pair, case, **kw):
    target, draft, prompts, _ = pair
    params = {**LOSSLESS[case], **kw}
    return generate(target, prompts, draft=draft, method=params.pop("method", case), max_new_tokens=N_NEW,
                    eos_token_id=[], record_steps=True, **params)


@pytest.fixture
def schedule(monkeypatch):
    """Forces the controller's decisions: a cycle of budgets (0 = AR step), clipped to its range."""
    def use(budgets):
        it = itertools.cycle(budgets)

        def decide(self, active):
            return 0 if not any(active) else min(max(next(it), 0), self.hi)
        monkeypatch.setattr(Controller, "decide", decide)
    return use


@pytest.mark.parametrize("case", list(LOSSLESS))
def test_greedy_stays_token_identical_under_forced_budgets_and_ar_steps(llama_pair, schedule, case):
    *_, refs = llama_pair
    schedule([0, 3, 1, 0, 0, 5, 2, 7, 0, 4])
    out, m = _generate(llama_pair, case)
    assert out.tolist() == [r[:N_NEW] for r in refs]
    budgets = [s["budget"] for s in m.steps]
    assert 0 in budgets and len(set(budgets) - {0}) >= 3
    assert m.num_ar_steps == budgets.count(0) and m.adaptive
    spec = [b for b in budgets if b]
    assert m.num_budget_steps == len(spec) and m.mean_budget == pytest.approx(sum(spec) / len(spec))
    assert m.ar_step_fraction == pytest.approx(m.num_ar_steps / m.num_target_forwards)
    d = m.as_dict()
    assert d["mean_budget"] == m.mean_budget and d["ar_step_fraction"] == m.ar_step_fraction
    assert "adaptive: mean budget" in m.summary()
    # an AR step is the root alone: no draft node reaches the target
    assert all(s["nodes"] == [1, 1, 1] for s in m.steps if s["budget"] == 0)


@pytest.mark.parametrize("case", list(LOSSLESS))
@pytest.mark.parametrize("costs", ["cheap-draft", "dear-draft"])
def test_greedy_stays_token_identical_under_the_controller(llama_pair, case, costs):
    *_, refs = llama_pair
    cfg = fixed(0.01, 0.02) if costs == "cheap-draft" else fixed(0.01, 0.6)
    out, m = _generate(llama_pair, case, adaptive=cfg)
    assert out.tolist() == [r[:N_NEW] for r in refs]
    if costs == "dear-draft" and case in ("sd", "specinfer"):
        assert m.num_ar_steps > 0  # a draft level costing 0.6 target steps rarely pays here


def test_ar_steps_run_no_draft_forward(llama_pair, schedule):
    schedule([0])
    _, m = _generate(llama_pair, "sd")
    assert m.num_draft_forwards == 0 and m.num_ar_steps == m.num_target_forwards
    schedule([0, 0, 0, 2])
    _, m2 = _generate(llama_pair, "sd")
    drafted = sum(1 for s in m2.steps if s["budget"])
    assert m2.num_draft_forwards == 2 * drafted  # gamma = 2: two forwards per drafted step, none else


def test_the_feature_draft_catches_up_after_ar_steps(schedule):
    from test_distill import fresh_draft, tiny_target

    target = tiny_target(seed=3)
    d = fresh_draft(target, arch="feature", seed=4).eval()
    prompts = [[5, 9, 33, 4, 71, 12], [8, 100, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    with torch.no_grad():
        ref, _ = generate(target, prompts, method="ar", max_new_tokens=14, eos_token_id=[])
        schedule([2, 0, 0, 3, 0, 1])
        for method in ("sd", "tsd", "opt-tree", "specinfer", "ouroboros"):
            out, m = generate(target, prompts, draft=d, method=method, max_new_tokens=14, eos_token_id=[])
            assert torch.equal(out, ref), method
            assert m.num_ar_steps > 0 and m.num_draft_forwards > 0


def test_adaptive_false_is_the_fixed_budget_loop(llama_pair):
    _, m = _generate(llama_pair, "sd", adaptive=False)
    assert not m.adaptive and m.num_ar_steps == 0 and m.mean_budget is None
    assert all(s["budget"] is None for s in m.steps)
    assert all(n == 5 for s in m.steps for n, a in zip(s["nodes"], s["active"]) if a)  # gamma 4, always
    _, m = _generate(llama_pair, "ngram", adaptive=False, gamma=2, max_gamma=8)
    assert max(n for s in m.steps for n in s["nodes"]) > 3  # its own doubling rule, not the controller


def test_a_free_draft_grows_the_budget_to_the_cap(llama_pair):
    _, m = _generate(llama_pair, "sd", adaptive=fixed(0.0, 0.0), exit_threshold=0.0)
    budgets = [s["budget"] for s in m.steps]
    assert budgets[0] == 2 and max(budgets) > 4 and m.num_ar_steps == 0  # a probe first (probe_budget 2)
    assert m.mean_budget == pytest.approx(sum(budgets) / len(budgets))


# ---- sampling: the target's distribution, whatever the budgets ------------------------------------

sampling_models = ts.models  # the fixed-budget distribution test's target and draft


def _chi_square(models, method, params, cfg_name):
    cfg = ts.CONFIGS[cfg_name]
    out, m = ts.sample(models, method, cfg, {**params, "record_steps": True})
    return ts.chi_square_pvalue(ts.empirical(out), ts.exact_joint(models[0], cfg)), m


SAMPLED = ts.LOSSLESS  # the same methods and parameters as the fixed-budget distribution test
ALPHA = 1e-3 / (2 * len(SAMPLED) + 1)


@pytest.mark.parametrize("method, params", SAMPLED, ids=[f"{m}-{i}" for i, (m, _) in enumerate(SAMPLED)])
@pytest.mark.parametrize("budgets", [[0, 2], [1, 0]], ids=["ar-then-draft", "draft-then-ar"])
def test_sampling_keeps_the_target_distribution_with_ar_steps_between_drafts(sampling_models, method, params,
                                                                             budgets, schedule):
    # 3 tokens: the first from prefill, the other two from a step of each kind in either order (an
    # AR step, then a draft whose cache caught up; or a draft, then an AR step when it was rejected)
    schedule(budgets)
    p, m = _chi_square(sampling_models, method, params, "t1")
    assert [s["budget"] for s in m.steps[:2]] == budgets
    assert p > ALPHA, f"{method}: chi-square p = {p:.2e}"


def test_sampling_keeps_the_target_distribution_under_the_real_controller(sampling_models):
    # The second step's budget comes from the first step's acceptance (and fixed costs), the step
    # after the prefill token: a lossless rule per step stays lossless overall.
    p, m = _chi_square(sampling_models, "sd", {"gamma": 2, "adaptive": fixed(0.0, 0.01)}, "warped")
    assert m.steps[0]["budget"] == 2 and m.steps[1]["budget"] != 2
    assert p > ALPHA, f"chi-square p = {p:.2e}"


def test_cli_turns_adaptive_off_by_flag_or_parameter(capsys):
    ns = argparse.Namespace(no_adaptive=False)
    params = {"gamma": 3, "adaptive": False}
    assert _adaptive_flag(ns, params) is False and params == {"gamma": 3}  # not a method parameter
    assert _adaptive_flag(ns, {}) is True
    assert _adaptive_flag(argparse.Namespace(no_adaptive=True), {"adaptive": True}) is False
    assert main(["generate", "--prompt", "x", "--param", "adaptive=maybe"]) == 2  # before any model loads
    assert "--param adaptive takes true or false, got 'maybe'" in capsys.readouterr().err


# ---- n-gram under adaptive speculation: proposals sized by their match ------------------------------

def test_longest_matches_ranks_by_match_length_then_full_then_recency():
    seq = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" (3 tokens) at 0 beats the more recent "9 2 3" (2 tokens): unlike lookup's recency
    assert longest_matches(seq, 1, 32, 2, 2) == [([4, 5], 3), ([7, 8], 2)]
    assert longest_matches(seq, 3, 32, 2, 2) == [([4, 5], 3)]  # min_ngram: at least 3 matched
    assert longest_matches(seq, 1, 2, 2, 2) == [([7, 8], 2), ([4, 5], 2)]  # capped: a tie, most recent
    assert longest_matches([5, 6, 7], 1, 32, 4, 1) == [] and longest_matches([5], 1, 32, 4, 1) == []
    # equal matches: a full-length continuation before a recent one cut short by the end of the text
    assert longest_matches([1, 2, 1, 2, 1], 1, 1, 3, 2) == [([2, 1, 2], 1), ([2, 1], 1)]


def test_adaptive_ngram_sizes_each_proposal_by_its_match():
    d = methods.make("ngram")
    d.enable_adaptive(AdaptiveConfig())
    d.set_budget(12)
    copy = list(range(100, 140))

    def proposed(text):
        state = SimpleNamespace(batch=1, seqs=[list(text)], active=[True], was_active=[True],
                                stager=Stager("cpu"), grammar=None)
        d.setup(state)
        return int(d.propose(state).num_nodes[0]) - 1

    assert proposed(copy + [7, 100]) == 1  # a 1-token match: one token
    assert proposed(copy + [7, 100, 101]) == 1  # 2 tokens: still one
    assert proposed(copy + [7, 100, 101, 102]) == 6  # 3 tokens: 2 per matched token
    assert proposed(copy + [7] + copy[:20]) == 12  # a long match: the budget caps it
    d.set_budget(48)
    assert proposed(copy + [7] + copy[:10]) == 20 and proposed([1, 2, 3, 4]) == 0


def test_adaptive_ngram_is_lossless_on_copied_text(llama_pair):
    target = llama_pair[0]
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(3, 60, (18,), generator=gen).tolist()
    prompts = [base + base[:5], base[:9] + base + base[:2]]  # long matches: long proposals
    refs = [reference_greedy(target, p, 24) for p in prompts]
    for branches in (1, 2):
        out, m = generate(target, prompts, method="ngram", branches=branches, max_new_tokens=24, eos_token_id=[],
                          record_steps=True)
        assert [out[b].tolist() for b in range(2)] == refs
        assert max(n for s in m.steps for n in s["nodes"]) > 3


def test_the_prior_slope_follows_the_machines_linear_kernel(monkeypatch):
    # AMX tiles (bf16): a block costs little more than one row, so a smaller prior per row
    want = 0.025 if machine_layout() == "amx" else 0.07
    assert AdaptiveConfig().prior_slope == want and AdaptiveConfig(prior_slope=0.1).prior_slope == 0.1
    monkeypatch.setenv("SPECOPS_CPU_ISA", "avx512")  # the lane order everywhere
    assert AdaptiveConfig().prior_slope == 0.07
    with pytest.raises(ValueError, match="prior_slope must be a number >= 0.0, got -1"):
        AdaptiveConfig(prior_slope=-1)
