// apply_token_bitmask on the CPU: disallowed logits become -inf, in place.
//
// Work is split into (row, span of kSpanWords words) units so that a single row of a 128K
// vocabulary still uses every core. Logits are handled as raw bit patterns (uint32 for fp32,
// uint16 for fp16 / bf16), so one integer select loop serves all three dtypes and vectorises.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

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
void apply_rows(const BitmaskRows& c, Bits neg_inf) {
  const int64_t T = c.T, W = c.W;
  Bits* base = reinterpret_cast<Bits*>(c.logits.data_ptr());
  const int32_t* m = c.mask.data_ptr<int32_t>();
  const int64_t spans = ceil_div(W, kSpanWords);
  at::parallel_for(0, c.B * T * spans, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t r = u / spans;
      const int64_t w0 = (u % spans) * kSpanWords;
      const int64_t w1 = w0 + kSpanWords < W ? w0 + kSpanWords : W;
      mask_span<Bits>(base + (r / T) * c.sb + (r % T) * c.st, m + r * W, w0, w1, c.V, neg_inf);
    }
  });
}

}  // namespace
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { SPECOPS_TOKEN_BITMASK_REGISTER(m, specops::CpuDevice, specops::apply_rows); }
