"""Scalar and row helpers of the verification kernels (triton_kernels/verify.py): the Triton
twins of csrc/verify_common.h's arithmetic (same fp32 operation order, fixed-point weights) and
of csrc/cpu/verify_rows.cpp's row passes."""
import triton
import triton.language as tl

from .sampling import load_logits, warp_value

STAT_WORDS = tl.constexpr(5)  # a row's warping statistics: mx, t (fp32 bits), klo, s (fp32 bits), best


@triton.jit
def _exp2i(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fix(x, scale):
    c = tl.where(x > 0, tl.minimum(x, 1.0), 0.0)
    return (c * scale).to(tl.int64)


@triton.jit
def _accept(u, q, Z, r, Zq):
    return (u * q) * Z < r * Zq


@triton.jit
def _fallback(Zn, Z, Zq):
    return (~(Zn > 0)) | (Zn < (1e-12 * Z) * Zq)


@triton.jit
def _uniform_index(u, n):
    f = u * n.to(tl.float32)
    return tl.where(f > 0, tl.minimum(f, (n - 1).to(tl.float32)), 0.0).to(tl.int32)


@triton.jit
def _threshold(u, W):
    wf = W.to(tl.float32)
    f = u * wf
    t = tl.where(f > 0, tl.minimum(f, wf), 0.0).to(tl.int64)
    return tl.minimum(t, W - 1)


@triton.jit
def _det_exp(x):
    x = tl.where(x > -50.0, tl.where(x < 0.0, x, 0.0), -50.0)
    k = tl.floor(x * 1.44269502162933349609375 + 0.5)
    r = (x - k * 0.693145751953125) - k * 1.428606765330187045037746429443359375e-06
    p = r * 0.000198412701138295233249664306640625 + 0.001388888922519981861114501953125
    p = p * r + 0.008333333767950534820556640625
    p = p * r + 0.0416666679084300994873046875
    p = p * r + 0.16666667163372039794921875
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    return p * ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _det_log(x):
    # csrc/verify_common.h det_log: x = m 2**e, m in [sqrt(1/2), sqrt(2)); e ln 2 + log1p(m - 1)
    # by a degree-20 Taylor polynomial in the same operation order (fp32((-1)**(n+1) / n) written
    # out exactly); x below 2**-126 -> -inf, NaN stays NaN.
    tiny = x < 1.1754943508222875079687365372222456778186655567720875215087517062784172594547271728515625e-38
    bits = tl.where(tiny | (x != x), 1.0, x).to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = m > 1.41421353816986083984375
    m = tl.where(big, m * 0.5, m)
    e = tl.where(big, e + 1, e)
    r = m - 1.0
    p = r * -0.0500000007450580596923828125 + 0.052631579339504241943359375
    p = p * r + -0.0555555559694766998291015625
    p = p * r + 0.0588235296308994293212890625
    p = p * r + -0.0625
    p = p * r + 0.066666670143604278564453125
    p = p * r + -0.071428574621677398681640625
    p = p * r + 0.076923079788684844970703125
    p = p * r + -0.083333335816860198974609375
    p = p * r + 0.0909090936183929443359375
    p = p * r + -0.100000001490116119384765625
    p = p * r + 0.111111111938953399658203125
    p = p * r + -0.125
    p = p * r + 0.14285714924335479736328125
    p = p * r + -0.16666667163372039794921875
    p = p * r + 0.20000000298023223876953125
    p = p * r + -0.25
    p = p * r + 0.3333333432674407958984375
    p = p * r + -0.5
    p = p * r + 1.0
    ef = e.to(tl.float32)
    out = ef * 0.693145751953125 + (ef * 1.428606765330187045037746429443359375e-06 + p * r)
    return tl.where(x != x, x, tl.where(tiny, float("-inf"), out))


@triton.jit
def _logit_prob(row, offs, m, st, mrow=0, MASKED: tl.constexpr = False):
    """Entries offs (where m) of a row warped from its logits `row`, with the statistics at st
    (STAT_WORDS int32 each; st may be a tensor of pointers, one per entry); 0 where not m.
    MASKED: the logits the bitmask row mrow (int32 words; may be per entry like st) disallows are
    -inf, as they were for the statistics."""
    x = load_logits(row, offs, m, mrow, MASKED)
    mx = tl.load(st).to(tl.float32, bitcast=True)
    t = tl.load(st + 1).to(tl.float32, bitcast=True)
    klo = tl.load(st + 2)
    s = tl.load(st + 3).to(tl.float32, bitcast=True)
    best = tl.load(st + 4)
    return tl.where(m, warp_value(x, offs, t, mx, klo, s, best), 0.0)


@triton.jit
def _row_weights(row, offs, V, scale, LOGPROB: tl.constexpr, st, LOGITS: tl.constexpr, mrow, MASKED: tl.constexpr):
    if LOGITS:
        x = _logit_prob(row, offs, offs < V, st, mrow, MASKED)
    else:
        x = tl.load(row + offs, mask=offs < V, other=0.0).to(tl.float32)
    if LOGPROB:
        x = tl.where(offs < V, _det_exp(x), 0.0)
    return _fix(x, scale)


@triton.jit
def _sum_fix(row, V, scale, BLOCK_V: tl.constexpr, LOGPROB: tl.constexpr = False, st=0, LOGITS: tl.constexpr = False,
             mrow=0, MASKED: tl.constexpr = False):
    # LOGITS: row holds logits, warped with the statistics at st (MASKED: under the bitmask row
    # mrow; see _logit_prob).
    acc = tl.zeros([BLOCK_V], dtype=tl.int64)
    for start in range(0, V, BLOCK_V):
        acc += _row_weights(row, start + tl.arange(0, BLOCK_V), V, scale, LOGPROB, st, LOGITS, mrow, MASKED)
    return tl.sum(acc, axis=0)


@triton.jit
def _sample_row(row, V, scale, W, u, BLOCK_V: tl.constexpr, LOGPROB: tl.constexpr = False, st=0,
                LOGITS: tl.constexpr = False, mrow=0, MASKED: tl.constexpr = False):
    # Inverse CDF over the fixed-point weights: the first index whose running sum exceeds the
    # threshold, in two levels. Level 1: chunk totals (each a parallel sum over BLOCK_V tokens)
    # and a running scan over them, until the chunk where the sum passes the threshold; level 2:
    # one prefix scan inside that chunk (still in registers). The old walk ran a prefix scan and a
    # min over every chunk it passed. Integer weights >= 0: the same index as the walk and the
    # C++ kernels.
    t = _threshold(u, W)
    found = tl.full([], -1, tl.int64)
    run = tl.full([], 0, tl.int64)
    start = tl.full([], 0, tl.int64)
    while (found < 0) & (start < V) & (W > 0):
        offs = start + tl.arange(0, BLOCK_V)
        w = _row_weights(row, offs, V, scale, LOGPROB, st, LOGITS, mrow, MASKED)
        s = tl.sum(w, axis=0)
        if run + s > t:
            hit = (tl.cumsum(w, axis=0) + run > t) & (offs < V)
            found = tl.min(tl.where(hit, offs, V + BLOCK_V), axis=0)
            found = tl.where(found < V, found, -1)
        run += s
        start += BLOCK_V
    return tl.where(W > 0, tl.where(found >= 0, found, V - 1), 0).to(tl.int32)


@triton.jit
def _argmax_row(row, V, BLOCK_V: tl.constexpr, mask_row, MASKED: tl.constexpr):
    # First index of the maximum, NaN counting as +inf. MASKED: the tokens whose bit is clear in
    # mask_row (int32 words, bit j % 32 of word j // 32) count as -inf (apply_token_bitmask's rule).
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = load_logits(row, offs, offs < V, mask_row, MASKED)
        key = tl.where(x != x, float("inf"), x)
        cm = tl.max(key, axis=0)
        ci = tl.min(tl.where(key == cm, offs, V), axis=0)
        best_i = tl.where(cm > best, ci, best_i)
        best = tl.maximum(cm, best)
    return best_i


@triton.jit
def _load_row(kind, node, offs, m, p_ptr, q_ptr, buf_ptr, b, T, V, NB: tl.constexpr, st_ptr, N,
              LOGITS: tl.constexpr, mrow=0, MASKED: tl.constexpr = False):
    # kind 0: target row `node`, 1: draft row `node`, 2..: scratch row kind - 2 (the masked loads
    # of the rows not selected touch no memory). LOGITS: p_ptr / q_ptr hold logits [N, V], warped
    # with the statistics st_ptr [2, N, STAT_WORDS]; MASKED: under the bitmask row mrow, the walk's
    # node u (target row u's and its children's draft rows' mask; scratch rows are built masked).
    if LOGITS:
        r = b * T + node
        a = _logit_prob(p_ptr + r * V, offs, m & (kind == 0), st_ptr + r * STAT_WORDS, mrow, MASKED)
        c = _logit_prob(q_ptr + r * V, offs, m & (kind == 1), st_ptr + (N + r) * STAT_WORDS, mrow, MASKED)
    else:
        a = tl.load(p_ptr + (b * T + node) * V + offs, mask=m & (kind == 0), other=0.0)
        c = tl.load(q_ptr + (b * T + node) * V + offs, mask=m & (kind == 1), other=0.0)
    s = tl.load(buf_ptr + (b * NB + kind - 2) * V + offs, mask=m & (kind >= 2), other=0.0)
    return tl.where(kind == 0, a, tl.where(kind == 1, c, s))


@triton.jit
def _load_at(kind, node, x, p_ptr, q_ptr, buf_ptr, b, T, V, NB: tl.constexpr, st_ptr, N, LOGITS: tl.constexpr, mrow=0,
             MASKED: tl.constexpr = False):
    return _load_row(kind, node, x, (x >= 0) & (x < V), p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS, mrow,
                     MASKED)
