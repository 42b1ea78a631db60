"""SpecInfer (docs/methods.md §SpecInfer): several draft sequences merged into one token tree, verified
in one target forward by R1 (greedy) or R3 (multi-step speculative sampling, ``mss``).

Proposers: ``num_drafts`` chains from the draft model and, with ``ngram=True``, one prompt-lookup
chain. Sampling: the model chains are i.i.d. samples of the warped draft distribution (R3 needs
each child to be an independent draw from the distribution its draft row names: the draft logits it
was drawn from, warped by verification with the sampling config; the n-gram chain's rows are point
masses, for which R3 reduces to R3p; under a grammar the chain stops before its first token the
grammar rejects). Greedy: the first chain is the draft's
argmax chain, the others are sampled at ``draft_temperature`` for diversity (R1 is exact whatever
the proposals are).

Merging (docs/methods.md §SpecInfer): chains sharing a prefix share its nodes; continuations of all chains
through a node stay below it (they are independent draws given the prefix). When several chains
draw the same token at the same node, R3 must see every draw: the extra draws are kept as leaf
duplicates (sampling only), which is lossless because acceptance at a node depends only on the
multiset of tokens drawn there.
"""
import torch

from ..readback import read_lists
from ..sampling import draw
from ..tree import Candidates
from .base import ModelDrafter, grammar_masked
from .ngram import lookup


class SpecInfer(ModelDrafter):
    name = "specinfer"
    description = "SpecInfer: several draft chains (i.i.d. samples) merged into a token tree"
    PARAMS = {"num_drafts": 3, "gamma": 4, "draft_temperature": 1.0, "ngram": False}
    sampling_mode = "mss"
    budget_param = "gamma"
    budget_cap_factor = 2  # num_drafts chains per level: the block grows fast with depth

    def check_params(self):
        self._positive_int("num_drafts", self.num_drafts)
        self._positive_int("gamma", self.gamma)
        self._real("draft_temperature", self.draft_temperature, positive=True)
        self._bool("ngram", self.ngram)

    def tree_budget(self):
        return 1 + (self.num_drafts + bool(self.ngram)) * self.gamma * 2

    def draft_budget(self):
        return self.num_drafts * self.gamma

    def propose(self, ctx):
        d = ctx.draft
        d.begin(ctx.seqs, ctx.active)
        B, k, greedy = ctx.batch, self.num_drafts, ctx.sampling.greedy
        trees = [_DraftTrie(ctx.seqs[b][-1], d.root[b]) for b in range(B)]
        tips = [[0] * k for _ in range(B)]
        for step in range(self.gamma):
            pairs, row = [], {}
            for b in range(B):
                if ctx.active[b]:
                    for t in sorted(set(tips[b])):
                        row[(b, t)] = len(pairs)
                        pairs.append((b, trees[b].blk[t]))
            if not pairs:
                d.forward()
                break
            # Every chain's draw of this level at once (one independent draw per chain and row; the
            # rows travel with the forward's upload), read back with the argmax rows in one host read.
            draws = [row[(b, tips[b][c])] for b in range(B) if ctx.active[b] for c in range(k)
                     if not (greedy and c == 0)]
            logits, draw_rows = d.forward(rows=pairs, extra=draws)  # [len(pairs), V]
            if ctx.grammar is not None:  # row order = the dict's insertion order = pairs'
                logits = grammar_masked(ctx, logits, [(b, trees[b].path_tokens(t)) for b, t in row])
            if greedy:
                # Max subtracted first: a tiny draft_temperature must not overflow to inf - inf.
                probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / self.draft_temperature, -1)
            else:
                probs = ctx.sampling.warp(logits)
            drawn = (draw(probs[draw_rows], ctx.generator) if draws
                     else probs.new_zeros(0, dtype=torch.int64))
            argmax, drawn = read_lists(logits.argmax(-1) if greedy else drawn[:0], drawn)
            drawn = iter(drawn)
            last = step == self.gamma - 1
            for b in range(B):
                if not ctx.active[b]:
                    continue
                tr = trees[b]
                for c in range(k):
                    t = tips[b][c]
                    j = row[(b, t)]
                    tok = argmax[j] if greedy and c == 0 else next(drawn)
                    q = None if greedy else logits[j]  # the row it was drawn from, before warping
                    nxt = tr.kids[t].get(tok)
                    if nxt is None:
                        blk = -1 if last else d.add(b, tok, tr.blk[t])
                        nxt = tr.add(tok, t, blk, q)
                    elif not greedy:
                        tr.dups.append((tok, t, q))  # another independent draw of the same token
                    tips[b][c] = nxt
        return self._target_tree(ctx, trees)

    def _target_tree(self, ctx, trees):
        B, greedy, V = ctx.batch, ctx.sampling.greedy, ctx.vocab_size
        tokens, parents, src, rows = [], [], [], []
        for b in range(B):
            tr = trees[b]
            tok, par, sr, qr = list(tr.tok), list(tr.par), list(tr.blk), list(tr.q)
            for t, parent, q in tr.dups:  # leaf duplicates (sampling only)
                tok.append(t)
                par.append(parent)
                sr.append(-1)
                qr.append(q)
            if self.ngram and ctx.active[b]:
                conts = lookup(ctx.seqs[b], 3, 1, self.gamma, 1)
                parent = 0
                for t in _allowed(ctx, b, conts[0] if conts else []):
                    tok.append(t)
                    par.append(parent)
                    sr.append(-1)
                    qr.append(None if greedy else _point_mass(t, V, ctx.root.device))
                    parent = len(tok) - 1
            tokens.append(tok)
            parents.append(par)
            src.append(sr)
            rows.append(qr)
        cand = Candidates(tokens=tokens, parents=parents, src=src,
                          depth_drafted=[self.gamma if ctx.active[b] else 0 for b in range(B)],
                          drafted_nodes=[len(tr.tok) for tr in trees])
        if not greedy:  # the model chains' rows were warped with the sampling config (the point masses: by any)
            cand.draft_logits, cand.draft_warp = rows, ctx.sampling
        return cand.stage(ctx.stager, V)


class _DraftTrie:
    """Draft chains merged on shared prefixes. Node 0 = the pending root. ``blk``: draft-block
    node (or -1 for last-step nodes, never fed); ``q``: the distribution the node was drawn from."""

    def __init__(self, root_token, root_blk):
        self.tok, self.par, self.blk, self.q = [root_token], [-1], [root_blk], [None]
        self.kids = [{}]
        self.dups = []

    def add(self, token, parent, blk, q):
        self.tok.append(token)
        self.par.append(parent)
        self.blk.append(blk)
        self.q.append(q)
        self.kids.append({})
        self.kids[parent][token] = len(self.tok) - 1
        return len(self.tok) - 1

    def path_tokens(self, node):
        """The tokens from the root's child down to ``node`` (empty for the root)."""
        out = []
        while node > 0:
            out.append(self.tok[node])
            node = self.par[node]
        return out[::-1]


def _point_mass(t, V, device):
    """The logits of a point mass at ``t``: 0 there, -inf elsewhere, so every warp (any temperature,
    top-k, top-p) gives the one-hot row. Shape: -> fp32 [V] (a fill on the device, no host data)."""
    row = torch.full((V,), float("-inf"), dtype=torch.float32, device=device)
    row[t] = 0.0
    return row


def _allowed(ctx, b, chain):
    """The longest prefix of the n-gram ``chain`` (below the root) the grammar allows (all without
    one): a point mass on a token the grammar rejects would leave its draft row nothing to draw."""
    if ctx.grammar is None or not chain:
        return chain
    toks, _ = ctx.grammar.constrain(b, [ctx.seqs[b][-1]] + list(chain), list(range(-1, len(chain))), forced=0)
    return list(chain)[:len(toks) - 1]


MultiDraftDrafter = SpecInfer  # the class's name before issue #32 (a public name: kept)
