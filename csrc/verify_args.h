// Host-side arguments of the verification launchers (verify_greedy, verify_tree, verify_joint,
// verify_tree_logits, verify_joint_logits) shared by csrc/cpu/verify*.cpp and csrc/cuda/verify.cu:
// the mode names, the shape/dtype checks that do not depend on the device, and the outputs. Each
// launcher adds its device checks (the CPU's also the logits dtypes its row readers take; the CUDA
// kernels are instantiated for fp64 too).
//
// The public Python ops validate every argument with a ValueError/TypeError that names it; these
// checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>

#include "registration.h"
#include "verify_common.h"

namespace specops {
namespace verify {

inline int32_t parse_mode(c10::string_view name) {
  const std::string mode(name);
  if (mode == "mss") return kMss;
  if (mode == "mss_pointmass") return kMssPointmass;
  if (mode == "mss_noreplace") return kMssNoreplace;
  if (mode == "sample_match") return kSampleMatch;
  if (mode == "gsd") return kGsd;
  TORCH_CHECK_VALUE(false, "verify_tree: mode must be one of mss, mss_pointmass, mss_noreplace, sample_match, gsd; ",
                    "got ", mode);
  return -1;
}

inline bool mode_needs_draft(int32_t mode) { return mode == kMss || mode == kMssNoreplace || mode == kGsd; }

// Scratch rows [V] the mode's walk needs per sequence.
inline int64_t mode_buffers(int32_t mode) {
  if (mode == kMss) return 2;
  if (mode == kMssNoreplace) return 3;
  if (mode == kMssPointmass) return 1;
  return 0;
}

// (accept_idx [B, T] filled with -1, accept_len [B], bonus [B]) with the options of `like` (int32).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> outputs(const at::Tensor& like, int64_t B, int64_t T) {
  return {at::full({B, T}, -1, like.options()), at::empty({B}, like.options()), at::empty({B}, like.options())};
}

// The tree ops' common arguments: tokens, parents [B, T] int32, num_nodes [B] int32 and the
// rows [B, T, V >= 1] (their dtype is the caller's check).
inline void check_tree_args(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& num_nodes,
                            const at::Tensor& rows) {
  SPECOPS_CHECK_DTYPE(tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(tokens, 2);
  SPECOPS_CHECK_DIM(parents, 2);
  SPECOPS_CHECK_DIM(num_nodes, 1);
  SPECOPS_CHECK_DIM(rows, 3);
  TORCH_CHECK_VALUE(parents.sizes() == tokens.sizes(), "parents must have the shape of tokens");
  TORCH_CHECK_VALUE(num_nodes.size(0) == tokens.size(0), "num_nodes must have shape [B]");
  TORCH_CHECK_VALUE(rows.size(0) == tokens.size(0) && rows.size(1) == tokens.size(1),
                    "probability rows must have shape [B, T, V]");
  TORCH_CHECK_VALUE(rows.size(2) >= 1, "V must be >= 1");
}

// The compiled kernels index tokens with int32.
inline void check_vocab(const char* op, int64_t V) {
  TORCH_CHECK_VALUE(V <= 2147483647, op, ": V must be <= 2^31 - 1 (int32 token indices), got ", V);
}

// The draft rows of a verify_tree* call: required by `mode`'s walk, and when given shaped like the
// target's. Returns whether they are given.
inline bool check_draft(const char* op, int32_t mode, c10::string_view mode_name,
                        const c10::optional<at::Tensor>& draft, const char* draft_name, const at::Tensor& target,
                        const char* target_name) {
  const bool given = draft.has_value() && draft->defined();
  TORCH_CHECK_VALUE(given || !mode_needs_draft(mode), op, ": mode ", mode_name, " needs ", draft_name);
  TORCH_CHECK_VALUE(!given || draft->sizes() == target.sizes(), draft_name, " must have the shape of ", target_name);
  return given;
}

// verify_tree: the tree arguments, fp32 target_probs / draft_probs and uniforms [B, T, 2] fp32.
// Returns whether draft_probs is given.
inline bool check_tree_probs_args(int32_t mode, c10::string_view mode_name, const at::Tensor& tokens,
                                  const at::Tensor& parents, const at::Tensor& num_nodes,
                                  const at::Tensor& target_probs, const at::Tensor& uniforms,
                                  const c10::optional<at::Tensor>& draft_probs) {
  check_tree_args(tokens, parents, num_nodes, target_probs);
  SPECOPS_CHECK_DTYPE(target_probs, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  TORCH_CHECK_VALUE(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
                    "uniforms must have shape [B, T, 2]");
  if (draft_probs.has_value() && draft_probs->defined()) {
    SPECOPS_CHECK_DTYPE(*draft_probs, at::kFloat);
  }
  return check_draft("verify_tree", mode, mode_name, draft_probs, "draft_probs", target_probs, "target_probs");
}

// The six warping parameters of a logits launch, [N] each: temperature, top_k, top_p, then the
// second row kind's (fp32, int32, fp32).
inline void check_params(const char* op, const char* const names[6], const at::Tensor* const params[6], int64_t N) {
  for (int i = 0; i < 6; ++i) {
    const at::Tensor& t = *params[i];
    const at::ScalarType dtype = i % 3 == 1 ? at::kInt : at::kFloat;
    TORCH_CHECK_VALUE(t.scalar_type() == dtype, op, ": ", names[i], " must have dtype ", dtype, ", got ",
                      t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == N, op, ": ", names[i], " must have shape [B * T] = [", N,
                      "], got ", t.sizes());
  }
}

// The six warping parameters, contiguous.
inline std::array<at::Tensor, 6> contiguous_params(const at::Tensor* const params[6]) {
  std::array<at::Tensor, 6> out;
  for (int i = 0; i < 6; ++i) out[i] = params[i]->contiguous();
  return out;
}

// verify_tree_logits: the tree arguments, uniforms [B, T, 2] fp32, the six warping parameters
// [B * T] (the target's, then the draft's) and draft_logits shaped like target_logits. Returns
// whether draft_logits is given.
inline bool check_tree_logits_args(int32_t mode, c10::string_view mode_name, const at::Tensor& tokens,
                                   const at::Tensor& parents, const at::Tensor& num_nodes,
                                   const at::Tensor& target_logits, const at::Tensor& uniforms,
                                   const at::Tensor* const params[6], const c10::optional<at::Tensor>& draft_logits) {
  constexpr const char* op = "verify_tree_logits";
  check_tree_args(tokens, parents, num_nodes, target_logits);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  check_vocab(op, target_logits.size(2));
  TORCH_CHECK_VALUE(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
                    "uniforms must have shape [B, T, 2]");
  static const char* const names[6] = {"temperature",       "top_k",       "top_p",
                                       "draft_temperature", "draft_top_k", "draft_top_p"};
  check_params(op, names, params, B * T);
  return check_draft(op, mode, mode_name, draft_logits, "draft_logits", target_logits, "target_logits");
}

// verify_joint / verify_joint_logits: draft_tokens [B, g] int32, the target's rows [B, g + 1, V >= 1]
// (named `target_name`; their dtype is the caller's check), draft_joint_logprobs [B, g] fp32,
// log_tau and uniforms [B] fp32, and with `num_nodes` (verify_joint_logits) num_nodes [B] int32.
// `prefix` starts each shape message. Returns (B, g, V).
inline std::tuple<int64_t, int64_t, int64_t> check_joint_args(const char* prefix, const at::Tensor& draft_tokens,
                                                              const at::Tensor& target, const char* target_name,
                                                              const at::Tensor& draft_joint_logprobs,
                                                              const at::Tensor& log_tau, const at::Tensor& uniforms,
                                                              const at::Tensor* nodes = nullptr) {
  SPECOPS_CHECK_DTYPE(draft_tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(draft_joint_logprobs, at::kFloat);
  SPECOPS_CHECK_DTYPE(log_tau, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  if (nodes) {
    const at::Tensor& num_nodes = *nodes;
    SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  }
  SPECOPS_CHECK_DIM(draft_tokens, 2);
  TORCH_CHECK_VALUE(target.dim() == 3, target_name, " must have rank 3, got ", target.dim());
  const int64_t B = draft_tokens.size(0), g = draft_tokens.size(1), V = target.size(2);
  TORCH_CHECK_VALUE(target.size(0) == B && target.size(1) == g + 1 && V >= 1, prefix, target_name,
                    " must have shape [B, g + 1, V]");
  TORCH_CHECK_VALUE(draft_joint_logprobs.sizes() == draft_tokens.sizes(), prefix,
                    "draft_joint_logprobs must have shape [B, g]");
  auto batch = [B](const at::Tensor& t) { return t.dim() == 1 && t.size(0) == B; };
  TORCH_CHECK_VALUE(batch(log_tau) && batch(uniforms) && (!nodes || batch(*nodes)), prefix,
                    nodes ? "log_tau, uniforms and num_nodes" : "log_tau and uniforms", " must have shape [B]");
  return {B, g, V};
}

// verify_joint_logits: check_joint_args with num_nodes, V within int32 and the six warping parameters
// [B * (g + 1)] (the test's, then the bonus's). Returns (B, g, V).
inline std::tuple<int64_t, int64_t, int64_t> check_joint_logits_args(
    const at::Tensor& draft_tokens, const at::Tensor& target_logits, const at::Tensor& draft_joint_logprobs,
    const at::Tensor& log_tau, const at::Tensor& uniforms, const at::Tensor* const params[6],
    const at::Tensor& num_nodes) {
  constexpr const char* op = "verify_joint_logits";
  const auto shape = check_joint_args("verify_joint_logits: ", draft_tokens, target_logits, "target_logits",
                                      draft_joint_logprobs, log_tau, uniforms, &num_nodes);
  const auto [B, g, V] = shape;
  check_vocab(op, V);
  static const char* const names[6] = {"temperature",       "top_k",       "top_p",
                                       "bonus_temperature", "bonus_top_k", "bonus_top_p"};
  check_params(op, names, params, B * (g + 1));
  return shape;
}

}  // namespace verify
}  // namespace specops
