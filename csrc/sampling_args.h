// Host-side arguments of warp_probs shared by the CPU and CUDA launchers: the checks (the device
// ones through the backend's Device, csrc/registration.h), the output and the registered entry
// point. Each backend supplies the runner.
//
// The public Python op validates every argument with a ValueError/TypeError that names it; these
// checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "registration.h"
#include "sampling_common.h"

namespace specops {
namespace warp {

// One warp_probs call with rows to warp: logits [N, V] with stride 1 in V (rows may be strided), the
// per-row parameters [N] contiguous (temperature and top_p fp32, top_k int32), the output fp32 [N, V].
struct Call {
  at::Tensor logits, temperature, top_k, top_p, out;
  int64_t N, V;
};

template <class Dev, void (*Run)(const Call&)>
at::Tensor entry(const at::Tensor& logits,       // [N, V] fp32/bf16/fp16
                 const at::Tensor& temperature,  // [N] fp32
                 const at::Tensor& top_k,        // [N] int32
                 const at::Tensor& top_p)        // [N] fp32
{
  SPECOPS_CHECK_DIM(logits, 2);
  SPECOPS_CHECK_DTYPE(temperature, at::kFloat);
  SPECOPS_CHECK_DTYPE(top_k, at::kInt);
  SPECOPS_CHECK_DTYPE(top_p, at::kFloat);
  check_device<Dev>("warp_probs", {{"logits", &logits}, {"temperature", &temperature}, {"top_k", &top_k},
                                   {"top_p", &top_p}});
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK_VALUE(temperature.numel() == N && top_k.numel() == N && top_p.numel() == N,
                    "warp_probs: temperature, top_k and top_p must have shape [N]");
  TORCH_CHECK_VALUE(V >= 1 || N == 0, "warp_probs: logits must have V >= 1");
  TORCH_CHECK_VALUE(V <= kMaxVocab, "warp_probs: V must be <= ", kMaxVocab, " (int32 token indices), got ", V);
  const typename Dev::Guard guard(logits.device());
  const Call c{logits.stride(1) == 1 ? logits : logits.contiguous(), temperature.contiguous(), top_k.contiguous(),
               top_p.contiguous(), at::empty({N, V}, logits.options().dtype(at::kFloat)), N, V};
  if (N > 0 && V > 0) Run(c);
  return c.out;
}

}  // namespace warp
}  // namespace specops
