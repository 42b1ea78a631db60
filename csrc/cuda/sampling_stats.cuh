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

// Entry i of a non-greedy warped row, from its logits x and statistics (each operation rounded on
// its own, as on every backend).
template <typename scalar_t>
__device__ __forceinline__ float warped_value(const scalar_t* x, int64_t i, float mx, float t, uint32_t kappa,
                                              float sum) {
  const float zi = __fdiv_rn(__fsub_rn(static_cast<float>(x[i]), mx), t);
  return float_key(zi) >= kappa ? expf(zi) / sum : 0.0f;
}

// The statistics warp_probs(logits, temperature, top_k, top_p) computes on this device, with the
// launch plan it would pick for these N rows (so the normaliser is summed in the same order),
// into out [N] (device memory). Shape: logits [N, V] contiguous, temperature / top_p fp32 [N],
// top_k int32 [N].
void warp_row_stats(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                    const at::Tensor& top_p, WarpRowStats* out);

}  // namespace specops
