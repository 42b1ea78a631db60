"""SpecInfer (docs/methods.md §SpecInfer: the chains, their merge into one tree, the leaf duplicates,
the draws, the n-gram chain). R3 needs each child to be an independent draw from the row it names:
the logits it was drawn from, warped by verification with the sampling config. The chains grow on
the device, one read per step (a grammar: one per forward); each forward feeds every chain's latest
token (a merged node's row is its creator's), so the target block is no longer than the merged tree."""
import torch

from ..readback import read_lists
from ..sampling import draw, greedy_tokens
from ..tree import Draft, root_draft
from .base import FLAG, ModelDrafter, count, grammar_masked, grammar_prefix, real
from .ngram import lookup


class SpecInfer(ModelDrafter):
    name = "specinfer"
    description = "SpecInfer: several draft chains (i.i.d. samples) merged into a token tree"
    PARAMS = {"num_drafts": 3, "gamma": 4, "draft_temperature": 1.0, "ngram": False}
    sampling_mode = "mss"
    budget_param = "gamma"
    CHECKS = {"num_drafts": count(), "gamma": count(), "draft_temperature": real(positive=True), "ngram": FLAG}
    budget_cap_factor = 2  # num_drafts chains per level: the block grows fast with depth

    def tree_budget(self):
        return 1 + (self.num_drafts + bool(self.ngram)) * self.gamma * 2

    def draft_budget(self):
        return self.num_drafts * self.gamma

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B, k, G, greedy = ctx.batch, self.num_drafts, self.gamma, ctx.sampling.greedy
        act = [b for b in range(B) if ctx.active[b]]
        if not act:
            d.forward()
            return root_draft(ctx.root)
        A, dev = len(act), ctx.root.device
        tips = [[d.root[b]] * k for b in act]  # [A][k] each chain's draft-block tip (host: the structure)
        self.chain_nodes = {b: [] for b in act}  # per fed level, each chain's draft-block node
        paths = [[[] for _ in range(k)] for _ in act]  # each chain's tokens on the host (a grammar only)
        chain = torch.arange(k, device=dev)
        node = torch.zeros(A, k, dtype=torch.int64, device=dev)  # each chain's trie node (0 = the root)
        creator = None  # [A, k]: the chain whose draft node holds the row of each chain's trie node
        total = torch.zeros(A, dtype=torch.int64, device=dev)  # trie nodes made so far (root excluded)
        slots = []  # per level: (tokens, parent trie nodes, created, trie node ids, draft rows) [A, k]
        for step in range(G):
            logits, _ = d.forward(rows=[(b, t) for b, row in zip(act, tips) for t in row])  # [A * k, V]
            V = logits.shape[-1]
            logits = logits.view(A, k, V)
            if creator is not None:  # a merged node's row is its creator's (as if fed once)
                logits = logits.gather(1, creator[..., None].expand(A, k, V))
            if ctx.grammar is not None:
                logits = grammar_masked(ctx, logits.reshape(A * k, V),
                                        [(b, paths[i][c]) for i, b in enumerate(act) for c in range(k)]).view(A, k, V)
            x = self._draw(ctx, logits)  # [A, k] int64
            # Merge: chain c joins the first chain c' <= c at the same node that drew the same token.
            same = ((node[:, :, None] == node[:, None, :]) & (x[:, :, None] == x[:, None, :])
                    & (chain[None, :] <= chain[:, None])[None])  # [A, k, k']
            rep = same.to(torch.int32).argmax(-1)  # [A, k] the chain that makes the node (argmax: the first)
            created = rep == chain
            ids = total[:, None] + created.cumsum(1)  # [A, k] trie ids, in creation order (level, chain)
            slots.append((x, node, created, ids, None if greedy else logits))
            node, creator = ids.gather(1, rep), rep
            total = total + created.sum(1)
            if ctx.grammar is not None:
                paths = [[p + [tok] for p, tok in zip(ps, row)] for ps, row in zip(paths, read_lists(x)[0])]
            if step < G - 1:  # the last level is never fed
                new = d.add_device([b for b in act for _ in range(k)], [t for row in tips for t in row],
                                   x.reshape(-1))
                tips = [new[i * k: (i + 1) * k] for i in range(A)]
                for b, row in zip(act, tips):
                    self.chain_nodes[b].append(row)
        return self._target_tree(ctx, act, slots, total)

    def _draw(self, ctx, logits):
        """Every chain's draw of one level (docs/methods.md §SpecInfer).
        Shape: logits [A, k, V] -> int64 [A, k]."""
        A, k, V = logits.shape
        if not ctx.sampling.greedy:
            return draw(ctx.sampling.warp(logits.reshape(A * k, V)), ctx.generator).view(A, k)
        top = greedy_tokens(logits[:, 0])[:, None]  # [A, 1]
        if k == 1:
            return top
        rest = logits[:, 1:].reshape(A * (k - 1), V)
        # Max subtracted first: a tiny draft_temperature must not overflow to inf - inf.
        probs = torch.softmax((rest - rest.amax(-1, keepdim=True)) / self.draft_temperature, -1)
        return torch.cat([top, draw(probs, ctx.generator).view(A, k - 1)], 1)

    def _target_tree(self, ctx, act, slots, total):
        """The target block: per sequence the root, the trie in creation order, the leaf duplicates,
        then the n-gram chain; one read brings the counts back, the structure is scattered on the
        device. Shape: -> Draft with T = the longest merged tree."""
        B, A, k, G, greedy = ctx.batch, len(act), self.num_drafts, self.gamma, ctx.sampling.greedy
        dev = ctx.root.device
        x, parent, created, ids = (torch.cat([level[i] for level in slots], 1) for i in range(4))  # [A, S]
        rows = None if greedy else torch.cat([level[4] for level in slots], 1)  # [A, S, V]
        dup = ~created if not greedy else torch.zeros_like(created)  # [A, S] slots kept as leaf duplicates
        made, dups = read_lists(total, dup.sum(1))
        nodes, extra = [1] * B, {}  # extra: each drafting sequence's n-gram chain
        for i, b in enumerate(act):
            conts = lookup(ctx.seqs[b], 3, 1, G, 1) if self.ngram else []
            extra[b] = grammar_prefix(ctx, b, conts[0] if conts else [])
            nodes[b] = 1 + made[i] + dups[i] + len(extra[b])
        T = max(nodes)
        # One upload: node counts, the roots' draft nodes, the sequences drafting, each slot's draft
        # node (-1: the last level, never fed), the n-gram nodes (block position, token, parent).
        slot_src = [node for b in act for row in self.chain_nodes[b] + [[-1] * k] for node in row]
        ng_at, ng_tok, ng_par = [], [], []
        for i, b in enumerate(act):
            first = 1 + made[i] + dups[i]
            for j, tok in enumerate(extra[b]):
                ng_at.append(b * T + first + j)
                ng_tok.append(tok)
                ng_par.append(0 if j == 0 else first + j - 1)
        up = ctx.stager.upload(nodes + [ctx.draft.root[b] for b in range(B)] + act + slot_src + ng_at + ng_tok + ng_par)
        S, n = G * k, len(ng_at)
        num_nodes, roots, seq, slot_src, ng_at, ng_tok, ng_par = up.split([B, B, A, A * S, n, n, n])
        num_nodes, slot_src = num_nodes.to(torch.int32), slot_src.view(A, S)
        # Each slot's block position: its trie id, a duplicate after the trie, else a dump row (B * T).
        dump = B * T
        pos = torch.where(created, ids, total[:, None] + dup.cumsum(1))
        flat = torch.where(created | dup, seq[:, None] * T + pos, dump).reshape(-1)  # [A * S]
        tokens, parents, src = (torch.zeros(B * T + 1, dtype=torch.int64, device=dev) for _ in range(3))
        tokens[flat], parents[flat] = x.reshape(-1), parent.reshape(-1)
        src[flat] = torch.where(created, slot_src, -1).reshape(-1)
        if n:
            tokens[ng_at], parents[ng_at], src[ng_at] = ng_tok, ng_par, -1
        tokens, parents, src = (t[:dump].view(B, T) for t in (tokens, parents, src))
        tokens[:, 0], parents[:, 0], src[:, 0] = ctx.root, -1, roots
        draft_logits = None
        if not greedy:  # the chains' rows were warped with the sampling config (the point masses: by any)
            V = rows.shape[-1]
            draft_logits = torch.zeros(B * T + 1, V, dtype=torch.float32, device=dev)
            draft_logits[flat] = rows.reshape(A * S, V).float()
            if n:  # the n-gram chain's rows: point masses, 0 at the token and -inf elsewhere
                draft_logits[ng_at] = float("-inf")
                draft_logits[ng_at, ng_tok] = 0.0
            draft_logits = draft_logits[:dump].view(B, T, V)
        depth = [G if b in self.chain_nodes else 0 for b in range(B)]
        return Draft(tokens=tokens, parents=parents.to(torch.int32), num_nodes=num_nodes,
                     draft_logits=draft_logits, draft_warp=None if greedy else ctx.sampling,
                     src=src.to(torch.int32), depth=depth, depth_drafted=list(depth),
                     drafted_nodes=[1 + (made[act.index(b)] if depth[b] else 0) for b in range(B)])

    def draft_nodes(self, b, nodes):
        """A merged node's draft K/V sit in the draft block of the chain that created it; those of
        an accepted path are kept along the chain that made its deepest fed node, whose own nodes
        above it hold the same tokens (the chains' draft nodes are never merged)."""
        for level, row in enumerate(self.chain_nodes[b]):
            if nodes and nodes[-1] in row:
                return [self.chain_nodes[b][i][row.index(nodes[-1])] for i in range(level + 1)]
        return nodes
