"""SD / SSD (docs/methods.md §SD, with ``exit_threshold``'s draft-exit): a chain of ``gamma`` draft
tokens, verified by R1 or R2 on each token's draft row (grammar-masked, if any) and its warp. The
chain grows on the device; drafting reads only under ``exit_threshold`` or a grammar."""
import torch

from ..readback import read_lists
from ..sampling import choose
from ..tree import Draft
from .base import ModelDrafter, count, fraction, grammar_masked, vocab_ids


class SD(ModelDrafter):
    name = "sd"
    description = "speculative decoding, a chain of gamma draft tokens (Leviathan/Chen)"
    PARAMS = {"gamma": 4, "exit_threshold": 0.0}
    sampling_mode = "mss"
    CHECKS = {"gamma": count(), "exit_threshold": fraction()}
    budget_param = "gamma"

    def tree_budget(self):
        return self.gamma + 1

    def uses_draft_vocab(self, sampling):
        return sampling.greedy and self.exit_threshold == 0  # R2 tests each token on its draft row

    def draft_budget(self):
        return self.gamma

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B, dev, G = ctx.batch, ctx.root.device, self.gamma
        sampled = not ctx.sampling.greedy  # R2 tests each token against the row it was drawn from
        host = ctx.grammar is not None or self.exit_threshold > 0  # a search on each forward's tokens
        tips, going, depth = list(d.root), list(ctx.active), [0] * B
        drafted = [[] for _ in range(B)]  # the drafted tokens on the host (a host search only)
        tokens = torch.cat([ctx.root[:, None], ctx.root.new_zeros(B, G)], 1)  # [B, G + 1]: the roots, the chain
        rows = torch.zeros(B, G + 1, ctx.vocab_size, dtype=torch.float32, device=dev) if sampled else None
        for _ in range(G):
            bs = [b for b in range(B) if going[b]]
            if not bs:
                break
            col = depth[bs[0]] + 1  # every drafting sequence is at the same level
            full = len(bs) == B  # else the sequences' indices travel with the forward's upload
            logits, at = d.forward(rows=[(b, tips[b]) for b in bs], extra=None if full else bs)  # [n, V]
            if ctx.grammar is not None:  # draw from the draft's distribution over allowed tokens
                logits = grammar_masked(ctx, logits, [(b, drafted[b]) for b in bs])
            chosen, probs = choose(logits, ctx.sampling, ctx.generator)  # int64 [n] on the device
            chosen = vocab_ids(d, chosen)
            idx = slice(None) if full else at  # the rows of the sequences drafting
            tokens[idx, col] = chosen
            if sampled:
                rows[idx, col] = logits
            if host:
                bs = self._host_search(ctx, bs, chosen, probs, logits, drafted, going)
                new = [d.add(b, drafted[b][-1], tips[b]) for b in bs]
            else:
                new = d.add_device(bs, [tips[b] for b in bs], chosen)
            for b, tip in zip(bs, new):
                tips[b], depth[b] = tip, depth[b] + 1
        nodes = [1 + n for n in depth]
        T = max(nodes)
        up = ctx.stager.upload(nodes + list(d.root))  # [2B]: node counts, the roots' block nodes
        ar = torch.arange(T, device=dev)
        valid = ar < up[:B, None]  # [B, T]; a sequence that stopped early wrote a column past its end
        draft_logits = None
        if sampled:
            draft_logits = torch.where(valid[..., None], rows[:, :T], 0.0) if host else rows[:, :T]
        return Draft(tokens=torch.where(valid, tokens[:, :T], 0),
                     parents=torch.where(valid, ar - 1, 0).to(torch.int32), num_nodes=up[:B].to(torch.int32),
                     draft_logits=draft_logits, draft_warp=ctx.sampling if sampled else None,
                     src=torch.where(valid, up[B:, None] + ar, 0).to(torch.int32),
                     depth=depth, depth_drafted=list(depth), drafted_nodes=nodes)

    def _host_search(self, ctx, bs, chosen, probs, logits, drafted, going):
        """Reads the chosen tokens (and their probabilities, with ``exit_threshold``) once, appends the
        kept ones to ``drafted``, stops the sequences that exit or reach ``gamma``; returns the kept."""
        if self.exit_threshold > 0:
            conf = probs if probs is not None else logits.softmax(-1)
            toks, conf = read_lists(chosen, conf.gather(1, chosen[:, None])[:, 0])
        else:
            toks, conf = read_lists(chosen)[0], None
        kept = []
        for j, b in enumerate(bs):
            exits = conf is not None and conf[j] < self.exit_threshold
            if not exits:
                drafted[b].append(toks[j])
                kept.append(b)
            going[b] = not exits and len(drafted[b]) < self.gamma
        return kept
