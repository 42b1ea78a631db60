"""Tree attention: draft-token queries attend to a committed KV prefix plus the part of the draft
block their bit-packed mask allows.

For sequence ``b``, cache rows ``[0, P)`` (``P = prefix_lens[b]``) are the prefix, seen by every valid
query; rows ``[P, P + L)`` (``L = block_lens[b]``) the block, whose key ``j`` query ``i`` sees iff bit
``j % 32`` of word ``j // 32`` of ``mask[b, i]`` is set (:func:`specops.build_tree_mask`'s format; any
visibility: trees, DAGs, lookahead windows; the queries need not be the whole block). Query rows
``i >= q_lens[b]`` are padding and, like a query that sees no key, give 0.
"""
import functools
import math
import numbers

import torch

from ...backend import register_op, register_supports, resolve_named
from .. import checks
from ..layout import KvLayout
from . import ref, splits
from .ref import visibility  # noqa: F401  (the op's visibility rule: baselines and specops.testing use it)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CUDA_MAX_D = 256  # the CUDA kernels' head-dim buckets (csrc/cuda/tree_attention.cu)
CUDA_MAX_B_HKV = 65535  # B * Hkv: a grid dimension of the CUDA kernel
# The largest |sm_scale| (csrc/tree_attention_args.h kMaxSmScale): fp32 scores q.k * sm_scale stay
# finite for fp16 inputs (|q.k| <= D * 65504**2) at any D below 1e18, and for bf16 / fp32 inputs
# while |q.k| <= 5e33 (only inputs whose unscaled scores nearly overflow already can overflow). Within
# it every backend computes the exact softmax (tests/test_bad_input.py checks the bound).
SM_SCALE_MAX = 65536.0


def attend(q, kv, prefix_lens, block_lens, mask, *, q_lens=None, sm_scale=None, check=True, backend=None,
           invariant=False):
    """:func:`tree_attention` over ``kv``, a :class:`~specops.ops.layout.KvLayout` (contiguous or paged)."""
    checks.tensor("q", q, dtype=FLOAT_DTYPES, rank=4)
    B, Tq, Hq, D = q.shape
    kv.check(dtype=q.dtype, rank=4, device=q.device, B=B, D=D, Hq=Hq)
    check_block(prefix_lens, block_lens, mask, q_lens, B, Tq, q.device)
    sm_scale, invariant = scale(sm_scale, D), check_invariant(invariant)
    if check:
        length_values(prefix_lens, block_lens, q_lens, kv, mask.shape[2], Tq)
    args = (q, *kv.tensors(), prefix_lens, block_lens, mask, q_lens, sm_scale)
    name, impl = resolve_named(kv.op("tree_attention"), q.device, backend, args)
    ns = choose_splits(name, q, kv.num_kv_heads, kv.rows(), prefix_lens, block_lens, mask.shape[2], kv.is_paged,
                       invariant=invariant)
    n = splits.workspace_size(ns, *q.shape)  # the fp32 partials, None without splits; in a graph always a
    # tensor: inductor cannot lower the op with its mutable optional left None
    ws = torch.empty(n, dtype=torch.float32, device=q.device) if n or torch.compiler.is_compiling() else None
    return impl(*args, ns, ws, invariant)


def tree_attention(q, k_cache, v_cache, prefix_lens, block_lens, mask, *, q_lens=None, sm_scale=None,
                   check=True, backend=None, invariant=False):
    """Attention of a draft block over a committed prefix plus a masked draft block.

    Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D] (q's dtype: fp32, fp16 or bf16; any
    strides, last-dim stride 1), prefix_lens / block_lens / q_lens int32 [B], mask int32 [B, Tq, W]
    -> out [B, Tq, Hq, D] in q's dtype.

    Query head ``h`` reads kv head ``h // (Hq // Hkv)`` (GQA/MQA); ``q`` carries its positions (RoPE
    at ``prefix + depth``); softmax and accumulation in fp32. ``sm_scale``: ``1/sqrt(D)`` by default,
    ``|sm_scale| <= SM_SCALE_MAX`` (65536). ``check=True`` verifies the lengths (one host sync):
    non-negative, ``prefix_lens + block_lens <= S``, ``block_lens <= 32 W``, ``q_lens <= Tq``; with
    ``check=False`` the kernels clamp bad lengths (no out-of-bounds access; unspecified result). The
    cuda backend takes ``D <= CUDA_MAX_D`` and ``B * Hkv <= CUDA_MAX_B_HKV``: the automatic choice
    passes other calls on, ``backend="cuda"`` raises BackendUnavailable naming the limit.
    ``invariant=True``: the batch-invariant schedule (docs/batch_invariance.md, "Invariant attention"):
    a row's output is bit for bit its AR view's, whatever else shares the call."""
    return attend(q, KvLayout.contiguous(k_cache, v_cache), prefix_lens, block_lens, mask, q_lens=q_lens,
                  sm_scale=sm_scale, check=check, backend=backend, invariant=invariant)


def tree_attention_paged(q, k_pages, v_pages, page_table, prefix_lens, block_lens, mask, *, q_lens=None,
                         sm_scale=None, check=True, backend=None, invariant=False):
    """:func:`tree_attention` over a paged KV cache (the layout of serving engines).

    Shape: q [B, Tq, Hq, D], k_pages / v_pages [num_pages, page_size, Hkv, D] (q's dtype; page_size
    a power of two; last-dim stride 1), page_table int32 [B, max_pages], prefix_lens / block_lens /
    q_lens int32 [B], mask int32 [B, Tq, W] -> out [B, Tq, Hq, D] in q's dtype.

    Row ``r`` of sequence ``b`` is slot ``r % page_size`` of page ``page_table[b, r // page_size]``;
    pages may be scattered in any order and shared between sequences (read only). The rest is
    :func:`tree_attention`'s, ``invariant`` included (a row's bits do not depend on the layout).
    vLLM's per-layer ``[2, num_blocks, block_size, num_kv_heads, head_size]`` is ``kv[0]``, ``kv[1]``;
    FlashInfer's NHD ``[num_pages, 2, page_size, num_heads, head_dim]`` is ``kv[:, 0]``, ``kv[:, 1]``
    and its HND the same ``.transpose(1, 2)`` (views); its CSR ``kv_indptr`` / ``kv_indices`` become
    ``page_table`` row by row, padded with any page id.

    ``check=True`` adds ``prefix_lens + block_lens <= max_pages * page_size`` and ``0 <= page_table[b,
    i] < num_pages`` for the pages the rows use (``i < ceil((prefix_lens[b] + block_lens[b]) /
    page_size)``); ``check=False`` clamps page ids too."""
    return attend(q, KvLayout.paged(k_pages, v_pages, page_table), prefix_lens, block_lens, mask, q_lens=q_lens,
                  sm_scale=sm_scale, check=check, backend=backend, invariant=invariant)


def check_invariant(invariant):
    if not isinstance(invariant, bool):
        raise TypeError(f"invariant must be a bool, got {invariant!r}")
    return invariant


def choose_splits(backend, q, Hkv, S, prefix_lens, block_lens, W, paged=False, invariant=False):
    """The kv split count ``backend``'s kernel runs a call with (docs/plans.md, "The split schedule"):
    q [B, Tq, Hq, D]; S rows a sequence can address; prefix_lens / block_lens int32 [B] (not read: no
    host sync); W mask words. -> int >= 1 (1 for the invariant schedule)."""
    if invariant:
        return 1
    B, Tq, Hq, D = q.shape
    if backend == "cpp":
        # No value reads: the rows a sequence can address bound the tiles (the loop sizes its caches).
        max_tiles = -(-S // splits.CPU_TILE_KEYS) + 1
        if not torch.compiler.is_compiling():
            _THREADS[0] = torch.get_num_threads()
        return splits.cpu_splits(B, Tq, Hq, Hkv, D, max_tiles, _THREADS[0])
    if backend == "triton":
        from ...triton_kernels import tree_attention as kernels

        arch, sms, _ = kernels.target(q.device)
        return kernels.splits(q, Hkv, S, arch, sms, paged)
    if backend in ("cuda", "cudasim"):
        if q.device.type == "cuda":
            props = torch.cuda.get_device_properties(q.device)
            arch, sms = (90 if props.major >= 9 else 80), props.multi_processor_count
        else:  # cudasim: CPU tensors
            arch, sms = splits.SIM_TARGET
        fp32 = q.dtype == torch.float32
        rows, keys = (CUDA_FP32_TILE if fp32 else (CUDA_TC_ROWS, 64 if D <= 64 else 32))
        return splits.gpu_launch_splits(B, Tq, Hq, Hkv, D, S, q.element_size(), fp32, rows, keys, arch, sms)
    return 1  # torch, flashinfer: no split schedule


_THREADS = [torch.get_num_threads()]  # the last thread count seen outside a graph (dynamo cannot call it)
CUDA_FP32_TILE = (16, 32)  # csrc/cuda/tree_attention.cu: query rows per block, keys per tile (fp32 kernel)
CUDA_TC_ROWS = 64  # tree_attention_tc.cuh kTcRows; keys per tile TcCfg<DP>::kBN: 64 for D <= 64, else 32


def check_block(prefix_lens, block_lens, mask, q_lens, B, Tq, dev):
    """The metadata rules of the block description (lengths int32 [B], mask int32 [B, Tq, W])."""
    checks.lengths("prefix_lens", prefix_lens, B, dev)
    checks.lengths("block_lens", block_lens, B, dev)
    checks.tensor("mask", mask, dtype=torch.int32, rank=3, device=dev)
    if mask.shape[0] != B or mask.shape[1] != Tq:
        raise ValueError(f"mask must have shape [B={B}, Tq={Tq}, W], got {tuple(mask.shape)}")
    if q_lens is not None:
        checks.lengths("q_lens", q_lens, B, dev)


def scale(sm_scale, D):
    """``sm_scale`` checked (finite, ``|sm_scale| <= SM_SCALE_MAX``) as a float; ``1/sqrt(D)`` for None."""
    if sm_scale is None:
        return 1.0 / math.sqrt(D)
    if not isinstance(sm_scale, numbers.Real) or isinstance(sm_scale, bool) or not math.isfinite(sm_scale):
        raise TypeError(f"sm_scale must be a finite real number or None, got {sm_scale!r}")
    if abs(sm_scale) > SM_SCALE_MAX:
        raise ValueError(f"sm_scale must lie in [-{SM_SCALE_MAX:g}, {SM_SCALE_MAX:g}] (larger scales overflow "
                         f"the fp32 scores), got {sm_scale!r}")
    return float(sm_scale)


def length_values(prefix_lens, block_lens, q_lens, kv, W, Tq):
    """The value rules of ``check=True`` on the layout ``kv`` (one host sync); the first broken one raises."""
    if prefix_lens.numel() == 0:
        return
    rows = kv.capacity()
    if kv.is_paged:
        M, ps = kv.page_table.shape[1], kv.page_size
        limit = f"max_pages * page_size = {M} * {ps} = {rows} (the rows page_table can address)"
        got = lambda name, t, bad: f"values in [{int(t.min())}, {int(t.max())}]"
    else:
        limit = f"S = {rows} (the cache length)"
        got = lambda name, t, bad: checks.at(f"({name})" if " " in name else name, t, bad)
    p, n = prefix_lens.long(), block_lens.long()
    rules = [
        ("prefix_lens", "be >= 0", prefix_lens, p < 0),
        ("block_lens", "be >= 0", block_lens, n < 0),
        ("block_lens", f"be <= 32 * W = {32 * W} (mask too narrow: mask is [B, Tq, W={W}])", block_lens, n > 32 * W),
        ("prefix_lens + block_lens", f"be <= {limit}", p + n, p + n > rows),
    ]
    if q_lens is not None:
        rules.append(("q_lens", f"lie in [0, Tq={Tq}]", q_lens, (q_lens < 0) | (q_lens > Tq)))
    rules = [checks.rule(name, t, bad, expect, got) for name, expect, t, bad in rules]
    if kv.is_paged:
        rules.append(kv.page_rule((p + n).clamp(max=rows)))
    checks.raise_first(rules)


# ---- backends: one implementation per backend for both layouts, registered under each layout's op
# (its own torch.library schema: (k_cache, v_cache) or (k_pages, v_pages, page_table)).

def _triton(paged, *args):
    from ...triton_kernels import tree_attention as kernels

    q, kv, rest, (num_splits, workspace, invariant) = ref.unpack(paged, args)
    run = kernels.tree_attention_paged if paged else kernels.tree_attention
    return run(q, *kv.tensors(), *rest, num_splits, workspace=workspace, invariant=invariant)


def _cuda_limits(paged, q, *args):
    """The CUDA kernel's launch limits (and its emulation's): None, or why a call exceeds them."""
    B, D, Hkv = q.shape[0], q.shape[3], ref.unpack(paged, (q, *args))[1].num_kv_heads
    if D > CUDA_MAX_D:
        return f"head dim D={D} > {CUDA_MAX_D}"
    if B * Hkv > CUDA_MAX_B_HKV:
        return f"B={B} * Hkv={Hkv} = {B * Hkv} > {CUDA_MAX_B_HKV} (grid y limit)"
    return None


def _triton_supports(paged, *args):
    from ...triton_kernels import tree_attention as kernels

    ok, why = (kernels.supports_paged if paged else kernels.supports)(*args)
    return None if ok else why


def _fake(q, *args, **kwargs):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


for _paged, _op in ((False, "tree_attention"), (True, "tree_attention_paged")):
    # The fake of the overload without a workspace too: what a compiled graph calls (no mutated argument).
    register_op(_op, functools.partial(ref.tree_attention, _paged), functools.partial(_triton, _paged), _fake,
                ("functional",))
    register_supports(_op, ("cuda", "cudasim"), functools.partial(_cuda_limits, _paged))
    register_supports(_op, ("triton",), functools.partial(_triton_supports, _paged))
