// The block-wide machinery of the CUDA verification kernels (csrc/cuda/verify.cu): reductions,
// scans and the inverse-CDF draw over a thread block, and the engine that runs the shared walks of
// ../verify_common.h on one sequence per block, over dense probability rows (verify_tree) or rows
// warped from logits on the fly (verify_tree_logits). Every thread runs the walk redundantly (so
// all of them reach the V-wide calls together); the engine does those calls cooperatively:
// strided loops, int64 fixed-point block sums and scans (exact, so the reduction order cannot
// change a decision). Tree bookkeeping that the walk writes (e.single) runs on thread 0 between
// barriers.
#pragma once

#include <climits>

#include "gpu.cuh"
#include "../verify_common.h"
#include "sampling_stats.cuh"

namespace specops {
namespace verify {
namespace cuda {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Per-block scratch for reductions.
struct Shared {
  int64_t i64[kWarps];
  float f32[kWarps];
  int32_t i32[kWarps];
  int64_t chunk[kThreads];  // block_sample's chunk totals
  int64_t base;             // block_sample: the running sum before the chosen chunk
};

__device__ int64_t block_sum(int64_t v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFull, v, o);
  __syncthreads();  // the previous reader of sh is done
  if ((threadIdx.x & 31) == 0) sh.i64[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.i64[w];
  return total;
}

__device__ int32_t block_min(int32_t v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_down_sync(kFull, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.i32[threadIdx.x >> 5] = v;
  __syncthreads();
  int32_t m = INT_MAX;
  for (int w = 0; w < kWarps; ++w) m = min(m, sh.i32[w]);
  return m;
}

// Inclusive scan of one int64 per thread over the block; *total gets the block's sum.
__device__ int64_t block_scan(int64_t v, Shared& sh, int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t up = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += up;
  }
  __syncthreads();
  if (lane == 31) sh.i64[warp] = v;
  __syncthreads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.i64[w];
    all += sh.i64[w];
  }
  *total = all;
  return v + before;
}

// Inverse-CDF draw over weight(i), i < V, whose sum is W: the first index whose running sum
// exceeds the threshold. Two levels instead of a walk over V in block-wide steps: the row is cut
// into at most kThreads chunks of L tokens (a multiple of 32), each warp sums whole chunks with
// coalesced loads, one block scan over the chunk totals finds the chunk where the running sum
// passes the threshold, and a block scan inside that chunk the token: about six barriers for any
// V, where the walk took four per kThreads tokens (about a thousand at V = 128K). The weights
// are non-negative integers, so the result is the walk's (and the CPU kernel's) exactly.
template <class Weight>
__device__ int32_t block_sample(int64_t V, int64_t W, float u, Weight&& weight, Shared& sh) {
  if (W <= 0) return 0;
  const int64_t t = sample_threshold(u, W);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t L = ceil_div(ceil_div(V, kThreads), 32) * 32;
  const int64_t chunks = ceil_div(V, L);  // <= kThreads
  __syncthreads();  // a previous reader of sh.chunk is done
  for (int64_t c = warp; c < chunks; c += kWarps) {
    const int64_t end = min(V, (c + 1) * L);
    int64_t s = 0;
    for (int64_t i = c * L + lane; i < end; i += 32) s += weight(i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    if (lane == 0) sh.chunk[c] = s;
  }
  __syncthreads();
  const bool mine = threadIdx.x < chunks;
  int64_t all;
  const int64_t incl = block_scan(mine ? sh.chunk[threadIdx.x] : 0, sh, &all);
  const int32_t c = block_min(mine && incl > t ? static_cast<int32_t>(threadIdx.x) : INT_MAX, sh);
  if (c == INT_MAX) return static_cast<int32_t>(V - 1);  // W overstated the weights
  if (static_cast<int32_t>(threadIdx.x) == c) sh.base = incl - sh.chunk[c];
  __syncthreads();
  int64_t run = sh.base;
  const int64_t end = min(V, (c + 1) * L);
  for (int64_t start = c * L; start < end; start += kThreads) {
    const int64_t i = start + threadIdx.x;
    const int64_t w = i < end ? weight(i) : 0;
    int64_t step;
    const int64_t in = block_scan(w, sh, &step);
    const int32_t first = block_min(i < end && run + in > t ? static_cast<int32_t>(threadIdx.x) : INT_MAX, sh);
    if (first != INT_MAX) return static_cast<int32_t>(start + first);
    run += step;
  }
  return static_cast<int32_t>(V - 1);
}

template <class Weight>
__device__ int64_t block_sum_weights(int64_t V, Weight&& weight, Shared& sh) {
  int64_t s = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) s += weight(i);
  return block_sum(s, sh);
}

// words (or nullptr): the row's allowed tokens, bit i % 32 of word i / 32; a disallowed entry
// counts as -inf (apply_token_bitmask's rule).
template <class scalar_t>
__device__ int32_t block_argmax(const scalar_t* row, int64_t V, Shared& sh, const int32_t* words = nullptr) {
  float best = -inf_f();
  int32_t best_i = INT_MAX;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = logit_at(row, i, words);
    if (best_i == INT_MAX || argmax_better(v, i, best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_down_sync(kFull, best, o);
    const int32_t oi = __shfl_down_sync(kFull, best_i, o);
    if (oi != INT_MAX && (best_i == INT_MAX || argmax_better(ov, oi, best, best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.f32[threadIdx.x >> 5] = best;
    sh.i32[threadIdx.x >> 5] = best_i;
  }
  __syncthreads();
  best = sh.f32[0];
  best_i = sh.i32[0];
  for (int w = 1; w < kWarps; ++w)
    if (sh.i32[w] != INT_MAX && (best_i == INT_MAX || argmax_better(sh.f32[w], sh.i32[w], best, best_i))) {
      best = sh.f32[w];
      best_i = sh.i32[w];
    }
  return best_i == INT_MAX ? 0 : best_i;
}

// The probability rows of one sequence, as they are.
struct DenseRows {
  const float* P;  // [T, V] target rows
  const float* Q;  // [T, V] draft rows or nullptr
  int64_t V;
  template <class F>
  __device__ auto with_row(Vec v, F&& f) const {
    const float* x = (v.kind == Vec::kTarget ? P : Q) + v.node * V;
    return f([x](int64_t i) { return x[i]; });
  }
};

// verify_tree_logits: the rows of one sequence warped from logits on the fly, entry by entry, by
// warp_probs' own expression (warped_value) and the row statistics warp_probs' own launch plan
// computed (warp_row_stats): the walk reads exactly the values warp_probs would have written. With
// a grammar bitmask, each read masks its logit with the row's words (the statistics were computed
// with the same words), so the values are warp_probs' on the masked logits.
template <typename scalar_t>
struct LogitRows {
  const scalar_t* X;             // [T, V] target logits
  const scalar_t* Y;             // [T, V] draft logits or nullptr
  const WarpRowStats* stats[2];  // [T] target, draft
  const float* temperature[2];   // [T]
  RowMask target_mask;           // row u: words row u (no words: no mask)
  RowMask draft_mask;            // row c: words row parents[c]
  int64_t V;
  // Selects, not stats[v.kind]: an array indexed at run time keeps the whole struct in local memory.
  template <class F>
  __device__ auto with_row(Vec v, F&& f) const {
    const bool target = v.kind == Vec::kTarget;
    const scalar_t* x = (target ? X : Y) + v.node * V;
    const WarpRowStats st = (target ? stats[0] : stats[1])[v.node];
    const float t = (target ? temperature[0] : temperature[1])[v.node];
    const int32_t* w = target ? target_mask.row(v.node) : draft_mask.row(v.node);
    return f([x, st, t, w](int64_t i) {
      if (st.argmax >= 0) return i == st.argmax ? 1.0f : 0.0f;
      return warped_value(x, i, st.mx, t, st.kappa, st.sum, w);
    });
  }
};

template <class Rows>
struct CudaTreeEngine {
  Rows rows;
  const float* U;    // [T, 2]
  float* buf;        // [nbuf, V] scratch rows
  int32_t* scratch;  // [T + 2] tree bookkeeping (global, written by thread 0)
  Shared* sh;
  int64_t V_;
  float scale_, inv_scale_;

  __device__ int64_t V() const { return V_; }
  __device__ float scale() const { return scale_; }
  __device__ float inv_scale() const { return inv_scale_; }
  __device__ float u0(int32_t node) const { return U[2 * node]; }
  __device__ float u1(int32_t node) const { return U[2 * node + 1]; }
  __device__ int32_t* ints() { return scratch; }
  template <class F>
  __device__ void single(F&& f) {
    __syncthreads();
    if (threadIdx.x == 0) f();
    __syncthreads();
  }
  __device__ void emit(int32_t* out, int32_t v) {
    if (threadIdx.x == 0) *out = v;
  }
  __device__ float* mrow(Vec v) { return buf + (v.kind - Vec::kBuf0) * V_; }
  // f(value) with value(i) = entry i of row v.
  template <class F>
  __device__ auto with_row(Vec v, F&& f) {
    if (v.kind >= Vec::kBuf0) {
      const float* x = mrow(v);
      return f([x](int64_t i) { return x[i]; });
    }
    return rows.with_row(v, f);
  }
  __device__ float at(Vec v, int32_t tok) {
    if (!in_vocab(tok, V_)) return 0.0f;
    return with_row(v, [&](auto x) { return x(tok); });
  }

  __device__ int64_t sum_fix(Vec v) {
    const float sc = scale_;
    return with_row(v, [&](auto x) {
      return block_sum_weights(V_, [&](int64_t i) { return fix_weight(x(i), sc); }, *sh);
    });
  }
  __device__ int32_t sample(Vec v, int64_t W, float u) {
    const float sc = scale_;
    return with_row(v, [&](auto x) {
      return block_sample(V_, W, u, [&](int64_t i) { return fix_weight(x(i), sc); }, *sh);
    });
  }
  // The block_sum after each writing loop is also the barrier that publishes the writes.
  __device__ int64_t residual(Vec dst, Vec r, Vec q, float Z, float Zq) {
    float* out = mrow(dst);
    return with_row(r, [&](auto rr) {
      return with_row(q, [&](auto qq) {
        int64_t w = 0;
        for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
          const float v = residual_value(rr(i), Zq, Z, qq(i));
          out[i] = v;
          w += fix_weight(v, scale_);
        }
        return block_sum(w, *sh);
      });
    });
  }
  __device__ int64_t residual_noreplace(Vec dst, Vec r, Vec q, float Z, float Zq, int32_t x, int64_t* wq) {
    // From the second rejection at a node, q is the scratch row kBufQ that this loop rewrites in
    // place: every thread must have read q[x] (the walk's acceptance test) before the thread
    // that owns index x zeroes it, or threads take different decisions and reach different barriers.
    __syncthreads();
    float* out = mrow(dst);
    float* qout = mrow(Vec::buf(Vec::kBufQ));
    int64_t w2 = 0;
    const int64_t total = with_row(r, [&](auto rr) {
      return with_row(q, [&](auto qq) {
        int64_t w = 0;
        for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
          const float qi = qq(i);
          const float v = residual_value(rr(i), Zq, Z, qi);
          out[i] = v;
          w += fix_weight(v, scale_);
          const float qn = i == x ? 0.0f : qi;
          qout[i] = qn;
          w2 += fix_weight(qn, scale_);
        }
        return block_sum(w, *sh);
      });
    });
    *wq = block_sum(w2, *sh);
    return total;
  }
  __device__ int64_t drop_token(Vec dst, Vec src, int32_t x) {
    float* out = mrow(dst);
    return with_row(src, [&](auto s) {
      int64_t w = 0;
      for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
        const float v = i == x ? 0.0f : s(i);
        out[i] = v;
        w += fix_weight(v, scale_);
      }
      return block_sum(w, *sh);
    });
  }
  __device__ void set_zero(Vec v, int32_t tok) {
    float* m = mrow(v);
    single([&] { m[tok] = 0.0f; });
  }
};

// The walk of `mode` over sequence b.
template <class E>
__device__ void run_walk(E& e, int32_t mode, const int32_t* tb, const int32_t* pb, int32_t n, int32_t T, int32_t* out,
                         int32_t* accept_len, int32_t* bonus) {
  if (mode == kSampleMatch) {
    auto predict = [&](int32_t u) {
      const Vec row = Vec::target(u);
      return e.sample(row, e.sum_fix(row), e.u1(u));
    };
    match_walk(e, predict, tb, pb, n, out, accept_len, bonus);
  } else if (mode == kGsd) {
    gsd_walk(e, tb, pb, n, T, out, accept_len, bonus);
  } else {
    mss_walk(e, mode, tb, pb, n, out, accept_len, bonus);
  }
}

}  // namespace cuda
}  // namespace verify
}  // namespace specops
