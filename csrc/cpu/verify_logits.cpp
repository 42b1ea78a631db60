// verify_tree_logits and verify_joint_logits on the CPU: verify_tree's walks and R6's (csrc/verify_common.h,
// the engine of verify_cpu.h) over rows that are warped from logits on demand, never an [N, V] tensor.
//
// Design (docs/verify_logits.md). Per sequence, a row's warping statistics (logit max, top-k /
// top-p threshold, normaliser; argmax for greedy rows: warp::RowStats) are computed by warp_probs'
// own row passes (sampling_rows.h) the first time the walk touches the row, and kept ([2, T] per
// sequence). A single probability p(x) is then evaluated from the logit and the statistics by the
// same lane arithmetic (prob_at), so it equals warp_probs' entry bit for bit. Full rows (the
// residual's inputs, a bonus draw, R4's draw) are warped into one of two [V] slots (target, draft)
// only when the walk asks for one; row_stats leaves exp(z) in the slot, so a row materialised right
// after its statistics costs one more pass. Rows the walk never reaches are never read.
// Extra memory per thread: the slots, the walk's scratch rows (<= 3) and warp_probs' row scratch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <memory>
#include <vector>

#include "sampling_rows.h"
#include "verify_cpu.h"

namespace specops {
namespace verify {
namespace cpu {
namespace {

// A [T, V] block of logits of one of the dtypes warp_probs takes, type-erased (the target's and
// the draft's dtypes may differ).
struct LogitBlock {
  const void* base;
  at::ScalarType dtype;
  int64_t V;

  template <class F>
  auto with_row(int32_t node, F&& f) const {
    const int64_t off = static_cast<int64_t>(node) * V;
    switch (dtype) {
      case at::kBFloat16: return f(static_cast<const at::BFloat16*>(base) + off);
      case at::kHalf: return f(static_cast<const at::Half*>(base) + off);
      default: return f(static_cast<const float*>(base) + off);
    }
  }
};

// The target (kind 0) and draft (kind 1) rows of one sequence, warped from logits on demand. With a
// bitmask, a row is warped from its masked copy (target row u: mask row u; draft row c: mask row
// parents[c], the state node c was drawn at), built in a [V] buffer when the walk first needs the
// whole row; a single probability of a disallowed token is 0, of an allowed one prob_at's.
struct LogitRows {
  LogitBlock logits[2];
  const float* temperature[2];  // [T]
  const int32_t* top_k[2];      // [T]
  const float* top_p[2];        // [T]
  int64_t V;
  int32_t T;
  warp::RowStats* stats;        // [2, T]
  uint8_t* known;               // [2, T]: stats computed
  float* slot;                  // [2, V]
  warp::Scratch* scratch;
  const int32_t* mask;          // [T, W] or nullptr
  const int32_t* parents;       // [T]
  float* masked;                // [2, V] (with a mask)
  int32_t slot_node[2] = {-1, -1};  // node whose warped row is in slot[kind]
  int32_t exp_node[2] = {-1, -1};   // node whose exp(z) is in slot[kind] and z in the scratch
  int32_t masked_node[2] = {-1, -1};  // node whose masked logits are in masked[kind]

  // The bitmask words of row (kind, node).
  const int32_t* words(int32_t kind, int32_t node) const {
    int32_t r = node;
    if (kind == 1) r = parents[node] >= 0 && parents[node] < node ? parents[node] : 0;
    return mask + static_cast<int64_t>(r) * ((V + 31) / 32);
  }

  // f(row pointer) on row (kind, node): the logits, or with a mask their masked fp32 copy.
  template <class F>
  auto with_row(int32_t kind, int32_t node, F&& f) {
    if (!mask) return logits[kind].with_row(node, f);
    float* m = masked + kind * V;
    if (masked_node[kind] != node) {
      logits[kind].with_row(node, [&](auto x) { masked_row(x, words(kind, node), V, m); });
      masked_node[kind] = node;
    }
    return f(static_cast<const float*>(m));
  }

  const warp::RowStats& row_stats(Vec v) {
    const int32_t kind = v.kind, node = v.node, i = kind * T + node;
    if (!known[i]) {
      float* e = slot + kind * V;
      stats[i] = with_row(kind, node, [&](auto x) {
        return warp::row_stats(x, V, temperature[kind][node], top_k[kind][node], top_p[kind][node], e, *scratch);
      });
      known[i] = 1;
      slot_node[kind] = -1;
      exp_node[kind] = node;
      exp_node[1 - kind] = -1;  // the scratch's z is this row's now
    }
    return stats[i];
  }

  const float* row(Vec v) {
    const int32_t kind = v.kind;
    float* out = slot + kind * V;
    if (slot_node[kind] != v.node) {
      const warp::RowStats& st = row_stats(v);
      if (exp_node[kind] == v.node) {
        warp::finish_probs(st, out, V, *scratch);
      } else {
        with_row(kind, v.node, [&](auto x) { warp::row_probs(x, V, st, out, *scratch); });
        exp_node[1 - kind] = -1;
      }
      exp_node[kind] = -1;
      slot_node[kind] = v.node;
    }
    return out;
  }

  float at(Vec v, int32_t tok) {
    if (slot_node[v.kind] == v.node) return slot[v.kind * V + tok];
    const warp::RowStats& st = row_stats(v);
    if (mask && !token_allowed(words(v.kind, v.node), tok)) return 0.0f;
    return logits[v.kind].with_row(v.node, [&](auto x) { return warp::prob_at(x, tok, st); });
  }
};

// Rows [r0, r0 + T) of a contiguous [N, V] logits tensor; an undefined one (no draft) gives no rows,
// typed `absent`.
LogitBlock logit_block(const at::Tensor& t, int64_t r0, int64_t V, at::ScalarType absent) {
  if (!t.defined()) return {nullptr, absent, V};
  return {static_cast<const char*>(t.data_ptr()) + r0 * V * static_cast<int64_t>(t.element_size()), t.scalar_type(),
          V};
}

// What LogitRows keeps per task (statistics, the [2, V] slots, warp_probs' row scratch) for
// sequences of T rows; rows() starts a sequence.
struct LogitRowsState {
  int64_t V;
  int32_t T;
  std::vector<float> slot;
  std::vector<warp::RowStats> stats;
  std::vector<uint8_t> known;
  std::unique_ptr<warp::Scratch, warp::ScratchDeleter> scratch;

  LogitRowsState(int64_t V, int64_t T)
      : V(V), T(static_cast<int32_t>(T)), slot(2 * V), stats(2 * T), known(2 * T), scratch(warp::make_scratch(V)) {}

  // The rows of the sequence whose first row is r0: its target and draft logits, pc the six
  // contiguous warping parameters ([N] each), and with a bitmask its words [T, W], the sequence's
  // parents [T] and a [2, V] buffer for masked rows.
  LogitRows rows(const LogitBlock& target, const LogitBlock& draft, const std::array<at::Tensor, 6>& pc, int64_t r0,
                 const int32_t* mask = nullptr, const int32_t* parents = nullptr, float* masked = nullptr) {
    std::fill(known.begin(), known.end(), 0);
    return LogitRows{{target, draft},
                     {pc[0].data_ptr<float>() + r0, pc[3].data_ptr<float>() + r0},
                     {pc[1].data_ptr<int32_t>() + r0, pc[4].data_ptr<int32_t>() + r0},
                     {pc[2].data_ptr<float>() + r0, pc[5].data_ptr<float>() + r0},
                     V,
                     T,
                     stats.data(),
                     known.data(),
                     slot.data(),
                     scratch.get(),
                     mask,
                     parents,
                     masked};
  }
};

}  // namespace

void verify_tree_logits_cpu(const TreeCall& c) {
  const int64_t T = c.T, V = c.V, W = (V + 31) / 32;
  const at::Tensor &x = c.target, &y = c.draft;
  const bool masked = c.words.defined();
  const int32_t* mw = masked ? c.words.data_ptr<int32_t>() : nullptr;
  const TreeIo io(c);
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S), inv_scale = exp2i(-S);
  const int64_t nbuf = mode_buffers(c.mode);
  at::parallel_for(0, c.B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V), masked_rows(masked ? 2 * V : 0);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    LogitRowsState state(V, T);
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t r0 = b * T;
      LogitRows rows = state.rows(logit_block(x, r0, V, x.scalar_type()), logit_block(y, r0, V, x.scalar_type()),
                                  c.params, r0, masked ? mw + r0 * W : nullptr, io.parents + r0, masked_rows.data());
      CpuTreeEngine<LogitRows> e{rows, io.uniforms + r0 * 2, buf.data(), chunks.data(), scratch.data(), V, scale,
                                 inv_scale};
      run_walk(e, c.mode, io.tokens + r0, io.parents + r0, valid_nodes(io.num_nodes[b], static_cast<int32_t>(T)),
               static_cast<int32_t>(T), io.accept_idx + r0, io.accept_len + b, io.bonus + b);
    }
  });
}

// R6 from logits (verify_joint_logits): the rows' two row kinds are the same logits under two warps,
// the test's (kind 0: one probability per row, from its statistics) and the bonus's (kind 1: the
// one row eta, warped whole for the draw).
void verify_joint_logits_cpu(const JointCall& c) {
  const int64_t g = c.g, T = g + 1, V = c.V;
  const at::Tensor& x = c.target;
  const int32_t* n = c.num_nodes.data_ptr<int32_t>();
  const JointIo io(c);
  const float scale = exp2i(fix_shift(V));
  at::parallel_for(0, c.B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> chunks(num_chunks(V));
    LogitRowsState state(V, T);
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t r0 = b * T;
      const LogitBlock block = logit_block(x, r0, V, x.scalar_type());
      LogitRows rows = state.rows(block, block, c.params, r0);
      const int32_t eta = joint_eta(io.tokens + b * g, valid_nodes(n[b], static_cast<int32_t>(T)), V, io.log_tau[b],
                                    io.joint_q + b * g,
                                    [&](int32_t row, int32_t token) { return det_log(rows.at(Vec::target(row), token)); });
      const float* row = rows.row(Vec::draft(eta));  // kind 1: the bonus warp
      io.accept(b, eta, row_sample(row, V, scale, row_sum_fix(row, V, scale, chunks.data()), io.uniforms[b],
                                   chunks.data(), false));
    }
  });
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  namespace sv = specops::verify;
  m.impl("verify_tree_logits", &sv::tree_logits_entry<specops::CpuDevice, false, sv::cpu::verify_tree_logits_cpu>);
  m.impl("verify_joint_logits", &sv::joint_logits_entry<specops::CpuDevice, false, sv::cpu::verify_joint_logits_cpu>);
}
