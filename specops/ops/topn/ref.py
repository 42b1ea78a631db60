"""The torch reference of the top-n ops: the one candidate order of :mod:`specops.ops.topn` (its module
docstring states it) as stable sorts."""
import torch
import torch.nn.functional as F


def topn_expand(parent_scores, child_logprobs, n, per_parent_k):
    """The spec: stable descending sorts keep equal scores in increasing (parent, token) order.
    Shape: parent_scores fp32 [B, P], child_logprobs [B, P, V] -> scores fp32, tokens, parents int32 [B, n]."""
    B, P, V = child_logprobs.shape
    s = parent_scores[:, :, None] + child_logprobs.float()  # [B, P, V]
    s = torch.where(torch.isnan(s), float("-inf"), s)
    if per_parent_k < V:
        order = s.sort(dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=s.device).expand_as(order))
        s = s.masked_fill(rank >= per_parent_k, float("-inf"))
    top, flat = s.reshape(B, P * V).sort(dim=-1, descending=True, stable=True)
    pad = (0, max(0, n - P * V))  # fewer than n candidates at all
    top, flat = F.pad(top[:, :n], pad, value=float("-inf")), F.pad(flat[:, :n], pad)
    ok = top > float("-inf")
    return top, torch.where(ok, flat % V, -1).to(torch.int32), torch.where(ok, flat // V, -1).to(torch.int32)


def select_topn_subtree(parents, scores, num_nodes, n):
    """The spec: effective scores (the minimum along the path), the best ``n`` by (score, lower
    index). Shape: parents int32 [B, T], scores fp32 [B, T], num_nodes int32 [B] -> keep_idx,
    new_parents int32 [B, n], counts int32 [B]."""
    B, T = parents.shape
    dev = parents.device
    rows, idx = torch.arange(B, device=dev), torch.arange(T, device=dev)
    s = torch.where(torch.isnan(scores), float("-inf"), scores)
    # Effective score: min over the path below the root, filled in topological order.
    eff = torch.full((B, T), float("inf"), device=dev)
    for i in range(1, T):
        parent = parents[:, i].clamp(0, i - 1).long()
        from_parent = torch.where(parent > 0, eff[rows, parent], float("inf"))
        eff[:, i] = torch.minimum(s[:, i], from_parent)
    eff = torch.where(idx[None, :] < num_nodes[:, None], eff, float("-inf"))
    eff[:, 0] = float("inf")
    # Best n by (eff desc, index asc): a stable descending sort.
    top, order = eff.sort(dim=-1, descending=True, stable=True)
    chosen = (idx[None, :] < n) & (top > float("-inf"))
    keep = torch.zeros(B, T, dtype=torch.bool, device=dev).scatter_(1, order, chosen)
    counts = keep.sum(dim=1)
    pos = torch.where(keep, keep.cumsum(dim=1) - 1, -1)
    new_parent_full = torch.where(keep & (idx[None, :] > 0),
                                  pos.gather(1, parents.clamp(0, T - 1).long()), -1)
    # Kept nodes in increasing original index, then padding.
    ranked = F.pad(torch.where(keep, idx[None, :], T).sort(dim=1).values, (0, max(0, n - T)), value=T)[:, :n]
    valid = ranked < T
    keep_idx = torch.where(valid, ranked, -1).to(torch.int32)
    new_parents = torch.where(valid, new_parent_full.gather(1, ranked.clamp(max=T - 1)), -1).to(torch.int32)
    return keep_idx, new_parents, counts.to(torch.int32)
