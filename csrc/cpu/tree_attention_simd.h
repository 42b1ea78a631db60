// SIMD traits of the CPU tree_attention kernel: one struct `Vec` per instruction set, with the
// handful of fp32 vector operations the kernel is written against.
//
// No include guard on purpose: tree_attention.cpp includes this (through
// tree_attention_kernel.h) once per instruction set, each time inside a
// `#pragma GCC target(...)` region and a namespace of its own, with TA_ISA set to
//   0 generic C++ (any x86-64 or other CPU), 1 AVX2+FMA+F16C, 2 AVX-512 (F/BW/VL/DQ),
//   3 AVX-512 plus AVX512_BF16 (the same as 2; the kernel adds the bf16 dot products).
// Only functions defined inside the region carry its target, so each copy is a separate
// set of symbols and the .so runs on CPUs without AVX-512 (dispatch: __builtin_cpu_supports).

#ifndef TA_INLINE
#define TA_INLINE inline __attribute__((always_inline))
#endif

#if TA_ISA >= 2

struct Vec {
  static constexpr int W = 16;  // fp32 lanes
  using vf = __m512;
  static TA_INLINE vf zero() { return _mm512_setzero_ps(); }
  static TA_INLINE vf set1(float x) { return _mm512_set1_ps(x); }
  static TA_INLINE vf load(const float* p) { return _mm512_loadu_ps(p); }
  static TA_INLINE void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
  static TA_INLINE vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
  static TA_INLINE vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
  static TA_INLINE vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
  static TA_INLINE vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
  static TA_INLINE vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
  static TA_INLINE float hsum(vf a) { return _mm512_reduce_add_ps(a); }
  // Lane k takes a where bit k of `bits` is set, b elsewhere.
  static TA_INLINE vf select(uint32_t bits, vf a, vf b) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>(bits), b, a);
  }
  // 2^x; exactly 0 for x <= -150 (masked scores are -inf).
  static TA_INLINE vf exp2(vf x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.f)), _mm512_set1_ps(128.f));
    const vf n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf f = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
    vf p = _mm512_set1_ps(1.5403530393381609e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
  }
  // W fp32 lanes from W fp16 / bf16 values (the narrow path converts K/V rows in registers).
  static TA_INLINE vf load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static TA_INLINE vf load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static TA_INLINE void cvt_f16(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
  static TA_INLINE void cvt_bf16(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::BFloat16(src[i], c10::BFloat16::from_bits()));
  }
};

#elif TA_ISA == 1

struct Vec {
  static constexpr int W = 8;
  using vf = __m256;
  static TA_INLINE vf zero() { return _mm256_setzero_ps(); }
  static TA_INLINE vf set1(float x) { return _mm256_set1_ps(x); }
  static TA_INLINE vf load(const float* p) { return _mm256_loadu_ps(p); }
  static TA_INLINE void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
  static TA_INLINE vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
  static TA_INLINE vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
  static TA_INLINE vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
  static TA_INLINE vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
  static TA_INLINE vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
  static TA_INLINE float hsum(vf a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
  }
  static TA_INLINE vf select(uint32_t bits, vf a, vf b) {
    const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane), lane);
    return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(on));
  }
  // 2^x; exactly 0 for x <= -127.
  static TA_INLINE vf exp2(vf x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
    const vf n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf f = _mm256_sub_ps(x, n);
    vf p = _mm256_set1_ps(1.5403530393381609e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    // 2^n by building the exponent field; n = -127 gives the bit pattern of 0.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static TA_INLINE vf load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static TA_INLINE vf load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static TA_INLINE void cvt_f16(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
  static TA_INLINE void cvt_bf16(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::BFloat16(src[i], c10::BFloat16::from_bits()));
  }
};

#else

// Portable fallback: plain loops over 8 lanes (the compiler vectorises what it can).
struct Vec {
  static constexpr int W = 8;
  struct vf {
    float v[8];
  };
  static TA_INLINE vf zero() { return set1(0.f); }
  static TA_INLINE vf set1(float x) {
    vf r;
    for (int k = 0; k < W; ++k) r.v[k] = x;
    return r;
  }
  static TA_INLINE vf load(const float* p) {
    vf r;
    for (int k = 0; k < W; ++k) r.v[k] = p[k];
    return r;
  }
  static TA_INLINE void store(float* p, vf a) {
    for (int k = 0; k < W; ++k) p[k] = a.v[k];
  }
#define TA_LANEWISE(name, expr)                   \
  static TA_INLINE vf name(vf a, vf b) {          \
    vf r;                                         \
    for (int k = 0; k < W; ++k) r.v[k] = (expr);  \
    return r;                                     \
  }
  TA_LANEWISE(mul, a.v[k] * b.v[k])
  TA_LANEWISE(add, a.v[k] + b.v[k])
  TA_LANEWISE(sub, a.v[k] - b.v[k])
  TA_LANEWISE(max, a.v[k] > b.v[k] ? a.v[k] : b.v[k])
#undef TA_LANEWISE
  static TA_INLINE float hsum(vf a) {  // the AVX2 order: (k, k + 4) pairs, then halves
    float h[4];
    for (int k = 0; k < 4; ++k) h[k] = a.v[k] + a.v[k + 4];
    return (h[0] + h[2]) + (h[1] + h[3]);
  }
  static TA_INLINE vf fma(vf a, vf b, vf c) {
    vf r;
    for (int k = 0; k < W; ++k) r.v[k] = a.v[k] * b.v[k] + c.v[k];
    return r;
  }
  static TA_INLINE vf select(uint32_t bits, vf a, vf b) {
    vf r;
    for (int k = 0; k < W; ++k) r.v[k] = (bits >> k) & 1u ? a.v[k] : b.v[k];
    return r;
  }
  static TA_INLINE vf exp2(vf a) {
    vf r;
    for (int k = 0; k < W; ++k) r.v[k] = a.v[k] <= -150.f ? 0.f : exp2f(a.v[k]);
    return r;
  }
  static TA_INLINE vf load_f16(const uint16_t* p) {
    vf r;
    cvt_f16(p, r.v, W);
    return r;
  }
  static TA_INLINE vf load_bf16(const uint16_t* p) {
    vf r;
    cvt_bf16(p, r.v, W);
    return r;
  }
  static TA_INLINE void cvt_f16(const uint16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
  static TA_INLINE void cvt_bf16(const uint16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(c10::BFloat16(src[i], c10::BFloat16::from_bits()));
  }
};

#endif

