// 16-lane vector loops of the sampling and topn CPU kernels (GCC vector extensions),
// compiled once per x86-64 ISA level and dispatched on CPU features once per process, so the
// .so runs on any x86-64 and uses AVX-512 where it exists.
//
// Why not target_clones: GCC lowers generic vector code for the baseline ISA before it clones
// a function (or inlines a helper), and lowers mask logic there lane by lane. Code compiled
// under `#pragma GCC target` is lowered for that ISA from the start.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../sampling_common.h"

// Vectors are only passed between functions compiled for the same ISA (and the helpers are
// inlined), so the ABI notes about 64-byte vector arguments do not apply. (GCC reports them
// at the end of the translation unit, so the warning stays off for the includer.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace specops {
namespace simd {

constexpr int kW = 16;
constexpr float kExpMin = -87.33654f;  // below it exp(x) is denormal; flushed to 0
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

struct Loops {
  float (*row_max)(const float* x, int64_t V);
  void (*shift_scale)(const float* x, float* z, int64_t V, float m, float t);
  double (*exp_masked)(const float* z, float* e, int64_t V, float m, float lo);
  double (*sum_masked)(const float* z, const float* e, int64_t V, float lo);
  void (*normalize_masked)(const float* z, float* e, int64_t V, float lo, float sum);
  int64_t (*next_above)(const float* c, int64_t i, int64_t V, float bias, float thr);
  uint64_t (*mass_total)(const float* e, int64_t V, int shift);
  int64_t (*compact_ge)(const float* src, int64_t V, float floor_, int32_t* idx);
  int64_t (*count_ge)(const float* src, int64_t V, float floor_);
  // One entry of a warped row, by the lane arithmetic of shift_scale, exp_masked (m = 0) and
  // normalize_masked: bit-identical to that entry of the row those three passes write.
  float (*prob_at)(float x, float m, float t, float lo, float sum);
};

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
namespace v4 {
#include "sampling_simd.inc"
}  // namespace v4
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
namespace v3 {
#include "sampling_simd.inc"
}  // namespace v3
#pragma GCC pop_options

namespace v1 {
#include "sampling_simd.inc"
}  // namespace v1

// The loops for this CPU: x86-64-v4 (AVX-512 F/BW/DQ/VL), v3 (AVX2 + FMA) or the baseline.
inline const Loops& loops() {
  static const Loops chosen = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      return v4::table();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return v3::table();
    return v1::table();
  }();
  return chosen;
}

}  // namespace simd
}  // namespace specops
