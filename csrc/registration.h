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
#include <initializer_list>
#include <optional>
#include <utility>

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

// Arguments by name, for checks over many of them (a null pointer: an absent optional argument).
using NamedTensors = std::initializer_list<std::pair<const char*, const at::Tensor*>>;

inline const at::Tensor* given(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// The CPU backend's device: what a launcher's shared entry (the *_args.h headers) checks every
// tensor against, and the guard it holds while it allocates (none on the CPU). csrc/cuda/gpu.cuh
// defines GpuDevice, its CUDA / emulator twin.
struct CpuDevice {
  static constexpr const char* kName = "CPU";
  static bool on(const at::Tensor& t) { return t.is_cpu(); }
  struct Guard {
    explicit Guard(const at::Device&) {}
  };
};

// Every tensor given lies on Dev and on the first one's device.
template <class Dev>
void check_device(const char* op, NamedTensors args) {
  const std::pair<const char*, const at::Tensor*>* first = nullptr;
  for (const auto& arg : args) {
    const at::Tensor* t = arg.second;
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) first = &arg;
    TORCH_CHECK_VALUE(Dev::on(*t) && t->device() == first->second->device(), op, ": ", arg.first, " must be a ",
                      Dev::kName, " tensor on ", first->first, "'s device, got ", t->device());
  }
}

}  // namespace specops
