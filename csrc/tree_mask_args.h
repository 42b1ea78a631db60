// Host-side arguments of build_tree_mask shared by the CPU and CUDA launchers: the checks (the
// device ones through the backend's Device, csrc/registration.h), the outputs and the registered
// entry point; each backend supplies the runner. The public Python op validates every argument
// with a ValueError/TypeError naming it; these checks guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <tuple>

#include "common.h"
#include "registration.h"

namespace specops {

// One build_tree_mask call with nodes: parents [B, T] and num_nodes [B] int32, contiguous, and the
// outputs mask [B, T, W = ceil(T / 32)] and depth [B, T] int32 (common.h, tree_mask_row).
struct TreeMaskCall {
  at::Tensor parents, num_nodes, mask, depth;
  int64_t B, T, W;
};

template <class Dev, void (*Run)(const TreeMaskCall&)>
std::tuple<at::Tensor, at::Tensor> build_tree_mask_entry(const at::Tensor& parents,    // [B, T] int32
                                                         const at::Tensor& num_nodes)  // [B] int32
{
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(parents, 2);
  SPECOPS_CHECK_DIM(num_nodes, 1);
  check_device<Dev>("build_tree_mask", {{"parents", &parents}, {"num_nodes", &num_nodes}});
  const int64_t B = parents.size(0), T = parents.size(1), W = ceil_div(T, 32);
  TORCH_CHECK_VALUE(num_nodes.size(0) == B, "num_nodes must have shape [B]");
  const typename Dev::Guard guard(parents.device());
  const TreeMaskCall c{parents.contiguous(), num_nodes.contiguous(), at::empty({B, T, W}, parents.options()),
                       at::empty({B, T}, parents.options()), B, T, W};
  if (B * T > 0) Run(c);
  return {c.mask, c.depth};
}

}  // namespace specops
