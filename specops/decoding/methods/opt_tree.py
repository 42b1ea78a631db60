"""OPT-Tree (docs/methods.md §OPT-Tree): the draft tree that maximises the draft-estimated expected
acceptance length E(A) = sum of path probabilities p̂ for a node budget ``n``.

Each layer keeps exactly ``n`` nodes: the global top-``n`` (parent, token) pairs by
p̂(parent) · q(token | path) over the previous layer (``topn_expand`` in log space). Drafting stops
at ``max_depth`` or when E_sub (the sum of the ``n`` largest p̂ of all layers built so far,
the paper's definition) grows by no more than ``delta``. The target verifies the ``n`` nodes with
the largest p̂, a rooted subtree (the paper's Thm 3.1; ties go to the shallower node), ordered by depth.
Greedy: R1; sampling: R4 (``sample_match``, the reference's rule; ``verify="mss_pointmass"`` gives
the same acceptance probability).
"""
import math

import torch

from .. import _kernels
from ...ops.topn import MAX_N
from ..readback import read_lists
from ..tree import Draft
from .base import ModelDrafter, grammar_masked


class OPTTree(ModelDrafter):
    name = "opt-tree"
    description = "OPT-Tree: per-layer global top-n by path probability, best-n subtree"
    # CPU-sized n; delta 0.5 (the reference code's default) sits in [mu, 1] for a draft costing
    # about half a target step, as the int8 copy does here.
    PARAMS = {"n": 10, "delta": 0.5, "max_depth": 8, "verify": None}
    sampling_mode = "sample_match"
    budget_param = "max_depth"  # layers (draft forwards) per step; delta may stop earlier
    budget_cap_factor = 2

    def check_params(self):
        self._positive_int("n", self.n, 1, MAX_N - 1)  # the final selection takes n + 1 nodes
        self._positive_int("max_depth", self.max_depth)
        self._real("delta", self.delta)
        if self.verify is not None:
            if self.verify not in ("sample_match", "mss_pointmass"):
                raise ValueError(f"verify must be 'sample_match' or 'mss_pointmass', got {self.verify!r}")
            self.sampling_mode = self.verify

    def tree_budget(self):
        return self.n + 1

    def draft_budget(self):
        return self.n * self.max_depth

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B, n = ctx.batch, self.n
        grammar = ctx.grammar is not None  # then every row is masked with its path's allowed tokens
        logits = d.forward(rows=[(b, d.root[b]) for b in range(B)])[0]  # [B, V]
        if grammar:
            logits = grammar_masked(ctx, logits, [(b, []) for b in range(B)])
        logq = logits.log_softmax(-1)[:, None]  # [B, 1, V]
        scores, toks, par = _kernels.topn_expand(logq.new_zeros(B, 1, dtype=torch.float32), logq, n, per_parent_k=n)
        layers = [(scores, toks, par)]  # per layer: [B, n] log p̂, tokens, parent index in previous layer
        blocks = [[[d.root[b]] for b in range(B)]]  # per layer, per sequence: block node of each entry
        going = list(ctx.active)
        sc, tk, pr, best = _read_layer(layers, n)  # one host read per layer
        # Under a grammar, the token path of each entry of the newest layer (its rows' masks).
        paths = [[[tk[b][i]] for i in range(n)] for b in range(B)] if grammar else None
        gain = list(best)  # first layer: E goes from 0 to E_sub
        while len(layers) < self.max_depth:
            going = [going[b] and gain[b] > self.delta for b in range(B)]
            if not any(going):
                break
            scores = layers[-1][0]
            blk = []
            for b in range(B):
                row = []
                for i in range(n):
                    if going[b] and math.isfinite(sc[b][i]):
                        row.append(d.add(b, tk[b][i], blocks[-1][b][pr[b][i]]))
                    else:
                        row.append(-1)
                blk.append(row)
            blocks.append(blk)
            pairs = [(b, blk[b][i] if blk[b][i] >= 0 else d.first_unfed) for b in range(B) for i in range(n)]
            rows, dead = d.forward(rows=pairs, extra=[x < 0 for row in blk for x in row])
            if grammar:  # rows of unfed entries are never expanded: no grammar work for them
                rows = grammar_masked(ctx, rows, [(b, paths[b][i] if blk[b][i] >= 0 else None)
                                                    for b in range(B) for i in range(n)])
            logq = rows.log_softmax(-1).view(B, n, -1)
            dead = dead.view(B, n).bool()
            parent_scores = scores.masked_fill(dead, float("-inf"))
            layers.append(_kernels.topn_expand(parent_scores, logq, n, per_parent_k=n))
            sc, tk, pr, esub = _read_layer(layers, n)
            if grammar:
                paths = [[paths[b][pr[b][i]] + [tk[b][i]] for i in range(n)] for b in range(B)]
            for b in range(B):
                if going[b]:
                    gain[b], best[b] = esub[b] - best[b], esub[b]
                else:
                    gain[b] = 0.0
        return self._select(ctx, layers, blocks)

    def _select(self, ctx, layers, blocks):
        # The drafted layers as one flat tree (root, then layer by layer: topological, shallower
        # first), then the best n nodes as a rooted subtree (select_topn_subtree), gathered on the
        # device: the Draft is built from the selection without reading it back.
        B, n, D = ctx.batch, self.n, len(layers)
        T = 1 + D * n
        sc = torch.cat([layer[0] for layer in layers], dim=1)  # [B, D * n]
        base = torch.arange(D, device=sc.device).repeat_interleave(n) * n + 1 - n  # flat index of each layer's parents
        base[:n] = 0
        pr = torch.cat([layer[2] for layer in layers], dim=1)  # [B, D * n]
        flat_par = torch.where(sc > float("-inf"), pr.clamp(min=0) + base, 0).to(torch.int32)
        parents = torch.cat([flat_par.new_full((B, 1), -1), flat_par], dim=1)  # [B, T]
        # The host's part in one upload: which sequences draft, and each flat node's draft-block node.
        src_host = []
        for b in range(B):
            src_host.append(ctx.draft.root[b])
            for k in range(D):  # a layer-k node was fed iff layer k+1 was drafted from it
                src_host += blocks[k + 1][b] if k + 1 < len(blocks) else [-1] * n
        up = ctx.stager.upload([int(a) for a in ctx.active] + src_host)
        active = up[:B].bool()
        scores = torch.cat([sc.new_zeros(B, 1), sc], dim=1).masked_fill(~active[:, None], float("-inf"))
        keep, new_par, counts = _kernels.select_topn_subtree(parents, scores, n + 1)  # [B, n + 1] x2, [B]
        valid = torch.arange(n + 1, device=keep.device)[None, :] < counts[:, None]
        at = torch.where(valid, keep, 0).long()
        root = ctx.root[:, None]
        tokens = torch.cat([root, torch.cat([layer[1] for layer in layers], dim=1).to(root.dtype)], dim=1)
        layer_of = torch.where(at > 0, (at - 1) // n + 1, 0)
        depth_drafted = [1 + sum(1 for k in range(1, len(blocks)) if any(x >= 0 for x in blocks[k][b]))
                         if ctx.active[b] else 0 for b in range(B)]
        return Draft(tokens=torch.where(valid, tokens.gather(1, at), 0), parents=torch.where(valid, new_par, 0),
                     num_nodes=counts.to(torch.int32),
                     src=torch.where(valid, up[B:].view(B, T).gather(1, at), -1).to(torch.int32),
                     depth=torch.where(valid, layer_of, 0).amax(-1), depth_drafted=depth_drafted,
                     drafted_nodes=[1 + n * d for d in depth_drafted])


def _read_layer(layers, n):
    """The newest layer's scores, tokens and parent indices ([B, n] each) and every sequence's
    E_sub (the sum of its n largest path probabilities over all layers, [B]): one host read."""
    sc, tk, pr = layers[-1]
    allscores = torch.cat([l[0] for l in layers], dim=1)  # [B, len(layers) * n]
    esub = allscores.topk(min(n, allscores.shape[1]), dim=-1).values.exp().sum(-1)
    return read_lists(sc, tk, pr, esub)


OptTreeDrafter = OPTTree  # the class's name before issue #32 (a public name: kept)
