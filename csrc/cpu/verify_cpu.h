// V-wide row primitives of the CPU verification kernels (csrc/cpu/verify*.cpp).
//
// Plain loops over one row; the fixed-point weights make every sum exact, so the loop order is
// free and the compiler may vectorise. Shared by verify.cpp and verify_tree.cpp.
#pragma once

#include <ATen/ATen.h>

#include "../registration.h"
#include "../verify_common.h"

namespace specops {
namespace verify {
namespace cpu {

// Sum of the fixed-point weights of a row; Weight maps an element to its probability.
template <class Weight>
int64_t sum_weights(int64_t V, Weight&& weight) {
  int64_t s = 0;
  for (int64_t i = 0; i < V; ++i) s += weight(i);
  return s;
}

// Inverse-CDF draw over the weights of a row whose sum is W (token 0 if W == 0).
template <class Weight>
int32_t sample_weights(int64_t V, int64_t W, float u, Weight&& weight) {
  if (W <= 0) return 0;
  const int64_t t = sample_threshold(u, W);
  int64_t c = 0;
  for (int64_t i = 0; i < V; ++i) {
    c += weight(i);
    if (c > t) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(V - 1);  // unreachable when W is the row's weight sum
}

inline int64_t sum_fix(const float* x, int64_t V, float scale) {
  return sum_weights(V, [&](int64_t i) { return fix_weight(x[i], scale); });
}

inline int32_t sample_fix(const float* x, int64_t V, float scale, int64_t W, float u) {
  return sample_weights(V, W, u, [&](int64_t i) { return fix_weight(x[i], scale); });
}

// First index of the maximum (NaN counts as +inf). A vectorisable max pass, then a search.
template <class scalar_t>
int32_t argmax_row(const scalar_t* x, int64_t V) {
  float best = -inf_f();
  bool nan = false;
  for (int64_t i = 0; i < V; ++i) {
    const float v = static_cast<float>(x[i]);
    nan |= v != v;
    best = v > best ? v : best;
  }
  if (nan) best = inf_f();
  for (int64_t i = 0; i < V; ++i)
    if (argmax_key(static_cast<float>(x[i])) == best) return static_cast<int32_t>(i);
  return 0;  // all -inf: the first index
}

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
