// build_tree_mask on the CPU: one independent ancestor walk per (sequence, node).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common.h"
#include "../registration.h"

namespace specops {

std::tuple<at::Tensor, at::Tensor> build_tree_mask_cpu(const at::Tensor& parents,    // [B, T] int32
                                                       const at::Tensor& num_nodes)  // [B] int32
{
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(parents, 2);
  SPECOPS_CHECK_DIM(num_nodes, 1);
  const int64_t B = parents.size(0), T = parents.size(1);
  TORCH_CHECK_VALUE(num_nodes.size(0) == B, "num_nodes must have shape [B]");
  const int64_t W = ceil_div(T, 32);
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto mask = at::empty({B, T, W}, parents.options());  // [B, T, W]
  auto depth = at::empty({B, T}, parents.options());    // [B, T]
  const int32_t* p = par.data_ptr<int32_t>();
  const int32_t* n = nn.data_ptr<int32_t>();
  int32_t* m = mask.data_ptr<int32_t>();
  int32_t* d = depth.data_ptr<int32_t>();
  // Rows are tiny (W words); a grain of 64 rows keeps task overhead negligible.
  at::parallel_for(0, B * T, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = r / T;
      const int32_t i = static_cast<int32_t>(r % T);
      d[r] = tree_mask_row(p + b * T, i, n[b], m + r * W, static_cast<int32_t>(W));
    }
  });
  return {mask, depth};
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("build_tree_mask", &specops::build_tree_mask_cpu); }
