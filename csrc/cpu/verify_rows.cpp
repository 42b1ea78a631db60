// V-wide row passes of the CPU verification kernels, vectorised.
//
// Every function is compiled three times (target_clones: AVX-512, AVX2, baseline) and picked at
// load time, so the .so runs on any x86-64. fp-contract=off is not optional: with AVX-512 GCC
// would fuse r * Zq - Z * q into an FMA and the residual would round differently from the other
// backends. no-trapping-math only lets the float -> int64 weight conversion vectorise; every
// value converted is in range. Both are set before any include so that inlining still works.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include "verify_rows.h"

#include <climits>
#include <cstring>

#include "../verify_common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SPECOPS_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SPECOPS_CLONES
#endif

namespace specops {
namespace verify {
namespace cpu {

namespace {

inline int64_t chunk_end(int64_t start, int64_t V) { return start + kChunk < V ? start + kChunk : V; }

}  // namespace

SPECOPS_CLONES int64_t row_sum_fix(const float* __restrict__ x, int64_t V, float scale, int64_t* chunks) {
  int64_t total = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    int64_t s = 0;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) s += fix_weight(x[i], scale);
    if (chunks) chunks[k] = s;
    total += s;
  }
  return total;
}

SPECOPS_CLONES int64_t row_sum_fix_exp(const float* __restrict__ logp, int64_t V, float scale, int64_t* chunks) {
  int64_t total = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    int64_t s = 0;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) s += fix_weight(det_exp(logp[i]), scale);
    if (chunks) chunks[k] = s;
    total += s;
  }
  return total;
}

SPECOPS_CLONES int64_t row_residual(float* __restrict__ out, const float* __restrict__ r, const float* __restrict__ q,
                                    float Z, float Zq, int64_t V, float scale, int64_t* chunks) {
  int64_t total = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    int64_t s = 0;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) {
      const float v = residual_value(r[i], Zq, Z, q[i]);
      out[i] = v;
      s += fix_weight(v, scale);
    }
    chunks[k] = s;
    total += s;
  }
  return total;
}

// qout may be q itself (the proposer row is then updated in place).
SPECOPS_CLONES int64_t row_residual_noreplace(float* __restrict__ out, float* qout, const float* __restrict__ r,
                                              const float* q, float Z, float Zq, int64_t x, int64_t V, float scale,
                                              int64_t* chunks, int64_t* wq) {
  int64_t total = 0, totq = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    int64_t s = 0, sq = 0;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) {
      const float qi = q[i];
      const float v = residual_value(r[i], Zq, Z, qi);
      out[i] = v;
      s += fix_weight(v, scale);
      sq += fix_weight(i == x ? 0.0f : qi, scale);
    }
    chunks[k] = s;
    total += s;
    totq += sq;
  }
  if (qout != q) memcpy(qout, q, V * sizeof(float));
  if (x >= 0 && x < V) qout[x] = 0.0f;
  *wq = totq;
  return total;
}

SPECOPS_CLONES int64_t row_drop_token(float* __restrict__ out, const float* __restrict__ src, int64_t x, int64_t V,
                                      float scale, int64_t* chunks) {
  int64_t total = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    int64_t s = 0;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) {
      const float v = i == x ? 0.0f : src[i];
      out[i] = v;
      s += fix_weight(v, scale);
    }
    chunks[k] = s;
    total += s;
  }
  return total;
}

// Chunk sums (given, or computed on the way) locate the chunk; its weights then a scalar running
// sum find the token.
SPECOPS_CLONES int32_t row_sample(const float* __restrict__ x, int64_t V, float scale, int64_t W, float u,
                                  const int64_t* chunks, bool exp_weights) {
  if (W <= 0) return 0;
  const int64_t t = sample_threshold(u, W);
  int64_t run = 0;
  for (int64_t start = 0, k = 0; start < V; start += kChunk, ++k) {
    const int64_t end = chunk_end(start, V);
    int64_t s = 0;
    if (chunks) {
      s = chunks[k];
    } else if (exp_weights) {
      for (int64_t i = start; i < end; ++i) s += fix_weight(det_exp(x[i]), scale);
    } else {
      for (int64_t i = start; i < end; ++i) s += fix_weight(x[i], scale);
    }
    if (run + s > t) {
      int64_t w[kChunk];  // the chunk's weights (vectorised), then a scalar running sum
      const int64_t n = end - start;
      if (exp_weights) {
        for (int64_t i = 0; i < n; ++i) w[i] = fix_weight(det_exp(x[start + i]), scale);
      } else {
        for (int64_t i = 0; i < n; ++i) w[i] = fix_weight(x[start + i], scale);
      }
      for (int64_t i = 0; i < n; ++i) {
        run += w[i];
        if (run > t) return static_cast<int32_t>(start + i);
      }
      return static_cast<int32_t>(end - 1);  // unreachable when the chunk sums are the row's
    }
    run += s;
  }
  return static_cast<int32_t>(V - 1);
}

// An int32 whose order is the float order of argmax_key (NaN -> +inf, -0 -> +0), so that the max
// reduction is an integer one and vectorises without fast-math.
inline int32_t argmax_int_key(float v) {
  int32_t b;
  memcpy(&b, &v, sizeof(b));
  b = (b & 0x7fffffff) > 0x7f800000 ? 0x7f800000 : b;
  b = b == INT32_MIN ? 0 : b;
  return b ^ ((b >> 31) & 0x7fffffff);
}

// First index of the maximum, NaN counting as +inf: the chunk holding the largest key, then the
// first index in it with that key.
SPECOPS_CLONES int32_t row_argmax(const float* __restrict__ x, int64_t V) {
  int32_t best = INT32_MIN;
  int64_t best_start = 0;
  for (int64_t start = 0; start < V; start += kChunk) {
    int32_t m = INT32_MIN;
    for (int64_t i = start, end = chunk_end(start, V); i < end; ++i) {
      const int32_t k = argmax_int_key(x[i]);
      m = k > m ? k : m;
    }
    if (m > best || start == 0) {
      best = m;
      best_start = start;
    }
  }
  for (int64_t i = best_start, end = chunk_end(best_start, V); i < end; ++i)
    if (argmax_int_key(x[i]) == best) return static_cast<int32_t>(i);
  return 0;
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops
