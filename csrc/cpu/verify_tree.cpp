// verify_tree on the CPU: sequences in parallel (at::parallel_for over B) running the shared walks
// of csrc/verify_common.h; the engine below supplies V-wide loops over one row at a time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "verify_cpu.h"

namespace specops {
namespace verify {
namespace cpu {

// The probability rows of one sequence, as they are.
struct DenseRows {
  const float* P;  // [T, V] target rows
  const float* Q;  // [T, V] draft rows, or nullptr
  int64_t V;
  const float* row(Vec v) const { return (v.kind == Vec::kTarget ? P : Q) + v.node * V; }
  float at(Vec v, int32_t tok) const { return row(v)[tok]; }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cpu(
    const at::Tensor& tokens,                    // [B, T] int32
    const at::Tensor& parents,                   // [B, T] int32
    const at::Tensor& target_probs,              // [B, T, V] fp32
    const at::Tensor& uniforms,                  // [B, T, 2] fp32
    const c10::optional<at::Tensor>& draft_probs,  // [B, T, V] fp32 or None
    const at::Tensor& num_nodes,                 // [B] int32
    c10::string_view mode_name) {
  const int32_t mode = parse_mode(mode_name);
  const bool has_q = check_tree_probs_args(mode, mode_name, tokens, parents, num_nodes, target_probs, uniforms,
                                           draft_probs);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_probs.size(2);
  const at::Tensor q = has_q ? draft_probs->contiguous() : at::Tensor();
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto p = target_probs.contiguous();
  auto un = uniforms.contiguous();
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  const int32_t* tk = tok.data_ptr<int32_t>();
  const int32_t* pa = par.data_ptr<int32_t>();
  const int32_t* n = nn.data_ptr<int32_t>();
  const float* pp = p.data_ptr<float>();
  const float* qp = has_q ? q.data_ptr<float>() : nullptr;
  const float* up = un.data_ptr<float>();
  int32_t* ai = accept_idx.data_ptr<int32_t>();
  int32_t* al = accept_len.data_ptr<int32_t>();
  int32_t* bo = bonus.data_ptr<int32_t>();
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S), inv_scale = exp2i(-S);
  const int64_t nbuf = mode_buffers(mode);
  // Sequences are independent; a walk is sequential and its V-wide passes are what costs.
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    for (int64_t b = lo; b < hi; ++b) {
      CpuTreeEngine<DenseRows> e{{pp + b * T * V, qp ? qp + b * T * V : nullptr, V}, up + b * T * 2, buf.data(),
                                 chunks.data(), scratch.data(), V, scale, inv_scale};
      run_walk(e, mode, tk + b * T, pa + b * T, valid_nodes(n[b], static_cast<int32_t>(T)), static_cast<int32_t>(T),
               ai + b * T, al + b, bo + b);
    }
  });
  return {accept_idx, accept_len, bonus};
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("verify_tree", &specops::verify::cpu::verify_tree_cpu); }
