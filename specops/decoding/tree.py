"""What a drafter hands the loop: one token tree per sequence on the device (:class:`Draft`), and
its host-side builder for drafters that search on the host (:class:`Candidates`). Terms:
docs/methods.md §Terms (node 0 is the pending root ``r``, ``parents[i] < i``)."""
import dataclasses

import torch


@dataclasses.dataclass
class Draft:
    """One padded token tree per sequence, on the device (fields: docs/methods.md §The decoding loop).

    Shape: tokens int64 [B, T] (node 0 = the pending root; padding 0), parents int32 [B, T]
    (``parents[b, 0] = -1``, padding 0), num_nodes int32 [B].
    ``draft_logits`` fp32 [B, T, V] or None, only for the rejection modes (``mss``, ``mss_noreplace``,
    ``gsd``): row ``i`` = the proposer's unwarped logits at node ``i``'s parent (zeros where it has
    none: uniform), warped with ``draft_warp`` (a SamplingConfig) by verification. ``src`` int32
    [B, T] or None: the draft-block node holding node ``i``'s draft K/V, or -1 (never fed, or a copy
    made under another context).
    Host fields (for metrics and the adaptive controller): ``depth`` [B] (a device tensor for a tree
    built on the device), ``depth_drafted`` [B] drafting steps (GSD's acceptance-rate denominator),
    ``drafted_nodes`` [B] nodes produced, root included (GSD: graph nodes, which the unmerged tree
    may exceed), ``copied`` [B][T] or None: node reached through a merge edge (GSD).
    MJSD (R6): ``log_q_joint`` fp32 [B, g] the joint log-probs of the chain's prefixes, ``joint_tau``,
    ``joint_warp`` (temperature, top_k, top_p)."""
    tokens: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor
    draft_logits: torch.Tensor = None
    draft_warp: object = None
    src: torch.Tensor = None
    depth: list = None
    depth_drafted: list = None
    drafted_nodes: list = None
    copied: list = None
    log_q_joint: torch.Tensor = None
    joint_tau: float = None
    joint_warp: tuple = None


@dataclasses.dataclass
class Candidates:
    """A token tree per sequence built on the host (ragged lists); :meth:`stage` makes it a Draft.
    ``draft_logits[b]``: None or n_b device rows [V] (None where the drafter has none); the other
    fields as in :class:`Draft`, as lists."""
    tokens: list
    parents: list
    draft_logits: list = None
    draft_warp: object = None
    src: list = None
    depth_drafted: list = None
    drafted_nodes: list = None
    copied: list = None

    def stage(self, stager, V=None):
        """The device Draft: tokens, parents, num_nodes (and src) in one staged upload, draft rows
        stacked on the device."""
        B, counts = len(self.tokens), [len(t) for t in self.tokens]
        T, flat = max(counts), []
        for rows in (self.tokens, self.parents) + ((self.src,) if self.src is not None else ()):
            for r in rows:
                flat += r + [0] * (T - len(r))
        flat += counts
        up = stager.upload(flat)
        n = B * T
        src = up[2 * n: 3 * n].view(B, T).to(torch.int32) if self.src is not None else None
        logits = self.pack_draft_logits(V) if self.draft_logits is not None else None
        return Draft(tokens=up[:n].view(B, T), parents=up[n: 2 * n].view(B, T).to(torch.int32),
                     num_nodes=up[-B:].to(torch.int32), draft_logits=logits, draft_warp=self.draft_warp, src=src,
                     depth=[max(depths(p)) for p in self.parents],
                     depth_drafted=self.depth_drafted or [0] * B,
                     drafted_nodes=self.drafted_nodes or counts, copied=self.copied)

    def pack_draft_logits(self, V):
        """Shape: -> fp32 [B, T, V] stacked on the rows' device (no host data), zeros for a node
        without a row (docs/methods.md §Verification rules); None when no node has a row."""
        real = next((r for rows in self.draft_logits if rows is not None for r in rows if r is not None), None)
        if real is None:
            return None
        T = max(len(t) for t in self.tokens)
        pad = torch.zeros(V, dtype=torch.float32, device=real.device)
        out = []
        for rows in self.draft_logits:
            rows = [pad if r is None else r.float() for r in rows or []]
            out.append(torch.stack(rows + [pad] * (T - len(rows))))
        return torch.stack(out)

    def validate(self):
        """Tree rules (cheap host check; drafters are trusted, this guards new ones)."""
        for b, (t, p) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if len(t) != len(p) or not t or p[0] != -1:
                raise AssertionError(f"sequence {b}: malformed tree (tokens {len(t)}, parents {p[:3]}...)")
            for i in range(1, len(p)):
                if not 0 <= p[i] < i:
                    raise AssertionError(f"sequence {b}: parents[{i}] = {p[i]} is not in [0, {i})")


def root_draft(root):
    """The block of the pending roots alone (AR steps): nothing uploaded. Shape: root int64 [B]."""
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
    """Token sequences merged on shared prefixes, in insertion order (a child always follows its
    parent, so ``parents[i] < i``)."""

    def __init__(self, root_token):
        self.tokens, self.parents, self._kids = [root_token], [-1], [{}]

    def insert(self, node, seq):
        """Appends ``seq`` below ``node`` sharing existing prefixes; returns its nodes."""
        nodes = []
        for tok in seq:
            if tok not in self._kids[node]:
                self._kids[node][tok] = len(self.tokens)
                self.tokens.append(tok)
                self.parents.append(node)
                self._kids.append({})
            node = self._kids[node][tok]
            nodes.append(node)
        return nodes
