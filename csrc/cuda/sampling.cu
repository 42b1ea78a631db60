// warp_probs on CUDA: one block per row. The row is streamed from global memory (L2) once per
// pass: max, then (if enabled) a 4-pass radix select for the top-k key, the fixed-point mass
// total and a 4-pass radix select for the top-p key, then the kept sum and the write.
// Same rule and same decisions as the CPU kernel (csrc/sampling_common.h).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../registration.h"
#include "../sampling_common.h"
#include "sampling_block.cuh"

namespace specops {
namespace {

constexpr int kThreads = 512;

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    warp_probs_kernel(const scalar_t* __restrict__ logits,  // [N, V], row stride row_stride
                      int64_t row_stride,
                      const float* __restrict__ temperature,  // [N]
                      const int32_t* __restrict__ top_k,      // [N]
                      const float* __restrict__ top_p,        // [N]
                      float* __restrict__ out,                // [N, V]
                      int64_t V) {
  __shared__ float s_float[32];
  __shared__ long long s_index[32];
  __shared__ unsigned long long s_mass[32];
  __shared__ block::RadixShared<unsigned int> s_count_select;
  __shared__ block::RadixShared<unsigned long long> s_mass_select;

  const int64_t row = blockIdx.x;
  const scalar_t* x = logits + row * row_stride;
  float* o = out + row * V;
  const float t = temperature[row];

  if (greedy_temperature(t)) {
    // Greedy: the first index of the maximal logit (NaN never wins).
    float best = -kInf;
    long long idx = V;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float v = static_cast<float>(x[i]);
      if (v > best || (idx == V && v == best)) {
        best = v;
        idx = i;
      }
    }
    const float m = block::reduce(best, block::Max(), s_float);
    long long am = block::reduce(best == m ? idx : static_cast<long long>(V), block::Min(), s_index);
    if (am >= V) am = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) o[i] = i == am ? 1.0f : 0.0f;
    return;
  }

  // z = (x - max x) / t: subtracting the row max first keeps huge logits and tiny temperatures
  // finite; max z = 0, so the unnormalised probabilities are exp(z).
  float mx = -kInf;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, static_cast<float>(x[i]));
  mx = block::reduce(mx, block::Max(), s_float);
  auto z = [&](int64_t i) { return __fdiv_rn(__fsub_rn(static_cast<float>(x[i]), mx), t); };
  const float scale = mass_scale(V);

  uint32_t kappa = 0;  // keep float_key(z) >= kappa
  const int32_t k = top_k[row];
  if (k > 0 && k < V) {
    kappa = block::radix_select<unsigned int>(
        V,
        [&](int64_t i, uint32_t& key) {
          key = float_key(z(i));
          return 1u;
        },
        static_cast<unsigned int>(k), &s_count_select);
  }
  const float p = top_p[row];
  if (p < 1.0f) {
    unsigned long long total = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float zi = z(i);
      if (float_key(zi) >= kappa) total += mass_fixed(expf(zi), scale);
    }
    total = block::reduce(total, block::Sum(), s_mass);
    const uint32_t kp = block::radix_select<unsigned long long>(
        V,
        [&](int64_t i, uint32_t& key) {
          const float zi = z(i);
          key = float_key(zi);
          return key >= kappa ? static_cast<unsigned long long>(mass_fixed(expf(zi), scale)) : 0ull;
        },
        static_cast<unsigned long long>(top_p_target(p, total)), &s_mass_select);
    kappa = kp > kappa ? kp : kappa;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float zi = z(i);
    sum += float_key(zi) >= kappa ? expf(zi) : 0.0f;
  }
  sum = block::reduce(sum, block::Sum(), s_float);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float zi = z(i);
    o[i] = float_key(zi) >= kappa ? expf(zi) / sum : 0.0f;
  }
}

at::Tensor warp_probs_cuda(const at::Tensor& logits,       // [N, V] fp32/bf16/fp16
                           const at::Tensor& temperature,  // [N] fp32
                           const at::Tensor& top_k,        // [N] int32
                           const at::Tensor& top_p)        // [N] fp32
{
  SPECOPS_CHECK_DIM(logits, 2);
  SPECOPS_CHECK_DTYPE(temperature, at::kFloat);
  SPECOPS_CHECK_DTYPE(top_k, at::kInt);
  SPECOPS_CHECK_DTYPE(top_p, at::kFloat);
  TORCH_CHECK(SPECOPS_ON_GPU(logits) && SPECOPS_ON_GPU(temperature) && SPECOPS_ON_GPU(top_k) && SPECOPS_ON_GPU(top_p),
              "warp_probs: " SPECOPS_GPU_NAME " tensors expected");
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(temperature.numel() == N && top_k.numel() == N && top_p.numel() == N,
              "warp_probs: temperature, top_k and top_p must have shape [N]");
  const gpu::DeviceGuard guard(logits.device());
  auto x = logits.stride(1) == 1 ? logits : logits.contiguous();
  auto tt = temperature.contiguous();
  auto kk = top_k.contiguous();
  auto pp = top_p.contiguous();
  auto out = at::empty({N, V}, logits.options().dtype(at::kFloat));
  if (N == 0 || V == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "warp_probs_cuda", [&] {
    SPECOPS_LAUNCH(N, kThreads, 0, gpu::current_stream(), warp_probs_kernel<scalar_t>)(
        x.data_ptr<scalar_t>(), x.stride(0), tt.data_ptr<float>(), kk.data_ptr<int32_t>(),
        pp.data_ptr<float>(), out.data_ptr<float>(), V);
  });
  SPECOPS_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace specops

SPECOPS_GPU_IMPL(m) { m.impl("warp_probs", &specops::warp_probs_cuda); }
