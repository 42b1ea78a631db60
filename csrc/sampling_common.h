// Selection logic shared by the sampling (warp_probs) and topn (topn_expand,
// select_topn_subtree) kernels of the CPU and CUDA backends.
//
// Everything here is plain scalar logic compiled as __host__ __device__ under nvcc,
// so the CPU backend's tests run exactly the decisions the GPU kernels make:
// the order-preserving float keys, the radix-select digit choice, the fixed-point
// probability mass used by top-p, and the tie-breaking comparators.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "common.h"

namespace specops {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- order-preserving keys --------------------------------------------------------------------

SPECOPS_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECOPS_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// Maps floats to uint32 so that unsigned order = float order (-inf lowest, +inf highest).
// -0 and +0 compare equal, so they share the key of +0: ties are decided on values.
// NaN maps outside [key(-inf), key(+inf)]; callers exclude it or leave it unspecified.
SPECOPS_HD uint32_t float_key(float x) {
  const uint32_t u = float_bits(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

SPECOPS_HD float key_float(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

// ---- radix select ---------------------------------------------------------------------------

// One digit of a radix select for the threshold key
//   kappa = max { k : W(key >= k) >= target },
// i.e. the key of the element at which the weight accumulated from the top first reaches
// `target` (weight 1 per element: the target-th largest key; probability mass: top-p).
// hist[d] holds the weight of the remaining candidates whose current digit is d; *above the
// weight of elements already known to lie above every remaining candidate. Returns the digit
// and adds the weight of the digits above it to *above. target <= *above + sum(hist) is
// required; otherwise the lowest digit is returned.
template <typename W>
SPECOPS_HD int radix_pick(const W* hist, int nbins, W target, W* above) {
  W acc = *above;
  for (int d = nbins - 1; d > 0; --d) {
    if (acc + hist[d] >= target) {
      *above = acc;
      return d;
    }
    acc += hist[d];
  }
  *above = acc;
  return 0;
}

// ---- temperature ----------------------------------------------------------------------------

// Temperatures below the smallest normal float (0, denormals, NaN) mean greedy decoding: no
// backend divides by a denormal reliably (GPU code may flush it to 0), and the limit t -> 0 of
// the warped distribution is the one-hot argmax anyway.
constexpr float kMinTemperature = 1.17549435082228750797e-38f;  // 2^-126, FLT_MIN

SPECOPS_HD bool greedy_temperature(float t) { return !(t >= kMinTemperature); }

// ---- fixed-point probability mass (top-p) ------------------------------------------------------

// Unnormalised probabilities e = exp(z - max) lie in [0, 1]. Top-p sums them as integers with
// S fractional bits so that the sum, and hence the kept set, does not depend on summation
// order (threads, atomics): every backend makes the same decision from the same e values.
// S = min(40, 62 - ceil(log2 V)) keeps a row's total below 2^62 (it also fits Triton's signed
// int64) for every V; vocabularies up to 2^22 get the full 40 bits. Exact for e >= 2^-S.
// V itself is limited to kMaxVocab (int32 token indices in the CPU and Triton kernels).
constexpr int64_t kMaxVocab = 2147483647;  // 2^31 - 1

SPECOPS_HD int mass_shift(int64_t V) {
  int bits = 0;  // ceil(log2 V) = bit length of V - 1
  for (uint64_t r = V > 1 ? static_cast<uint64_t>(V - 1) : 0; r != 0; r >>= 1) ++bits;
  return bits > 22 ? 62 - bits : 40;
}

// 2^mass_shift(V) as a float (exact: a power of two).
SPECOPS_HD float mass_scale(int64_t V) { return static_cast<float>(1ull << mass_shift(V)); }

SPECOPS_HD uint64_t mass_fixed(float e, float scale) { return static_cast<uint64_t>(e * scale); }

// The smallest integer mass >= top_p * total, kept in [1, total] so that at least the
// maximal token survives any top_p > 0 (and top_p <= 0 behaves as the tiniest top_p).
SPECOPS_HD uint64_t top_p_target(float top_p, uint64_t total) {
  const double want = static_cast<double>(top_p) * static_cast<double>(total);
  if (!(want > 1.0)) return total == 0 ? 0 : 1;
  if (want >= static_cast<double>(total)) return total;
  uint64_t t = static_cast<uint64_t>(want);
  if (static_cast<double>(t) < want) ++t;
  return t;
}

// ---- candidate order (topn) -------------------------------------------------------------------

// The one order of topn_expand and select_topn_subtree: higher score first, then lower index.
// Index = flat candidate index (parent * V + token) or node index; both break ties towards
// earlier parents / ancestors. NaN never reaches this (callers turn it into -inf).
SPECOPS_HD bool score_before(float sa, int64_t ia, float sb, int64_t ib) {
  return sa > sb || (sa == sb && ia < ib);
}

// A candidate is available iff its score is > -inf (so NaN is not).
SPECOPS_HD bool score_available(float s) { return s > -kInf; }

// ---- select_topn_subtree ------------------------------------------------------------------------

// Effective score of node i of one tree: the minimum of the (NaN -> -inf) scores on the path
// from i up to, but excluding, the root. Non-increasing along every path by construction, so
// the best n nodes under score_before are ancestor-closed. The root gets +inf (always kept),
// padding nodes (i >= n_valid) -inf (never kept). The walk stops at any pointer that does not
// go strictly backwards, so an unchecked malformed tree cannot loop forever.
SPECOPS_HD float subtree_eff_score(const int32_t* parents, const float* scores, int32_t i,
                                   int32_t n_valid) {
  if (i == 0) return kInf;
  if (i >= n_valid) return -kInf;
  float eff = kInf;
  int32_t j = i;
  while (j > 0) {
    const float s = scores[j] == scores[j] ? scores[j] : -kInf;
    eff = s < eff ? s : eff;
    const int32_t p = parents[j];
    if (p < 0 || p >= j) break;
    j = p;
  }
  return eff;
}

}  // namespace specops
