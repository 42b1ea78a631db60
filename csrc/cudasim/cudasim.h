// cudasim: the CUDA surface our kernels use, emulated on the CPU, so that csrc/cuda/*.cu compiled a
// second time as host C++ (-DSPECOPS_CUDASIM, see csrc/cuda/gpu.cuh) runs on CPU tensors.
//
// Model (docs/cudasim.md): the blocks of a grid run one after another; the threads of a block are
// cooperative fibers scheduled deterministically (a thread runs until it blocks at __syncthreads or
// at a warp collective, then the next one runs, in the order set_schedule chose). Barriers are
// counted: all live threads must wait at the same __syncthreads (file:line), else the launch fails
// with "divergent __syncthreads"; a warp collective (__shfl_*_sync, __ballot_sync, ...) completes
// when all 32 lanes reach one, else "missing lane". Every failure is a c10::Error (a Python
// RuntimeError), never a hang. Launch limits are those of a real sm_90 (or sm_80) device.
//
// What it cannot show: the memory model (plain loads and stores, no caches, no reordering), timing
// and occupancy, and GPU rounding (expf/exp2f are the host's, and nvcc's FMA contraction does not
// happen: the build uses -ffp-contract=off).
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- the runtime API types (global, as cuda_runtime.h declares them) ------------------------------

struct uint3 {
  unsigned int x, y, z;
};

// The vector types, with the device's alignment (a 16-byte load is one uint4).
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct CUstream_st* cudaStream_t;

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {  // the values of cuda_runtime_api.h
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

const char* cudaGetErrorString(cudaError_t err);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);

namespace cudasim {
namespace detail {

// The part of an emulated thread that kernel code reads (threadIdx); the runtime's Thread extends it.
struct ThreadView {
  uint3 tid;
  int linear = 0;  // x fastest, then y, then z
};

extern ThreadView* current;  // the running thread
extern uint3 block_idx;      // the running block
extern dim3 block_dim, grid_dim;
extern unsigned char* dynamic_smem;  // the running block's extern __shared__ buffer

enum class Collective : int { kShfl, kShflXor, kShflDown, kShflUp, kBallot, kAny, kAll, kSyncWarp };

// Blocks the calling lane until its warp's 32 lanes reached a collective, then returns its result.
uint64_t warp_collective(Collective op, uint64_t value, int arg, int width, unsigned mask, const char* file,
                         int line);

// A warp-wide exchange of whole fragments (the emulated mma.sync and ldmatrix): every lane posts
// pointers to its inputs and outputs; the 32nd lane to arrive runs compute(ins, outs) over all
// lanes (lane order), then every lane goes on. The pointers stay valid: a waiting fiber's stack is
// untouched. Lanes must all call the same `compute` (checked).
using ExchangeFn = void (*)(const void* const* ins, void* const* outs);
void warp_exchange(const char* what, ExchangeFn compute, const void* in, void* out, const char* file, int line);

// Racecheck (csrc/cudasim/racecheck.cpp): true while a racecheck launch runs kernel code, so the
// access hooks record; false in the runtime, and always false when racecheck is off.
extern bool rc_track;
// An access the hooks cannot see (ldmatrix rows, read by the warp's exchange; atomics), at its
// source line. kind: 0 read, 1 write, 2 atomic read-modify-write.
void rc_note(const void* p, int bytes, int kind, const char* file, int line);

// cp.async emulation: the bytes are read at issue time and land in shared memory when the issuing
// thread waits for their group (cp.async.wait_group; the latest a device may), so a kernel that
// reads a tile before waiting for it reads the old contents there, as it may on a device; or at
// issue (set_cp_async("early"), the earliest).
void cp_async(void* smem_dst, const void* src, int bytes, int src_bytes, const char* file, int line);
void cp_async_commit();
void cp_async_wait(int keep_groups);
void syncthreads(const char* file, int line);
cudaError_t set_max_dynamic_smem(const void* fn, int bytes);

// One kernel launch: the runtime runs `entry(ctx)` once per emulated thread of every block.
struct LaunchConfig {
  const char* name;
  const void* fn;
  dim3 grid, block;
  size_t smem;
};
void run_grid(const LaunchConfig& cfg, void (*entry)(void*), void* ctx);

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "cudasim: shuffles move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

template <class T>
T shuffle(Collective op, unsigned mask, T v, int arg, int width, const char* file, int line) {
  return from_bits<T>(warp_collective(op, to_bits(v), arg, width, mask, file, line));
}

template <class... P>
struct Launch {
  LaunchConfig cfg;
  void (*fn)(P...);

  template <class... A>
  void operator()(A&&... args) const {
    // Kernel parameters are copies, as on a device; every emulated thread gets its own copy
    // through the call below.
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    struct Ctx {
      void (*fn)(P...);
      std::tuple<std::decay_t<P>...>* params;
    } ctx{fn, &params};
    run_grid(cfg, [](void* c) {
      auto* x = static_cast<Ctx*>(c);
      std::apply(x->fn, *x->params);
    }, &ctx);
  }
};

}  // namespace detail

// SPECOPS_LAUNCH(grid, block, smem, stream, kernel)(args...) under the emulator.
template <class... P>
detail::Launch<P...> launch(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t) {
  return {{name, reinterpret_cast<const void*>(fn), grid, block, smem}, fn};
}

}  // namespace cudasim

template <class... P>
cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return cudasim::detail::set_max_dynamic_smem(reinterpret_cast<const void*>(fn), value);
}

// ---- the device-side surface ------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One copy per kernel instantiation, shared by the block's fibers (blocks run one at a time).
// Racecheck finds these among the module's writable static storage (racecheck.cpp).
#define __shared__ static

#define threadIdx (::cudasim::detail::current->tid)
#define blockIdx (::cudasim::detail::block_idx)
#define blockDim (::cudasim::detail::block_dim)
#define gridDim (::cudasim::detail::grid_dim)
#define warpSize 32

// Barriers and warp collectives record their call site (file:line, the caller's through
// __builtin_FILE/LINE default arguments) for the divergence and deadlock reports.
#define CUDASIM_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()

inline void __syncthreads(CUDASIM_SITE) { cudasim::detail::syncthreads(file, line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, CUDASIM_SITE) {
  cudasim::detail::warp_collective(cudasim::detail::Collective::kSyncWarp, 0, 0, 32, mask, file, line);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, CUDASIM_SITE) {
  return cudasim::detail::shuffle(cudasim::detail::Collective::kShfl, mask, v, src_lane, width, file, line);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, CUDASIM_SITE) {
  return cudasim::detail::shuffle(cudasim::detail::Collective::kShflXor, mask, v, lane_mask, width, file, line);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, CUDASIM_SITE) {
  return cudasim::detail::shuffle(cudasim::detail::Collective::kShflDown, mask, v, static_cast<int>(delta), width,
                                  file, line);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, CUDASIM_SITE) {
  return cudasim::detail::shuffle(cudasim::detail::Collective::kShflUp, mask, v, static_cast<int>(delta), width,
                                  file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, CUDASIM_SITE) {
  return static_cast<unsigned>(
      cudasim::detail::warp_collective(cudasim::detail::Collective::kBallot, pred != 0, 0, 32, mask, file, line));
}
inline int __any_sync(unsigned mask, int pred, CUDASIM_SITE) {
  return static_cast<int>(
      cudasim::detail::warp_collective(cudasim::detail::Collective::kAny, pred != 0, 0, 32, mask, file, line));
}
inline int __all_sync(unsigned mask, int pred, CUDASIM_SITE) {
  return static_cast<int>(
      cudasim::detail::warp_collective(cudasim::detail::Collective::kAll, pred != 0, 0, 32, mask, file, line));
}

inline void __threadfence_block() {}
inline void __threadfence() {}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}

// Correctly rounded single operations (the build has no FMA contraction, so a plain operator is one
// IEEE operation, as these intrinsics are on a device).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

inline int __float_as_int(float f) { return cudasim::detail::from_bits<int>(cudasim::detail::to_bits(f)); }
inline unsigned __float_as_uint(float f) { return cudasim::detail::from_bits<unsigned>(cudasim::detail::to_bits(f)); }
inline float __int_as_float(int i) { return cudasim::detail::from_bits<float>(cudasim::detail::to_bits(i)); }
inline float __uint_as_float(unsigned u) { return cudasim::detail::from_bits<float>(cudasim::detail::to_bits(u)); }
inline long long __double_as_longlong(double d) { return cudasim::detail::from_bits<long long>(cudasim::detail::to_bits(d)); }
inline double __longlong_as_double(long long i) { return cudasim::detail::from_bits<double>(cudasim::detail::to_bits(i)); }

// Device min/max take mixed integer types, like CUDA's overload set.
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

// Atomics: fibers never preempt each other between a load and a store, so a read-modify-write is
// atomic. Returns the old value, as on a device. Racecheck records it as an atomic access: atomics do
// not race with each other, only with plain accesses.
template <class T, class F>
inline T atomic_rmw(T* addr, F next, const char* file, int line) {
  cudasim::detail::rc_note(addr, sizeof(T), 2, file, line);
  const bool track = cudasim::detail::rc_track;
  cudasim::detail::rc_track = false;
  asm volatile("" ::: "memory");  // keeps the store above: the instrumentation's calls come later
  const T old = *addr;
  *addr = next(old);
  asm volatile("" ::: "memory");
  cudasim::detail::rc_track = track;
  return old;
}
template <class T, class U>
inline T atomicAdd(T* addr, U v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T o) { return static_cast<T>(o + static_cast<T>(v)); }, file, line);
}
template <class T, class U>
inline T atomicSub(T* addr, U v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T o) { return static_cast<T>(o - static_cast<T>(v)); }, file, line);
}
template <class T, class U>
inline T atomicMax(T* addr, U v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T o) { return o < static_cast<T>(v) ? static_cast<T>(v) : o; }, file, line);
}
template <class T, class U>
inline T atomicMin(T* addr, U v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T o) { return static_cast<T>(v) < o ? static_cast<T>(v) : o; }, file, line);
}
template <class T, class U>
inline T atomicExch(T* addr, U v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T) { return static_cast<T>(v); }, file, line);
}
template <class T, class U, class W>
inline T atomicCAS(T* addr, U compare, W v, CUDASIM_SITE) {
  return atomic_rmw(addr, [&](T o) { return o == static_cast<T>(compare) ? static_cast<T>(v) : o; }, file, line);
}
