// Input checks shared by the host-side launchers of both extensions.
//
// The public Python ops validate every argument with a ValueError/TypeError that names it; these
// checks guard the kernels against direct torch.ops calls with the same vocabulary: a wrong dtype
// is a TypeError (TORCH_CHECK_TYPE), every other bad argument a ValueError (TORCH_CHECK_VALUE), so
// a caller of torch.ops.specops.* catches what a caller of specops.* catches. The launchers use
// TORCH_CHECK_VALUE for their own argument rules for the same reason.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

#define SPECOPS_CHECK_DTYPE(x, dt) \
  TORCH_CHECK_TYPE((x).scalar_type() == (dt), #x " must be " #dt ", got ", (x).scalar_type())
#define SPECOPS_CHECK_DIM(x, d) \
  TORCH_CHECK_VALUE((x).dim() == (d), #x " must have rank " #d ", got ", (x).dim())
#define SPECOPS_CHECK_CONTIG(x) TORCH_CHECK_VALUE((x).is_contiguous(), #x " must be contiguous")
#define SPECOPS_CHECK_DEVICE(x, dev) \
  TORCH_CHECK_VALUE((x).device() == (dev), #x " must be on ", (dev), ", got ", (x).device())

namespace specops {

// Whether two tensors' byte ranges (lowest to one past the highest element they address) meet:
// metadata only (pointers, sizes, strides), conservative for interleaved views. Empty or undefined
// tensors meet nothing.
inline bool bytes_overlap(const at::Tensor& a, const at::Tensor& b) {
  auto range = [](const at::Tensor& t, uintptr_t& lo, uintptr_t& hi) {
    if (!t.defined() || t.numel() == 0) return false;
    int64_t first = 0, last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t ext = (t.size(d) - 1) * t.stride(d);
      (ext < 0 ? first : last) += ext;
    }
    const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
    const int64_t es = static_cast<int64_t>(t.element_size());
    lo = base + first * es;
    hi = base + (last + 1) * es;
    return true;
  };
  uintptr_t alo, ahi, blo, bhi;
  if (!range(a, alo, ahi) || !range(b, blo, bhi)) return false;
  return alo < bhi && blo < ahi;
}

}  // namespace specops
