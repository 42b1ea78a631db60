"""warp_probs in Triton: one program per row, streaming the row in tiles.

The scaled logits are ``z = (x - max x) / t`` (the row max subtracted first, so nothing
overflows and max z = 0). The top-k / top-p thresholds are radix selects on the order-preserving
keys of z (``float_key`` of csrc/sampling_common.h), with radix_pick's digit rule:

* top-k: four 8-bit digits, each one pass over the row whose histogram is ``tl.histogram``
  (counts need no weights);
* top-p: the candidates' fixed-point mass total (one pass), then one pass that compacts into the
  output row, used as scratch, the tokens that can matter: those of the top-k survivors whose
  mass reaches (total - target) / V (lighter ones hold less than total - target together, so the
  threshold lies above them; the CPU kernel prunes the same way), and eight 4-bit digit passes
  over those candidates only, each a 16-bin weighted histogram (one-hot tile of int64 masses:
  ``tl.histogram`` has no weights).

Roofline model (not a measurement; V = 128K fp32 logits, temperature, top-k and top-p on): the
old kernel read the row 20 times and wrote it once (11 MB per row) and bisected each of 16 digit
passes with 16 int64 compare/select/add per token (about 256 per token); the new one reads the
row 7 times and writes it once (4.2 MB per row), plus the passes over the candidates (at most 16
int64 select/add per candidate per top-p pass; typically a few hundred candidates, at worst V).
One program per row (one launch; a split of rows over programs would need a launch per pass):
if an SM draws 1/132 of the H100's 3.35 TB/s (1/108 of the A100's 2.0 TB/s), a row takes about
165 us (227 us) bandwidth-bound, for N = 1 and N = 64 alike (64 programs on 64 SMs), against
430 us (590 us) of traffic alone before. Same rule and same fixed-point mass as the C++ kernels.
"""
import os

import torch
import triton
import triton.language as tl

NUM_WARPS = 4
MIN_TEMPERATURE = tl.constexpr(1.1754943508222875e-38)  # 2**-126: below it greedy (sampling_common.h)
MAX_VOCAB = 2**31 - 1  # int32 token offsets
INT_MIN = tl.constexpr(-2147483648)


def _blocks(V):
    """(BLOCK, BLOCK_SEL): tiles of the streaming passes and of the top-p digit passes (which hold
    a [BLOCK_SEL, 16] int64 tile). The interpreter pays per operation, not per element: wider
    tiles run faster there."""
    wide = os.environ.get("TRITON_INTERPRET") == "1"
    return min(triton.next_power_of_2(V), 8192 if wide else 1024), 4096 if wide else 256


def mass_scale(V):
    """2**S, S = min(40, 62 - ceil(log2 V)): fixed-point scale of the top-p mass (mass_shift in
    csrc/sampling_common.h); a row's total stays below 2**62 for every V."""
    bits = max(0, V - 1).bit_length()
    return float(2 ** (40 if bits <= 22 else 62 - bits))


@triton.jit
def _key(z):
    """Order-preserving signed int32 key of fp32 values (-0.0 shares the key of +0.0)."""
    z = tl.where(z == 0.0, 0.0, z)
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _digits(z):
    """float_key(z) of csrc/sampling_common.h (unsigned order = float order), as int32 bits: the
    radix digits are taken from it."""
    return _key(z) ^ INT_MIN


@triton.jit
def load_logits(x_row, offs, valid, mask_row, MASKED: tl.constexpr):
    """Logits ``offs`` of a row as fp32, -inf where not valid. MASKED: also -inf where the
    bitmask row ``mask_row`` (int32 words, bit j % 32 of word j // 32: apply_token_bitmask's
    layout) clears the bit, at the load, so a NaN / +inf at a disallowed token is never used."""
    x = tl.load(x_row + offs, mask=valid, other=float("-inf")).to(tl.float32)
    if MASKED:
        words = tl.load(mask_row + (offs >> 5), mask=valid, other=0)
        x = tl.where(((words >> (offs & 31)) & 1) != 0, x, float("-inf"))
    return x


@triton.jit
def _load_z(x_row, offs, V, t, mx, mask_row, MASKED: tl.constexpr):
    """z = (x - mx) / t, each operation rounded on its own; padding (and MASKED, disallowed) lanes get -inf."""
    valid = offs < V
    x = load_logits(x_row, offs, valid, mask_row, MASKED)
    return tl.math.div_rn(x - mx, t), valid


@triton.jit
def _mass(z, scale):
    return (tl.exp(z) * scale).to(tl.int64)


@triton.jit
def _pick(hist, bins, above, target):
    """radix_pick (csrc/sampling_common.h): the largest digit d >= 1 with above + W(digit >= d) >=
    target, else 0; and above plus the weight of the digits above d."""
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    ok = (bins >= 1) & (above + at_or_above >= target)
    d = tl.max(tl.where(ok, bins, 0), axis=0)
    return d, above + tl.sum(tl.where(bins > d, hist, 0), axis=0)


@triton.jit
def _candidate_pass(cand_row, n, d_prev, scale, SHIFT: tl.constexpr, BITS: tl.constexpr, FIRST: tl.constexpr,
                    MASS: tl.constexpr, COMPACT: tl.constexpr, BLOCK: tl.constexpr):
    """One digit pass over the candidates cand_row[:n] (their z values). Unless FIRST, only those
    whose digit above this one (bits SHIFT + BITS ..) is d_prev take part. Returns the histogram
    of the digit at SHIFT (BITS wide; counts, or with MASS fixed-point masses) and, with COMPACT,
    moves the taking part to the front of cand_row (in order) and returns their number."""
    NB: tl.constexpr = 1 << BITS
    bins = tl.arange(0, NB)
    if MASS:
        acc = tl.zeros([BLOCK, NB], dtype=tl.int64)
    else:
        acc = tl.zeros([NB], dtype=tl.int32)
    m = tl.zeros([], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n
        z = tl.load(cand_row + offs, mask=live, other=0.0)
        kb = _digits(z)
        if not FIRST:
            live = live & (((kb >> (SHIFT + BITS)) & (NB - 1)) == d_prev)
        digit = (kb >> SHIFT) & (NB - 1)
        if MASS:
            w = tl.where(live, _mass(z, scale), 0)
            acc += tl.where(digit[:, None] == bins[None, :], w[:, None], 0)
        else:
            acc += tl.histogram(digit, NB, mask=live)
        if COMPACT:
            # In place: every thread has read this tile before any thread overwrites its front.
            tl.debug_barrier()
            c = live.to(tl.int32)
            tl.store(cand_row + m + tl.cumsum(c, axis=0) - 1, z, mask=live)
            m += tl.sum(c, axis=0)
    tl.debug_barrier()  # the candidates are read next by other threads than wrote them
    if MASS:
        hist = tl.sum(acc, axis=0)
    else:
        hist = acc.to(tl.int64)
    return hist, m


@triton.jit
def count_select(x_row, cand_row, V, t, mx, k, BLOCK: tl.constexpr, mask_row, MASKED: tl.constexpr):
    """float_key bits of the max key kappa with #(key >= kappa) >= k (the k-th largest z), in
    four 8-bit digits. The second pass also copies the tokens of the first digit to cand_row (V
    fp32 of scratch); the last two passes read only those, shrinking them once more."""
    bins = tl.arange(0, 256)
    hist = tl.zeros([256], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx, mask_row, MASKED)
        hist += tl.histogram((_digits(z) >> 24) & 255, 256, mask=valid)
    d0, above = _pick(hist.to(tl.int64), bins, tl.zeros([], dtype=tl.int64), k)
    hist = tl.zeros([256], dtype=tl.int32)
    n = tl.zeros([], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx, mask_row, MASKED)
        kb = _digits(z)
        live = valid & (((kb >> 24) & 255) == d0)
        hist += tl.histogram((kb >> 16) & 255, 256, mask=live)
        c = live.to(tl.int32)
        tl.store(cand_row + n + tl.cumsum(c, axis=0) - 1, z, mask=live)
        n += tl.sum(c, axis=0)
    tl.debug_barrier()
    d1, above = _pick(hist.to(tl.int64), bins, above, k)
    hist, n = _candidate_pass(cand_row, n, d1, 1.0, 8, 8, False, False, True, BLOCK)
    d2, above = _pick(hist, bins, above, k)
    hist, n = _candidate_pass(cand_row, n, d2, 1.0, 0, 8, False, False, False, BLOCK)
    d3, above = _pick(hist, bins, above, k)
    return (d0 << 24) | (d1 << 16) | (d2 << 8) | d3


@triton.jit
def mass_select(x_row, cand_row, V, t, mx, scale, klo, p, BLOCK: tl.constexpr, BLOCK_SEL: tl.constexpr, mask_row,
                MASKED: tl.constexpr):
    """float_key bits of the max key kappa whose fixed-point mass M(key >= kappa), over the tokens
    with key >= klo (signed _key), reaches top_p_target(p, total), in eight 4-bit digits.
    cand_row: V fp32 of scratch."""
    total = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BLOCK):
        z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx, mask_row, MASKED)
        total += tl.sum(tl.where(valid & (_key(z) >= klo), _mass(z, scale), 0), axis=0)
    # top_p_target: the smallest integer >= p * total, within [1, total].
    want = p.to(tl.float64) * total.to(tl.float64)
    target = want.to(tl.int64)
    target += (target.to(tl.float64) < want).to(tl.int64)
    target = tl.minimum(tl.maximum(target, 1), total)
    # The candidates: masses >= slack. The others are each below (total - target) / V, so they
    # hold less than total - target, and they are the lowest keys: the threshold lies above them.
    slack = (total - target) // V
    n = tl.zeros([], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx, mask_row, MASKED)
        w = _mass(z, scale)
        cand = valid & (_key(z) >= klo) & (w > 0) & (w >= slack)
        c = cand.to(tl.int32)
        tl.store(cand_row + n + tl.cumsum(c, axis=0) - 1, z, mask=cand)
        n += tl.sum(c, axis=0)
    tl.debug_barrier()
    bins = tl.arange(0, 16)
    # Each pass keeps (compacts) the candidates of the digit picked before it.
    hist, _ = _candidate_pass(cand_row, n, 0, scale, 28, 4, True, True, False, BLOCK_SEL)
    d, above = _pick(hist, bins, tl.zeros([], dtype=tl.int64), target)
    kappa = d << 28
    for j in tl.static_range(1, 8):
        hist, n = _candidate_pass(cand_row, n, d, scale, 28 - 4 * j, 4, False, True, True, BLOCK_SEL)
        d, above = _pick(hist, bins, above, target)
        kappa = kappa | (d << (28 - 4 * j))
    return kappa


@triton.jit
def row_stats(x_row, cand_row, V, t, k, p, scale, BLOCK: tl.constexpr, BLOCK_SEL: tl.constexpr, mask_row=0,
              MASKED: tl.constexpr = False):
    """What a warped row is made of: (mx, klo, s, best). The row max mx, the kept set
    ``_key(z) >= klo``, the fp32 sum s of exp(z) over it (in BLOCK tiles: the tile width fixes the
    summation order), and for a greedy row (t below MIN_TEMPERATURE) the index ``best >= 0`` of its
    one-hot (-1 otherwise; mx = 0 then). cand_row: V fp32 of scratch when top-k or top-p is on.
    MASKED: the row as if the logits its bitmask row mask_row disallows were -inf (load_logits)."""
    mx = tl.full([], 0.0, tl.float32)
    klo = tl.full([], -2147483648, tl.int32)  # keep _key(z) >= klo
    s = tl.full([], 1.0, tl.float32)
    best_idx = tl.full([], -1, tl.int32)
    if t >= MIN_TEMPERATURE:
        # Subtract the row max before dividing: huge logits and tiny t stay finite, max z = 0.
        mx = tl.full([], float("-inf"), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = load_logits(x_row, offs, offs < V, mask_row, MASKED)
            mx = tl.maximum(mx, tl.max(x, axis=0))
        if (k > 0) & (k < V):
            klo = count_select(x_row, cand_row, V, t, mx, k.to(tl.int64), BLOCK, mask_row, MASKED) ^ INT_MIN
        if p < 1.0:
            kp = mass_select(x_row, cand_row, V, t, mx, scale, klo, p, BLOCK, BLOCK_SEL, mask_row, MASKED) ^ INT_MIN
            klo = tl.maximum(klo, kp)
        s = tl.zeros([], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx, mask_row, MASKED)
            s += tl.sum(tl.where(valid & (_key(z) >= klo), tl.exp(z), 0.0), axis=0)
    else:
        # Greedy: the first index of the maximal logit.
        best = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.zeros([], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = load_logits(x_row, offs, offs < V, mask_row, MASKED)
            tmax = tl.max(x, axis=0)
            tidx = tl.min(tl.where(x == tmax, offs, V), axis=0)
            better = tmax > best
            best_idx = tl.where(better, tidx, best_idx)
            best = tl.where(better, tmax, best)
    return mx, klo, s, best_idx


@triton.jit
def warp_value(x, offs, t, mx, klo, s, best):
    """Entries ``offs`` of the warped row from their logits x (fp32) and the row's row_stats (t is
    only read by non-greedy rows: pass 1 for greedy ones). verify_tree_logits evaluates its
    probabilities with this very function, so they equal warp_probs' bit for bit."""
    z = tl.math.div_rn(x - mx, t)
    e = tl.where(_key(z) >= klo, tl.exp(z), 0.0)
    return tl.where(best >= 0, tl.where(offs == best, 1.0, 0.0), e / s)


@triton.jit
def _warp_probs_kernel(
    logits_ptr,  # [N, V] fp32/bf16/fp16, row stride stride_row
    temp_ptr,  # [N] fp32
    top_k_ptr,  # [N] int32
    top_p_ptr,  # [N] fp32
    out_ptr,  # [N, V] fp32 (also the top-p candidates' scratch)
    V,
    stride_row,
    scale,  # fp32 2**S, the fixed-point scale of the top-p mass (mass_scale(V))
    BLOCK: tl.constexpr,
    BLOCK_SEL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_row
    o_row = out_ptr + row * V
    t = tl.load(temp_ptr + row)
    mx, klo, s, best = row_stats(x_row, o_row, V, t, tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), scale,
                                 BLOCK, BLOCK_SEL)
    t = tl.where(best >= 0, 1.0, t)
    tl.debug_barrier()  # the candidates in o_row are read before they are overwritten
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        tl.store(o_row + offs, warp_value(x, offs, t, mx, klo, s, best), mask=offs < V)


def warp_probs(logits, temperature, top_k, top_p):
    """Shape: logits [N, V], temperature fp32 [N], top_k int32 [N], top_p fp32 [N] -> fp32 [N, V].

    V <= MAX_VOCAB (int32 offsets; the op checks it before calling)."""
    N, V = logits.shape
    if V > 1 and logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(N, V, dtype=torch.float32, device=logits.device)
    if N and V:
        block, block_sel = _blocks(V)
        _warp_probs_kernel[(N,)](logits, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(),
                                 out, V, logits.stride(0), mass_scale(V), BLOCK=block, BLOCK_SEL=block_sel,
                                 num_warps=NUM_WARPS)
    return out


def _aot_case(dtype):
    def call():
        f32 = dict(dtype=torch.float32, device="meta")
        warp_probs(torch.empty(8, 49152, dtype=dtype, device="meta"), torch.empty(8, **f32),
                   torch.empty(8, dtype=torch.int32, device="meta"), torch.empty(8, **f32))
    return call


# One launch per logits dtype (V = 49152), made by warp_probs on meta tensors and compiled by
# specops.triton_kernels.aot as the JIT would.
AOT_SPECS = [(str(dt)[6:], None, _aot_case(dt), 0) for dt in (torch.float32, torch.bfloat16, torch.float16)]
