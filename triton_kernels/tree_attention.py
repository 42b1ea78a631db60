"""tree_attention in Triton: FlashAttention-2 style, one loop over the prefix tiles (no mask bits)
then the block tiles (bit tests), and a split-K (flash-decoding) variant whose partials a second
kernel merges by log-sum-exp, for few query rows over a long prefix.

One program owns BLOCK_M query rows of one (sequence b, kv head g): row m is query m // G of head
g * G + m % G, so each K/V tile is loaded once for the whole GQA group. Scores live in base 2
(scaled by sm_scale * log2 e); the running max/sum/accumulator are fp32.

Tile shapes, warps and pipeline stages come from one table (CONFIGS) per GPU architecture, head
size class and dtype; ``plan`` turns a call into the exact kernel launches, which both the launcher
and the AOT budget check (``python -m specops.triton_kernels.aot``) use, so the check compiles the
kernels users get. ``supports`` says, before any launch, whether a shape can run here.

``tree_attention_paged`` is the same kernel with ``PAGED`` set: K/V rows come from a paged cache
([num_pages, page_size, Hkv, D], vLLM's layout) through the sequence's page table, in ``_kv_rows``,
the one place the kernel addresses a K/V row.

``invariant=True`` is the same kernel with ``INVARIANT`` set: the batch-invariant schedule of
docs/batch_invariance.md (one query row per program, tiles over the row's virtual sequence).
"""
import os

import torch
import triton
import triton.language as tl

from ..ops.tree_attention.splits import BALANCE, SMS, gpu_launch_splits  # noqa: F401  (BALANCE, SMS: re-exported)
from ..ops.tree_attention.splits import gpu_splits as auto_splits  # noqa: F401  (the GPU split rule, by its launcher name)
from .aot import Launch
from .tree_attention_configs import (ARCHS, CONFIGS, GRID_X_MAX, MAX_D, PAGED_CONFIGS, SMEM_BIG,  # noqa: F401
                                     SMEM_SMALL, Config, block_d, config, invariant_config, supports,
                                     supports_paged, target)  # (re-exported: the launcher's public names)

LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, d_ok, s_ok, qk_scale, UPCAST: tl.constexpr):
    """One K/V tile: scores, online softmax, accumulate. key_ok [BN] bounds the keys, s_ok [BM, BN]
    is the visibility of the tile's keys to the rows."""
    k = tl.load(k_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
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
def _kv_rows(keys, key_ok, table_row, log2_page, num_pages, sk_page, sk_row, sv_page, sv_row, PAGED: tl.constexpr):
    """Element offsets [BN] of the K and V rows of logical keys ``keys`` from their (sequence, kv
    head) bases: the one place the kernel addresses a K/V row. Contiguous: keys * stride. Paged:
    page table_row[key >> log2_page] (clamped into [0, num_pages): check=False must not read out of
    bounds), slot key % page_size; one table read serves K and V; entries of keys past key_ok are
    not read."""
    if PAGED:
        page = tl.load(table_row + (keys >> log2_page), mask=key_ok, other=0)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        slot = (keys & ((1 << log2_page) - 1)).to(tl.int64)
        return page * sk_page + slot * sk_row, page * sv_page + slot * sv_row
    else:
        return keys.to(tl.int64) * sk_row, keys.to(tl.int64) * sv_row


@triton.jit
def _virtual_rows(mask_row, sm_w, nw, L, anc_row):
    """Writes the row's visible block keys (j < L, bit set; words [0, nw)) in index order to
    anc_row[0, V) and returns V: each word's set bits ranked by the running count plus a cumsum.
    The tile loop then gathers a tile's rows from anc_row with one load (a nested loop there would
    keep Triton from pipelining it: fp32 tiles then spill kilobytes)."""
    j = tl.arange(0, 32)
    n = L * 0
    for w in range(0, nw):
        bits = tl.where(w * 32 + j < L, (tl.load(mask_row + w * sm_w) >> j) & 1, 0)  # [32]
        tl.store(anc_row + n + tl.cumsum(bits, axis=0) - 1, w * 32 + j, mask=bits != 0)
        n += tl.sum(bits)
    tl.debug_barrier()  # anc_row is read next by other threads than wrote it
    return n


@triton.jit
def _tree_attention_kernel(
    q_ptr,  # [B, Tq, Hq, D]
    k_ptr,  # [B, Hkv, S, D], or PAGED [num_pages, page_size, Hkv, D]
    v_ptr,  # as k_ptr
    out_ptr,  # [B, Tq, Hq, D] contiguous (final) or part_o [NS, B * Tq * Hq, D] fp32 (SPLIT)
    lse_ptr,  # [NS, B * Tq * Hq] fp32 (SPLIT only)
    prefix_ptr, block_ptr, qlen_ptr,  # [B] int32, strides s_pre, s_blk, s_ql (any, 0 included)
    mask_ptr,  # [B, Tq, W] int32, strides sm_b, sm_t, sm_w
    pt_ptr,  # PAGED: page table [B, max_pages] int32, row stride s_pt (else unused)
    anc_ptr,  # INVARIANT: scratch int32 [B * Tq * Hkv, 32 * W], a program's visible block keys (else unused)
    s_pre, s_blk, s_ql, sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_t, sm_w,
    s_pt, sk_pg, sv_pg,  # PAGED: sk_b = sv_b = 0, sk_s / sv_s step between slots, sk_pg / sv_pg between pages
    log2_page, num_pages,
    B, Tq, Hq, Hkv, S, W, D, qk_scale,  # S: rows a sequence can address (PAGED: max_pages * page_size)
    NS,  # number of kv splits (grid dim 1)
    N_M,  # query-row tiles per (sequence, kv head); INVARIANT: Tq (one query row a program)
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_QLEN: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr, PAGED: tl.constexpr,
    INVARIANT: tl.constexpr = False,
):
    # Grid x = (sequence, kv head, row tile), row tiles innermost so that the programs sharing a
    # K/V stream run side by side (L2 reuse); grid x holds 2^31 - 1 programs, grid y only 65535.
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    # The JIT types a Python float fp32; inductor, tracing this launch into a compiled graph, fp64,
    # which would widen the scores and the accumulators. fp32 either way (the same rounding).
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid_m = pid % N_M
    bg = pid // N_M
    b = bg // Hkv
    g = bg % Hkv
    # Lengths clamped into range (check=False must not read out of bounds).
    P = tl.minimum(tl.maximum(tl.load(prefix_ptr + b * s_pre), 0), S)
    L = tl.minimum(tl.maximum(tl.load(block_ptr + b * s_blk), 0), tl.minimum(S - P, 32 * W))
    if HAS_QLEN:
        QL = tl.minimum(tl.maximum(tl.load(qlen_ptr + b * s_ql), 0), Tq)
    else:
        QL = Tq

    if INVARIANT:  # query pid_m, tile row m = its head g * G + m (rows m >= G: padding)
        rows = tl.arange(0, BLOCK_M)
        qi = pid_m + rows * 0
        head = g * G + rows
        in_rows = rows < G
        row_ok = in_rows & (pid_m < QL)
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        qi = rows // G
        head = g * G + rows % G
        in_rows = qi < Tq
        row_ok = qi < QL
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    q_ptrs = q_ptr + b * sq_b + qi[:, None] * sq_t + head[:, None] * sq_h + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + b * sk_b + g * sk_h
    v_base = v_ptr + b * sv_b + g * sv_h
    table_row = pt_ptr + b * s_pt

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    if INVARIANT:
        # The tiles of the row's virtual sequence (P + V positions) from virtual position 0: the
        # rows and places of the AR call's tiles, whatever else the call holds (padding rows: none).
        nw = tl.where(pid_m < QL, tl.cdiv(L, 32), 0)  # words holding block keys (<= W)
        anc_row = anc_ptr + pid * (32 * W)
        V = _virtual_rows(mask_ptr + b * sm_b + pid_m * sm_t, sm_w, nw, L, anc_row)
        n_tiles = tl.where(pid_m < QL, tl.cdiv(P + V, BLOCK_N), 0)
    else:
        n_prefix = tl.cdiv(P, BLOCK_N)
        n_tiles = n_prefix + tl.cdiv(L, BLOCK_N)
    t0 = (n_tiles * split) // NS
    t1 = (n_tiles * (split + 1)) // NS

    # One loop over the split's tiles (one pipelined copy of the tile code keeps the registers
    # down): tiles [0, n_prefix) cover the prefix from key 0, the rest the block from key P. Prefix
    # keys need no mask bits; block key j is visible to query i iff bit j % 32 of mask[b, i, j // 32].
    # A block tile starts on a word boundary (BLOCK_N % 32 == 0): each row loads its BLOCK_N / 32
    # words (predicated off on prefix tiles) and the bits are expanded in registers.
    if not INVARIANT:
        mask_rows = mask_ptr + b * sm_b + tl.minimum(qi, Tq - 1).to(tl.int64) * sm_t  # [BM]
        word_of_n = offs_n // 32
    for t in range(t0, t1):
        if INVARIANT:  # virtual position v: row v of the prefix, else row P + anc[v - P]
            vpos = t * BLOCK_N + offs_n
            key_ok = vpos < P + V
            anc = tl.load(anc_row + (vpos - P), mask=key_ok & (vpos >= P), other=0)
            keys = tl.where(vpos < P, vpos, P + anc)
            visible = row_ok[:, None] & key_ok[None, :]  # every key of the tile, to all the row's heads
        else:
            in_block = t >= n_prefix
            tb = t - n_prefix
            keys = tl.where(in_block, P + tb * BLOCK_N, t * BLOCK_N) + offs_n
            key_ok = keys < tl.where(in_block, P + L, P)
            words = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
            for k in tl.static_range(BLOCK_N // 32):
                w = tb * (BLOCK_N // 32) + k
                wk = tl.load(mask_rows + w * sm_w, mask=row_ok & in_block & (w < W), other=0)  # [BM]
                words = tl.where((word_of_n == k)[None, :], wk[:, None], words)
            bit = ((words >> (offs_n & 31)[None, :]) & 1) != 0
            visible = row_ok[:, None] & key_ok[None, :] & (bit | (not in_block))
        k_rows, v_rows = _kv_rows(keys, key_ok, table_row, log2_page, num_pages, sk_pg, sk_s, sv_pg, sv_s, PAGED)
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q,
            k_base + k_rows[:, None] + offs_d[None, :],
            v_base + v_rows[:, None] + offs_d[None, :],
            key_ok, d_ok, visible, qk_scale, UPCAST=UPCAST)

    seen = row_ok & (l_i > 0)
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    out_rows = (b * Tq + qi) * Hq + head  # row index of [B, Tq, Hq]
    if SPLIT:
        part = split.to(tl.int64) * B * Tq * Hq + out_rows
        tl.store(out_ptr + part[:, None] * D + offs_d[None, :], o, mask=in_rows[:, None] & d_ok[None, :])
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        # Stored as column 0 of a [BM, BLOCK_D] tile in o's layout: a [BM] store in the dot's row
        # layout makes ptxas spill kilobytes (fp32 decode tiles, sm_80 and sm_90).
        first = offs_d[None, :] == 0
        tl.store(lse_ptr + part[:, None] + offs_d[None, :], tl.where(first, lse[:, None], 0.0),
                 mask=in_rows[:, None] & first)
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


# ---- launches --------------------------------------------------------------------------------

def _kv_layout(k_cache, v_cache, page_table):
    """(Hkv, S, kernel stride/paging arguments) of contiguous caches [B, Hkv, S, D] or, with a
    page table [B, max_pages], of paged caches [num_pages, page_size, Hkv, D] (S = max_pages *
    page_size logical rows, 0 with an empty pool: no row can be addressed then)."""
    if page_table is None:
        Hkv, S = k_cache.shape[1], k_cache.shape[2]
        strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
        return Hkv, S, strides, (0, 0, 0, 0, 1)
    num_pages, page_size, Hkv = k_cache.shape[:3]
    S = min(page_table.shape[1] * page_size, 2**31 - 1) if num_pages else 0
    strides = (0, k_cache.stride(2), k_cache.stride(1), 0, v_cache.stride(2), v_cache.stride(1))
    paging = (page_table.stride(0), k_cache.stride(0), v_cache.stride(0), page_size.bit_length() - 1,
              max(num_pages, 1))
    return Hkv, S, strides, paging


def splits(q, Hkv, S, arch, sms, paged=False):
    """The split count :func:`specops.ops.tree_attention.splits.gpu_splits` gives this kernel's launch (its
    program shape comes from CONFIGS). Shape: q [B, Tq, Hq, D]; S keys per sequence (a bound)."""
    B, Tq, Hq, D = q.shape
    cfg = config(arch, q.dtype, D, Tq * (Hq // Hkv), paged=paged)
    return gpu_launch_splits(B, Tq, Hq, Hkv, D, S, q.element_size(), q.dtype == torch.float32, cfg.block_m,
                             cfg.block_n, arch, sms)


def plan(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits=None, arch=None,
         sms=None, page_table=None, workspace=None, invariant=False):
    """The launches of one call and its output (allocated, not yet written).

    Shape: as :func:`tree_attention`, or with ``page_table`` int32 [B, max_pages] as
    :func:`tree_attention_paged` (k_cache / v_cache are then the pages [num_pages, page_size, Hkv, D]).
    ``arch`` / ``sms`` default to ``q``'s device (the AOT check passes them with meta tensors).
    ``num_splits``: the schedule's split count (None: :func:`splits`); ``workspace``: fp32 of
    >= ``splits.workspace_size`` elements for the partials (None: allocated here). ``invariant``:
    the batch-invariant schedule (INVARIANT: one program per (query, kv head), never split)."""
    B, Tq, Hq, D = q.shape
    Hkv, S, kv_strides, paging = _kv_layout(k_cache, v_cache, page_table)
    G = Hq // Hkv
    W = mask.shape[2]
    out = torch.empty(B, Tq, Hq, D, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out, []
    if arch is None:
        arch, dev_sms, _ = target(q.device)
        sms = sms or dev_sms
    if q.stride(3) != 1:
        q = q.contiguous()
    rows = Tq * G
    paged = page_table is not None
    if invariant:
        cfg, n_m, ns = invariant_config(arch, q.dtype, D, G), Tq, 1
        if n_m * B * Hkv > GRID_X_MAX:
            raise ValueError(f"invariant=True: {n_m * B * Hkv} programs (B * Tq * Hkv) exceed the grid limit "
                             f"{GRID_X_MAX}")
    else:
        cfg = config(arch, q.dtype, D, rows, paged=paged)
        n_m = triton.cdiv(rows, cfg.block_m)
        ns = num_splits or splits(q, Hkv, S, arch, sms, paged=paged)
    BD = block_d(D)
    R = B * Tq * Hq
    has_qlen = q_lens is not None
    qlen = q_lens if has_qlen else prefix_lens  # unused pointer when HAS_QLEN is False
    table = page_table if page_table is not None else prefix_lens  # unused pointer unless PAGED
    anc = (torch.empty(n_m * B * Hkv * 32 * W, dtype=torch.int32, device=q.device) if invariant
           else prefix_lens)  # unused pointer unless INVARIANT
    strides = (prefix_lens.stride(0), block_lens.stride(0), qlen.stride(0), *q.stride()[:3], *kv_strides,
               *mask.stride(), *paging)
    sizes = (B, Tq, Hq, Hkv, S, W, D, float(sm_scale) * LOG2E, ns, n_m)
    meta = dict(G=G, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=BD, HAS_QLEN=has_qlen,
                UPCAST=os.environ.get("TRITON_INTERPRET") == "1" and q.dtype != torch.float32,
                PAGED=paged, INVARIANT=invariant, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    grid = (n_m * B * Hkv, ns)
    lens = (prefix_lens, block_lens, qlen, mask, table, anc)
    if ns == 1:
        return out, [Launch(_tree_attention_kernel, grid, (q, k_cache, v_cache, out, out, *lens, *strides, *sizes),
                            dict(SPLIT=False, **meta))]
    if workspace is None:
        workspace = torch.empty(ns * R * (D + 1), dtype=torch.float32, device=q.device)
    part = workspace[:ns * R * D].view(ns, R, D)
    lse = workspace[ns * R * D:ns * R * (D + 1)].view(ns, R)
    BLOCK_R = 16
    return out, [
        Launch(_tree_attention_kernel, grid, (q, k_cache, v_cache, part, lse, *lens, *strides, *sizes),
               dict(SPLIT=True, **meta)),
        Launch(_combine_kernel, (triton.cdiv(R, BLOCK_R),), (part, lse, out, R, D, ns),
               dict(BLOCK_R=BLOCK_R, BLOCK_S=max(2, triton.next_power_of_2(ns)), BLOCK_D=BD)),
    ]


def _run(q, k_cache, v_cache, page_table, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits, arch,
         ok_why, workspace=None, invariant=False):
    ok, why = ok_why
    if not ok:
        raise ValueError(f"tree_attention (triton) cannot run this call: {why}")
    if num_splits is not None and not 1 <= num_splits <= 65535:
        raise ValueError(f"num_splits must lie in [1, 65535], got {num_splits}")
    if invariant and num_splits not in (None, 1):
        raise ValueError(f"num_splits must be None or 1 with invariant=True (the invariant schedule is unsplit), "
                         f"got {num_splits}")
    if arch is not None and arch not in CONFIGS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    sms = None if arch is None else target(q.device)[1]
    out, launches = plan(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits,
                         arch=arch, sms=sms, page_table=page_table, workspace=workspace, invariant=invariant)
    for launch in launches:
        launch.kernel[launch.grid](*launch.args, **launch.kwargs)
    return out


def tree_attention(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits=None,
                   arch=None, workspace=None, invariant=False):
    """Shape: q [B, Tq, Hq, D], k_cache / v_cache [B, Hkv, S, D], prefix_lens / block_lens / q_lens
    int32 [B] (q_lens may be None; any strides), mask int32 [B, Tq, W] -> out [B, Tq, Hq, D] in
    q's dtype. ``num_splits`` forces the number of kv splits (None: chosen from the problem and
    device); ``arch`` (80 or 90) forces that arch's CONFIGS (tests run sm_80 tiles interpreted);
    ``workspace``: the partials (see :func:`plan`). ``invariant``: the batch-invariant schedule
    (docs/batch_invariance.md; num_splits None or 1). Raises ValueError for what :func:`supports` refuses."""
    return _run(q, k_cache, v_cache, None, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits, arch,
                supports(q, k_cache), workspace, invariant)


def tree_attention_paged(q, k_pages, v_pages, page_table, prefix_lens, block_lens, mask, q_lens, sm_scale,
                         num_splits=None, arch=None, workspace=None, invariant=False):
    """:func:`tree_attention` over a paged cache, the same kernel with PAGED set.

    Shape: k_pages / v_pages [num_pages, page_size, Hkv, D] (page_size a power of two),
    page_table int32 [B, max_pages] (any row stride, unit column stride); the rest as
    :func:`tree_attention`."""
    if page_table.shape[1] > 1 and page_table.stride(1) != 1:
        page_table = page_table.contiguous()
    return _run(q, k_pages, v_pages, page_table, prefix_lens, block_lens, mask, q_lens, sm_scale, num_splits,
                arch, supports_paged(q, k_pages), workspace, invariant)


# ---- AOT check ---------------------------------------------------------------------------------

def _aot_call(arch, dtype, D, rows_class, split, paged=False, invariant=False):
    """Meta tensors of a typical call that selects one CONFIGS entry: batch 4 (1 when split), 8
    query heads over 2 kv heads (G = 4), a 4096-row cache, 16-aligned sizes as real models have;
    paged: a pool of 1024 pages of 16 rows ([num_pages, 16, Hkv, D], vLLM's layout), 256 pages a
    sequence; invariant: the INVARIANT variant (its tiles whatever the rows)."""
    Tq = 4 if rows_class == "decode" else 64
    B = 1 if split else 4
    Hq, Hkv, S = 8, 2, 4096
    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(B, Tq, Hq, D, **meta)
    table = None
    if paged:
        k = torch.empty(1024, 16, Hkv, D, **meta)
        v = torch.empty(1024, 16, Hkv, D, **meta)
        table = torch.empty(B, S // 16, device="meta", dtype=torch.int32)
    else:
        k = torch.empty(B, S, Hkv, D, **meta).transpose(1, 2)  # a [B, S, Hkv, D] cache buffer
        v = torch.empty(B, S, Hkv, D, **meta).transpose(1, 2)
    lens = [torch.empty(B, device="meta", dtype=torch.int32) for _ in range(3)]
    mask = torch.empty(B, Tq, 2, device="meta", dtype=torch.int32)
    out, launches = plan(q, k, v, lens[0], lens[1], mask, lens[2], D ** -0.5, num_splits=4 if split else 1,
                         arch=arch, sms=SMS[arch], page_table=table, invariant=invariant)
    cfg = (invariant_config(arch, dtype, D, Hq // Hkv) if invariant else
           config(arch, dtype, D, Tq * Hq // Hkv, paged=paged))
    assert launches[0].kwargs["BLOCK_M"] == cfg.block_m and launches[0].kwargs["num_stages"] == cfg.num_stages
    return launches


def aot_cases():
    """(name, arch, launches, budget) of every CONFIGS entry: fp32 and bf16 (fp16 once per arch:
    the same tiles), split and not for decode tiles, split also for the widest block tiles; the
    same entries again with a paged cache ("paged ..."), whose row gather must not cost spills
    either; the invariant variant ("invariant ...", contiguous for each tile entry, paged for two).
    No spills; table 80 within SMEM_SMALL."""
    for paged in (False, True):
        tag = "paged " if paged else ""
        for arch in ARCHS:
            budget = {"spills": 0, "smem": SMEM_SMALL if arch == 80 else SMEM_BIG}
            for dtype in (torch.bfloat16, torch.float32):
                for D in (64, 128, 256):
                    for rows_class in ("decode", "block"):
                        splits = (False, True) if rows_class == "decode" or D == 256 else (False,)
                        for split in splits:
                            name = f"{tag}{str(dtype)[6:]} D{D} {rows_class}{' split' if split else ''}"
                            yield name, arch, _aot_call(arch, dtype, D, rows_class, split, paged), budget
            yield f"{tag}float16 D128 block", arch, _aot_call(arch, torch.float16, 128, "block", False, paged), budget
            for dtype, D in (((torch.bfloat16, 128), (torch.float32, 256)) if paged else
                             [(t, d) for t in (torch.bfloat16, torch.float32) for d in (64, 128, 256)]):
                yield (f"invariant {tag}{str(dtype)[6:]} D{D}", arch,
                       _aot_call(arch, dtype, D, "decode", False, paged, invariant=True), budget)


AOT_SPECS = aot_cases
