"""The one decoding loop of every method: prefill, then ``Decoder.step`` until every sequence stops
(docs/methods.md §The decoding loop: the step's phases, its observers and the host traffic each may
cause). What is method-specific sits behind the Drafter protocol; with ``adaptive``, a Controller
(adaptive.py) sets the budget before every step (0: an AR step, without ``propose`` or ``commit``)."""
import dataclasses
import time

import torch

from ..engine import ModelRunner
from ..ops.token_bitmask import apply_token_bitmask
from ..ops.verify.logits import fuses_bitmask
from . import _kernels
from .adaptive import Controller
from .context import DraftContext, TargetFeatures
from .metrics import Metrics
from .sampling import draw, greedy_tokens
from .tree import root_draft
from .verify import verify

TargetLM = ModelRunner  # the target's runner (api.py builds it under this name)


@dataclasses.dataclass
class StepResult:
    """One step as the observers see it: ``budget`` (None: fixed), the ``draft`` and the verify
    ``result`` (host lists filled), ``was_active`` [B], ``emitted`` [B] token lists (after the stop
    cut), and the step's phases in seconds (``draft_s``: propose; ``verify_s``: target forward,
    verification and the read; ``keep_s``: keep and emit; ``commit_s``: the drafter's commit)."""
    budget: int
    draft: object
    result: object
    was_active: list
    emitted: list
    draft_s: float
    verify_s: float
    keep_s: float
    commit_s: float


class Decoder:
    """Prefill on construction, then :meth:`step` until no sequence is active."""

    def __init__(self, target, drafter, prompts, *, sampling, stopper, generator, draft=None, tokenizer=None,
                 adaptive=None, observers=(), ranks=None, grammar=None):
        self.target, self.drafter, self.stopper, self.observers = target, drafter, stopper, list(observers)
        self.grammar = grammar
        B, dev = len(prompts), target.device
        gen = _on_device(generator, dev)
        last = target.prefill(prompts)  # [B, V]
        if grammar is not None:  # the first token obeys the grammar too
            last = _masked(last[:, None], grammar.fill_next_bitmask().to(dev)[:, None])[:, 0]
        first = greedy_tokens(last) if sampling.greedy else draw(sampling.warp(last), gen)  # int64 [B]
        self.prefill_logits = last
        # What the drafter sees (the sequences this loop extends); not the target, tokenizer or verifier.
        self.state = s = DraftContext(
            seqs=[list(p) for p in prompts], prompt_lens=[len(p) for p in prompts], active=[True] * B,
            was_active=[True] * B, sampling=sampling, generator=gen, vocab_size=last.shape[-1], root=first,
            stager=target.stager, vocab_id=(last.shape[-1], getattr(tokenizer, "name_or_path", None)), draft=draft,
            target=TargetFeatures(target) if drafter.needs_target_features else None, grammar=grammar)
        self.active_t = torch.ones(B, dtype=torch.bool, device=dev)
        self.reasons = [None] * B
        self.first_emitted = [self._emit_one(b, [t]) for b, t in enumerate(first.tolist())]
        self._advance_grammar(self.first_emitted)
        if draft is not None:
            draft.prefill(prompts)
        drafter.setup(s)
        self.ctl = None  # the step controller (None: fixed budgets)
        if adaptive is not None and drafter.budget_param is not None:
            if drafter.adaptive_range is None:
                raise ValueError("adaptive decoding needs drafter.enable_adaptive(cfg) before the caches "
                                 f"are sized (method {drafter.name!r})")
            self.ctl = Controller(adaptive, B, *drafter.adaptive_range, ranks=ranks)

    def step(self):
        s, drafter = self.state, self.drafter
        t0 = time.perf_counter()
        s.was_active = list(s.active)
        budget = None if self.ctl is None else self.ctl.decide(s.active)
        if budget == 0:  # an AR step: the root alone, R1 / sampling from P[root]
            draft, mode = root_draft(s.root), ("greedy" if s.sampling.greedy else "mss_pointmass")
        else:
            if budget is not None:
                drafter.set_budget(budget)
            draft, mode = drafter.propose(s), drafter.verify_mode(s.sampling)
        t1 = time.perf_counter()
        rows = self._grammar_rows(draft)  # before the forward: the host work overlaps a GPU's
        logits = self.target.forward(draft.tokens, draft.parents, draft.num_nodes)
        with_argmax = budget != 0 and drafter.needs_target_argmax
        fused = rows is not None and fuses_bitmask(mode) and not with_argmax  # the walk masks the rows it reads
        if rows is not None and not fused:
            logits = _masked(logits, rows)
        result = verify(mode, draft, logits, s.sampling, s.generator, self.active_t, bitmask=rows if fused else None)
        result.read(draft, s.active, with_argmax=with_argmax)
        t2 = time.perf_counter()  # verify time ends with the read (on a GPU it waits for the forward)
        # a finished sequence keeps nothing
        self.target.keep(result.accept_idx, result.accept_lens, [len(p) for p in result.paths], check=_kernels.CHECK)
        emitted = [self._emit_one(b, result.path_tokens[b][1:] + [result.bonus[b]]) if s.active[b] else []
                   for b in range(s.batch)]
        s.root = result.bonus_t.long()
        self._advance_grammar(emitted)
        t3 = time.perf_counter()
        if budget != 0:
            drafter.commit(s, draft, result)
        t4 = time.perf_counter()
        out = StepResult(budget, draft, result, s.was_active, emitted, t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        for observe in self.observers:
            observe(self, out)
        return out

    def _grammar_rows(self, draft):
        """The grammar's allowed tokens at every node of the block (None without a grammar): one
        host read of the draft's tree, the masks on the host, one non-blocking upload.
        Shape: -> int32 [B, T, ceil(V / 32)] on the target's device."""
        if self.grammar is None:
            return None
        n = None if draft.num_nodes is None else draft.num_nodes.to(torch.int32).cpu()
        rows = self.grammar.fill_tree_bitmask(draft.parents.to(torch.int32).cpu(), draft.tokens.to(torch.int32).cpu(), n)
        return rows.to(self.target.device, non_blocking=True)

    def _advance_grammar(self, emitted):
        """Commits the emitted tokens to the grammar; a sequence whose grammar has ended stops."""
        if self.grammar is None:
            return
        self.grammar.advance([list(k) for k in emitted])
        for b, done in enumerate(self.grammar.is_terminated()):
            if done and self.state.active[b]:
                self._finish(b, "grammar")

    def _emit_one(self, b, new):
        """Appends sequence ``b``'s new tokens up to a stop condition; returns the kept ones."""
        s = self.state
        kept, reason = self.stopper.cut(s.generated(b), new)
        s.seqs[b] += kept
        if reason:
            self._finish(b, reason)
        return kept

    def _finish(self, b, reason):
        self.state.active[b], self.reasons[b] = False, reason
        self.active_t[b] = False  # a fill on the device: no host data


def decode(target, drafter, prompts, *, sampling, stopper, generator, draft=None, tokenizer=None,
           stream=None, record_steps=False, track_logprobs=None, adaptive=None, ranks=None, grammar=None):
    """Runs ``drafter``'s method to completion -> (generated token lists per sequence, Metrics).

    ``target``: a ModelRunner; ``draft``: a DraftLM or None. ``adaptive``: None (fixed budgets) or an
    AdaptiveConfig that ``drafter.enable_adaptive`` took before the caches were sized. ``ranks``: a
    tensor-parallel target's :class:`specops.parallel.RankGroup` (host decisions taken together,
    optional per-step divergence check). ``grammar``: a Grammar of ``len(prompts)`` sequences
    masking the target's logits at every block node (docs/structured.md); its stop tokens must be
    among the stopper's EOS ids. ``track_logprobs``: see ``generate``'s ``logprobs`` (None: only for
    the methods that are not lossless)."""
    m = Metrics(method=drafter.name, batch_size=len(prompts))
    t_start = time.perf_counter()
    track = (not drafter.lossless) if track_logprobs is None else track_logprobs
    logprob = _LogprobSum() if track else None
    observers = [_metrics_observer(m, record_steps), _controller_observer(m)]
    if stream is not None:
        observers.append(lambda dec, r: [stream(b, k) for b, k in enumerate(r.emitted) if k])
    if logprob is not None:
        observers.append(logprob.observe)
    if ranks is not None:
        observers.append(lambda dec, r: ranks.check_step(m.num_target_forwards, dec.state.seqs))
    dec = Decoder(target, drafter, prompts, sampling=sampling, stopper=stopper, generator=generator, draft=draft,
                  tokenizer=tokenizer, adaptive=adaptive, observers=observers, ranks=ranks, grammar=grammar)
    m.adaptive = dec.ctl is not None
    if stream is not None:
        for b, kept in enumerate(dec.first_emitted):
            stream(b, kept)
    if logprob is not None:
        logprob.add(dec.prefill_logits, list(range(len(prompts))), [k[0] for k in dec.first_emitted], dec.state.stager)
    m.prefill_time_s = time.perf_counter() - t_start
    while any(dec.state.active):
        dec.step()
    if logprob is not None:
        m.target_logprob_sum += float(logprob.sum)
        m.target_logprob_count += logprob.count
    m.total_time_s = time.perf_counter() - t_start
    if draft is not None:
        m.num_draft_forwards = draft.forwards
    gen = [dec.state.generated(b) for b in range(len(prompts))]
    m.num_generated_tokens = sum(len(g) for g in gen)
    m.lengths = [len(g) for g in gen]
    m.finish_reasons = dec.reasons
    return gen, m


# ---- observers ----------------------------------------------------------------------------------

def _metrics_observer(m, record_steps):
    def observe(dec, r):
        d, res = r.draft, r.result
        m.num_target_forwards += 1
        for b, path in enumerate(res.paths):
            if r.was_active[b]:
                m.record_draft(drafted=res.num_nodes[b] - 1, accepted=len(path) - 1,
                               depth_drafted=d.depth_drafted[b], drafted_nodes=d.drafted_nodes[b],
                               graph_success=d.copied is not None and any(d.copied[b][i] for i in path))
        m.draft_time_s += r.draft_s
        m.verify_time_s += r.verify_s
        m.bookkeeping_time_s += r.keep_s + r.commit_s
        if record_steps:
            m.steps.append({"active": list(r.was_active), "nodes": res.num_nodes,
                            "accepted": [max(len(p) - 1, 0) for p in res.paths], "budget": r.budget,
                            "draft_s": r.draft_s, "verify_s": r.verify_s, "bookkeeping_s": r.keep_s + r.commit_s})
    return observe


def _controller_observer(m):
    def observe(dec, r):
        if dec.ctl is None:  # fixed budgets
            return
        # drafting = propose + the drafter's commit; the rest of the step is the target's block
        dec.ctl.observe(r.budget, [r.draft.depth[b] if r.was_active[b] else 0 for b in range(len(r.was_active))],
                        [max(len(p) - 1, 0) for p in r.result.paths], max(r.result.num_nodes),
                        t_target=r.verify_s + r.keep_s, t_draft=r.draft_s + r.commit_s)
        m.record_budget(r.budget)
    return observe


def _masked(logits, rows):
    """``logits`` with the tokens ``rows`` disallows at -inf (specops.apply_token_bitmask, in
    place on a contiguous copy when needed). Shape: logits [B, T, V], rows int32 [B, T, W]."""
    logits = logits.contiguous()
    apply_token_bitmask(logits.view(-1, logits.shape[-1]), rows.reshape(-1, rows.shape[-1]), check=False)
    return logits


def _on_device(generator, device):
    """The loop's generator on the target's device: the given one when it is there already, else a
    device generator seeded from it (one draw at setup), so every uniform is drawn on the device."""
    if generator is None or generator.device == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


class _LogprobSum:
    """Sum of log p(token | row) over emitted tokens, kept on the device until the decode ends."""

    def __init__(self):
        self.sum, self.count = 0.0, 0  # sum: a float64 device tensor once a row is added

    def observe(self, dec, r):
        rows, toks = [], []
        T = r.result.logits.shape[1]
        for b, kept in enumerate(r.emitted):
            rows += [b * T + i for i in r.result.paths[b][: len(kept)]]
            toks += kept
        mask = r.result.bitmask  # fused into verification: the rows read here are masked the same way
        if rows:
            self.add(r.result.logits.reshape(-1, r.result.logits.shape[-1]), rows, toks, dec.state.stager,
                     None if mask is None else mask.reshape(-1, mask.shape[-1]))

    def add(self, logits, rows, tokens, stager, mask=None):
        """Shape: logits [N, V]; rows, tokens: equal-length int lists (row of logits, emitted token);
        mask int32 [N, ceil(V / 32)] or None (the grammar's rows: the likelihood under the masked target)."""
        up = stager.upload(rows + tokens)
        n = len(rows)
        sel = logits[up[:n]].float()  # [n, V], a copy (indexed by a tensor)
        if mask is not None:
            apply_token_bitmask(sel, mask[up[:n]], check=False)
        # log_softmax at one entry = logit - logsumexp: no [n, V] log-prob tensor is materialised
        part = (sel.gather(-1, up[n:, None])[:, 0] - sel.logsumexp(-1)).sum(dtype=torch.float64)
        self.sum = self.sum + part
        self.count += n
