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
from ..tree import Candidates
from .base import ModelDrafter


class OptTreeDrafter(ModelDrafter):
    name = "opt-tree"
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

    def propose(self, state):
        d = state.draft
        d.begin(state.seqs, state.active)
        B, n = state.batch, self.n
        d.forward()
        logq = d.logits_rows([(b, d.root[b]) for b in range(B)]).log_softmax(-1)[:, None]  # [B, 1, V]
        scores, toks, par = _kernels.topn_expand(torch.zeros(B, 1), logq, n, per_parent_k=n)
        layers = [(scores, toks, par)]  # per layer: [B, n] log p̂, tokens, parent index in previous layer
        blocks = [[[d.root[b]] for b in range(B)]]  # per layer, per sequence: block node of each entry
        going = list(state.active)
        sc, tk, pr, best = _read_layer(layers, n)  # one host read per layer
        host_tk = [tk]  # per layer: the tokens as host lists (for _select)
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
            d.forward()
            pairs = [(b, blk[b][i] if blk[b][i] >= 0 else d.first_row_node) for b in range(B) for i in range(n)]
            logq = d.logits_rows(pairs).log_softmax(-1).view(B, n, -1)
            dead = torch.tensor([[blk[b][i] < 0 for i in range(n)] for b in range(B)])
            parent_scores = scores.masked_fill(dead, float("-inf"))
            layers.append(_kernels.topn_expand(parent_scores, logq, n, per_parent_k=n))
            sc, tk, pr, esub = _read_layer(layers, n)
            host_tk.append(tk)
            for b in range(B):
                if going[b]:
                    gain[b], best[b] = esub[b] - best[b], esub[b]
                else:
                    gain[b] = 0.0
        return self._select(state, layers, blocks, host_tk)

    def _select(self, state, layers, blocks, tk):
        # The drafted layers as one flat tree (root, then layer by layer: topological, shallower
        # first), then the best n nodes as a rooted subtree (select_topn_subtree).
        B, n = state.batch, self.n
        D = len(layers)
        T = 1 + D * n
        scores = torch.full((B, T), float("-inf"))
        parents = torch.zeros(B, T, dtype=torch.int32)
        parents[:, 0] = -1
        for k, (sc, _, pr) in enumerate(layers):
            scores[:, 1 + k * n: 1 + (k + 1) * n] = sc
            base = 0 if k == 0 else 1 + (k - 1) * n
            parents[:, 1 + k * n: 1 + (k + 1) * n] = torch.where(sc > float("-inf"), pr.clamp(min=0) + base, 0)
        scores[:, 0] = 0.0
        scores[torch.tensor([not a for a in state.active])] = float("-inf")
        keep, new_par, counts = _kernels.select_topn_subtree(parents, scores, n + 1)
        keep, new_par, counts = read_lists(keep, new_par, counts)
        tokens, par_out, src, depth_drafted = [], [], [], []
        for b in range(B):
            tok, par, sr = [state.seqs[b][-1]], [-1], [state.draft.root[b]]
            for j in range(1, counts[b]):
                k, i = divmod(keep[b][j] - 1, n)
                tok.append(tk[k][b][i])
                par.append(new_par[b][j])
                # a layer-k node was fed iff layer k+1 was drafted from it
                fed = k + 1 < len(blocks) and blocks[k + 1][b][i] >= 0
                sr.append(blocks[k + 1][b][i] if fed else -1)
            tokens.append(tok)
            par_out.append(par)
            src.append(sr)
            drafted = 1 + sum(1 for k in range(1, len(blocks)) if any(x >= 0 for x in blocks[k][b]))
            depth_drafted.append(drafted if state.active[b] else 0)
        return Candidates(tokens=tokens, parents=par_out, src=src, depth_drafted=depth_drafted,
                          drafted_nodes=[1 + n * d for d in depth_drafted])


def _read_layer(layers, n):
    """The newest layer's scores, tokens and parent indices ([B, n] each) and every sequence's
    E_sub (the sum of its n largest path probabilities over all layers, [B]): one host read."""
    sc, tk, pr = layers[-1]
    allscores = torch.cat([l[0] for l in layers], dim=1)  # [B, len(layers) * n]
    esub = allscores.topk(min(n, allscores.shape[1]), dim=-1).values.exp().sum(-1)
    return read_lists(sc, tk, pr, esub)
