// warp_probs on the CPU: one task per row; the top-k and top-p thresholds are found by
// radix select over order-preserving keys of the scaled logits (expected O(V), no sort).
//
// Row pipeline (see specops/ops/sampling.py for the rule itself):
//   z = logits / t (fp32)            -> max
//   top-k: kappa_k = k-th largest key (weight 1 per token)      -> keep z >= value(kappa_k)
//   e = exp(z - max) on the kept set -> fixed-point mass total
//   top-p: kappa_p = key where the mass from the top reaches top_p -> keep z >= value(kappa_p)
//   probs = e / sum(e) on the kept set, 0 elsewhere.
// The hot loops are plain float loops compiled for AVX-512 / AVX2 / baseline via
// target_clones (the .so must run on machines without AVX-512).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../registration.h"
#include "../sampling_common.h"

#define SPECOPS_SIMD __attribute__((target_clones("avx512f", "avx2,fma", "default")))

namespace specops {
namespace {

// exp(x) for x <= 0 (the only range softmax needs): Cephes-style range reduction and a
// degree-6 polynomial, relative error ~2e-7, branch-free so loops vectorise. Below the
// smallest normal result (x < -87.34, including -inf) it returns 0.
inline float exp_nonpos(float x) {
  const bool under = !(x >= -87.33654f);
  x = std::fmin(std::fmax(x, -87.33654f), 0.0f);
  const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const int32_t n = static_cast<int32_t>(fx);
  const float scale = bits_float(static_cast<uint32_t>(n + 127) << 23);
  return under ? 0.0f : y * scale;
}

// z[i] /= t; returns max(z).
SPECOPS_SIMD float scale_max(float* z, int64_t V, float t) {
  float m = -kInf;
  for (int64_t i = 0; i < V; ++i) {
    z[i] = z[i] / t;
    m = std::fmax(m, z[i]);
  }
  return m;
}

// e[i] = exp(z[i] - m) where z[i] >= lo, else 0; returns the fixed-point mass of e.
SPECOPS_SIMD uint64_t exp_masked(const float* z, float* e, int64_t V, float m, float lo) {
  uint64_t mass = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float v = z[i] >= lo ? exp_nonpos(z[i] - m) : 0.0f;
    e[i] = v;
    mass += mass_fixed(v);
  }
  return mass;
}

SPECOPS_SIMD double sum_masked(const float* z, const float* e, int64_t V, float lo) {
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i) s += z[i] >= lo ? static_cast<double>(e[i]) : 0.0;
  return s;
}

SPECOPS_SIMD void normalize_masked(const float* z, float* e, int64_t V, float lo, float sum) {
  for (int64_t i = 0; i < V; ++i) e[i] = z[i] >= lo ? e[i] / sum : 0.0f;
}

// Radix select on 32-bit keys in digits of 11, 11 and 10 bits. The first pass reads all
// candidates; each later pass reads only those sharing the chosen prefix (compacted).
template <typename W>
class RadixSelect {
 public:
  // keys[i], weights[i] (weights == nullptr: weight 1) for i < n; returns kappa.
  uint32_t run(const uint32_t* keys, const W* weights, int64_t n, W target) {
    constexpr int kShift[3] = {21, 10, 0};
    constexpr int kBins[3] = {2048, 2048, 1024};
    uint32_t prefix = 0;
    W above = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = kShift[pass], nb = kBins[pass];
      hist_.assign(nb, 0);
      for (int64_t i = 0; i < n; ++i)
        hist_[(keys[i] >> shift) & (nb - 1)] += weights ? weights[i] : W(1);
      const int d = radix_pick(hist_.data(), nb, target, &above);
      prefix |= static_cast<uint32_t>(d) << shift;
      if (pass == 2) break;
      // Keep the candidates of digit d for the next, finer pass.
      next_keys_.clear();
      next_weights_.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (static_cast<int>((keys[i] >> shift) & (nb - 1)) != d) continue;
        next_keys_.push_back(keys[i]);
        if (weights) next_weights_.push_back(weights[i]);
      }
      keys_.swap(next_keys_);
      weights_.swap(next_weights_);
      keys = keys_.data();
      weights = weights ? weights_.data() : nullptr;
      n = static_cast<int64_t>(keys_.size());
    }
    return prefix;
  }

 private:
  std::vector<W> hist_, weights_, next_weights_;
  std::vector<uint32_t> keys_, next_keys_;
};

struct RowScratch {
  std::vector<float> z;
  std::vector<uint32_t> keys;
  std::vector<uint64_t> mass;
  RadixSelect<uint32_t> count_select;
  RadixSelect<uint64_t> mass_select;
};

template <typename scalar_t>
void warp_row(const scalar_t* x,  // [V]
              int64_t V, float t, int32_t k, float top_p,
              float* out,  // [V]
              RowScratch& s) {
  float* z = s.z.data();
  for (int64_t i = 0; i < V; ++i) z[i] = static_cast<float>(x[i]);
  if (!(t > 0.0f)) {
    // Greedy: one-hot at the first maximal logit (NaN never wins).
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (z[i] > z[best]) best = i;
    std::fill(out, out + V, 0.0f);
    out[best] = 1.0f;
    return;
  }
  const float m = scale_max(z, V, t);
  float lo = -kInf;  // keep z >= lo
  if (k > 0 && k < V) {
    for (int64_t i = 0; i < V; ++i) s.keys[i] = float_key(z[i]);
    lo = key_float(s.count_select.run(s.keys.data(), nullptr, V, static_cast<uint32_t>(k)));
  }
  const uint64_t total = exp_masked(z, out, V, m, lo);
  if (top_p < 1.0f) {
    // Candidates: the top-k survivors (all tokens without top-k).
    int64_t n = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (!(z[i] >= lo)) continue;
      s.keys[n] = float_key(z[i]);
      s.mass[n] = mass_fixed(out[i]);
      ++n;
    }
    const uint32_t kp = s.mass_select.run(s.keys.data(), s.mass.data(), n, top_p_target(top_p, total));
    lo = std::fmax(lo, key_float(kp));
  }
  const double sum = sum_masked(z, out, V, lo);
  normalize_masked(z, out, V, lo, static_cast<float>(sum));
}

at::Tensor warp_probs_cpu(const at::Tensor& logits,       // [N, V] fp32/bf16/fp16
                          const at::Tensor& temperature,  // [N] fp32
                          const at::Tensor& top_k,        // [N] int32
                          const at::Tensor& top_p)        // [N] fp32
{
  SPECOPS_CHECK_DIM(logits, 2);
  SPECOPS_CHECK_DTYPE(temperature, at::kFloat);
  SPECOPS_CHECK_DTYPE(top_k, at::kInt);
  SPECOPS_CHECK_DTYPE(top_p, at::kFloat);
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(temperature.numel() == N && top_k.numel() == N && top_p.numel() == N,
              "warp_probs: temperature, top_k and top_p must have shape [N]");
  TORCH_CHECK(V >= 1 || N == 0, "warp_probs: logits must have V >= 1");
  auto x = logits.stride(1) == 1 ? logits : logits.contiguous();
  auto tt = temperature.contiguous();
  auto kk = top_k.contiguous();
  auto pp = top_p.contiguous();
  auto out = at::empty({N, V}, logits.options().dtype(at::kFloat));  // [N, V]
  if (N == 0 || V == 0) return out;
  const int64_t row_stride = x.stride(0);
  const float* t = tt.data_ptr<float>();
  const int32_t* k = kk.data_ptr<int32_t>();
  const float* p = pp.data_ptr<float>();
  float* o = out.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "warp_probs_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, N, 1, [&](int64_t lo, int64_t hi) {
      RowScratch s;
      s.z.resize(V);
      s.keys.resize(V);
      s.mass.resize(V);
      for (int64_t r = lo; r < hi; ++r) warp_row(xp + r * row_stride, V, t[r], k[r], p[r], o + r * V, s);
    });
  });
  return out;
}

}  // namespace
}  // namespace specops

TORCH_LIBRARY_FRAGMENT(specops, m) {
  m.def("warp_probs(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p) -> Tensor");
}

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("warp_probs", &specops::warp_probs_cpu); }
