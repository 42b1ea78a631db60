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

#include <array>

#include "gpu.cuh"
#include "../verify_args.h"
#include "../verify_common.h"
#include "verify_engine.cuh"

namespace specops {
namespace verify {
namespace cuda {

// One block per SM at least, as verify_tree_logits_kernel below: without the bound, ptxas gives sm_80
// 64 registers and a 64-byte stack frame; with it, 96 registers and no stack.
__global__ void __launch_bounds__(kThreads, 1)
    verify_tree_kernel(const int32_t* __restrict__ tokens,    // [B, T]
                       const int32_t* __restrict__ parents,   // [B, T]
                       const int32_t* __restrict__ num_nodes,  // [B]
                       const float* __restrict__ target,      // [B, T, V]
                       const float* __restrict__ draft,       // [B, T, V] or nullptr
                       const float* __restrict__ uniforms,    // [B, T, 2]
                       float* buf,                            // [B, nbuf, V]
                       int32_t* scratch,                      // [B, T + 2]
                       int32_t* accept_idx,                   // [B, T]
                       int32_t* accept_len,                   // [B]
                       int32_t* bonus,                        // [B]
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
                              float* buf,                               // [B, nbuf, V]
                              int32_t* scratch,                         // [B, T + 2]
                              int32_t* accept_idx,                      // [B, T]
                              int32_t* accept_len,                      // [B]
                              int32_t* bonus,                           // [B]
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
                         int32_t* accept_idx,                   // [B, T]
                         int32_t* accept_len,                   // [B]
                         int32_t* bonus,                        // [B]
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
                        int32_t* accept_idx,                       // [B, g + 1]
                        int32_t* accept_len,                       // [B]
                        int32_t* bonus,                            // [B]
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
                               int32_t* accept_idx,                       // [B, g + 1]
                               int32_t* accept_len,                       // [B]
                               int32_t* bonus,                            // [B]
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

void verify_tree_cuda(const TreeCall& c) {
  const int64_t B = c.B, T = c.T, V = c.V, nbuf = mode_buffers(c.mode);
  auto buf = at::empty({B, nbuf, V}, c.target.options());
  auto scratch = at::empty({B, T + 2}, c.tokens.options());
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_tree_kernel)(
      c.tokens.data_ptr<int32_t>(), c.parents.data_ptr<int32_t>(), c.num_nodes.data_ptr<int32_t>(),
      c.target.data_ptr<float>(), c.draft.defined() ? c.draft.data_ptr<float>() : nullptr,
      c.uniforms.data_ptr<float>(), nbuf ? buf.data_ptr<float>() : nullptr, scratch.data_ptr<int32_t>(),
      c.accept_idx.data_ptr<int32_t>(), c.accept_len.data_ptr<int32_t>(), c.bonus.data_ptr<int32_t>(),
      static_cast<int32_t>(T), V, static_cast<int32_t>(nbuf), c.mode, fix_shift(V));
  SPECOPS_LAUNCH_CHECK();
}

void verify_tree_logits_cuda(const TreeCall& c) {
  const int64_t B = c.B, T = c.T, V = c.V, N = B * T;
  const std::array<at::Tensor, 6>& pc = c.params;
  const bool has_q = c.draft.defined();
  // One kernel per logits dtype: a draft of another dtype is widened to the target's (exact when
  // the target's is fp32), or the target to fp32 when the draft is fp32 (exact); either way every
  // z, hence every probability, is what warp_probs computes from the original logits.
  at::Tensor x = c.target, y = c.draft;
  if (has_q && y.scalar_type() != x.scalar_type()) {
    x = x.to(at::kFloat);
    y = y.to(at::kFloat);
  }
  // The bitmask rows each logits row is warped under: target row u its own, draft row c its
  // parent's (read where the logits are read, in both kernels: no masked copy of the logits).
  const int32_t* mw = c.words.defined() ? c.words.data_ptr<int32_t>() : nullptr;
  const int64_t W = (V + 31) / 32;
  // Row statistics with warp_probs' own plan: target rows, then draft rows (each N rows, as the
  // two warp_probs calls of the composition).
  auto stats = at::empty({2, N, 4}, c.tokens.options());
  auto* st = reinterpret_cast<WarpRowStats*>(stats.data_ptr<int32_t>());
  auto temps = at::stack({pc[0], pc[3]}).contiguous();
  warp_row_stats(x.view({N, V}), pc[0], pc[1], pc[2], st, RowMask{mw, nullptr, static_cast<int32_t>(T), W});
  if (has_q)
    warp_row_stats(y.view({N, V}), pc[3], pc[4], pc[5], st + N,
                   RowMask{mw, c.parents.data_ptr<int32_t>(), static_cast<int32_t>(T), W});
  const int64_t nbuf = mode_buffers(c.mode);
  auto buf = at::empty({B, nbuf, V}, c.uniforms.options());
  auto scratch = at::empty({B, T + 2}, c.tokens.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "verify_tree_logits_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_tree_logits_kernel<scalar_t>)(
        c.tokens.data_ptr<int32_t>(), c.parents.data_ptr<int32_t>(), c.num_nodes.data_ptr<int32_t>(),
        x.data_ptr<scalar_t>(), has_q ? y.data_ptr<scalar_t>() : nullptr, st, temps.data_ptr<float>(),
        c.uniforms.data_ptr<float>(), nbuf ? buf.data_ptr<float>() : nullptr, scratch.data_ptr<int32_t>(),
        c.accept_idx.data_ptr<int32_t>(), c.accept_len.data_ptr<int32_t>(), c.bonus.data_ptr<int32_t>(), mw,
        static_cast<int32_t>(T), V, static_cast<int32_t>(nbuf), c.mode, fix_shift(V));
  });
  SPECOPS_LAUNCH_CHECK();
}

void verify_greedy_cuda(const TreeCall& c) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.target.scalar_type(), "verify_greedy_cuda", [&] {
    SPECOPS_LAUNCH(c.B, kThreads, 0, gpu::current_stream(), verify_greedy_kernel<scalar_t>)(
        c.tokens.data_ptr<int32_t>(), c.parents.data_ptr<int32_t>(), c.num_nodes.data_ptr<int32_t>(),
        c.target.data_ptr<scalar_t>(), c.accept_idx.data_ptr<int32_t>(), c.accept_len.data_ptr<int32_t>(),
        c.bonus.data_ptr<int32_t>(), c.words.defined() ? c.words.data_ptr<int32_t>() : nullptr,
        static_cast<int32_t>(c.T), c.V);
  });
  SPECOPS_LAUNCH_CHECK();
}

void verify_joint_cuda(const JointCall& c) {
  SPECOPS_LAUNCH(c.B, kThreads, 0, gpu::current_stream(), verify_joint_kernel)(
      c.tokens.data_ptr<int32_t>(), c.target.data_ptr<float>(), c.joint_q.data_ptr<float>(),
      c.log_tau.data_ptr<float>(), c.uniforms.data_ptr<float>(), c.accept_idx.data_ptr<int32_t>(),
      c.accept_len.data_ptr<int32_t>(), c.bonus.data_ptr<int32_t>(), static_cast<int32_t>(c.g), c.V,
      fix_shift(c.V));
  SPECOPS_LAUNCH_CHECK();
}

void verify_joint_logits_cuda(const JointCall& c) {
  const int64_t B = c.B, N = B * (c.g + 1), V = c.V;
  const std::array<at::Tensor, 6>& pc = c.params;
  // Row statistics with warp_probs' own plan: the test's warp, then the bonus's (each N rows, as
  // the two warp_probs calls of the composition).
  auto stats = at::empty({2, N, 4}, c.tokens.options());
  auto* st = reinterpret_cast<WarpRowStats*>(stats.data_ptr<int32_t>());
  auto temps = at::stack({pc[0], pc[3]}).contiguous();
  warp_row_stats(c.target.view({N, V}), pc[0], pc[1], pc[2], st);
  warp_row_stats(c.target.view({N, V}), pc[3], pc[4], pc[5], st + N);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.target.scalar_type(), "verify_joint_logits_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_joint_logits_kernel<scalar_t>)(
        c.tokens.data_ptr<int32_t>(), c.target.data_ptr<scalar_t>(), st, temps.data_ptr<float>(),
        c.joint_q.data_ptr<float>(), c.log_tau.data_ptr<float>(), c.uniforms.data_ptr<float>(),
        c.num_nodes.data_ptr<int32_t>(), c.accept_idx.data_ptr<int32_t>(), c.accept_len.data_ptr<int32_t>(),
        c.bonus.data_ptr<int32_t>(), static_cast<int32_t>(c.g), V, fix_shift(V));
  });
  SPECOPS_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace verify
}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  namespace sv = specops::verify;
  using Dev = specops::GpuDevice;
  m.impl("verify_joint_logits", &sv::joint_logits_entry<Dev, true, sv::cuda::verify_joint_logits_cuda>);
  m.impl("verify_greedy", &sv::greedy_entry<Dev, sv::cuda::verify_greedy_cuda>);
  m.impl("verify_tree", &sv::tree_entry<Dev, sv::cuda::verify_tree_cuda>);
  m.impl("verify_tree_logits", &sv::tree_logits_entry<Dev, true, sv::cuda::verify_tree_logits_cuda>);
  m.impl("verify_joint", &sv::joint_entry<Dev, sv::cuda::verify_joint_cuda>);
}
