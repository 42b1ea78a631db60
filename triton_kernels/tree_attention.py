"""tree_attention in Triton: FlashAttention-2 style, two phases (prefix tiles without a mask test,
then block tiles with bit tests), and a split-K (flash-decoding) variant whose partials a second
kernel merges by log-sum-exp, for few query rows over a long prefix.

One program owns BLOCK_M query rows of one (sequence b, kv head g): row m is query m // G of head
g * G + m % G, so each K/V tile is loaded once for the whole GQA group. Scores live in base 2
(scaled by sm_scale * log2 e); the running max/sum/accumulator are fp32.
"""
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, s_ok, qk_scale,
                 BOUNDED: tl.constexpr, UPCAST: tl.constexpr):
    """One K/V tile: scores, online softmax, accumulate. key_ok [BN] bounds the keys (BOUNDED),
    s_ok [BM, BN] is the visibility of block keys (None-like all-true for prefix tiles)."""
    if BOUNDED:
        k = tl.load(k_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    else:
        k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    # ieee: fp32 inputs must not be rounded to tf32 (ignored for bf16/fp16 inputs).
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [BM, BN]
    s = tl.where(s_ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing stay finite
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i


@triton.jit
def _tree_attention_kernel(
    q_ptr,  # [B, Tq, Hq, D]
    k_ptr,  # [B, Hkv, S, D]
    v_ptr,  # [B, Hkv, S, D]
    out_ptr,  # [B, Tq, Hq, D] (final) or part_o [NS, B, Tq, Hq, D] fp32 (SPLIT)
    lse_ptr,  # [NS, B, Tq, Hq] fp32 (SPLIT only)
    prefix_ptr, block_ptr, qlen_ptr,  # [B] int32
    mask_ptr,  # [B, Tq, W] int32
    sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
    B, Tq, Hq, Hkv, S, W, D, qk_scale,
    NS,  # number of kv splits (grid dim 2)
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_QLEN: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bg = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    b = bg // Hkv
    g = bg % Hkv
    # Lengths clamped into range (check=False must not read out of bounds).
    P = tl.minimum(tl.maximum(tl.load(prefix_ptr + b), 0), S)
    L = tl.minimum(tl.maximum(tl.load(block_ptr + b), 0), tl.minimum(S - P, 32 * W))
    if HAS_QLEN:
        QL = tl.minimum(tl.maximum(tl.load(qlen_ptr + b), 0), Tq)
    else:
        QL = Tq

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // G
    head = g * G + rows % G
    in_rows = qi < Tq
    row_ok = qi < QL
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    q_ptrs = q_ptr + b * sq_b + qi[:, None].to(tl.int64) * sq_t + head[:, None] * sq_h + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + b * sk_b + g * sk_h
    v_base = v_ptr + b * sv_b + g * sv_h

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    n_prefix = tl.cdiv(P, BLOCK_N)
    n_tiles = n_prefix + tl.cdiv(L, BLOCK_N)
    t0 = (n_tiles * split) // NS
    t1 = (n_tiles * (split + 1)) // NS
    all_true = row_ok[:, None] & (offs_n[None, :] >= 0)

    # Phase 1: whole prefix tiles, no mask test at all.
    for t in range(t0, tl.minimum(t1, P // BLOCK_N)):
        keys = t * BLOCK_N + offs_n
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q,
            k_base + keys[:, None].to(tl.int64) * sk_s + offs_d[None, :],
            v_base + keys[:, None].to(tl.int64) * sv_s + offs_d[None, :],
            keys < P, d_ok, all_true, qk_scale, BOUNDED=False, UPCAST=UPCAST)
    # The prefix's partial last tile, bounds-checked.
    t_part = P // BLOCK_N
    if (P % BLOCK_N != 0) & (t_part >= t0) & (t_part < t1):
        keys = t_part * BLOCK_N + offs_n
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q,
            k_base + keys[:, None].to(tl.int64) * sk_s + offs_d[None, :],
            v_base + keys[:, None].to(tl.int64) * sv_s + offs_d[None, :],
            keys < P, d_ok, all_true & (keys < P)[None, :], qk_scale, BOUNDED=True, UPCAST=UPCAST)
    # Phase 2: block tiles, key j visible to query i iff bit j % 32 of mask[b, i, j // 32].
    mask_rows = mask_ptr + (b * Tq + tl.minimum(qi, Tq - 1).to(tl.int64)) * W
    for t in range(tl.maximum(t0, n_prefix), t1):
        j = (t - n_prefix) * BLOCK_N + offs_n
        j_ok = j < L
        keys = P + j
        words = tl.load(mask_rows[:, None] + (j[None, :] >> 5), mask=row_ok[:, None] & j_ok[None, :], other=0)
        visible = ((words >> (j[None, :] & 31)) & 1) != 0
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q,
            k_base + keys[:, None].to(tl.int64) * sk_s + offs_d[None, :],
            v_base + keys[:, None].to(tl.int64) * sv_s + offs_d[None, :],
            j_ok, d_ok, visible & row_ok[:, None], qk_scale, BOUNDED=True, UPCAST=UPCAST)

    seen = row_ok & (l_i > 0)
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    out_rows = ((b * Tq + qi.to(tl.int64)) * Hq + head)  # row index of [B, Tq, Hq]
    if SPLIT:
        part = split.to(tl.int64) * B * Tq * Hq + out_rows
        tl.store(out_ptr + part[:, None] * D + offs_d[None, :], o, mask=in_rows[:, None] & d_ok[None, :])
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + part, lse, mask=in_rows)
    else:
        tl.store(out_ptr + out_rows[:, None] * D + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=in_rows[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(
    part_ptr,  # [NS, R, D] fp32, R = B * Tq * Hq
    lse_ptr,  # [NS, R] fp32
    out_ptr,  # [R, D]
    R, D, NS,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    lse = tl.load(lse_ptr + offs_s[None, :].to(tl.int64) * R + rows[:, None],
                  mask=r_ok[:, None] & s_ok[None, :], other=float("-inf"))  # [BR, BS]
    mx = tl.max(lse, axis=1)
    any_seen = mx > float("-inf")
    w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.where(any_seen, mx, 0.0)[:, None]), 0.0)
    total = tl.sum(w, axis=1)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s in range(0, NS):
        ws = tl.sum(tl.where(offs_s[None, :] == s, w, 0.0), axis=1)
        po = tl.load(part_ptr + (s * R + rows[:, None]) * D + offs_d[None, :],
                     mask=r_ok[:, None] & d_ok[None, :], other=0.0)
        acc += ws[:, None] * po
    o = tl.where(any_seen[:, None], acc / tl.where(any_seen, total, 1.0)[:, None], 0.0)
    tl.store(out_ptr + rows[:, None] * D + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])


def _interpreting():
    return os.environ.get("TRITON_INTERPRET") == "1"


def _block_m(rows, dtype):
    # fp32 runs exact (ieee) dots on CUDA cores: smaller tiles, and a 64 x 64 x 128 fp32 tile
    # set with the default pipelining would overflow an SM's shared memory.
    return 16 if rows <= 16 else (32 if dtype == torch.float32 else 64)


def _block_n(dtype):
    return 32 if dtype == torch.float32 else 64


def _auto_splits(q, n_programs, S, BLOCK_N):
    """Split the keys when the (row tile, sequence, kv head) programs cannot fill the device."""
    if q.is_cuda:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    else:
        sms = 2  # the interpreter: split small problems too, so the path is exercised
    if n_programs >= sms or S < 4 * BLOCK_N:
        return 1
    return max(1, min(triton.cdiv(2 * sms, n_programs), triton.cdiv(S, 4 * BLOCK_N), 64))


def tree_attention(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits=None):
    """Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D], prefix_lens / block_lens / q_lens
    int32 [B] (q_lens may be None), mask int32 [B, Tq, W] -> out [B, Tq, Hq, D] in q's dtype.
    ``num_splits`` forces the number of kv splits (None: chosen from the problem and device)."""
    B, Tq, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    W = mask.shape[2]
    out = torch.empty(B, Tq, Hq, D, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if q.stride(3) != 1:
        q = q.contiguous()
    mask = mask.contiguous()
    rows = Tq * G
    BLOCK_M = _block_m(rows, q.dtype)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_N = _block_n(q.dtype)
    n_m = triton.cdiv(rows, BLOCK_M)
    ns = num_splits or _auto_splits(q, n_m * B * Hkv, S, BLOCK_N)
    qlen = q_lens if q_lens is not None else prefix_lens  # unused pointer when HAS_QLEN is False
    common = dict(G=G, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, HAS_QLEN=q_lens is not None,
                  UPCAST=_interpreting() and q.dtype != torch.float32)
    args = (q, k_cache, v_cache)
    strides = (q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    sizes = (B, Tq, Hq, Hkv, S, W, D, float(sm_scale) * LOG2E)
    grid = (n_m, B * Hkv, ns)
    if ns == 1:
        _tree_attention_kernel[grid](*args, out, out, prefix_lens, block_lens, qlen, mask, *strides, *sizes, 1,
                                     SPLIT=False, **common)
        return out
    part = torch.empty(ns, B * Tq * Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(ns, B * Tq * Hq, dtype=torch.float32, device=q.device)
    _tree_attention_kernel[grid](*args, part, lse, prefix_lens, block_lens, qlen, mask, *strides, *sizes, ns,
                                 SPLIT=True, **common)
    R = B * Tq * Hq
    BLOCK_R = 16
    _combine_kernel[(triton.cdiv(R, BLOCK_R),)](part, lse, out, R, D, ns, BLOCK_R=BLOCK_R,
                                                BLOCK_S=max(2, triton.next_power_of_2(ns)), BLOCK_D=BLOCK_D)
    return out


def _fwd_spec(dtype, block_m, block_d, split, g=4, has_qlen=True):
    block_n = _block_n({"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype])
    ptr = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    sig = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "out_ptr": "*fp32" if split else ptr, "lse_ptr": "*fp32",
           "prefix_ptr": "*i32", "block_ptr": "*i32", "qlen_ptr": "*i32", "mask_ptr": "*i32"}
    for name in ("sq_b", "sq_t", "sq_h", "sk_b", "sk_h", "sk_s", "sv_b", "sv_h", "sv_s"):
        sig[name] = "i64"
    for name in ("B", "Tq", "Hq", "Hkv", "S", "W", "D"):
        sig[name] = "i32"
    sig.update(qk_scale="fp32", NS="i32")
    const = dict(G=g, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, HAS_QLEN=has_qlen, SPLIT=split,
                 UPCAST=False)
    for name in const:
        sig[name] = "constexpr"
    return (_tree_attention_kernel, sig, const)


# The launcher's real configs, one per tile shape it picks: BLOCK_M 16 (split-K) or 64 (32 for
# fp32), BLOCK_N 64 (32 for fp32), BLOCK_D 64 or 128, each dtype once; G and HAS_QLEN are free
# constexprs (shown with two values each).
AOT_SPECS = [
    _fwd_spec("bf16", 64, 128, False, g=4),
    _fwd_spec("fp16", 64, 64, False, g=7, has_qlen=False),
    _fwd_spec("fp32", 32, 128, False, g=4),
    _fwd_spec("bf16", 16, 128, True, g=4),
    (_combine_kernel,
     {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*bf16", "R": "i32", "D": "i32", "NS": "i32",
      "BLOCK_R": "constexpr", "BLOCK_S": "constexpr", "BLOCK_D": "constexpr"},
     {"BLOCK_R": 16, "BLOCK_S": 16, "BLOCK_D": 128}),
]
