"""SD / SSD (docs/methods.md §SD): a chain of ``gamma`` draft tokens, verified by R1 (greedy) or
R2 (rejection sampling with the draft's warped distribution, ``mss`` on a chain): each token's
draft logits row (masked by the grammar, if any) goes to verification with the sampling config it was
warped with, which warps only the rows its walk reads.

``exit_threshold`` > 0 adds SSD's draft-exit: stop drafting a sequence once the draft's probability
of its own next token falls below it (the low-probability token is not proposed).
"""
from ..sampling import choose
from ..tree import Candidates
from .base import ModelDrafter, grammar_masked


class SD(ModelDrafter):
    name = "sd"
    description = "speculative decoding, a chain of gamma draft tokens (Leviathan/Chen)"
    PARAMS = {"gamma": 4, "exit_threshold": 0.0}
    sampling_mode = "mss"
    budget_param = "gamma"

    def check_params(self):
        self._positive_int("gamma", self.gamma)
        self._fraction("exit_threshold", self.exit_threshold)

    def tree_budget(self):
        return self.gamma + 1

    def draft_budget(self):
        return self.gamma

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B = ctx.batch
        tips = list(d.root)
        going = list(ctx.active)
        tokens = [[s[-1]] for s in ctx.seqs]
        src = [[d.root[b]] for b in range(B)]
        drawn_from = [[None] for _ in range(B)]  # per node: the draft logits row it was drawn from
        depth = [0] * B
        for _ in range(self.gamma):
            if not any(going):
                break
            bs = [b for b in range(B) if going[b]]
            logits, _ = d.forward(rows=[(b, tips[b]) for b in bs])  # [len(bs), V]
            if ctx.grammar is not None:  # draw from the draft's distribution over allowed tokens
                logits = grammar_masked(ctx, logits, [(b, tokens[b][1:]) for b in bs])
            chosen, probs = choose(logits, ctx.sampling, ctx.generator)
            conf = None
            if self.exit_threshold > 0:
                conf = (probs if probs is not None else logits.softmax(-1))
            for j, b in enumerate(bs):
                tok = chosen[j]
                if conf is not None and float(conf[j, tok]) < self.exit_threshold:
                    going[b] = False
                    continue
                depth[b] += 1
                tokens[b].append(tok)
                drawn_from[b].append(None if probs is None else logits[j])
                tips[b] = d.add(b, tok, tips[b])
                src[b].append(tips[b])
                if len(tokens[b]) > self.gamma:
                    going[b] = False
        sampled = not ctx.sampling.greedy  # R2 tests each token against the row it was drawn from
        return Candidates(tokens=tokens, parents=[[-1] + list(range(len(t) - 1)) for t in tokens], src=src,
                          depth_drafted=depth, drafted_nodes=[len(t) for t in tokens],
                          draft_logits=drawn_from if sampled else None, draft_warp=ctx.sampling
                          ).stage(ctx.stager, ctx.vocab_size)


ChainDrafter = SD  # the class's name before issue #32 (a public name: kept)
