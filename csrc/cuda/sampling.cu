// warp_probs on CUDA. Same rule and same decisions as the CPU kernel (csrc/sampling_common.h):
// z = (x - max x) / t, top-k and top-p thresholds on order-preserving keys of z found by radix
// selects over four 8-bit digits (weight 1 for top-k, fixed-point mass for top-p), then
// exp(z) / sum over the kept set.
//
// Two launch plans, picked by the launcher from N, V and the SM count:
//  * one block per row (V < kSplitMinV, or enough rows to fill the GPU): the row is streamed
//    from global memory (L2) once per pass: max, 4 digit passes for top-k, 4 for top-p (the
//    first also gives the mass total), the kept sum and the write.
//  * split rows (V >= kSplitMinV and few rows): a grid of (chunk, row) blocks and one launch per
//    pass. Blocks histogram their chunk into a per-row global histogram [N, 8, 256] (integer
//    atomics: order-independent); the next launch's blocks each pick the digit from it (the same
//    pick_digit, so every block of a row agrees) and block 0 records the row's radix state.
//    Row max and kept sum go through per-chunk partials reduced in a fixed order.
//
// Roofline model (not a measurement; V = 128K fp32 logits, temperature, top-k and top-p on; an SM
// is assumed to draw its share of HBM bandwidth, 3.35 TB/s / 132 on the H100, 2.0 TB/s / 108 on
// the A100): both plans read the row 11 times and write it once, 6.3 MB per row (the old kernel
// 13 passes, 6.8 MB: a separate mass-total pass). N = 64: one block per row keeps 64 SMs busy,
// 269 us (H100) / 368 us (A100) before; the split plan (5 chunks per row; 4 on the A100) all of
// them: 120 us / 201 us. N = 1: one SM, 269 us / 368 us before; 16 chunks now, 15.5 us / 21 us
// plus 11 launches. The old shared-memory histogram also serialised about V / 3 atomics on each
// of the few bins the exponent digit uses; the per-warp, run-merged one adds about one per thread
// and bin change.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <type_traits>

#include "gpu.cuh"
#include "../sampling_args.h"
#include "sampling_block.cuh"
#include "sampling_stats.cuh"

namespace specops {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kSplitMinV = 32768;  // smaller rows: one block per row
constexpr int64_t kMinChunk = 8192;    // tokens per block at least, in the split plan
constexpr int kPasses = 8;             // digit passes: 4 for top-k, 4 for top-p

__device__ bool top_k_on(int32_t k, int64_t V) { return k > 0 && k < V; }
__device__ bool top_p_on(float p) { return p < 1.0f; }

// z = (x - max x) / t, each operation rounded on its own (as on every backend); x masked by words
// (nullptr: none).
template <typename scalar_t>
__device__ float scaled(const scalar_t* x, int64_t i, float mx, float t, const int32_t* words) {
  return __fdiv_rn(__fsub_rn(logit_at(x, i, words), mx), t);
}

// ---- one block per row ----------------------------------------------------------------------

// Four resident blocks per SM (32 registers a thread), as before the bitmask reads: without the
// bound, ptxas takes 40 on sm_90 for the masked loads and three blocks fit.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads, 4)
    warp_probs_kernel(const scalar_t* __restrict__ logits,  // [N, V], row stride row_stride
                      int64_t row_stride,
                      const float* __restrict__ temperature,  // [N]
                      const int32_t* __restrict__ top_k,      // [N]
                      const float* __restrict__ top_p,        // [N]
                      float* out,                             // [N, V], or nullptr with stats
                      WarpRowStats* stats,                    // [N] (verify_tree_logits), or nullptr
                      RowMask mask,                           // verify_tree_logits' bitmask, or none
                      int64_t V) {
  __shared__ float s_float[32];
  __shared__ long long s_index[32];
  // The two selects run one after the other: their shared memory overlaps.
  __shared__ union {
    block::RadixShared<unsigned int> count;
    block::RadixShared<unsigned long long> mass;
  } s_select;

  const int64_t row = blockIdx.x;
  const scalar_t* x = logits + row * row_stride;
  const int32_t* w = mask.row(row);
  float* o = out + row * V;
  const float t = temperature[row];

  if (greedy_temperature(t)) {
    // Greedy: the first index of the maximal logit (NaN never wins).
    float best = -kInf;
    long long idx = V;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float v = logit_at(x, i, w);
      if (v > best || (idx == V && v == best)) {
        best = v;
        idx = i;
      }
    }
    const float m = block::reduce(best, block::Max(), s_float);
    long long am = block::reduce(best == m ? idx : static_cast<long long>(V), block::Min(), s_index);
    if (am >= V) am = 0;
    if (stats) {
      if (threadIdx.x == 0) stats[row] = {0.0f, 1.0f, 0u, static_cast<int32_t>(am)};
      return;
    }
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) o[i] = i == am ? 1.0f : 0.0f;
    return;
  }

  // Subtracting the row max first keeps huge logits and tiny temperatures finite; max z = 0, so
  // the unnormalised probabilities are exp(z).
  float mx = -kInf;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, logit_at(x, i, w));
  mx = block::reduce(mx, block::Max(), s_float);
  auto z = [&](int64_t i) { return scaled(x, i, mx, t, w); };
  const float scale = mass_scale(V);

  uint32_t kappa = 0;  // keep float_key(z) >= kappa
  const int32_t k = top_k[row];
  if (top_k_on(k, V)) {
    kappa = block::radix_select<unsigned int>(
        V,
        [&](int64_t i, uint32_t& key) {
          key = float_key(z(i));
          return 1u;
        },
        [&](unsigned int) { return static_cast<unsigned int>(k); }, &s_select.count);
  }
  const float p = top_p[row];
  if (top_p_on(p)) {
    // The first digit pass sums the candidates' mass: the target follows from it.
    const uint32_t kp = block::radix_select<unsigned long long>(
        V,
        [&](int64_t i, uint32_t& key) {
          const float zi = z(i);
          key = float_key(zi);
          return key >= kappa ? static_cast<unsigned long long>(mass_fixed(expf(zi), scale)) : 0ull;
        },
        [&](unsigned long long total) { return static_cast<unsigned long long>(top_p_target(p, total)); },
        &s_select.mass);
    kappa = kp > kappa ? kp : kappa;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float zi = z(i);
    sum += float_key(zi) >= kappa ? expf(zi) : 0.0f;
  }
  sum = block::reduce(sum, block::Sum(), s_float);
  if (stats) {
    if (threadIdx.x == 0) stats[row] = {mx, sum, kappa, -1};
    return;
  }
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) o[i] = warped_value(x, i, mx, t, kappa, sum, w);
}

// ---- split rows: (chunk, row) blocks, one launch per pass -------------------------------------

// A row's radix state after some digit picks (global [N, kPasses + 1]: slot j after j picks).
struct RowState {
  unsigned long long above, target;
  uint32_t prefix;  // digits picked so far of the select in progress
  uint32_t kappa;   // keep float_key(z) >= kappa: 0, then top-k's key, then max with top-p's
};

template <typename scalar_t>
struct Split {
  const scalar_t* logits;  // [N, V], row stride row_stride
  int64_t row_stride;
  const float* temperature;  // [N]
  const int32_t* top_k;      // [N]
  const float* top_p;        // [N]
  float* out;                // [N, V], or nullptr with stats
  WarpRowStats* stats;       // [N] (verify_tree_logits: the statistics instead of the rows), or nullptr
  RowMask mask;              // verify_tree_logits' bitmask, or none
  int64_t V, chunk;          // block x covers [x * chunk, min(V, (x + 1) * chunk))
  float* part_max;           // [N, C] chunk maxima of the logits
  long long* part_arg;       // [N, C] first index of the chunk maximum (greedy rows)
  float* part_sum;           // [N, C] chunk sums of the kept exp(z)
  unsigned long long* hist;  // [N, kPasses, 256] row histograms, zeroed by the max launch
  RowState* state;           // [N, kPasses + 1]
};

struct SplitShared {
  unsigned long long hist[block::kRadixBins];
  RowState st;
  float f32[32];
  long long i64[32];
};

// Applies pick j (0-3: top-k's digits, 4-7: top-p's) to st. Called by the 32 lanes of warp 0.
__device__ RowState apply_pick(RowState st, const unsigned long long* hist, int j, int32_t k, float p, int64_t V) {
  const int shift = 24 - 8 * (j & 3);
  const bool on = j < 4 ? top_k_on(k, V) : top_p_on(p);
  if (on) {
    const int d = block::pick_digit<unsigned long long>(
        hist,
        [&](unsigned long long total) {
          return j < 4 ? static_cast<unsigned long long>(k) : static_cast<unsigned long long>(top_p_target(p, total));
        },
        (j & 3) == 0, &st.above, &st.target);
    st.prefix |= static_cast<uint32_t>(d) << shift;
  }
  if (j == 3) {  // top-k done: its key is the floor of the top-p candidates
    st.kappa = on ? st.prefix : 0u;
    st.prefix = 0;
    st.above = 0;
  } else if (j == 7 && on) {
    st.kappa = st.prefix > st.kappa ? st.prefix : st.kappa;
  }
  return st;
}

// The row's state after `picks` picks: slot picks - 1 (written by the previous launch) and that
// launch's histogram give slot picks, which block 0 of the row records. All threads call it.
template <typename scalar_t>
__device__ RowState row_state(const Split<scalar_t>& a, int64_t row, int picks, int32_t k, float p, SplitShared& sh) {
  if (picks == 0) return RowState{};
  const unsigned long long* h = a.hist + (row * kPasses + picks - 1) * block::kRadixBins;
  for (int b = threadIdx.x; b < block::kRadixBins; b += blockDim.x) sh.hist[b] = h[b];
  const RowState prev = picks == 1 ? RowState{} : a.state[row * (kPasses + 1) + picks - 1];
  __syncthreads();
  if (threadIdx.x < 32) {
    const RowState st = apply_pick(prev, sh.hist, picks - 1, k, p, a.V);
    if (threadIdx.x == 0) {
      sh.st = st;
      if (blockIdx.x == 0) a.state[row * (kPasses + 1) + picks] = st;
    }
  }
  __syncthreads();
  return sh.st;
}

// max over the row's chunk maxima (exact in any order).
template <typename scalar_t>
__device__ float row_max(const Split<scalar_t>& a, int64_t row, SplitShared& sh) {
  float m = -kInf;
  for (int64_t c = threadIdx.x; c < gridDim.x; c += blockDim.x) m = fmaxf(m, a.part_max[row * gridDim.x + c]);
  return block::reduce(m, block::Max(), sh.f32);
}

// Chunk maxima (and, for greedy rows, the first index of each); block 0 of a row also clears
// the row's histograms for the digit passes.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) warp_probs_max_kernel(Split<scalar_t> a) {
  __shared__ SplitShared sh;
  const int64_t row = blockIdx.y, V = a.V;
  const scalar_t* x = a.logits + row * a.row_stride;
  const int32_t* w = a.mask.row(row);
  const int64_t begin = blockIdx.x * a.chunk, end = min(V, begin + a.chunk);
  if (blockIdx.x == 0) {
    unsigned long long* h = a.hist + row * kPasses * block::kRadixBins;
    for (int b = threadIdx.x; b < kPasses * block::kRadixBins; b += blockDim.x) h[b] = 0;
  }
  float best = -kInf;  // NaN never wins, as in the one-block greedy path
  long long idx = V;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = logit_at(x, i, w);
    if (v > best || (idx == V && v == best)) {
      best = v;
      idx = i;
    }
  }
  const float m = block::reduce(best, block::Max(), sh.f32);
  const long long am = block::reduce(best == m ? idx : static_cast<long long>(V), block::Min(), sh.i64);
  if (threadIdx.x == 0) {
    a.part_max[row * gridDim.x + blockIdx.x] = m;
    a.part_arg[row * gridDim.x + blockIdx.x] = am;
  }
}

// Digit pass `pass` (0-3: top-k, kMass false; 4-7: top-p, kMass true) over the block's chunk.
template <typename scalar_t, bool kMass>
__global__ void __launch_bounds__(kThreads) warp_probs_pass_kernel(Split<scalar_t> a, int pass) {
  using W = std::conditional_t<kMass, unsigned long long, unsigned int>;  // shared-memory counters
  __shared__ SplitShared sh;
  __shared__ W sub[block::kRadixWarps][block::kRadixBins];
  const int64_t row = blockIdx.y, V = a.V;
  const float t = a.temperature[row];
  if (greedy_temperature(t)) return;  // row-uniform: the whole block leaves
  const int32_t k = a.top_k[row];
  const float p = a.top_p[row];
  const RowState st = row_state(a, row, pass, k, p, sh);
  if (!(pass < 4 ? top_k_on(k, V) : top_p_on(p))) return;
  const float mx = row_max(a, row, sh);
  const scalar_t* x = a.logits + row * a.row_stride;
  const int32_t* w = a.mask.row(row);
  const float scale = mass_scale(V);
  const int64_t begin = blockIdx.x * a.chunk, end = min(V, begin + a.chunk);
  block::radix_clear(sub);
  __syncthreads();
  block::radix_histogram<W>(
      begin, end,
      [&](int64_t i, uint32_t& key) {
        const float zi = scaled(x, i, mx, t, w);
        key = float_key(zi);
        if constexpr (!kMass) return W(1);
        else return key >= st.kappa ? static_cast<W>(mass_fixed(expf(zi), scale)) : W(0);
      },
      st.prefix, 24 - 8 * (pass & 3), sub[threadIdx.x >> 5]);
  __syncthreads();
  block::radix_reduce(sub, sh.hist);
  __syncthreads();
  unsigned long long* h = a.hist + (row * kPasses + pass) * block::kRadixBins;
  for (int b = threadIdx.x; b < block::kRadixBins; b += blockDim.x)
    if (sh.hist[b] != 0) atomicAdd(&h[b], sh.hist[b]);
}

// Chunk sums of exp(z) over the kept set (after the last pick).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) warp_probs_sum_kernel(Split<scalar_t> a) {
  __shared__ SplitShared sh;
  const int64_t row = blockIdx.y, V = a.V;
  const float t = a.temperature[row];
  if (greedy_temperature(t)) return;
  const RowState st = row_state(a, row, kPasses, a.top_k[row], a.top_p[row], sh);
  const float mx = row_max(a, row, sh);
  const scalar_t* x = a.logits + row * a.row_stride;
  const int32_t* w = a.mask.row(row);
  const int64_t begin = blockIdx.x * a.chunk, end = min(V, begin + a.chunk);
  float sum = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float zi = scaled(x, i, mx, t, w);
    sum += float_key(zi) >= st.kappa ? expf(zi) : 0.0f;
  }
  sum = block::reduce(sum, block::Sum(), sh.f32);
  if (threadIdx.x == 0) a.part_sum[row * gridDim.x + blockIdx.x] = sum;
}

// The output: exp(z) / sum over the kept set, or the greedy one-hot.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) warp_probs_write_kernel(Split<scalar_t> a) {
  __shared__ SplitShared sh;
  const int64_t row = blockIdx.y, V = a.V, C = gridDim.x;
  const scalar_t* x = a.logits + row * a.row_stride;
  float* o = a.out + row * V;
  const int64_t begin = blockIdx.x * a.chunk, end = min(V, begin + a.chunk);
  const float t = a.temperature[row];
  const float mx = row_max(a, row, sh);
  if (greedy_temperature(t)) {
    long long am = V;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      if (a.part_max[row * C + c] == mx) am = min(am, a.part_arg[row * C + c]);
    am = block::reduce(am, block::Min(), sh.i64);
    if (am >= V) am = 0;
    if (a.stats) {
      if (blockIdx.x == 0 && threadIdx.x == 0) a.stats[row] = {0.0f, 1.0f, 0u, static_cast<int32_t>(am)};
      return;
    }
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) o[i] = i == am ? 1.0f : 0.0f;
    return;
  }
  const uint32_t kappa = a.state[row * (kPasses + 1) + kPasses].kappa;
  float sum = 0.0f;  // a fixed order: the same in every block of the row
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += a.part_sum[row * C + c];
  sum = block::reduce(sum, block::Sum(), sh.f32);
  if (a.stats) {
    if (blockIdx.x == 0 && threadIdx.x == 0) a.stats[row] = {mx, sum, kappa, -1};
    return;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    o[i] = warped_value(x, i, mx, t, kappa, sum, a.mask.row(row));
}

// Blocks per row of the split plan (1: one block per row). Enough blocks for about two per SM,
// none smaller than kMinChunk tokens.
int64_t split_chunks(int64_t N, int64_t V, int sms) {
  if (V < kSplitMinV || N >= 2 * sms) return 1;
  const int64_t want = ceil_div(2 * sms, N);
  const int64_t most = V / kMinChunk;
  return want < most ? want : most;
}

template <typename scalar_t>
void launch_split(const Split<scalar_t>& a, int64_t N, int64_t C, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(N));
  SPECOPS_LAUNCH(grid, kThreads, 0, stream, warp_probs_max_kernel<scalar_t>)(a);
  SPECOPS_LAUNCH_CHECK();
  for (int pass = 0; pass < kPasses; ++pass) {
    if (pass < 4) {
      SPECOPS_LAUNCH(grid, kThreads, 0, stream, warp_probs_pass_kernel<scalar_t, false>)(a, pass);
    } else {
      SPECOPS_LAUNCH(grid, kThreads, 0, stream, warp_probs_pass_kernel<scalar_t, true>)(a, pass);
    }
    SPECOPS_LAUNCH_CHECK();
  }
  SPECOPS_LAUNCH(grid, kThreads, 0, stream, warp_probs_sum_kernel<scalar_t>)(a);
  SPECOPS_LAUNCH_CHECK();
  SPECOPS_LAUNCH(grid, kThreads, 0, stream, warp_probs_write_kernel<scalar_t>)(a);
  SPECOPS_LAUNCH_CHECK();
}

// warp_probs' launch plan for logits [N, V]: the rows into out, or their statistics into stats
// (of the rows masked by mask, where it has words).
void launch_warp(const at::Tensor& x, const at::Tensor& tt, const at::Tensor& kk, const at::Tensor& pp, float* out,
                 WarpRowStats* stats, const RowMask& mask) {
  const int64_t N = x.size(0), V = x.size(1);
  int sms = 0;
  SPECOPS_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()));
  const int64_t C = split_chunks(N, V, sms);
  const auto stream = gpu::current_stream();
  if (C == 1) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "warp_probs_cuda", [&] {
      SPECOPS_LAUNCH(N, kThreads, 0, stream, warp_probs_kernel<scalar_t>)(
          x.data_ptr<scalar_t>(), x.stride(0), tt.data_ptr<float>(), kk.data_ptr<int32_t>(), pp.data_ptr<float>(),
          out, stats, mask, V);
    });
    SPECOPS_LAUNCH_CHECK();
    return;
  }
  // Scratch of the split plan: chunk partials, row histograms and radix states (one allocation).
  const int64_t words = 3 * N * C + N * kPasses * block::kRadixBins +
                        N * (kPasses + 1) * static_cast<int64_t>(sizeof(RowState) / 8);
  auto scratch = at::empty({words}, x.options().dtype(at::kLong));
  auto* base = reinterpret_cast<unsigned long long*>(scratch.data_ptr<int64_t>());
  const int64_t chunk = ceil_div(V, C);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "warp_probs_cuda", [&] {
    Split<scalar_t> a{x.data_ptr<scalar_t>(), x.stride(0), tt.data_ptr<float>(), kk.data_ptr<int32_t>(),
                      pp.data_ptr<float>(), out, stats, mask, V, chunk,
                      reinterpret_cast<float*>(base),                    // part_max: N * C words (half used)
                      reinterpret_cast<long long*>(base + N * C),        // part_arg
                      reinterpret_cast<float*>(base + 2 * N * C),        // part_sum (half used)
                      base + 3 * N * C,                                  // hist
                      reinterpret_cast<RowState*>(base + 3 * N * C + N * kPasses * block::kRadixBins)};
    launch_split(a, N, ceil_div(V, chunk), stream);
  });
}

void warp_probs_cuda(const warp::Call& c) {
  launch_warp(c.logits, c.temperature, c.top_k, c.top_p, c.out.data_ptr<float>(), nullptr, RowMask{});
}

}  // namespace

void warp_row_stats(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                    const at::Tensor& top_p, WarpRowStats* out, const RowMask& mask) {
  if (logits.size(0) == 0) return;
  launch_warp(logits, temperature, top_k, top_p, nullptr, out, mask);
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  m.impl("warp_probs", &specops::warp::entry<specops::GpuDevice, specops::warp_probs_cuda>);
}
