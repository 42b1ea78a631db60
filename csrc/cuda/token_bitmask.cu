// apply_token_bitmask on CUDA: disallowed logits become -inf, in place.
//
// One block per (row, chunk of kChunk tokens); consecutive threads take consecutive tokens, so
// the stores coalesce and the 32 lanes of a warp read one mask word (a broadcast). Allowed
// logits are neither read nor written. Logits are handled as raw bit patterns (uint32 for fp32,
// uint16 for fp16 / bf16), so one kernel body serves the three dtypes.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../token_bitmask_args.h"

namespace specops {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;
constexpr int kChunk = kThreads * kPerThread;  // tokens per block

template <typename Bits>
__global__ void __launch_bounds__(kThreads)
apply_token_bitmask_kernel(Bits* logits,                      // [B, T, V] raw bits, rows at (b * sb + t * st)
                           const int32_t* __restrict__ mask,  // [B * T, W]
                           int64_t T, int64_t V, int64_t W, int64_t sb, int64_t st, int64_t chunks,
                           Bits neg_inf) {
  const int64_t u = blockIdx.x;
  const int64_t r = u / chunks;
  const int64_t j0 = (u % chunks) * kChunk;
  Bits* row = logits + (r / T) * sb + (r % T) * st;
  const int32_t* mrow = mask + r * W;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t j = j0 + k * kThreads + threadIdx.x;
    if (j < V && !mask_test(mrow, static_cast<int32_t>(j))) row[j] = neg_inf;
  }
}

template <typename Bits>
void launch(const BitmaskRows& c, Bits neg_inf) {
  const int64_t chunks = ceil_div(c.V, kChunk);
  const int64_t blocks = c.B * c.T * chunks;
  TORCH_CHECK_VALUE(blocks <= 2147483647, "apply_token_bitmask: too many rows for one launch (", blocks, " blocks)");
  SPECOPS_LAUNCH(static_cast<unsigned int>(blocks), kThreads, 0, gpu::current_stream(), apply_token_bitmask_kernel<Bits>)(
      reinterpret_cast<Bits*>(c.logits.data_ptr()), c.mask.data_ptr<int32_t>(), c.T, c.V, c.W, c.sb, c.st, chunks,
      neg_inf);
  SPECOPS_LAUNCH_CHECK();
}

}  // namespace
}  // namespace specops

SPECOPS_GPU_IMPL(m) { SPECOPS_TOKEN_BITMASK_REGISTER(m, specops::GpuDevice, specops::launch); }
