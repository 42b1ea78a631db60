"""OPT-Tree (docs/methods.md §OPT-Tree: the per-layer global top-``n`` by path probability p̂,
``delta``'s stop on E_sub, the best-``n`` rooted subtree, R4 or R3p, ``sync_free`` with TSD's
default). A grammar reads each layer's tokens (its masks follow them) either way."""
import torch

from ...ops.topn import MAX_N
from .. import _kernels
from ..readback import read_lists
from ..tree import Draft
from .base import FLAG, ModelDrafter, count, optional, real, vocab_ids


class OPTTree(ModelDrafter):
    name = "opt-tree"
    description = "OPT-Tree: per-layer global top-n by path probability, best-n subtree"
    # CPU-sized n; delta 0.5 (the reference code's default) sits in [mu, 1] for a draft costing
    # about half a target step, as the int8 copy does here.
    PARAMS = {"n": 10, "delta": 0.5, "max_depth": 8, "verify": None, "sync_free": None}
    # n + 1 <= MAX_N: the final selection takes n + 1 nodes
    CHECKS = {"n": count(1, MAX_N - 1), "max_depth": count(), "delta": real(), "sync_free": optional(FLAG)}
    sampling_mode = "sample_match"
    VERIFY = ("sample_match", "mss_pointmass")
    budget_param = "max_depth"  # layers (draft forwards) per step; delta may stop earlier
    budget_cap_factor = 2

    def tree_budget(self):
        return self.n + 1

    def uses_draft_vocab(self, sampling):
        return True  # R4 / R3p read the drafted tokens, never a draft row

    def nodes(self):
        """This step's node budget: ``n``, capped under adaptive speculation (docs/methods.md §OPT-Tree)."""
        return self.n if self.adaptive_range is None else min(self.n, 2 * self.max_depth + 1)

    def draft_budget(self):
        return self.n * self.max_depth

    def propose(self, ctx):
        """Each layer's ``n`` (token, parent) pairs from ``topn_expand`` are fed back as they are (a
        sequence that goes on adds its finite entries, a prefix); the one host decision: ``delta``'s stop."""
        d, B, n = ctx.draft, ctx.batch, self.nodes()
        grammar = ctx.grammar is not None  # then every row is masked with its path's allowed tokens
        sync_free = not grammar and (self.sync_free if self.sync_free is not None else d.device.type != "cpu")
        logits, base, active = self.first_forward(ctx)  # base: the block node of the newest fed layer's first entry
        going = active = active.bool()
        logq = logits.log_softmax(-1)[:, None]  # [B, 1, V]
        layers = [_ids(d, _kernels.topn_expand(logq.new_zeros(B, 1, dtype=torch.float32), logq, n, per_parent_k=n))]
        src = [base[:, None]]  # per flat layer: each entry's draft-block node, -1 where not fed ([B, 1] the roots)
        drafted = active.long()  # [B] layers drafted: the root's, then each fed one (read when sync-free)
        depth_drafted = [int(a) for a in ctx.active]  # the same on the host (reading)
        best = gain = _esub(layers, n)  # fp64 [B]: the first layer takes E from 0 to E_sub
        paths = [[[]] for _ in range(B)] if grammar else None  # the token path of each newest-layer entry
        while len(layers) < self.max_depth:
            going = going & (gain > self.delta)
            scores, toks, par = layers[-1]
            fed = going[:, None] & scores.isfinite()  # [B, n] delta's stop: the finite entries (a prefix)
            if sync_free:
                live = [n] * B
            else:  # the one read per layer
                live = fed.sum(1)
                if grammar:
                    live, tk, pr = read_lists(live, toks, par)
                    paths = [[paths[b][max(pr[b][i], 0)] + [tk[b][i]] for i in range(n)] for b in range(B)]
                else:
                    live = read_lists(live)[0]
                if not any(live):
                    break
                depth_drafted = [x + (f > 0) for x, f in zip(depth_drafted, live)]
            rows, base = self.feed_layer(ctx, live, n, (base[:, None] + par.clamp(min=0)).reshape(-1),
                                         toks.clamp(min=0).long().reshape(-1), paths)
            src.append(torch.where(fed, base[:, None] + torch.arange(n, device=base.device), -1))
            drafted = drafted + fed.any(1)
            logq = rows.log_softmax(-1).view(B, n, -1)
            layers.append(_ids(d, _kernels.topn_expand(scores.masked_fill(~going[:, None], float("-inf")), logq, n,
                                                       per_parent_k=n)))
            esub = _esub(layers, n)
            gain = torch.where(going, esub - best, 0.0)
            best = torch.where(going, esub, best)
        if sync_free:  # the step's one read: the layers each sequence drafted
            depth_drafted = read_lists(drafted)[0]
        return self._select(ctx, layers, src, active, depth_drafted)

    def _select(self, ctx, layers, src, active, depth_drafted):
        # The drafted layers as one flat tree (root, then layer by layer: topological, shallower
        # first), then the best n nodes as a rooted subtree (select_topn_subtree), gathered on the
        # device: the Draft is built from the selection without reading it back.
        B, n, D = ctx.batch, self.nodes(), len(layers)
        sc = torch.cat([layer[0] for layer in layers], dim=1)  # [B, D * n]
        base = torch.arange(D, device=sc.device).repeat_interleave(n) * n + 1 - n  # flat index of each layer's parents
        base[:n] = 0
        pr = torch.cat([layer[2] for layer in layers], dim=1)  # [B, D * n]
        flat_par = torch.where(sc > float("-inf"), pr.clamp(min=0) + base, 0).to(torch.int32)
        parents = torch.cat([flat_par.new_full((B, 1), -1), flat_par], dim=1)  # [B, T]
        # each flat node's draft-block node (a layer-k entry was fed iff layer k + 1 was drafted from it)
        src = torch.cat(src + [src[0].new_full((B, n), -1)] * (D + 1 - len(src)), dim=1)  # [B, T]
        scores = torch.cat([sc.new_zeros(B, 1), sc], dim=1).masked_fill(~active[:, None], float("-inf"))
        keep, new_par, counts = _kernels.select_topn_subtree(parents, scores, n + 1)  # [B, n + 1] x2, [B]
        valid = torch.arange(n + 1, device=keep.device)[None, :] < counts[:, None]
        at = torch.where(valid, keep, 0).long()
        root = ctx.root[:, None]
        tokens = torch.cat([root, torch.cat([layer[1] for layer in layers], dim=1).to(root.dtype)], dim=1)
        layer_of = torch.where(at > 0, (at - 1) // n + 1, 0)
        return Draft(tokens=torch.where(valid, tokens.gather(1, at), 0), parents=torch.where(valid, new_par, 0),
                     num_nodes=counts.to(torch.int32), src=torch.where(valid, src.gather(1, at), -1).to(torch.int32),
                     depth=torch.where(valid, layer_of, 0).amax(-1), depth_drafted=depth_drafted,
                     drafted_nodes=[1 + n * d for d in depth_drafted])


def _ids(d, layer):
    """A topn_expand layer with its columns as token ids (a dead entry's -1 may read column 0's: its
    score is -inf, so it is neither fed nor selected)."""
    scores, cols, par = layer
    return scores, vocab_ids(d, cols), par


def _esub(layers, n):
    """Every sequence's E_sub: the sum of its n largest path probabilities over all layers, in fp64
    (the stop test ``gain > delta`` compares differences of these). Shape: -> fp64 [B]."""
    allscores = torch.cat([layer[0] for layer in layers], dim=1)  # [B, len(layers) * n]
    return allscores.topk(min(n, allscores.shape[1]), dim=-1).values.exp().sum(-1).double()


OptTreeDrafter = OPTTree  # the class's name before issue #32 (a public name: kept)
