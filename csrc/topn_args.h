// Host-side arguments of topn_expand and select_topn_subtree shared by the CPU and CUDA launchers:
// the checks (the device ones through the backend's Device, csrc/registration.h), the outputs, and
// the registered entry points. Each backend supplies the runners and its limit on n.
//
// The public Python ops validate every argument with a ValueError/TypeError that names it; these
// checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "registration.h"

namespace specops {
namespace topn {

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// One topn_expand call: the inputs, contiguous, and the outputs [B, n] (scores fp32, tokens and
// parents int32) for the runner to fill; kp = min(per_parent_k, n, V) children per parent.
struct Expand {
  at::Tensor parent_scores, child_logprobs;  // [B, P] fp32, [B, P, V]
  int64_t B, P, V, n, kp;
  at::Tensor scores, tokens, parents;
};

// One select_topn_subtree call: the inputs, contiguous, and the outputs (keep_idx and new_parents
// [B, n], counts [B], int32).
struct Select {
  at::Tensor parents, scores, num_nodes;  // [B, T] int32, [B, T] fp32, [B] int32
  int64_t B, T, n;
  at::Tensor keep, new_parents, counts;
};

inline void check_n(const char* op, int64_t n, int64_t max_n) {
  TORCH_CHECK_VALUE(n >= 1 && n <= max_n, op, ": n must be >= 1 and <= ", max_n, ", got ", n);
}

// MaxN: the backend's largest n (what its kernels keep per sequence).
template <class Dev, int64_t MaxN, void (*Run)(const Expand&)>
Result expand_entry(const at::Tensor& parent_scores,   // [B, P] fp32
                    const at::Tensor& child_logprobs,  // [B, P, V] fp32/bf16/fp16
                    int64_t n, int64_t per_parent_k) {
  SPECOPS_CHECK_DTYPE(parent_scores, at::kFloat);
  SPECOPS_CHECK_DIM(parent_scores, 2);
  SPECOPS_CHECK_DIM(child_logprobs, 3);
  check_device<Dev>("topn_expand", {{"parent_scores", &parent_scores}, {"child_logprobs", &child_logprobs}});
  const int64_t B = child_logprobs.size(0), P = child_logprobs.size(1), V = child_logprobs.size(2);
  TORCH_CHECK_VALUE(parent_scores.size(0) == B && parent_scores.size(1) == P,
                    "topn_expand: parent_scores must have shape [B, P] of child_logprobs");
  check_n("topn_expand", n, MaxN);
  TORCH_CHECK_VALUE(P >= 1 && V >= 1, "topn_expand: child_logprobs must have P >= 1 and V >= 1");
  const typename Dev::Guard guard(parent_scores.device());
  const at::Tensor ps = parent_scores.contiguous();
  const auto i32 = ps.options().dtype(at::kInt);
  const Expand e{ps, child_logprobs.contiguous(), B, P, V, n, std::min({per_parent_k >= 1 ? per_parent_k : V, n, V}),
                 at::empty({B, n}, ps.options()), at::empty({B, n}, i32), at::empty({B, n}, i32)};
  if (B > 0) Run(e);
  return {e.scores, e.tokens, e.parents};
}

template <class Dev, void (*Run)(const Select&)>
Result select_entry(const at::Tensor& parents,    // [B, T] int32
                    const at::Tensor& scores,     // [B, T] fp32
                    const at::Tensor& num_nodes,  // [B] int32
                    int64_t n) {
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(scores, at::kFloat);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(parents, 2);
  check_device<Dev>("select_topn_subtree", {{"parents", &parents}, {"scores", &scores}, {"num_nodes", &num_nodes}});
  check_n("select_topn_subtree", n, INT32_MAX);
  const int64_t B = parents.size(0), T = parents.size(1);
  TORCH_CHECK_VALUE(T >= 1, "select_topn_subtree: parents must have T >= 1");
  TORCH_CHECK_VALUE(scores.sizes() == parents.sizes(), "select_topn_subtree: scores must have the shape of parents");
  TORCH_CHECK_VALUE(num_nodes.dim() == 1 && num_nodes.size(0) == B,
                    "select_topn_subtree: num_nodes must have shape [B]");
  const typename Dev::Guard guard(parents.device());
  const at::Tensor par = parents.contiguous();
  const Select s{par, scores.contiguous(), num_nodes.contiguous(), B, T, n,
                 at::empty({B, n}, par.options()), at::empty({B, n}, par.options()), at::empty({B}, par.options())};
  if (B > 0) Run(s);
  return {s.keep, s.new_parents, s.counts};
}

// Registers both ops for one backend.
#define SPECOPS_TOPN_REGISTER(m, DEV, MAX_N, EXPAND, SELECT)                                     \
  do {                                                                                          \
    m.impl("topn_expand", &specops::topn::expand_entry<DEV, MAX_N, EXPAND>);                    \
    m.impl("select_topn_subtree", &specops::topn::select_entry<DEV, SELECT>);                   \
  } while (0)

}  // namespace topn
}  // namespace specops
