"""warp_probs in Triton: one program per row, streaming the row in tiles.

The scaled logits are ``z = (x - max x) / t`` (the row max subtracted first, so nothing
overflows and max z = 0). The top-k / top-p thresholds are found by a 16-way bisection over
order-preserving int32 keys of z: each of 8 passes counts (or sums the fixed-point mass of) the tokens at
or above 16 candidate thresholds and keeps the highest one that still reaches the target, so
the exact threshold key comes out after 8 passes with no sort and no shared-memory histogram.
Same rule and same fixed-point mass as the C++ kernels (csrc/sampling_common.h).
"""
import torch
import triton
import triton.language as tl

BLOCK = 1024  # streaming passes (max, mass, write)
BLOCK_SEL = 256  # bisection passes hold a [BLOCK_SEL, 16] comparison tile
NUM_WARPS = 4
MIN_TEMPERATURE = tl.constexpr(1.1754943508222875e-38)  # 2**-126: below it greedy (sampling_common.h)
MAX_VOCAB = 2**31 - 1  # int32 token offsets


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
def _load_z(x_row, offs, V, t, mx):
    """z = (x - mx) / t, each operation rounded on its own; padding lanes get -inf."""
    valid = offs < V
    x = tl.load(x_row + offs, mask=valid, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(x - mx, t), valid


@triton.jit
def select_key(x_row, V, t, mx, scale, klo, target, MASS: tl.constexpr, BLOCK_SEL: tl.constexpr):
    """max key kappa with W(key >= kappa) >= target, over the tokens with key >= klo.

    W counts tokens (MASS=False) or sums their fixed-point mass exp(z) * scale (MASS=True)."""
    d = tl.arange(0, 16).to(tl.int64)
    lo = tl.full([], -2147483648, tl.int64)
    for i in tl.static_range(8):
        thr = lo + d * (1 << (28 - 4 * i))  # [16]
        acc = tl.zeros([16], dtype=tl.int64)
        for start in range(0, V, BLOCK_SEL):
            offs = start + tl.arange(0, BLOCK_SEL)
            z, valid = _load_z(x_row, offs, V, t, mx)
            key = _key(z)
            live = valid & (key >= klo)
            if MASS:
                w = tl.where(live, (tl.exp(z) * scale).to(tl.int64), 0)
            else:
                w = live.to(tl.int64)
            hit = key.to(tl.int64)[:, None] >= thr[None, :]
            acc += tl.sum(tl.where(hit, w[:, None], 0), axis=0)
        lo += tl.max(tl.where(acc >= target, d, 0), axis=0) * (1 << (28 - 4 * i))
    return lo.to(tl.int32)


@triton.jit
def _warp_probs_kernel(
    logits_ptr,  # [N, V] fp32/bf16/fp16, row stride stride_row
    temp_ptr,  # [N] fp32
    top_k_ptr,  # [N] int32
    top_p_ptr,  # [N] fp32
    out_ptr,  # [N, V] fp32
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
    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    if t >= MIN_TEMPERATURE:
        # Subtract the row max before dividing: huge logits and tiny t stay finite, max z = 0.
        mx = tl.full([], float("-inf"), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            mx = tl.maximum(mx, tl.max(x, axis=0))
        klo = tl.full([], -2147483648, tl.int32)  # keep key >= klo
        if (k > 0) & (k < V):
            klo = select_key(x_row, V, t, mx, scale, klo, k.to(tl.int64), False, BLOCK_SEL)
        if p < 1.0:
            total = tl.zeros([], dtype=tl.int64)
            for start in range(0, V, BLOCK):
                z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx)
                live = valid & (_key(z) >= klo)
                total += tl.sum(tl.where(live, (tl.exp(z) * scale).to(tl.int64), 0), axis=0)
            # top_p_target: the smallest integer >= p * total, within [1, total].
            want = p.to(tl.float64) * total.to(tl.float64)
            target = want.to(tl.int64)
            target += (target.to(tl.float64) < want).to(tl.int64)
            target = tl.minimum(tl.maximum(target, 1), total)
            klo = tl.maximum(klo, select_key(x_row, V, t, mx, scale, klo, target, True, BLOCK_SEL))
        s = tl.zeros([], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            z, valid = _load_z(x_row, start + tl.arange(0, BLOCK), V, t, mx)
            s += tl.sum(tl.where(valid & (_key(z) >= klo), tl.exp(z), 0.0), axis=0)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z, valid = _load_z(x_row, offs, V, t, mx)
            e = tl.where(_key(z) >= klo, tl.exp(z), 0.0)
            tl.store(o_row + offs, e / s, mask=valid)
    else:
        # Greedy: the first index of the maximal logit.
        best = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.zeros([], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            tmax = tl.max(x, axis=0)
            tidx = tl.min(tl.where(x == tmax, offs, V), axis=0)
            better = tmax > best
            best_idx = tl.where(better, tidx, best_idx)
            best = tl.where(better, tmax, best)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(o_row + offs, tl.where(offs == best_idx, 1.0, 0.0), mask=offs < V)


def warp_probs(logits, temperature, top_k, top_p):
    """Shape: logits [N, V], temperature fp32 [N], top_k int32 [N], top_p fp32 [N] -> fp32 [N, V].

    V <= MAX_VOCAB (int32 offsets; the op checks it before calling)."""
    N, V = logits.shape
    if V > 1 and logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(N, V, dtype=torch.float32, device=logits.device)
    if N and V:
        _warp_probs_kernel[(N,)](logits, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(),
                                 out, V, logits.stride(0), mass_scale(V), BLOCK=BLOCK, BLOCK_SEL=BLOCK_SEL,
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
