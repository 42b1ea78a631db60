// The CPU tree_attention kernel's narrow path (head dims in lanes), included by
// tree_attention_kernel.h once per instruction set (no include guard, as that file).

// Narrow items (pb.narrow: <= kNarrow query rows, e.g. a decode step's GQA group, or every item of
// the batch-invariant schedule when G <= kNarrow). Query rows in lanes would leave most lanes idle
// and pay a broadcast per key and head dim, so here the head dim is in lanes: a score is one dot
// product (FMAs down D, one horizontal sum), and P V adds p * V rows into [M][D] fp32 accumulators.
// K/V rows are read in place (fp16 / bf16 widened in registers). Layout: Q [M][D] (pre-scaled into
// the base-2 domain), O [M][D]; scores and probabilities [M][kTileN] in the S^T scratch.
template <typename T>
TA_INLINE vf load_row(const T* p) {
  if constexpr (std::is_same_v<T, float>) return Vec::load(p);
  else if constexpr (std::is_same_v<T, c10::Half>) return Vec::load_f16(reinterpret_cast<const uint16_t*>(p));
  else return Vec::load_bf16(reinterpret_cast<const uint16_t*>(p));
}

#if TA_ISA >= 2
// The sums of a, b, c, d in lanes 0, 4, 8, 12, each paired as _mm512_reduce_add_ps pairs one vector's
// lanes (i + (i + 8), then + 4, then + 2, then + 1; IEEE addition commutes), so each equals
// Vec::hsum of its vector bit for bit.
TA_INLINE __m512 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 x = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
}
#endif

// O[m][d..d + DG W) = al[m] O[m][..] + sum_n P[m][n] V[n][..], in increasing n: each element's chain
// is the same whatever DG (the bits do not depend on the grouping).
template <int M, int DG, typename T>
TA_INLINE void narrow_pv(const ItemState& s, const T* const* vp, const float* sc, int len, int d, const float* al) {
  const int D = s.pb->D;
  vf acc[M][DG];
  TA_UNROLL for (int m = 0; m < M; ++m) TA_UNROLL for (int g = 0; g < DG; ++g)
    acc[m][g] = Vec::mul(Vec::load(s.ot + m * D + d + g * W), Vec::set1(al[m]));
  for (int n = 0; n < len; ++n) {
    vf v[DG];
    TA_UNROLL for (int g = 0; g < DG; ++g) v[g] = load_row(vp[n] + d + g * W);
    TA_UNROLL for (int m = 0; m < M; ++m) {
      const vf p = Vec::set1(sc[m * kTileN + n]);
      TA_UNROLL for (int g = 0; g < DG; ++g) acc[m][g] = Vec::fma(p, v[g], acc[m][g]);
    }
  }
  TA_UNROLL for (int m = 0; m < M; ++m) TA_UNROLL for (int g = 0; g < DG; ++g)
    Vec::store(s.ot + m * D + d + g * W, acc[m][g]);
}

template <int M, bool kMasked, typename T>
void narrow_tile(const ItemState& s, const T* const* kp, const T* const* vp, int len, int j0) {
  const int D = s.pb->D, dv = D / W * W, lp = (len + W - 1) / W * W;
  float* sc = s.st;
  // A score's tail (head dims past whole vectors) and mask, after its vector sum x.
  auto finish = [&](int m, int n, float x) {
    for (int d = dv; d < D; ++d) x += static_cast<float>(kp[n][d]) * s.qt[m * D + d];
    if constexpr (kMasked) {
      if (!((s.colmask[static_cast<int64_t>(j0 + n) * s.nvm + m / W] >> (m % W)) & 1u)) x = -INFINITY;
    }
    sc[m * kTileN + n] = x;
  };
  int n = 0;
#if TA_ISA >= 2
  // Four keys at a time (M <= kNarrow): 4M independent chains down the head dims, and the four sums
  // of a row in one butterfly, whose pairings are _mm512_reduce_add_ps's (hsum4): the same bits as
  // one key at a time, at ~half the shuffles.
  if constexpr (M <= kNarrow) {
    for (; n + 4 <= len; n += 4) {
      vf acc[M][4];
      TA_UNROLL for (int m = 0; m < M; ++m) TA_UNROLL for (int j = 0; j < 4; ++j) acc[m][j] = Vec::zero();
      for (int d = 0; d < dv; d += W) {
        vf kv[4];
        TA_UNROLL for (int j = 0; j < 4; ++j) kv[j] = load_row(kp[n + j] + d);
        TA_UNROLL for (int m = 0; m < M; ++m) {
          const vf q = Vec::load(s.qt + m * D + d);
          TA_UNROLL for (int j = 0; j < 4; ++j) acc[m][j] = Vec::fma(kv[j], q, acc[m][j]);
        }
      }
      TA_UNROLL for (int m = 0; m < M; ++m) {
        alignas(64) float x[W];
        Vec::store(x, hsum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
        TA_UNROLL for (int j = 0; j < 4; ++j) finish(m, n + j, x[4 * j]);
      }
    }
  }
#endif
  for (; n < len; ++n) {
    const T* k = kp[n];
    vf acc[M];
    TA_UNROLL for (int m = 0; m < M; ++m) acc[m] = Vec::zero();
    for (int d = 0; d < dv; d += W) {
      const vf kv = load_row(k + d);
      TA_UNROLL for (int m = 0; m < M; ++m) acc[m] = Vec::fma(kv, Vec::load(s.qt + m * D + d), acc[m]);
    }
    TA_UNROLL for (int m = 0; m < M; ++m) finish(m, n, Vec::hsum(acc[m]));
  }
  // Online softmax per row; rows that saw nothing keep a finite reference, as in chunk_step.
  alignas(64) float al[M];
  TA_UNROLL for (int m = 0; m < M; ++m) {
    float* r = sc + m * kTileN;
    for (int n = len; n < lp; ++n) r[n] = -INFINITY;
    // The max lane-wise, then across lanes (a scalar chain of len dependent compares cost ~1/4 of the
    // tile). max(x, m) keeps m where x is NaN, as the scalar compare did.
    vf vmx = Vec::set1(-INFINITY);
    for (int n = 0; n < lp; n += W) vmx = Vec::max(Vec::load(r + n), vmx);
    alignas(64) float lanes[W];
    Vec::store(lanes, vmx);
    float mx = -INFINITY;
    for (int k = 0; k < W; ++k) mx = lanes[k] > mx ? lanes[k] : mx;
    const float m_old = s.mrow[m], m_new = m_old > mx ? m_old : mx, ref = m_new > -3.0e38f ? m_new : -3.0e38f;
    s.mrow[m] = m_new;
    alignas(64) float a[W];
    Vec::store(a, Vec::exp2(Vec::set1(m_old - ref)));
    al[m] = a[0];
    const vf rv = Vec::set1(ref);
    vf sum = Vec::zero();
    for (int n = 0; n < lp; n += W) {
      const vf p = Vec::exp2(Vec::sub(Vec::load(r + n), rv));
      Vec::store(r + n, p);
      sum = Vec::add(sum, p);
    }
    s.lrow[m] = s.lrow[m] * al[m] + Vec::hsum(sum);
  }
  // P V over DG vectors of head dims at a time: M x DG independent accumulator chains (one per
  // vector of head dims, M = 3, was latency-bound: ~1/3 of the tile's time).
  constexpr int DG = M <= kNarrow ? (W >= 16 ? 4 : 2) : 1;
  int d = 0;
  for (; d + DG * W <= dv; d += DG * W) narrow_pv<M, DG>(s, vp, sc, len, d, al);
  for (; d < dv; d += W) narrow_pv<M, 1>(s, vp, sc, len, d, al);
  for (int d = dv; d < D; ++d)
    TA_UNROLL for (int m = 0; m < M; ++m) {
      float o = s.ot[m * D + d] * al[m];
      for (int n = 0; n < len; ++n) o += sc[m * kTileN + n] * static_cast<float>(vp[n][d]);
      s.ot[m * D + d] = o;
    }
}

template <bool kMasked, typename T>
void narrow_step(const ItemState& s, const T* const* kp, const T* const* vp, int len, int j0) {
  switch (s.M) {
    case 1: narrow_tile<1, kMasked>(s, kp, vp, len, j0); return;
    case 2: narrow_tile<2, kMasked>(s, kp, vp, len, j0); return;
    case 3: narrow_tile<3, kMasked>(s, kp, vp, len, j0); return;
    default: narrow_tile<4, kMasked>(s, kp, vp, len, j0); return;
  }
}
