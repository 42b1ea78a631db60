// Block-wide building blocks of the sampling and topn CUDA kernels: reductions, an ordered
// flag scan, a radix select and a sorted block top-m. The decisions inside them (keys, candidate
// order, fixed-point mass) are the __host__ __device__ helpers of csrc/sampling_common.h that
// the CPU backend runs and tests; the digit choice is radix_pick's, computed by one warp in
// parallel (pick_digit); only the data movement lives here.
//
// Every function must be called by all threads of the block (they contain __syncthreads), unless
// it says otherwise, and assumes blockDim.x is a multiple of 32 and at most 1024 (512 for the
// radix select and top_sorted).
#pragma once

#include <cstdint>

#include "../sampling_common.h"

namespace specops {
namespace block {

struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

// Reduces v over the block; every thread gets the result. Deterministic: a fixed shuffle
// tree per warp, then the warp results in warp order. scratch: shared T[32].
template <typename T, typename Op>
__device__ T reduce(T v, Op op, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < nwarps; ++w) r = op(r, scratch[w]);
  return r;
}

// Exclusive prefix count of `flag` in thread order; *total gets the block's count.
// scratch: shared int[32].
__device__ inline int scan_flags(bool flag, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();
  if (lane == 0) scratch[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < nwarps; ++w) {
    before += w < warp ? scratch[w] : 0;
    all += scratch[w];
  }
  *total = all;
  return before + in_warp;
}

// ---- radix select ------------------------------------------------------------------------
//
// A pass histograms one 8-bit digit of the keys of the remaining candidates. Each warp adds
// into its own sub-histogram, and each thread first merges consecutive items that land in the
// same bin into one add: keys concentrated in a few bins (the exponent digit of a row of logits,
// long runs of ties) no longer serialise the block on a handful of shared-memory words. The
// sub-histograms are summed after the pass and warp 0 picks the digit in parallel. The adds are
// integer, so the histogram, and hence every decision, does not depend on thread timing.

constexpr int kRadixWarps = 16;  // sub-histograms: blocks of up to 512 threads
constexpr int kRadixBins = 256;

template <typename W>
struct RadixShared {
  W sub[kRadixWarps][kRadixBins];  // per-warp sub-histograms (zero between passes)
  W hist[kRadixBins];              // their sum
  W above, target;
  uint32_t prefix;
};

// The digit of radix_pick (csrc/sampling_common.h), found by the 32 lanes of one warp together:
// lane L owns the bins 255 - 8L down to 248 - 8L, a shuffle scan gives the weight above each
// lane's bins, and the first lane (from the top) whose bins reach the target holds the digit.
// Identical to radix_pick for non-negative weights. With `first`, the target is
// target_of_total(sum of the histogram) (top-p: the total mass of the candidates); it is kept in
// *target. Updates *above as radix_pick does. All 32 lanes of the warp must call it.
template <typename W, typename TargetOf>
__device__ int pick_digit(const W* hist, TargetOf target_of_total, bool first, W* above, W* target) {
  const int lane = threadIdx.x & 31;
  const int top = kRadixBins - 1 - 8 * lane;
  W own = 0;
  for (int j = 0; j < 8; ++j) own += hist[top - j];
  W incl = own;
  for (int off = 1; off < 32; off <<= 1) {
    const W up = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += up;
  }
  const W total = __shfl_sync(0xffffffffu, incl, 31);
  const W goal = first ? static_cast<W>(target_of_total(total)) : *target;
  W acc = *above + (incl - own);
  int found = -1;
  W found_above = 0;
  for (int j = 0; j < 8 && found < 0; ++j) {
    const int d = top - j;
    if (d > 0 && acc + hist[d] >= goal) {
      found = d;
      found_above = acc;
    }
    acc += hist[d];
  }
  const unsigned hits = __ballot_sync(0xffffffffu, found >= 0);
  int digit = 0;
  W new_above = *above + total - hist[0];  // no digit > 0 reaches the goal: radix_pick returns 0
  if (hits != 0) {  // warp-uniform
    const int winner = __ffs(static_cast<int>(hits)) - 1;
    digit = __shfl_sync(0xffffffffu, found, winner);
    new_above = __shfl_sync(0xffffffffu, found_above, winner);
  }
  *above = new_above;
  *target = goal;
  return digit;
}

// Adds the weights of items [begin, end) (strided over the block) whose key matches `prefix`
// above bit shift + 8 into sub[(key >> shift) & 255]: this warp's sub-histogram. Each thread
// merges runs of items in the same bin into one shared-memory atomic.
template <typename W, typename Item>
__device__ void radix_histogram(int64_t begin, int64_t end, Item item, uint32_t prefix, int shift, W* sub) {
  const uint32_t high = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
  int run_bin = 0;
  W run = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    uint32_t key;
    const W w = item(i, key);
    if (w == 0 || ((key ^ prefix) & high) != 0) continue;
    const int b = static_cast<int>((key >> shift) & 255u);
    if (b != run_bin) {
      if (run != 0) atomicAdd(&sub[run_bin], run);
      run_bin = b;
      run = 0;
    }
    run += w;
  }
  if (run != 0) atomicAdd(&sub[run_bin], run);
}

// hist[b] = sum over warps of sub[w][b], and sub back to zero for the next pass. The
// sub-histograms must be complete (a barrier after radix_histogram); hist is ready after the
// next barrier.
template <typename W, typename H>
__device__ void radix_reduce(W (*sub)[kRadixBins], H* hist) {
  const int nwarps = blockDim.x >> 5;
  for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) {
    H s = 0;
    for (int w = 0; w < nwarps; ++w) {
      s += sub[w][b];
      sub[w][b] = 0;
    }
    hist[b] = s;
  }
}

template <typename W>
__device__ void radix_clear(W (*sub)[kRadixBins]) {
  for (int i = threadIdx.x; i < kRadixWarps * kRadixBins; i += blockDim.x) sub[i / kRadixBins][i % kRadixBins] = 0;
}

// kappa = max { k : W(key >= k) >= target } over the items i < n, in four 8-bit digits, with
// target = target_of_total(total weight of the items). item(i, key) sets the item's key and
// returns its weight (0: not a candidate). W is unsigned int (counts) or unsigned long long
// (fixed-point mass). Requires blockDim.x <= 32 * kRadixWarps.
template <typename W, typename Item, typename TargetOf>
__device__ uint32_t radix_select(int64_t n, Item item, TargetOf target_of_total, RadixShared<W>* sh) {
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // a previous user of the shared memory (a union member) may still read it
  radix_clear(sh->sub);
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    __syncthreads();  // sub-histograms zero, the previous digit published
    radix_histogram<W>(0, n, item, prefix, shift, sh->sub[warp]);
    __syncthreads();
    radix_reduce(sh->sub, sh->hist);
    __syncthreads();
    if (warp == 0) {
      W above = shift == 24 ? W(0) : sh->above, target = sh->target;
      const int d = pick_digit<W>(sh->hist, target_of_total, shift == 24, &above, &target);
      __syncwarp();  // every lane has read sh->above / sh->target (a shuffle orders lanes only in practice)
      if (threadIdx.x == 0) {
        sh->above = above;
        sh->target = target;
        sh->prefix = prefix | (static_cast<uint32_t>(d) << shift);
      }
    }
    __syncthreads();
    prefix = sh->prefix;
  }
  return prefix;
}

// top_sorted holds up to kTopItems items per thread while it sorts in place.
constexpr int kTopItems = 4;

struct TopShared {
  RadixShared<unsigned int> radix;
  int scan[32];
  unsigned int count[32];
  int taken;
};

// The best m available items of a row under score_before (score desc, index asc), sorted.
// score(i) gives item i's score for i < n (available iff > -inf). Writes the sorted scores and
// indices to out_score[0..got) / out_idx[0..got) (shared, capacity >= m) and returns
// got = min(m, available items). Requires m <= kTopItems * blockDim.x.
template <typename Score>
__device__ int top_sorted(int64_t n, int m, Score score, float* sel_score, int64_t* sel_idx,
                          TopShared* sh) {
  unsigned int avail = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) avail += score_available(score(i)) ? 1u : 0u;
  avail = reduce(avail, Sum(), sh->count);
  const int got = static_cast<int>(avail < static_cast<unsigned int>(m) ? avail : m);
  if (got == 0) return 0;
  const uint32_t kappa = radix_select<unsigned int>(
      n,
      [&](int64_t i, uint32_t& key) {
        const float s = score(i);
        key = float_key(s);
        return score_available(s) ? 1u : 0u;
      },
      [&](unsigned int) { return static_cast<unsigned int>(got); }, &sh->radix);
  // Items above kappa all make it; of those at kappa, the lowest indices fill the rest.
  unsigned int above = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = score(i);
    above += (score_available(s) && float_key(s) > kappa) ? 1u : 0u;
  }
  above = reduce(above, Sum(), sh->count);
  const int need = got - static_cast<int>(above);
  if (threadIdx.x == 0) sh->taken = 0;
  int eq_base = 0;
  for (int64_t start = 0; start < n; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    const float s = i < n ? score(i) : -kInf;
    const bool ok = score_available(s);
    const uint32_t key = float_key(s);
    const bool at = ok && key == kappa;
    int eq_total;
    const int eq_rank = eq_base + scan_flags(at, sh->scan, &eq_total);
    if ((ok && key > kappa) || (at && eq_rank < need)) {
      const int slot = atomicAdd(&sh->taken, 1);
      sel_score[slot] = s;
      sel_idx[slot] = i;
    }
    eq_base += eq_total;
  }
  __syncthreads();
  // Sort the got items by counting, for each, the items that come before it.
  float my_s[kTopItems];
  int64_t my_i[kTopItems];
  int my_rank[kTopItems];
  for (int r = 0; r < kTopItems; ++r) {
    const int j = r * blockDim.x + threadIdx.x;
    if (j < got) {
      my_s[r] = sel_score[j];
      my_i[r] = sel_idx[j];
      int rank = 0;
      for (int q = 0; q < got; ++q) rank += score_before(sel_score[q], sel_idx[q], my_s[r], my_i[r]) ? 1 : 0;
      my_rank[r] = rank;
    }
  }
  __syncthreads();
  for (int r = 0; r < kTopItems; ++r) {
    const int j = r * blockDim.x + threadIdx.x;
    if (j < got) {
      sel_score[my_rank[r]] = my_s[r];
      sel_idx[my_rank[r]] = my_i[r];
    }
  }
  __syncthreads();
  return got;
}

}  // namespace block
}  // namespace specops
