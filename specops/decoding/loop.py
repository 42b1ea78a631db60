"""The one decoding loop (methods.md 11.1), shared by every method:

    prefill target (and draft) -> r = first token
    repeat: propose -> target forward over the block (tree attention, positions = L + depth)
            -> verify -> target KV compact/truncate -> emit (stop conditions cut exactly)
            -> drafter.commit (draft KV, pools)

It never looks at which method runs: everything method-specific sits behind the Drafter protocol.
"""
import dataclasses
import time

import torch

from .metrics import Metrics
from .runner import block_logits, commit_paths, make_runner, pad_batch
from .sampling import choose
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

    @property
    def batch(self):
        return len(self.seqs)

    def generated(self, b):
        return self.seqs[b][self.prompt_lens[b]:]


class TargetLM:
    def __init__(self, model, batch_size, max_len):
        self.runner = make_runner(model, batch_size, max_len)
        self.B = batch_size

    def prefill(self, prompts):
        """Shape: -> fp32 [B, V], logits after each prompt's last token."""
        ids, lens = pad_batch(prompts)
        dev = self.runner.lens.device
        logits = self.runner.prefill(ids.to(dev), lens.to(dev))
        return logits[torch.arange(self.B), lens.long().to(logits.device) - 1].float()

    def forward(self, tokens, parents, num_nodes):
        return block_logits(self.runner, tokens, parents, num_nodes, 0)

    def commit(self, paths, policy):
        """Keeps, per sequence, the accepted path's K/V (paths[b] = None keeps nothing).

        ``policy`` "truncate" is a drafter's promise that its blocks are chains (the accepted path
        is a block prefix, kept without a copy); "compact" moves the path's rows."""
        if policy == "truncate" and any(p and p != list(range(len(p))) for p in paths):
            raise RuntimeError("a drafter with kv_policy='truncate' proposed a block whose accepted path "
                               "is not a prefix; declare kv_policy='compact'")
        commit_paths(self.runner, paths)


def decode(target, drafter, prompts, *, sampling, stopper, generator, draft=None, tokenizer=None,
           stream=None, record_steps=False, track_logprobs=True, metrics=None):
    """Runs ``drafter``'s method to completion. ``target``: a TargetLM; ``draft``: a DraftLM or None.

    Returns (generated token lists per sequence, Metrics)."""
    B = len(prompts)
    m = metrics if metrics is not None else Metrics()
    m.method, m.batch_size = drafter.name, B
    t_start = time.perf_counter()

    last = target.prefill(prompts)  # [B, V]
    first, _ = choose(last, sampling, generator)
    V = last.shape[-1]
    state = DecodeState(seqs=[list(p) for p in prompts], prompt_lens=[len(p) for p in prompts],
                        active=[True] * B, was_active=[True] * B, sampling=sampling,
                        generator=generator, vocab_size=V, draft=draft, tokenizer=tokenizer)
    reasons = [None] * B
    for b in range(B):
        kept, reason = stopper.cut([], [first[b]])
        state.seqs[b] += kept
        if track_logprobs:
            m.target_logprob_sum += float(last[b].log_softmax(-1)[first[b]])
            m.target_logprob_count += 1
        if reason:
            state.active[b], reasons[b] = False, reason
        if stream is not None:
            stream(b, kept)
    if draft is not None:
        draft.prefill(prompts)
    drafter.setup(state)
    m.prefill_time_s = time.perf_counter() - t_start

    while any(state.active):
        t0 = time.perf_counter()
        state.was_active = list(state.active)
        cand = drafter.propose(state)
        t1 = time.perf_counter()

        tokens, parents, num_nodes = cand.pack(target.runner.lens.device)
        logits = target.forward(tokens, parents, num_nodes)
        m.num_target_forwards += 1
        mode = drafter.verify_mode(sampling)
        result = verify(mode, cand, tokens, parents, num_nodes, logits, state)
        t2 = time.perf_counter()

        target.commit([result.paths[b] if state.active[b] else None for b in range(B)], drafter.kv_policy)
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
            if track_logprobs and kept:
                rows = torch.tensor(path[: len(kept)], device=logits.device)
                lp = logits[b, rows].log_softmax(-1)
                m.target_logprob_sum += float(lp.gather(-1, torch.tensor(kept, device=lp.device)[:, None]).sum())
                m.target_logprob_count += len(kept)
            if reason:
                state.active[b], reasons[b] = False, reason
            if stream is not None and kept:
                stream(b, kept)
        drafter.commit(state, cand, result)
        t3 = time.perf_counter()
        m.draft_time_s += t1 - t0
        m.verify_time_s += t2 - t1
        m.bookkeeping_time_s += t3 - t2
        if record_steps:
            m.steps.append({"active": list(state.was_active), "nodes": cand.num_nodes(),
                            "accepted": [len(p) - 1 for p in result.paths],
                            "draft_s": t1 - t0, "verify_s": t2 - t1, "bookkeeping_s": t3 - t2})

    m.total_time_s = time.perf_counter() - t_start
    if draft is not None:
        m.num_draft_forwards = draft.forwards
    gen = [state.generated(b) for b in range(B)]
    m.num_generated_tokens = sum(len(g) for g in gen)
    m.lengths = [len(g) for g in gen]
    m.finish_reasons = reasons
    return gen, m
