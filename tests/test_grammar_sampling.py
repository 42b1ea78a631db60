"""Sampling under a grammar: the lossless modes emit the target's distribution renormalised over the
tokens the grammar allows, exactly (docs/structured.md). test_decoding_sampling.py's chi-square
harness under a rule grammar that needs no tokenizer or engine ("never token 0, never the previous
token again") in place of :class:`specops.decoding.grammar.Grammar`: model drafts are masked by it,
n-gram candidates pruned by it, target rows masked at every node."""
from types import SimpleNamespace

import pytest
import test_decoding_sampling as ts
import torch
from test_decoding_sampling import ALPHA, PROMPT, ROWS, V, chi_square_pvalue, empirical
from test_distill import fresh_draft

from specops.decoding import api, generate

pytestmark = pytest.mark.usefixtures("one_thread", "kernel_checks")
models = ts.models  # the fixture of the grammar-free harness: its V = 8 target and a draft that disagrees


def allowed_after(last):
    """The rule: after ``last`` (None: nothing emitted yet) every token but 0 and ``last``."""
    return [t for t in range(V) if t != 0 and t != last]


def row_of(last):
    return sum(1 << t for t in allowed_after(last))


class RuleGrammar:
    """Grammar's interface (batch_size, stop_tokens, fill_next_bitmask, fill_tree_bitmask,
    rows_after, constrain, advance, is_terminated) for :func:`allowed_after`. W = 1 word."""

    def __init__(self, tokenizer, *, batch_size, vocab_size, **_):
        assert vocab_size == V
        self.last = [None] * batch_size

    @property
    def batch_size(self):
        return len(self.last)

    stop_tokens = ()

    def is_terminated(self):
        return [False] * self.batch_size

    def advance(self, accepted):
        for b, toks in enumerate(accepted):
            for t in toks:
                assert t in allowed_after(self.last[b]), (b, t, self.last[b])
                self.last[b] = t

    def fill_next_bitmask(self):
        return torch.tensor([[row_of(last)] for last in self.last], dtype=torch.int32)

    def fill_tree_bitmask(self, parents, tokens, num_nodes=None, *, with_valid=False):
        B, T = parents.shape
        rows = torch.full((B, T, 1), -1, dtype=torch.int32)
        valid = torch.zeros(B, T, dtype=torch.bool)
        n = [T] * B if num_nodes is None else num_nodes.tolist()
        par, tok = parents.tolist(), tokens.tolist()
        for b in range(B):
            for i in range(n[b]):  # the root, then every child of a valid node that the rule allows
                p = par[b][i]
                if i == 0 or valid[b, p] and tok[b][i] in allowed_after(tok[b][p]):
                    valid[b, i] = True
                    rows[b, i, 0] = row_of(tok[b][i])
        return (rows, valid) if with_valid else rows

    def rows_after(self, paths):
        def row(last, toks):
            ok = all(t in allowed_after(prev) for prev, t in zip([last, *toks], toks))
            return row_of(toks[-1] if toks else last) if ok else -1
        return torch.tensor([[row(self.last[b], toks)] for b, toks in paths], dtype=torch.int32)

    def constrain(self, b, tokens, parents, *, forced=8):
        # The valid nodes of the tree walk (RuleGrammar's: _Recording counts only verified blocks).
        tree = torch.tensor([parents]), torch.tensor([tokens])
        valid = RuleGrammar.fill_tree_bitmask(self, *tree, with_valid=True)[1][0]
        keep = [i for i in range(len(tokens)) if valid[i]]
        return [tokens[i] for i in keep], [-1] + [keep.index(parents[i]) for i in keep[1:]]


NO_TEXT = SimpleNamespace(decode=lambda ids, **_: "")  # a tokenizer the loop never reads (no stop strings)


def masked_warp(cfg, logits, lasts):
    """The loop's order: mask the target's row, then warp. logits [N, V] -> probs [N, V]."""
    logits = logits.clone()
    for i, last in enumerate(lasts):
        logits[i, [t for t in range(V) if t not in allowed_after(last)]] = float("-inf")
    return cfg.warp(logits)


def exact_joint(target, cfg):
    """P(t1, t2, t3) of the target under the grammar. Shape: -> [V, V, V]."""
    with torch.no_grad():
        p1 = masked_warp(cfg, target(torch.tensor([PROMPT])).logits[0, -1:], [None])[0]
        ids2 = torch.tensor([PROMPT + [a] for a in range(V)])
        p2 = masked_warp(cfg, target(ids2).logits[:, -1], list(range(V)))
        ids3 = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = masked_warp(cfg, target(ids3).logits[:, -1], [b for a in range(V) for b in range(V)]).view(V, V, V)
    return torch.nan_to_num(p1[:, None, None] * p2[:, :, None] * p3)  # rows of never-emitted prefixes


CASES = [
    ("ar", {}, "t1"),
    ("sd", {"gamma": 3}, "t1"),
    ("tsd", {"k": 3, "theta_prob": 0.05, "theta_sib": 0.05, "max_depth": 2}, "t1"),
    ("ngram", {"gamma": 3, "branches": 2, "min_ngram": 1}, "t1"),
    ("specinfer", {"num_drafts": 3, "gamma": 2}, "t1"),
    ("opt-tree", {"n": 6, "delta": 0.0, "max_depth": 2}, "t1"),
    ("ouroboros", {"gamma": 2, "window": 1, "ngram": 3, "guesses": 2, "branches": 2}, "t1"),
    ("ouroboros", {"gamma": 3, "ngram": 3, "branches": 2, "model_free": True}, "t1"),
    ("sd", {"gamma": 3}, "warped"),
    ("eagle-sd", {"gamma": 3}, "t1"),
    ("eagle-tsd", {"k": 3, "theta_prob": 0.05, "theta_sib": 0.05, "max_depth": 2}, "warped"),
]


def ruled(monkeypatch, models, method, prompts, grammar=RuleGrammar, **kw):
    """generate under ``grammar`` (in place of Grammar), fixed budgets; ``method`` "eagle-x": x with
    the feature draft (its rows are masked like any draft model's), model-free methods without one."""
    monkeypatch.setattr(api, "Grammar", grammar)
    target, draft = models
    if method.startswith("eagle-"):  # an untrained EAGLE-style draft of the target: it disagrees with it
        method, draft = method[len("eagle-"):], fresh_draft(target, torch.arange(V), "feature", seed=13).eval()
    if method in ("ar", "ngram") or kw.get("model_free"):
        draft = None
    return generate(target, prompts, draft=draft, method=method, eos_token_id=[], regex="(the rule grammar)",
                    tokenizer=NO_TEXT, adaptive=False, **kw)


def case_ids(cases):  # method[-free][-config]
    return ["-".join([m + ("-free" if params.get("model_free") else ""), *rest]) for m, params, *rest in cases]


@pytest.mark.parametrize("method, params, cfg_name", CASES, ids=case_ids(CASES))
def test_lossless_modes_keep_the_masked_target_distribution(models, monkeypatch, method, params, cfg_name):
    cfg = ts.CONFIGS[cfg_name]
    out, _ = ruled(monkeypatch, models, method, [PROMPT] * ROWS, max_new_tokens=3, seed=0,
                   temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, **params)
    first3 = out[:, :3]
    assert not bool((first3 == 0).any()) and not bool((first3[:, 1:] == first3[:, :-1]).any())  # obeys the rule
    p = chi_square_pvalue(empirical(out), exact_joint(models[0], cfg))
    assert p > ALPHA, f"{method} {params} under the grammar: chi-square p = {p:.2e}"


def test_the_harness_tells_the_masked_distribution_from_the_plain_one(models, monkeypatch):
    """Power: the same sample against the target's unmasked distribution fails the test."""
    out, _ = ruled(monkeypatch, models, "sd", [PROMPT] * ROWS, max_new_tokens=3, seed=1, temperature=1.0,
                   gamma=3)
    assert chi_square_pvalue(empirical(out), ts.exact_joint(models[0], ts.CONFIGS["t1"])) < 1e-6


class _Recording(RuleGrammar):
    """RuleGrammar that counts the verified blocks' drafted nodes and those the rule rejects."""
    invalid = 0
    drafted = 0

    def fill_tree_bitmask(self, parents, tokens, num_nodes=None, *, with_valid=False):
        rows, valid = super().fill_tree_bitmask(parents, tokens, num_nodes, with_valid=True)
        nodes = parents.numel() if num_nodes is None else int(num_nodes.sum())  # roots included
        _Recording.drafted += nodes - parents.shape[0]
        _Recording.invalid += nodes - int(valid.sum())  # valid is False past num_nodes
        return (rows, valid) if with_valid else rows


DRAFTERS = [("sd", {"gamma": 3}), ("tsd", {"k": 3, "max_depth": 3}), ("gsd", {"k": 3, "max_depth": 3}),
            ("specinfer", {"num_drafts": 3, "gamma": 2}),
            ("opt-tree", {"n": 6, "max_depth": 3}), ("mjsd", {"gamma": 3, "beams": 2}),
            ("ouroboros", {"gamma": 3, "window": 1, "ngram": 3, "guesses": 2, "branches": 2}),
            ("ouroboros", {"gamma": 3, "ngram": 3, "branches": 3, "model_free": True}),
            ("ngram", {"gamma": 3, "branches": 3, "min_ngram": 1}), ("eagle-tsd", {"k": 3, "max_depth": 3})]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method, params", DRAFTERS, ids=case_ids(DRAFTERS))
def test_every_drafter_proposes_only_what_the_grammar_allows(models, monkeypatch, method, params, temperature):
    """Model drafts are drawn from masked rows and host candidates (n-gram, phrases) pruned, so every
    node of every verified block follows the grammar (none is spent on a token verification must
    reject); greedy lossless methods give constrained AR's tokens (fp32)."""
    monkeypatch.setattr(_Recording, "invalid", 0)
    monkeypatch.setattr(_Recording, "drafted", 0)
    prompts = [PROMPT, PROMPT[:-1]] * 4
    out, m = ruled(monkeypatch, models, method, prompts, grammar=_Recording, max_new_tokens=12, seed=4,
                   temperature=temperature, **params)
    assert not bool((out == 0).any()) and not bool((out[:, 1:] == out[:, :-1]).any())
    assert _Recording.drafted > m.num_target_forwards and _Recording.invalid == 0
    if temperature == 0 and method not in ("gsd", "mjsd"):  # lossless, fp32: constrained AR's tokens
        ar, _ = ruled(monkeypatch, models, "ar", prompts, max_new_tokens=12)
        assert out.tolist() == ar.tolist()
