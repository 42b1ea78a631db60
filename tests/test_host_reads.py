"""Host traffic per decode step: one read, no blocking upload, no tensor built from host data
(docs/methods.md §The decoding loop, "Host traffic per step": the per-method table, the kinds).

Counted in the decode steps of every method (greedy and sampled, tiny fp32 models, after prefill and
a warm-up step), per phase (``propose``; ``commit``: the drafter's; ``loop``: the rest of
``Decoder.step``): reads (``READS``), host-built tensors (``BUILDERS``, ``Tensor.new_tensor``,
indexing with a Python list), host allocations (``FACTORIES`` without ``device=``), blocking
uploads (``Tensor.to`` / ``cuda`` naming a device, or ``copy_``, from a host-built or host-allocated
tensor without ``non_blocking=True``: on a CPU the device is the host, so the source's origin tells
an upload from a same-device ``.to``) and staged uploads (``runner.Stager.upload``, the one path host
data takes). A device op that synchronises without a Python-visible read (a boolean mask index,
``nonzero``) is not counted: the loop uses none."""
import collections

import pytest
import torch
from test_decoding import FREE_DRAFTS

from specops.decoding import api, loop, methods
from specops.engine import runner

pytestmark = pytest.mark.usefixtures("one_thread")

READS = ("tolist", "item", "cpu", "numpy", "__int__", "__bool__", "__float__", "__index__", "__iter__")
BUILDERS = ("tensor", "as_tensor", "from_numpy", "frombuffer")
# Factories: a call without ``device=`` makes a host tensor, which a later ``.to(device)`` uploads.
FACTORIES = ("zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint")
STEPS = (2, 3, 4)  # step 1 is the warm-up (its caches' host lengths are fresh from prefill)

# method -> (generate kwargs, (propose reads per step, per draft forward): at most, the loop's staged
# uploads per step). The loop reads once, the drafter's commit nothing (why each drafter reads: the
# comments below, docs/methods.md's table); the loop stages only the log-likelihood rows it gathers
# for the methods that are not lossless (GSD's R5, MJSD).
LOOP_READS = 1
EXPECTED = {
    "ar": ({}, (0, 0), 0),
    "ngram": ({}, (0, 0), 0),
    "sd": ({}, (0, 0), 0),
    "sd-sampled": ({"method": "sd", "temperature": 1.0}, (0, 0), 0),
    "sd-exit": ({"method": "sd", "exit_threshold": 0.02}, (0, 1), 0),  # SSD's exit: a host decision
    "specinfer": ({}, (1, 0), 0),  # the merged tree's size, once
    "specinfer-sampled": ({"method": "specinfer", "temperature": 1.0}, (1, 0), 0),
    "tsd": ({}, (0, 1), 0),  # on a CPU: the frontier's and tree's sizes per layer (the search stays on the device)
    "tsd-sync-free": ({"method": "tsd", "sync_free": True}, (1, 0), 0),  # every layer's sizes at the end
    "tsd-sync-free-sampled": ({"method": "tsd", "sync_free": True, "temperature": 1.0}, (1, 0), 0),
    "gsd": ({}, (0, 1), 1),  # the merge searches on the host
    "opt-tree": ({}, (0, 1), 0),  # on a CPU: delta's stop, a [B] count per layer
    "opt-tree-sync-free": ({"method": "opt-tree", "sync_free": True}, (1, 0), 0),  # the depths at the end
    "ouroboros": ({}, (0, 1), 0),
    "ouroboros-model-free": ({"method": "ouroboros", "model_free": True}, (0, 0), 0),
    "mjsd": ({}, (0, 0), 1),  # the beams grow and the best is traced back on the device
    # the adaptive controller observes every step (fixed costs that make drafting pay: no AR steps)
    "opt-tree-adaptive": ({"method": "opt-tree", "adaptive": FREE_DRAFTS}, (0, 1), 0),
    "tsd-sync-free-adaptive": ({"method": "tsd", "sync_free": True, "adaptive": FREE_DRAFTS}, (1, 0), 0),
    "sd-adaptive": ({"method": "sd", "adaptive": FREE_DRAFTS}, (0, 0), 0),
}

# case -> (lo, hi): F + lo <= propose's staged uploads <= F + hi: one non-blocking copy per draft forward
# (its new nodes, the rows it samples from, values it needs on the device), the target block (or its
# host-known part: SD's node counts; none for MJSD, TSD, OPT-Tree, whose chain, trees and block-node
# maps are built on the device) and the draft's truncate. The drafter's commit stages the kept path.
DRAFT_STAGED = {"sd": (1, 2), "specinfer": (1, 2), "tsd": (0, 0), "tsd-sync-free": (0, 0), "opt-tree": (0, 1),
                "opt-tree-sync-free": (0, 1), "mjsd": (0, 1)}


def _names_a_device(args, kw):
    devices = (torch.device, str, int, torch.Tensor)
    return "device" in kw or any(isinstance(a, devices) and not isinstance(a, bool) for a in args[:1])


def _host(t):
    return getattr(t, "_host_built", False)


def _list_index(t, idx, *value):
    return any(isinstance(p, list) for p in (idx if isinstance(idx, tuple) else (idx,)))


class Counter:
    """Counts host traffic per (step, phase); a step starts when ``Decoder.step`` is entered."""

    KINDS = ("reads", "built", "host_alloc", "blocking", "staged")

    def __init__(self):
        self.step, self.phase = 0, "prefill"
        self.n = {k: collections.Counter() for k in self.KINDS}
        self.forwards = collections.Counter()

    def count(self, kind):
        self.n[kind][(self.step, self.phase)] += 1

    def install(self, monkeypatch):
        def patch(owner, name, kind, **kw):
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name), kind, **kw))

        for name in READS:
            patch(torch.Tensor, name, "reads")
        for name in BUILDERS:
            patch(torch, name, "built", mark=True)
        patch(torch.Tensor, "new_tensor", "built", mark=True)
        for name in FACTORIES:
            patch(torch, name, "host_alloc", mark=True, when=lambda *a, **kw: kw.get("device") is None)
        uploads = {  # from a host-built or host-allocated tensor, without non_blocking=True
            "to": lambda t, *a, **kw: _host(t) and _names_a_device(a, kw) and not kw.get("non_blocking"),
            "cuda": lambda t, *a, **kw: _host(t) and not kw.get("non_blocking"),
            "copy_": lambda t, src, non_blocking=False: _host(src) and not non_blocking}
        for name, blocking in uploads.items():
            patch(torch.Tensor, name, "blocking", when=blocking)
        for name in ("__getitem__", "__setitem__"):  # indexing with a Python list builds an index tensor
            patch(torch.Tensor, name, "built", when=_list_index)
        patch(runner.Stager, "upload", "staged")
        step = loop.Decoder.step

        def counted_step(dec):
            self.step, self.phase = self.step + 1, "loop"
            before = getattr(dec.state.draft, "forwards", 0)  # no draft model: 0
            try:
                return step(dec)
            finally:
                self.forwards[self.step] = getattr(dec.state.draft, "forwards", 0) - before
                self.phase = "after"
        monkeypatch.setattr(loop.Decoder, "step", counted_step)

    def _wrap(self, fn, kind, mark=False, when=None):
        """``fn`` counting a ``kind`` at every call, or where ``when(*its arguments)`` holds; with
        ``mark``, the tensor it then returns is tagged host-built."""
        def counted(*args, **kw):
            hit = when is None or when(*args, **kw)
            if hit:
                self.count(kind)
            out = fn(*args, **kw)
            if hit and mark and isinstance(out, torch.Tensor):
                out._host_built = True
            return out
        return counted

    def wrap(self, drafter):
        """``drafter`` with its propose and commit counted in phases of their own."""
        def in_phase(fn, phase):
            def counted(*args):
                self.phase = phase
                try:
                    return fn(*args)
                finally:
                    self.phase = "loop"
            return counted
        drafter.propose = in_phase(drafter.propose, "propose")
        drafter.commit = in_phase(drafter.commit, "commit")
        return drafter


def count_steps(llama_pair, monkeypatch, case):
    target, draft, prompts, _ = llama_pair
    # repeated text: the model-free drafters find matches, the others accept some tokens
    prompts = [p * 3 for p in prompts[:2]]
    params = {"adaptive": False, **EXPECTED[case][0]}
    method = params.pop("method", case)
    counter = Counter()
    make = methods.make
    monkeypatch.setattr(methods, "make", lambda name, **kw: counter.wrap(make(name, **kw)))
    drafter = make(method, **{k: v for k, v in params.items() if k not in ("temperature", "adaptive")})
    counter.needs_model = drafter.needs_draft_model
    counter.install(monkeypatch)
    _, m = api.generate(target, prompts, draft=draft if drafter.needs_draft_model else None, method=method,
                        max_new_tokens=24, eos_token_id=[], **params)
    monkeypatch.undo()
    assert m.num_target_forwards > max(STEPS), "too few steps to measure"
    return counter


def per_step(counter, kind, s):
    return {p: counter.n[kind][(s, p)] for p in ("propose", "loop", "commit")}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_one_read_no_blocking_upload_no_host_built_tensor_per_step(llama_pair, monkeypatch, case):
    counter = count_steps(llama_pair, monkeypatch, case)
    _, (per_propose, per_forward), loop_staged = EXPECTED[case]
    for s in STEPS:
        F = counter.forwards[s]
        assert F > 0 or not counter.needs_model, f"step {s} drafted nothing"
        reads = per_step(counter, "reads", s)
        assert reads["propose"] <= per_propose + per_forward * F, f"step {s} ({F} draft forwards)"
        assert (reads["loop"], reads["commit"]) == (LOOP_READS, 0), f"step {s}"
        for kind in ("built", "host_alloc", "blocking"):
            assert per_step(counter, kind, s) == {"propose": 0, "loop": 0, "commit": 0}, f"step {s}: {kind}"
        staged = per_step(counter, "staged", s)
        assert staged["loop"] == loop_staged, f"step {s}"
        if F == 0:  # no draft model: the target block is the step's only upload (none for AR)
            assert staged["propose"] == (case != "ar"), f"step {s}"
        if case in DRAFT_STAGED:
            lo, hi = DRAFT_STAGED[case]
            assert F + lo <= staged["propose"] <= F + hi and staged["commit"] == 1, (s, F, staged)


def test_the_counter_sees_every_kind_of_traffic(monkeypatch):
    counter = Counter()
    counter.install(monkeypatch)
    t = torch.tensor([3])
    t.tolist(), t.item(), t.cpu(), t.numpy(), int(t), bool(t), float(t), [0, 1, 2, 3][t], list(t)
    torch.as_tensor([1]), torch.from_numpy(t.numpy()), t.new_tensor([1]), t[[0]]
    t.to("cpu"), t.to(t.device, non_blocking=True), torch.zeros(1).copy_(t), torch.zeros(1).copy_(t, True)
    torch.rand(2).to("cpu"), torch.rand(2, device="cpu").to("cpu"), torch.zeros(2, device="cpu").to(torch.int32)
    monkeypatch.undo()
    got = {k: counter.n[k][(0, "prefill")] for k in Counter.KINDS}
    # built: tensor, as_tensor, from_numpy, new_tensor, t[[0]]; host_alloc: zeros x2, rand;
    # blocking: t.to("cpu"), copy_(t), rand(2).to("cpu")
    assert got == {"reads": len(READS) + 1, "built": 5, "host_alloc": 3, "blocking": 3, "staged": 0}
    counter.install(monkeypatch)
    runner.Stager("cpu").upload([1, 2])
    monkeypatch.undo()
    assert counter.n["staged"][(0, "prefill")] == 1 and counter.n["blocking"][(0, "prefill")] == 3
