"""MJSD (docs/methods.md §MJSD): a beam-search draft verified by joint likelihood (R6). Approximate
by design: it aims at lower perplexity than greedy decoding, not at the target's distribution.

Beam search runs inside the draft block as a tree (not as B x beams rows whose K/V get reordered):
each step feeds the surviving beams and keeps the global top-``beams`` (beam, token) pairs by
cumulative warped draft log-prob (``topn_expand``); no KV is copied until the final path is known.
The highest-scoring final beam is proposed as a chain with its per-prefix joint log-probs
``log q_{1:j}``. Both ``p`` and ``q`` use MJSD's own warp for the joint test (temperature 1,
top-``joint_top_k`` then top-``joint_top_p``; the paper's App. D: 20 and 0.9); the bonus token uses
the generation's sampling config (argmax when greedy). ``tau = 1`` never accepts (target-only
decoding); ``tau = 0`` accepts all.
"""
import math

import torch

from .. import _kernels
from ...ops.topn import MAX_N
from ..readback import read_lists
from ..sampling import SamplingConfig
from ..tree import Candidates
from .base import ModelDrafter, grammar_masked


class MJSD(ModelDrafter):
    name = "mjsd"
    description = "multi-token joint SD: beam-search draft, joint-likelihood acceptance (approximate)"
    PARAMS = {"gamma": 4, "beams": 8, "tau": 0.1, "joint_top_k": 20, "joint_top_p": 0.9}
    sampling_mode = "joint"
    lossless = False
    budget_param = "gamma"

    def check_params(self):
        self._positive_int("gamma", self.gamma)
        self._positive_int("beams", self.beams, 1, MAX_N)
        self._fraction("tau", self.tau)
        self._positive_int("joint_top_k", self.joint_top_k, 0)
        p = self.joint_top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"joint_top_p must be a number in (0, 1], got {p!r}")
        self.joint = SamplingConfig(1.0, self.joint_top_k, self.joint_top_p)

    def verify_mode(self, sampling):
        return "joint"

    def tree_budget(self):
        return self.gamma + 1

    def draft_budget(self):
        return self.beams * self.gamma

    def _logq(self, logits):
        return self.joint.warp(logits).clamp_min(0).log()

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B, M = ctx.batch, self.beams
        grammar = ctx.grammar is not None  # then every row is masked with its beam's allowed tokens
        logits = d.forward(rows=[(b, d.root[b]) for b in range(B)])[0]  # [B, V]
        if grammar:
            logits = grammar_masked(ctx, logits, [(b, []) for b in range(B)])
        logq = self._logq(logits)[:, None]  # [B, 1, V]
        layers = [_kernels.topn_expand(logq.new_zeros(B, 1, dtype=torch.float32), logq, M, per_parent_k=M)]
        blocks = [[[d.root[b]] for b in range(B)]]  # blocks[k+1][b][i]: block node of layers[k] beam i
        host = [read_lists(*layers[-1])]  # per layer: (scores, tokens, parents) as host lists, one read each
        # Under a grammar, the token path of each beam of the newest layer (its rows' masks).
        paths = [[[host[0][1][b][i]] for i in range(M)] for b in range(B)] if grammar else None
        for _ in range(1, self.gamma):
            scores = layers[-1][0]
            sc, tk, pr = host[-1]
            blk = [[d.add(b, tk[b][i], blocks[-1][b][pr[b][i]])
                    if ctx.active[b] and math.isfinite(sc[b][i]) else -1 for i in range(M)]
                   for b in range(B)]
            blocks.append(blk)
            pairs = [(b, blk[b][i] if blk[b][i] >= 0 else d.first_unfed) for b in range(B) for i in range(M)]
            rows, dead = d.forward(rows=pairs, extra=[x < 0 for row in blk for x in row])
            if grammar:  # rows of unfed beams are never expanded: no grammar work for them
                rows = grammar_masked(ctx, rows, [(b, paths[b][i] if blk[b][i] >= 0 else None)
                                                    for b in range(B) for i in range(M)])
            logq = self._logq(rows).view(B, M, -1)
            dead = dead.view(B, M).bool()
            layers.append(_kernels.topn_expand(scores.masked_fill(dead, float("-inf")), logq, M, per_parent_k=M))
            host.append(read_lists(*layers[-1]))
            if grammar:
                _, tk, pr = host[-1]
                paths = [[paths[b][pr[b][i]] + [tk[b][i]] for i in range(M)] for b in range(B)]
        return self._best_beam(ctx, layers, host, blocks)

    def _best_beam(self, ctx, layers, host, blocks):
        B, g, M = ctx.batch, self.gamma, self.beams
        sc, tk, pr = ([layer[i] for layer in host] for i in range(3))
        tokens, src, picks = [], [], []  # picks: per sequence, g columns of the flat score table
        for b in range(B):
            chain_tok, chain_src = [ctx.seqs[b][-1]], [ctx.draft.root[b]]
            path = []
            if ctx.active[b]:
                # deepest layer with a finite beam, then its best beam
                k = max((k for k in range(g) if any(math.isfinite(x) for x in sc[k][b])), default=-1)
                if k >= 0:
                    i = max(range(len(sc[k][b])), key=lambda j: sc[k][b][j])
                    for kk in range(k, -1, -1):
                        path.append((kk, i))
                        i = pr[kk][b][i]
                    path.reverse()
                for kk, i in path:
                    chain_tok.append(tk[kk][b][i])
                    fed = kk + 1 < len(blocks) and blocks[kk + 1][b][i] >= 0
                    chain_src.append(blocks[kk + 1][b][i] if fed else -1)
            picks += [kk * M + i for kk, i in path] + [len(layers) * M] * (g - len(chain_tok) + 1)
            tokens.append(chain_tok)
            src.append(chain_src)
        # log q_{1:j} gathered on the device from the layers' scores (the last column: 0 = padding)
        table = torch.cat([layer[0] for layer in layers] + [layers[0][0].new_zeros(B, 1)], dim=1)
        log_q = table.gather(1, ctx.stager.upload(picks).view(B, g))
        cand = Candidates(tokens=tokens, parents=[[-1] + list(range(len(t) - 1)) for t in tokens], src=src,
                          depth_drafted=[g if ctx.active[b] else 0 for b in range(B)],
                          drafted_nodes=[1 + self.beams * g if ctx.active[b] else 1 for b in range(B)])
        return cand.stage(ctx.stager, log_q_joint=log_q, joint_tau=self.tau,
                          joint_warp=(1.0, self.joint_top_k, self.joint_top_p))


BeamDrafter = MJSD  # the class's name before issue #32 (a public name: kept)
