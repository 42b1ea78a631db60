"""build_tree_mask in Triton: a tile of rows walks its ancestors in lock-step."""
import torch
import triton
import triton.language as tl

BLOCK_R = 32


@triton.jit
def _build_tree_mask_kernel(
    parents_ptr,  # [B, T] int32
    num_nodes_ptr,  # [B] int32
    mask_ptr,  # [B, T, W] int32
    depth_ptr,  # [B, T] int32
    T,
    W,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    words = tl.arange(0, BLOCK_W)
    n = tl.load(num_nodes_ptr + b)
    in_range = rows < T
    acc = tl.where(words[None, :] == (rows[:, None] >> 5), 1 << (rows[:, None] & 31), 0)
    depth = tl.zeros([BLOCK_R], dtype=tl.int32)
    # j: the node whose parent each row looks up next; -1 once its walk is over. Like the
    # C++ helper, a pointer that does not go strictly backwards ends the walk.
    j = tl.where(in_range & (rows < n), rows, -1)
    while tl.max(j, axis=0) > 0:
        active = j > 0
        p = tl.load(parents_ptr + b * T + j, mask=active, other=-1)
        ok = active & (p >= 0) & (p < j)
        bit = tl.where(ok[:, None] & (words[None, :] == (p[:, None] >> 5)), 1 << (p[:, None] & 31), 0)
        acc = acc | bit
        depth += ok.to(tl.int32)
        j = tl.where(ok, p, -1)
    out_rows = b * T + rows
    tl.store(mask_ptr + out_rows[:, None] * W + words[None, :], acc,
             mask=in_range[:, None] & (words[None, :] < W))
    tl.store(depth_ptr + out_rows, depth, mask=in_range)


def build_tree_mask(parents, num_nodes):
    """Shape: parents int32 [B, T], num_nodes int32 [B] -> (mask int32 [B, T, W], depth int32 [B, T])."""
    B, T = parents.shape
    W = triton.cdiv(T, 32)
    parents = parents.contiguous()
    num_nodes = num_nodes.contiguous()
    mask = torch.empty(B, T, W, dtype=torch.int32, device=parents.device)
    depth = torch.empty(B, T, dtype=torch.int32, device=parents.device)
    if B * T:
        grid = (B, triton.cdiv(T, BLOCK_R))
        _build_tree_mask_kernel[grid](parents, num_nodes, mask, depth, T, W,
                                      BLOCK_R=BLOCK_R, BLOCK_W=triton.next_power_of_2(W))
    return mask, depth


def _aot_case(T):
    def call():
        build_tree_mask(torch.empty(4, T, dtype=torch.int32, device="meta"),
                        torch.empty(4, dtype=torch.int32, device="meta"))
    return call


# BLOCK_W = next_pow2(ceil(T / 32)): 1 (T = 26), 8 (T = 256), 128 (T = 4096), launched by
# build_tree_mask on meta tensors and compiled by specops.triton_kernels.aot as the JIT would.
AOT_SPECS = [(f"T{T}", None, _aot_case(T), 0) for T in (26, 256, 4096)]
