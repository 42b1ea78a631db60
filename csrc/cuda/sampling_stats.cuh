// The statistics of a warped row (warp_probs, csrc/cuda/sampling.cu) and the one expression that
// turns a logit into its warped probability, shared by warp_probs' write pass and by
// verify_tree_logits (csrc/cuda/verify.cu), so that the verifier sees warp_probs' values bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "gpu.cuh"
#include "../sampling_common.h"

namespace specops {

// One row: keep float_key(z) >= kappa with z = (x - mx) / t, probability exp(z) / sum there;
// greedy rows (t below the minimum temperature): the one-hot at argmax (-1 for other rows).
struct WarpRowStats {
  float mx;
  float sum;
  uint32_t kappa;
  int32_t argmax;
};

// The grammar bitmask of verify_tree_logits' rows (csrc/cuda/verify.cu), read where the logit is
// read: a disallowed logit counts as -inf before any use (apply_token_bitmask's rule, so NaN / +inf
// planted there never matter), with no masked copy of the logits. Row n = b * T + c of N = B * T
// rows reads word row n of words [B * T, W], or with parents (draft row c: the grammar state node c
// was drawn at) word row b * T + parents[n], b * T where parents[n] is outside [0, c) (the root).
// words == nullptr: no mask (warp_probs).
struct RowMask {
  const int32_t* words = nullptr;    // [B * T, W], W = ceil(V / 32)
  const int32_t* parents = nullptr;  // [B * T] or nullptr
  int32_t T = 1;
  int64_t W = 0;

  // Row n's words, or nullptr without a mask. n < 2^31 (a row is a block index of its launch):
  // 32-bit division, whose few registers warp_probs' kernels can afford.
  __device__ const int32_t* row(int64_t n) const {
    if (words == nullptr) return nullptr;
    int64_t r = n;
    if (parents != nullptr) {
      const int32_t c = static_cast<int32_t>(n) % T;
      const int32_t p = parents[n];
      r = n - c + (p >= 0 && p < c ? p : 0);
    }
    return words + r * W;
  }
};

// Bit i % 32 of word i / 32: token i allowed.
__device__ __forceinline__ bool token_allowed(const int32_t* words, int64_t i) {
  return (static_cast<uint32_t>(words[i >> 5]) >> (i & 31)) & 1u;
}

// Logit i of a row as fp32, -inf where the row's words (nullptr: none) disallow it.
template <typename scalar_t>
__device__ __forceinline__ float logit_at(const scalar_t* x, int64_t i, const int32_t* words) {
  return words == nullptr || token_allowed(words, i) ? static_cast<float>(x[i]) : -kInf;
}

// Entry i of a non-greedy warped row, from its logits x (masked by words, nullptr: none) and
// statistics (each operation rounded on its own, as on every backend).
template <typename scalar_t>
__device__ __forceinline__ float warped_value(const scalar_t* x, int64_t i, float mx, float t, uint32_t kappa,
                                              float sum, const int32_t* words = nullptr) {
  const float zi = __fdiv_rn(__fsub_rn(logit_at(x, i, words), mx), t);
  return float_key(zi) >= kappa ? expf(zi) / sum : 0.0f;
}

// The statistics warp_probs(logits, temperature, top_k, top_p) computes on this device, with the
// launch plan it would pick for these N rows (so the normaliser is summed in the same order),
// into out [N] (device memory); with mask.words, those of the rows masked by it (apply_token_bitmask
// first). Shape: logits [N, V] contiguous, temperature / top_p fp32 [N], top_k int32 [N].
void warp_row_stats(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                    const at::Tensor& top_p, WarpRowStats* out, const RowMask& mask = RowMask{});

}  // namespace specops
