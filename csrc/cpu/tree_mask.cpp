// build_tree_mask on the CPU: one independent ancestor walk per (sequence, node).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../tree_mask_args.h"

namespace specops {

void build_tree_mask_cpu(const TreeMaskCall& c) {
  const int64_t T = c.T, W = c.W;
  const int32_t* p = c.parents.data_ptr<int32_t>();
  const int32_t* n = c.num_nodes.data_ptr<int32_t>();
  int32_t* m = c.mask.data_ptr<int32_t>();
  int32_t* d = c.depth.data_ptr<int32_t>();
  // Rows are tiny (W words); a grain of 64 rows keeps task overhead negligible.
  at::parallel_for(0, c.B * T, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = r / T;
      const int32_t i = static_cast<int32_t>(r % T);
      d[r] = tree_mask_row(p + b * T, i, n[b], m + r * W, static_cast<int32_t>(W));
    }
  });
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("build_tree_mask", &specops::build_tree_mask_entry<specops::CpuDevice, specops::build_tree_mask_cpu>);
}
