"""kv_compact in Triton: one program per (layer, sequence, head, column block).

A program walks the accepted rows of its slice in chunks of BLOCK_A, in order. Within a chunk
it loads every source row before storing any (a CTA barrier separates the two, because the
thread that stores a row is not the one that may still have to load it). Across chunks the
in-order argument of csrc/kv_compact_common.h applies: a later chunk only reads rows at or past
its own destinations, which no earlier chunk wrote. Programs own disjoint slices and columns,
so they never race with each other.
"""
import triton
import triton.language as tl

BLOCK_A = 16  # rows per chunk: a typical accepted path fits in one
MAX_BLOCK_D = 128  # columns per program: a D=128 fp32 row is one 512-byte program row


@triton.jit
def _kv_compact_kernel(
    k_ptr,  # [L, B, H, S, D] modified in place
    v_ptr,  # [L, B, H, S, D] modified in place
    prefix_ptr,  # [B] int32
    idx_ptr,  # [B, A] int32
    lens_ptr,  # [B] int32
    B, H, S, D, A,
    k_sl, k_sb, k_sh, k_ss,  # element strides of k_cache in L, B, H, S (D has stride 1)
    v_sl, v_sb, v_sh, v_ss,
    BLOCK_A: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    h = pid % H
    b = (pid // H) % B
    l = pid // (H * B)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    n = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), A)
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    k_slice = k_ptr + l * k_sl + b * k_sb + h * k_sh
    v_slice = v_ptr + l * v_sl + b * v_sb + h * v_sh
    for a0 in range(0, n, BLOCK_A):
        j = a0 + tl.arange(0, BLOCK_A)
        in_n = j < n
        src = prefix + tl.load(idx_ptr + b * A + j, mask=in_n, other=0).to(tl.int64)
        dst = prefix + j
        # Same rule as kv_move_rows: skip identities and (unchecked) rows outside [0, S).
        ok = in_n & (src != dst) & (src >= 0) & (src < S) & (dst >= 0) & (dst < S)
        m = ok[:, None] & col_ok[None, :]
        k_rows = tl.load(k_slice + src[:, None] * k_ss + cols[None, :], mask=m)
        v_rows = tl.load(v_slice + src[:, None] * v_ss + cols[None, :], mask=m)
        tl.debug_barrier()  # every source of this chunk is read before any row is written
        tl.store(k_slice + dst[:, None] * k_ss + cols[None, :], k_rows, mask=m)
        tl.store(v_slice + dst[:, None] * v_ss + cols[None, :], v_rows, mask=m)


def block_d(D):
    return min(MAX_BLOCK_D, triton.next_power_of_2(D))


def kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
    """Shape: k_cache, v_cache [L, B, H, S, D] (stride 1 in D), prefix_lens int32 [B],
    accept_idx int32 [B, A], accept_lens int32 [B] -> None (caches modified in place)."""
    L, B, H, S, D = k_cache.shape
    A = accept_idx.shape[1]
    if k_cache.numel() == 0 or A == 0:
        return
    bd = block_d(D)
    grid = (L * B * H, triton.cdiv(D, bd))
    _kv_compact_kernel[grid](
        k_cache, v_cache, prefix_lens.contiguous(), accept_idx.contiguous(), accept_lens.contiguous(),
        B, H, S, D, A, *k_cache.stride()[:4], *v_cache.stride()[:4],
        BLOCK_A=BLOCK_A, BLOCK_D=bd)


_DTYPES = ("float32", "float16", "bfloat16")


def _aot_case(dtype, D):
    """kv_compact of a [24 layers, 4 sequences, 8 heads, 4096 rows, D] cache (meta tensors)."""
    import torch

    def call():
        k, v = (torch.empty(24, 4, 8, 4096, D, dtype=getattr(torch, dtype), device="meta") for _ in range(2))
        i32 = dict(dtype=torch.int32, device="meta")
        kv_compact(k, v, torch.empty(4, **i32), torch.empty(4, 16, **i32), torch.empty(4, **i32))
    return call


# One case per BLOCK_D the launcher picks (64; 128 for D >= 128) and dtype, launched by
# kv_compact on meta tensors and compiled by specops.triton_kernels.aot as the JIT would.
AOT_SPECS = [(f"{dt} D{D}", None, _aot_case(dt, D), 0)
             for dt in _DTYPES for D in (64, 128)]
