// linear on CUDA: a GEMV-style kernel for small row counts whose every output element is reduced in
// one fixed order, a function of K alone (specops/ops/linear, the batch-invariance contract).
//
// A block of 4 warps owns 8 output columns (2 a warp) and up to 16 rows, in register groups of 8.
// Lane l of a warp owns the K elements k = 128 s + 4 l + e (steps s ascending, e = 0..3 within a
// step) and accumulates their products with one fmaf chain in that order, for each of its 2 x 8
// (column, row) pairs; the 32 lane partials are then combined by the xor shuffle tree 16, 8, 4, 2,
// 1 (every lane ends with the same sum: a + b == b + a), the bias added, and the sum rounded once
// to the output dtype. Nothing in that order depends on M, on the element's row within its group,
// on the grid or on blockIdx, so row i of an M-row call equals the one-row call on row i bit for bit.
//
// The rows of a group are staged in shared memory as fp32, 512 K elements at a time, and every
// weight vector a lane loads serves all 8 rows of the group. Weights are read with 4-element
// vector loads when the weight's pointer and row stride allow (the chain is the same either way).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "gpu.cuh"
#include "../common.h"
#include "../registration.h"

namespace specops {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kCols = 2;                    // output columns a warp
constexpr int kBlockCols = kWarps * kCols;  // output columns a block
constexpr int kRows = 8;                    // rows a register group
constexpr int kGroups = 2;                  // register groups a block, one after the other
constexpr int kVec = 4;                     // consecutive K elements a lane takes per step
constexpr int kStep = 32 * kVec;            // K elements a warp covers per step
constexpr int kChunk = 4 * kStep;           // K elements of x staged per pass (8 x 512 fp32 = 16 KiB)
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxGridY = 65535;

template <typename T>
__device__ __forceinline__ float bits_to_float(unsigned bits) {  // bits: one 16-bit value
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return __uint_as_float(bits << 16);
  } else {
    return static_cast<float>(c10::Half(static_cast<uint16_t>(bits), c10::Half::from_bits()));
  }
}

// w[0..3] of the lane's step (k < K), 0 past K. Vec: one aligned 4-element load (then K % 4 == 0,
// so the vector lies within K).
template <typename T, bool Vec>
__device__ __forceinline__ void load_w(const T* __restrict__ row, int64_t k, int64_t K, float (&w)[kVec]) {
  if constexpr (Vec && std::is_same_v<T, float>) {
    const float4 v = *reinterpret_cast<const float4*>(row + k);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (Vec) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + k);
    w[0] = bits_to_float<T>(v.x & 0xffffu), w[1] = bits_to_float<T>(v.x >> 16);
    w[2] = bits_to_float<T>(v.y & 0xffffu), w[3] = bits_to_float<T>(v.y >> 16);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) w[e] = k + e < K ? static_cast<float>(row[k + e]) : 0.f;
  }
}

// out [M, N] = x [M, K] @ w [N, K]^T (+ bias [N]); x and w with unit column stride.
template <typename T, bool Vec>
__global__ void __launch_bounds__(kThreads)
linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* out,
              int64_t M, int64_t N, int64_t K, int64_t sx, int64_t sw) {
  __shared__ __align__(16) float xs[kRows][kChunk];  // the group's rows, one chunk of K, 0 past M and K
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBlockCols + warp * kCols;
  const T* wrow[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wrow[c] = w + std::min<int64_t>(col0 + c, N - 1) * sw;  // clamped: read, never stored

  // Every loop bound below is uniform over the block, so every thread reaches each barrier.
  for (int64_t base = static_cast<int64_t>(blockIdx.y) * kRows * kGroups; base < M;
       base += static_cast<int64_t>(gridDim.y) * kRows * kGroups) {
    for (int64_t row0 = base; row0 < std::min<int64_t>(M, base + kRows * kGroups); row0 += kRows) {
      float acc[kCols][kRows];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[c][r] = 0.f;

      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        __syncthreads();  // the previous chunk's readers are done with xs
        for (int i = threadIdx.x; i < kRows * kChunk; i += kThreads) {
          const int r = i / kChunk, kk = i % kChunk;
          const int64_t m = row0 + r, k = k0 + kk;
          xs[r][kk] = m < M && k < K ? static_cast<float>(x[m * sx + k]) : 0.f;
        }
        __syncthreads();
        const int steps = static_cast<int>(std::min<int64_t>(kChunk, K - k0) + kStep - 1) / kStep;
        for (int s = 0; s < steps; ++s) {
          const int kk = s * kStep + lane * kVec;
          const int64_t k = k0 + kk;
          if (k >= K) continue;  // this lane's elements of the step are all past K
          float wv[kCols][kVec];
#pragma unroll
          for (int c = 0; c < kCols; ++c) load_w<T, Vec>(wrow[c], k, K, wv[c]);
          const int n_e = static_cast<int>(std::min<int64_t>(kVec, K - k));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float4 xv = *reinterpret_cast<const float4*>(&xs[r][kk]);
            const float xe[kVec] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              if (e < n_e) {  // elements past K are skipped, not added as 0 * 0
#pragma unroll
                for (int c = 0; c < kCols; ++c) acc[c][r] = __fmaf_rn(wv[c][e], xe[e], acc[c][r]);
              }
            }
          }
        }
      }

      // The fixed lane tree, then lane c * kRows + r stores (column c, row r).
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float v = acc[c][r];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
          const int64_t m = row0 + r, n = col0 + c;
          if (lane == c * kRows + r && m < M && n < N) {
            if (bias != nullptr) v += static_cast<float>(bias[n]);
            out[m * N + n] = static_cast<T>(v);
          }
        }
      }
    }
  }
}

template <typename T, bool Vec>
void launch(const at::Tensor& x, const at::Tensor& w, const T* bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const dim3 grid(static_cast<unsigned>(ceil_div(N, kBlockCols)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div(M, kRows * kGroups), kMaxGridY)));
  SPECOPS_LAUNCH(grid, kThreads, 0, gpu::current_stream(), linear_kernel<T, Vec>)(
      x.data_ptr<T>(), w.data_ptr<T>(), bias, out.data_ptr<T>(), M, N, K, x.stride(0), w.stride(0));
  SPECOPS_LAUNCH_CHECK();
}

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  // Vector loads of the weight where its pointer and row stride keep every vector aligned.
  const bool vec = x.size(1) % kVec == 0 && w.stride(0) % kVec == 0 &&
                   reinterpret_cast<uintptr_t>(w.data_ptr()) % (kVec * sizeof(T)) == 0;
  const T* bp = bias ? bias->data_ptr<T>() : nullptr;
  vec ? launch<T, true>(x, w, bp, out) : launch<T, false>(x, w, bp, out);
}

}  // namespace

at::Tensor linear_cuda(const at::Tensor& x,       // [M, K] fp32/bf16/fp16
                       const at::Tensor& weight,  // [N, K] same dtype
                       const std::optional<at::Tensor>& bias)  // [N] same dtype
{
  SPECOPS_CHECK_DIM(x, 2);
  SPECOPS_CHECK_DIM(weight, 2);
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(x) && SPECOPS_ON_GPU(weight) && weight.device() == x.device(),
              "linear: " SPECOPS_GPU_NAME " tensors on one device expected");
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), "linear: weight must have x's dtype ", x.scalar_type(),
              ", got ", weight.scalar_type());
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK_VALUE(weight.size(1) == K, "linear: weight must have shape [N, ", K, "], got ", weight.sizes());
  TORCH_CHECK_VALUE(K > 0, "linear: K must be >= 1, got ", K);
  TORCH_CHECK_VALUE(ceil_div(N, kBlockCols) <= 0x7fffffff, "linear: N = ", N, " exceeds the grid");
  if (bias) {
    SPECOPS_CHECK_DIM((*bias), 1);
    TORCH_CHECK_VALUE(bias->scalar_type() == x.scalar_type() && bias->size(0) == N && bias->device() == x.device(),
                "linear: bias must be [N] of x's dtype on x's device");
  }
  const gpu::DeviceGuard guard(x.device());
  auto out = at::empty({M, N}, x.options());
  if (out.numel() == 0) return out;
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor wc = weight.stride(1) == 1 ? weight : weight.contiguous();
  const std::optional<at::Tensor> bc = bias ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  AT_DISPATCH_SWITCH(x.scalar_type(), "linear_cuda",
                     AT_DISPATCH_CASE(at::ScalarType::Float, [&] { run<scalar_t>(xc, wc, bc, out); })
                     AT_DISPATCH_CASE(at::ScalarType::Half, [&] { run<scalar_t>(xc, wc, bc, out); })
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] { run<scalar_t>(xc, wc, bc, out); }));
  return out;
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) { m.impl("linear", &specops::linear_cuda); }
