// verify_greedy and verify_joint on the CPU (one task per sequence), and the schemas of the three
// verification ops. verify_tree lives in verify_tree.cpp; the decision logic in ../verify_common.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "../token_bitmask_args.h"
#include "verify_cpu.h"

namespace specops {
namespace verify {
namespace cpu {

// Rows in fp32 for row_argmax: fp32 as is, other dtypes widened (exactly) into tmp.
inline const float* as_float_row(const float* row, int64_t, std::vector<float>&) { return row; }
template <class T>
const float* as_float_row(const T* row, int64_t V, std::vector<float>& tmp) {
  tmp.resize(V);
  for (int64_t i = 0; i < V; ++i) tmp[i] = static_cast<float>(row[i]);
  return tmp.data();
}

// Stores straight to the outputs; the walks need nothing else from an engine for R1.
struct EmitOnly {
  void emit(int32_t* out, int32_t v) { *out = v; }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_greedy_cpu(const at::Tensor& tokens,         // [B, T] int32
                                                                 const at::Tensor& parents,        // [B, T] int32
                                                                 const at::Tensor& target_logits,  // [B, T, V]
                                                                 const at::Tensor& num_nodes,      // [B] int32
                                                                 const c10::optional<at::Tensor>& bitmask)  // [B, T, W]
{
  check_tree_args(tokens, parents, num_nodes, target_logits);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2), W = (V + 31) / 32;
  const at::Tensor words = node_bitmask_words(bitmask, "verify_greedy", B, T, V);
  const bool masked = words.defined();
  TORCH_CHECK_VALUE(!masked || words.device().is_cpu(), "verify_greedy: bitmask must be on cpu, got ", words.device());
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto logits = target_logits.contiguous();
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  const int32_t* tk = tok.data_ptr<int32_t>();
  const int32_t* pa = par.data_ptr<int32_t>();
  const int32_t* n = nn.data_ptr<int32_t>();
  int32_t* ai = accept_idx.data_ptr<int32_t>();
  int32_t* al = accept_len.data_ptr<int32_t>();
  int32_t* bo = bonus.data_ptr<int32_t>();
  const int32_t* wd = masked ? words.data_ptr<int32_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "verify_greedy_cpu", [&] {
    const scalar_t* lg = logits.data_ptr<scalar_t>();
    at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
      EmitOnly e;
      std::vector<float> row32;
      for (int64_t b = lo; b < hi; ++b) {
        const scalar_t* rows = lg + b * T * V;
        auto predict = [&](int32_t u) {
          const scalar_t* row = rows + u * V;
          return row_argmax(wd ? masked_row(row, wd + (b * T + u) * W, V, row32) : as_float_row(row, V, row32), V);
        };
        match_walk(e, predict, tk + b * T, pa + b * T, valid_nodes(n[b], static_cast<int32_t>(T)), ai + b * T, al + b,
                   bo + b);
      }
    });
  });
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_joint_cpu(
    const at::Tensor& draft_tokens,          // [B, g] int32
    const at::Tensor& target_logprobs,       // [B, g + 1, V] fp32
    const at::Tensor& draft_joint_logprobs,  // [B, g] fp32
    const at::Tensor& log_tau,               // [B] fp32
    const at::Tensor& uniforms)              // [B] fp32
{
  SPECOPS_CHECK_DTYPE(target_logprobs, at::kFloat);
  const auto [B, g, V] = check_joint_args("", draft_tokens, target_logprobs, "target_logprobs", draft_joint_logprobs,
                                          log_tau, uniforms);
  auto lp = target_logprobs.contiguous();
  const float* lpp = lp.data_ptr<float>();
  const JointIo io(draft_tokens, draft_joint_logprobs, log_tau, uniforms, B, g);
  const float scale = exp2i(fix_shift(V));
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const float* rows = lpp + b * (g + 1) * V;
      const int32_t eta = joint_eta(io.tokens + b * g, static_cast<int32_t>(g + 1), V, io.log_tau[b],
                                    io.joint_q + b * g, [&](int32_t row, int32_t x) { return rows[row * V + x]; });
      const float* row = rows + eta * V;
      std::vector<int64_t> chunks(num_chunks(V));
      io.accept(b, eta, row_sample(row, V, scale, row_sum_fix_exp(row, V, scale, chunks.data()), io.uniforms[b],
                                   chunks.data(), true));
    }
  });
  return io.result();
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("verify_greedy", &specops::verify::cpu::verify_greedy_cpu);
  m.impl("verify_joint", &specops::verify::cpu::verify_joint_cpu);
}
