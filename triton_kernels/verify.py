"""Verification in Triton: one program per sequence walks its tree; V-wide passes are cooperative.

Mirrors csrc/verify_common.h (same decisions, same fp32 operation order, fixed-point sums) so the
integer outputs equal the torch reference bit for bit. Launch with enable_fp_fusion=False: a
fused multiply-add would round differently from the reference. Scratch rows ([B, 3, V]) hold the
residual double buffer and R3w's proposer row; tl.debug_barrier() orders their writes before the
next read by other threads of the program. Rule codes (R1-R6): docs/methods.md §Verification rules.
"""
import os

import torch
import triton
import triton.language as tl

from .verify_rows import (STAT_WORDS, _accept, _argmax_row, _det_log, _exp2i, _fallback, _fix, _load_at, _load_row,
                          _logit_prob, _sample_row, _sum_fix, _uniform_index)

MODES = {"mss": 0, "mss_pointmass": 1, "mss_noreplace": 2}
NBUF = {0: 2, 1: 1, 2: 3}  # scratch rows per sequence: R3 double buffer, R3p copy, R3w + proposer row



@triton.jit
def _match_kernel(
    tok_ptr,  # [B, T] int32
    par_ptr,  # [B, T] int32
    n_ptr,  # [B] int32
    rows_ptr,  # [B, T, V] logits (R1, and R4 with LOGITS) or fp32 probs (R4)
    u_ptr,  # [B, T, 2] fp32 (R4 only)
    idx_ptr,  # [B, T] int32 out
    len_ptr,  # [B] int32 out
    bonus_ptr,  # [B] int32 out
    st_ptr,  # [2, B * T, STAT_WORDS] int32 warping statistics (LOGITS only)
    mask_ptr,  # [B, T, W] int32 allowed tokens per node (MASKED only)
    T,
    V,
    S,
    SAMPLE: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MASKED: tl.constexpr = False,
):
    # R1 (argmax) / R4 (a draw per node): descend into the first child whose token is the prediction.
    b = tl.program_id(0).to(tl.int64)
    scale = _exp2i(S)
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 1), T)
    t_idx = tl.arange(0, BLOCK_T)
    par = tl.load(par_ptr + b * T + t_idx, mask=t_idx < n, other=-2)
    tok = tl.load(tok_ptr + b * T + t_idx, mask=t_idx < n, other=-1)
    tl.store(idx_ptr + b * T, 0)
    u = tl.full([], 0, tl.int32)
    length = tl.full([], 1, tl.int32)
    done = tl.full([], 0, tl.int32)
    bonus = tl.full([], 0, tl.int32)
    while done == 0:
        row = rows_ptr + (b * T + u) * V
        mrow = mask_ptr + (b * T + u) * ((V + 31) // 32)
        if SAMPLE:
            st = st_ptr + (b * T + u) * STAT_WORDS
            W = _sum_fix(row, V, scale, BLOCK_V, False, st, LOGITS, mrow, MASKED)
            v = _sample_row(row, V, scale, W, tl.load(u_ptr + (b * T + u) * 2 + 1), BLOCK_V, False, st, LOGITS, mrow,
                            MASKED)
        else:
            v = _argmax_row(row, V, BLOCK_V, mrow, MASKED)
        hit = (par == u) & (tok == v) & (t_idx > u)
        c = tl.min(tl.where(hit, t_idx, BLOCK_T), axis=0)
        if c < BLOCK_T:
            tl.store(idx_ptr + b * T + length, c)
            length += 1
            u = c
        else:
            bonus = v
            done += 1
    tl.store(len_ptr + b, length)
    tl.store(bonus_ptr + b, bonus)
    tl.store(idx_ptr + b * T + t_idx, tl.full([BLOCK_T], -1, tl.int32), mask=(t_idx >= length) & (t_idx < T))


@triton.jit
def _mss_kernel(
    tok_ptr,  # [B, T] int32
    par_ptr,  # [B, T] int32
    n_ptr,  # [B] int32
    p_ptr,  # [B, T, V] fp32 target (LOGITS: target logits)
    q_ptr,  # [B, T, V] fp32 draft (LOGITS: draft logits; unused by R3p)
    u_ptr,  # [B, T, 2] fp32
    buf_ptr,  # [B, NB, V] fp32 scratch
    idx_ptr,  # [B, T] int32 out
    len_ptr,  # [B] int32 out
    bonus_ptr,  # [B] int32 out
    st_ptr,  # [2, B * T, STAT_WORDS] int32 warping statistics of target, draft rows (LOGITS only)
    mask_ptr,  # [B, T, W] int32 allowed tokens per node (LOGITS with MASKED only)
    T,
    V,
    S,
    MODE: tl.constexpr,  # 0 R3 (mss), 1 R3p (pointmass), 2 R3w (noreplace)
    NB: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MASKED: tl.constexpr = False,
):
    # mss_walk of csrc/verify_common.h; row kinds as in _load_row.
    b = tl.program_id(0).to(tl.int64)
    N = tl.num_programs(0).to(tl.int64) * T
    scale = _exp2i(S)
    inv_scale = _exp2i(-S)
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 1), T)
    t_idx = tl.arange(0, BLOCK_T)
    par = tl.load(par_ptr + b * T + t_idx, mask=t_idx < n, other=-2)
    tl.store(idx_ptr + b * T, 0)
    u = tl.full([], 0, tl.int32)
    length = tl.full([], 1, tl.int32)
    done = tl.full([], 0, tl.int32)
    bonus = tl.full([], 0, tl.int32)
    while done == 0:
        kids = (par == u) & (t_idx > u)
        nk = tl.sum(kids.to(tl.int32), axis=0)
        # Every logits row read below is under u's grammar state: target row u, drafts of u's children.
        mrow = mask_ptr + (b * T + u) * ((V + 31) // 32)
        # The target distribution at u is R / Z, R3w's proposer Qr / Zq.
        r_kind = tl.full([], 0, tl.int32)
        r_node = u
        Z = tl.full([], 1.0, tl.float32)
        W = tl.full([], -1, tl.int64)
        qr_kind = tl.full([], 1, tl.int32)
        qr_node = tl.where(nk > 0, tl.min(tl.where(kids, t_idx, BLOCK_T), axis=0), 0)
        Zq = tl.full([], 1.0, tl.float32)
        d = u
        accepted = tl.full([], -1, tl.int32)
        while (nk > 0) & (accepted < 0):
            j = tl.full([], 0, tl.int32)
            if MODE == 0:
                if nk > 1:
                    j = _uniform_index(tl.load(u_ptr + (b * T + d) * 2 + 1), nk)
            rank = tl.cumsum(kids.to(tl.int32), axis=0) - 1
            s = tl.min(tl.where(kids & (rank == j), t_idx, BLOCK_T), axis=0)
            kids = kids & (t_idx != s)
            nk -= 1
            x = tl.load(tok_ptr + b * T + s)
            if MODE == 1:
                q_kind = tl.full([], 0, tl.int32)  # unused: q = delta
                q_node = s
                qx = tl.full([], 1.0, tl.float32)
            elif MODE == 2:
                q_kind = qr_kind
                q_node = qr_node
                qx = _load_at(q_kind, q_node, x, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS, mrow, MASKED)
            else:
                q_kind = tl.full([], 1, tl.int32)
                q_node = s
                qx = _load_at(q_kind, q_node, x, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS, mrow, MASKED)
            rx = _load_at(r_kind, r_node, x, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS, mrow, MASKED)
            d = s
            if _accept(tl.load(u_ptr + (b * T + s) * 2), qx, Z, rx, Zq):
                accepted = s
            elif MODE == 1:
                if (x >= 0) & (x < V):
                    # R3p: zero the rejected token, copying the target row on the first rejection.
                    Wn = W - _fix(rx, scale)
                    if r_kind == 0:
                        acc = tl.zeros([BLOCK_V], dtype=tl.int64)
                        for start in range(0, V, BLOCK_V):
                            offs = start + tl.arange(0, BLOCK_V)
                            m = offs < V
                            v = _load_row(0, r_node, offs, m, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS,
                                          mrow, MASKED)
                            v = tl.where(offs == x, 0.0, v)
                            tl.store(buf_ptr + (b * NB) * V + offs, v, mask=m)
                            acc += _fix(v, scale)
                        Wn = tl.sum(acc, axis=0)
                        tl.debug_barrier()
                    Zn = Wn.to(tl.float32) * inv_scale
                    if _fallback(Zn, Z, 1.0) == 0:
                        if r_kind == 0:
                            r_kind = tl.full([], 2, tl.int32)
                        else:
                            # Every thread has read R[x] (rx above) before it is zeroed in place.
                            tl.debug_barrier()
                            tl.store(buf_ptr + (b * NB) * V + x, 0.0)
                            tl.debug_barrier()
                        W = Wn
                        Z = Zn
            else:
                # R3 / R3w: the residual max(0, R / Z - q / Zq), scaled by Z * Zq, into the other buffer.
                dst = tl.where(r_kind == 2, 3, 2)
                if MODE == 2:
                    # R3w rewrites its proposer row in place below: every thread must have read
                    # q[x] (qx above) before the thread owning index x zeroes it.
                    tl.debug_barrier()
                acc = tl.zeros([BLOCK_V], dtype=tl.int64)
                accq = tl.zeros([BLOCK_V], dtype=tl.int64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    m = offs < V
                    rr = _load_row(r_kind, r_node, offs, m, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS,
                                   mrow, MASKED)
                    qq = _load_row(q_kind, q_node, offs, m, p_ptr, q_ptr, buf_ptr, b, T, V, NB, st_ptr, N, LOGITS,
                                   mrow, MASKED)
                    c = rr * Zq - Z * qq
                    c = tl.where(c > 0, c, 0.0)
                    tl.store(buf_ptr + (b * NB + dst - 2) * V + offs, c, mask=m)
                    acc += _fix(c, scale)
                    if MODE == 2:
                        qn = tl.where(offs == x, 0.0, qq)
                        tl.store(buf_ptr + (b * NB + 2) * V + offs, qn, mask=m)
                        accq += _fix(qn, scale)
                tl.debug_barrier()
                Wn = tl.sum(acc, axis=0)
                Zn = Wn.to(tl.float32) * inv_scale
                if _fallback(Zn, Z, Zq) == 0:
                    r_kind = dst
                    W = Wn
                    Z = Zn
                if MODE == 2:
                    qr_kind = tl.full([], 4, tl.int32)
                    Zq = tl.sum(accq, axis=0).to(tl.float32) * inv_scale
        if accepted < 0:
            ud = tl.load(u_ptr + (b * T + d) * 2 + 1)
            if r_kind == 0:
                row = p_ptr + (b * T + r_node) * V
                st = st_ptr + (b * T + r_node) * STAT_WORDS
                W = _sum_fix(row, V, scale, BLOCK_V, False, st, LOGITS, mrow, MASKED)
                bonus = _sample_row(row, V, scale, W, ud, BLOCK_V, False, st, LOGITS, mrow, MASKED)
            else:
                bonus = _sample_row(buf_ptr + (b * NB + r_kind - 2) * V, V, scale, W, ud, BLOCK_V)
            done += 1
        else:
            tl.store(idx_ptr + b * T + length, accepted)
            length += 1
            u = accepted
    tl.store(len_ptr + b, length)
    tl.store(bonus_ptr + b, bonus)
    tl.store(idx_ptr + b * T + t_idx, tl.full([BLOCK_T], -1, tl.int32), mask=(t_idx >= length) & (t_idx < T))


@triton.jit
def _gsd_kernel(
    tok_ptr,  # [B, T] int32
    par_ptr,  # [B, T] int32
    n_ptr,  # [B] int32
    p_ptr,  # [B, T, V] fp32 target (LOGITS: target logits)
    q_ptr,  # [B, T, V] fp32 draft (LOGITS: draft logits)
    u_ptr,  # [B, T, 2] fp32
    idx_ptr,  # [B, T] int32 out
    len_ptr,  # [B] int32 out
    bonus_ptr,  # [B] int32 out
    st_ptr,  # [2, B * T, STAT_WORDS] int32 warping statistics (LOGITS only)
    mask_ptr,  # [B, T, W] int32 allowed tokens per node (LOGITS with MASKED only)
    T,
    V,
    S,
    LOGITS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MASKED: tl.constexpr = False,
):
    # R5: every node walks its ancestors in lock-step, AND-ing the edge tests on the way.
    b = tl.program_id(0).to(tl.int64)
    scale = _exp2i(S)
    MW = (V + 31) // 32
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 1), T)
    t_idx = tl.arange(0, BLOCK_T)
    live = t_idx < n
    ok = live
    depth = tl.zeros([BLOCK_T], dtype=tl.int32)
    cur = tl.where(live, t_idx, 0)
    while tl.max(cur, axis=0) > 0:
        step = cur > 0
        pc = tl.load(par_ptr + b * T + cur, mask=step, other=-1)
        x = tl.load(tok_ptr + b * T + cur, mask=step, other=-1)
        good = step & (pc >= 0) & (pc < cur)
        xin = good & (x >= 0) & (x < V)
        if LOGITS:
            N = tl.num_programs(0).to(tl.int64) * T
            # Both under the parent's grammar state (the mask row pc), as the edge pc -> cur is.
            mrow = mask_ptr + (b * T + pc) * MW
            pr = _logit_prob(p_ptr + (b * T + pc) * V, x, xin, st_ptr + (b * T + pc) * STAT_WORDS, mrow, MASKED)
            qr = _logit_prob(q_ptr + (b * T + cur) * V, x, xin, st_ptr + (N + b * T + cur) * STAT_WORDS, mrow, MASKED)
        else:
            pr = tl.load(p_ptr + (b * T + pc) * V + x, mask=xin, other=0.0)
            qr = tl.load(q_ptr + (b * T + cur) * V + x, mask=xin, other=0.0)
        uu = tl.load(u_ptr + (b * T + cur) * 2, mask=step, other=0.0)
        edge = good & _accept(uu, qr, 1.0, pr, 1.0)
        ok = ok & (edge | ~step)
        depth += step.to(tl.int32)
        cur = tl.where(good, pc, 0)
    key = tl.where(ok, depth, -1)
    m = tl.max(key, axis=0)
    end = tl.min(tl.where(key == m, t_idx, BLOCK_T), axis=0)
    c = end
    for k in range(0, m + 1):
        tl.store(idx_ptr + b * T + (m - k), c)
        c = tl.load(par_ptr + b * T + c)
    tl.store(idx_ptr + b * T + t_idx, tl.full([BLOCK_T], -1, tl.int32), mask=(t_idx > m) & (t_idx < T))
    tl.store(len_ptr + b, m + 1)
    row = p_ptr + (b * T + end) * V
    st = st_ptr + (b * T + end) * STAT_WORDS
    mrow = mask_ptr + (b * T + end) * MW
    W = _sum_fix(row, V, scale, BLOCK_V, False, st, LOGITS, mrow, MASKED)
    u1 = tl.load(u_ptr + (b * T + end) * 2 + 1)
    tl.store(bonus_ptr + b, _sample_row(row, V, scale, W, u1, BLOCK_V, False, st, LOGITS, mrow, MASKED))


@triton.jit
def _joint_kernel(
    tok_ptr,  # [B, g] int32
    lp_ptr,  # [B, g + 1, V] fp32 target log-probs (LOGITS: target logits)
    lq_ptr,  # [B, g] fp32 draft joint log-probs
    lt_ptr,  # [B] fp32 log tau
    u_ptr,  # [B] fp32
    idx_ptr,  # [B, g + 1] int32 out
    len_ptr,  # [B] int32 out
    bonus_ptr,  # [B] int32 out
    st_ptr,  # [2, B * (g + 1), STAT_WORDS] int32 statistics of the test's, the bonus's warp (LOGITS only)
    n_ptr,  # [B] int32 chain nodes (LOGITS only; else g + 1)
    G,
    V,
    S,
    LOGITS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # R6 (joint_eta of csrc/verify_common.h): the longest passing prefix (not the first failure),
    # bonus from the next row. LOGITS: a tested value is det_log of the logit's warped probability
    # (the test's statistics), the bonus row warped with the bonus's statistics.
    b = tl.program_id(0).to(tl.int64)
    N = tl.num_programs(0).to(tl.int64) * (G + 1)
    scale = _exp2i(S)
    log_tau = tl.load(lt_ptr + b)
    if LOGITS:
        n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 1), G + 1)
    else:
        n = G + 1
    joint = tl.full([], 0.0, tl.float32)
    eta = tl.full([], 0, tl.int32)
    for j in range(1, n):
        x = tl.load(tok_ptr + b * G + j - 1)
        ok = (x >= 0) & (x < V)
        r = b * (G + 1) + j - 1
        if LOGITS:
            lp = _det_log(_logit_prob(lp_ptr + r * V, x, ok, st_ptr + r * STAT_WORDS))
        else:
            lp = tl.load(lp_ptr + r * V + x, mask=ok, other=float("-inf"))
        joint = joint + tl.where(ok, lp, float("-inf"))
        lq = tl.load(lq_ptr + b * G + j - 1)
        passed = (log_tau == float("-inf")) | ((log_tau < 0) & (joint - lq > log_tau))
        eta = tl.where(passed, j, eta)
    t_idx = tl.arange(0, BLOCK_T)
    tl.store(idx_ptr + b * (G + 1) + t_idx, tl.where(t_idx <= eta, t_idx, -1), mask=t_idx < G + 1)
    tl.store(len_ptr + b, eta + 1)
    r = b * (G + 1) + eta
    row = lp_ptr + r * V
    st = st_ptr + (N + r) * STAT_WORDS
    u = tl.load(u_ptr + b)
    if LOGITS:
        W = _sum_fix(row, V, scale, BLOCK_V, False, st, True)
        bonus = _sample_row(row, V, scale, W, u, BLOCK_V, False, st, True)
    else:  # log-probabilities: weights of their det_exp
        W = _sum_fix(row, V, scale, BLOCK_V, True)
        bonus = _sample_row(row, V, scale, W, u, BLOCK_V, True)
    tl.store(bonus_ptr + b, bonus)


# ---- launchers -------------------------------------------------------------------------------

def _block_v(V):
    # The interpreter pays per op, not per element: fewer, wider chunks run faster there.
    cap = 8192 if os.environ.get("TRITON_INTERPRET") == "1" else 1024
    return min(triton.next_power_of_2(V), cap)


def _fix_shift(V):
    return 62 - max(0, int(V - 1).bit_length())


def _outputs(tokens, T):
    B = tokens.shape[0]
    dev = tokens.device
    return (torch.empty(B, T, dtype=torch.int32, device=dev), torch.empty(B, dtype=torch.int32, device=dev),
            torch.empty(B, dtype=torch.int32, device=dev))


def verify_greedy(tokens, parents, target_logits, num_nodes, bitmask=None):
    """Shape: tokens, parents int32 [B, T], target_logits [B, T, V], num_nodes int32 [B], bitmask
    int32 [B, T, ceil(V / 32)] or None -> outputs."""
    B, T = tokens.shape
    V = target_logits.shape[2]
    out = _outputs(tokens, T)
    if B:
        unused = torch.empty(1, dtype=torch.float32, device=tokens.device)
        mask = bitmask.contiguous() if bitmask is not None else unused
        _match_kernel[(B,)](tokens.contiguous(), parents.contiguous(), num_nodes.contiguous(),
                            target_logits.contiguous(), unused, *out, unused, mask, T, V, _fix_shift(V), SAMPLE=False,
                            LOGITS=False, BLOCK_T=triton.next_power_of_2(T), BLOCK_V=_block_v(V),
                            MASKED=bitmask is not None, enable_fp_fusion=False)
    return out


def verify_tree(tokens, parents, target_probs, uniforms, draft_probs, num_nodes, mode, stats=None, bitmask=None):
    """Shape: as specops.verify_tree (validated there). With ``stats`` (int32 [2, B * T,
    STAT_WORDS], triton_kernels/verify_logits.py) the rows are logits, warped on the fly, and
    with ``bitmask`` (int32 [B, T, ceil(V / 32)], stats computed under it) masked as they are read."""
    B, T = tokens.shape
    V = target_probs.shape[2]
    out = _outputs(tokens, T)
    if not B:
        return out
    args = (tokens.contiguous(), parents.contiguous(), num_nodes.contiguous(), target_probs.contiguous())
    u = uniforms.contiguous()
    q = draft_probs.contiguous() if draft_probs is not None else args[3]
    logits = stats is not None
    assert logits or bitmask is None, "a bitmask masks logits rows (stats), not probabilities"
    st = stats if logits else u
    mask = bitmask.contiguous() if bitmask is not None else u
    common = dict(LOGITS=logits, BLOCK_T=triton.next_power_of_2(T), BLOCK_V=_block_v(V), MASKED=bitmask is not None,
                  enable_fp_fusion=False)
    S = _fix_shift(V)
    if mode == "sample_match":
        _match_kernel[(B,)](args[0], args[1], args[2], args[3], u, *out, st, mask, T, V, S, SAMPLE=True, **common)
    elif mode == "gsd":
        _gsd_kernel[(B,)](*args, q, u, *out, st, mask, T, V, S, **common)
    else:
        nb = NBUF[MODES[mode]]
        buf = torch.empty(B, nb, V, dtype=torch.float32, device=tokens.device)
        _mss_kernel[(B,)](*args, q, u, buf, *out, st, mask, T, V, S, MODE=MODES[mode], NB=nb, **common)
    return out


def verify_joint(draft_tokens, target_logprobs, draft_joint_logprobs, log_tau, uniforms, stats=None, num_nodes=None):
    """Shape: draft_tokens int32 [B, g], target_logprobs fp32 [B, g + 1, V], draft_joint_logprobs fp32
    [B, g], log_tau fp32 [B], uniforms fp32 [B] -> outputs with accept_idx [B, g + 1]. With ``stats``
    (int32 [2, B * (g + 1), STAT_WORDS]: the test's warp, the bonus's; triton_kernels/verify_logits.py)
    and ``num_nodes`` (int32 [B]) the rows are logits, warped on the fly (verify_joint_logits)."""
    B, g = draft_tokens.shape
    V = target_logprobs.shape[2]
    out = _outputs(draft_tokens, g + 1)
    if B:
        logits = stats is not None
        u = uniforms.contiguous()
        _joint_kernel[(B,)](draft_tokens.contiguous(), target_logprobs.contiguous(),
                            draft_joint_logprobs.contiguous(), log_tau.contiguous(), u, *out,
                            stats if logits else u, num_nodes.contiguous() if logits else u, g, V, _fix_shift(V),
                            LOGITS=logits, BLOCK_T=triton.next_power_of_2(g + 1), BLOCK_V=_block_v(V),
                            enable_fp_fusion=False)
    return out


def _aot_case(T, kind, dtype=torch.float32):
    """One verify launcher on meta tensors: 4 sequences, T nodes (g = T - 1 drafts for joint), V = 49152."""
    def call():
        B, V = 4, 49152
        i32 = dict(dtype=torch.int32, device="meta")
        f32 = dict(dtype=torch.float32, device="meta")
        tok, par, n = torch.empty(B, T, **i32), torch.empty(B, T, **i32), torch.empty(B, **i32)
        if kind == "greedy":
            verify_greedy(tok, par, torch.empty(B, T, V, dtype=dtype, device="meta"), n)
        elif kind == "joint":
            verify_joint(torch.empty(B, T - 1, **i32), torch.empty(B, T, V, **f32), torch.empty(B, T - 1, **f32),
                         torch.empty(B, **f32), torch.empty(B, **f32))
        else:
            draft = None if kind == "sample_match" else torch.empty(B, T, V, **f32)
            verify_tree(tok, par, torch.empty(B, T, V, **f32), torch.empty(B, T, 2, **f32), draft, n, kind)
    return call


_VERIFY_SPILLS = 16  # a few kernels spill 4-16 B with triton 3.8 (sm_80 mss*, sm_90 sample_match/pointmass)
# Every launcher and mode at the chunk every V >= 1024 gets (BLOCK_V 1024), for a small and a
# large tree (BLOCK_T 8 and 1024): launched on meta tensors and compiled by
# specops.triton_kernels.aot as the JIT would (enable_fp_fusion=False included).
AOT_SPECS = [(f"{kind} T{T}{'' if dt == torch.float32 else ' bf16'}", None, _aot_case(T, kind, dt), _VERIFY_SPILLS)
             for T in (8, 1024)
             for kind, dt in [("greedy", torch.float32), ("greedy", torch.bfloat16), ("sample_match", torch.float32),
                              ("mss", torch.float32), ("mss_pointmass", torch.float32),
                              ("mss_noreplace", torch.float32), ("gsd", torch.float32), ("joint", torch.float32)]]
