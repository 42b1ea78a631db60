"""The torch reference of tree_attention, the spec every backend is held to: :func:`tree_attention`
(dense) and :func:`invariant_ref` (the batch-invariant schedule, docs/batch_invariance.md, "Invariant
attention"), which computes each row alone without BLAS (whose blocking follows the operand shapes), so
nothing else in the call changes its bits: those of AR's one-row call."""
import torch

from ..layout import KvLayout


def invariant_ref(q, k_cache, v_cache, vis, sm_scale):
    """Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D], vis bool [B, Tq, S] (:func:`visibility`)
    -> [B, Tq, Hq, D] in q's dtype (fp32 math; rows that see no key 0); one host read per row."""
    B, Tq, Hq, _ = q.shape
    G = Hq // k_cache.shape[1]
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    for b in range(B):
        for i in range(Tq):
            rows = vis[b, i].nonzero().squeeze(1)  # [L] the virtual sequence
            if rows.numel() == 0:
                continue
            k = k_cache[b][:, rows].float().repeat_interleave(G, dim=0)  # [Hq, L, D]
            v = v_cache[b][:, rows].float().repeat_interleave(G, dim=0)
            s = (q[b, i].float()[:, None, :] * k).sum(-1) * sm_scale  # [Hq, L]
            p = (s - s.amax(-1, keepdim=True)).exp()
            o = (p[:, :, None] * v).sum(1) / p.sum(-1, keepdim=True)  # [Hq, D]
            out[b, i] = o.to(q.dtype)
    return out


def visibility(prefix_lens, block_lens, mask, q_lens, S):
    """The dense visibility the op implements. Shape: prefix_lens / block_lens / q_lens (or None) int32
    [B], mask int32 [B, Tq, W] -> bool [B, Tq, S]."""
    B, Tq, W = mask.shape
    dev = mask.device
    s = torch.arange(S, device=dev)
    p, n = (t.long()[:, None, None] for t in (prefix_lens, block_lens))
    j = s[None, None, :] - p  # block index of key s, [B, 1, S]
    in_block = (j >= 0) & (j < n) & (j < 32 * W)
    jc = j.clamp(0, max(32 * W - 1, 0)).expand(B, Tq, S)
    if W:
        bit = ((torch.gather(mask, 2, jc >> 5).long() >> (jc & 31)) & 1).bool()
    else:
        bit = torch.zeros(B, Tq, S, dtype=torch.bool, device=dev)
    vis = (s[None, None, :] < p) | (in_block & bit)
    if q_lens is not None:
        vis &= (torch.arange(Tq, device=dev)[None, :] < q_lens.long()[:, None])[:, :, None]
    return vis


def unpack(paged, args):
    """(q, layout, the op's rest through sm_scale, (num_splits, workspace, invariant)) of an op's
    positional arguments (the schedule's defaulted where left out)."""
    n = 3 if paged else 2
    rest = args[1 + n:]
    return args[0], KvLayout(*args[1:1 + n]), rest[:5], rest[5:] + (1, None, False)[len(rest) - 5:]


def tree_attention(paged, *args):
    """The spec: dense fp32 scores over the whole cache, invisible keys at -inf, rows that see nothing 0
    (not softmax's NaN); a paged cache is the contiguous one its table describes. Shape: the registered
    op's positional arguments (:func:`unpack`) -> out [B, Tq, Hq, D] in q's dtype."""
    q, kv, (prefix_lens, block_lens, mask, q_lens, sm_scale), (_, _, invariant) = unpack(paged, args)
    kv = kv.gather()
    Hq, (Hkv, S) = q.shape[2], kv.k.shape[1:3]
    vis = visibility(prefix_lens, block_lens, mask, q_lens, S)  # [B, Tq, S]
    if invariant:
        return invariant_ref(q, kv.k, kv.v, vis, sm_scale)
    # Rows past prefix + block are not part of the op: zero them so garbage there cannot leak.
    used = vis.any(1)[:, None, :, None]  # [B, 1, S, 1]; k, v: [B, Hq, S, D]
    k, v = (t.float().masked_fill(~used, 0).repeat_interleave(Hq // Hkv, dim=1) for t in (kv.k, kv.v))
    scores = torch.einsum("bthd,bhsd->bhts", q.float(), k) * sm_scale  # [B, Hq, Tq, S]
    scores = scores.masked_fill(~vis[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhts,bhsd->bthd", probs, v)
    return out.to(q.dtype)
