// Host-side arguments of the verification launchers (verify_greedy, verify_tree, verify_tree_logits,
// verify_joint, verify_joint_logits) shared by csrc/cpu/verify*.cpp and csrc/cuda/verify.cu: the
// mode names, the checks (the device ones through the backend's Device, csrc/registration.h), and
// the registered entry points, which hand a backend's runner one call struct (TreeCall, JointCall:
// the tensors contiguous, the outputs allocated) instead of up to 14 arguments. Logits dtypes: fp32,
// bf16 and fp16, and fp64 where the backend's kernels take it (Fp64).
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
#include "token_bitmask_args.h"
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

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;  // accept_idx, accept_len, bonus

// One tree verification (verify_greedy, verify_tree, verify_tree_logits): its tensors contiguous and
// its outputs, which the runner fills (it runs only when B > 0).
struct TreeCall {
  int32_t mode;                           // parse_mode's (verify_greedy: -1)
  int64_t B, T, V;
  at::Tensor tokens, parents, num_nodes;  // [B, T], [B, T], [B] int32
  at::Tensor target, draft;               // [B, T, V] probabilities or logits; draft undefined when absent
  at::Tensor uniforms;                    // [B, T, 2] fp32 (verify_tree*)
  std::array<at::Tensor, 6> params;       // verify_tree_logits, [B * T] each: temperature, top_k, top_p, draft_*
  at::Tensor words;                       // [B, T, ceil(V / 32)] int32 bitmask words, or undefined
  at::Tensor accept_idx, accept_len, bonus;  // [B, T] (-1 where nothing is accepted), [B], [B] int32
};

// One joint verification (R6: verify_joint, verify_joint_logits), likewise.
struct JointCall {
  int64_t B, g, V;
  at::Tensor tokens, target;              // draft_tokens [B, g] int32, the target's rows [B, g + 1, V]
  at::Tensor joint_q, log_tau, uniforms;  // draft_joint_logprobs [B, g], log_tau [B], uniforms [B] fp32
  at::Tensor num_nodes;                   // verify_joint_logits: [B] int32
  std::array<at::Tensor, 6> params;       // verify_joint_logits, [B * (g + 1)] each: the test's, then bonus_*
  at::Tensor accept_idx, accept_len, bonus;  // [B, g + 1], [B], [B] int32
};

using TreeRunFn = void (*)(const TreeCall&);
using JointRunFn = void (*)(const JointCall&);

// The logits dtypes a backend's kernels take.
template <bool Fp64>
void check_logits(const char* op, const char* name, const at::Tensor& x) {
  const auto dt = x.scalar_type();
  TORCH_CHECK_VALUE(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf || (Fp64 && dt == at::kDouble), op,
                    ": ", name, " must be ", Fp64 ? "fp32, bf16, fp16 or fp64" : "fp32, bf16 or fp16", ", got ", dt);
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

inline void check_uniforms(const at::Tensor& uniforms, int64_t B, int64_t T) {
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  TORCH_CHECK_VALUE(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
                    "uniforms must have shape [B, T, 2]");
}

// The draft rows of a verify_tree* call: required by `mode`'s walk, and when given shaped like the
// target's.
inline void check_draft(const char* op, int32_t mode, c10::string_view mode_name,
                        const c10::optional<at::Tensor>& draft, const char* draft_name, const at::Tensor& target,
                        const char* target_name) {
  const bool has = draft.has_value() && draft->defined();
  TORCH_CHECK_VALUE(has || !mode_needs_draft(mode), op, ": mode ", mode_name, " needs ", draft_name);
  TORCH_CHECK_VALUE(!has || draft->sizes() == target.sizes(), draft_name, " must have the shape of ", target_name);
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

inline std::array<at::Tensor, 6> contiguous_params(const at::Tensor* const params[6]) {
  std::array<at::Tensor, 6> out;
  if (params)
    for (int i = 0; i < 6; ++i) out[i] = params[i]->contiguous();
  return out;
}

// (accept_idx [B, T] filled with -1, accept_len [B], bonus [B]) with the options of `like` (int32).
inline Result outputs(const at::Tensor& like, int64_t B, int64_t T) {
  return {at::full({B, T}, -1, like.options()), at::empty({B}, like.options()), at::empty({B}, like.options())};
}

// A checked tree call: its tensors contiguous, its outputs, its runner when it has sequences.
template <class Dev, TreeRunFn Run>
Result run_tree(int32_t mode, const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& num_nodes,
                const at::Tensor& target, const at::Tensor* draft, const at::Tensor& uniforms,
                const at::Tensor* const params[6], const at::Tensor& words) {
  const typename Dev::Guard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1);
  TreeCall c{mode, B, T, target.size(2), tokens.contiguous(), parents.contiguous(), num_nodes.contiguous(),
             target.contiguous(), draft && draft->defined() ? draft->contiguous() : at::Tensor(),
             uniforms.defined() ? uniforms.contiguous() : at::Tensor(), contiguous_params(params), words};
  std::tie(c.accept_idx, c.accept_len, c.bonus) = outputs(tokens, B, T);
  if (B > 0) Run(c);
  return {c.accept_idx, c.accept_len, c.bonus};
}

template <class Dev, TreeRunFn Run>
Result greedy_entry(const at::Tensor& tokens,                   // [B, T] int32
                    const at::Tensor& parents,                  // [B, T] int32
                    const at::Tensor& target_logits,            // [B, T, V]
                    const at::Tensor& num_nodes,                // [B] int32
                    const c10::optional<at::Tensor>& bitmask) {  // [B, T, ceil(V / 32)] int32 or None
  check_tree_args(tokens, parents, num_nodes, target_logits);
  const at::Tensor words = node_bitmask_words(bitmask, "verify_greedy", tokens.size(0), tokens.size(1),
                                              target_logits.size(2));
  check_device<Dev>("verify_greedy", {{"tokens", &tokens}, {"parents", &parents}, {"target_logits", &target_logits},
                                      {"num_nodes", &num_nodes}, {"bitmask", &words}});
  return run_tree<Dev, Run>(-1, tokens, parents, num_nodes, target_logits, nullptr, at::Tensor(), nullptr, words);
}

template <class Dev, TreeRunFn Run>
Result tree_entry(const at::Tensor& tokens,                       // [B, T] int32
                  const at::Tensor& parents,                      // [B, T] int32
                  const at::Tensor& target_probs,                 // [B, T, V] fp32
                  const at::Tensor& uniforms,                     // [B, T, 2] fp32
                  const c10::optional<at::Tensor>& draft_probs,   // [B, T, V] fp32 or None
                  const at::Tensor& num_nodes,                    // [B] int32
                  c10::string_view mode_name) {
  const int32_t mode = parse_mode(mode_name);
  check_tree_args(tokens, parents, num_nodes, target_probs);
  SPECOPS_CHECK_DTYPE(target_probs, at::kFloat);
  check_uniforms(uniforms, tokens.size(0), tokens.size(1));
  if (draft_probs.has_value() && draft_probs->defined()) {
    SPECOPS_CHECK_DTYPE(*draft_probs, at::kFloat);
  }
  check_draft("verify_tree", mode, mode_name, draft_probs, "draft_probs", target_probs, "target_probs");
  check_device<Dev>("verify_tree", {{"tokens", &tokens}, {"parents", &parents}, {"target_probs", &target_probs},
                                    {"uniforms", &uniforms}, {"draft_probs", given(draft_probs)},
                                    {"num_nodes", &num_nodes}});
  return run_tree<Dev, Run>(mode, tokens, parents, num_nodes, target_probs, given(draft_probs), uniforms, nullptr,
                            at::Tensor());
}

template <class Dev, bool Fp64, TreeRunFn Run>
Result tree_logits_entry(const at::Tensor& tokens,                       // [B, T] int32
                         const at::Tensor& parents,                      // [B, T] int32
                         const at::Tensor& target_logits,                // [B, T, V]
                         const at::Tensor& uniforms,                     // [B, T, 2] fp32
                         const at::Tensor& temperature,                  // [B * T] fp32
                         const at::Tensor& top_k,                        // [B * T] int32
                         const at::Tensor& top_p,                        // [B * T] fp32
                         const c10::optional<at::Tensor>& draft_logits,  // [B, T, V] or None
                         const at::Tensor& draft_temperature,            // [B * T] fp32
                         const at::Tensor& draft_top_k,                  // [B * T] int32
                         const at::Tensor& draft_top_p,                  // [B * T] fp32
                         const at::Tensor& num_nodes,                    // [B] int32
                         c10::string_view mode_name,
                         const c10::optional<at::Tensor>& bitmask) {     // [B, T, ceil(V / 32)] int32 or None
  constexpr const char* op = "verify_tree_logits";
  const int32_t mode = parse_mode(mode_name);
  check_tree_args(tokens, parents, num_nodes, target_logits);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2);
  check_vocab(op, V);
  check_uniforms(uniforms, B, T);
  static const char* const names[6] = {"temperature",       "top_k",       "top_p",
                                       "draft_temperature", "draft_top_k", "draft_top_p"};
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &draft_temperature, &draft_top_k, &draft_top_p};
  check_params(op, names, params, B * T);
  check_draft(op, mode, mode_name, draft_logits, "draft_logits", target_logits, "target_logits");
  check_logits<Fp64>(op, "target_logits", target_logits);
  if (draft_logits.has_value() && draft_logits->defined()) check_logits<Fp64>(op, "draft_logits", *draft_logits);
  const at::Tensor words = node_bitmask_words(bitmask, op, B, T, V);
  check_device<Dev>(op, {{"tokens", &tokens}, {"parents", &parents}, {"target_logits", &target_logits},
                         {"uniforms", &uniforms}, {"temperature", &temperature}, {"top_k", &top_k}, {"top_p", &top_p},
                         {"draft_logits", given(draft_logits)}, {"draft_temperature", &draft_temperature},
                         {"draft_top_k", &draft_top_k}, {"draft_top_p", &draft_top_p}, {"num_nodes", &num_nodes},
                         {"bitmask", &words}});
  return run_tree<Dev, Run>(mode, tokens, parents, num_nodes, target_logits, given(draft_logits), uniforms, params,
                            words);
}

// verify_joint / verify_joint_logits: draft_tokens [B, g] int32, the target's rows [B, g + 1, V >= 1]
// (named `target_name`; their dtype is the caller's check), draft_joint_logprobs [B, g] fp32,
// log_tau and uniforms [B] fp32, and with `num_nodes` (verify_joint_logits) num_nodes [B] int32.
// `prefix` starts each shape message.
inline void check_joint_args(const char* prefix, const at::Tensor& draft_tokens, const at::Tensor& target,
                             const char* target_name, const at::Tensor& draft_joint_logprobs,
                             const at::Tensor& log_tau, const at::Tensor& uniforms, const at::Tensor* nodes = nullptr) {
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
  const int64_t B = draft_tokens.size(0), g = draft_tokens.size(1);
  TORCH_CHECK_VALUE(target.size(0) == B && target.size(1) == g + 1 && target.size(2) >= 1, prefix, target_name,
                    " must have shape [B, g + 1, V]");
  TORCH_CHECK_VALUE(draft_joint_logprobs.sizes() == draft_tokens.sizes(), prefix,
                    "draft_joint_logprobs must have shape [B, g]");
  auto batch = [B](const at::Tensor& t) { return t.dim() == 1 && t.size(0) == B; };
  TORCH_CHECK_VALUE(batch(log_tau) && batch(uniforms) && (!nodes || batch(*nodes)), prefix,
                    nodes ? "log_tau, uniforms and num_nodes" : "log_tau and uniforms", " must have shape [B]");
}

// A checked joint call: its tensors contiguous, its outputs, its runner when it has sequences.
template <class Dev, JointRunFn Run>
Result run_joint(const at::Tensor& draft_tokens, const at::Tensor& target, const at::Tensor& draft_joint_logprobs,
                 const at::Tensor& log_tau, const at::Tensor& uniforms, const at::Tensor& num_nodes,
                 const at::Tensor* const params[6]) {
  const typename Dev::Guard guard(draft_tokens.device());
  const int64_t B = draft_tokens.size(0), g = draft_tokens.size(1);
  JointCall c{B, g, target.size(2), draft_tokens.contiguous(), target.contiguous(), draft_joint_logprobs.contiguous(),
              log_tau.contiguous(), uniforms.contiguous(),
              num_nodes.defined() ? num_nodes.contiguous() : at::Tensor(), contiguous_params(params)};
  std::tie(c.accept_idx, c.accept_len, c.bonus) = outputs(draft_tokens, B, g + 1);
  if (B > 0) Run(c);
  return {c.accept_idx, c.accept_len, c.bonus};
}

template <class Dev, JointRunFn Run>
Result joint_entry(const at::Tensor& draft_tokens,          // [B, g] int32
                   const at::Tensor& target_logprobs,       // [B, g + 1, V] fp32
                   const at::Tensor& draft_joint_logprobs,  // [B, g] fp32
                   const at::Tensor& log_tau,               // [B] fp32
                   const at::Tensor& uniforms)              // [B] fp32
{
  SPECOPS_CHECK_DTYPE(target_logprobs, at::kFloat);
  check_joint_args("", draft_tokens, target_logprobs, "target_logprobs", draft_joint_logprobs, log_tau, uniforms);
  check_device<Dev>("verify_joint", {{"draft_tokens", &draft_tokens}, {"target_logprobs", &target_logprobs},
                                     {"draft_joint_logprobs", &draft_joint_logprobs}, {"log_tau", &log_tau},
                                     {"uniforms", &uniforms}});
  return run_joint<Dev, Run>(draft_tokens, target_logprobs, draft_joint_logprobs, log_tau, uniforms, at::Tensor(),
                             nullptr);
}

template <class Dev, bool Fp64, JointRunFn Run>
Result joint_logits_entry(const at::Tensor& draft_tokens,          // [B, g] int32
                          const at::Tensor& target_logits,         // [B, g + 1, V]
                          const at::Tensor& draft_joint_logprobs,  // [B, g] fp32
                          const at::Tensor& log_tau,               // [B] fp32
                          const at::Tensor& uniforms,              // [B] fp32
                          const at::Tensor& temperature,           // [B * (g + 1)] fp32
                          const at::Tensor& top_k,                 // [B * (g + 1)] int32
                          const at::Tensor& top_p,                 // [B * (g + 1)] fp32
                          const at::Tensor& bonus_temperature,     // [B * (g + 1)] fp32
                          const at::Tensor& bonus_top_k,           // [B * (g + 1)] int32
                          const at::Tensor& bonus_top_p,           // [B * (g + 1)] fp32
                          const at::Tensor& num_nodes) {           // [B] int32
  constexpr const char* op = "verify_joint_logits";
  check_joint_args("verify_joint_logits: ", draft_tokens, target_logits, "target_logits", draft_joint_logprobs,
                   log_tau, uniforms, &num_nodes);
  check_vocab(op, target_logits.size(2));
  static const char* const names[6] = {"temperature",       "top_k",       "top_p",
                                       "bonus_temperature", "bonus_top_k", "bonus_top_p"};
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &bonus_temperature, &bonus_top_k, &bonus_top_p};
  check_params(op, names, params, draft_tokens.size(0) * (draft_tokens.size(1) + 1));
  check_logits<Fp64>(op, "target_logits", target_logits);
  check_device<Dev>(op, {{"draft_tokens", &draft_tokens}, {"target_logits", &target_logits},
                         {"draft_joint_logprobs", &draft_joint_logprobs}, {"log_tau", &log_tau},
                         {"uniforms", &uniforms}, {"temperature", &temperature}, {"top_k", &top_k},
                         {"top_p", &top_p}, {"bonus_temperature", &bonus_temperature}, {"bonus_top_k", &bonus_top_k},
                         {"bonus_top_p", &bonus_top_p}, {"num_nodes", &num_nodes}});
  return run_joint<Dev, Run>(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms, num_nodes, params);
}

}  // namespace verify
}  // namespace specops
