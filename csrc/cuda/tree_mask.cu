// build_tree_mask on CUDA: one thread per (sequence, node) walking its ancestors
// with the same helper the CPU backend runs (csrc/common.h).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../tree_mask_args.h"

namespace specops {

__global__ void build_tree_mask_kernel(const int32_t* __restrict__ parents,    // [B, T]
                                       const int32_t* __restrict__ num_nodes,  // [B]
                                       int32_t* mask,                          // [B, T, W]
                                       int32_t* depth,                         // [B, T]
                                       int64_t B, int32_t T, int32_t W) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= B * T) return;
  const int64_t b = r / T;
  const int32_t i = static_cast<int32_t>(r % T);
  depth[r] = tree_mask_row(parents + b * T, i, num_nodes[b], mask + r * W, W);
}

void build_tree_mask_cuda(const TreeMaskCall& c) {
  constexpr int kThreads = 128;
  SPECOPS_LAUNCH(ceil_div(c.B * c.T, kThreads), kThreads, 0, gpu::current_stream(), build_tree_mask_kernel)(
      c.parents.data_ptr<int32_t>(), c.num_nodes.data_ptr<int32_t>(), c.mask.data_ptr<int32_t>(),
      c.depth.data_ptr<int32_t>(), c.B, static_cast<int32_t>(c.T), static_cast<int32_t>(c.W));
  SPECOPS_LAUNCH_CHECK();
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  m.impl("build_tree_mask", &specops::build_tree_mask_entry<specops::GpuDevice, specops::build_tree_mask_cuda>);
}
