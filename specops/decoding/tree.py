"""What a drafter hands the loop: one token tree per sequence on the device (:class:`Draft`), and
the host-side builder of such trees for drafters that search on the host (:class:`Candidates`).

Terms (docs/methods.md §Terms): node 0 is the root = the pending token ``r`` (emitted, not yet in the
target cache); ``parents[i] < i``; the target sees node ``i`` at position ``L + depth(i)``.
"""
import dataclasses

import torch


@dataclasses.dataclass
class Draft:
    """What a drafter hands the loop: one padded token tree per sequence, on the device.

    Shape: tokens int64 [B, T] (node 0 = the pending root; padding 0), parents int32 [B, T]
    (``parents[b, 0] = -1``, padding 0), num_nodes int32 [B]; ``draft_probs`` fp32 [B, T, V] or
    None: row ``i`` = the distribution node ``i`` was drawn from (its proposer's distribution at its
    parent; uniform where none), only for the rejection modes (``mss``, ``mss_noreplace``, ``gsd``);
    ``src`` int32 [B, T] or None: the draft-block node that holds node ``i``'s draft K/V, or -1
    (never fed, or a copy made under another context): read back along the accepted path with the
    step's one read, for the drafter's commit.

    Host fields (known to the drafter without a read; metrics and the adaptive controller):
    ``depth`` [B] the tree depth per sequence (a device int tensor for a tree built on the device:
    the step's read brings it back), ``depth_drafted`` [B] drafting steps spent (GSD's
    acceptance-rate denominator), ``drafted_nodes`` [B] nodes the drafter produced, root included
    (GSD counts graph nodes, which the unmerged tree may exceed), ``copied`` [B][T] or None: node
    reached through a merge edge (GSD graph success).

    MJSD (R6): ``log_q_joint`` fp32 [B, g], the draft's joint log-probs of the chain's prefixes;
    ``joint_tau``; ``joint_warp`` (temperature, top_k, top_p) of its joint test."""
    tokens: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor
    draft_probs: torch.Tensor = None
    src: torch.Tensor = None
    depth: list = None
    depth_drafted: list = None
    drafted_nodes: list = None
    copied: list = None
    log_q_joint: torch.Tensor = None
    joint_tau: float = None
    joint_warp: tuple = None

    @property
    def batch(self):
        return self.tokens.shape[0]


@dataclasses.dataclass
class Candidates:
    """A token tree per sequence built on the host (Python lists, ragged), for drafters whose
    search runs on the host; :meth:`stage` turns it into a :class:`Draft` with one staged upload.

    ``draft_probs[b]``: None or a list of n_b rows (device fp32 [V], None for uniform).
    ``src``, ``depth_drafted``, ``drafted_nodes``, ``copied``: as in :class:`Draft`, as lists."""
    tokens: list
    parents: list
    draft_probs: list = None
    src: list = None
    depth_drafted: list = None
    drafted_nodes: list = None
    copied: list = None

    @property
    def batch(self):
        return len(self.tokens)

    def num_nodes(self):
        return [len(t) for t in self.tokens]

    def stage(self, stager, V=None, **fields):
        """The device Draft: tokens, parents, num_nodes (and src) in one staged upload; draft rows
        stacked on the device. ``fields`` go to the Draft (typed per-method fields).

        Shape: -> Draft with tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B]."""
        B = self.batch
        T = max(len(t) for t in self.tokens)
        flat = []
        for rows in (self.tokens, self.parents) + ((self.src,) if self.src is not None else ()):
            for r in rows:
                flat += r
                flat += [0] * (T - len(r))
        flat += self.num_nodes()
        up = stager.upload(flat)
        n = B * T
        src = up[2 * n: 3 * n].view(B, T).to(torch.int32) if self.src is not None else None
        probs = self.pack_draft_probs(V) if self.draft_probs is not None else None
        return Draft(tokens=up[:n].view(B, T), parents=up[n: 2 * n].view(B, T).to(torch.int32),
                     num_nodes=up[-B:].to(torch.int32), draft_probs=probs, src=src,
                     depth=[max(depths(p)) for p in self.parents],
                     depth_drafted=self.depth_drafted or [0] * B,
                     drafted_nodes=self.drafted_nodes or self.num_nodes(), copied=self.copied, **fields)

    def pack_draft_probs(self, V):
        """Shape: -> fp32 [B, T, V] on the rows' device; rows without a proposal distribution are
        uniform (built on the device: no host data)."""
        T = max(len(t) for t in self.tokens)
        real = next(r for rows in self.draft_probs if rows is not None for r in rows if r is not None)
        uni = torch.full((V,), 1.0 / V, dtype=torch.float32, device=real.device)
        out = []
        for b in range(self.batch):
            rows = self.draft_probs[b] or []
            rows = [r if r is not None else uni for r in rows]
            out.append(torch.stack(rows + [uni] * (T - len(rows))))
        return torch.stack(out)

    def validate(self):
        """Tree rules (cheap host check; drafters are trusted, this guards new ones)."""
        for b in range(self.batch):
            t, p = self.tokens[b], self.parents[b]
            if len(t) != len(p) or not t or p[0] != -1:
                raise AssertionError(f"sequence {b}: malformed tree (tokens {len(t)}, parents {p[:3]}...)")
            for i in range(1, len(p)):
                if not 0 <= p[i] < i:
                    raise AssertionError(f"sequence {b}: parents[{i}] = {p[i]} is not in [0, {i})")


def root_draft(root):
    """The block of the pending roots alone (AR steps), from the device roots: nothing uploaded.

    Shape: root int64 [B] -> Draft with T = 1."""
    B = root.shape[0]
    return Draft(tokens=root[:, None], parents=torch.full((B, 1), -1, dtype=torch.int32, device=root.device),
                 num_nodes=torch.ones(B, dtype=torch.int32, device=root.device), depth=[0] * B,
                 depth_drafted=[0] * B, drafted_nodes=[1] * B)


def depths(parents):
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


class Trie:
    """Token sequences merged on shared prefixes, built in insertion order (BFS order is not
    needed: a child is always created after its parent, so ``parents[i] < i`` holds)."""

    def __init__(self, root_token):
        self.tokens = [root_token]
        self.parents = [-1]
        self._kids = [{}]

    def child(self, node, token, *, create=True):
        nxt = self._kids[node].get(token)
        if nxt is None and create:
            nxt = self.add(node, token)
        return nxt

    def add(self, node, token):
        """A new child even if a sibling has the same token (duplicate proposals)."""
        self.tokens.append(token)
        self.parents.append(node)
        self._kids.append({})
        self._kids[node].setdefault(token, len(self.tokens) - 1)
        return len(self.tokens) - 1

    def insert(self, node, seq, limit=None):
        """Appends ``seq`` below ``node`` sharing existing prefixes; stops at ``limit`` nodes."""
        for tok in seq:
            nxt = self._kids[node].get(tok)
            if nxt is None:
                if limit is not None and len(self.tokens) >= limit:
                    return
                nxt = self.add(node, tok)
            node = nxt

    def __len__(self):
        return len(self.tokens)
