// apply_token_bitmask on the CPU: disallowed logits become -inf, in place.
//
// Work is split into (row, span of kSpanWords words) units so that a single row of a 128K
// vocabulary still uses every core. Logits are handled as raw bit patterns (uint32 for fp32,
// uint16 for fp16 / bf16), so one integer select loop serves all three dtypes and vectorises.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "../common.h"
#include "../registration.h"
#include "../token_bitmask_args.h"

namespace specops {
namespace {

constexpr int64_t kSpanWords = 64;  // 2048 tokens per unit of work

// Applies words [w0, w1) of one row's mask to that row's logits (V of them, as raw bits).
template <typename Bits>
void mask_span(Bits* row, const int32_t* mask, int64_t w0, int64_t w1, int64_t V, Bits neg_inf) {
  for (int64_t w = w0; w < w1; ++w) {
    const uint32_t m = static_cast<uint32_t>(mask[w]);
    const int64_t j0 = w * 32;
    const int64_t n = V - j0 < 32 ? V - j0 : 32;
    if (m == 0xFFFFFFFFu && n == 32) continue;  // all allowed: nothing to write
    Bits* x = row + j0;
    if (n == 32) {
      // Fixed trip count: the compiler turns this select into a vector blend.
      for (int k = 0; k < 32; ++k) x[k] = ((m >> k) & 1u) ? x[k] : neg_inf;
    } else {
      for (int64_t k = 0; k < n; ++k) x[k] = ((m >> k) & 1u) ? x[k] : neg_inf;
    }
  }
}

template <typename Bits>
void apply_all(const at::Tensor& logits, const at::Tensor& mask, Bits neg_inf) {
  const bool flat = logits.dim() == 2;
  const int64_t B = flat ? 1 : logits.size(0);
  const int64_t T = logits.size(logits.dim() - 2);
  const int64_t V = logits.size(logits.dim() - 1);
  const int64_t W = mask.size(mask.dim() - 1);
  // Leading strides of the logits, in elements: views (a slice of a larger buffer) are written in place.
  const int64_t sb = flat ? 0 : logits.stride(0);
  const int64_t st = logits.stride(logits.dim() - 2);
  Bits* base = reinterpret_cast<Bits*>(logits.data_ptr());
  const int32_t* m = mask.data_ptr<int32_t>();
  const int64_t spans = ceil_div(W, kSpanWords);
  at::parallel_for(0, B * T * spans, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t r = u / spans;
      const int64_t w0 = (u % spans) * kSpanWords;
      const int64_t w1 = w0 + kSpanWords < W ? w0 + kSpanWords : W;
      mask_span<Bits>(base + (r / T) * sb + (r % T) * st, m + r * W, w0, w1, V, neg_inf);
    }
  });
}

}  // namespace

void apply_token_bitmask_cpu(const at::Tensor& logits,         // [B, T, V] or [N, V] fp32/fp16/bf16, in place
                             const at::Tensor& bitmask)  // [B, T, W] or [N, W] int32, W = ceil(V / 32)
{
  check_token_bitmask_args(logits, bitmask);
  TORCH_CHECK_VALUE(logits.is_cpu() && bitmask.is_cpu(), "apply_token_bitmask: CPU tensors expected");
  const uint32_t neg_inf = neg_inf_bits(logits.scalar_type());
  if (logits.numel() == 0) return;
  auto mask = bitmask.contiguous();
  if (logits.scalar_type() == at::kFloat) apply_all<uint32_t>(logits, mask, neg_inf);
  else apply_all<uint16_t>(logits, mask, static_cast<uint16_t>(neg_inf));
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("apply_token_bitmask", &specops::apply_token_bitmask_cpu); }
