// build_tree_mask on CUDA: one thread per (sequence, node) walking its ancestors
// with the same helper the CPU backend runs (csrc/common.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../common.h"
#include "../registration.h"

namespace specops {

__global__ void build_tree_mask_kernel(const int32_t* __restrict__ parents,    // [B, T]
                                       const int32_t* __restrict__ num_nodes,  // [B]
                                       int32_t* __restrict__ mask,             // [B, T, W]
                                       int32_t* __restrict__ depth,            // [B, T]
                                       int64_t B, int32_t T, int32_t W) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= B * T) return;
  const int64_t b = r / T;
  const int32_t i = static_cast<int32_t>(r % T);
  depth[r] = tree_mask_row(parents + b * T, i, num_nodes[b], mask + r * W, W);
}

std::tuple<at::Tensor, at::Tensor> build_tree_mask_cuda(const at::Tensor& parents,    // [B, T] int32
                                                        const at::Tensor& num_nodes)  // [B] int32
{
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(parents, 2);
  SPECOPS_CHECK_DIM(num_nodes, 1);
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(parents) && SPECOPS_ON_GPU(num_nodes), "build_tree_mask: " SPECOPS_GPU_NAME " tensors expected");
  const gpu::DeviceGuard guard(parents.device());
  const int64_t B = parents.size(0), T = parents.size(1);
  const int64_t W = ceil_div(T, 32);
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto mask = at::empty({B, T, W}, parents.options());
  auto depth = at::empty({B, T}, parents.options());
  if (B * T == 0) return {mask, depth};
  constexpr int kThreads = 128;
  const int64_t blocks = ceil_div(B * T, kThreads);
  SPECOPS_LAUNCH(blocks, kThreads, 0, gpu::current_stream(), build_tree_mask_kernel)(
      par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), mask.data_ptr<int32_t>(),
      depth.data_ptr<int32_t>(), B, static_cast<int32_t>(T), static_cast<int32_t>(W));
  SPECOPS_LAUNCH_CHECK();
  return {mask, depth};
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) { m.impl("build_tree_mask", &specops::build_tree_mask_cuda); }
