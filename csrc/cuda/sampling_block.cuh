// Block-wide building blocks of the sampling and topn CUDA kernels: reductions, an ordered
// flag scan, a radix select and a sorted block top-m. The decisions inside them (digit choice,
// keys, candidate order) are the __host__ __device__ helpers of csrc/sampling_common.h that
// the CPU backend runs and tests; only the data movement lives here.
//
// Every function must be called by all threads of the block (they contain __syncthreads) and
// assumes blockDim.x is a multiple of 32 and at most 1024.
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

template <typename W>
struct RadixShared {
  W hist[256];
  W above;
  uint32_t prefix;
};

// kappa = max { k : W(key >= k) >= target } over the items i < n, in four 8-bit digits.
// item(i, key) sets the item's key and returns its weight (0: not a candidate).
// W is unsigned int (counts) or unsigned long long (fixed-point mass): the shared-memory
// atomics add integers, so the result does not depend on thread timing.
template <typename W, typename Item>
__device__ uint32_t radix_select(int64_t n, Item item, W target, RadixShared<W>* sh) {
  uint32_t prefix = 0;
  if (threadIdx.x == 0) sh->above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh->hist[b] = 0;
    __syncthreads();
    const uint32_t high = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      uint32_t key;
      const W w = item(i, key);
      if (w != 0 && ((key ^ prefix) & high) == 0) atomicAdd(&sh->hist[(key >> shift) & 255u], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int d = radix_pick<W>(sh->hist, 256, target, &sh->above);
      sh->prefix = prefix | (static_cast<uint32_t>(d) << shift);
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
      static_cast<unsigned int>(got), &sh->radix);
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
