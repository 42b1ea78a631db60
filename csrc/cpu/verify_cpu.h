// Launcher checks shared by csrc/cpu/verify.cpp and verify_tree.cpp (the row passes are in
// verify_rows.h).
#pragma once

#include <ATen/ATen.h>

#include "../registration.h"
#include "../verify_common.h"
#include "verify_rows.h"

namespace specops {
namespace verify {
namespace cpu {

// Checks shared by the launchers of verify.cpp / verify_tree.cpp (the Python op validates first).
inline void check_tree_args(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& num_nodes,
                            const at::Tensor& rows) {
  SPECOPS_CHECK_DTYPE(tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(tokens, 2);
  SPECOPS_CHECK_DIM(parents, 2);
  SPECOPS_CHECK_DIM(num_nodes, 1);
  SPECOPS_CHECK_DIM(rows, 3);
  TORCH_CHECK(parents.sizes() == tokens.sizes(), "parents must have the shape of tokens");
  TORCH_CHECK(num_nodes.size(0) == tokens.size(0), "num_nodes must have shape [B]");
  TORCH_CHECK(rows.size(0) == tokens.size(0) && rows.size(1) == tokens.size(1),
              "probability rows must have shape [B, T, V]");
  TORCH_CHECK(rows.size(2) >= 1, "V must be >= 1");
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops
