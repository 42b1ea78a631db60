// Tensor-core building blocks for fp16/bf16 kernels on sm_80+: mma.sync m16n8k16 (fp32
// accumulate), ldmatrix .x4 (plain and .trans) and cp.async 16-byte copies with zero fill. On a
// device they are the PTX instructions; under the emulator (SPECOPS_CUDASIM) they are warp exchanges
// that move the same fragments, so kernels built on them run, and are tested, on the CPU.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "ldmatrix"), with g = lane / 4 and t = lane % 4; each 32-bit register holds two 16-bit values,
// the lower column (or row) in the low half:
//   A (16x16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   B (16x8, "col"):      b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   C, D (16x8, fp32):    d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
//   ldmatrix .x4: lanes 8q..8q+7 give the row addresses (16 bytes each) of 8x8 matrix q; register
//   r[q] of lane l gets row l/4, columns 2(l%4)..+1 of matrix q (.trans: column l/4, rows 2(l%4)..+1).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "gpu.cuh"

namespace specops {
namespace tc {

// Two values of T (c10::Half or c10::BFloat16), rounded to nearest even, packed low then high.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(T(lo).x) | (static_cast<uint32_t>(T(hi).x) << 16);
}

#if defined(SPECOPS_CUDASIM)

namespace sim {

template <typename T>
inline float value(uint32_t reg, int half) {
  T v;
  v.x = static_cast<uint16_t>(half ? reg >> 16 : reg & 0xFFFFu);
  return static_cast<float>(v);
}

struct MmaIn {
  const uint32_t* a;  // [4]
  const uint32_t* b;  // [2]
  const float* c;     // [4]
};

template <typename T>
void mma_all(const void* const* ins, void* const* outs) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto* in = static_cast<const MmaIn*>(ins[l]);
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = value<T>(in->a[0], h);
      A[g + 8][2 * t + h] = value<T>(in->a[1], h);
      A[g][2 * t + 8 + h] = value<T>(in->a[2], h);
      A[g + 8][2 * t + 8 + h] = value<T>(in->a[3], h);
      B[2 * t + h][g] = value<T>(in->b[0], h);
      B[2 * t + 8 + h][g] = value<T>(in->b[1], h);
      C[g][2 * t + h] = in->c[h];
      C[g + 8][2 * t + h] = in->c[2 + h];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    float* d = static_cast<float*>(outs[l]);
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e / 2), col = 2 * t + (e % 2);
      double acc = 0.0;  // fp16/bf16 products are exact in fp32; the sum is rounded once
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[r][k]) * B[k][col];
      d[e] = static_cast<float>(acc + C[r][col]);
    }
  }
}

template <bool kTrans>
void ldsm_all(const void* const* ins, void* const* outs) {
  for (int l = 0; l < 32; ++l) {
    const auto* row_addr = static_cast<const uint16_t* const*>(ins[l]);
    TORCH_CHECK(reinterpret_cast<uintptr_t>(*row_addr) % 16 == 0,
                "cudasim: ldmatrix row addresses must be 16-byte aligned (lane ", l, ")");
  }
  for (int l = 0; l < 32; ++l) {
    uint32_t* r = static_cast<uint32_t*>(outs[l]);
    for (int q = 0; q < 4; ++q) {
      auto elem = [&](int row, int col) {  // matrix q, row `row` (its address came from lane 8q + row)
        return *(*static_cast<const uint16_t* const*>(ins[8 * q + row]) + col);
      };
      const int a = l / 4, b = 2 * (l % 4);
      const uint16_t lo = kTrans ? elem(b, a) : elem(a, b);
      const uint16_t hi = kTrans ? elem(b + 1, a) : elem(a, b + 1);
      r[q] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

}  // namespace sim

// d += A * B for this warp's fragments.
template <typename T>
inline void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], CUDASIM_SITE) {
  const float c[4] = {d[0], d[1], d[2], d[3]};
  const sim::MmaIn in{a, b, c};
  ::cudasim::detail::warp_exchange("mma.sync.m16n8k16", sim::mma_all<T>, &in, d, file, line);
}

// Each lane's row is recorded as its read for racecheck: the exchange reads it on the last lane.
inline void ldsm_x4(uint32_t (&r)[4], const void* row, CUDASIM_SITE) {
  ::cudasim::detail::rc_note(row, 16, 0, file, line);
  ::cudasim::detail::warp_exchange("ldmatrix.x4", sim::ldsm_all<false>, &row, r, file, line);
}

inline void ldsm_x4_trans(uint32_t (&r)[4], const void* row, CUDASIM_SITE) {
  ::cudasim::detail::rc_note(row, 16, 0, file, line);
  ::cudasim::detail::warp_exchange("ldmatrix.x4.trans", sim::ldsm_all<true>, &row, r, file, line);
}

// 16 bytes from global to shared memory, or 16 zero bytes when !valid (src is not read).
inline void cp_async16(void* smem, const void* src, bool valid, CUDASIM_SITE) {
  ::cudasim::detail::cp_async(smem, src, 16, valid ? 16 : 0, file, line);
}
inline void cp_async_commit() { ::cudasim::detail::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::cudasim::detail::cp_async_wait(N);
}

#else  // a device

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // built for sm_80 and sm_90 only
#endif
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row)));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* src, bool valid) {
  // src-size 0 zero-fills the 16 bytes without reading src
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif

}  // namespace tc
}  // namespace specops
