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

#include <string>
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

// The six warping parameters of a launch, [N] each: temperature, top_k, top_p, then the second row kind's.
void check_params(const char* op, const char* const names[6], const at::Tensor* const params[6], int64_t N) {
  for (int i = 0; i < 6; ++i) {
    const at::Tensor& t = *params[i];
    const at::ScalarType dtype = i % 3 == 1 ? at::kInt : at::kFloat;
    TORCH_CHECK_VALUE(t.scalar_type() == dtype, op, ": ", names[i], " must have dtype ", dtype, ", got ",
                      t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == N, op, ": ", names[i], " must have shape [B * T] = [", N,
                      "], got ", t.sizes());
  }
}

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
  const int32_t mode = parse_mode(std::string(mode_name));
  check_tree_args(tokens, parents, num_nodes, target_logits);
  check_logits("verify_tree_logits", "target_logits", target_logits);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2);
  TORCH_CHECK_VALUE(V <= 2147483647, "verify_tree_logits: V must be <= 2^31 - 1 (int32 token indices), got ", V);
  TORCH_CHECK_VALUE(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
              "uniforms must have shape [B, T, 2]");
  const char* names[6] = {"temperature", "top_k", "top_p", "draft_temperature", "draft_top_k", "draft_top_p"};
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &draft_temperature, &draft_top_k, &draft_top_p};
  check_params("verify_tree_logits", names, params, B * T);
  const bool has_q = draft_logits.has_value() && draft_logits->defined();
  TORCH_CHECK_VALUE(has_q || !mode_needs_draft(mode), "verify_tree_logits: mode ", mode_name, " needs draft_logits");
  at::Tensor y;
  if (has_q) {
    check_logits("verify_tree_logits", "draft_logits", *draft_logits);
    TORCH_CHECK_VALUE(draft_logits->sizes() == target_logits.sizes(), "draft_logits must have the shape of target_logits");
    y = draft_logits->contiguous();
  }
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
  at::Tensor pc[6];
  for (int i = 0; i < 6; ++i) pc[i] = params[i]->contiguous();
  auto accept_idx = at::full({B, T}, -1, tokens.options());
  auto accept_len = at::empty({B}, tokens.options());
  auto bonus = at::empty({B}, tokens.options());
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
  const auto esize = [](const at::Tensor& t) { return static_cast<int64_t>(t.element_size()); };
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V), slot(2 * V), masked_rows(masked ? 2 * V : 0);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    std::vector<warp::RowStats> stats(2 * T);
    std::vector<uint8_t> known(2 * T);
    auto rows_scratch = warp::make_scratch(V);
    for (int64_t b = lo; b < hi; ++b) {
      std::fill(known.begin(), known.end(), 0);
      const int64_t r0 = b * T;
      LogitRows rows{{{static_cast<const char*>(x.data_ptr()) + r0 * V * esize(x), x.scalar_type(), V},
                      {has_q ? static_cast<const char*>(y.data_ptr()) + r0 * V * esize(y) : nullptr,
                       has_q ? y.scalar_type() : x.scalar_type(), V}},
                     {pc[0].data_ptr<float>() + r0, pc[3].data_ptr<float>() + r0},
                     {pc[1].data_ptr<int32_t>() + r0, pc[4].data_ptr<int32_t>() + r0},
                     {pc[2].data_ptr<float>() + r0, pc[5].data_ptr<float>() + r0},
                     V,
                     static_cast<int32_t>(T),
                     stats.data(),
                     known.data(),
                     slot.data(),
                     rows_scratch.get(),
                     masked ? mw + r0 * W : nullptr,
                     pa + r0,
                     masked_rows.data()};
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
  constexpr const char* op = "verify_joint_logits";
  SPECOPS_CHECK_DTYPE(draft_tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(draft_joint_logprobs, at::kFloat);
  SPECOPS_CHECK_DTYPE(log_tau, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(draft_tokens, 2);
  SPECOPS_CHECK_DIM(target_logits, 3);
  check_logits(op, "target_logits", target_logits);
  const int64_t B = draft_tokens.size(0), g = draft_tokens.size(1), T = g + 1, V = target_logits.size(2);
  TORCH_CHECK_VALUE(target_logits.size(0) == B && target_logits.size(1) == T && V >= 1,
                    "verify_joint_logits: target_logits must have shape [B, g + 1, V]");
  TORCH_CHECK_VALUE(V <= 2147483647, "verify_joint_logits: V must be <= 2^31 - 1 (int32 token indices), got ", V);
  TORCH_CHECK_VALUE(draft_joint_logprobs.sizes() == draft_tokens.sizes(),
                    "verify_joint_logits: draft_joint_logprobs must have shape [B, g]");
  TORCH_CHECK_VALUE(log_tau.dim() == 1 && log_tau.size(0) == B && uniforms.dim() == 1 && uniforms.size(0) == B &&
                        num_nodes.dim() == 1 && num_nodes.size(0) == B,
                    "verify_joint_logits: log_tau, uniforms and num_nodes must have shape [B]");
  const char* names[6] = {"temperature", "top_k", "top_p", "bonus_temperature", "bonus_top_k", "bonus_top_p"};
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &bonus_temperature, &bonus_top_k, &bonus_top_p};
  check_params(op, names, params, B * T);
  auto tok = draft_tokens.contiguous();
  auto x = target_logits.contiguous();
  auto lq = draft_joint_logprobs.contiguous();
  auto lt = log_tau.contiguous();
  auto un = uniforms.contiguous();
  auto nn = num_nodes.contiguous();
  at::Tensor pc[6];
  for (int i = 0; i < 6; ++i) pc[i] = params[i]->contiguous();
  auto accept_idx = at::full({B, T}, -1, draft_tokens.options());
  auto accept_len = at::empty({B}, draft_tokens.options());
  auto bonus = at::empty({B}, draft_tokens.options());
  if (B == 0) return {accept_idx, accept_len, bonus};
  const int32_t* tk = tok.data_ptr<int32_t>();
  const float* lqp = lq.data_ptr<float>();
  const float* ltp = lt.data_ptr<float>();
  const float* up = un.data_ptr<float>();
  const int32_t* n = nn.data_ptr<int32_t>();
  int32_t* ai = accept_idx.data_ptr<int32_t>();
  int32_t* al = accept_len.data_ptr<int32_t>();
  int32_t* bo = bonus.data_ptr<int32_t>();
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S);
  const int64_t esize = x.element_size();
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> slot(2 * V);
    std::vector<int64_t> chunks(num_chunks(V));
    std::vector<warp::RowStats> stats(2 * T);
    std::vector<uint8_t> known(2 * T);
    auto rows_scratch = warp::make_scratch(V);
    for (int64_t b = lo; b < hi; ++b) {
      std::fill(known.begin(), known.end(), 0);
      const int64_t r0 = b * T;
      const LogitBlock block{static_cast<const char*>(x.data_ptr()) + r0 * V * esize, x.scalar_type(), V};
      LogitRows rows{{block, block},
                     {pc[0].data_ptr<float>() + r0, pc[3].data_ptr<float>() + r0},
                     {pc[1].data_ptr<int32_t>() + r0, pc[4].data_ptr<int32_t>() + r0},
                     {pc[2].data_ptr<float>() + r0, pc[5].data_ptr<float>() + r0},
                     V,
                     static_cast<int32_t>(T),
                     stats.data(),
                     known.data(),
                     slot.data(),
                     rows_scratch.get(),
                     nullptr,
                     nullptr,
                     nullptr};
      const int32_t eta = joint_eta(tk + b * g, valid_nodes(n[b], static_cast<int32_t>(T)), V, ltp[b], lqp + b * g,
                                    [&](int32_t row, int32_t token) { return det_log(rows.at(Vec::target(row), token)); });
      for (int32_t j = 0; j <= eta; ++j) ai[r0 + j] = j;
      al[b] = eta + 1;
      const float* row = rows.row(Vec::draft(eta));  // kind 1: the bonus warp
      bo[b] = row_sample(row, V, scale, row_sum_fix(row, V, scale, chunks.data()), up[b], chunks.data(), false);
    }
  });
  return {accept_idx, accept_len, bonus};
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("verify_tree_logits", &specops::verify::cpu::verify_tree_logits_cpu);
  m.impl("verify_joint_logits", &specops::verify::cpu::verify_joint_logits_cpu);
}
