"""The torch reference of tree_attention's batch-invariant schedule (docs/batch_invariance.md).

A query row's keys are its *virtual sequence*: the cache rows it sees in increasing order (the
prefix, then the visible block keys in index order: where AR decoding appends them). Each row is
computed on its own, with tensors shaped by its own virtual length only, so nothing about the rest
of the call (other rows, other sequences, padding, the cache length, threads) can change its
bits: the row gets the same bits as the one-row call of AR decoding. No BLAS (whose blocking and
threading follow the operand shapes): products and sums are torch elementwise ops and reductions
over tensors of the row's shape.
"""
import torch


def invariant_ref(q, k_cache, v_cache, vis, sm_scale):
    """Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D], vis bool [B, Tq, S] (the dense
    visibility, :func:`specops.ops.tree_attention.visibility`) -> [B, Tq, Hq, D] in q's dtype;
    rows that see no key are 0. fp32 scores, softmax and accumulation; one host read per row."""
    B, Tq, Hq, D = q.shape
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
