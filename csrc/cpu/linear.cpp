// specops::linear on the CPU: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), fp32 accumulation.
//
// Batch invariance (docs/batch_invariance.md): every output element is reduced in one order that
// depends on K only. Eight lane partial sums, lane l taking k = 8 j + l for j = 0, 1, ... (one fused
// multiply-add each, K zero-padded to a multiple of 8), then the lanes combined by halving (l + 4,
// l + 2, l + 1), then the bias, then one rounding to the output dtype. Tiles of rows and columns,
// the thread split of the columns and the instruction set change how many elements are computed
// together, never the order inside one element, so row i of an M-row call is bit for bit the one-row
// call on row i. The AVX2 kernel and the generic one compute the same bits (tests/test_linear.py).
//
// Speed: one pass over the weight serves every row of x. x is converted to fp32 once per call
// ([M, Kp] in a per-thread buffer); a register tile of MR rows x NR weight rows keeps MR * NR
// accumulators, and the weight rows of a column block stay in L1 while the row tiles go by.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdlib>
#include <type_traits>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../registration.h"
#include "linear_amx.h"

namespace specops {
namespace {

constexpr int kLanes = 8;
constexpr int64_t kColBlock = 32;  // weight rows per block: 32 x K bf16 stays in L1 for K <= 512

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }
inline float to_float(c10::Half v) { return static_cast<float>(v); }

// The fixed combination of the 8 lane partial sums (= ops/linear/ref.py lanes_to_scalar).
inline float combine_lanes(const float* p) {
  const float a0 = p[0] + p[4], a1 = p[1] + p[5], a2 = p[2] + p[6], a3 = p[3] + p[7];
  const float b0 = a0 + a2, b1 = a1 + a3;
  return b0 + b1;
}

template <typename T>
inline void store_out(T* out, float acc, const T* bias, int64_t n) {
  if (bias) acc += to_float(bias[n]);
  out[n] = static_cast<T>(acc);  // c10's conversions round to nearest even
}

// ---- generic C++: the reference order, one element at a time --------------------------------------

template <typename T>
void rows_generic(const float* xf, int64_t M, int64_t Kp, const T* w, int64_t K, const T* bias, T* out,
                  int64_t N, int64_t n_lo, int64_t n_hi) {
  std::vector<float> wrow(Kp, 0.f);
  for (int64_t n = n_lo; n < n_hi; ++n) {
    for (int64_t k = 0; k < K; ++k) wrow[k] = to_float(w[n * K + k]);
    for (int64_t m = 0; m < M; ++m) {
      float p[kLanes] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      const float* xr = xf + m * Kp;
      for (int64_t j = 0; j < Kp; j += kLanes)
        for (int l = 0; l < kLanes; ++l) p[l] = std::fma(wrow[j + l], xr[j + l], p[l]);
      store_out(out + m * N, combine_lanes(p), bias, n);
    }
  }
}

#if defined(__x86_64__)
// ---- AVX2 + FMA (+ F16C for fp16) -----------------------------------------------------------------

#define LIN_TARGET __attribute__((target("avx2,fma,f16c"))) inline
#define LIN_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

LIN_INLINE __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
LIN_INLINE __m256 load8(const c10::BFloat16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
LIN_INLINE __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

LIN_INLINE float hsum(__m256 v) {  // lanes l + 4, then l + 2, then l + 1: combine_lanes' order
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

// Weight rows are short (K * 2 bytes: ~1 KB for a 135M model) and a tile reads NR of them side by
// side, so the hardware prefetcher sees NR short streams and trains too late: a one-row call over the
// LM head ran at ~60 % of the DRAM bandwidth. The tile that first reads a column block therefore
// prefetches, spread over its K loop, the weight bytes one whole tile plus kPrefetchMargin past its
// own (at least kPrefetchAhead), so that even the last of the next tile's NR rows is in cache when
// that tile starts (2-core EPYC, M = 1, bf16: LM head 49152 x 576 4.6 ms -> 2.8 ms, the bandwidth
// floor being ~2.3 ms; a fixed 16 KB distance is less than one 8-row tile at K = 1536, 24 KB, and
// left SmolLM2's down projection, 576 x 1536, at 9.4 GB/s where its K = 576 weights ran at 18-22 on a
// 2-core Xeon VM).
constexpr int64_t kPrefetchAhead = 16 << 10, kPrefetchMargin = 8 << 10;

// MR rows of x (fp32, [.., Kp] zero-padded) times NR weight rows starting at n; pf (or nullptr):
// the first of pf_lines cache lines to prefetch while doing so.
template <int MR, int NR, typename T>
LIN_TARGET void tile(const float* xf, int64_t Kp, const T* w, int64_t K, const T* bias, T* out, int64_t N,
                     int64_t n, const char* pf = nullptr, int64_t pf_lines = 0) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_setzero_ps();
  const int64_t full = K / kLanes * kLanes;
  const int64_t pf_step = pf ? (pf_lines * kLanes + full - 1) / std::max<int64_t>(full, 1) : 0;  // lines per k step
  const char* const pf_end = pf + pf_lines * 64;
  for (int64_t k = 0; k < full; k += kLanes) {
    for (int64_t i = 0; i < pf_step && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = load8(w + (n + r) * K + k);
      for (int i = 0; i < MR; ++i) acc[i][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xf + i * Kp + k), acc[i][r]);
    }
  }
  if (full < K) {  // the zero-padded last block: the same fused multiply-adds on zeros
    for (int r = 0; r < NR; ++r) {
      alignas(32) float tail[kLanes] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int64_t k = full; k < K; ++k) tail[k - full] = to_float(w[(n + r) * K + k]);
      const __m256 wv = _mm256_load_ps(tail);
      for (int i = 0; i < MR; ++i) acc[i][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xf + i * Kp + full), acc[i][r]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) store_out(out + i * N, hsum(acc[i][r]), bias, n + r);
}

// ---- AVX-512 (+ DQ, BW): two weight rows per register, the same bits ---------------------------------
//
// A zmm register holds the 8-lane partial sums of two weight rows side by side (lanes 0-7 row n,
// lanes 8-15 row n + 1) against x's 8 values broadcast to both halves, so every lane runs exactly
// the AVX2 tile's fused multiply-adds in the same order and the halves are combined as there: the
// same bits, twice the multiply-adds per instruction (blocks of 2+ rows are compute-bound).
#define LIN512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c"))) inline
#define LIN512_INLINE __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

LIN512_INLINE __m256i load16x2(const void* a, const void* b) {  // 8 16-bit values of a, then 8 of b
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}
LIN512_INLINE __m512 load8x2(const float* a, const float* b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}
LIN512_INLINE __m512 load8x2(const c10::BFloat16* a, const c10::BFloat16* b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load16x2(a, b)), 16));
}
LIN512_INLINE __m512 load8x2(const c10::Half* a, const c10::Half* b) { return _mm512_cvtph_ps(load16x2(a, b)); }

// MR rows of x times NR = 2 NP weight rows starting at n (the AVX2 tile's contract).
template <int MR, int NR, typename T>
LIN512_TARGET void tile512(const float* xf, int64_t Kp, const T* w, int64_t K, const T* bias, T* out, int64_t N,
                           int64_t n, const char* pf = nullptr, int64_t pf_lines = 0) {
  static_assert(NR % 2 == 0, "tile512 pairs weight rows");
  constexpr int NP = NR / 2;
  __m512 acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_setzero_ps();
  const int64_t full = K / kLanes * kLanes;
  const int64_t pf_step = pf ? (pf_lines * kLanes + full - 1) / std::max<int64_t>(full, 1) : 0;
  const char* const pf_end = pf + pf_lines * 64;
  for (int64_t k = 0; k < full; k += kLanes) {
    for (int64_t i = 0; i < pf_step && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
    __m512 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + k));
    for (int p = 0; p < NP; ++p) {
      const __m512 wv = load8x2(w + (n + 2 * p) * K + k, w + (n + 2 * p + 1) * K + k);
      for (int i = 0; i < MR; ++i) acc[i][p] = _mm512_fmadd_ps(wv, xv[i], acc[i][p]);
    }
  }
  if (full < K) {  // the zero-padded last block, as in the AVX2 tile
    for (int p = 0; p < NP; ++p) {
      alignas(64) float tail[2 * kLanes] = {};
      for (int64_t k = full; k < K; ++k) {
        tail[k - full] = to_float(w[(n + 2 * p) * K + k]);
        tail[kLanes + k - full] = to_float(w[(n + 2 * p + 1) * K + k]);
      }
      const __m512 wv = _mm512_load_ps(tail);
      for (int i = 0; i < MR; ++i)
        acc[i][p] = _mm512_fmadd_ps(wv, _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + full)), acc[i][p]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int p = 0; p < NP; ++p) {
      store_out(out + i * N, hsum(_mm512_castps512_ps256(acc[i][p])), bias, n + 2 * p);
      store_out(out + i * N, hsum(_mm512_extractf32x8_ps(acc[i][p], 1)), bias, n + 2 * p + 1);
    }
}

// ---- AVX-512, packed bf16 weights (ops/linear pack_weight): the same bits without widening shuffles --
//
// The tiles above widen each bf16 weight with a cross-lane shuffle (port 5) beside its fused
// multiply-add; a one-row call then streamed SmolLM2's weights at ~20 GB/s where a plain read of the
// same bytes reached ~25 on a 2-core Xeon VM. Packed at load, one 64-byte load holds, in each 32-bit
// lane l of a half, the weights of k = 16 c + l (low 16 bits) and 16 c + 8 + l (high 16 bits) of a
// pair of rows (lanes 0-7 the even row, 8-15 the odd one): a shift and a mask give the two 8-lane
// blocks in place, and each lane still runs k = l, l + 8, l + 16, ... in order (the same bits).
// Layout [ceil(N / 8), ceil(K / 16), 128]: packed[g, c, 32 p + 16 h + 2 l + s] =
// w[8 g + 2 p + h, 16 c + 8 s + l], zeros past N and K (an extra block of zero products leaves every
// partial sum as it was: a sum that starts at +0 never becomes -0). A thread's groups are one
// contiguous stream, prefetched a fixed kPackedAhead bytes ahead of the chunk being read (up to
// ``end``; nullptr: no prefetch): SmolLM2's one-row projections took 11.5 ms for 269 MB against
// 13.3 unpacked and 12.1 with the one-tile-ahead prefetch of the tiles above (a C probe on the
// 2-core Xeon VM; the plain read of the same bytes: 10.6 ms).
constexpr int64_t kPackedAhead = 4 << 10;

template <int MR>
LIN512_TARGET void tile_packed(const float* xf, int64_t Kp, const c10::BFloat16* grp, int64_t C,
                               const c10::BFloat16* bias, c10::BFloat16* out, int64_t N, int64_t n,
                               const char* end) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int p = 0; p < 4; ++p) acc[i][p] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t c = 0; c < C; ++c) {
    const char* ahead = reinterpret_cast<const char*>(grp + c * 128) + kPackedAhead;
    if (end && ahead + 256 <= end)
      for (int i = 0; i < 4; ++i) _mm_prefetch(ahead + 64 * i, _MM_HINT_T0);
    // Up to 4 rows keep their x in registers; 5 or 6 rows (24 accumulators) reload it per use.
    constexpr int XR = MR <= 4 ? MR : 1;
    __m512 xlo[XR], xhi[XR];
    if constexpr (MR <= 4)
      for (int i = 0; i < MR; ++i) {
        xlo[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + 16 * c));
        xhi[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + 16 * c + 8));
      }
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(grp + (c * 4 + p) * 32);
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, high));
      for (int i = 0; i < MR; ++i) {
        if constexpr (MR <= 4) {
          acc[i][p] = _mm512_fmadd_ps(lo, xlo[i], acc[i][p]);
          acc[i][p] = _mm512_fmadd_ps(hi, xhi[i], acc[i][p]);
        } else {
          acc[i][p] = _mm512_fmadd_ps(lo, _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + 16 * c)), acc[i][p]);
          acc[i][p] = _mm512_fmadd_ps(hi, _mm512_broadcast_f32x8(_mm256_loadu_ps(xf + i * Kp + 16 * c + 8)),
                                      acc[i][p]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int p = 0; p < 4; ++p) {
      if (n + 2 * p < N) store_out(out + i * N, hsum(_mm512_castps512_ps256(acc[i][p])), bias, n + 2 * p);
      if (n + 2 * p + 1 < N) store_out(out + i * N, hsum(_mm512_extractf32x8_ps(acc[i][p], 1)), bias, n + 2 * p + 1);
    }
}

// Rows [0, M) x row groups [g_lo, g_hi) of the packed weight (G groups in all): blocks of groups
// kept in L1 while the row tiles go by; the first pass over a block prefetches.
LIN512_TARGET void rows_packed(const float* xf, int64_t M, int64_t Kp, const c10::BFloat16* wp, int64_t G,
                               int64_t C, const c10::BFloat16* bias, c10::BFloat16* out, int64_t N, int64_t g_lo,
                               int64_t g_hi) {
  const char* const end = reinterpret_cast<const char*>(wp + G * C * 128);
  for (int64_t b0 = g_lo; b0 < g_hi; b0 += kColBlock / 8) {
    const int64_t b1 = std::min(g_hi, b0 + kColBlock / 8);
    // Row tiles of 4, the last 1-6 rows in one tile: every tile re-reads and re-widens the block's
    // weights, so 5 or 6 rows as one tile instead of 4 + 1 or 4 + 2 (a tree block of 5-6 nodes).
    for (int64_t m = 0, mr; m < M; m += mr) {
      mr = M - m <= 6 ? M - m : 4;
      for (int64_t g = b0; g < b1; ++g) {
        const c10::BFloat16* grp = wp + g * C * 128;
        const char* pf = m == 0 ? end : nullptr;
        c10::BFloat16* o = out + m * N;
        const float* xm = xf + m * Kp;
        switch (mr) {
          case 1: tile_packed<1>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
          case 2: tile_packed<2>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
          case 3: tile_packed<3>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
          case 5: tile_packed<5>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
          case 6: tile_packed<6>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
          default: tile_packed<4>(xm, Kp, grp, C, bias, o, N, 8 * g, pf); break;
        }
      }
    }
  }
}

// The tile of an NR-column group: paired in zmm registers (Z) or the AVX2 one.
template <int MR, int NR, bool Z, typename T>
LIN_TARGET void tile_any(const float* xf, int64_t Kp, const T* w, int64_t K, const T* bias, T* out, int64_t N,
                         int64_t n, const char* pf = nullptr, int64_t pf_lines = 0) {
  if constexpr (Z && NR % 2 == 0) tile512<MR, NR>(xf, Kp, w, K, bias, out, N, n, pf, pf_lines);
  else tile<MR, NR>(xf, Kp, w, K, bias, out, N, n, pf, pf_lines);
}

// Rows [0, M) x columns [n_lo, n_hi): MR rows by NR columns per tile, column blocks kept in L1.
template <int MR, int NR, bool Z, typename T>
LIN_TARGET void rows_avx2_fixed(const float* xf, int64_t M, int64_t Kp, const T* w, int64_t K, const T* bias,
                                T* out, int64_t N, int64_t n_lo, int64_t n_hi);

template <int NR, bool Z, typename T>
LIN_TARGET void rows_tail_m(int64_t rows, const float* xf, int64_t Kp, const T* w, int64_t K, const T* bias,
                            T* out, int64_t N, int64_t n) {
  switch (rows) {  // the last 1-3 rows of x when M is not a multiple of the row tile
    case 1: tile_any<1, NR, Z>(xf, Kp, w, K, bias, out, N, n); break;
    case 2: tile_any<2, NR, Z>(xf, Kp, w, K, bias, out, N, n); break;
    case 3: tile_any<3, NR, Z>(xf, Kp, w, K, bias, out, N, n); break;
    default: break;
  }
}

template <int MR, int NR, bool Z, typename T>
LIN_TARGET void rows_avx2_fixed(const float* xf, int64_t M, int64_t Kp, const T* w, int64_t K, const T* bias,
                                T* out, int64_t N, int64_t n_lo, int64_t n_hi) {
  const char* const w_end = reinterpret_cast<const char*>(w + N * K);
  for (int64_t b0 = n_lo; b0 < n_hi; b0 += kColBlock) {
    const int64_t b1 = std::min(n_hi, b0 + kColBlock);
    int64_t m = 0;
    for (; m + MR <= M; m += MR) {
      int64_t n = b0;
      if (m == 0) {  // the first pass over the block reads it from memory; prefetch ahead of it
        for (; n + NR <= b1; n += NR) {
          const char* at = reinterpret_cast<const char*>(w + n * K) +
                           std::max<int64_t>(kPrefetchAhead, NR * K * sizeof(T) + kPrefetchMargin);
          const int64_t lines = std::min<int64_t>(NR * K * sizeof(T) / 64, (w_end - at) / 64);
          tile_any<MR, NR, Z>(xf + m * Kp, Kp, w, K, bias, out + m * N, N, n, lines > 0 ? at : nullptr,
                              std::max<int64_t>(lines, 0));
        }
      }
      for (; n + NR <= b1; n += NR) tile_any<MR, NR, Z>(xf + m * Kp, Kp, w, K, bias, out + m * N, N, n);
      for (; n < b1; ++n) tile<MR, 1>(xf + m * Kp, Kp, w, K, bias, out + m * N, N, n);
    }
    if (m < M) {
      int64_t n = b0;
      for (; n + NR <= b1; n += NR) rows_tail_m<NR, Z>(M - m, xf + m * Kp, Kp, w, K, bias, out + m * N, N, n);
      for (; n < b1; ++n) rows_tail_m<1, false>(M - m, xf + m * Kp, Kp, w, K, bias, out + m * N, N, n);
    }
  }
}

template <typename T>
void rows_avx2(const float* xf, int64_t M, int64_t Kp, const T* w, int64_t K, const T* bias, T* out, int64_t N,
               int64_t n_lo, int64_t n_hi, bool avx512) {
  // Register tiles (AVX2: accumulators = MR * NR <= 12 of the 16 ymm registers; AVX-512: MR * NR / 2
  // <= 16 of the 32 zmm). One row: 8 independent accumulator chains hide the FMA latency while the
  // weight streams from memory (bandwidth-bound: the AVX2 tile); blocks are compute-bound.
  // (At M = 2 the paired tile measured no faster than the AVX2 one; from M = 4 on it is 1.15-1.45x
  // faster on a 2-core Xeon VM with AVX-512: SmolLM2's projections and LM head, bf16.)
  if (M == 1) return rows_avx2_fixed<1, 8, false>(xf, M, Kp, w, K, bias, out, N, n_lo, n_hi);
  if (avx512 && M >= 4) return rows_avx2_fixed<4, 8, true>(xf, M, Kp, w, K, bias, out, N, n_lo, n_hi);
  if (M == 2) return rows_avx2_fixed<2, 4, false>(xf, M, Kp, w, K, bias, out, N, n_lo, n_hi);
  if (M == 3) return rows_avx2_fixed<3, 4, false>(xf, M, Kp, w, K, bias, out, N, n_lo, n_hi);
  return rows_avx2_fixed<4, 3, false>(xf, M, Kp, w, K, bias, out, N, n_lo, n_hi);
}

bool has_avx512() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }();
  return ok;
}

bool has_avx2() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return ok;
}
#endif  // __x86_64__

// SPECOPS_CPU_ISA=generic forces the generic kernel, =avx2 the AVX2 tiles (tests compare them: the
// same bits), as for tree_attention; =avx512 keeps a bf16 call off the AMX tiles (their own order).
enum class LinIsa { generic, avx2, avx512, amx };
LinIsa lin_isa() {
#if defined(__x86_64__)
  const char* cap = std::getenv("SPECOPS_CPU_ISA");
  if (!has_avx2() || (cap && !std::strcmp(cap, "generic"))) return LinIsa::generic;
  if (!has_avx512() || (cap && !std::strcmp(cap, "avx2"))) return LinIsa::avx2;
#if defined(SPECOPS_HAS_AMX_PATH)
  if (!(cap && !std::strcmp(cap, "avx512")) && amx::available()) return LinIsa::amx;
#endif
  return LinIsa::avx512;
#else
  return LinIsa::generic;
#endif
}

template <typename T>
void convert_rows(const T* x, int64_t M, int64_t K, int64_t Kp, float* xf) {  // [M, K] -> fp32 [M, Kp]
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xf[m * Kp + k] = to_float(x[m * K + k]);
    for (int64_t k = K; k < Kp; ++k) xf[m * Kp + k] = 0.f;
  }
}

template <typename T>
void run_linear(const at::Tensor& x, const at::Tensor& w_t, const at::Tensor& b_t, bool has_bias, at::Tensor& out,
                LinIsa isa, const at::Tensor& packed) {
  const int64_t M = x.size(0), K = x.size(1), N = w_t.size(0);
#if defined(SPECOPS_HAS_AMX_PATH)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (isa == LinIsa::amx) {  // a packed copy in the AMX layout, else the plain weight
      const int64_t MB = (M + 15) / 16, C = (K + amx::kChunk - 1) / amx::kChunk;
      thread_local std::vector<c10::BFloat16> xbuf;  // x in the B operand's layout, packed once per call
      xbuf.resize(static_cast<size_t>(MB * C * 512));
      amx::pack_x(x.data_ptr<c10::BFloat16>(), M, K, xbuf.data());
      const c10::BFloat16* xb = xbuf.data();
      const c10::BFloat16* w = w_t.data_ptr<c10::BFloat16>();
      const c10::BFloat16* b = has_bias ? b_t.data_ptr<c10::BFloat16>() : nullptr;
      c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
      const bool own = packed.defined() && amx::is_packed_shape(packed, N, K);
      const c10::BFloat16* wp = own ? packed.data_ptr<c10::BFloat16>() : nullptr;
      // A task streams at least 64 KB of packed weight, 256 KB of plain (the splits below).
      const int64_t min_task = own ? int64_t{64} << 10 : int64_t{256} << 10;
      const int64_t grain = std::max<int64_t>(1, min_task / (amx::kRows * K * 2));
      at::parallel_for(0, (N + amx::kRows - 1) / amx::kRows, grain, [&](int64_t lo, int64_t hi) {
        amx::rows(xb, M, K, w, wp, b, o, N, lo, hi);
      });
      return;
    }
  }
#endif
#if defined(__x86_64__)
  const bool use_packed = packed.defined() && packed.size(2) == 128 && isa != LinIsa::generic && isa != LinIsa::avx2;  // else the plain weight: the same bits
#else
  const bool use_packed = false;
#endif
  // fp32 copy of x, zero-padded to Kp (16 with the packed layout): converted once, read by every tile.
  const int64_t Kp = use_packed ? packed.size(1) * 16 : (K + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<float> xbuf;
  xbuf.resize(static_cast<size_t>(M * Kp));
  convert_rows(x.data_ptr<T>(), M, K, Kp, xbuf.data());
  const float* xf = xbuf.data();
  const T* w = w_t.data_ptr<T>();
  const T* b = has_bias ? b_t.data_ptr<T>() : nullptr;
  T* o = out.data_ptr<T>();
  // Columns split between threads in groups of 8 (the one-row tile). A task streams at least
  // 256 KB of weight: below that the fork/join costs more than a second core saves (k/v projections
  // of a 135M model: 221 KB, 1.6x faster on one thread at M = 1 on a 2-core EPYC). The packed
  // kernel (AVX-512 machines) splits from 64 KB: SmolLM2's compiled one-row step took 14.6 ms
  // against 15.0 with 256 KB (2-core Xeon VM, three interleaved processes each).
  const int64_t group_bytes = std::max<int64_t>(1, K * w_t.element_size() * 8);
  const int64_t min_task = use_packed ? int64_t{64} << 10 : int64_t{256} << 10;
  const int64_t grain = std::max<int64_t>(1, min_task / group_bytes);
  at::parallel_for(0, (N + 7) / 8, grain, [&](int64_t lo, int64_t hi) {
    const int64_t n_lo = lo * 8, n_hi = std::min(N, hi * 8);
#if defined(__x86_64__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (use_packed)
        return rows_packed(xf, M, Kp, packed.data_ptr<c10::BFloat16>(), packed.size(0), packed.size(1), b, o, N,
                           lo, hi);
    }
    if (isa != LinIsa::generic) return rows_avx2<T>(xf, M, Kp, w, K, b, o, N, n_lo, n_hi, isa != LinIsa::avx2);
#endif
    rows_generic<T>(xf, M, Kp, w, K, b, o, N, n_lo, n_hi);
  });
}

at::Tensor linear_impl(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       const at::Tensor& packed) {
  SPECOPS_CHECK_DIM(x, 2);
  SPECOPS_CHECK_DIM(weight, 2);
  TORCH_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), "weight must have x's dtype ", x.scalar_type(),
              ", got ", weight.scalar_type());
  TORCH_CHECK_VALUE(x.size(1) == weight.size(1), "x [M, K] and weight [N, K] must share K, got ", x.sizes(), " and ",
              weight.sizes());
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK_VALUE(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == weight.size(0),
                "bias must be [N] with x's dtype");
  }
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);  // [M, K] x [N, K]
  if (packed.defined()) {  // ops/linear pack_weight(weight): the AVX-512 tiles' layout or the AMX tiles'
    TORCH_CHECK_TYPE(packed.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kBFloat16,
                     "packed: the packed layout is bf16 (x, weight and packed), got x ", x.scalar_type(),
                     " and packed ", packed.scalar_type());
    const bool avx512_layout = packed.dim() == 3 && packed.size(0) == (N + 7) / 8 &&
                               packed.size(1) == (K + 15) / 16 && packed.size(2) == 128;
    const bool amx_layout = packed.dim() == 3 && packed.size(0) == (N + 15) / 16 &&
                            packed.size(1) == (K + 31) / 32 && packed.size(2) == 512;
    TORCH_CHECK_VALUE((avx512_layout || amx_layout) && packed.is_contiguous(),
                      "packed must be pack_weight(weight): contiguous [", (N + 7) / 8, ", ", (K + 15) / 16,
                      ", 128] (layout avx512) or [", (N + 15) / 16, ", ", (K + 31) / 32, ", 512] (layout amx), got ",
                      packed.sizes());
  }
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto bc = has_bias ? bias->contiguous() : at::Tensor();
  auto out = at::empty({M, N}, x.options());  // [M, N]
  if (M == 0 || N == 0) return out;
  const LinIsa isa = lin_isa();
  switch (x.scalar_type()) {  // fp32, bf16, fp16 (the Python entry rejects the others)
    case at::kFloat: run_linear<float>(xc, wc, bc, has_bias, out, isa, packed); break;
    case at::kBFloat16: run_linear<c10::BFloat16>(xc, wc, bc, has_bias, out, isa, packed); break;
    case at::kHalf: run_linear<c10::Half>(xc, wc, bc, has_bias, out, isa, packed); break;
    default: TORCH_CHECK_TYPE(false, "linear: x must be fp32, bf16 or fp16, got ", x.scalar_type());
  }
  return out;
}

}  // namespace

at::Tensor linear_cpu(const at::Tensor& x,                    // [M, K]
                      const at::Tensor& weight,               // [N, K]
                      const c10::optional<at::Tensor>& bias)  // [N] or None
{
  return linear_impl(x, weight, bias, at::Tensor());
}

// The same values from the packed copy of a bf16 weight (its layout above rows_packed); machines
// without AVX-512 read the plain weight.
at::Tensor linear_packed_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias) {
  return linear_impl(x, weight, bias, packed);
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("linear", &specops::linear_cpu);
  m.impl("linear_packed", &specops::linear_packed_cpu);
}

// specops._C.linear_isa(): the kernel a bf16 call runs on this machine now ("amx", "avx512", "avx2" or
// "generic"; SPECOPS_CPU_ISA caps it): the Python side packs weights only where the AVX-512 tiles read them.
PyObject* specops_linear_isa_py(PyObject*, PyObject*) {
  static const char* names[] = {"generic", "avx2", "avx512", "amx"};
  return PyUnicode_FromString(names[static_cast<int>(specops::lin_isa())]);
}

// specops._C.linear(x, weight, bias[, packed]): the same kernel called from Python without the dispatcher.
// torch.ops' generic argument parsing costs ~4 us a call, as much as the kernel itself for a
// one-row call over a small projection (ops/linear: the cpp backend's eager entry; torch.compile
// and tensor subclasses keep the registered op). Plain CPU tensors only; errors as the op's.
PyObject* specops_linear_py(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 && nargs != 4) {
    PyErr_Format(PyExc_TypeError, "linear(x, weight, bias, packed=None) takes 3 or 4 arguments, got %zd", nargs);
    return nullptr;
  }
  for (int i = 0; i < nargs; ++i) {
    if (i >= 2 && args[i] == Py_None) continue;
    if (!THPVariable_Check(args[i])) {
      PyErr_Format(PyExc_TypeError, "linear: argument %d must be a torch.Tensor, got %s", i, Py_TYPE(args[i])->tp_name);
      return nullptr;
    }
  }
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& weight = THPVariable_Unpack(args[1]);
  c10::optional<at::Tensor> bias;
  if (args[2] != Py_None) bias = THPVariable_Unpack(args[2]);
  at::Tensor packed;
  if (nargs == 4 && args[3] != Py_None) packed = THPVariable_Unpack(args[3]);
  at::Tensor out;
  PyObject* error_type = nullptr;
  std::string error;
  Py_BEGIN_ALLOW_THREADS  // a long call (an LM head, a prompt) leaves other Python threads running
  try {
    TORCH_CHECK_VALUE(x.device().is_cpu() && weight.device().is_cpu() && (!bias || bias->device().is_cpu()),
                      "linear: every tensor must be on the CPU, got x on ", x.device(), ", weight on ", weight.device());
    TORCH_CHECK_VALUE(!packed.defined() || packed.device().is_cpu(), "linear: packed must be on the CPU, got ",
                      packed.device());
    out = specops::linear_impl(x, weight, bias, packed);
  } catch (const c10::ValueError& e) {
    error_type = PyExc_ValueError, error = e.what_without_backtrace();
  } catch (const c10::TypeError& e) {
    error_type = PyExc_TypeError, error = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    error_type = PyExc_RuntimeError, error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error_type = PyExc_RuntimeError, error = e.what();
  }
  Py_END_ALLOW_THREADS
  if (error_type) {
    PyErr_SetString(error_type, error.c_str());
    return nullptr;
  }
  return THPVariable_Wrap(std::move(out));
}
