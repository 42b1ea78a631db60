"""FlashInfer's custom-mask prefill as the optional ``tree_attention`` backend ``"flashinfer"``: fp16 /
bf16 calls of head dim 64, 128 or 256 on CUDA tensors where ``flashinfer`` imports, tried after ``triton``
and ``cuda`` (why: below). tests/test_backend.py checks it against the torch reference where
FlashInfer and a GPU exist (not here).

No cache copy, no host sync: ``k_cache[b]`` ``[Hkv, S, D]`` is FlashInfer's ``HND`` layout of one request
whose KV length is the whole buffer ``S``; lengths and tree mask become one boolean ``custom_mask`` ``[Tq,
S]`` (:func:`specops.ops.tree_attention.visibility`): rows past ``prefix + block`` are invisible, query
rows that see no key give zeros. One ``single_prefill_with_kv_cache`` launch per sequence.

Why not the default (bench/roofline.py's bytes over the H100 / A100 SXM datasheet bandwidth, no GPU
timing): a decode step (Hq 32, Hkv 8, D 128, prefix 4096, 16 tree queries, bf16) is memory-bound, 5.1 us
(H100) / 8.4 us (A100) at B = 1 and 40.8 / 67.1 us at B = 8, which our kernels approach by reading the
prefix + block rows once per kv head. This provider reads the whole buffer (twice the rows in use: 10.3 /
16.8 us at B = 1, 82.0 / 134.7 us at B = 8, mask included) in B launches, and the custom-mask prefill
runs at about half the causal kernel's speed (FlashInfer issue #724): ~4x the bound. The batch wrapper
(``BatchPrefillWithPagedKVCacheWrapper``, planned per step with a packed mask over the block only) would
remove both, but cannot be built or tested here."""
import torch

from ..backend import BackendUnavailable, register
from ..ops.tree_attention import visibility

HEAD_DIMS = (64, 128, 256)  # what FlashInfer's prebuilt/JIT prefill kernels cover
DTYPES = (torch.float16, torch.bfloat16)


def supports(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale):
    """None when FlashInfer can run the call, else why not."""
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} (FlashInfer prefill takes fp16/bf16)"
    if q.shape[3] not in HEAD_DIMS:
        return f"head dim D={q.shape[3]} not in {HEAD_DIMS}"
    if k_cache.stride(2) != k_cache.shape[3] or k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        return "k_cache / v_cache rows must be dense [S, D] per head (HND layout)"
    return None


@register("tree_attention", "flashinfer", supports=supports)
def tree_attention_flashinfer(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits=1,
                              workspace=None, invariant=False):
    """Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D] -> [B, Tq, Hq, D] (q's dtype).
    FlashInfer schedules its own splits: ``num_splits`` / ``workspace`` are not used; it has no
    batch-invariant schedule (``invariant=True`` raises BackendUnavailable)."""
    if invariant:
        raise BackendUnavailable("tree_attention: backend 'flashinfer' has no batch-invariant schedule (invariant=True)")
    import flashinfer

    B = q.shape[0]
    S = k_cache.shape[2]
    vis = visibility(prefix_lens, block_lens, mask, q_lens, S)  # [B, Tq, S] bool
    out = torch.empty_like(q)
    for b in range(B):
        out[b] = flashinfer.single_prefill_with_kv_cache(
            q[b], k_cache[b], v_cache[b], custom_mask=vis[b], kv_layout="HND", sm_scale=sm_scale)
    return out.masked_fill_(~vis.any(-1)[:, :, None, None], 0)
