"""Host reads per decode step: verification stays on the device until one read per step.

Every way a tensor's values reach Python (``tolist``, ``item``, ``cpu``, ``numpy``, ``int()``,
``bool()``, ``float()``, ``__index__``, iteration) is counted during decode steps of every method
(greedy, tiny fp32 models, after prefill and a warm-up step), split by phase:

* ``loop``: everything outside the drafter (target forward, verification, KV compaction, emission):
  the loop's one packed read (its counts also keep the runner's host copy of the cache lengths
  fresh, so the runner reads nothing);
* ``propose``: the drafter, as a function of its draft forwards (one read per forward for the tokens
  it needs on the host; OPT-Tree one more for its final subtree choice);
* ``commit``: the drafter's commit (draft KV compaction from host paths, pools): nothing.

The same table is in docs/methods.md §The decoding loop. A device op that synchronises without a
Python-visible read (a boolean mask index, ``nonzero``) is not counted here: the loop uses none."""
import collections

import pytest
import torch

from specops.decoding import api, methods
from specops.testing import perturbed_copy, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")

READS = ("tolist", "item", "cpu", "numpy", "__int__", "__bool__", "__float__", "__index__", "__iter__")
STEPS = (2, 3, 4)  # step 1 is the warm-up (its caches' host lengths are fresh from prefill)

# method -> (generate kwargs, reads per draft forward, constant reads in propose); the loop's
# part is LOOP_READS for every method and the drafter's commit reads nothing.
LOOP_READS = 1
EXPECTED = {
    "ar": ({}, 0, 0),
    "ngram": ({}, 0, 0),
    "sd": ({}, 1, 0),
    "sd-sampled": ({"method": "sd", "temperature": 1.0}, 1, 0),
    "specinfer": ({}, 1, 0),
    "tsd": ({}, 1, 0),
    "gsd": ({}, 1, 0),
    "opt-tree": ({}, 1, 1),
    "ouroboros": ({}, 1, 0),
    "ouroboros-model-free": ({"method": "ouroboros", "model_free": True}, 0, 0),
    "mjsd": ({}, 1, 0),
}


@pytest.fixture(scope="module")
def models():
    target = tiny_causal_lm("llama", seed=0)
    draft = perturbed_copy(target, 0.15, seed=1)
    gen = torch.Generator().manual_seed(5)
    # repeated text: the model-free drafters find matches, the others accept some tokens
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() * 3 for n in (5, 11)]
    return target, draft, prompts


class Counter:
    """Counts host reads per (step, phase); a step starts when the drafter's propose is entered."""

    def __init__(self):
        self.step, self.phase = 0, "prefill"
        self.reads = collections.Counter()
        self.forwards = collections.Counter()
        self.truncations = collections.Counter()

    def install(self, monkeypatch):
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))

    def _counted(self, fn):
        def read(tensor, *args, **kw):
            self.reads[(self.step, self.phase)] += 1
            return fn(tensor, *args, **kw)
        return read

    def wrap(self, drafter):
        propose, commit = drafter.propose, drafter.commit

        def counted_propose(state):
            self.step += 1
            before = state.draft.forwards if state.draft is not None else 0
            runner = state.draft.runner if state.draft is not None else None
            if runner is not None and not hasattr(runner, "_counted"):
                truncate = runner.truncate

                def counted_truncate(new_lens, *args):
                    self.truncations[self.step] += 1
                    return truncate(new_lens, *args)
                runner.truncate, runner._counted = counted_truncate, True
            self.phase = "propose"
            try:
                return propose(state)
            finally:
                self.phase = "loop"
                self.forwards[self.step] = (state.draft.forwards if state.draft is not None else 0) - before

        def counted_commit(state, cand, result):
            self.phase = "commit"
            try:
                return commit(state, cand, result)
            finally:
                self.phase = "loop"
        drafter.propose, drafter.commit = counted_propose, counted_commit
        return drafter


def count_steps(models, monkeypatch, case):
    target, draft, prompts = models
    params = dict(EXPECTED[case][0])
    method = params.pop("method", case)
    counter = Counter()
    make = methods.make
    monkeypatch.setattr(methods, "make", lambda name, **kw: counter.wrap(make(name, **kw)))
    drafter = make(method, **{k: v for k, v in params.items() if k != "temperature"})
    counter.install(monkeypatch)
    _, m = api.generate(target, prompts, draft=draft if drafter.needs_draft_model else None, method=method,
                        max_new_tokens=24, eos_token_id=[], adaptive=False, **params)
    monkeypatch.undo()
    assert m.num_target_forwards > max(STEPS), "too few steps to measure"
    return counter


@pytest.mark.parametrize("case", list(EXPECTED))
def test_one_packed_read_per_step_outside_the_drafter(models, monkeypatch, case):
    counter = count_steps(models, monkeypatch, case)
    _, per_forward, const = EXPECTED[case]
    for s in STEPS:
        got = {p: counter.reads[(s, p)] for p in ("propose", "loop", "commit")}
        # a draft cache that drops rows (Ouroboros) checks the new lengths on the host: no read
        want = {"propose": per_forward * counter.forwards[s] + const, "loop": LOOP_READS, "commit": 0}
        assert got == want, f"step {s} ({counter.forwards[s]} draft forwards, {counter.truncations[s]} truncations)"


def test_the_counter_sees_every_kind_of_read(monkeypatch):
    counter = Counter()
    counter.install(monkeypatch)
    t = torch.tensor([3])
    t.tolist(), t.item(), t.cpu(), t.numpy(), int(t), bool(t), float(t), [0, 1, 2, 3][t], list(t)
    monkeypatch.undo()
    assert counter.reads[(0, "prefill")] == len(READS)
