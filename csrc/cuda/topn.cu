// topn_expand and select_topn_subtree on CUDA.
//
// topn_expand: stage 1, one block per (sequence, parent) row, picks the row's best
// kp = min(per_parent_k, n, V) children with block::top_sorted (radix select on score keys,
// ordered compaction, sort by counting); stage 2, one block per sequence, the best n of the
// P * kp survivors with the same routine. The order is score_before (csrc/sampling_common.h),
// the one the CPU backend runs. Both stages keep their selection in shared memory, which caps
// kp and n at block::kTopItems * kThreads (checked).
//
// select_topn_subtree: one block per sequence; effective scores by the shared ancestor walk,
// ranks by counting, new indices by an ordered flag scan; global scratch between phases.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>

#include "gpu.cuh"
#include "../sampling_common.h"
#include "../topn_args.h"
#include "sampling_block.cuh"

namespace specops {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxTop = block::kTopItems * kThreads;

// Stage 1: row r = (b, p) of child_logprobs -> its best kp candidates, sorted.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    topn_parent_kernel(const float* __restrict__ parent_scores,   // [B * P]
                       const scalar_t* __restrict__ child,        // [B * P, V]
                       float* cand_score,                         // [B * P, kp]
                       int32_t* cand_token,                       // [B * P, kp]
                       int64_t V, int kp) {
  SPECOPS_DYNAMIC_SMEM(unsigned char, smem);
  int64_t* sel_idx = reinterpret_cast<int64_t*>(smem);      // [kp]
  float* sel_score = reinterpret_cast<float*>(sel_idx + kp);  // [kp]
  __shared__ block::TopShared sh;
  const int64_t r = blockIdx.x;
  const float bias = parent_scores[r];
  const scalar_t* c = child + r * V;
  int got = 0;
  if (score_available(bias)) {  // block-uniform: a padding parent has no candidates
    got = block::top_sorted(
        V, kp,
        [&](int64_t i) {
          const float s = bias + static_cast<float>(c[i]);
          return s == s ? s : -kInf;
        },
        sel_score, sel_idx, &sh);
  }
  for (int j = threadIdx.x; j < kp; j += blockDim.x) {
    cand_score[r * kp + j] = j < got ? sel_score[j] : -kInf;
    cand_token[r * kp + j] = j < got ? static_cast<int32_t>(sel_idx[j]) : -1;
  }
}

// Stage 2: sequence b's P * kp survivors -> its best n. Equal scores keep buffer order,
// which is (parent asc, token asc) because each parent's list is sorted by score_before.
__global__ void __launch_bounds__(kThreads)
    topn_merge_kernel(const float* __restrict__ cand_score,   // [B, P * kp]
                      const int32_t* __restrict__ cand_token,  // [B, P * kp]
                      float* scores,                           // [B, n]
                      int32_t* tokens,                         // [B, n]
                      int32_t* parents,                        // [B, n]
                      int64_t L, int kp, int n) {
  SPECOPS_DYNAMIC_SMEM(unsigned char, smem);
  int64_t* sel_idx = reinterpret_cast<int64_t*>(smem);     // [n]
  float* sel_score = reinterpret_cast<float*>(sel_idx + n);  // [n]
  __shared__ block::TopShared sh;
  const int64_t b = blockIdx.x;
  const float* cs = cand_score + b * L;
  const int got = block::top_sorted(
      L, n, [&](int64_t i) { return cs[i]; }, sel_score, sel_idx, &sh);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const bool ok = j < got;
    scores[b * n + j] = ok ? sel_score[j] : -kInf;
    tokens[b * n + j] = ok ? cand_token[b * L + sel_idx[j]] : -1;
    parents[b * n + j] = ok ? static_cast<int32_t>(sel_idx[j] / kp) : -1;
  }
}

void topn_expand_cuda(const topn::Expand& e) {
  const int64_t B = e.B, P = e.P, V = e.V, n = e.n, kp = e.kp;
  const auto f32 = e.parent_scores.options();
  auto cand_score = at::empty({B * P, kp}, f32);
  auto cand_token = at::empty({B * P, kp}, f32.dtype(at::kInt));
  const auto stream = gpu::current_stream();
  const size_t sm1 = kp * (sizeof(int64_t) + sizeof(float));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, e.child_logprobs.scalar_type(), "topn_expand_cuda", [&] {
    SPECOPS_LAUNCH(B * P, kThreads, sm1, stream, topn_parent_kernel<scalar_t>)(
        e.parent_scores.data_ptr<float>(), e.child_logprobs.data_ptr<scalar_t>(), cand_score.data_ptr<float>(),
        cand_token.data_ptr<int32_t>(), V, static_cast<int>(kp));
  });
  SPECOPS_LAUNCH_CHECK();
  const size_t sm2 = n * (sizeof(int64_t) + sizeof(float));
  SPECOPS_LAUNCH(B, kThreads, sm2, stream, topn_merge_kernel)(
      cand_score.data_ptr<float>(), cand_token.data_ptr<int32_t>(), e.scores.data_ptr<float>(),
      e.tokens.data_ptr<int32_t>(), e.parents.data_ptr<int32_t>(), P * kp, static_cast<int>(kp),
      static_cast<int>(n));
  SPECOPS_LAUNCH_CHECK();
}

__global__ void __launch_bounds__(kThreads)
    select_topn_subtree_kernel(const int32_t* __restrict__ parents,    // [B, T]
                               const float* __restrict__ scores,       // [B, T]
                               const int32_t* __restrict__ num_nodes,  // [B]
                               float* eff,                             // [B, T] scratch
                               int32_t* pos,                           // [B, T] scratch
                               int32_t* keep,                          // [B, n]
                               int32_t* new_parents,                   // [B, n]
                               int32_t* counts,                        // [B]
                               int32_t T, int32_t n) {
  __shared__ int s_scan[32];
  const int64_t b = blockIdx.x;
  const int32_t* par = parents + b * T;
  float* e = eff + b * T;
  int32_t* q = pos + b * T;
  const int32_t nv = min(max(num_nodes[b], 1), T);
  for (int32_t i = threadIdx.x; i < T; i += blockDim.x) e[i] = subtree_eff_score(par, scores + b * T, i, nv);
  __syncthreads();
  // Kept iff root, or available and fewer than n - 1 non-root nodes come before it.
  for (int32_t i = threadIdx.x; i < T; i += blockDim.x) {
    bool kept = i == 0;
    if (!kept && score_available(e[i])) {
      int32_t rank = 0;
      for (int32_t j = 1; j < T && rank < n - 1; ++j)
        rank += (score_available(e[j]) && score_before(e[j], j, e[i], i)) ? 1 : 0;
      kept = rank < n - 1;
    }
    q[i] = kept ? 1 : 0;
  }
  __syncthreads();
  int32_t count = 0;
  for (int32_t start = 0; start < T; start += blockDim.x) {
    const int32_t i = start + threadIdx.x;
    const bool kept = i < T && q[i] != 0;
    int total;
    const int before = block::scan_flags(kept, s_scan, &total);
    if (i < T) q[i] = kept ? count + before : -1;
    count += total;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < T; i += blockDim.x) {
    if (q[i] < 0) continue;
    const int32_t p = i == 0 ? -1 : par[i];
    keep[b * n + q[i]] = i;
    new_parents[b * n + q[i]] = (p >= 0 && p < i) ? q[p] : -1;
  }
  for (int32_t j = count + threadIdx.x; j < n; j += blockDim.x) keep[b * n + j] = new_parents[b * n + j] = -1;
  if (threadIdx.x == 0) counts[b] = count;
}

void select_topn_subtree_cuda(const topn::Select& s) {
  const int64_t B = s.B, T = s.T;
  auto eff = at::empty({B, T}, s.scores.options());
  auto pos = at::empty({B, T}, s.parents.options());
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), select_topn_subtree_kernel)(
      s.parents.data_ptr<int32_t>(), s.scores.data_ptr<float>(), s.num_nodes.data_ptr<int32_t>(),
      eff.data_ptr<float>(), pos.data_ptr<int32_t>(), s.keep.data_ptr<int32_t>(), s.new_parents.data_ptr<int32_t>(),
      s.counts.data_ptr<int32_t>(), static_cast<int32_t>(T), static_cast<int32_t>(s.n));
  SPECOPS_LAUNCH_CHECK();
}

}  // namespace
}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  SPECOPS_TOPN_REGISTER(m, specops::GpuDevice, specops::kMaxTop, specops::topn_expand_cuda,
                        specops::select_topn_subtree_cuda);
}
