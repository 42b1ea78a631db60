// The CPU tree_attention kernel: one work item = (sequence, kv head, query tile, kv split).
//
// No include guard: tree_attention.cpp includes this once per instruction set (TA_ISA, see
// tree_attention_simd.h) inside `namespace specops::TA_NS` and a `#pragma GCC target` region.
//
// Layout ("query rows in lanes"): the M = (queries of the tile) x (G heads of the kv group)
// query rows of an item live in SIMD lanes, so one pass over a K/V tile serves the whole GQA
// group, K and V rows are read in place with broadcasts (no transposition), and every softmax
// reduction runs down the key axis, lane-wise:
//   Q^T [D][Mp] (pre-scaled by sm_scale*log2 e), S^T = P^T [N][lanes of a chunk],
//   O^T [Dp][Mp] fp32, running max m [Mp] and sum l [Mp] (base 2).
// Row m of an item is query i0 + m / G, head g*G + m % G. A tile of N keys is either a prefix
// tile (no mask test at all) or a block tile (one lane-mask per key, built once per item).
// bf16 with AVX512_BF16 (kDot) keeps K in place too (pairs of d are adjacent), packs V as pairs
// of rows and P^T as pairs of keys, and accumulates both products in fp32 with vdpbf16ps.
// fp16 (and bf16 without AVX512_BF16) converts each K/V tile to fp32 once and runs the fp32 path.

#include "tree_attention_simd.h"

#define TA_UNROLL _Pragma("GCC unroll 32")

constexpr int kMaxMC = TA_ISA >= 2 ? 4 : (TA_ISA == 1 ? 2 : 1);  // vectors of query rows per chunk

// Register tiles: MC vectors of query rows x R key rows (Q K^T) or R head dims (P V),
// R * MC accumulators (24 of the 32 zmm; 12 of the 16 ymm).
template <int MC>
constexpr int tile_rows() {
  if constexpr (TA_ISA >= 2) return MC == 1 ? 16 : MC == 2 ? 12 : MC == 3 ? 8 : 6;
  else if constexpr (TA_ISA == 1) return MC == 1 ? 12 : 6;
  else return 4;
}
static_assert(kTileN % 48 == 0 && kPadD % 32 == 0, "tiles must hold whole register tiles; packed V rows whole vectors");

using vf = Vec::vf;
constexpr int W = Vec::W;

// Stores R x MC scores (scaled into the base-2 domain when kScale, masked with the keys' lane
// masks cm [R][nvm] when kMasked) and folds them into the tile's running max mx.
template <int R, int MC, bool kMasked, bool kScale>
TA_INLINE void store_scores(vf (&acc)[R][MC], float* __restrict st, int ls, const uint32_t* cm, int nvm, vf scale,
                            vf* mx) {
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c) {
    vf x = acc[r][c];
    if constexpr (kScale) x = Vec::mul(x, scale);
    if constexpr (kMasked) x = Vec::select(cm[r * nvm + c], x, Vec::set1(-INFINITY));
    Vec::store(st + r * ls + c * W, x);
    mx[c] = Vec::max(mx[c], x);
  }
}

// S^T[r][c] = sum_d K[r][d] * Q^T[d][c] for R keys x MC vectors of query rows.
template <int R, int MC, bool kMasked, typename K>
TA_INLINE void qk_tile(const float* __restrict qt, int64_t ldq, const K* const* kp, int D, float* __restrict st,
                       int ls, const uint32_t* cm, int nvm, vf* mx) {
  vf acc[R][MC];
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = Vec::zero();
  const K* kr[R];
  TA_UNROLL for (int r = 0; r < R; ++r) kr[r] = kp[r];
  for (int d = 0; d < D; ++d) {
    vf q[MC];
    TA_UNROLL for (int c = 0; c < MC; ++c) q[c] = Vec::load(qt + d * ldq + c * W);
    TA_UNROLL for (int r = 0; r < R; ++r) {
      const vf k = Vec::set1(kr[r][d]);
      TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = Vec::fma(k, q[c], acc[r][c]);
    }
  }
  store_scores<R, MC, kMasked, false>(acc, st, ls, cm, nvm, Vec::zero(), mx);
}

// O^T[d0 + r][c] = alpha[c] * O^T[d0 + r][c] + sum_n V[n][d0 + r] * P^T[n][c]. TAIL clamps the
// head dim for the last group (rows past D land in O^T's padding and are never read back).
// Not inlined, and alpha [MC][W] read from memory: inlined into its loop, GCC keeps values live
// across calls and spills the P^T operands of the inner loop (MC = 3).
template <int R, int MC, bool TAIL>
__attribute__((noinline)) void pv_tile(const float* __restrict pt, int ls, const float* const* vp, int d0, int D, int len,
                       float* __restrict ot, int64_t ldo, const float* alpha) {
  vf acc[R][MC];
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c)
    acc[r][c] = Vec::mul(Vec::load(ot + (d0 + r) * ldo + c * W), Vec::load(alpha + c * W));
  int dc[R];  // column offsets from d0: compile-time constants unless TAIL
  TA_UNROLL for (int r = 0; r < R; ++r) dc[r] = TAIL ? (d0 + r < D ? r : D - 1 - d0) : r;
  for (int n = 0; n < len; ++n) {
    vf p[MC];
    TA_UNROLL for (int c = 0; c < MC; ++c) p[c] = Vec::load(pt + n * ls + c * W);
    const float* vr = vp[n] + d0;
    TA_UNROLL for (int r = 0; r < R; ++r) {
      const vf v = Vec::set1(vr[dc[r]]);
      TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = Vec::fma(v, p[c], acc[r][c]);
    }
  }
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c)
    Vec::store(ot + (d0 + r) * ldo + c * W, acc[r][c]);
}

#if TA_ISA >= 3
TA_INLINE __m512i bcast_pair(const uint16_t* p) {
  int32_t x;
  __builtin_memcpy(&x, p, 4);
  return _mm512_set1_epi32(x);
}

// Q K^T with bf16 pairs: Q^T is [D/2][ldq][2], K rows are read in place (d, d+1 adjacent).
template <int R, int MC, bool kMasked>
TA_INLINE void qk_tile_dot(const uint16_t* __restrict qt, int64_t ldq, const uint16_t* const* kp, int D2,
                           float* __restrict st, int ls, const uint32_t* cm, int nvm, vf scale, vf* mx) {
  __m512 acc[R][MC];
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* kr[R];
  TA_UNROLL for (int r = 0; r < R; ++r) kr[r] = kp[r];
  for (int p = 0; p < D2; ++p) {
    __m512bh q[MC];
    TA_UNROLL for (int c = 0; c < MC; ++c) q[c] = (__m512bh)_mm512_loadu_si512(qt + (p * ldq + c * 16) * 2);
    TA_UNROLL for (int r = 0; r < R; ++r) {
      const __m512bh k = (__m512bh)bcast_pair(kr[r] + 2 * p);
      TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], k, q[c]);
    }
  }
  store_scores<R, MC, kMasked, true>(acc, st, ls, cm, nvm, scale, mx);
}

// P V with bf16 pairs of keys: P^T is [len/2][ls][2], V packed as [len/2][Dp][2].
template <int R, int MC>
TA_INLINE void pv_tile_dot(const uint16_t* __restrict pt, int ls, const uint16_t* __restrict vt, int Dp, int d0,
                           int n2, float* __restrict ot, int64_t ldo, const __m512* alpha) {
  __m512 acc[R][MC];
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c)
    acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + r) * ldo + c * 16), alpha[c]);
  for (int t = 0; t < n2; ++t) {
    __m512bh p[MC];
    TA_UNROLL for (int c = 0; c < MC; ++c) p[c] = (__m512bh)_mm512_loadu_si512(pt + (t * ls + c * 16) * 2);
    const uint16_t* vr = vt + (static_cast<int64_t>(t) * Dp + d0) * 2;
    TA_UNROLL for (int r = 0; r < R; ++r) {
      const __m512bh v = (__m512bh)bcast_pair(vr + 2 * r);
      TA_UNROLL for (int c = 0; c < MC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], v, p[c]);
    }
  }
  TA_UNROLL for (int r = 0; r < R; ++r) TA_UNROLL for (int c = 0; c < MC; ++c)
    _mm512_storeu_ps(ot + (d0 + r) * ldo + c * 16, acc[r][c]);
}

// Rows 2t, 2t+1 of `len` bf16 rows (pointers: they may lie in different pages) interleaved into
// [ceil(len/2)][Dp][2], zero padded (Dp is a multiple of 32).
template <typename T>
TA_INLINE void pack_pairs(const T* const* rows, int len, int D, int Dp, uint16_t* dst) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                      37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int t = 0; 2 * t < len; ++t) {
    const bool has_b = 2 * t + 1 < len;
    const uint16_t* a = reinterpret_cast<const uint16_t*>(rows[2 * t]);
    const uint16_t* b = has_b ? reinterpret_cast<const uint16_t*>(rows[2 * t + 1]) : a;
    uint16_t* o = dst + static_cast<int64_t>(t) * Dp * 2;
    for (int d = 0; d < Dp; d += 32) {
      const __mmask32 in = D - d >= 32 ? ~0u : (D > d ? (1u << (D - d)) - 1u : 0u);
      const __m512i x = _mm512_maskz_loadu_epi16(in, a + d);
      const __m512i y = _mm512_maskz_loadu_epi16(has_b ? in : 0u, b + d);
      _mm512_storeu_si512(o + 2 * d, _mm512_permutex2var_epi16(x, lo, y));
      _mm512_storeu_si512(o + 2 * d + 32, _mm512_permutex2var_epi16(x, hi, y));
    }
  }
}
#endif

// The running state of an item's query rows, and where its scratch lives.
struct ItemState {
  const ta::Problem* pb;
  int M, Mp, nvm;          // rows, padded rows, lane vectors
  float* qt;               // Q^T [D][Mp] fp32, or [D/2][Mp][2] bf16 (kDot)
  float* ot;               // O^T [Dp][Mp]
  float* mrow;             // [Mp] running max (base 2, scaled)
  float* lrow;             // [Mp] running sum
  float* st;               // S^T / P^T of one chunk [kTileN][kMaxMC * W]
  uint16_t* pt;            // P^T bf16 pairs [kTileN / 2][kMaxMC * W][2]
  const uint32_t* colmask;  // [block][nvm] lane masks of block keys
};

// One chunk of MC lane vectors [v0, v0 + MC) against one K/V tile of `len` keys.
template <int MC, bool kMasked, bool kDot, typename K>
void chunk_step(const ItemState& s, int v0, const K* const* kp, const void* vsrc, int len, int j0) {
  constexpr int R = tile_rows<MC>();
  constexpr int LS = MC * W;  // S^T row stride of this chunk
  const ta::Problem& pb = *s.pb;
  const int D = pb.D;
  float* st = s.st;
  // Q K^T tile by tile, folding in the mask and the running max. Rows past len repeat the
  // tile's last key (block tiles: their lane masks are zero), so they never raise the max.
  vf mx[MC], al[MC], ls[MC];
  [[maybe_unused]] const vf scale = Vec::set1(pb.scale_log2);
  TA_UNROLL for (int c = 0; c < MC; ++c) mx[c] = Vec::set1(-INFINITY);
  const uint32_t* cm = kMasked ? s.colmask + static_cast<int64_t>(j0) * s.nvm + v0 : nullptr;
  for (int n0 = 0; n0 < len; n0 += R) {
    const uint32_t* cmr = kMasked ? cm + static_cast<int64_t>(n0) * s.nvm : nullptr;
    if constexpr (kDot) {
#if TA_ISA >= 3
      qk_tile_dot<R, MC, kMasked>(reinterpret_cast<const uint16_t*>(s.qt) + static_cast<int64_t>(v0) * W * 2, s.Mp,
                                  kp + n0, D / 2, st + n0 * LS, LS, cmr, s.nvm, scale, mx);
#endif
    } else {
      qk_tile<R, MC, kMasked>(s.qt + v0 * W, s.Mp, kp + n0, D, st + n0 * LS, LS, cmr, s.nvm, mx);
    }
  }
  // Online softmax down the key axis, lane-wise.
  TA_UNROLL for (int c = 0; c < MC; ++c) {
    const vf m_old = Vec::load(s.mrow + (v0 + c) * W);
    const vf m_new = Vec::max(m_old, mx[c]);
    Vec::store(s.mrow + (v0 + c) * W, m_new);
    mx[c] = Vec::max(m_new, Vec::set1(-3.0e38f));  // a finite reference even for rows that saw nothing
    al[c] = Vec::exp2(Vec::sub(m_old, mx[c]));
    ls[c] = Vec::zero();
  }
  float* ot = s.ot + v0 * W;
#if TA_ISA >= 3
  if constexpr (kDot) {
    // P^T straight to bf16 pairs of keys (rows n, n+1 interleaved per lane), nearest even.
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int n2 = (len + 1) / 2;
    for (int t = 0; t < n2; ++t) {
      const bool odd_tail = 2 * t + 1 >= len;
      TA_UNROLL for (int c = 0; c < MC; ++c) {
        const __m512 a = Vec::exp2(Vec::sub(_mm512_loadu_ps(st + 2 * t * LS + c * W), mx[c]));
        const __m512 b = odd_tail ? _mm512_setzero_ps()
                                  : Vec::exp2(Vec::sub(_mm512_loadu_ps(st + (2 * t + 1) * LS + c * W), mx[c]));
        ls[c] = Vec::add(ls[c], Vec::add(a, b));
        const __m512i pr = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        _mm512_storeu_si512(s.pt + (t * LS + c * W) * 2, pr);
      }
    }
    TA_UNROLL for (int c = 0; c < MC; ++c) {
      float* l = s.lrow + (v0 + c) * W;
      Vec::store(l, Vec::fma(Vec::load(l), al[c], ls[c]));
    }
    const uint16_t* vt = static_cast<const uint16_t*>(vsrc);
    for (int d0 = 0; d0 < D; d0 += R) pv_tile_dot<R, MC>(s.pt, LS, vt, pb.Dp, d0, n2, ot, s.Mp, al);
    return;
  }
#endif
  if constexpr (!kDot) {
    for (int n = 0; n < len; ++n) {
      TA_UNROLL for (int c = 0; c < MC; ++c) {
        const vf p = Vec::exp2(Vec::sub(Vec::load(st + n * LS + c * W), mx[c]));
        Vec::store(st + n * LS + c * W, p);
        ls[c] = Vec::add(ls[c], p);
      }
    }
    TA_UNROLL for (int c = 0; c < MC; ++c) {
      float* l = s.lrow + (v0 + c) * W;
      Vec::store(l, Vec::fma(Vec::load(l), al[c], ls[c]));
    }
    const float* const* vp = static_cast<const float* const*>(vsrc);
    alignas(64) float alpha[MC * W];
    TA_UNROLL for (int c = 0; c < MC; ++c) Vec::store(alpha + c * W, al[c]);
    const int dfull = D / R * R;
    for (int d0 = 0; d0 < dfull; d0 += R) pv_tile<R, MC, false>(st, LS, vp, d0, D, len, ot, s.Mp, alpha);
    if (dfull < D) pv_tile<R, MC, true>(st, LS, vp, dfull, D, len, ot, s.Mp, alpha);
  }
}

#include "tree_attention_narrow.h"

template <bool kMasked, bool kDot, typename K>
void tile_step(const ItemState& s, const K* const* kp, const void* vsrc, int len, int j0) {
  const int nv = (s.M + W - 1) / W;
  const int nch = (nv + kMaxMC - 1) / kMaxMC;
  for (int ch = 0; ch < nch; ++ch) {
    const int v0 = nv * ch / nch, mc = nv * (ch + 1) / nch - v0;
    switch (mc) {
      case 1: chunk_step<1, kMasked, kDot>(s, v0, kp, vsrc, len, j0); break;
#if TA_ISA >= 1
      case 2: chunk_step<2, kMasked, kDot>(s, v0, kp, vsrc, len, j0); break;
#endif
#if TA_ISA >= 2
      case 3: chunk_step<3, kMasked, kDot>(s, v0, kp, vsrc, len, j0); break;
      case 4: chunk_step<4, kMasked, kDot>(s, v0, kp, vsrc, len, j0); break;
#endif
      default: break;
    }
  }
}

// Work item `item` of problem `pb`, using the thread's scratch `ws` (layout in pb).
template <typename scalar_t, bool kDot>
void run_item(const ta::Problem& pb, float* ws, int64_t item) {
  const ta::WorkItem w = ta::decode_item(item, pb.Hkv, pb.n_qtiles, pb.n_splits);
  const ta::SeqLens sl = ta::clamp_lens(pb.prefix[w.b], pb.block[w.b], pb.q_lens ? pb.q_lens[w.b] : pb.Tq,
                                        pb.S, pb.W, pb.Tq);
  int32_t i0, i1;
  ta::query_tile(pb.Tq, pb.n_qtiles, w.qt, &i0, &i1);
  const int G = pb.G, D = pb.D;
  const int iv = i1 < sl.queries ? i1 : sl.queries;
  const int M = iv > i0 ? (iv - i0) * G : 0;
  scalar_t* out = static_cast<scalar_t*>(pb.out);
  auto out_row = [&](int i, int h) { return out + w.b * pb.so_b + i * pb.so_t + h * pb.so_h; };
  if (pb.n_splits == 1) {  // padding rows; with splits the combine writes them
    for (int i = iv > i0 ? iv : i0; i < i1; ++i)
      for (int h = w.g * G; h < (w.g + 1) * G; ++h) {
        scalar_t* o = out_row(i, h);
        for (int d = 0; d < D; ++d) o[d] = scalar_t(0.f);
      }
  }
  if (M == 0) return;

  ItemState s;
  s.pb = &pb;
  s.M = M;
  s.Mp = pb.Mp;
  s.nvm = pb.Mp / W;
  s.qt = ws + pb.off_qt;
  s.ot = ws + pb.off_ot;
  s.mrow = ws + pb.off_m;
  s.lrow = ws + pb.off_l;
  s.st = ws + pb.off_st;
  s.pt = reinterpret_cast<uint16_t*>(ws + pb.off_pt);
  uint32_t* colmask = reinterpret_cast<uint32_t*>(ws + pb.off_cm);
  s.colmask = colmask;
  const int Mp = s.Mp, Ml = (M + W - 1) / W * W;  // lanes in use (whole vectors)

  // Q^T: rows m of this item in lanes; fp32 pre-scaled into the base-2 domain, or raw bf16 pairs.
  const scalar_t* q = static_cast<const scalar_t*>(pb.q);
  for (int m = 0; m < Ml; ++m) {
    const scalar_t* qr = m < M ? q + w.b * pb.sq_b + (i0 + m / G) * pb.sq_t + (w.g * G + m % G) * pb.sq_h : nullptr;
    if constexpr (kDot) {
      uint16_t* qt = reinterpret_cast<uint16_t*>(s.qt);
      for (int d = 0; d < D; ++d) qt[((d >> 1) * Mp + m) * 2 + (d & 1)] = qr ? qr[d].x : 0;
    } else if (pb.narrow) {
      if (qr)
        for (int d = 0; d < D; ++d) s.qt[m * D + d] = static_cast<float>(qr[d]) * pb.scale_log2;
    } else {
      for (int d = 0; d < D; ++d) s.qt[d * Mp + m] = qr ? static_cast<float>(qr[d]) * pb.scale_log2 : 0.f;
    }
  }
  for (int m = 0; m < Ml; ++m) {
    s.mrow[m] = -INFINITY;
    s.lrow[m] = 0.f;
  }
  if (pb.narrow)
    for (int e = 0; e < M * D; ++e) s.ot[e] = 0.f;
  else
    for (int d = 0; d < pb.Dp; ++d)
      for (int m = 0; m < Ml; ++m) s.ot[d * Mp + m] = 0.f;

  // K/V rows are addressed only through kv_off: contiguous (row r at r * stride) or paged (the
  // sequence's page table row; the paged base has no sequence term, sk_b = sv_b = 0).
  const scalar_t* kb = static_cast<const scalar_t*>(pb.k) + w.b * pb.sk_b + w.g * pb.sk_h;
  const scalar_t* vb = static_cast<const scalar_t*>(pb.v) + w.b * pb.sv_b + w.g * pb.sv_h;
  const int32_t* table_row = pb.pages ? pb.pages + w.b * pb.s_pages : nullptr;
  auto kv_off = [&](int64_t r, int64_t s_page, int64_t s_row) {
    return table_row ? ta::kv_row_offset<true>(table_row, pb.log2_page, pb.num_pages, s_page, s_row, r)
                     : ta::kv_row_offset<false>(nullptr, 0, 0, 0, s_row, r);
  };
  constexpr bool kInPlace = std::is_same_v<scalar_t, float>;
  using K = std::conditional_t<kDot, uint16_t, float>;
  const K* kp[kTileN];
  const float* vp[kTileN];
  const scalar_t* krow[kTileN];  // the tile's rows in the cache
  const scalar_t* vrow[kTileN];
  float* kpk = ws + pb.off_kpk;
  float* vpk = ws + pb.off_vpk;
  const int64_t row_bytes = static_cast<int64_t>(D) * sizeof(scalar_t);
  // Paged rows lie in scattered pages, which the hardware prefetcher cannot follow: ask for the
  // next tile's rows while this one computes (contiguous caches stream without help).
  auto prefetch = [&](int len, auto&& row_of) {
    for (int n = 0; n < len; ++n) {
      const char* kr = reinterpret_cast<const char*>(kb + kv_off(row_of(n), pb.sk_pg, pb.sk_s));
      const char* vr = reinterpret_cast<const char*>(vb + kv_off(row_of(n), pb.sv_pg, pb.sv_s));
      for (int64_t off = 0; off < row_bytes; off += 64) {
        __builtin_prefetch(kr + off, 0, 3);
        __builtin_prefetch(vr + off, 0, 3);
      }
    }
  };
  // One K/V tile of `len` keys, the n-th at cache row row_of(n); masked by the block keys' lane
  // masks from colmask row j0 on, or unmasked (j0 < 0).
  auto visit = [&](int len, auto&& row_of, int j0) {
    const void* vsrc = vp;
    for (int n = 0; n < len; ++n) {
      krow[n] = kb + kv_off(row_of(n), pb.sk_pg, pb.sk_s);
      vrow[n] = vb + kv_off(row_of(n), pb.sv_pg, pb.sv_s);
    }
    if (pb.narrow) {  // rows in place, whatever the layout (each is read once per pass)
      if (j0 < 0) narrow_step<false>(s, krow, vrow, len, 0);
      else narrow_step<true>(s, krow, vrow, len, j0);
      return;
    }
    // fp32 paged rows are copied into the packed tiles (contiguous rows, as in a contiguous
    // cache): in place, a head's rows of a page lie Hkv * D apart (4 KiB at Hkv 8, D 128), so a
    // tile's rows share a few L1 sets and the Q K^T / P V passes, which read every row once per
    // chunk and head-dim group, miss on each (0.75x contiguous at the decode shape; 0.95x packed).
    // The same values in the same order: the same bits.
    const bool pack = kInPlace && table_row;
    if (pack)
      for (int n = 0; n < len; ++n) {
        std::memcpy(kpk + n * D, krow[n], row_bytes);
        std::memcpy(vpk + n * D, vrow[n], row_bytes);
      }
    // Rows past the tile repeat its last row: Q K^T computes them, the softmax never reads them.
    for (int n = 0; n < kTileN; ++n) {
      const int nn = n < len ? n : len - 1;
      if constexpr (kDot) {
        kp[n] = reinterpret_cast<const uint16_t*>(krow[nn]);
      } else if constexpr (kInPlace) {
        if (pack) {
          kp[n] = kpk + nn * D;
          vp[n] = vpk + nn * D;
        } else {
          kp[n] = krow[nn];
          vp[n] = vrow[nn];
        }
      } else {
        kp[n] = kpk + nn * D;
        vp[n] = vpk + nn * D;
      }
    }
    if constexpr (kDot) {
#if TA_ISA >= 3
      pack_pairs(vrow, len, D, pb.Dp, reinterpret_cast<uint16_t*>(vpk));
#endif
      vsrc = vpk;
    } else if constexpr (!kInPlace) {
      for (int n = 0; n < len; ++n) {
        const uint16_t* kr = reinterpret_cast<const uint16_t*>(krow[n]);
        const uint16_t* vr = reinterpret_cast<const uint16_t*>(vrow[n]);
        if constexpr (std::is_same_v<scalar_t, c10::Half>) {
          Vec::cvt_f16(kr, kpk + n * D, D);
          Vec::cvt_f16(vr, vpk + n * D, D);
        } else {
          Vec::cvt_bf16(kr, kpk + n * D, D);
          Vec::cvt_bf16(vr, vpk + n * D, D);
        }
      }
    }
    if (j0 < 0) tile_step<false, kDot>(s, kp, vsrc, len, 0);
    else tile_step<true, kDot>(s, kp, vsrc, len, j0);
  };

  if (pb.invariant) {
    // The batch-invariant schedule: this item is one query (its G heads in lanes); its keys are
    // its virtual sequence (ta::visible_block_keys), tiled from virtual position 0. A tile then
    // holds the same rows, in the same places, as in the AR step that has those block keys in the
    // cache, and every lane's arithmetic depends only on its own row: the same bits.
    int32_t* anc = reinterpret_cast<int32_t*>(colmask);
    const int32_t* mrow = pb.mask + (static_cast<int64_t>(w.b) * pb.Tq + i0) * pb.W;
    const int L = sl.prefix + ta::visible_block_keys(mrow, pb.W, sl.block, anc);
    for (int v0 = 0; v0 < L; v0 += kTileN) {
      const int len = L - v0 < kTileN ? L - v0 : kTileN;
      auto row_of = [&](int n) { return static_cast<int64_t>(ta::virtual_row(sl, anc, v0 + n)); };
      if (table_row && v0 + kTileN < L) {
        const int nlen = L - v0 - kTileN < kTileN ? L - v0 - kTileN : kTileN;
        prefetch(nlen, [&](int n) { return static_cast<int64_t>(ta::virtual_row(sl, anc, v0 + kTileN + n)); });
      }
      visit(len, row_of, -1);
    }
  } else {
    int32_t t0, t1;
    ta::split_range(ta::num_kv_tiles(sl, kTileN), pb.n_splits, w.s, &t0, &t1);
    const int np = static_cast<int>(ceil_div(sl.prefix, kTileN));
    // Lane masks of the block keys this split visits: bit (m % W) of colmask[j - jlo][m / W].
    const int jlo = (t0 > np ? t0 - np : 0) * kTileN;
    const int jhi = t1 > np ? ((t1 - np) * kTileN < sl.block ? (t1 - np) * kTileN : sl.block) : 0;
    if (jhi > jlo) {
      // kTileN extra zero rows: the register tiles of a short last tile read past the block.
      for (int64_t e = 0; e < static_cast<int64_t>(jhi - jlo + kTileN) * s.nvm; ++e) colmask[e] = 0;
      for (int qi = 0; qi < iv - i0; ++qi) {
        const int32_t* row = pb.mask + (static_cast<int64_t>(w.b) * pb.Tq + i0 + qi) * pb.W;
        for (int j32 = jlo; j32 < jhi; j32 += 32) {
          uint32_t bits = ta::mask_bits32(row, pb.W, j32, jhi);
          while (bits) {
            const int j = j32 + __builtin_ctz(bits) - jlo;
            bits &= bits - 1;
            for (int m = qi * G; m < (qi + 1) * G; ++m) colmask[static_cast<int64_t>(j) * s.nvm + m / W] |= 1u << (m % W);
          }
        }
      }
    }
    for (int t = t0; t < t1; ++t) {
      const ta::KvTile kt = ta::kv_tile(sl, t, kTileN);
      if (table_row && t + 1 < t1) {
        const ta::KvTile nx = ta::kv_tile(sl, t + 1, kTileN);
        prefetch(nx.len, [&](int n) { return static_cast<int64_t>(nx.start + n); });
      }
      visit(kt.len, [&](int n) { return static_cast<int64_t>(kt.start + n); }, kt.j0 < 0 ? -1 : kt.j0 - jlo);
    }
  }

  // O^T [Dp][Mp], or O [M][D] on the narrow path
  const int64_t od = pb.narrow ? 1 : Mp, om = pb.narrow ? D : 1;
  for (int m = 0; m < M; ++m) {
    const int i = i0 + m / G, h = w.g * G + m % G;
    const float l = s.lrow[m], inv = l > 0.f ? 1.f / l : 0.f;
    if (pb.n_splits == 1) {
      scalar_t* o = out_row(i, h);
      for (int d = 0; d < D; ++d) o[d] = scalar_t(s.ot[d * od + m * om] * inv);
    } else {
      const int64_t r = ((static_cast<int64_t>(w.s) * pb.B + w.b) * pb.Tq + i) * pb.Hq + h;
      float* po = pb.part_o + r * D;
      for (int d = 0; d < D; ++d) po[d] = s.ot[d * od + m * om] * inv;
      pb.part_lse[r] = ta::lse2(s.mrow[m], l);
    }
  }
}

// Merges the n_splits partial results of output rows [r0, r1), r = (b * Tq + i) * Hq + h.
template <typename scalar_t>
void combine(const ta::Problem& pb, int64_t r0, int64_t r1) {
  const int D = pb.D, ns = pb.n_splits;
  const int64_t rows = static_cast<int64_t>(pb.B) * pb.Tq * pb.Hq;
  float wt[ta::kMaxSplits];
  for (int64_t r = r0; r < r1; ++r) {
    const int b = static_cast<int>(r / (static_cast<int64_t>(pb.Tq) * pb.Hq));
    const int i = static_cast<int>(r / pb.Hq % pb.Tq), h = static_cast<int>(r % pb.Hq);
    const int32_t ql = ta::clamp_i32(pb.q_lens ? pb.q_lens[b] : pb.Tq, 0, pb.Tq);
    scalar_t* o = static_cast<scalar_t*>(pb.out) + b * pb.so_b + i * pb.so_t + h * pb.so_h;
    float mx = -INFINITY;
    for (int p = 0; p < ns && i < ql; ++p) mx = pb.part_lse[p * rows + r] > mx ? pb.part_lse[p * rows + r] : mx;
    if (mx == -INFINITY) {
      for (int d = 0; d < D; ++d) o[d] = scalar_t(0.f);
      continue;
    }
    float total = 0.f;
    for (int p = 0; p < ns; ++p) total += wt[p] = ta::combine_weight(pb.part_lse[p * rows + r], mx);
    const float inv = 1.f / total;
    for (int d = 0; d < D; ++d) {
      float acc = 0.f;
      for (int p = 0; p < ns; ++p) acc += wt[p] * pb.part_o[(p * rows + r) * D + d];
      o[d] = scalar_t(acc * inv);
    }
  }
}
