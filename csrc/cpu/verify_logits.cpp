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

#include "../token_bitmask_args.h"
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

void check_logits(const char* op, const char* name, const at::Tensor& x) {
  const auto dt = x.scalar_type();
  TORCH_CHECK_VALUE(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op, ": ", name,
                    " must be fp32, bf16 or fp16, got ", dt);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_logits_cpu(
    const at::Tensor& tokens,                       // [B, T] int32
    const at::Tensor& parents,                      // [B, T] int32
    const at::Tensor& target_logits,                // [B, T, V] fp32/bf16/fp16
    const at::Tensor& uniforms,                     // [B, T, 2] fp32
    const at::Tensor& temperature,                  // [B * T] fp32
    const at::Tensor& top_k,                        // [B * T] int32
    const at::Tensor& top_p,                        // [B * T] fp32
    const c10::optional<at::Tensor>& draft_logits,  // [B, T, V] fp32/bf16/fp16 or None
    const at::Tensor& draft_temperature,            // [B * T] fp32
    const at::Tensor& draft_top_k,                  // [B * T] int32
    const at::Tensor& draft_top_p,                  // [B * T] fp32
    const at::Tensor& num_nodes,                    // [B] int32
    c10::string_view mode_name,
    const c10::optional<at::Tensor>& bitmask) {     // [B, T, ceil(V / 32)] int32 or None
  const int32_t mode = parse_mode(mode_name);
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &draft_temperature, &draft_top_k, &draft_top_p};
  const bool has_q = check_tree_logits_args(mode, mode_name, tokens, parents, num_nodes, target_logits, uniforms,
                                            params, draft_logits);
  check_logits("verify_tree_logits", "target_logits", target_logits);
  if (has_q) check_logits("verify_tree_logits", "draft_logits", *draft_logits);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2);
  const at::Tensor y = has_q ? draft_logits->contiguous() : at::Tensor();
  const at::Tensor words = node_bitmask_words(bitmask, "verify_tree_logits", B, T, V);
  const bool masked = words.defined();
  TORCH_CHECK_VALUE(!masked || words.device().is_cpu(), "verify_tree_logits: bitmask must be on cpu, got ",
                    words.device());
  const int32_t* mw = masked ? words.data_ptr<int32_t>() : nullptr;
  const int64_t W = (V + 31) / 32;
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto x = target_logits.contiguous();
  auto un = uniforms.contiguous();
  const auto pc = contiguous_params(params);
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  const int32_t* tk = tok.data_ptr<int32_t>();
  const int32_t* pa = par.data_ptr<int32_t>();
  const int32_t* n = nn.data_ptr<int32_t>();
  const float* up = un.data_ptr<float>();
  int32_t* ai = accept_idx.data_ptr<int32_t>();
  int32_t* al = accept_len.data_ptr<int32_t>();
  int32_t* bo = bonus.data_ptr<int32_t>();
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S), inv_scale = exp2i(-S);
  const int64_t nbuf = mode_buffers(mode);
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V), masked_rows(masked ? 2 * V : 0);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    LogitRowsState state(V, T);
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t r0 = b * T;
      LogitRows rows = state.rows(logit_block(x, r0, V, x.scalar_type()), logit_block(y, r0, V, x.scalar_type()), pc,
                                  r0, masked ? mw + r0 * W : nullptr, pa + r0, masked_rows.data());
      CpuTreeEngine<LogitRows> e{rows, up + r0 * 2, buf.data(), chunks.data(), scratch.data(), V, scale, inv_scale};
      run_walk(e, mode, tk + r0, pa + r0, valid_nodes(n[b], static_cast<int32_t>(T)), static_cast<int32_t>(T),
               ai + r0, al + b, bo + b);
    }
  });
  return {accept_idx, accept_len, bonus};
}

// R6 from logits (verify_joint_logits): the rows' two row kinds are the same logits under two warps,
// the test's (kind 0: one probability per row, from its statistics) and the bonus's (kind 1: the
// one row eta, warped whole for the draw).
std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_joint_logits_cpu(
    const at::Tensor& draft_tokens,          // [B, g] int32
    const at::Tensor& target_logits,         // [B, g + 1, V] fp32/bf16/fp16
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
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &bonus_temperature, &bonus_top_k, &bonus_top_p};
  const auto [B, g, V] = check_joint_logits_args(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms,
                                                 params, num_nodes);
  check_logits("verify_joint_logits", "target_logits", target_logits);
  const int64_t T = g + 1;
  auto x = target_logits.contiguous();
  auto nn = num_nodes.contiguous();
  const auto pc = contiguous_params(params);
  const JointIo io(draft_tokens, draft_joint_logprobs, log_tau, uniforms, B, g);
  if (B == 0) return io.result();
  const int32_t* n = nn.data_ptr<int32_t>();
  const float scale = exp2i(fix_shift(V));
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> chunks(num_chunks(V));
    LogitRowsState state(V, T);
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t r0 = b * T;
      const LogitBlock block = logit_block(x, r0, V, x.scalar_type());
      LogitRows rows = state.rows(block, block, pc, r0);
      const int32_t eta = joint_eta(io.tokens + b * g, valid_nodes(n[b], static_cast<int32_t>(T)), V, io.log_tau[b],
                                    io.joint_q + b * g,
                                    [&](int32_t row, int32_t token) { return det_log(rows.at(Vec::target(row), token)); });
      const float* row = rows.row(Vec::draft(eta));  // kind 1: the bonus warp
      io.accept(b, eta, row_sample(row, V, scale, row_sum_fix(row, V, scale, chunks.data()), io.uniforms[b],
                                   chunks.data(), false));
    }
  });
  return io.result();
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("verify_tree_logits", &specops::verify::cpu::verify_tree_logits_cpu);
  m.impl("verify_joint_logits", &specops::verify::cpu::verify_joint_logits_cpu);
}
