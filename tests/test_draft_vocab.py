"""Drafters that search the draft head's own vocabulary (``Drafter.uses_draft_vocab``; ModelRunner's
``head_subset``): the runner's logits are the full head's kept columns, eager and compiled, and each
such method drafts and emits the same tokens as over full-vocabulary logits."""
import sys

import pytest
import torch
from test_distill import V, fresh_draft, tiny_target

from specops.decoding import methods
from specops.decoding.api import generate
from specops.decoding.methods import base
from specops.decoding.sampling import SamplingConfig
from specops.engine import ModelRunner

KEEP = torch.arange(3, V, 2)  # ascending, as a shipped draft's
PROMPTS = [[5, 9, 33, 4, 71, 12], [8, 100, 3]]


@pytest.mark.parametrize("compile", [False, True])
def test_subset_logits_are_the_full_heads_kept_columns(compile):
    target = tiny_target(seed=3)
    d = fresh_draft(target, KEEP, seed=4).eval()
    full_r, sub_r = (ModelRunner(d, 2, 64, compile=compile, head_subset=s) for s in (False, True))
    assert full_r.vocab_keep is None and torch.equal(sub_r.vocab_keep, KEEP)
    assert ModelRunner(target, 1, 16, head_subset=True).vocab_keep is None  # a full head: full logits
    toks = torch.tensor([[7, 8, 9], [10, 11, 12]])
    parents = torch.tensor([[-1, 0, 0], [-1, 0, 1]], dtype=torch.int32)
    with torch.inference_mode():
        for r in (full_r, sub_r):
            r.prefill(PROMPTS, logits=False)
        full, sub = full_r.forward(toks, parents), sub_r.forward(toks, parents)
    assert sub.shape == (2, 3, len(KEEP))
    assert torch.equal(sub, full[..., KEEP])
    assert torch.isneginf(full[..., 0]).all()  # token 0 is not kept: the full logits' scatter


def test_vocab_ids_maps_columns_and_reads_column_0_for_dead_entries():
    class Draft:
        vocab_keep = torch.tensor([4, 9, 11])

    assert torch.equal(base.vocab_ids(Draft, torch.tensor([[2, -1], [0, 1]], dtype=torch.int32)),
                       torch.tensor([[11, 4], [4, 9]]))
    Draft.vocab_keep = None
    cols = torch.tensor([2, -1])
    assert base.vocab_ids(Draft, cols) is cols


def test_which_drafters_search_the_draft_vocabulary():
    greedy, sampled = SamplingConfig(0.0), SamplingConfig(0.8)
    sd, exits = methods.make("sd"), methods.make("sd", exit_threshold=0.3)
    assert sd.uses_draft_vocab(greedy) and not sd.uses_draft_vocab(sampled)  # R2 reads the draft rows
    assert not exits.uses_draft_vocab(greedy)
    assert methods.make("tsd").uses_draft_vocab(sampled)  # R3p: deterministic children, no rows
    gsd = methods.make("gsd")
    assert gsd.uses_draft_vocab(greedy) and not gsd.uses_draft_vocab(sampled)  # R5 keeps the rows
    assert methods.make("gsd", verify="mss_pointmass").uses_draft_vocab(sampled)
    for name in ("opt-tree", "mjsd"):
        assert methods.make(name).uses_draft_vocab(sampled)
    for name in ("specinfer", "ouroboros"):
        assert not methods.make(name).uses_draft_vocab(greedy)


@pytest.mark.parametrize("method, temperature", [("sd", 0.0), ("tsd", 0.0), ("tsd", 0.8), ("gsd", 0.0),
                                                 ("opt-tree", 0.0), ("opt-tree", 0.8), ("mjsd", 0.0)])
def test_methods_draft_the_same_tokens_over_the_draft_vocabulary(method, temperature, monkeypatch):
    target = tiny_target(seed=3)
    d = fresh_draft(target, KEEP, arch="feature", seed=4).eval()
    kw = {"draft": d, "method": method, "max_new_tokens": 12, "eos_token_id": [], "adaptive": False,
          "temperature": temperature, "seed": 5}
    klass = type(methods.make(method))
    module = sys.modules[klass.propose.__module__]
    mapped = []

    def spy(draft, cols):
        mapped.append(draft.vocab_keep is not None)
        return base.vocab_ids(draft, cols)

    monkeypatch.setattr(module, "vocab_ids", spy)
    out, m = generate(target, PROMPTS, **kw)
    assert mapped and all(mapped)  # every column went through the draft's vocabulary
    monkeypatch.setattr(klass, "uses_draft_vocab", lambda self, sampling: False)
    mapped.clear()
    ref, m_ref = generate(target, PROMPTS, **kw)
    assert not any(mapped)
    assert torch.equal(out, ref)
    assert (m.num_draft_tokens, m.num_accepted_tokens) == (m_ref.num_draft_tokens, m_ref.num_accepted_tokens)
    assert m.num_draft_tokens > 0 and (m.num_accepted_tokens > 0 or temperature > 0)  # sampled: may accept none
