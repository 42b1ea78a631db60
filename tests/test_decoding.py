"""The decoding loop end to end on tiny random fp32 models: greedy token identity for every lossless
method (batch 1 and 3, ragged prompts, Llama and Qwen2), method invariants, stop conditions,
metrics, and bad input rejected before any work."""
from types import SimpleNamespace

import pytest
import torch

import specops
from specops.decoding import METHODS, generate
from specops.engine import ModelRunner
from specops.testing import perturbed_copy

# pair (tests/conftest.py): a Llama and a Qwen2 target, each with its draft, prompts and references
pytestmark = pytest.mark.usefixtures("one_thread", "kernel_checks")

N_NEW = 20


LOSSLESS = {  # grouped by method: its defaults, then its variants
    "ar": {},
    "sd": {}, "sd-exit": {"method": "sd", "gamma": 6, "exit_threshold": 0.3},
    "ngram": {}, "ngram-branches": {"method": "ngram", "branches": 3, "gamma": 5},
    "ngram-adaptive": {"method": "ngram", "gamma": 2, "max_gamma": 8},
    "specinfer": {}, "specinfer-ngram": {"method": "specinfer", "num_drafts": 2, "ngram": True},
    "tsd": {}, "gsd-no-merge": {"method": "gsd", "tau": None},
    "opt-tree": {}, "opt-tree-deep": {"method": "opt-tree", "n": 6, "delta": 0.0, "max_depth": 5},
    "ouroboros": {}, "ouroboros-no-window": {"method": "ouroboros", "window": 0, "gamma": 3, "branches": 2},
    "ouroboros-model-free": {"method": "ouroboros", "model_free": True, "draft": None},
}


def _run(target, draft, prompts, case, **kw):
    params = dict(LOSSLESS.get(case, {}))
    method, draft = params.pop("method", case), params.pop("draft", draft)
    # fixed budgets: the invariants below are about each method's own blocks (tests/test_adaptive.py
    # covers the adaptive controller; the identity test below runs both)
    params = {"eos_token_id": [], "adaptive": False, "max_new_tokens": N_NEW, **params, **kw}
    return generate(target, prompts, draft=draft, method=method, **params)


# ---- greedy: token-identical to plain greedy decoding ---------------------------------------------

LAYOUTS = [pytest.param({}, id="contiguous"),
           pytest.param({"kv_layout": "paged", "page_size": 4}, id="paged")]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("case", list(LOSSLESS))
def test_greedy_is_token_identical_to_greedy_decoding_batch3(pair, case, adaptive, layout):
    target, draft, prompts, refs = pair
    out, m = _run(target, draft, prompts, case, adaptive=adaptive, **layout)
    assert out.dtype == torch.int64 and out.tolist() == [r[:N_NEW] for r in refs]
    assert m.lengths == [N_NEW] * 3 and m.finish_reasons == ["length"] * 3
    if case != "ar":
        assert m.num_target_forwards <= N_NEW
    if case in ("sd", "tsd", "opt-tree") and not adaptive:
        # Guards against a silently degenerate setup where every method falls back to AR.
        assert m.mean_acceptance_length > 1.5, case


@pytest.mark.parametrize("case", ["sd", "specinfer", "tsd", "gsd-no-merge", "opt-tree", "ouroboros", "ngram"])
def test_greedy_is_token_identical_batch1(pair, case):
    target, draft, prompts, refs = pair
    out, _ = _run(target, draft, [prompts[1]], case)
    assert out[0].tolist() == refs[1][:N_NEW]


def test_gsd_with_merging_is_exact_under_greedy_verification(pair):
    # Merging changes only what is proposed; R1 on the unmerged tree checks every node in its own
    # context, so the divergence from greedy decoding measured here is zero.
    target, draft, prompts, refs = pair
    out, m = _run(target, draft, prompts, "gsd", tau=1, k=4, theta_prob=0.05, theta_sib=0.05)
    assert out.tolist() == [r[:N_NEW] for r in refs] and m.num_drafted_nodes > 0


def test_exact_draft_copy_accepts_every_chain_token(pair):
    target, _, prompts, refs = pair
    out, m = _run(target, perturbed_copy(target, 0.0), prompts, "sd", gamma=3, max_new_tokens=17)
    assert out.tolist() == [r[:17] for r in refs]
    assert m.draft_acceptance_rate == 1.0 and m.acceptance_rate_per_pos == [1.0, 1.0, 1.0]
    assert m.mean_acceptance_length == 4.0  # 1 prefill token + 4 steps x 4 tokens


TSD_SEARCHES = [pytest.param({}, id="default"), pytest.param({"max_nodes": 6, "max_tree_nodes": 4}, id="node-cap"),
                pytest.param({"max_depth": 7, "theta_prob": 0.1, "theta_sib": 0.1, "max_nodes": 40,
                              "max_tree_nodes": 20}, id="deep"),
                pytest.param({"k": 3, "max_tree_nodes": 5}, id="tree-cap")]


def _search_run(target, draft, prompts, method, temperature, **params):
    """A seeded run's tokens, its steps (timings left out) and its counts."""
    out, m = _run(target, draft, prompts, method, temperature=temperature, seed=3, record_steps=True, **params)
    steps = [{k: v for k, v in s.items() if not k.endswith("_s")} for s in m.steps]
    counts = (m.num_target_forwards, m.num_draft_forwards, m.num_accepted_tokens, m.num_drafted_nodes,
              m.num_draft_tokens, m.draft_depth)
    return out, steps, counts


@pytest.mark.parametrize("params", TSD_SEARCHES)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_tsd_device_search_is_the_host_search(pair, monkeypatch, params, temperature):
    # TSD grows its tree on the device; GSD's merge (and a grammar) keep the host search. Without a
    # merge both must build the same trees: same tokens, same steps, same draft-side counts.
    target, draft, prompts, _ = pair
    from specops.decoding.methods.tsd import TSD

    device = _search_run(target, draft, prompts, "tsd", temperature, **params)
    monkeypatch.setattr(TSD, "propose", lambda self, ctx: self.grow_on_host(ctx))
    host = _search_run(target, draft, prompts, "tsd", temperature, **params)
    assert torch.equal(device[0], host[0]) and device[1:] == host[1:]


# fixed costs that make drafting pay: the adaptive budget follows the acceptance alone (deterministic)
FREE_DRAFTS = specops.decoding.AdaptiveConfig(target_cost=lambda T: 1.0, draft_cost=lambda g: 0.0)


@pytest.mark.parametrize("method,params", [pytest.param("tsd", p.values[0], id="tsd-" + p.id) for p in TSD_SEARCHES]
                         + [pytest.param("opt-tree", {}, id="opt-tree-default"),
                            pytest.param("opt-tree", {"n": 6, "delta": 0.0, "max_depth": 5}, id="opt-tree-deep"),
                            pytest.param("opt-tree", {"n": 3, "max_depth": 6}, id="opt-tree-narrow")])
@pytest.mark.parametrize("adaptive", [False, FREE_DRAFTS], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_sync_free_search_builds_the_reading_searchs_trees(pair, method, params, adaptive, temperature):
    # Sync-free, TSD feeds each layer at its widest and OPT-Tree every layer (padding rows the trees
    # never take) and neither reads per layer: same tokens, steps and counts as the reading search,
    # which computes exactly its frontier, so only the draft forwards may grow.
    target, draft, prompts, _ = pair
    free, reading = (_search_run(target, draft, prompts, method, temperature, adaptive=adaptive, sync_free=flag,
                                 **params) for flag in (True, False))
    assert torch.equal(free[0], reading[0]) and free[1] == reading[1]
    assert free[2][:1] + free[2][2:] == reading[2][:1] + reading[2][2:] and free[2][1] >= reading[2][1]


def test_tsd_with_k1_is_sd_and_opt_tree_n1_is_a_chain(pair):
    target, draft, prompts, refs = pair
    _, m_tsd = _run(target, draft, prompts, "tsd", k=1, theta_prob=0.0, theta_sib=0.0, max_depth=4)
    _, m_sd = _run(target, draft, prompts, "sd", gamma=4)
    assert m_tsd.num_accepted_tokens == m_sd.num_accepted_tokens
    assert m_tsd.num_target_forwards == m_sd.num_target_forwards
    out, m_opt = _run(target, draft, prompts, "opt-tree", n=1, delta=0.0, max_depth=4)
    assert m_opt.draft_tokens_per_step <= 4.0
    assert out.tolist() == [r[:N_NEW] for r in refs]


# ---- MJSD (approximate by design) -----------------------------------------------------------------

def test_mjsd_tau1_is_target_only_decoding(pair):
    target, draft, prompts, refs = pair
    out, m = _run(target, draft, prompts, "mjsd", tau=1.0)
    assert out.tolist() == [r[:N_NEW] for r in refs] and m.num_accepted_tokens == 0


def test_mjsd_tau0_accepts_the_whole_beam(pair):
    target, draft, prompts, _ = pair
    _, m = _run(target, draft, prompts, "mjsd", tau=0.0, gamma=3, beams=4, max_new_tokens=1 + 4 * 4)
    assert m.num_accepted_tokens == m.num_draft_tokens == 3 * 4 * 3


def test_mjsd_perplexity_is_the_target_likelihood_of_its_output(pair):
    # MJSD's deviation is its perplexity under the target (as the MJSD paper measures it): what the
    # loop logs from the verification logits must equal an independent re-scoring of the output.
    target, draft, prompts, _ = pair
    out, m = _run(target, draft, prompts[:1], "mjsd", adaptive=True)
    ids = torch.tensor([prompts[0] + out[0].tolist()])
    with torch.no_grad():
        lp = target(ids).logits[0, :-1].float().log_softmax(-1)
    P = len(prompts[0])
    gold = lp[P - 1:].gather(-1, ids[0, P:, None])[:, 0]
    assert m.perplexity == pytest.approx(float((-gold.mean()).exp()), rel=1e-4)


# ---- stop conditions --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["ar", "sd", "tsd", "opt-tree", "ouroboros", "specinfer", "mjsd"])
def test_eos_inside_an_accepted_block_truncates_exactly(pair, case):
    target, draft, prompts, refs = pair
    # EOS = the token greedy decoding emits at position 7 of sequence 0 (first occurrence).
    eos = refs[0][7]
    kw = {"tau": 1.0} if case == "mjsd" else {}
    out, m = _run(target, draft, prompts, case, eos_token_id=eos, **kw)
    for b in range(3):
        ref = refs[b][:N_NEW]
        cut = ref.index(eos) + 1 if eos in ref else N_NEW
        assert m.lengths[b] == cut
        assert out[b, :cut].tolist() == ref[:cut]
        assert m.finish_reasons[b] == ("eos" if eos in ref else "length")
    assert m.num_generated_tokens == sum(m.lengths)


@pytest.mark.parametrize("case", ["sd", "tsd", "ngram", "ouroboros"])
def test_stop_string_truncates_at_the_first_token_completing_it(pair, case):
    target, draft, prompts, refs = pair
    # enough of a tokenizer for stop strings: token i decodes to one letter
    tok = SimpleNamespace(eos_token_id=None, decode=lambda ids: "".join(chr(97 + i % 26) for i in ids))
    text = tok.decode(refs[2][:N_NEW])
    stop = text[9:11]
    cut = next(k for k in range(1, N_NEW + 1) if stop in tok.decode(refs[2][:k]))
    out, m = _run(target, draft, [prompts[2]], case, stop=[stop], tokenizer=tok)
    assert out[0].tolist() == refs[2][:cut]
    assert m.finish_reasons == ["stop"]


@pytest.mark.parametrize("n", [1, 2, 7])
def test_max_new_tokens_is_exact(pair, n):
    target, draft, prompts, refs = pair
    for case in ("sd", "tsd", "ouroboros"):
        out, m = _run(target, draft, prompts, case, max_new_tokens=n)
        assert out.shape == (3, n) and m.lengths == [n] * 3
        assert out.tolist() == [r[:n] for r in refs]


def test_streaming_sees_exactly_the_output(pair):
    target, draft, prompts, _ = pair
    seen = [[], [], []]
    out, _ = _run(target, draft, prompts, "tsd", stream=lambda b, ids: seen[b].extend(ids))
    assert seen == out.tolist()


# ---- metrics ------------------------------------------------------------------------------------

def test_metrics_follow_the_vllm_definitions(pair):
    target, draft, prompts, _ = pair
    _, m = _run(target, draft, prompts, "tsd", record_steps=True)
    assert m.num_drafts == sum(sum(s["active"]) for s in m.steps)
    assert m.num_draft_tokens == sum(n - 1 for s in m.steps for n, a in zip(s["nodes"], s["active"]) if a)
    assert m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.draft_acceptance_rate == pytest.approx(m.num_accepted_tokens / m.num_draft_tokens)
    assert m.num_accepted_tokens_per_pos[0] <= m.num_drafts
    assert sum(m.num_accepted_tokens_per_pos) == m.num_accepted_tokens
    # one prefill token per sequence, then m + 1 per draft (the last step may be cut by max tokens)
    assert 3 + m.num_drafts + m.num_accepted_tokens - 3 * 6 <= m.num_generated_tokens
    assert m.num_generated_tokens <= 3 + m.num_drafts + m.num_accepted_tokens
    assert m.total_time_s >= m.draft_time_s + m.verify_time_s > 0
    assert m.num_draft_forwards > 0 and m.num_target_forwards == len(m.steps)
    d = m.as_dict()
    assert d["mean_acceptance_length"] == m.mean_acceptance_length and "steps" not in d


def test_compare_ar_fills_speedup(pair):
    target, draft, prompts, _ = pair
    _, m = _run(target, draft, prompts[:1], "sd", compare_ar=True, max_new_tokens=8)
    assert m.ar_tokens_per_s > 0 and m.speedup == pytest.approx(m.tokens_per_s / m.ar_tokens_per_s)


# ---- bad input: a clear error before any work -------------------------------------------------------

@pytest.fixture
def no_work(monkeypatch):
    # every runner (target and draft) is a ModelRunner: building one is the first model work
    monkeypatch.setattr(ModelRunner, "__init__", lambda *a, **kw: pytest.fail("decoding work started"))


# More cases, on every backend and both layouts: tests/test_bad_input_state.py's generate battery.
@pytest.mark.parametrize("kwargs, match", [
    ({"method": "beam-me-up"}, "unknown method"), ({"method": "sd", "gama": 3}, "unknown parameter"),
    ({"method": "tsd", "theta_prob": 2.0}, "theta_prob"), ({"method": "tsd", "sync_free": 1}, "sync_free"),
    ({"method": "opt-tree", "sync_free": "yes"}, "sync_free"), ({"temperature": -0.1}, "temperature"),
    ({"max_new_tokens": 2000}, "too long"), ({"kv_layout": "blocked"}, "kv_layout"),
    ({"kv_layout": "paged", "page_size": 0}, "page_size"), ({"page_size": True}, "page_size"),
    ({"prompt": [[1, 2, 3], []]}, "empty"), ({"prompt": [[500, 1]]}, "vocabulary"),
    ({"prompt": "a string prompt"}, "tokenizer"), ({"method": "tsd", "draft": None}, "needs a draft"),
    ({"method": "sd", "draft": "no-such-model"}, "unknown embedded model"),
])
def test_bad_input_raises_before_work(pair, no_work, kwargs, match):
    target, draft, prompts, _ = pair
    kw = {"prompt": prompts, "draft": draft, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(target, **kw)


def test_model_free_methods_need_no_draft(pair):
    target, _, prompts, refs = pair
    for method, kw in (("ngram", {}), ("ouroboros", {"model_free": True})):
        out, m = generate(target, prompts, method=method, max_new_tokens=N_NEW, eos_token_id=[], **kw)
        assert out.tolist() == [r[:N_NEW] for r in refs]
        assert m.num_draft_forwards == 0


def test_every_registered_method_runs(pair):
    target, draft, prompts, _ = pair
    for name in METHODS:
        out, m = generate(target, prompts[:2], draft=draft, method=name, max_new_tokens=6, eos_token_id=[])
        assert out.shape == (2, 6) and m.method == name


def test_generate_is_exported():
    assert specops.generate is generate
