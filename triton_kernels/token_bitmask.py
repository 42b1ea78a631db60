"""apply_token_bitmask in Triton: a program per (row, tile of BLOCK_V tokens) stores -inf where the
mask bit is clear; allowed logits are neither read nor written."""
import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,  # [B, T, V] fp32/fp16/bf16, rows at b * stride_b + t * stride_t
    mask_ptr,  # [B * T, W] int32
    T,
    V,
    W,
    stride_b,
    stride_t,
    BLOCK_V: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_range = cols < V
    words = tl.load(mask_ptr + r * W + (cols >> 5), mask=in_range, other=-1)
    allowed = ((words >> (cols & 31)) & 1) != 0
    row = logits_ptr + (r // T) * stride_b + (r % T) * stride_t
    neg_inf = tl.full([BLOCK_V], float("-inf"), tl.float32)
    tl.store(row + cols, neg_inf.to(logits_ptr.dtype.element_ty), mask=in_range & ~allowed)


def apply_token_bitmask(logits, bitmask):
    """Shape: logits [B, T, V] or [N, V] (stride 1 in V), bitmask int32 [B, T, W] or [N, W] -> None
    (logits written in place)."""
    if logits.dim() == 2:
        logits, bitmask = logits[None], bitmask[None]
    B, T, V = logits.shape
    W = bitmask.shape[-1]
    mask = bitmask.contiguous()
    if B * T == 0 or V == 0:
        return
    grid = (B * T, triton.cdiv(V, BLOCK_V))
    _apply_token_bitmask_kernel[grid](logits, mask, T, V, W, logits.stride(0), logits.stride(1), BLOCK_V=BLOCK_V)


def _aot_case(B, T, V, dtype):
    def call():
        apply_token_bitmask(torch.empty(B, T, V, dtype=dtype, device="meta"),
                            torch.empty(B, T, (V + 31) // 32, dtype=torch.int32, device="meta"))
    return call


# Vocabularies of Llama 2 (32000, fp32 logits), SmolLM2 (49152, bf16), GPT-2 (50257: W and V
# not multiples of 16, so no divisibility hints) and Llama 3 (128256, fp16), launched by
# apply_token_bitmask on meta tensors and compiled by specops.triton_kernels.aot as the JIT would.
AOT_SPECS = [(f"V{V}-{str(dtype).split('.')[-1]}", None, _aot_case(4, 8, V, dtype), 0)
             for V, dtype in ((32000, torch.float32), (49152, torch.bfloat16), (50257, torch.float32),
                              (128256, torch.float16))]
