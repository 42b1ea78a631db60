"""TSD (docs/methods.md §TSD), and the drafting GSD shares with it (gsd.py).

Each drafting step runs the draft model once on the frontier (tree attention over the growing
draft block, positions = prefix + depth), takes the top-``k`` children of every frontier node by
the draft's probability ``q``, drops children with ``q < theta_sib * max q`` (sibling pruning) and
stops expanding children with ``q < theta_prob`` (probability pruning, with the paper's leaf
semantics); drafting ends after ``max_depth`` steps or when the frontier is empty (draft-exit).
``max_nodes`` caps the draft tree (TSD can explode). ``tau`` (None here) merges repeated nodes
into a graph: that is GSD (gsd.py), which drafts with this class's search.
"""
from ..readback import read_lists
from ..sampling import SamplingConfig
from ..token_graph import TokenGraph
from ..tree import Candidates
from .base import ModelDrafter, grammar_masked

_SOFTMAX = SamplingConfig(1.0)  # the warp of TSD's q: temperature 1, no top-k / top-p


class TSD(ModelDrafter):
    name = "tsd"
    description = "tree SD: top-k tree with probability and sibling pruning"
    # k and the thresholds are the paper's 70B setting; depth and caps are CPU-sized (paper: 10, 100).
    PARAMS = {"k": 4, "max_depth": 5, "theta_prob": 0.2, "theta_sib": 0.3, "max_nodes": 24,
              "max_tree_nodes": 32, "tau": None, "verify": None}
    sampling_mode = "mss_pointmass"
    budget_param = "max_depth"  # draft forwards per step; max_nodes still caps the tree
    budget_cap_factor = 2  # 10 = the paper's depth

    def check_params(self):
        self._positive_int("k", self.k)
        self._positive_int("max_depth", self.max_depth)
        self._fraction("theta_prob", self.theta_prob)
        self._fraction("theta_sib", self.theta_sib)
        self._positive_int("max_nodes", self.max_nodes, 2)
        self._positive_int("max_tree_nodes", self.max_tree_nodes, 2)
        if self.tau is not None:
            self._positive_int("tau", self.tau, 0)
        # Top-k children are deterministic, not draws from q: R3/R3w would not be lossless here.
        allowed = ("mss_pointmass", "sample_match", "gsd")
        if self.verify is not None and self.verify not in allowed:
            raise ValueError(f"verify must be one of {allowed} (the rule used when sampling), got {self.verify!r}")
        if self.verify is not None:
            self.sampling_mode = self.verify
        self.lossless = self.sampling_mode != "gsd"

    def tree_budget(self):
        return self.max_tree_nodes

    def draft_budget(self):
        return self.max_nodes

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B = ctx.batch
        graphs = [TokenGraph(ctx.seqs[b][-1], self.tau) for b in range(B)]
        blk = [{0: d.root[b]} for b in range(B)]  # graph node -> draft-block node (fed or to be fed)
        qrow = [{} for _ in range(B)]  # graph node -> the draft logits after it (R5 tests its children on them)
        frontier = [[0] if ctx.active[b] else [] for b in range(B)]
        depth = [0] * B
        keep_rows = not ctx.sampling.greedy and self.sampling_mode == "gsd"
        for step in range(self.max_depth):
            if not any(frontier):
                break
            pairs = [(b, blk[b][u]) for b in range(B) for u in frontier[b]]
            logits = d.forward(rows=pairs)[0]  # [len(pairs), V]
            if ctx.grammar is not None:  # each node's path: its real parents up to the root
                paths = [(b, [graphs[b].token[x] for x in reversed(graphs[b].path(u))][1:])
                         for b in range(B) for u in frontier[b]]
                logits = grammar_masked(ctx, logits, paths)
            probs = logits.softmax(-1)
            top_q, top_t = probs.topk(min(self.k, probs.shape[-1]), dim=-1)
            top_q, top_t = read_lists(top_q, top_t)  # one host read per draft forward
            j = 0
            last = step == self.max_depth - 1
            for b in range(B):
                g, nxt = graphs[b], []
                if frontier[b]:
                    depth[b] += 1
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
        return self._unmerged(ctx, graphs, blk, qrow, depth, keep_rows)

    def _unmerged(self, ctx, graphs, blk, qrow, depth, keep_rows):
        tokens, parents, src, copied, rows = [], [], [], [], []
        for b, g in enumerate(graphs):
            tok, par, gsrc, cp = g.unmerge(self.max_tree_nodes, self.max_depth)
            tokens.append(tok)
            parents.append(par)
            copied.append(cp)
            src.append([-1 if cp[i] else blk[b].get(gsrc[i], -1) for i in range(len(tok))])
            if keep_rows:  # every child's graph parent was expanded, so has a row (a copy: its first occurrence's)
                rows.append([None] + [qrow[b][g.parent[gsrc[i]]] for i in range(1, len(tok))])
        # q = the softmax of the draft's logits (top-k children by it): warped at temperature 1
        return Candidates(tokens=tokens, parents=parents, src=src, copied=copied, depth_drafted=depth,
                          drafted_nodes=[len(g) for g in graphs], draft_logits=rows if keep_rows else None,
                          draft_warp=_SOFTMAX).stage(ctx.stager, ctx.vocab_size)


TopKTreeDrafter = TSD  # the class's name before issue #32 (a public name: kept)
