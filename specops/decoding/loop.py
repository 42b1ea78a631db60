"""The one decoding loop (docs/methods.md §The decoding loop), shared by every method:

    prefill target (and draft) -> r = first token
    repeat: propose -> target forward over the block (tree attention, positions = L + depth)
            -> verify (device) -> one packed host read -> target kv_compact (device)
            -> emit (stop conditions cut exactly) -> drafter.commit (draft KV, pools)

It never looks at which method runs: everything method-specific sits behind the Drafter protocol.
With ``adaptive`` (an AdaptiveConfig), a Controller (adaptive.py) sets the drafter's budget knob
before every step from the acceptance and the step costs seen so far; budget 0 is an AR step: the
block is the root alone, neither ``propose`` nor the drafter's ``commit`` runs (so no draft forward),
and the draft cache catches up when drafting resumes.
"""
import dataclasses
import time

import torch

from . import _kernels
from .adaptive import Controller
from .metrics import Metrics
from .runner import block_logits, make_runner, pad_batch
from .sampling import choose
from .tree import Candidates, depths
from .verify import verify


@dataclasses.dataclass
class DecodeState:
    """What drafters read. ``seqs[b]`` = prompt + emitted tokens; its last token is the pending
    root (emitted, not yet in the target cache). ``active[b]``: still generating; ``was_active``:
    active when the current block was proposed."""
    seqs: list
    prompt_lens: list
    active: list
    was_active: list
    sampling: object
    generator: torch.Generator
    vocab_size: int
    draft: object = None
    tokenizer: object = None
    target: object = None  # the TargetLM (``state.target.features`` / ``.lens`` for EAGLE drafters)

    @property
    def batch(self):
        return len(self.seqs)

    def generated(self, b):
        return self.seqs[b][self.prompt_lens[b]:]


class TargetLM:
    """The target model behind the loop: its runner (static KV cache) and, with ``keep_features``,
    the final hidden states of every committed position (for EAGLE-style drafters).

    ``features`` [B, max_len, H] (model dtype): ``features[b, p]`` is the LM head's input (the final
    hidden state, after the final norm) at committed cache position ``p``, i.e. the state that
    produced the logits for token ``p + 1``. Filled at prefill (every prompt position) and on every
    commit (the accepted path's rows, at the positions they are committed to); rows at or past
    ``lens[b]`` are unspecified. Captured by a forward hook on the decoder's final norm (whose
    output is the head's input; then prefill sends only the last rows through the head) or, for a
    model without one, a pre-hook on ``model.get_output_embeddings()``; either exists only when
    ``keep_features`` is set.

    ``runner_kw`` go to the runner (``kv_layout``, ``page_size``: see ``generate``)."""

    def __init__(self, model, batch_size, max_len, keep_features=False, **runner_kw):
        self.runner = make_runner(model, batch_size, max_len, **runner_kw)
        self.B = batch_size
        self.keep_features = bool(keep_features)
        self.features = None
        self._hidden = None  # [B, T, H]: LM-head input of the latest target forward
        self._capturing = False  # the hook records only our own forwards (a draft may share the model)
        if self.keep_features:
            head = model.get_output_embeddings()
            if head is None:
                raise ValueError("keep_features needs a model with an output embedding (LM head)")
            cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            param = next(model.parameters())
            # One spare row past max_len: the device-side commit sends the padding entries of an
            # accepted path there instead of filtering them (a filter would read back a count).
            self._features_buf = torch.zeros(batch_size, max_len + 1, cfg.hidden_size, dtype=param.dtype,
                                             device=self.runner.lens.device)
            self.features = self._features_buf[:, :max_len]
            self._spare_row = max_len
            decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
            norm = getattr(decoder, "norm", None)
            if isinstance(norm, torch.nn.Module):
                self._hook = norm.register_forward_hook(self._capture_norm)
            else:
                self._hook = head.register_forward_pre_hook(self._capture)
            self._all_rows = not isinstance(norm, torch.nn.Module)  # the head must see every row

    def _capture(self, module, args):
        if self._capturing:
            self._hidden = args[0]

    def _capture_norm(self, module, args, output):
        if self._capturing:
            self._hidden = output

    @property
    def lens(self):
        """The committed lengths, int32 [B]."""
        return self.runner.lens

    def close(self):
        """Removes the feature hook (a TargetLM is per decode; the model lives on)."""
        hook = getattr(self, "_hook", None)
        if hook is not None:
            hook.remove()
            self._hook = None

    def _forward(self, fn, *args, **kw):
        self._capturing = self.keep_features
        try:
            return fn(*args, **kw)
        finally:
            self._capturing = False

    def prefill(self, prompts):
        """Shape: -> fp32 [B, V], logits after each prompt's last token."""
        ids, lens = pad_batch(prompts)
        dev = self.runner.lens.device
        all_rows = self.keep_features and self._all_rows
        if all_rows or not getattr(self.runner, "prefill_last_only", False):
            logits = self._forward(self.runner.prefill, ids.to(dev), lens.to(dev))
            if self.keep_features:
                L = ids.shape[1]
                self.features[:, :L] = self._hidden.to(self.features.dtype)
                self._hidden = None
            return logits[torch.arange(self.B), lens.long().to(logits.device) - 1].float()
        # Only the last row per prompt goes through the LM head (a [L, V] projection saved).
        last = self._forward(self.runner.prefill, ids.to(dev), lens.to(dev), last_only=True).float()
        if self.keep_features:  # the final norm's output: every prompt row
            self.features[:, : ids.shape[1]] = self._hidden.to(self.features.dtype)
            self._hidden = None
        return last

    def forward(self, tokens, parents, num_nodes):
        return self._forward(block_logits, self.runner, tokens, parents, num_nodes, 0)

    def commit(self, accept_idx, accept_lens, host_counts):
        """Keeps, per sequence, the accepted path's K/V: one ``runner.compact`` (kv_compact; a chain
        prefix moves each row onto itself), on the device, nothing read back.

        Shape: accept_idx int32 [B, A] (block node indices, root first; entries at or past
        accept_lens[b] are padding), accept_lens int32 [B] (0 for a sequence that keeps nothing);
        host_counts: the same counts as a list (from the step's packed read), so the runner's host
        copy of its lengths stays fresh without a read of its own."""
        if self.keep_features and self._hidden is not None:
            self._commit_features(accept_idx, accept_lens)
        self.runner.compact(accept_idx, accept_lens, check=_kernels.CHECK, host_counts=host_counts)

    def _commit_features(self, accept_idx, accept_lens):
        # Before the runner commits: lens are still the positions the paths start at.
        B, A = accept_idx.shape
        dev = self.features.device
        T = self._hidden.shape[1]
        j = torch.arange(A, device=dev)
        valid = j[None, :] < accept_lens.to(dev)[:, None]  # [B, A]
        pos = torch.where(valid, self.runner.lens.to(dev)[:, None].long() + j, self._spare_row)  # [B, A]
        bi = torch.arange(B, device=dev)[:, None]
        rows = self._hidden[bi, accept_idx.to(dev).long().clamp(0, T - 1)]  # [B, A, H]
        self._features_buf[bi, pos] = rows.to(self.features.dtype)
        self._hidden = None


def decode(target, drafter, prompts, *, sampling, stopper, generator, draft=None, tokenizer=None,
           stream=None, record_steps=False, track_logprobs=True, metrics=None, adaptive=None, ranks=None):
    """Runs ``drafter``'s method to completion. ``target``: a TargetLM; ``draft``: a DraftLM or None.
    ``adaptive``: None (fixed budgets) or an AdaptiveConfig; then ``drafter.enable_adaptive(adaptive)``
    must have run before the caches were sized. ``ranks``: the :class:`specops.parallel.RankGroup` of
    a tensor-parallel target (host decisions taken together, optional per-step divergence check).

    Returns (generated token lists per sequence, Metrics)."""
    B = len(prompts)
    m = metrics if metrics is not None else Metrics()
    m.method, m.batch_size = drafter.name, B
    t_start = time.perf_counter()
    # The emitted tokens' target log-likelihood accumulates on the logits' device and is read once
    # at the end (no host sync per step).
    logprob = _LogprobSum() if track_logprobs else None

    last = target.prefill(prompts)  # [B, V]
    first, _ = choose(last, sampling, generator)
    V = last.shape[-1]
    state = DecodeState(seqs=[list(p) for p in prompts], prompt_lens=[len(p) for p in prompts],
                        active=[True] * B, was_active=[True] * B, sampling=sampling,
                        generator=generator, vocab_size=V, draft=draft, tokenizer=tokenizer, target=target)
    reasons = [None] * B
    if logprob is not None:
        logprob.add(last, list(range(B)), first)
    for b in range(B):
        kept, reason = stopper.cut([], [first[b]])
        state.seqs[b] += kept
        if reason:
            state.active[b], reasons[b] = False, reason
        if stream is not None:
            stream(b, kept)
    if draft is not None:
        draft.prefill(prompts)
    drafter.setup(state)
    ctl = _controller(adaptive, drafter, B, ranks)
    m.adaptive = ctl is not None
    m.prefill_time_s = time.perf_counter() - t_start

    while any(state.active):
        t0 = time.perf_counter()
        state.was_active = list(state.active)
        budget = None if ctl is None else ctl.decide(state.active)
        if budget == 0:  # an AR step: no draft work at all
            cand = Candidates(tokens=[[s[-1]] for s in state.seqs], parents=[[-1] for _ in state.seqs])
            mode = "greedy" if sampling.greedy else "mss_pointmass"  # R1 / sampling from P[root]
        else:
            if budget is not None:
                drafter.set_budget(budget)
            cand = drafter.propose(state)
            mode = drafter.verify_mode(sampling)
        t1 = time.perf_counter()

        dev = target.runner.lens.device
        tokens, parents, num_nodes = cand.pack(dev)
        logits = target.forward(tokens, parents, num_nodes)
        m.num_target_forwards += 1
        result = verify(mode, cand, tokens, parents, num_nodes, logits, state)
        # The step's one host read (paths, bonus tokens, and the argmax rows a drafter asks for), then
        # the verify outputs go straight into kv_compact, finished sequences masked to keep nothing:
        # the compaction runs on the device while the host emits and drafts.
        result.read(state.active, with_argmax=budget != 0 and getattr(drafter, "needs_target_argmax", False))
        t2 = time.perf_counter()  # verify time ends with the read (on a GPU it waits for the forward)
        keep = torch.where(torch.tensor(state.active, device=dev), result.accept_lens, 0).to(torch.int32)
        target.commit(result.accept_idx, keep, [len(p) for p in result.paths])

        lp_rows, lp_toks = [], []
        for b in range(B):
            if not state.active[b]:
                continue
            path = result.paths[b]
            new = [cand.tokens[b][i] for i in path[1:]] + [result.bonus[b]]
            kept, reason = stopper.cut(state.generated(b), new)
            state.seqs[b] += kept
            copied = cand.copied[b] if cand.copied is not None else None
            m.record_draft(
                drafted=len(cand.tokens[b]) - 1, accepted=len(path) - 1,
                depth_drafted=cand.depth_drafted[b] if cand.depth_drafted else 0,
                drafted_nodes=cand.drafted_nodes[b] if cand.drafted_nodes else len(cand.tokens[b]),
                graph_success=bool(copied) and any(copied[i] for i in path))
            if logprob is not None and kept:
                lp_rows += [b * logits.shape[1] + i for i in path[: len(kept)]]
                lp_toks += kept
            if reason:
                state.active[b], reasons[b] = False, reason
            if stream is not None and kept:
                stream(b, kept)
        if lp_rows:
            logprob.add(logits.reshape(-1, logits.shape[-1]), lp_rows, lp_toks)
        t_commit = time.perf_counter()
        if budget != 0:
            drafter.commit(state, cand, result)
        t3 = time.perf_counter()
        m.draft_time_s += t1 - t0
        m.verify_time_s += t2 - t1
        m.bookkeeping_time_s += t3 - t2
        if ctl is not None:
            # drafting = propose + the drafter's commit; the rest of the step is the target's block
            ctl.observe(budget, [max(depths(cand.parents[b])) if state.was_active[b] else 0 for b in range(B)],
                        [max(len(p) - 1, 0) for p in result.paths], max(cand.num_nodes()),
                        t_target=t_commit - t1, t_draft=(t1 - t0) + (t3 - t_commit))
            m.record_budget(budget)
        if ranks is not None:
            ranks.check_step(m.num_target_forwards, state.seqs)
        if record_steps:
            m.steps.append({"active": list(state.was_active), "nodes": cand.num_nodes(),
                            "accepted": [max(len(p) - 1, 0) for p in result.paths], "budget": budget,
                            "draft_s": t1 - t0, "verify_s": t2 - t1, "bookkeeping_s": t3 - t2})

    if logprob is not None:
        m.target_logprob_sum += logprob.total()
        m.target_logprob_count += logprob.count
    m.total_time_s = time.perf_counter() - t_start
    if draft is not None:
        m.num_draft_forwards = draft.forwards
    gen = [state.generated(b) for b in range(B)]
    m.num_generated_tokens = sum(len(g) for g in gen)
    m.lengths = [len(g) for g in gen]
    m.finish_reasons = reasons
    return gen, m


def _controller(cfg, drafter, batch, ranks=None):
    """The step controller for ``drafter`` under AdaptiveConfig ``cfg`` (None: fixed budgets)."""
    if cfg is None or drafter.budget_param is None:
        return None
    if drafter.adaptive_range is None:
        raise ValueError(f"adaptive decoding needs drafter.enable_adaptive(cfg) before the caches are sized "
                         f"(method {drafter.name!r})")
    initial, lo, hi = drafter.adaptive_range
    return Controller(cfg, batch, initial, lo, hi, ranks=ranks)


class _LogprobSum:
    """Sum of log p(token | row) over emitted tokens, kept as a device tensor until ``total()``."""

    def __init__(self):
        self.sum = None
        self.count = 0

    def add(self, logits, rows, tokens):
        """Shape: logits [N, V]; rows, tokens: equal-length int lists (row of logits, emitted token)."""
        dev = logits.device
        sel = logits[torch.tensor(rows, device=dev)].float()  # [n, V]
        tok = torch.tensor(tokens, device=dev)[:, None]
        # log_softmax at one entry = logit - logsumexp: no [n, V] log-prob tensor is materialised
        part = (sel.gather(-1, tok)[:, 0] - sel.logsumexp(-1)).sum(dtype=torch.float64)
        self.sum = part if self.sum is None else self.sum + part
        self.count += len(tokens)

    def total(self):
        return float(self.sum) if self.sum is not None else 0.0
