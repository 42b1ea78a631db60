// warp_probs on the CPU: one task per row, no sort. Row pipeline (the rule itself is in
// specops/ops/sampling/; the shared decisions in csrc/sampling_common.h):
//   m = max(logits); z = (logits - m) / t (fp32), so max z = 0  two vector passes
//   top-k: the k-th largest z, counting duplicates          heap scan for k <= 256 (blocks that
//          -> keep z >= it                                  cannot enter are skipped), else
//                                                           radix select on keys, weight 1
//   e = exp(z - max) on the kept set, sum                   one vector pass
//   top-p: radix select on keys weighted by the fixed-point mass of e, over the candidates
//          (the top-k survivors, or the tokens heavy enough to matter) -> keep z >= it
//   probs = e / sum on the kept set, 0 elsewhere             one vector pass
// The streaming loops are 16-lane vector code compiled per ISA level (sampling_simd.h); the
// histogram passes of the radix select are scalar.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../sampling_args.h"
#include "sampling_rows.h"
#include "sampling_simd.h"

namespace specops {
namespace {

// The k-th largest of z[0..V) (counting duplicates) for small k: one pass that keeps the k
// largest values seen in a min-heap and skips blocks of kW that cannot enter it.
float kth_largest_small(const float* z, int64_t V, int64_t k, std::vector<float>& heap) {
  const simd::Loops& loops = simd::loops();
  heap.assign(z, z + k);
  std::make_heap(heap.begin(), heap.end(), std::greater<float>());
  for (int64_t i = k; i < V;) {
    i = loops.next_above(z, i, V, 0.0f, heap.front());
    const int64_t end = std::min<int64_t>(i + simd::kW, V);
    for (; i < end; ++i) {
      if (!(z[i] > heap.front())) continue;
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = z[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  }
  return heap.front();
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

}  // namespace

namespace warp {

struct Scratch {
  std::vector<float> z, heap;
  std::vector<uint32_t> keys;
  std::vector<int32_t> idx;
  std::vector<uint64_t> mass;
  RadixSelect<uint32_t> count_select;
  RadixSelect<uint64_t> mass_select;

  // z is a full row; the selection arrays grow to what a row needs (top-p: its candidates).
  void reserve(int64_t V) {
    if (static_cast<int64_t>(z.size()) < V) z.resize(V);
  }
  void reserve_candidates(int64_t n) {
    if (static_cast<int64_t>(keys.size()) < n) keys.resize(n);
    if (static_cast<int64_t>(idx.size()) < n) idx.resize(n);
    if (static_cast<int64_t>(mass.size()) < n) mass.resize(n);
  }
};

void ScratchDeleter::operator()(Scratch* s) const { delete s; }

std::unique_ptr<Scratch, ScratchDeleter> make_scratch(int64_t V) {
  std::unique_ptr<Scratch, ScratchDeleter> s(new Scratch);
  s->reserve(V);
  return s;
}

const float* scratch_z(const Scratch& s) { return s.z.data(); }

namespace {

// Top-k with k up to this uses the heap scan, above it the radix select.
constexpr int64_t kSmallTopK = 256;

inline const float* as_float(const float* x, int64_t, float*) { return x; }

template <typename scalar_t>
const float* as_float(const scalar_t* x, int64_t V, float* buf) {
  for (int64_t i = 0; i < V; ++i) buf[i] = static_cast<float>(x[i]);
  return buf;
}

}  // namespace

template <typename scalar_t>
RowStats row_stats(const scalar_t* x, int64_t V, float t, int32_t k, float top_p, float* e, Scratch& s) {
  float* z = s.z.data();
  const float* xf = as_float(x, V, z);
  if (greedy_temperature(t)) {
    // Greedy: one-hot at the first maximal logit (NaN never wins).
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (xf[i] > xf[best]) best = i;
    return {0.0f, t, 0.0f, 1.0f, static_cast<int32_t>(best)};
  }
  const simd::Loops& loops = simd::loops();
  // Subtracting the row max before dividing keeps huge logits and tiny temperatures finite.
  const float mx = loops.row_max(xf, V);
  loops.shift_scale(xf, z, V, mx, t);
  const float m = 0.0f;  // max z
  float lo = -kInf;  // keep z >= lo
  if (k > 0 && k < V) {
    if (k <= kSmallTopK) {
      lo = kth_largest_small(z, V, k, s.heap);
    } else {
      s.reserve_candidates(V);
      for (int64_t i = 0; i < V; ++i) s.keys[i] = float_key(z[i]);
      lo = key_float(s.count_select.run(s.keys.data(), nullptr, V, static_cast<uint32_t>(k)));
    }
  }
  double sum = loops.exp_masked(z, e, V, m, lo);
  if (top_p < 1.0f) {
    // The candidates: the top-k survivors, or without top-k every token whose mass can matter.
    // With total mass W and target T, the tokens below any z-threshold whose masses are each
    // < (W - T) / V hold less than W - T together, so the top-p threshold lies above them and
    // dropping them changes nothing. z < m + log((W - T) / V / 2^S) - 1e-3 guarantees that
    // mass bound despite exp's ~2e-7 error (and the dropped set is a down-set in z).
    const int shift = mass_shift(V);
    const float scale = mass_scale(V);
    const uint64_t total = loops.mass_total(e, V, shift);
    const uint64_t target = top_p_target(top_p, total);
    float floor_ = lo;
    const uint64_t slack = (total - target) / static_cast<uint64_t>(V);
    if (lo == -kInf && slack > 0) {
      const double zf = m + std::log(static_cast<double>(slack) / scale) - 1e-3;
      floor_ = std::nextafter(static_cast<float>(zf), -kInf);
    }
    // compact_ge stores one index past the count at most (branch-free append).
    if (static_cast<int64_t>(s.idx.size()) < V + 1) s.reserve_candidates(loops.count_ge(z, V, floor_) + 1);
    const int64_t n = loops.compact_ge(z, V, floor_, s.idx.data());
    for (int64_t j = 0; j < n; ++j) {
      s.keys[j] = float_key(z[s.idx[j]]);
      s.mass[j] = mass_fixed(e[s.idx[j]], scale);
    }
    const float lo_p = key_float(s.mass_select.run(s.keys.data(), s.mass.data(), n, target));
    if (lo_p > lo) {
      lo = lo_p;
      sum = loops.sum_masked(z, e, V, lo);
    }
  }
  return {mx, t, lo, static_cast<float>(sum), -1};
}

void finish_probs(const RowStats& st, float* e, int64_t V, const Scratch& s) {
  if (st.argmax >= 0) {
    std::fill(e, e + V, 0.0f);
    e[st.argmax] = 1.0f;
    return;
  }
  simd::loops().normalize_masked(s.z.data(), e, V, st.lo, st.sum);
}

template <typename scalar_t>
void row_probs(const scalar_t* x, int64_t V, const RowStats& st, float* out, Scratch& s) {
  if (st.argmax < 0) {
    // The passes of row_stats that produce z and e on the kept set (e there does not depend on
    // whether the mask is top-k's or the final one).
    const simd::Loops& loops = simd::loops();
    float* z = s.z.data();
    loops.shift_scale(as_float(x, V, z), z, V, st.m, st.t);
    loops.exp_masked(z, out, V, 0.0f, st.lo);
  }
  finish_probs(st, out, V, s);
}

template <typename scalar_t>
float prob_at(const scalar_t* x, int64_t tok, const RowStats& st) {
  if (st.argmax >= 0) return tok == st.argmax ? 1.0f : 0.0f;
  return simd::loops().prob_at(static_cast<float>(x[tok]), st.m, st.t, st.lo, st.sum);
}

#define SPECOPS_WARP_ROWS(T)                                                                      \
  template RowStats row_stats<T>(const T*, int64_t, float, int32_t, float, float*, Scratch&);   \
  template void row_probs<T>(const T*, int64_t, const RowStats&, float*, Scratch&);             \
  template float prob_at<T>(const T*, int64_t, const RowStats&);
SPECOPS_WARP_ROWS(float)
SPECOPS_WARP_ROWS(at::BFloat16)
SPECOPS_WARP_ROWS(at::Half)
SPECOPS_WARP_ROWS(double)
#undef SPECOPS_WARP_ROWS

}  // namespace warp

namespace {

template <typename scalar_t>
void warp_row(const scalar_t* x,  // [V]
              int64_t V, float t, int32_t k, float top_p,
              float* out,  // [V]
              warp::Scratch& s) {
  finish_probs(warp::row_stats(x, V, t, k, top_p, out, s), out, V, s);
}

void warp_probs_cpu(const warp::Call& c) {
  const at::Tensor& x = c.logits;
  const int64_t V = c.V;
  const int64_t row_stride = x.stride(0);
  const float* t = c.temperature.data_ptr<float>();
  const int32_t* k = c.top_k.data_ptr<int32_t>();
  const float* p = c.top_p.data_ptr<float>();
  float* o = c.out.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "warp_probs_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, c.N, 1, [&](int64_t lo, int64_t hi) {
      // Reused across calls by the pool's threads: no allocation or zeroing per call.
      thread_local warp::Scratch s;
      s.reserve(V);
      s.reserve_candidates(V + 1);
      for (int64_t r = lo; r < hi; ++r) warp_row(xp + r * row_stride, V, t[r], k[r], p[r], o + r * V, s);
    });
  });
}

}  // namespace
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("warp_probs", &specops::warp::entry<specops::CpuDevice, specops::warp_probs_cpu>);
}
