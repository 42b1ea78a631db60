"""FlashInfer's custom-mask prefill as an optional ``tree_attention`` backend (``"flashinfer"``).

It runs fp16/bf16 calls whose head dim FlashInfer compiles (64, 128, 256) when the ``flashinfer``
package imports and the tensors are on a CUDA device. In the automatic choice it comes after
``triton`` and ``cuda`` (specops/backend.py), for the reason below; ``backend="flashinfer"`` asks
for it. Nothing here runs without FlashInfer and a GPU: the machines this project
is built on have neither, so the provider's test (``tests/test_flashinfer.py``) runs only where both
exist, comparing it with the torch reference like every backend.

How a call maps onto FlashInfer, with no copy of the cache and no host sync: sequence ``b``'s cache
``k_cache[b]`` ``[Hkv, S, D]`` is FlashInfer's ``HND`` layout of a single request whose KV length is
the whole buffer ``S``; the lengths and the tree mask become one boolean ``custom_mask`` ``[Tq, S]``
(:func:`specops.ops.tree_attention.visibility`), so rows past ``prefix + block`` are simply invisible.
Query rows that see no key (padding, ``q_lens``) come out as zeros, as the contract says. One
``single_prefill_with_kv_cache`` launch per sequence.

Why it is not the default (model: bench/roofline.py's bytes over the H100 SXM / A100 SXM datasheet
bandwidth; no GPU timing here). At a decode step (Hq 32, Hkv 8, D 128, prefix 4096, 16 tree
queries, bf16) the op is memory-bound; model: its lower bound is 5.1 us (H100) / 8.4 us (A100) at
B = 1 and 40.8 / 67.1 us at B = 8, what our kernels approach by reading only the prefix + block
rows once per kv head. This provider reads K/V over the whole buffer ``S`` (a cache sized to twice
the rows in use: model 10.3 / 16.8 us at B = 1, 82.0 / 134.7 us at B = 8, mask traffic included),
in B launches, and FlashInfer's custom-mask prefill runs at about half its causal kernel's speed
(FlashInfer issue #724), so model ~2x that again: 4x the bound. The batch wrapper
(``BatchPrefillWithPagedKVCacheWrapper`` planned once per step with a packed custom mask over the
block only) would remove the launches and the mask over the prefix, but cannot be built or tested
on machines without FlashInfer and a GPU, so the provider stays behind our kernels.
"""
import importlib.util

import torch

from ..backend import BackendUnavailable, register
from ..ops.tree_attention import visibility

HEAD_DIMS = (64, 128, 256)  # what FlashInfer's prebuilt/JIT prefill kernels cover
DTYPES = (torch.float16, torch.bfloat16)


def importable():
    return importlib.util.find_spec("flashinfer") is not None


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

    B, Tq, Hq, D = q.shape
    S = k_cache.shape[2]
    vis = visibility(prefix_lens, block_lens, mask, q_lens, S)  # [B, Tq, S] bool
    out = torch.empty_like(q)
    for b in range(B):
        out[b] = flashinfer.single_prefill_with_kv_cache(
            q[b], k_cache[b], v_cache[b], custom_mask=vis[b], kv_layout="HND", sm_scale=sm_scale)
    return out.masked_fill_(~vis.any(-1)[:, :, None, None], 0)
