"""verify_tree_logits in Triton: a statistics kernel, then verify_tree's walk kernels on logits.

1. ``_row_stats_kernel``: a grid of G programs, each taking rows r = pid, pid + G, ... of the
   target and the draft logits (2 * B * T rows), runs warp_probs' own row pass (``row_stats`` of
   triton_kernels/sampling.py, same tile width, so the same summation order) and stores the row's
   statistics (mx, t, klo, s, best: STAT_WORDS int32) instead of the row. Its candidate scratch
   is one [V] fp32 row per program ([G, V], G <= 128), not [N, V].
2. The walk kernels of triton_kernels/verify.py with LOGITS=True: every target / draft value they
   read is ``warp_value`` of the logit and its row's statistics, the function warp_probs' kernel
   writes its rows with, so the walk sees warp_probs' probabilities bit for bit. Residual rows live
   in the walk's [B, NB, V] scratch, as in verify_tree.

With a bitmask (MASKED) both read the mask words next to the logits they mask (load_logits of
triton_kernels/sampling.py): target row u under bitmask row u, draft row c under row parents[c].
No masked copy of the logits is made and no pass is added.

Extra memory: 2 * B * T * STAT_WORDS int32 + G * V + B * NB * V fp32 (as verify_tree's).
"""
import torch
import triton
import triton.language as tl

from . import verify
from .sampling import NUM_WARPS, _blocks, mass_scale, row_stats
from .verify_rows import STAT_WORDS

MAX_PROGRAMS = 128  # rows in flight in the statistics kernel (its scratch is [programs, V] fp32)


@triton.jit
def _row_stats_kernel(
    x_ptr,  # [N, V] target logits fp32/bf16/fp16
    y_ptr,  # [N, V] draft logits (same dtype as x_ptr's kernel instance), or x_ptr when R == N
    temp_ptr,  # [2, N] fp32: target, draft
    top_k_ptr,  # [2, N] int32
    top_p_ptr,  # [2, N] fp32
    st_ptr,  # [2, N, STAT_WORDS] int32 out
    cand_ptr,  # [G, V] fp32 scratch
    mask_ptr,  # [N, W] int32 allowed tokens per node (MASKED only)
    par_ptr,  # [N] int32 parents (MASKED only)
    N,
    R,  # rows to do: N (target only) or 2 * N
    D0,  # the first draft row of this launch (MASKED only): N, or 0 for a draft-only launch
    T,
    V,
    scale,
    BLOCK: tl.constexpr,
    BLOCK_SEL: tl.constexpr,
    MASKED: tl.constexpr = False,
):
    pid = tl.program_id(0)
    cand_row = cand_ptr + pid.to(tl.int64) * V
    for r in range(pid, R, tl.num_programs(0)):
        r64 = tl.full([], 0, tl.int64) + r
        if r64 < N:
            x_row = x_ptr + r64 * V
        else:
            x_row = y_ptr + (r64 - N) * V
        mrow = mask_ptr
        if MASKED:
            # Draft row c was drawn in its parent's grammar state: mask row parents[c], row 0 of the
            # sequence for the root (and a padding node's parent outside [0, c)).
            c = r64 - D0
            i = c % T
            pc = tl.load(par_ptr + c, mask=c >= 0, other=0)
            node = tl.where(c >= 0, c - i + tl.where((pc >= 0) & (pc < i), pc, 0), r64)
            mrow = mask_ptr + node * ((V + 31) // 32)
        t = tl.load(temp_ptr + r64)
        mx, klo, s, best = row_stats(x_row, cand_row, V, t, tl.load(top_k_ptr + r64), tl.load(top_p_ptr + r64),
                                     scale, BLOCK, BLOCK_SEL, mrow, MASKED)
        t = tl.where(best >= 0, 1.0, t)
        out = st_ptr + r64 * STAT_WORDS
        tl.store(out, mx.to(tl.int32, bitcast=True))
        tl.store(out + 1, t.to(tl.int32, bitcast=True))
        tl.store(out + 2, klo)
        tl.store(out + 3, s.to(tl.int32, bitcast=True))
        tl.store(out + 4, best)
        tl.debug_barrier()  # the next row's candidates overwrite this one's scratch


def row_stats_of(target_logits, draft_logits, t, k, p, dt, dk, dp, parents=None, bitmask=None):
    """Shape: logits [B, T, V] (draft may be None), params [B * T], parents int32 [B, T] and bitmask
    int32 [B, T, ceil(V / 32)] or None -> int32 [2, B * T, STAT_WORDS]."""
    B, T, V = target_logits.shape
    N = B * T
    x = target_logits.contiguous()
    stats = torch.zeros(2, N, STAT_WORDS, dtype=torch.int32, device=x.device)
    block, block_sel = _blocks(V)
    scale = mass_scale(V)
    temp, top_k, top_p = (torch.stack([a, b]).contiguous() for a, b in ((t, dt), (k, dk), (p, dp)))
    # One launch per logits dtype: the draft's may differ from the target's.
    if draft_logits is None or draft_logits.dtype == x.dtype:
        y = x if draft_logits is None else draft_logits.contiguous()
        launches = [(x, y, temp, top_k, top_p, stats, N if draft_logits is None else 2 * N, N)]
    else:
        launches = [(x, x, temp, top_k, top_p, stats, N, N),
                    (draft_logits.contiguous(), draft_logits.contiguous(), temp[1:], top_k[1:], top_p[1:], stats[1:],
                     N, 0)]
    masked = bitmask is not None
    mask, par = (bitmask.contiguous(), parents.contiguous()) if masked else (stats, stats)
    for xx, yy, tt, kk, pp, st, R, D0 in launches:
        G = min(R, MAX_PROGRAMS)
        cand = torch.empty(G, V, dtype=torch.float32, device=x.device)
        _row_stats_kernel[(G,)](xx, yy, tt, kk, pp, st, cand, mask, par, N, R, D0, T, V, scale, BLOCK=block,
                                BLOCK_SEL=block_sel, MASKED=masked, num_warps=NUM_WARPS)
    return stats


def verify_tree_logits(tokens, parents, target_logits, uniforms, t, k, p, draft_logits, dt, dk, dp, num_nodes, mode,
                       bitmask=None):
    """Shape: as specops.verify_tree_logits (validated there); params [B * T]."""
    if tokens.shape[0] == 0:
        return verify.verify_tree(tokens, parents, target_logits, uniforms, draft_logits, num_nodes, mode)
    stats = row_stats_of(target_logits, draft_logits, t, k, p, dt, dk, dp, parents, bitmask)
    return verify.verify_tree(tokens, parents, target_logits, uniforms, draft_logits, num_nodes, mode, stats=stats,
                              bitmask=bitmask)


def verify_joint_logits(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms, t, k, p, bt, bk, bp,
                        num_nodes):
    """Shape: as specops.verify_joint_logits (validated there); params [B * (g + 1)]. The statistics
    kernel above warps the rows twice (the test's warp as the target's, the bonus's as the draft's),
    then R6's kernel reads them as logits."""
    if draft_tokens.shape[0] == 0:
        return verify.verify_joint(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms)
    stats = row_stats_of(target_logits, target_logits, t, k, p, bt, bk, bp)
    return verify.verify_joint(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms, stats=stats,
                               num_nodes=num_nodes)


def _aot_case(T, mode, dtype, masked=False):
    def call():
        B, V = 4, 49152
        i32 = dict(dtype=torch.int32, device="meta")
        f32 = dict(dtype=torch.float32, device="meta")
        x = torch.empty(B, T, V, dtype=dtype, device="meta")
        draft = None if mode in ("sample_match", "mss_pointmass") else torch.empty(B, T, V, dtype=dtype, device="meta")
        prm = [torch.empty(B * T, **f32), torch.empty(B * T, **i32), torch.empty(B * T, **f32)]
        mask = torch.empty(B, T, V // 32, **i32) if masked else None
        verify_tree_logits(torch.empty(B, T, **i32), torch.empty(B, T, **i32), x, torch.empty(B, T, 2, **f32), *prm,
                           draft, *prm, torch.empty(B, **i32), mode, mask)
    return call


def _aot_joint_case(T, dtype):
    def call():
        B, V = 4, 49152
        i32 = dict(dtype=torch.int32, device="meta")
        f32 = dict(dtype=torch.float32, device="meta")
        prm = [torch.empty(B * T, **f32), torch.empty(B * T, **i32), torch.empty(B * T, **f32)]
        verify_joint_logits(torch.empty(B, T - 1, **i32), torch.empty(B, T, V, dtype=dtype, device="meta"),
                            torch.empty(B, T - 1, **f32), torch.empty(B, **f32), torch.empty(B, **f32), *prm, *prm,
                            torch.empty(B, **i32))
    return call


# The statistics kernel and every walk with LOGITS=True, per logits dtype, compiled by
# specops.triton_kernels.aot as the JIT would; MASKED (a grammar's bitmask) for a draft-reading
# and a target-only walk, the statistics kernel masked with both.
AOT_SPECS = [(f"logits {mode} T8 {str(dt)[6:]}{' masked' if masked else ''}", None, _aot_case(8, mode, dt, masked),
              verify._VERIFY_SPILLS)
             for mode, masked in [(m, False) for m in ("mss", "mss_pointmass", "mss_noreplace", "sample_match", "gsd")]
             + [("mss", True), ("sample_match", True), ("gsd", True)]
             for dt in (torch.float32, torch.bfloat16)]
AOT_SPECS += [(f"logits joint T8 {str(dt)[6:]}", None, _aot_joint_case(8, dt), verify._VERIFY_SPILLS)
              for dt in (torch.float32, torch.bfloat16)]
