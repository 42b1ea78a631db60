"""The tile configurations of the Triton tree_attention kernel (triton_kernels/tree_attention.py)
per GPU architecture, head size class and dtype, the device's table and SM count (``target``), and
``supports``: whether a call can run here, before any launch."""
import functools
import os
from dataclasses import dataclass

import torch
import triton

from ..ops.tree_attention.splits import SIM_TARGET

MAX_D = 256  # the widest head the CONFIGS table has tiles for
GRID_X_MAX = 2**31 - 1  # CUDA's grid-x limit (grid y/z stop at 65535: only the split count goes there)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int  # a multiple of 32 (whole mask words per tile)
    num_warps: int
    num_stages: int


# CONFIGS[arch][wide][BLOCK_D] = (decode config, block config): "decode" when a (sequence, kv head)
# has at most 16 query rows (Tq * G <= 16), "block" otherwise; wide = fp32 (CUDA-core ieee dots,
# half the tile of fp16/bf16 tensor-core dots). Chosen so that every entry compiles with zero
# register spills and fits the shared memory of the GPUs that get it: table 90 the 227 KB of
# sm_90, table 80 the 99 KB of sm_86 / sm_89 / sm_120, which use it too (SMEM_SMALL); checked on
# the compiled kernels by tests/test_triton_aot.py. (fp32 D 256 uses 16-row tiles throughout:
# with 32 rows ptxas spills kilobytes in the split variant.)
CONFIGS = {
    90: {
        False: {64: (Config(16, 64, 4, 3), Config(64, 64, 4, 3)),
                128: (Config(16, 64, 4, 3), Config(64, 64, 8, 3)),
                256: (Config(16, 64, 4, 2), Config(64, 64, 8, 2))},
        True: {64: (Config(16, 32, 4, 3), Config(32, 32, 4, 3)),
               128: (Config(16, 32, 4, 3), Config(32, 32, 4, 3)),
               256: (Config(16, 32, 4, 2), Config(16, 32, 4, 2))},
    },
    80: {
        False: {64: (Config(16, 64, 4, 3), Config(64, 64, 4, 3)),
                128: (Config(16, 64, 4, 3), Config(64, 64, 8, 3)),
                256: (Config(16, 64, 4, 2), Config(64, 32, 8, 2))},
        True: {64: (Config(16, 32, 4, 3), Config(32, 32, 4, 3)),
               128: (Config(16, 32, 4, 3), Config(32, 32, 4, 2)),
               256: (Config(16, 32, 4, 2), Config(16, 32, 4, 2))},
    },
}
# Paged entries that differ from CONFIGS, (arch, wide, BLOCK_D) -> (decode, block). ptxas (CUDA
# 12.9) gives the paged fp32 D 256 kernel on sm_90 with 2 stages 32 registers and ~9.5 KB of spills
# (the contiguous one: 138 registers, none) whatever the register cap; with 3 stages it compiles
# spill-free (195 registers, 85 KB of shared memory). Checked by tests/test_triton_aot.py.
PAGED_CONFIGS = {(90, True, 256): (Config(16, 32, 4, 3), Config(16, 32, 4, 3))}
ARCHS = tuple(CONFIGS)
SMEM_BIG = 232448  # sm_90 / sm_100 opt-in shared memory per block: table 90
SMEM_SMALL = 101376  # sm_86 / sm_89 / sm_120 opt-in (A100: 166912): every table 80 entry fits


def block_d(D):
    return max(16, triton.next_power_of_2(D))


def config(arch, dtype, D, rows, paged=False):
    """The Config for ``rows = Tq * G`` query rows per (sequence, kv head) of head size ``D``
    (``paged``: of the paged variant, PAGED_CONFIGS where it has an entry)."""
    key = (arch, dtype == torch.float32, max(64, block_d(D)))
    decode, block = (PAGED_CONFIGS.get(key) if paged else None) or CONFIGS[key[0]][key[1]][key[2]]
    return decode if rows <= 16 else block


def invariant_config(arch, dtype, D, G):
    """The Config of the invariant schedule: a function of the head size, dtype and GQA group only
    (never of Tq, B, S, the block or the layout): one query's G heads a program (rows padded to a
    dot's 16), the decode entry's key tiles; fp32 with 8 warps and 3 stages, where 4 warps spill
    (the gathered rows pipeline as the paged ones do; up to 10 KB of spills on sm_90). Checked by
    the AOT cases "invariant ..."."""
    decode, wide = config(arch, dtype, D, 1), dtype == torch.float32
    return Config(max(16, triton.next_power_of_2(G)), decode.block_n, 8 if wide else decode.num_warps,
                  3 if wide else decode.num_stages)


@functools.cache
def _cuda_target(index):
    props = torch.cuda.get_device_properties(index)
    big = props.major >= 9 and props.shared_memory_per_block_optin >= SMEM_BIG
    return (90 if big else 80), props.multi_processor_count, (props.major, props.minor)


def target(device):
    """(CONFIGS table, SM count, capability) of ``device``: table 90 for sm_90+ parts with 227 KB
    of shared memory per block, else table 80. The interpreter (CPU tensors) plans with table 90
    and 8 SMs (splits.SIM_TARGET), so that small decode problems split too and the split path is
    exercised."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())
    return (*SIM_TARGET, None)


def supports(q, k_cache, v_cache=None, prefix_lens=None, block_lens=None, mask=None, q_lens=None,
             sm_scale=None):
    """``(ok, reason)``: can this backend run the call (shapes, dtypes, device; no host sync)?

    Shape: the arguments of :func:`tree_attention` (only q, k_cache and the device are read)."""
    return _supports(q, k_cache.shape[1], paged=False)


def supports_paged(q, k_pages, v_pages=None, page_table=None, prefix_lens=None, block_lens=None, mask=None,
                   q_lens=None, sm_scale=None):
    """:func:`supports` for :func:`tree_attention_paged` (k_pages [num_pages, page_size, Hkv, D])."""
    return _supports(q, k_pages.shape[2], paged=True)


def _supports(q, Hkv, paged):
    dev = q.device
    if dev.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "CPU tensors need TRITON_INTERPRET=1"
    elif dev.type != "cuda":
        return False, f"no Triton backend for {dev.type} tensors"
    if q.dtype not in _FLOATS:
        return False, f"q dtype must be one of {_FLOATS}, got {q.dtype}"
    D = q.shape[-1]
    if D > MAX_D:
        return False, f"head size D={D} > {MAX_D} (no tile configuration fits shared memory)"
    B, Tq, Hq = q.shape[:3]
    if Hkv == 0 or Hq % Hkv:
        return False, f"Hq={Hq} is not a multiple of Hkv={Hkv}"
    if dev.type == "cuda":
        cap = target(dev)[2]
        if cap < (8, 0):
            return False, f"sm_{cap[0]}{cap[1]}: the tile configurations are built for sm_80 and newer"
    rows = Tq * (Hq // Hkv)
    programs = triton.cdiv(rows, config(target(dev)[0], q.dtype, D, rows, paged).block_m) * B * Hkv
    if programs > GRID_X_MAX:
        return False, f"{programs} programs (B * Hkv * row tiles) exceed the grid limit {GRID_X_MAX}"
    return True, "ok"
