"""MJSD (docs/methods.md §MJSD): a beam-search draft verified by joint likelihood (R6), approximate by
design (it aims at lower perplexity than greedy decoding, not at the target's distribution). The beams
grow as a tree in the draft block; a dead beam (score -inf) is never expanded. The joint test's warp:
the paper's App. D (top-k 20, top-p 0.9); ``tau = 1`` never accepts (target only), ``tau = 0`` accepts all."""
import math

import torch

from ...ops.topn import MAX_N
from .. import _kernels
from ..readback import read_lists
from ..sampling import SamplingConfig
from ..tree import Draft
from .base import ModelDrafter, count, fraction, vocab_ids


class MJSD(ModelDrafter):
    name = "mjsd"
    description = "multi-token joint SD: beam-search draft, joint-likelihood acceptance (approximate)"
    PARAMS = {"gamma": 4, "beams": 8, "tau": 0.1, "joint_top_k": 20, "joint_top_p": 0.9}
    CHECKS = {"gamma": count(), "beams": count(1, MAX_N), "tau": fraction(), "joint_top_k": count(0),
              "joint_top_p": fraction(0, 1, open_lo=True)}
    sampling_mode = "joint"
    budget_param = "gamma"

    def uses_draft_vocab(self, sampling):
        return True  # R6 reads the beams' scores, never a draft row

    def check_params(self):
        super().check_params()
        self.joint = SamplingConfig(1.0, self.joint_top_k, self.joint_top_p)

    def verify_mode(self, sampling):
        return "joint"

    def tree_budget(self):
        return self.gamma + 1

    def draft_budget(self):
        return self.beams * self.gamma

    def _logq(self, logits):
        """Shape: [N, V] -> fp32 [N, V], log of the joint test's warp (-inf where it is 0). Only positive
        entries go through ``log`` (torch's CPU log is ~40x slower on zeros, which fill a warped row: 8 beams'
        rows took ~4 ms); below the smallest normal float they read as it (log ~ -87.3)."""
        p = self.joint.warp(logits)
        zero = p <= 0
        return p.clamp_min_(torch.finfo(p.dtype).tiny).log_().masked_fill_(zero, float("-inf"))

    def propose(self, ctx):
        """Every layer's ``beams`` (token, parent) pairs from ``topn_expand`` are fed back as they are
        (the block's layout is known on the host) and the best beam is traced back on the device:
        drafting reads nothing. A grammar reads each layer (its masks follow the beams' tokens)."""
        d, B, M = ctx.draft, ctx.batch, self.beams
        grammar = ctx.grammar is not None  # then every row is masked with its beam's allowed tokens
        logits, roots, active = self.first_forward(ctx)  # [B, V], or [B, Vd] over d.vocab_keep
        logq = self._logq(logits)[:, None]  # [B, 1, V]
        start = logq.new_zeros(B, 1, dtype=torch.float32).masked_fill(~active.bool()[:, None], float("-inf"))
        # per layer: [B, M] scores, tokens (ids: a draft-vocabulary column mapped through vocab_keep), parents
        layers = [self._ids(d, _kernels.topn_expand(start, logq, M, per_parent_k=M))]
        host = read_lists(*layers[-1]) if grammar else None
        paths = [[[host[1][b][i]] for i in range(M)] for b in range(B)] if grammar else None  # newest beams
        bases = []  # per fed layer: [B] the block node of its first beam
        for k in range(1, self.gamma):
            scores, toks, par = layers[-1]
            # Layer k - 1's beam i sits at block node base + i below the root (k = 1) or layer k - 2's
            # beam par[i]. Every beam is fed, or under a grammar its finite ones (a prefix: best first).
            live = [(sum(map(math.isfinite, host[0][b])) if grammar else M) if ctx.active[b] else 0
                    for b in range(B)]
            parents = ([d.root[b] for b in range(B) for _ in range(live[b])] if k == 1
                       else (bases[-1][:, None] + par.clamp(min=0)).reshape(-1))
            # a beam not fed takes any computed row (its score is -inf: never expanded)
            rows, base = self.feed_layer(ctx, live, M, parents, toks.clamp(min=0).long().reshape(-1), paths)
            bases.append(base)
            logq = self._logq(rows).view(B, M, -1)
            layers.append(self._ids(d, _kernels.topn_expand(scores, logq, M, per_parent_k=M)))
            if grammar:
                host = read_lists(*layers[-1])
                paths = [[paths[b][host[2][b][i]] + [host[1][b][i]] for i in range(M)] for b in range(B)]
        return self._best_beam(ctx, layers, roots, bases)

    @staticmethod
    def _ids(d, layer):
        """A layer with its columns as token ids (a dead beam's -1 may read column 0: its score is
        -inf, so it is never fed or expanded)."""
        scores, cols, par = layer
        return scores, vocab_ids(d, cols), par

    def _best_beam(self, ctx, layers, roots, bases):
        """The deepest layer's best beam traced back on the device: a chain with its draft-block nodes
        and per-prefix joint log-probs ``log q_{1:j}`` (the scores). Shape: -> Draft, T = gamma + 1."""
        B, g, M = ctx.batch, self.gamma, self.beams
        # Layers are sorted best first, so a layer's best beam is its first; -inf beams only have
        # -inf children, so the layers with a finite beam are a prefix.
        dev = roots.device
        scores = torch.stack([layer[0] for layer in layers], 1)  # [B, g, M]
        last = scores[:, :, 0].isfinite().sum(1) - 1  # [B], -1: none
        # The path's beam in each layer, chased down from the deepest (a beam past `last`: 0, unused);
        # then every layer's token, score and draft-block node in one gather each.
        cur = [torch.zeros(B, 1, dtype=torch.int64, device=dev)]
        for k in range(g - 1, 0, -1):
            cur.append(torch.where((k <= last)[:, None], layers[k][2].gather(1, cur[-1]).long().clamp(min=0), 0))
        cur = torch.cat(cur[::-1], 1)  # [B, g]
        on = torch.arange(g, device=dev)[None] <= last[:, None]  # [B, g]
        toks = torch.stack([layer[1].long() for layer in layers], 1)  # [B, g, M]
        tok = torch.where(on, toks.gather(2, cur[..., None])[..., 0], 0)
        log_q = torch.where(on, scores.gather(2, cur[..., None])[..., 0], 0.0)
        fed = torch.full_like(cur, -1)  # the last layer is never fed
        if g > 1:
            fed[:, :-1] = torch.stack(bases, 1) + cur[:, :-1]
        src = torch.where(on, fed, 0)
        num_nodes = (last + 2).to(torch.int32)
        ar = torch.arange(g + 1, device=roots.device)
        valid = ar < num_nodes[:, None]  # [B, g + 1]
        return Draft(tokens=torch.cat([ctx.root[:, None], tok], 1), num_nodes=num_nodes,
                     parents=torch.where(valid, ar - 1, 0).to(torch.int32),
                     src=torch.cat([roots[:, None], src], 1).to(torch.int32), depth=last + 1,
                     depth_drafted=[g if a else 0 for a in ctx.active],
                     drafted_nodes=[1 + M * g if a else 1 for a in ctx.active],
                     log_q_joint=log_q, joint_tau=self.tau,
                     joint_warp=(1.0, self.joint_top_k, self.joint_top_p))
