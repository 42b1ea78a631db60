// Host-side arguments of apply_token_bitmask shared by the CPU and CUDA launchers: the checks (the
// device ones through the backend's Device, csrc/registration.h), the rows of a call, the -inf bit
// pattern of each logit dtype (the kernels write raw bits) and the registered entry point; each
// backend supplies the runner. Also the per-node bitmask of the verify ops. The public Python op
// validates every argument with a ValueError/TypeError naming it; these checks guard the kernels
// against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <cstdint>

#include "common.h"
#include "registration.h"

namespace specops {

// logits [B, T, V] or [N, V]; bitmask int32 of the same leading shape and ceil(V / 32) words.
inline void check_token_bitmask_args(const at::Tensor& logits, const at::Tensor& bitmask) {
  SPECOPS_CHECK_DTYPE(bitmask, at::kInt);
  TORCH_CHECK_VALUE(logits.dim() == 2 || logits.dim() == 3, "apply_token_bitmask: logits must have rank 2 or 3");
  TORCH_CHECK_VALUE(bitmask.dim() == logits.dim(), "apply_token_bitmask: bitmask must have the rank of logits");
  const int64_t V = logits.size(-1);
  for (int64_t d = 0; d + 1 < logits.dim(); ++d)
    TORCH_CHECK_VALUE(bitmask.size(d) == logits.size(d), "apply_token_bitmask: bitmask and logits leading shapes differ");
  TORCH_CHECK_VALUE(bitmask.size(-1) == ceil_div(V, 32), "apply_token_bitmask: bitmask must have ceil(V / 32) words");
  TORCH_CHECK_VALUE(V <= 1 || logits.stride(-1) == 1, "apply_token_bitmask: logits must have stride 1 in V");
}

// The bits of -inf in the logits' dtype (fp32: uint32; fp16 / bf16: uint16); raises for others.
inline uint32_t neg_inf_bits(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 0xFF800000u;
    case at::kHalf: return 0xFC00u;
    case at::kBFloat16: return 0xFF80u;
    default: TORCH_CHECK_TYPE(false, "apply_token_bitmask: logits must be fp32, fp16 or bf16, got ", dtype);
  }
  return 0;
}

// One apply_token_bitmask call with logits to mask: row r = (b, t) of the [B, T, V] logits ([N, V]:
// B = 1, T = N) starts at element b * sb + t * st (views are written in place); its mask words are
// row r of `mask` [B * T, W] (contiguous int32).
struct BitmaskRows {
  at::Tensor logits, mask;
  int64_t B, T, V, W, sb, st;
};

// The runner of one bit width (Bits: uint32_t for fp32 logits, uint16_t for fp16 / bf16).
template <typename Bits>
using BitmaskRunFn = void (*)(const BitmaskRows&, Bits neg_inf);

template <class Dev, BitmaskRunFn<uint32_t> Run32, BitmaskRunFn<uint16_t> Run16>
void apply_token_bitmask_entry(const at::Tensor& logits,   // [B, T, V] or [N, V] fp32/fp16/bf16, in place
                               const at::Tensor& bitmask)  // [B, T, W] or [N, W] int32, W = ceil(V / 32)
{
  check_token_bitmask_args(logits, bitmask);
  check_device<Dev>("apply_token_bitmask", {{"logits", &logits}, {"bitmask", &bitmask}});
  const uint32_t neg_inf = neg_inf_bits(logits.scalar_type());
  if (logits.numel() == 0) return;
  const typename Dev::Guard guard(logits.device());
  const bool flat = logits.dim() == 2;
  const BitmaskRows rows{logits, bitmask.contiguous(), flat ? 1 : logits.size(0), logits.size(-2), logits.size(-1),
                         bitmask.size(-1), flat ? 0 : logits.stride(0), logits.stride(-2)};
  if (logits.scalar_type() == at::kFloat) Run32(rows, neg_inf);
  else Run16(rows, static_cast<uint16_t>(neg_inf));
}

// Registers apply_token_bitmask for one backend; APPLY<Bits> is its runner template.
#define SPECOPS_TOKEN_BITMASK_REGISTER(m, DEV, APPLY) \
  m.impl("apply_token_bitmask", &specops::apply_token_bitmask_entry<DEV, APPLY<uint32_t>, APPLY<uint16_t>>)

// The optional per-node bitmask of a verify op over [B, T, V] rows: undefined when absent, else
// its contiguous int32 [B, T, ceil(V / 32)] words. The launcher adds its device check.
inline at::Tensor node_bitmask_words(const c10::optional<at::Tensor>& bitmask, const char* op, int64_t B, int64_t T,
                                     int64_t V) {
  if (!bitmask.has_value() || !bitmask->defined()) return at::Tensor();
  SPECOPS_CHECK_DTYPE(*bitmask, at::kInt);
  const int64_t W = ceil_div(V, 32);
  TORCH_CHECK_VALUE(bitmask->dim() == 3 && bitmask->size(0) == B && bitmask->size(1) == T && bitmask->size(2) == W,
                    op, ": bitmask must have shape [B, T, ceil(V / 32)] = [", B, ", ", T, ", ", W, "], got ",
                    bitmask->sizes());
  return bitmask->contiguous();
}

}  // namespace specops
