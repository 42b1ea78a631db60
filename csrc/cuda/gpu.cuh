// The runtime surface of every csrc/cuda/*.cu, in two builds of the same source:
//  * nvcc (specops._C_cuda): the CUDA runtime through c10's CUDA headers, ops registered for the
//    CUDA dispatch key of specops::;
//  * host C++ with -DSPECOPS_CUDASIM (specops._C_cudasim, test-only): the SIMT emulation of
//    csrc/cudasim/cudasim.h, ops registered for CPU tensors under specops_cudasim::.
// Kernel bodies stay plain CUDA; host code uses only the names below for launches, streams, device
// guards, error checks and dynamic shared memory.
// Writable kernel pointers are never __restrict__: nvcc's optimizer then moves loads of them across
// __syncthreads(), and threads that talk through global scratch read stale words (tests/test_cuda_source.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../registration.h"

#if defined(SPECOPS_CUDASIM)

#include "../cudasim/cudasim.h"

#define SPECOPS_GPU_IMPL(m) TORCH_LIBRARY_IMPL(specops_cudasim, CPU, m)
// Tensors the kernels may dereference: CUDA tensors on a device, CPU tensors under the emulator.
#define SPECOPS_ON_GPU(t) ((t).is_cpu())
#define SPECOPS_GPU_NAME "cudasim (CPU)"
// SPECOPS_LAUNCH(grid, block, smem, stream, kernel)(args...) = kernel<<<grid, block, smem, stream>>>(args...)
#define SPECOPS_LAUNCH(grid, block, smem, stream, ...) \
  ::cudasim::launch(#__VA_ARGS__, __VA_ARGS__, grid, block, smem, stream)
#define SPECOPS_GPU_CHECK(expr)                                                         \
  do {                                                                                  \
    const cudaError_t specops_err = (expr);                                             \
    TORCH_CHECK(specops_err == cudaSuccess, "CUDA error: ", cudaGetErrorString(specops_err)); \
  } while (0)
#define SPECOPS_LAUNCH_CHECK() ((void)0)  // an emulated launch raises at once
#define SPECOPS_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(::cudasim::detail::dynamic_smem)

namespace specops {
namespace gpu {
struct DeviceGuard {
  explicit DeviceGuard(const c10::Device&) {}
};
inline cudaStream_t current_stream() { return nullptr; }
}  // namespace gpu
}  // namespace specops

#else

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#define SPECOPS_GPU_IMPL(m) TORCH_LIBRARY_IMPL(specops, CUDA, m)
#define SPECOPS_ON_GPU(t) ((t).is_cuda())
#define SPECOPS_GPU_NAME "CUDA"
#define SPECOPS_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define SPECOPS_GPU_CHECK(expr) C10_CUDA_CHECK(expr)
#define SPECOPS_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
#define SPECOPS_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]

namespace specops {
namespace gpu {
using DeviceGuard = c10::cuda::CUDAGuard;
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
}  // namespace gpu
}  // namespace specops

#endif

namespace specops {
// The device of this build's launchers, for the shared entries of the *_args.h headers (CpuDevice's
// twin, csrc/registration.h).
struct GpuDevice {
  static constexpr const char* kName = SPECOPS_GPU_NAME;
  static bool on(const at::Tensor& t) { return SPECOPS_ON_GPU(t); }
  using Guard = gpu::DeviceGuard;
};
}  // namespace specops
