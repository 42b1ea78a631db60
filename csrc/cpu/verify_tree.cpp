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

void verify_tree_cpu(const TreeCall& c) {
  const int64_t T = c.T, V = c.V;
  const TreeIo io(c);
  const float* pp = c.target.data_ptr<float>();
  const float* qp = c.draft.defined() ? c.draft.data_ptr<float>() : nullptr;
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S), inv_scale = exp2i(-S);
  const int32_t mode = c.mode;
  const int64_t nbuf = mode_buffers(mode);
  // Sequences are independent; a walk is sequential and its V-wide passes are what costs.
  at::parallel_for(0, c.B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    for (int64_t b = lo; b < hi; ++b) {
      CpuTreeEngine<DenseRows> e{{pp + b * T * V, qp ? qp + b * T * V : nullptr, V}, io.uniforms + b * T * 2,
                                 buf.data(), chunks.data(), scratch.data(), V, scale, inv_scale};
      run_walk(e, mode, io.tokens + b * T, io.parents + b * T, valid_nodes(io.num_nodes[b], static_cast<int32_t>(T)),
               static_cast<int32_t>(T), io.accept_idx + b * T, io.accept_len + b, io.bonus + b);
    }
  });
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  namespace sv = specops::verify;
  m.impl("verify_tree", &sv::tree_entry<specops::CpuDevice, sv::cpu::verify_tree_cpu>);
}
