// verify_greedy and verify_joint on the CPU (one task per sequence), and the schemas of the three
// verification ops. verify_tree lives in verify_tree.cpp; the decision logic in ../verify_common.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <vector>

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

void verify_greedy_cpu(const TreeCall& c) {
  const int64_t B = c.B, T = c.T, V = c.V, W = (V + 31) / 32;
  const at::Tensor& logits = c.target;
  const TreeIo io(c);
  const int32_t* wd = c.words.defined() ? c.words.data_ptr<int32_t>() : nullptr;
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
        match_walk(e, predict, io.tokens + b * T, io.parents + b * T,
                   valid_nodes(io.num_nodes[b], static_cast<int32_t>(T)), io.accept_idx + b * T, io.accept_len + b,
                   io.bonus + b);
      }
    });
  });
}

void verify_joint_cpu(const JointCall& c) {
  const int64_t g = c.g, V = c.V;
  const float* lpp = c.target.data_ptr<float>();
  const JointIo io(c);
  const float scale = exp2i(fix_shift(V));
  at::parallel_for(0, c.B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
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
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  namespace sv = specops::verify;
  m.impl("verify_greedy", &sv::greedy_entry<specops::CpuDevice, sv::cpu::verify_greedy_cpu>);
  m.impl("verify_joint", &sv::joint_entry<specops::CpuDevice, sv::cpu::verify_joint_cpu>);
}
