"""The loop's host-side pieces on their own: GSD's token graph, Ouroboros' phrase pool, n-gram
lookup, stop conditions, metrics, candidate packing, drafter parameters, kernel checks, CLI."""
import os
from types import SimpleNamespace

import pytest
import torch

from specops import cli, verify_joint_logits, verify_tree
from specops.decoding import Metrics, PhrasePool, TokenGraph, _kernels
from specops.decoding import verify as verify_mod
from specops.decoding.draft_lm import DraftLM
from specops.decoding.methods import METHODS, NgramDrafter
from specops.decoding.methods.ngram import lookup
from specops.decoding.sampling import SamplingConfig, greedy_tokens, inverse_cdf
from specops.decoding.stopping import Stopper
from specops.decoding.tree import Candidates, Draft, Trie, depths
from specops.engine import Stager
from specops.testing import random_verify_case, tiny_causal_lm

# ---- GSD token graph --------------------------------------------------------------------------

def _grow(g, u, tokens):
    """Adds a chain below u (merging where redundant); returns the last node or the merge target."""
    for t in tokens:
        v = g.find_redundant(u, t)
        if v is not None:
            g.merge(u, v)
            return v
        u = g.add(u, t)
    return u


def test_graph_without_tau_never_merges():
    g = TokenGraph(0, tau=None)
    assert _grow(g, 0, [1, 2, 3]) == 3
    _grow(g, 0, [5, 2, 3])
    assert len(g) == 7 and all(not p for p in g.pseudo)
    tokens, _, _, copied = g.unmerge(100, 10)
    assert sorted(tokens) == sorted(g.token) and not any(copied)


@pytest.mark.parametrize("tau, branch, token, want", [
    (0, [5], 2, 2),  # the second "2" is redundant (same token, not on its path)
    (1, [5], 2, None),  # "5 2" vs "1 2"
    (1, [5, 2], 3, 3),  # "2 3" repeats
    (2, [5, 2], 3, None),  # "5 2 3" vs "1 2 3"
])
def test_tau_counts_matching_predecessors(tau, branch, token, want):
    # Branch 0-1-2-3, then the chain ``branch`` below the root: is ``token`` below its end redundant?
    g = TokenGraph(0, tau=tau)
    _grow(g, 0, [1, 2, 3])
    assert g.find_redundant(_grow(g, 0, branch), token) == want


def test_unmerge_copies_the_shared_subtree_with_fresh_depths():
    g = TokenGraph(0, tau=0)
    _grow(g, 0, [1, 2, 3, 4])  # nodes 1..4
    u = g.add(0, 7)
    assert g.find_redundant(u, 2) == 2
    g.merge(u, 2)
    tokens, parents, src, copied = g.unmerge(100, 10)
    assert all(0 <= parents[i] < i for i in range(1, len(parents)))
    d = depths(parents)  # in the unmerged tree: the copies sit below "7"
    copies = [(tokens[i], d[i], src[i]) for i in range(len(tokens)) if copied[i]]
    assert copies == [(2, 2, 2), (3, 3, 3), (4, 4, 4)]  # (token, depth, graph node)
    paths = []  # each node's root path of tokens (parents precede children)
    for tok, par in zip(tokens, parents):
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    assert (0, 7, 2, 3, 4) in paths and (0, 1, 2, 3, 4) in paths


def test_merges_that_would_close_a_cycle_are_rejected_and_unmerge_is_capped():
    g = TokenGraph(0, tau=0)
    a = g.add(0, 1)
    b = g.add(a, 2)
    c = g.add(0, 3)
    assert g.find_redundant(b, 3) == c  # before: "3" below b may reuse c
    assert g.find_redundant(c, 1) == a
    g.merge(c, a)  # c => a, so c reaches b
    assert g.find_redundant(b, 3) is None  # b => c would close the loop a -> b -> c -> a
    for _ in range(3):  # a long chain below b, then a tight cap
        b = g.add(b, 9)
    tokens, parents, _, _ = g.unmerge(6, 3)
    assert len(tokens) <= 6 and max(depths(parents)) <= 3


def test_first_occurrence_wins():
    g = TokenGraph(0, tau=0)
    x = g.add(0, 4)
    g.add(g.add(0, 5), 4)
    assert g.find_redundant(g.add(0, 6), 4) == x


# ---- Ouroboros phrase pool --------------------------------------------------------------------

def test_phrase_pool_is_lru_per_key_and_newest_first():
    pool = PhrasePool(length=2, capacity=3)
    for phrase in ([1, 2], [3, 4], [5, 6]):
        pool.insert(9, phrase)
    pool.insert(9, [1, 2])  # re-insert moves to newest
    pool.insert(9, [7, 8])  # evicts the oldest: [3, 4]
    assert pool.get(9, 10) == [[7, 8], [1, 2], [5, 6]]
    assert pool.get(9, 1) == [[7, 8]] and pool.get(9, 0) == [] and pool.get(1, 3) == []
    pool.insert(9, [1])  # wrong length: ignored
    pool.replace(9, [5, 6], [5, 5])
    assert pool.get(9, 10) == [[5, 5], [7, 8], [1, 2]]


def test_phrase_pool_ngrams():
    pool = PhrasePool(length=2, capacity=4)
    pool.add_ngrams([1, 2, 3, 1, 2, 4])
    assert pool.get(1, 4) == [[2, 4], [2, 3]]
    assert pool.get(2, 4) == [[4], [3, 1]] or pool.get(2, 4) == [[3, 1]]


# ---- n-gram lookup ----------------------------------------------------------------------------

def test_ngram_lookup_prefers_long_matches_and_full_continuations():
    seq = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    assert lookup(seq, 3, 1, 2, 1) == [[4, 5]]  # "1 2 3" seen at 0
    assert lookup(seq, 2, 1, 2, 2) == [[7, 8], [4, 5]]  # "2 3": most recent first
    assert lookup([5, 6, 7], 3, 1, 4, 1) == []
    assert lookup([1, 2, 1, 2, 1], 1, 1, 3, 1) == [[2, 1, 2]]  # the recent match is cut short


def test_ngram_draft_length_doubles_after_a_full_accept_and_resets_after_a_rejection():
    d = NgramDrafter(gamma=2, max_gamma=8)
    assert d.tree_budget() == 9
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]  # "1 2" seen before: a long copy follows
    state = SimpleNamespace(batch=1, seqs=[list(text)], active=[True], was_active=[True], stager=Stager("cpu"),
                            grammar=None)
    d.setup(state)
    lens = []
    for accepted in (2, 4, 8, 3, 0):
        draft = d.propose(state)
        lens.append(int(draft.num_nodes[0]) - 1)
        d.commit(state, draft, SimpleNamespace(paths=[list(range(accepted + 1))]))
    assert lens == [2, 4, 8, 8, 2]  # doubled up to max_gamma; a rejection resets to gamma
    with pytest.raises(ValueError, match="max_gamma"):
        NgramDrafter(gamma=4, max_gamma=3)


def test_trie_shares_prefixes():
    t = Trie(0)
    t.insert(0, [1, 2, 3])
    t.insert(0, [1, 2, 4])
    t.insert(0, [5])
    assert t.tokens == [0, 1, 2, 3, 4, 5] and t.parents == [-1, 0, 1, 2, 2, 0]
    assert t.insert(1, [2, 7]) == [2, 6]  # the sequence's nodes, the shared prefix's included


# ---- stop conditions, metrics, candidate packing ---------------------------------------------

def test_stopper_cuts_at_eos_inside_a_block_and_at_max_tokens():
    s = Stopper(10, eos_token_ids=[7])
    assert s.cut([1, 2], [3, 7, 4, 5]) == ([3, 7], "eos")
    assert s.cut(list(range(8)), [1, 2, 3]) == ([1, 2], "length")
    assert s.cut([], [1, 2]) == ([1, 2], None)
    assert Stopper(2, eos_token_ids=[5]).cut([1], [5, 5]) == ([5], "eos")


def test_stopper_stop_string_cut_is_minimal_and_spans_blocks():
    letters = SimpleNamespace(decode=lambda ids: "".join(chr(97 + i) for i in ids))
    s = Stopper(50, stop_strings=["cd"], tokenizer=letters)
    assert s.cut([0, 1], [2, 3, 4]) == ([2, 3], "stop")
    assert s.cut([0, 1, 2], [3, 4]) == ([3], "stop")  # "c" was emitted earlier
    assert s.cut([0], [1]) == ([1], None)
    with pytest.raises(ValueError, match="tokenizer"):
        Stopper(5, stop_strings=["x"])


def test_metrics_definitions():
    m = Metrics()
    m.record_draft(drafted=4, accepted=2)
    m.record_draft(drafted=4, accepted=0)
    m.record_draft(drafted=6, accepted=3, depth_drafted=3, drafted_nodes=9, graph_success=True)
    assert m.num_drafts == 3 and m.num_draft_tokens == 14 and m.num_accepted_tokens == 5
    assert m.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert m.draft_acceptance_rate == pytest.approx(5 / 14)
    assert m.num_accepted_tokens_per_pos == [2, 2, 1]
    assert m.acceptance_rate_per_pos == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert m.draft_tokens_per_step == pytest.approx(14 / 3)
    assert m.graph_success_rate == pytest.approx(1 / 3) and m.matchness == pytest.approx(5 / 3)
    assert m.speedup is None and m.perplexity is None
    m.num_generated_tokens, m.total_time_s, m.ar_tokens_per_s = 20, 2.0, 5.0
    assert m.tokens_per_s == 10.0 and m.speedup == 2.0
    assert "mean acceptance length" in m.summary()


def test_candidates_stage_into_a_padded_device_draft_with_one_upload():
    stager = Stager("cpu")
    c = Candidates(tokens=[[5, 6, 7], [9]], parents=[[-1, 0, 0], [-1]], src=[[4, -1, 6], [2]])
    c.validate()
    d = c.stage(stager)
    assert stager.uploads == 1
    assert d.tokens.tolist() == [[5, 6, 7], [9, 0, 0]] and d.tokens.dtype == torch.int64
    assert d.parents.tolist() == [[-1, 0, 0], [-1, 0, 0]] and d.parents.dtype == torch.int32
    assert d.num_nodes.tolist() == [3, 1] and d.num_nodes.dtype == torch.int32
    assert d.src.tolist() == [[4, -1, 6], [2, 0, 0]] and d.depth == [1, 0] and d.draft_logits is None
    c.draft_logits = [list(torch.eye(4)[:3] * 3), None]  # a sequence without rows: zero logits (uniform)
    rows = c.stage(stager, 4).draft_logits
    assert rows.shape == (2, 3, 4) and rows.dtype == torch.float32
    assert torch.equal(rows[0], torch.eye(4)[:3] * 3) and torch.equal(rows[1], torch.zeros(3, 4))
    with pytest.raises(AssertionError):
        Candidates(tokens=[[1, 2]], parents=[[-1, 1]]).validate()


# ---- drafter parameters -----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_rejects_unknown_parameters(name):
    with pytest.raises(ValueError, match="unknown parameter"):
        METHODS[name](no_such_param=1)
    drafter = METHODS[name]()
    assert drafter.tree_budget() >= 1 and drafter.draft_budget() >= 0


@pytest.mark.parametrize("make, params, match", [
    # Issue #16 item 5: these were accepted (or failed only after the first forwards).
    ("specinfer", {"draft_temperature": float("nan")}, "draft_temperature must be a finite number > 0, got nan"),
    ("specinfer", {"draft_temperature": float("inf")}, "draft_temperature must be a finite number > 0, got inf"),
    ("opt-tree", {"delta": float("nan")}, "delta must be a finite number >= 0, got nan"),
    ("opt-tree", {"delta": float("inf")}, "delta must be a finite number >= 0, got inf"),
    ("opt-tree", {"n": 2**31}, r"n must be an int in \[1, 65535\], got 2147483648"),
    ("mjsd", {"joint_top_p": 0.0}, r"joint_top_p must be a number in \(0, 1\], got 0.0"),
    ("mjsd", {"beams": 70000}, r"beams must be an int in \[1, 65536\], got 70000"),
    ("ouroboros", {"model_free": 1}, "model_free must be True or False, got 1"),
    ("specinfer", {"ngram": "no"}, "ngram must be True or False, got 'no'"),
    # SamplingConfig refuses inf and bools the same way
    (SamplingConfig, {"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    (SamplingConfig, {"temperature": True}, "temperature must be a finite number >= 0"),
    (SamplingConfig, {"top_p": True}, r"top_p must be a number in \(0, 1\]"),
])
def test_method_and_sampling_parameters_are_validated_at_construction(make, params, match):
    with pytest.raises(ValueError, match=match):
        (METHODS[make] if isinstance(make, str) else make)(**params)


# ---- verification from logits ---------------------------------------------------------------

@pytest.mark.parametrize("mode", ["mss", "mss_noreplace", "gsd"])
def test_rejection_modes_verify_draft_logits_as_the_warped_rows(mode):
    # The loop hands the rejection modes the draft's logits and warp (verify_tree_logits warps the
    # rows its walk reads); the result is verify_tree on both warped probability tensors, bit for
    # bit, including a point-mass row (0 / -inf) and a zero row (uniform under top-k and top-p).
    g = torch.Generator().manual_seed(7)
    B, T, V = 3, 6, 13
    c = random_verify_case(B, T, V, generator=g, match=0.4)
    draft_logits = torch.randn(B, T, V, generator=g) * 2
    draft_logits[0, 1] = float("-inf")
    draft_logits[0, 1, int(c["tokens"][0, 1])] = 0.0  # a point mass at node 1's token
    draft_logits[1, 2] = 0.0  # no row: uniform
    sampling, warp = SamplingConfig(0.8, 5, 0.9), SamplingConfig(1.3, 4, 0.8)
    draft = Draft(tokens=c["tokens"].long(), parents=c["parents"], num_nodes=c["num_nodes"], draft_logits=draft_logits,
                  draft_warp=warp)
    active = torch.ones(B, dtype=torch.bool)
    got = verify_mod.verify(mode, draft, c["target_logits"], sampling, torch.Generator().manual_seed(3), active)
    uniforms = torch.rand(B, T, 2, generator=torch.Generator().manual_seed(3))  # verify's draw

    def warped(cfg, x):
        return cfg.warp(x.reshape(B * T, V)).reshape(B, T, V)
    assert torch.equal(warped(warp, draft_logits)[1, 2], torch.full((V,), 1.0 / V))
    idx, lens, bonus = verify_tree(c["tokens"], c["parents"], warped(sampling, c["target_logits"]), uniforms,
                                   draft_probs=warped(warp, draft_logits), mode=mode, num_nodes=c["num_nodes"])
    assert torch.equal(got.accept_lens, lens) and torch.equal(got.bonus_t.long(), bonus.long())
    for b in range(B):
        assert torch.equal(got.accept_idx[b, : lens[b]], idx[b, : lens[b]])


def test_mjsd_verifies_from_logits_with_its_joint_warp_and_the_generation_bonus():
    # The loop's R6 step is verify_joint_logits on the chain: the test under MJSD's warp, the bonus
    # under the sampling config, ragged chains cut at num_nodes, no [B, T, V] tensor on the way.
    g = torch.Generator().manual_seed(11)
    B, T, V = 3, 5, 17
    logits = torch.randn(B, T, V, generator=g) * 3
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.int64), logits[:, :-1].argmax(-1)], 1)
    tokens[1, 2] = int(logits[1, 1].argmin())  # a prefix that fails
    log_q = torch.cumsum(torch.full((B, T - 1), -0.4), 1)
    num_nodes = torch.tensor([5, 4, 2], dtype=torch.int32)
    for sampling in (SamplingConfig(0.0), SamplingConfig(0.8, 5, 0.9)):
        for tau in (0.0, 0.1, 1.0):
            draft = Draft(tokens=tokens, parents=torch.arange(-1, T - 1, dtype=torch.int32).expand(B, T).contiguous(),
                          num_nodes=num_nodes, log_q_joint=log_q, joint_tau=tau, joint_warp=(1.0, 20, 0.9))
            active = torch.tensor([True, True, False])
            got = verify_mod.verify("joint", draft, logits, sampling, torch.Generator().manual_seed(5), active)
            u = torch.rand(B, T, 2, generator=torch.Generator().manual_seed(5))[:, 0, 0]
            idx, lens, bonus = verify_joint_logits(
                tokens[:, 1:].to(torch.int32), logits, log_q, tau, u, temperature=1.0, top_k=20, top_p=0.9,
                bonus_temperature=sampling.temperature, bonus_top_k=sampling.top_k,
                bonus_top_p=sampling.top_p, num_nodes=num_nodes)
            assert torch.equal(got.accept_idx, idx) and torch.equal(got.bonus_t, bonus)
            assert got.accept_lens.tolist() == (lens * active).tolist()
            assert (lens <= num_nodes).all()
            if tau == 0.0:
                assert lens.tolist() == num_nodes.tolist()
            if sampling.greedy:
                eta = (lens - 1).long()
                assert bonus.tolist() == logits[torch.arange(B), eta].argmax(-1).tolist()


def test_kernel_checks_are_off_on_the_hot_path_and_switchable(monkeypatch):
    assert _kernels.CHECK is False or os.environ.get("SPECOPS_CHECK") == "1"
    monkeypatch.setattr(_kernels, "CHECK", True)
    tokens = torch.tensor([[1, 0]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0]], dtype=torch.int32)
    logits = torch.zeros(1, 2, 2)
    bad = torch.tensor([[[0.0, float("nan")], [0.0, 0.0]]])  # NaN draft logits are refused when checked
    with pytest.raises(ValueError, match="draft_logits must not contain NaN"):
        _kernels.verify_mode("mss", tokens, parents, logits, torch.full((1, 2, 2), 0.5), num_nodes=None,
                             sampling=SamplingConfig(1.0), draft_logits=bad.roll(1, 1))


# ---- command line -----------------------------------------------------------------------------

def test_cli_method_parameters_parse_to_python_values():
    for arg, value in [("gamma=6", 6), ("delta=0.25", 0.25), ("tau=none", None), ("reuse_pool=false", False),
                       ("verify=mss_pointmass", "mss_pointmass")]:
        assert cli._param(arg) == (arg.split("=")[0], value)


def test_cli_rejects_unknown_methods_and_reports_bad_parameters(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--method", "nope", "--prompt", "x"])
    assert cli.main(["info"]) == 0
    assert "backend" in capsys.readouterr().out


def test_cli_generate_checks_the_kv_layout_before_loading(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_setup", lambda args: pytest.fail("a model was loaded"))
    assert cli.main(["generate", "--prompt", "x", "--kv-layout", "paged", "--page-size", "12"]) == 2
    assert "page_size must be a power of two" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--prompt", "x", "--kv-layout", "blocked"])


def test_cli_demo_rejects_unknown_methods_before_loading(capsys):
    assert cli.main(["demo", "--methods", "sd,warp-drive"]) == 2
    assert "unknown method" in capsys.readouterr().err


# ---- draws on a device other than the generator's: inverse CDF of CPU uniforms ---------------------

def test_inverse_cdf_picks_the_interval_of_u_and_never_an_empty_one():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0],
                          [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]])  # rows need not sum to 1
    assert inverse_cdf(probs, torch.zeros(2, 1)).tolist() == [1, 0]
    # the boundaries: [0, .25) -> 1, [.25, .75) -> 3, [.75, 1) -> 4; the second row halves
    for x, want in [(0.2499, [1, 0]), (0.25, [3, 0]), (0.7499, [3, 5]), (0.75, [4, 5]), (1 - 2**-24, [4, 5])]:
        assert inverse_cdf(probs, torch.full((2, 1), x)).tolist() == want, x
    # u * total rounding onto the last cdf entry still lands on a token with mass (not the zero tail)
    assert inverse_cdf(probs, torch.ones(2, 1)).tolist() == [4, 5]


def test_inverse_cdf_draws_follow_the_row_distribution():
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    n = 40000
    got = inverse_cdf(p.expand(n, 4), torch.rand(n, 1, generator=g))
    freq = torch.bincount(got, minlength=4).double() / n
    assert freq[1] == 0 and torch.allclose(freq, p.double(), atol=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_tokens_is_argmax_and_takes_the_first_of_tied_maxima(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 4099, generator=g).to(dtype)  # [B, T, V]: a vector tail past the lanes
    x[:, :, torch.randperm(4099, generator=g)[:2000]] = float("-inf")  # a subset head's empty columns
    top = x.amax(-1) + 1  # [B, T]
    for col in (4098, 17, 900):  # tied maxima, the first one placed last: a last-wins rule fails
        x[0, :, col] = top[0]
    x[1, 2] = float("-inf")
    x[1, 2, [4000, 3]] = 0.0
    want = x.argmax(-1)
    assert want[0].tolist() == [17] * 5 and want[1, 2] == 3
    assert torch.equal(greedy_tokens(x), want)


def test_draft_lm_device_tokens_feed_like_host_tokens_and_commit_from_path_tokens():
    # Ragged catch-up chains (the second forward feeds one sequence's chain again from q0): nodes
    # whose tokens stay on the device (add_device) give the logits host tokens (add) give, and a
    # commit takes their tokens from the caller, reading nothing.
    model = tiny_causal_lm("llama", seed=0)
    prompts = [[5, 17, 99, 3], [70, 2, 33, 8, 61, 4]]
    seqs = [prompts[0] + [9, 12, 40], prompts[1] + [7]]  # catch-up chains of 3 and 1 tokens
    drafted = [[21, 22], [31, 32]]
    out = []
    for device in (False, True):
        d = DraftLM(model, 2, 40)
        with torch.inference_mode():
            d.prefill(prompts)
            d.begin(seqs, [True, True])
            tips = list(d.root)
            rows = []
            for level in range(2):
                rows.append(d.forward(rows=[(b, tips[b]) for b in range(2)])[0])
                toks = [drafted[b][level] for b in range(2)]
                if device:
                    tips = d.add_device([0, 1], tips, torch.tensor(toks))
                else:
                    tips = [d.add(b, toks[b], tips[b]) for b in range(2)]
            rows.append(d.forward(rows=[(b, tips[b]) for b in range(2)])[0])  # feeds an earlier device token again
            paths = [list(range(d.root[b] + 3)) for b in range(2)]  # the chain, then both drafted nodes
            lens = d.commit_paths(paths, [[None] * (d.root[b] + 1) + drafted[b] for b in range(2)])
        out.append((torch.stack(rows), lens, [list(c) for c in d.cached]))
    assert torch.equal(out[0][0], out[1][0])
    assert out[0][1:] == out[1][1:]
    assert out[1][2] == [seqs[b] + drafted[b] for b in range(2)]


def test_the_draft_tokenizer_check_compares_vocabularies_once_per_pair():
    from specops.decoding.api import _check_same_vocab

    class Tok:
        def __init__(self, vocab):
            self.vocab, self.reads = dict(vocab), 0

        def __len__(self):
            return len(self.vocab)

        def get_vocab(self):
            self.reads += 1
            return dict(self.vocab)

    model = tiny_causal_lm("llama")
    V = model.config.vocab_size
    target, draft = Tok({f"t{i}": i for i in range(V)}), Tok({f"t{i}": i for i in range(V)})
    for _ in range(3):
        _check_same_vocab(model, target, model, draft)
    assert (target.reads, draft.reads) == (1, 1)  # the verdict is kept for the pair
    other = Tok({f"t{i}": (i + 1) % V for i in range(V)})  # same size, other ids
    for _ in range(2):
        with pytest.raises(ValueError, match="tokenizer differs from the target's"):
            _check_same_vocab(model, target, model, other)
    draft.vocab["extra"] = V  # a token added after the check: the sizes differ now
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        _check_same_vocab(model, target, model, draft)
