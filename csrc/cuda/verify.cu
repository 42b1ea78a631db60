// Verification on CUDA: one thread block per sequence, running the shared walks of
// ../verify_common.h through the block engine of verify_engine.cuh.
//
// verify_tree_logits (design: docs/verify_logits.md): warp_probs' own launch plan computes each
// row's statistics (max, top-k / top-p threshold key, normaliser; argmax of greedy rows: 16 bytes
// a row, warp_row_stats in sampling.cu), then the walk kernel evaluates every target / draft value
// it reads from the logit and those statistics with warp_probs' own expression (warped_value), so
// the decisions are verify_tree's on warp_probs' rows, bit for bit. Residual rows live in the
// per-sequence scratch rows verify_tree uses; no [B, T, V] probability tensor exists. Extra memory:
// 32 bytes per row of statistics + B * nbuf * V fp32 (verify_tree's own scratch) + the split
// plan's per-row histograms when warp_probs would use it. A grammar bitmask is read where the logit
// is read, in both kernels (RowMask, sampling_stats.cuh): each row is warp_probs' on the masked
// logits without a masked copy or an extra pass over them. verify_joint_logits reuses the same
// statistics and LogitRows for R6: the test's warp and the bonus's as its two row kinds.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <torch/library.h>

#include <climits>
#include <string>

#include "gpu.cuh"
#include "../registration.h"
#include "../token_bitmask_args.h"
#include "../verify_args.h"
#include "../verify_common.h"
#include "verify_engine.cuh"

namespace specops {
namespace verify {
namespace cuda {

__global__ void __launch_bounds__(kThreads)
    verify_tree_kernel(const int32_t* __restrict__ tokens,    // [B, T]
                       const int32_t* __restrict__ parents,   // [B, T]
                       const int32_t* __restrict__ num_nodes,  // [B]
                       const float* __restrict__ target,      // [B, T, V]
                       const float* __restrict__ draft,       // [B, T, V] or nullptr
                       const float* __restrict__ uniforms,    // [B, T, 2]
                       float* __restrict__ buf,               // [B, nbuf, V]
                       int32_t* __restrict__ scratch,         // [B, T + 2]
                       int32_t* __restrict__ accept_idx,      // [B, T]
                       int32_t* __restrict__ accept_len,      // [B]
                       int32_t* __restrict__ bonus,           // [B]
                       int32_t T, int64_t V, int32_t nbuf, int32_t mode, int32_t S) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  CudaTreeEngine<DenseRows> e{{target + b * T * V, draft ? draft + b * T * V : nullptr, V},
                              uniforms + b * T * 2,
                              buf + b * nbuf * V,
                              scratch + b * (T + 2),
                              &sh,
                              V,
                              exp2i(S),
                              exp2i(-S)};
  run_walk(e, mode, tokens + b * T, parents + b * T, valid_nodes(num_nodes[b], T), T, accept_idx + b * T,
           accept_len + b, bonus + b);
}

// One block per SM at least (the walk is latency-bound, one block per sequence): ptxas may use
// up to 128 registers instead of spilling the warped rows' statistics.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads, 1)
    verify_tree_logits_kernel(const int32_t* __restrict__ tokens,       // [B, T]
                              const int32_t* __restrict__ parents,      // [B, T]
                              const int32_t* __restrict__ num_nodes,    // [B]
                              const scalar_t* __restrict__ target,      // [B, T, V] logits
                              const scalar_t* __restrict__ draft,       // [B, T, V] logits or nullptr
                              const WarpRowStats* __restrict__ stats,   // [2, B * T] target, draft
                              const float* __restrict__ temperature,    // [2, B * T] target, draft
                              const float* __restrict__ uniforms,       // [B, T, 2]
                              float* __restrict__ buf,                  // [B, nbuf, V]
                              int32_t* __restrict__ scratch,            // [B, T + 2]
                              int32_t* __restrict__ accept_idx,         // [B, T]
                              int32_t* __restrict__ accept_len,         // [B]
                              int32_t* __restrict__ bonus,              // [B]
                              const int32_t* __restrict__ bitmask,      // [B, T, W] or nullptr
                              int32_t T, int64_t V, int32_t nbuf, int32_t mode, int32_t S) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x, N = static_cast<int64_t>(gridDim.x) * T, W = (V + 31) / 32;
  const int32_t* words = bitmask ? bitmask + b * T * W : nullptr;
  const LogitRows<scalar_t> rows{target + b * T * V,
                                 draft ? draft + b * T * V : nullptr,
                                 {stats + b * T, stats + N + b * T},
                                 {temperature + b * T, temperature + N + b * T},
                                 RowMask{words, nullptr, T, W},
                                 RowMask{words, parents + b * T, T, W},
                                 V};
  CudaTreeEngine<LogitRows<scalar_t>> e{rows, uniforms + b * T * 2, buf + b * nbuf * V, scratch + b * (T + 2), &sh,
                                        V, exp2i(S), exp2i(-S)};
  run_walk(e, mode, tokens + b * T, parents + b * T, valid_nodes(num_nodes[b], T), T, accept_idx + b * T,
           accept_len + b, bonus + b);
}

struct EmitOnly {
  __device__ void emit(int32_t* out, int32_t v) {
    if (threadIdx.x == 0) *out = v;
  }
};

template <class scalar_t>
__global__ void __launch_bounds__(kThreads)
    verify_greedy_kernel(const int32_t* __restrict__ tokens,    // [B, T]
                         const int32_t* __restrict__ parents,   // [B, T]
                         const int32_t* __restrict__ num_nodes,  // [B]
                         const scalar_t* __restrict__ logits,   // [B, T, V]
                         int32_t* __restrict__ accept_idx,      // [B, T]
                         int32_t* __restrict__ accept_len,      // [B]
                         int32_t* __restrict__ bonus,           // [B]
                         const int32_t* __restrict__ bitmask,   // [B, T, W] or nullptr
                         int32_t T, int64_t V) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x, W = (V + 31) / 32;
  const scalar_t* rows = logits + b * T * V;
  EmitOnly e;
  auto predict = [&](int32_t u) {
    return block_argmax(rows + u * V, V, sh, bitmask ? bitmask + (b * T + u) * W : nullptr);
  };
  match_walk(e, predict, tokens + b * T, parents + b * T, valid_nodes(num_nodes[b], T), accept_idx + b * T,
             accept_len + b, bonus + b);
}

// R6 over one sequence's chain of n nodes on one block: eta from joint_eta (every thread,
// redundantly: g is small), the accepted prefix, then draw(eta), the bonus drawn from row eta by the
// whole block. logp(row, x): the test's log-probability of token x in row `row`.
template <class LogP, class Draw>
__device__ void joint_walk(const int32_t* tokens, int32_t n, int64_t V, float log_tau, const float* lq, LogP&& logp,
                           Draw&& draw, int32_t* accept_idx, int32_t* accept_len, int32_t* bonus) {
  const int32_t eta = joint_eta(tokens, n, V, log_tau, lq, logp);
  for (int32_t j = threadIdx.x; j <= eta; j += kThreads) accept_idx[j] = j;
  if (threadIdx.x == 0) *accept_len = eta + 1;
  const int32_t tok = draw(eta);
  if (threadIdx.x == 0) *bonus = tok;
}

// verify_joint: the target's rows are log-probabilities; the bonus weighs det_exp of its row.
__global__ void __launch_bounds__(kThreads)
    verify_joint_kernel(const int32_t* __restrict__ draft_tokens,  // [B, g]
                        const float* __restrict__ logprobs,        // [B, g + 1, V]
                        const float* __restrict__ joint_q,         // [B, g]
                        const float* __restrict__ log_tau,         // [B]
                        const float* __restrict__ uniforms,        // [B]
                        int32_t* __restrict__ accept_idx,          // [B, g + 1]
                        int32_t* __restrict__ accept_len,          // [B]
                        int32_t* __restrict__ bonus,               // [B]
                        int32_t g, int64_t V, int32_t S) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const float* rows = logprobs + b * (g + 1) * V;
  const float scale = exp2i(S), u = uniforms[b];
  joint_walk(
      draft_tokens + b * g, g + 1, V, log_tau[b], joint_q + b * g,
      [&](int32_t row, int32_t x) { return rows[row * V + x]; },
      [&](int32_t eta) {
        const float* row = rows + eta * V;
        auto weight = [&](int64_t i) { return fix_weight(det_exp(row[i]), scale); };
        return block_sample(V, block_sum_weights(V, weight, sh), u, weight, sh);
      },
      accept_idx + b * (g + 1), accept_len + b, bonus + b);
}

// verify_joint_logits: the rows are logits, read through LogitRows with two row kinds over the
// same logits, the test's warp (kTarget: one probability per row, det_log of it) and the bonus's
// (kDraft: row eta's warped values for the draw), each from warp_row_stats' statistics.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    verify_joint_logits_kernel(const int32_t* __restrict__ draft_tokens,  // [B, g]
                               const scalar_t* __restrict__ logits,       // [B, g + 1, V]
                               const WarpRowStats* __restrict__ stats,    // [2, B * (g + 1)] test, bonus
                               const float* __restrict__ temperature,     // [2, B * (g + 1)] test, bonus
                               const float* __restrict__ joint_q,         // [B, g]
                               const float* __restrict__ log_tau,         // [B]
                               const float* __restrict__ uniforms,        // [B]
                               const int32_t* __restrict__ num_nodes,     // [B]
                               int32_t* __restrict__ accept_idx,          // [B, g + 1]
                               int32_t* __restrict__ accept_len,          // [B]
                               int32_t* __restrict__ bonus,               // [B]
                               int32_t g, int64_t V, int32_t S) {
  __shared__ Shared sh;
  const int32_t T = g + 1;
  const int64_t b = blockIdx.x, N = static_cast<int64_t>(gridDim.x) * T;
  const scalar_t* x = logits + b * T * V;
  const LogitRows<scalar_t> rows{x, x, {stats + b * T, stats + N + b * T},
                                 {temperature + b * T, temperature + N + b * T}, RowMask{}, RowMask{}, V};
  const float scale = exp2i(S), u = uniforms[b];
  joint_walk(
      draft_tokens + b * g, valid_nodes(num_nodes[b], T), V, log_tau[b], joint_q + b * g,
      [&](int32_t row, int32_t tok) {
        return det_log(rows.with_row(Vec::target(row), [&](auto p) { return p(tok); }));
      },
      [&](int32_t eta) {
        return rows.with_row(Vec::draft(eta), [&](auto p) {
          auto weight = [&](int64_t i) { return fix_weight(p(i), scale); };
          return block_sample(V, block_sum_weights(V, weight, sh), u, weight, sh);
        });
      },
      accept_idx + b * T, accept_len + b, bonus + b);
}

// tokens, parents, num_nodes and the rows on the device (after check_tree_args).
void check_tree_device(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& num_nodes,
                       const at::Tensor& rows) {
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(tokens) && SPECOPS_ON_GPU(parents) && SPECOPS_ON_GPU(num_nodes) && SPECOPS_ON_GPU(rows),
                    "verify: " SPECOPS_GPU_NAME " tensors expected");
}

// The six warping parameters on the device (after check_params).
void check_params_device(const char* message, const at::Tensor* const params[6]) {
  for (int i = 0; i < 6; ++i) TORCH_CHECK_VALUE(SPECOPS_ON_GPU(*params[i]), message);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                                                                const at::Tensor& target_probs,
                                                                const at::Tensor& uniforms,
                                                                const c10::optional<at::Tensor>& draft_probs,
                                                                const at::Tensor& num_nodes,
                                                                c10::string_view mode_name) {
  const int32_t mode = parse_mode(mode_name);
  const bool has_q = check_tree_probs_args(mode, mode_name, tokens, parents, num_nodes, target_probs, uniforms,
                                           draft_probs);
  check_tree_device(tokens, parents, num_nodes, target_probs);
  const gpu::DeviceGuard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_probs.size(2);
  const at::Tensor q = has_q ? draft_probs->contiguous() : at::Tensor();
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  const int64_t nbuf = mode_buffers(mode);
  auto buf = at::empty({B, nbuf, V}, target_probs.options());
  auto scratch = at::empty({B, T + 2}, tokens.options());
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto p = target_probs.contiguous();
  auto un = uniforms.contiguous();
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_tree_kernel)(
      tok.data_ptr<int32_t>(), par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), p.data_ptr<float>(),
      has_q ? q.data_ptr<float>() : nullptr, un.data_ptr<float>(), nbuf ? buf.data_ptr<float>() : nullptr,
      scratch.data_ptr<int32_t>(), accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(),
      bonus.data_ptr<int32_t>(), static_cast<int32_t>(T), V, static_cast<int32_t>(nbuf), mode,
      fix_shift(V));
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_logits_cuda(
    const at::Tensor& tokens,                       // [B, T] int32
    const at::Tensor& parents,                      // [B, T] int32
    const at::Tensor& target_logits,                // [B, T, V] fp32/bf16/fp16
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
  const int32_t mode = parse_mode(mode_name);
  const at::Tensor* params[6] = {&temperature, &top_k, &top_p, &draft_temperature, &draft_top_k, &draft_top_p};
  const bool has_q = check_tree_logits_args(mode, mode_name, tokens, parents, num_nodes, target_logits, uniforms,
                                            params, draft_logits);
  check_tree_device(tokens, parents, num_nodes, target_logits);
  check_params_device("verify_tree_logits: warping parameters must be [B * T] fp32 / int32 / fp32 " SPECOPS_GPU_NAME
                      " tensors", params);
  const gpu::DeviceGuard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2), N = B * T;
  const at::Tensor words = node_bitmask_words(bitmask, "verify_tree_logits", B, T, V);
  const bool masked = words.defined();
  TORCH_CHECK_VALUE(!masked || SPECOPS_ON_GPU(words),
                    "verify_tree_logits: " SPECOPS_GPU_NAME " tensors expected (bitmask)");
  // One kernel per logits dtype: a draft of another dtype is widened to the target's (exact when
  // the target's is fp32), or the target to fp32 when the draft is fp32 (exact); either way every
  // z, hence every probability, is what warp_probs computes from the original logits.
  at::Tensor x = target_logits.contiguous(), y;
  if (has_q) {
    y = draft_logits->contiguous();
    if (y.scalar_type() != x.scalar_type()) {
      x = x.to(at::kFloat);
      y = y.to(at::kFloat);
    }
  }
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto par = parents.contiguous();
  // The bitmask rows each logits row is warped under: target row u its own, draft row c its
  // parent's (read where the logits are read, in both kernels: no masked copy of the logits).
  const int32_t* mw = masked ? words.data_ptr<int32_t>() : nullptr;
  const int64_t W = (V + 31) / 32;
  // Row statistics with warp_probs' own plan: target rows, then draft rows (each N rows, as the
  // two warp_probs calls of the composition).
  auto stats = at::empty({2, N, 4}, tokens.options());
  auto* st = reinterpret_cast<WarpRowStats*>(stats.data_ptr<int32_t>());
  auto temps = at::stack({temperature, draft_temperature}).contiguous();
  warp_row_stats(x.view({N, V}), temperature.contiguous(), top_k.contiguous(), top_p.contiguous(), st,
                 RowMask{mw, nullptr, static_cast<int32_t>(T), W});
  if (has_q)
    warp_row_stats(y.view({N, V}), draft_temperature.contiguous(), draft_top_k.contiguous(),
                   draft_top_p.contiguous(), st + N,
                   RowMask{mw, par.data_ptr<int32_t>(), static_cast<int32_t>(T), W});
  const int64_t nbuf = mode_buffers(mode);
  auto buf = at::empty({B, nbuf, V}, uniforms.options());
  auto scratch = at::empty({B, T + 2}, tokens.options());
  auto tok = tokens.contiguous();
  auto nn = num_nodes.contiguous();
  auto un = uniforms.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "verify_tree_logits_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_tree_logits_kernel<scalar_t>)(
        tok.data_ptr<int32_t>(), par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), x.data_ptr<scalar_t>(),
        has_q ? y.data_ptr<scalar_t>() : nullptr, st, temps.data_ptr<float>(), un.data_ptr<float>(),
        nbuf ? buf.data_ptr<float>() : nullptr, scratch.data_ptr<int32_t>(), accept_idx.data_ptr<int32_t>(),
        accept_len.data_ptr<int32_t>(), bonus.data_ptr<int32_t>(), mw, static_cast<int32_t>(T), V,
        static_cast<int32_t>(nbuf), mode, fix_shift(V));
  });
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_greedy_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                                                                  const at::Tensor& target_logits,
                                                                  const at::Tensor& num_nodes,
                                                                  const c10::optional<at::Tensor>& bitmask) {
  check_tree_args(tokens, parents, num_nodes, target_logits);
  check_tree_device(tokens, parents, num_nodes, target_logits);
  const gpu::DeviceGuard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2);
  const at::Tensor words = node_bitmask_words(bitmask, "verify_greedy", B, T, V);
  const bool masked = words.defined();
  TORCH_CHECK_VALUE(!masked || SPECOPS_ON_GPU(words), "verify_greedy: " SPECOPS_GPU_NAME " tensors expected (bitmask)");
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto logits = target_logits.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "verify_greedy_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_greedy_kernel<scalar_t>)(
        tok.data_ptr<int32_t>(), par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), logits.data_ptr<scalar_t>(),
        accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(), bonus.data_ptr<int32_t>(),
        masked ? words.data_ptr<int32_t>() : nullptr, static_cast<int32_t>(T), V);
  });
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_joint_cuda(const at::Tensor& draft_tokens,
                                                                 const at::Tensor& target_logprobs,
                                                                 const at::Tensor& draft_joint_logprobs,
                                                                 const at::Tensor& log_tau, const at::Tensor& uniforms) {
  SPECOPS_CHECK_DTYPE(target_logprobs, at::kFloat);
  const auto [B, g, V] = check_joint_args("", draft_tokens, target_logprobs, "target_logprobs", draft_joint_logprobs,
                                          log_tau, uniforms);
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(draft_tokens) && SPECOPS_ON_GPU(target_logprobs), "verify_joint: " SPECOPS_GPU_NAME " tensors expected");
  const gpu::DeviceGuard guard(draft_tokens.device());
  auto [accept_idx, accept_len, bonus] = outputs(draft_tokens, B, g + 1);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto tok = draft_tokens.contiguous();
  auto lp = target_logprobs.contiguous();
  auto lq = draft_joint_logprobs.contiguous();
  auto lt = log_tau.contiguous();
  auto un = uniforms.contiguous();
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_joint_kernel)(
      tok.data_ptr<int32_t>(), lp.data_ptr<float>(), lq.data_ptr<float>(), lt.data_ptr<float>(),
      un.data_ptr<float>(), accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(),
      bonus.data_ptr<int32_t>(), static_cast<int32_t>(g), V, fix_shift(V));
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_joint_logits_cuda(
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
  const int64_t T = g + 1, N = B * T;
  check_params_device("verify_joint_logits: warping parameters must be [B * (g + 1)] fp32 / int32 / fp32 "
                      SPECOPS_GPU_NAME " tensors", params);
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(draft_tokens) && SPECOPS_ON_GPU(target_logits) &&
                        SPECOPS_ON_GPU(draft_joint_logprobs) && SPECOPS_ON_GPU(log_tau) && SPECOPS_ON_GPU(uniforms) &&
                        SPECOPS_ON_GPU(num_nodes),
                    "verify_joint_logits: " SPECOPS_GPU_NAME " tensors expected");
  const gpu::DeviceGuard guard(draft_tokens.device());
  auto [accept_idx, accept_len, bonus] = outputs(draft_tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto x = target_logits.contiguous();
  // Row statistics with warp_probs' own plan: the test's warp, then the bonus's (each N rows, as
  // the two warp_probs calls of the composition).
  auto stats = at::empty({2, N, 4}, draft_tokens.options());
  auto* st = reinterpret_cast<WarpRowStats*>(stats.data_ptr<int32_t>());
  auto temps = at::stack({temperature, bonus_temperature}).contiguous();
  warp_row_stats(x.view({N, V}), temperature.contiguous(), top_k.contiguous(), top_p.contiguous(), st);
  warp_row_stats(x.view({N, V}), bonus_temperature.contiguous(), bonus_top_k.contiguous(), bonus_top_p.contiguous(),
                 st + N);
  auto tok = draft_tokens.contiguous();
  auto lq = draft_joint_logprobs.contiguous();
  auto lt = log_tau.contiguous();
  auto un = uniforms.contiguous();
  auto nn = num_nodes.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "verify_joint_logits_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_joint_logits_kernel<scalar_t>)(
        tok.data_ptr<int32_t>(), x.data_ptr<scalar_t>(), st, temps.data_ptr<float>(), lq.data_ptr<float>(),
        lt.data_ptr<float>(), un.data_ptr<float>(), nn.data_ptr<int32_t>(), accept_idx.data_ptr<int32_t>(),
        accept_len.data_ptr<int32_t>(), bonus.data_ptr<int32_t>(), static_cast<int32_t>(g), V, fix_shift(V));
  });
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

}  // namespace cuda
}  // namespace verify
}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  m.impl("verify_joint_logits", &specops::verify::cuda::verify_joint_logits_cuda);
  m.impl("verify_greedy", &specops::verify::cuda::verify_greedy_cuda);
  m.impl("verify_tree", &specops::verify::cuda::verify_tree_cuda);
  m.impl("verify_tree_logits", &specops::verify::cuda::verify_tree_logits_cuda);
  m.impl("verify_joint", &specops::verify::cuda::verify_joint_cuda);
}
