"""TSD (docs/methods.md §TSD: top-k children per frontier node, sibling and probability pruning, the
node cap, ``sync_free`` and why its default differs on a CPU) and the drafting GSD shares (gsd.py:
``tau`` set). The tree grows on the device, node for node as the host search (``grow_on_host``, one
read per draft forward) grows it; GSD's merge, a grammar's masks and R5's kept rows need the latter."""
import itertools

import torch

from ..readback import read_lists
from ..sampling import SamplingConfig
from ..token_graph import TokenGraph
from ..tree import Candidates, Draft
from .base import (
    FLAG,
    ModelDrafter,
    count,
    fraction,
    grammar_masked,
    optional,
    vocab_ids,
)

_SOFTMAX = SamplingConfig(1.0)  # the warp of TSD's q: temperature 1, no top-k / top-p


class TSD(ModelDrafter):
    name = "tsd"
    description = "tree SD: top-k tree with probability and sibling pruning"
    # k and the thresholds are the paper's 70B setting; depth and caps are CPU-sized (paper: 10, 100).
    PARAMS = {"k": 4, "max_depth": 5, "theta_prob": 0.2, "theta_sib": 0.3, "max_nodes": 24,
              "max_tree_nodes": 32, "tau": None, "verify": None, "sync_free": None}
    CHECKS = {"k": count(), "max_depth": count(), "theta_prob": fraction(), "theta_sib": fraction(),
              "max_nodes": count(2), "max_tree_nodes": count(2), "tau": optional(count(0)),
              "sync_free": optional(FLAG)}
    sampling_mode = "mss_pointmass"
    # Top-k children are deterministic, not draws from q: R3/R3w would not be lossless here.
    VERIFY = ("mss_pointmass", "sample_match", "gsd")
    budget_param = "max_depth"  # draft forwards per step; max_nodes still caps the tree
    budget_cap_factor = 2  # 10 = the paper's depth

    def tree_budget(self):
        return self.max_tree_nodes

    def uses_draft_vocab(self, sampling):
        return sampling.greedy or self.sampling_mode != "gsd"  # R5 sampled keeps the draft rows

    def draft_budget(self):
        # a sync-free search feeds its layers at their widest, padding included (None: it may)
        padded = 1 + sum(frontier_widths(self.k, self.max_nodes, self.max_depth)) if self.sync_free is not False else 0
        return max(self.max_nodes, padded)

    def propose(self, ctx):
        keep_rows = not ctx.sampling.greedy and self.sampling_mode == "gsd"
        if self.tau is None and ctx.grammar is None and not keep_rows:
            return self.grow_on_device(ctx)
        return self.grow_on_host(ctx)

    def grow_on_device(self, ctx):
        """TSD's search on the device. Graph nodes are numbered in creation order (BFS, siblings best
        first), the host search's unmerged tree's order, so the first ``max_tree_nodes`` are the
        target's tree. Reading, each count sizes the next forward's block (``DraftLM`` keeps node
        counts on the host). Shape: -> Draft with T = min(largest tree, max_tree_nodes)."""
        d, B, M = ctx.draft, ctx.batch, self.max_nodes
        sync_free = self.sync_free if self.sync_free is not None else d.device.type != "cpu"
        widths = frontier_widths(self.k, M, self.max_depth) if sync_free else None
        logits, roots, live_dev = self.first_forward(ctx)  # live_dev [B]: frontier sizes (the active roots)
        dev = roots.device
        fblk = roots[:, None]  # [B, W] the draft-block node of each frontier entry (valid: a prefix of live)
        fidx = torch.zeros(B, 1, dtype=torch.int64, device=dev)  # [B, W] graph node of each frontier entry
        # The graph in creation order, [B, M + 1]: column 0 the root, column M takes what the cap drops
        # (a parent is written before the tree reads it).
        gtok = torch.cat([ctx.root[:, None], ctx.root.new_zeros(B, M)], 1)
        gpar = torch.full((B, M + 1), -1, dtype=torch.int64, device=dev)
        gsrc = torch.cat([roots[:, None], torch.full_like(gpar[:, 1:], -1)], 1)
        count = torch.ones(B, dtype=torch.int64, device=dev)
        live = [int(a) for a in ctx.active]
        layer_sizes = [[1] * B]  # sizes after each layer (Draft.depth of the truncated tree)
        depth_drafted = list(live)
        counts, fed_layers = [count], live_dev  # sync-free: the per-layer counts, read at the end
        for step in range(self.max_depth):
            W = fidx.shape[1]
            probs = logits.softmax(-1)
            top_q, top_t = probs.topk(min(self.k, probs.shape[-1]), dim=-1)  # [B * W, K]
            top_t = vocab_ids(d, top_t)
            K = top_q.shape[-1]
            # fp64 as the host search compared (Python floats of the fp32 probabilities)
            top_q = top_q.double().view(B, W * K)
            best = top_q.view(B, W, K)[..., :1].expand(B, W, K).reshape(B, W * K)
            entry = torch.arange(W * K, device=dev) // K  # [W * K] the frontier entry of each candidate
            cand = (entry[None] < live_dev[:, None]) & (top_q >= self.theta_sib * best)  # sibling pruning
            pos = count[:, None] + cand.cumsum(1) - 1  # graph node each candidate becomes
            keep = cand & (pos < M)  # the node cap, in creation order
            at = torch.where(keep, pos, M)
            gtok.scatter_(1, at, top_t.view(B, W * K).to(gtok.dtype))
            gpar.scatter_(1, at, fidx.gather(1, entry[None].expand(B, W * K)))
            count = count + keep.sum(1)
            grow = keep & (top_q >= self.theta_prob) if step < self.max_depth - 1 else torch.zeros_like(keep)
            nlive = grow.sum(1)
            if sync_free:
                counts.append(count)
                if step >= len(widths):  # no frontier can be this deep: nothing grows
                    break
                W2 = widths[step]
                fed_layers = fed_layers + (nlive > 0)
            else:  # the one read per layer: the new frontier's and the tree's sizes
                live, sizes = read_lists(nlive, count)
                layer_sizes.append(sizes)
                if not any(live):
                    break
                W2 = max(live)
                depth_drafted = [x + (n > 0) for x, n in zip(depth_drafted, live)]
            # The new frontier: the growing candidates, a prefix in creation order (column W2: the rest).
            # Per entry its graph node, token and parent's frontier entry (all int64).
            slot = torch.where(grow, grow.cumsum(1) - 1, W2)[None].expand(3, B, W * K)
            cands = torch.stack([pos, top_t.view(B, W * K), entry[None].expand(B, W * K)])  # [3, B, W * K]
            nfidx, ntok, pentry = torch.zeros(3, B, W2 + 1, dtype=torch.int64, device=dev).scatter_(
                2, slot, cands)[..., :W2].unbind()  # [B, W2] each
            pblk = fblk.gather(1, pentry)  # [B, W2] the parent's draft-block node (padding: entry 0's)
            logits, firstd = self.feed_layer(ctx, [W2] * B if sync_free else live, W2, pblk.reshape(-1),
                                             ntok.reshape(-1))  # sync-free: every sequence feeds W2
            live_dev, fidx = nlive, nfidx
            fblk = firstd[:, None] + torch.arange(W2, device=dev)[None]  # consecutive nodes per sequence
            fed = torch.arange(W2, device=dev)[None] < nlive[:, None]
            gsrc.scatter_(1, torch.where(fed, nfidx, M), fblk)
        if sync_free:  # the step's one read: every layer's tree sizes and the drafting depths
            layer_sizes, depth_drafted = read_lists(torch.stack(counts), fed_layers)
        # The target's tree: the first max_tree_nodes graph nodes (parents precede children).
        cap, sizes = self.max_tree_nodes, layer_sizes[-1]
        T = min(max(sizes), cap)
        valid = torch.arange(T, device=dev)[None] < count[:, None]
        # tree depth = the layers that added a node within the first ``cap`` nodes
        depth = [sum(before[b] < min(after[b], cap) for before, after in itertools.pairwise(layer_sizes))
                 for b in range(B)]
        return Draft(tokens=torch.where(valid, gtok[:, :T], 0),
                     parents=torch.where(valid, gpar[:, :T], 0).to(torch.int32),
                     num_nodes=count.clamp(max=cap).to(torch.int32),
                     src=torch.where(valid, gsrc[:, :T], -1).to(torch.int32), depth=depth,
                     depth_drafted=depth_drafted, drafted_nodes=list(sizes))

    def grow_on_host(self, ctx):
        """The search on host lists (GSD's merge needs them; a grammar's masks and R5's kept rows follow the
        tokens): one read per draft forward (the frontier's top-k), the tree staged in one upload."""
        d, B = ctx.draft, ctx.batch
        d.begin(ctx.seqs, ctx.active)
        graphs = [TokenGraph(ctx.seqs[b][-1], self.tau) for b in range(B)]
        blk = [{0: d.root[b]} for b in range(B)]  # graph node -> draft-block node (fed or to be fed)
        qrow = [{} for _ in range(B)]  # graph node -> the draft logits after it (R5 tests its children on them)
        frontier = [[0] if ctx.active[b] else [] for b in range(B)]
        depth = [0] * B
        keep_rows = not ctx.sampling.greedy and self.sampling_mode == "gsd"
        for step in range(self.max_depth):
            if not any(frontier):
                break
            logits = d.forward(rows=[(b, blk[b][u]) for b in range(B) for u in frontier[b]])[0]
            if ctx.grammar is not None:  # each node's path: its real parents up to the root
                paths = [(b, [graphs[b].token[x] for x in reversed(graphs[b].path(u))][1:])
                         for b in range(B) for u in frontier[b]]
                logits = grammar_masked(ctx, logits, paths)
            probs = logits.softmax(-1)
            top_q, top_t = probs.topk(min(self.k, probs.shape[-1]), dim=-1)
            top_q, top_t = read_lists(top_q, vocab_ids(d, top_t))  # the one read
            j = 0
            last = step == self.max_depth - 1
            for b in range(B):
                g, nxt = graphs[b], []
                depth[b] += bool(frontier[b])
                for u in frontier[b]:
                    if keep_rows:
                        qrow[b][u] = logits[j]
                    qs, ts = top_q[j], top_t[j]
                    j += 1
                    for q, t in zip(qs, ts):
                        if q < self.theta_sib * qs[0]:
                            break  # sorted: every later sibling is pruned too
                        v = g.find_redundant(u, t)
                        if v is not None:
                            g.merge(u, v)
                            continue
                        if len(g) >= self.max_nodes:
                            break
                        c = g.add(u, t)
                        if q >= self.theta_prob and not last:
                            blk[b][c] = d.add(b, t, blk[b][u])
                            nxt.append(c)
                frontier[b] = nxt
        trees = [g.unmerge(self.max_tree_nodes, self.max_depth) for g in graphs]
        tokens, parents, gsrc, copied = (list(field) for field in zip(*trees))
        src = [[-1 if cp else blk[b].get(s, -1) for s, cp in zip(gsrc[b], copied[b])] for b in range(B)]
        rows = None
        if keep_rows:  # every child's graph parent was expanded, so it has a row (a copy: the original's)
            rows = [[None] + [qrow[b][g.parent[s]] for s in gsrc[b][1:]] for b, g in enumerate(graphs)]
        # q = the softmax of the draft's logits (top-k children by it): warped at temperature 1
        return Candidates(tokens=tokens, parents=parents, src=src, copied=copied, depth_drafted=depth,
                          drafted_nodes=[len(g) for g in graphs], draft_logits=rows,
                          draft_warp=_SOFTMAX).stage(ctx.stager, ctx.vocab_size)


def frontier_widths(k, max_nodes, max_depth):
    """The most entries TSD's frontier can hold after layers 1 .. max_depth - 1, ending where none can:
    the sync-free search's layer widths (docs/methods.md §TSD; k=4, 24 nodes, depth 5: [4, 16, 16, 16])."""
    out = []
    for layer in range(1, max_depth):
        w = min(k ** layer, max_nodes - 1)
        while w and sum(-(-w // k ** j) for j in range(layer)) > max_nodes - 1:
            w -= 1
        if not w:
            break
        out.append(w)
    return out
