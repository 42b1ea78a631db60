"""kv_compact in Triton: one program per (layer, sequence, head, column block).

A program walks the accepted rows of its slice in chunks of BLOCK_A, in order. Within a chunk
it loads every source row before storing any (a CTA barrier separates the two, because the
thread that stores a row is not the one that may still have to load it). Across chunks the
in-order argument of csrc/kv_compact_common.h applies: a later chunk only reads rows at or past
its own destinations, which no earlier chunk wrote. Programs own disjoint slices and columns,
so they never race with each other.

``kv_compact_paged`` is the same kernel with ``PAGED`` set: rows are placed through the sequence's
page table (``_row_offsets``), slices have no sequence term.
"""
import triton
import triton.language as tl

BLOCK_A = 16  # rows per chunk: a typical accepted path fits in one
MAX_BLOCK_D = 128  # columns per program: a D=128 fp32 row is one 512-byte program row


@triton.jit
def _row_offsets(rows, ok, table_row, log2_page, num_pages, s_page, s_row, PAGED: tl.constexpr):
    """(element offsets, ok) of logical rows ``rows`` [BA] (int64) from the slice base. Paged: page
    table_row[row >> log2_page], slot row % page_size; a page id outside [0, num_pages) clears ok
    (unchecked input: the move is skipped, nothing is written out of bounds)."""
    if PAGED:
        page = tl.load(table_row + (rows >> log2_page), mask=ok, other=0).to(tl.int64)
        ok = ok & (page >= 0) & (page < num_pages)
        return page * s_page + (rows & ((1 << log2_page) - 1)) * s_row, ok
    else:
        return rows * s_row, ok


@triton.jit
def _kv_compact_kernel(
    k_ptr,  # [L, B, H, S, D], or PAGED [L, num_pages, page_size, H, D]; modified in place
    v_ptr,  # as k_ptr
    prefix_ptr,  # [B] int32
    idx_ptr,  # [B, A] int32
    lens_ptr,  # [B] int32
    pt_ptr,  # PAGED: page table [B, max_pages] int32 (else unused)
    B, H, S, D, A,  # S: logical rows of a slice (PAGED: max_pages * page_size)
    k_sl, k_sb, k_sh, k_ss,  # element strides of k_cache in L, B, H, S (D has stride 1; PAGED: k_sb = 0)
    v_sl, v_sb, v_sh, v_ss,
    s_pt, k_spg, v_spg, log2_page, num_pages,  # PAGED: table row stride, page strides, page size, pool size
    BLOCK_A: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr,
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
    table_row = pt_ptr + b * s_pt
    for a0 in range(0, n, BLOCK_A):
        j = a0 + tl.arange(0, BLOCK_A)
        in_n = j < n
        src = prefix + tl.load(idx_ptr + b * A + j, mask=in_n, other=0).to(tl.int64)
        dst = prefix + j
        # Same rule as kv_move_rows: skip identities and (unchecked) rows outside [0, S); paged,
        # also rows whose page id is out of range (kv_pool_row).
        ok = in_n & (src != dst) & (src >= 0) & (src < S) & (dst >= 0) & (dst < S)
        k_src, ok = _row_offsets(src, ok, table_row, log2_page, num_pages, k_spg, k_ss, PAGED)
        k_dst, ok = _row_offsets(dst, ok, table_row, log2_page, num_pages, k_spg, k_ss, PAGED)
        v_src, _ = _row_offsets(src, ok, table_row, log2_page, num_pages, v_spg, v_ss, PAGED)
        v_dst, _ = _row_offsets(dst, ok, table_row, log2_page, num_pages, v_spg, v_ss, PAGED)
        m = ok[:, None] & col_ok[None, :]
        k_rows = tl.load(k_slice + k_src[:, None] + cols[None, :], mask=m)
        v_rows = tl.load(v_slice + v_src[:, None] + cols[None, :], mask=m)
        tl.debug_barrier()  # every source of this chunk is read before any row is written
        tl.store(k_slice + k_dst[:, None] + cols[None, :], k_rows, mask=m)
        tl.store(v_slice + v_dst[:, None] + cols[None, :], v_rows, mask=m)


def block_d(D):
    return min(MAX_BLOCK_D, triton.next_power_of_2(D))


def kv_compact(k_cache, v_cache, prefix_lens, accept_idx, accept_lens):
    """Shape: k_cache, v_cache [L, B, H, S, D] (stride 1 in D), prefix_lens int32 [B],
    accept_idx int32 [B, A], accept_lens int32 [B] -> None (caches modified in place)."""
    L, B, H, S, D = k_cache.shape
    _launch(k_cache, v_cache, None, prefix_lens, accept_idx, accept_lens, L, B, H, S, D,
            (*k_cache.stride()[:4], *v_cache.stride()[:4]), (0, 0, 0, 0, 1))


def kv_compact_paged(k_pages, v_pages, page_table, prefix_lens, accept_idx, accept_lens):
    """The same kernel over paged caches (PAGED set).

    Shape: k_pages, v_pages [L, num_pages, page_size, H, D] (stride 1 in D, page_size a power of
    two), page_table int32 [B, max_pages], prefix_lens int32 [B], accept_idx int32 [B, A],
    accept_lens int32 [B] -> None (pages modified in place)."""
    L, N, P, H, D = k_pages.shape
    B, max_pages = page_table.shape
    table = page_table.contiguous()
    ks, vs = k_pages.stride(), v_pages.stride()
    _launch(k_pages, v_pages, table, prefix_lens, accept_idx, accept_lens, L, B, H, max_pages * P, D,
            (ks[0], 0, ks[3], ks[2], vs[0], 0, vs[3], vs[2]),
            (table.stride(0), ks[1], vs[1], P.bit_length() - 1, max(N, 1)))


def _launch(k, v, table, prefix_lens, accept_idx, accept_lens, L, B, H, S, D, strides, paging):
    A = accept_idx.shape[1]
    if k.numel() == 0 or A == 0 or B == 0:
        return
    bd = block_d(D)
    grid = (L * B * H, triton.cdiv(D, bd))
    idx = accept_idx.contiguous()
    _kv_compact_kernel[grid](
        k, v, prefix_lens.contiguous(), idx, accept_lens.contiguous(), table if table is not None else idx,
        B, H, S, D, A, *strides, *paging,
        BLOCK_A=BLOCK_A, BLOCK_D=bd, PAGED=table is not None)


_DTYPES = ("float32", "float16", "bfloat16")


def _aot_case(dtype, D, paged=False):
    """kv_compact of a [24 layers, 4 sequences, 8 heads, 4096 rows, D] cache (meta tensors); paged:
    kv_compact_paged of 24 layers of a pool of 1024 pages of 16 rows, 256 pages a sequence."""
    import torch

    def call():
        i32 = dict(dtype=torch.int32, device="meta")
        lens = (torch.empty(4, **i32), torch.empty(4, 16, **i32), torch.empty(4, **i32))
        if paged:
            k, v = (torch.empty(24, 1024, 16, 8, D, dtype=getattr(torch, dtype), device="meta") for _ in range(2))
            kv_compact_paged(k, v, torch.empty(4, 256, **i32), *lens)
        else:
            k, v = (torch.empty(24, 4, 8, 4096, D, dtype=getattr(torch, dtype), device="meta") for _ in range(2))
            kv_compact(k, v, *lens)
    return call


# One case per BLOCK_D the launcher picks (64; 128 for D >= 128) and dtype, contiguous and paged,
# launched by kv_compact(_paged) on meta tensors and compiled by specops.triton_kernels.aot as the
# JIT would.
AOT_SPECS = [(f"{'paged ' if paged else ''}{dt} D{D}", None, _aot_case(dt, D, paged), 0)
             for paged in (False, True) for dt in _DTYPES for D in (64, 128)]
