"""What a drafter hands the loop: one token tree per sequence, plus what verification needs.

Terms (docs/methods.md §Terms): node 0 is the root = the pending token ``r`` (emitted, not yet in the
target cache); ``parents[i] < i``; the target sees node ``i`` at position ``L + depth(i)``.
"""
import dataclasses

import torch


@dataclasses.dataclass
class Candidates:
    """Per-sequence token trees (Python lists, ragged) and per-node draft information.

    ``draft_probs[b]``: None or fp32 [n_b, V], row ``i`` = the distribution node ``i`` was drawn
    from (its proposer's distribution at its parent); row 0 is unused. Needed by the rejection
    modes (``mss``, ``mss_noreplace``, ``gsd``).
    ``src[b][i]``: the draft-block node that holds node ``i``'s draft K/V, or -1 (never fed, or a
    copy made under another context); the drafter reads it back in ``commit``.
    ``depth_drafted[b]``: drafting steps spent on this tree (GSD's acceptance-rate denominator).
    ``drafted_nodes[b]``: nodes the drafter produced, root included (GSD's "drafted token num";
    for GSD it counts graph nodes, which the unmerged tree may exceed).
    ``copied[b][i]``: node reached through a merge edge (GSD graph success).
    ``extra``: method data (MJSD: ``log_q_joint`` fp32 [B, g]).
    """
    tokens: list
    parents: list
    draft_probs: list = None
    src: list = None
    depth_drafted: list = None
    drafted_nodes: list = None
    copied: list = None
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def batch(self):
        return len(self.tokens)

    def num_nodes(self):
        return [len(t) for t in self.tokens]

    def pack(self, device="cpu"):
        """Padded tensors for the target forward and the verifiers.

        Shape: -> tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B]. Padding rows have
        token 0 and parent 0 (ignored by every consumer through ``num_nodes``)."""
        T = max(len(t) for t in self.tokens)
        # Padded host lists, one tensor each (one host-to-device copy per tensor, nothing read back).
        tokens = torch.tensor([list(t) + [0] * (T - len(t)) for t in self.tokens], dtype=torch.int64)
        parents = torch.tensor([list(p) + [0] * (T - len(p)) for p in self.parents], dtype=torch.int32)
        num_nodes = torch.tensor(self.num_nodes(), dtype=torch.int32)
        return tokens.to(device), parents.to(device), num_nodes.to(device)

    def pack_draft_probs(self, V, device="cpu"):
        """Shape: -> fp32 [B, T, V]; rows without a proposal distribution are uniform."""
        B = self.batch
        T = max(len(t) for t in self.tokens)
        out = torch.full((B, T, V), 1.0 / V, dtype=torch.float32, device=device)
        for b in range(B):
            rows = self.draft_probs[b] if self.draft_probs is not None else None
            if rows is not None:
                out[b, : rows.shape[0]] = rows.to(device)
        return out

    def validate(self):
        """Tree rules (cheap host check; drafters are trusted, this guards new ones)."""
        for b in range(self.batch):
            t, p = self.tokens[b], self.parents[b]
            if len(t) != len(p) or not t or p[0] != -1:
                raise AssertionError(f"sequence {b}: malformed tree (tokens {len(t)}, parents {p[:3]}...)")
            for i in range(1, len(p)):
                if not 0 <= p[i] < i:
                    raise AssertionError(f"sequence {b}: parents[{i}] = {p[i]} is not in [0, {i})")


def depths(parents):
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def path_to(parents, node):
    """Root-to-node list of node indices."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


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
