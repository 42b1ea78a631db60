"""topn_expand and select_topn_subtree in Triton.

topn_expand runs one kernel twice: stage 1 with one program per (sequence, parent) row over
its V children (score = parent score + child log-prob), stage 2 with one program per sequence
over the P * kp stage-1 survivors. Each program finds the count threshold key by the same
16-way bisection as warp_probs, compacts the chosen items in index order (a running cumsum),
then sorts them by counting, per item, the items that come before it.

select_topn_subtree: one program per sequence; effective scores by a lock-step ancestor walk,
ranks by counting, new indices by a running cumsum. Both use global scratch between phases,
separated by barriers.
"""
import torch
import triton
import triton.language as tl

from .sampling import _key

BLOCK = 256  # streaming tiles
BLOCK_SEL = 256  # bisection tiles ([BLOCK_SEL, 16] comparisons)
BLOCK_I = 64  # sort-by-counting tiles ([BLOCK_I, BLOCK_J] comparisons)
BLOCK_J = 64


@triton.jit
def _scores(src_row, offs, L, bias):
    """Scores of items offs of a row; NaN and out-of-range items are -inf (unavailable)."""
    s = tl.load(src_row + offs, mask=offs < L, other=float("-inf")).to(tl.float32) + bias
    return tl.where(s == s, s, float("-inf"))


@triton.jit
def _before(s_a, i_a, s_b, i_b):
    """score_before of csrc/sampling_common.h: a comes first iff higher score, then lower index."""
    return (s_a > s_b) | ((s_a == s_b) & (i_a < i_b))


@triton.jit
def _topn_kernel(
    src_ptr,  # [R, L] stage 1: child log-probs; stage 2: stage-1 scores
    bias_ptr,  # [R] fp32 parent scores (stage 1 only)
    tok_ptr,  # [R, L] int32 stage-1 tokens (stage 2 only)
    tmp_s_ptr,  # [R, M] fp32 scratch: chosen items, unsorted
    tmp_i_ptr,  # [R, M] int32 scratch
    out_s_ptr,  # [R, M] fp32
    out_t_ptr,  # [R, M] int32 token
    out_p_ptr,  # [R, M] int32 parent (stage 2 only)
    L,
    M,
    KP,  # stage 2: items per parent in a row (parent = index // KP)
    STAGE2: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_SEL: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    src = src_ptr + row * L
    if STAGE2:
        bias = 0.0
    else:
        bias = tl.load(bias_ptr + row)
    avail = tl.zeros([], dtype=tl.int32)
    for start in range(0, L, BLOCK):
        s = _scores(src, start + tl.arange(0, BLOCK), L, bias)
        avail += tl.sum((s > float("-inf")).to(tl.int32), axis=0)
    got = tl.minimum(avail, M)
    if got > 0:
        # kappa: the got-th largest key among available items.
        d = tl.arange(0, 16).to(tl.int64)
        lo = tl.full([], -2147483648, tl.int64)
        for i in tl.static_range(8):
            thr = lo + d * (1 << (28 - 4 * i))
            acc = tl.zeros([16], dtype=tl.int32)
            for start in range(0, L, BLOCK_SEL):
                s = _scores(src, start + tl.arange(0, BLOCK_SEL), L, bias)
                hit = (_key(s).to(tl.int64)[:, None] >= thr[None, :]) & (s > float("-inf"))[:, None]
                acc += tl.sum(hit.to(tl.int32), axis=0)
            lo += tl.max(tl.where(acc >= got, d, 0), axis=0) * (1 << (28 - 4 * i))
        kappa = lo.to(tl.int32)
        above = tl.zeros([], dtype=tl.int32)
        for start in range(0, L, BLOCK):
            s = _scores(src, start + tl.arange(0, BLOCK), L, bias)
            above += tl.sum(((s > float("-inf")) & (_key(s) > kappa)).to(tl.int32), axis=0)
        need = got - above
        # Items above kappa all make it; of those at kappa, the lowest indices fill the rest.
        taken = tl.zeros([], dtype=tl.int32)
        eq_seen = tl.zeros([], dtype=tl.int32)
        for start in range(0, L, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            s = _scores(src, offs, L, bias)
            ok = s > float("-inf")
            key = _key(s)
            eq = (ok & (key == kappa)).to(tl.int32)
            eq_rank = eq_seen + tl.cumsum(eq, axis=0) - eq
            sel = ((ok & (key > kappa)) | ((eq > 0) & (eq_rank < need))).to(tl.int32)
            slot = row * M + taken + tl.cumsum(sel, axis=0) - sel
            tl.store(tmp_s_ptr + slot, s, mask=sel > 0)
            tl.store(tmp_i_ptr + slot, offs, mask=sel > 0)
            taken += tl.sum(sel, axis=0)
            eq_seen += tl.sum(eq, axis=0)
        tl.debug_barrier()
        # Sort by counting: an item's rank is the number of chosen items before it.
        for i_start in range(0, got, BLOCK_I):
            ii = i_start + tl.arange(0, BLOCK_I)
            mi = ii < got
            s_i = tl.load(tmp_s_ptr + row * M + ii, mask=mi, other=0.0)
            x_i = tl.load(tmp_i_ptr + row * M + ii, mask=mi, other=0)
            rank = tl.zeros([BLOCK_I], dtype=tl.int32)
            for j_start in range(0, got, BLOCK_J):
                jj = j_start + tl.arange(0, BLOCK_J)
                mj = jj < got
                s_j = tl.load(tmp_s_ptr + row * M + jj, mask=mj, other=0.0)
                x_j = tl.load(tmp_i_ptr + row * M + jj, mask=mj, other=0)
                first = _before(s_j[None, :], x_j[None, :], s_i[:, None], x_i[:, None]) & mj[None, :]
                rank += tl.sum(first.to(tl.int32), axis=1)
            dst = row * M + rank
            tl.store(out_s_ptr + dst, s_i, mask=mi)
            if STAGE2:
                tl.store(out_t_ptr + dst, tl.load(tok_ptr + row * L + x_i, mask=mi, other=-1), mask=mi)
                tl.store(out_p_ptr + dst, x_i // KP, mask=mi)
            else:
                tl.store(out_t_ptr + dst, x_i, mask=mi)
    for start in range(0, M, BLOCK):
        jj = start + tl.arange(0, BLOCK)
        pad = (jj >= got) & (jj < M)
        tl.store(out_s_ptr + row * M + jj, tl.full([BLOCK], float("-inf"), tl.float32), mask=pad)
        tl.store(out_t_ptr + row * M + jj, tl.full([BLOCK], -1, tl.int32), mask=pad)
        if STAGE2:
            tl.store(out_p_ptr + row * M + jj, tl.full([BLOCK], -1, tl.int32), mask=pad)


def _launch(src, bias, tok, M, KP, stage2):
    R, L = src.shape
    dev = src.device
    out_s = torch.empty(R, M, dtype=torch.float32, device=dev)
    out_t = torch.empty(R, M, dtype=torch.int32, device=dev)
    out_p = torch.empty(R, M, dtype=torch.int32, device=dev) if stage2 else out_t
    tmp_s = torch.empty(R, M, dtype=torch.float32, device=dev)
    tmp_i = torch.empty(R, M, dtype=torch.int32, device=dev)
    if R:
        _topn_kernel[(R,)](src, bias, tok, tmp_s, tmp_i, out_s, out_t, out_p, L, M, KP, STAGE2=stage2,
                           BLOCK=BLOCK, BLOCK_SEL=BLOCK_SEL, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J)
    return out_s, out_t, out_p


def topn_expand(parent_scores, child_logprobs, n, per_parent_k):
    """Shape: parent_scores fp32 [B, P], child_logprobs [B, P, V] -> (fp32 [B, n], int32 [B, n], int32 [B, n])."""
    B, P, V = child_logprobs.shape
    kp = min(per_parent_k, n, V)
    child = child_logprobs.contiguous().view(B * P, V)
    s1, t1, _ = _launch(child, parent_scores.contiguous().view(B * P), child, kp, kp, stage2=False)
    s2, t2, p2 = _launch(s1.view(B, P * kp), s1, t1.view(B, P * kp), n, kp, stage2=True)
    return s2, t2, p2


@triton.jit
def _subtree_kernel(
    parents_ptr,  # [B, T] int32
    scores_ptr,  # [B, T] fp32
    num_nodes_ptr,  # [B] int32
    eff_ptr,  # [B, T] fp32 scratch: effective scores
    pos_ptr,  # [B, T] int32 scratch: kept flags, then new indices
    keep_ptr,  # [B, n] int32
    new_par_ptr,  # [B, n] int32
    counts_ptr,  # [B] int32
    T,
    n,
    BLOCK: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    par = parents_ptr + b * T
    sc = scores_ptr + b * T
    eff = eff_ptr + b * T
    pos = pos_ptr + b * T
    nv = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), T)
    # Effective score: min of the scores on the path below the root (subtree_eff_score).
    for start in range(0, T, BLOCK):
        i = start + tl.arange(0, BLOCK)
        e = tl.full([BLOCK], float("inf"), tl.float32)
        j = tl.where((i > 0) & (i < nv), i, 0)  # the node whose score is read next; 0 = done
        while tl.max(j, axis=0) > 0:
            active = j > 0
            s = tl.load(sc + j, mask=active, other=0.0)
            e = tl.where(active, tl.minimum(e, tl.where(s == s, s, float("-inf"))), e)
            p = tl.load(par + j, mask=active, other=-1)
            j = tl.where(active & (p >= 0) & (p < j), p, 0)
        e = tl.where(i == 0, float("inf"), tl.where(i < nv, e, float("-inf")))
        tl.store(eff + i, e, mask=i < T)
    tl.debug_barrier()
    # Kept iff root, or available and fewer than n - 1 non-root nodes come before it.
    for start in range(0, T, BLOCK):
        i = start + tl.arange(0, BLOCK)
        e_i = tl.load(eff + i, mask=i < T, other=float("-inf"))
        rank = tl.zeros([BLOCK], dtype=tl.int32)
        for j_start in range(0, T, BLOCK_J):
            jj = j_start + tl.arange(0, BLOCK_J)
            e_j = tl.load(eff + jj, mask=jj < T, other=float("-inf"))
            ok_j = (jj > 0) & (e_j > float("-inf"))
            first = _before(e_j[None, :], jj[None, :], e_i[:, None], i[:, None]) & ok_j[None, :]
            rank += tl.sum(first.to(tl.int32), axis=1)
        kept = (i == 0) | ((e_i > float("-inf")) & (rank < n - 1))
        tl.store(pos + i, kept.to(tl.int32), mask=i < T)
    tl.debug_barrier()
    count = tl.zeros([], dtype=tl.int32)
    for start in range(0, T, BLOCK):
        i = start + tl.arange(0, BLOCK)
        f = tl.load(pos + i, mask=i < T, other=0)
        tl.store(pos + i, tl.where(f > 0, count + tl.cumsum(f, axis=0) - f, -1), mask=i < T)
        count += tl.sum(f, axis=0)
    tl.debug_barrier()
    for start in range(0, T, BLOCK):
        i = start + tl.arange(0, BLOCK)
        q = tl.load(pos + i, mask=i < T, other=-1)
        p = tl.load(par + i, mask=(i < T) & (i > 0), other=-1)
        p_ok = (q >= 0) & (p >= 0) & (p < i)
        new_p = tl.load(pos + p, mask=p_ok, other=-1)
        tl.store(keep_ptr + b * n + q, i, mask=q >= 0)
        tl.store(new_par_ptr + b * n + q, tl.where(p_ok, new_p, -1), mask=q >= 0)
    for start in range(0, n, BLOCK):
        jj = start + tl.arange(0, BLOCK)
        pad = (jj >= count) & (jj < n)
        tl.store(keep_ptr + b * n + jj, tl.full([BLOCK], -1, tl.int32), mask=pad)
        tl.store(new_par_ptr + b * n + jj, tl.full([BLOCK], -1, tl.int32), mask=pad)
    tl.store(counts_ptr + b, count)


def select_topn_subtree(parents, scores, num_nodes, n):
    """Shape: parents int32 [B, T], scores fp32 [B, T], num_nodes int32 [B] ->
    (keep_idx int32 [B, n], new_parents int32 [B, n], counts int32 [B])."""
    B, T = parents.shape
    dev = parents.device
    keep = torch.empty(B, n, dtype=torch.int32, device=dev)
    new_parents = torch.empty(B, n, dtype=torch.int32, device=dev)
    counts = torch.empty(B, dtype=torch.int32, device=dev)
    eff = torch.empty(B, T, dtype=torch.float32, device=dev)
    pos = torch.empty(B, T, dtype=torch.int32, device=dev)
    if B:
        _subtree_kernel[(B,)](parents.contiguous(), scores.contiguous(), num_nodes.contiguous(), eff, pos,
                              keep, new_parents, counts, T, n, BLOCK=BLOCK, BLOCK_J=BLOCK_J)
    return keep, new_parents, counts


def _aot_expand(dtype):
    def call():
        topn_expand(torch.empty(4, 16, dtype=torch.float32, device="meta"),
                    torch.empty(4, 16, 49152, dtype=dtype, device="meta"), 64, 8)
    return call


def _aot_subtree():
    i32 = dict(dtype=torch.int32, device="meta")
    select_topn_subtree(torch.empty(4, 256, **i32), torch.empty(4, 256, dtype=torch.float32, device="meta"),
                        torch.empty(4, **i32), 64)


# topn_expand launches stage 1 (child log-probs of each dtype) and stage 2; select_topn_subtree
# one kernel: launched on meta tensors and compiled by specops.triton_kernels.aot as the JIT would.
AOT_SPECS = [(f"expand {str(dt)[6:]}", None, _aot_expand(dt), 0)
             for dt in (torch.float32, torch.bfloat16, torch.float16)]
# The subtree kernel spills (344-416 B with triton 3.8 on sm_80/sm_90): allowed, to be reduced.
AOT_SPECS.append(("subtree T256", None, _aot_subtree, 512))
