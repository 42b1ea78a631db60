"""specops.linear in Triton: a small-row GEMM whose every output element is reduced in one fixed order.

One program owns a BLOCK_M x BLOCK_N tile of the output and walks K in tiles of BLOCK_K, one
``tl.dot`` per tile accumulated in fp32, with no split-K. BLOCK_M is fixed and BLOCK_N, BLOCK_K,
warps and stages depend on (dtype, K) only (:func:`config`), never on M: the kernel that computes
an element, and so the order of its reduction, is the same whatever the number of rows in the call
or the row's position in its tile (a tensor-core MMA computes every element of its tile the same
way). ``M`` and the row-tile count are not specialised (``do_not_specialize``), so a one-row call runs the very kernel an
M-row call does. Row i of an M-row call therefore equals the one-row call on row i bit for bit.

Under TRITON_INTERPRET=1 (CPU tensors) the interpreter's ``tl.dot`` is numpy's matmul (OpenBLAS),
whose value for one row depends on the other rows of the tile (measured: every row of a [16, 32] x
[32, 40] fp32 product differs from the same row multiplied alone), and whose bf16 operands are raw
bits. So the interpreted kernel (``EMULATE_DOT``) forms each K tile's products in fp32 (exact for
bf16 / fp16 operands, as on tensor cores) and reduces them with ``tl.sum`` over the tile (numpy's
pairwise sum along the contiguous axis: a fixed order per element, whatever the other rows). The
compiled kernel's tl.dot and the interpreted kernel share the tiles, masks and addressing, not the
order inside a tile. The interpreter's fp32 -> bf16 cast truncates, so there the kernel stores
fp32 and torch rounds to x's dtype (to nearest even, as a GPU store does).
"""
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .aot import Launch

BLOCK_M = 16  # rows per program, fixed: the tile never depends on M


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def config(dtype, K):
    """The tiles of a call: a function of (dtype, K) only, so that the reduction order is too.

    16-bit inputs: 32 output columns a program (N = 576 gives 18 programs at M <= 16) and K tiles of
    128 (one m16n8k16 chain of 8 steps a tile). fp32: exact fp32 FMAs (``input_precision="ieee"``,
    no tf32), tiles of 32. K shorter than a tile takes the next power of two (at least 16, tl.dot's
    minimum)."""
    wide = dtype == torch.float32
    block_k = 32 if wide else 128
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    return Config(block_n=32, block_k=block_k, num_warps=4, num_stages=3 if K > block_k else 1)


@triton.jit(do_not_specialize=["M", "N_M"])
def _linear_kernel(
    x_ptr,  # [M, K] fp32/bf16/fp16, row stride sx, unit column stride
    w_ptr,  # [N, K] same dtype, row stride sw, unit column stride
    b_ptr,  # [N] same dtype (HAS_BIAS), else any pointer
    out_ptr,  # [M, N] contiguous: x's dtype, or fp32 when the interpreter rounds in torch
    M,
    N,
    K,
    sx,
    sw,
    N_M,  # row tiles: programs pid, pid + 1, ... share a column tile (its weights stay in L2)
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EMULATE_DOT: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m = pid % N_M
    pid_n = pid // N_M
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * sx + ks[None, :]  # [BM, BK]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * sw + ks[None, :]  # [BN, BK]: K contiguous
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        a = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if EMULATE_DOT:
            prod = a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]  # [BM, BN, BK]
            acc += tl.sum(prod, axis=2)
        else:
            # ieee: fp32 inputs are not rounded to tf32 (ignored for bf16/fp16 inputs).
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")  # [BM, BN]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _interpret():
    return os.environ.get("TRITON_INTERPRET") == "1"


def plan(x, weight, bias):
    """(output buffer, launch arguments) of one call; the buffer is fp32 where the interpreter
    rounds in torch. Shape: x [M, K], weight [N, K], bias [N] or None, last strides 1."""
    M, K = x.shape
    N = weight.shape[0]
    interp = _interpret()
    out_dtype = torch.float32 if interp else x.dtype
    out = torch.empty(M, N, dtype=out_dtype, device=x.device)
    cfg = config(x.dtype, K)
    n_m = triton.cdiv(M, BLOCK_M)
    grid = (n_m * triton.cdiv(N, cfg.block_n),)
    args = (x, weight, bias if bias is not None else weight, out, M, N, K, x.stride(0), weight.stride(0), n_m)
    meta = dict(HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                EMULATE_DOT=interp, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, Launch(_linear_kernel, grid, args, meta)


def linear(x, weight, bias):
    """Shape: x [M, K], weight [N, K], bias [N] or None (unit last strides, one dtype) -> [M, N] in x's dtype."""
    out, launch = plan(x, weight, bias)
    if out.numel():
        launch.kernel[launch.grid](*launch.args, **launch.kwargs)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _aot_case(M, N, K, dtype, bias=False):
    def call():
        x = torch.empty(M, K, dtype=dtype, device="meta")
        w = torch.empty(N, K, dtype=dtype, device="meta")
        linear(x, w, torch.empty(N, dtype=dtype, device="meta") if bias else None)
    return call


# SmolLM2's projections (K 576: q/o 576, k/v 192, gate/up 1536, LM head 49152; down K 1536) in bf16
# at M = 1 and 16 (M is not specialised: one kernel for both), fp16 and fp32 at K 576, a biased
# call, and a K shorter than a tile (BLOCK_K 16).
AOT_SPECS = [
    *[(f"bfloat16 M{M} N{N} K576", None, _aot_case(M, N, 576, torch.bfloat16), 0)
      for N in (576, 192, 1536, 49152) for M in (1, 16)],
    ("bfloat16 M16 N576 K1536", None, _aot_case(16, 576, 1536, torch.bfloat16), 0),
    ("float16 M8 N576 K576 bias", None, _aot_case(8, 576, 576, torch.float16, bias=True), 0),
    ("float32 M8 N576 K576", None, _aot_case(8, 576, 576, torch.float32), 0),
    ("bfloat16 M3 N33 K15", None, _aot_case(3, 33, 15, torch.bfloat16), 0),
]
