// Kernels that pin down the emulator's own semantics (tests/test_cudasim.py): warp collectives
// against the PTX definitions, barriers, shared memory, atomics, and the failures that must raise
// instead of hanging (divergent barriers, missing lanes, launches a device would refuse).
#include <stdexcept>
#include <string>
#include <vector>

#include "../cuda/mma.cuh"
#include "cudasim.h"

namespace cudasim {
namespace selftest {
namespace {

// out[t * 8 + k]: lane t's results of the eight collectives below (width 32, then width 8).
__global__ void collectives(int* out, int arg) {
  const int t = threadIdx.x, lane = t & 31;
  int* o = out + t * 8;
  o[0] = __shfl_sync(0xffffffffu, t, (lane * 7 + arg) & 31);
  o[1] = __shfl_xor_sync(0xffffffffu, t, arg & 31);
  o[2] = __shfl_down_sync(0xffffffffu, t, static_cast<unsigned>(arg & 31));
  o[3] = __shfl_up_sync(0xffffffffu, t, static_cast<unsigned>(arg & 31));
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, (t % 3) == 0));
  o[5] = __any_sync(0xffffffffu, t == arg) * 2 + __all_sync(0xffffffffu, t >= 0);
  o[6] = __shfl_down_sync(0xffffffffu, t, static_cast<unsigned>(arg & 7), 8);
  o[7] = __shfl_xor_sync(0xffffffffu, static_cast<long long>(t) << 33, arg & 7, 8) >> 33;
}

// Warp w writes its id into static shared memory; after the barrier every thread reads warp
// (w + 1)'s. A shared-memory counter takes one atomicAdd per thread.
__global__ void shared_and_atomics(int* out) {
  __shared__ int ids[32];
  __shared__ unsigned long long counter;
  const int t = threadIdx.x, w = t / 32, nw = blockDim.x / 32;
  if (t == 0) counter = 0;
  if ((t & 31) == 0) ids[w] = w + 100 * static_cast<int>(blockIdx.x);
  __syncthreads();
  atomicAdd(&counter, 1ull + static_cast<unsigned long long>(t));
  out[blockIdx.x * blockDim.x + t] = ids[(w + 1) % nw];
  __syncthreads();
  if (t == 0) out[gridDim.x * blockDim.x + blockIdx.x] = static_cast<int>(counter);
}

// Threads below `split` wait at one barrier, the others at another.
__global__ void divergent_barrier(int* out, int split) {
  if (static_cast<int>(threadIdx.x) < split) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Lane `gone` leaves before its warp's shuffle.
__global__ void missing_lane(int* out, int gone) {
  if (static_cast<int>(threadIdx.x) == gone) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

// The upper half exits; the rest still meet at a barrier (a device counts exited threads as arrived).
__global__ void early_exit_barrier(int* out) {
  if (threadIdx.x >= blockDim.x / 2) return;
  out[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] += 1;
}

// Reads dynamic shared memory before writing it: the emulator fills it with 0xFF bytes.
__global__ void uninitialised_smem(int* out) {
  const int* smem = reinterpret_cast<const int*>(detail::dynamic_smem);
  out[threadIdx.x] = smem[threadIdx.x];
}

// Nothing but a launch (for the launch-limit checks).
__global__ void empty_kernel(int* out) {
  if (out) out[threadIdx.x] = static_cast<int>(threadIdx.x);
}

// D = A B (16 x 16 x 16, bf16 in, fp32 out) through ldmatrix + mma.sync, twice: B^T staged
// row-major and read with ldmatrix (as K in attention), and B staged row-major and read with
// ldmatrix.trans (as V). out: [2][16][16] row-major.
__global__ void mma_16x16x16(const float* a, const float* b, int* out, int sync) {
  using T = c10::BFloat16;
  constexpr int LD = 24;  // 16 + 8: rows 48 bytes apart, 16-byte aligned
  T* as = reinterpret_cast<T*>(detail::dynamic_smem);  // [16][LD]
  T* bt = as + 16 * LD;                                // B^T [16 n][LD]
  T* bs = bt + 16 * LD;                                // B [16 k][LD]
  const int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    as[r * LD + c] = T(a[e]);
    bt[c * LD + r] = T(b[e]);  // b is [k][n]
    bs[r * LD + c] = T(b[e]);
  }
  if (sync) __syncthreads();  // without it, ldmatrix reads rows other lanes wrote: a hazard
  uint32_t af[4], kf[4], vf[4];
  specops::tc::ldsm_x4(af, as + (lane % 16) * LD + (lane / 16) * 8);
  specops::tc::ldsm_x4(kf, bt + ((lane / 16) * 8 + lane % 8) * LD + ((lane / 8) % 2) * 8);
  specops::tc::ldsm_x4_trans(vf, bs + (((lane / 8) % 2) * 8 + lane % 8) * LD + (lane / 16) * 8);
  for (int way = 0; way < 2; ++way) {
    const uint32_t* f = way == 0 ? kf : vf;
    for (int nb = 0; nb < 2; ++nb) {
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      const uint32_t bf[2] = {f[2 * nb], f[2 * nb + 1]};
      specops::tc::mma16816<T>(d, af, bf);
      for (int e = 0; e < 4; ++e) {
        const int r = lane / 4 + 8 * (e / 2), c = nb * 8 + 2 * (lane % 4) + (e % 2);
        out[way * 256 + r * 16 + c] = static_cast<int>(d[e]);
      }
    }
  }
}

// cp.async: what shared memory holds before the wait (the emulator's 0xFF fill) and after it.
__global__ void cp_async_visibility(const int* src, int* out) {
  int* s = reinterpret_cast<int*>(detail::dynamic_smem);
  const int t = threadIdx.x;
  specops::tc::cp_async16(s + 4 * t, src + 4 * t, true);
  specops::tc::cp_async16(s + 128 + 4 * t, src, false);  // zero fill, src not read
  specops::tc::cp_async_commit();
  out[t] = s[4 * t];  // too early: the copy has not landed
  specops::tc::cp_async_wait<0>();
  out[32 + t] = s[4 * t + 3];
  out[64 + t] = s[128 + 4 * t];
}

// ---- planted hazards for racecheck: 64 threads (two warps); fixed = 1 puts in the missing barrier ----

// RAW: warp 1 reads the words warp 0 wrote (dynamic shared memory).
__global__ void hazard_raw(int* out, int fixed) {
  int* s = reinterpret_cast<int*>(detail::dynamic_smem);
  const int t = threadIdx.x;
  if (t < 32) s[t] = t + 1;
  if (fixed) __syncthreads();
  if (t >= 32) out[t] = s[t - 32];
}

// WAR: warp 1 overwrites the words warp 0 reads.
__global__ void hazard_war(int* out, int fixed) {
  int* s = reinterpret_cast<int*>(detail::dynamic_smem);
  const int t = threadIdx.x;
  if (t < 32) out[t] = s[t + 32];
  if (fixed) __syncthreads();
  if (t >= 32) s[t] = t;
}

// WAW: both warps write the same words of a static __shared__ array.
__global__ void hazard_waw(int* out, int fixed) {
  __shared__ int s[32];
  const int t = threadIdx.x;
  if (t < 32) s[t] = t;
  if (fixed) __syncthreads();
  if (t >= 32) s[t - 32] = t;
  __syncthreads();
  out[t] = s[t % 32];
}

// Within one warp: each lane reads its neighbour's word; only __syncwarp orders the lanes.
__global__ void hazard_warp(int* out, int fixed) {
  __shared__ int s[32];
  const int t = threadIdx.x;
  if (t < 32) s[t] = t;
  if (fixed) __syncwarp();
  if (t < 32) out[t] = s[(t + 1) % 32];
}

// Atomic counters another thread zeroes with plain writes in the same interval.
__global__ void hazard_atomic(int* out, int fixed) {
  __shared__ int hist[4];
  const int t = threadIdx.x;
  if (t < 4) hist[t] = 0;
  if (fixed) __syncthreads();
  atomicAdd(&hist[t % 4], 1);
  __syncthreads();
  if (t < 4) out[t] = hist[t];
}

// A refill by cp.async that another warp's read still needs: warp 0 copies src over its words
// while warp 1 reads them before the barrier. Late landing (at the wait) hides it; early landing
// (at issue) shows it; racecheck reports it either way.
__global__ void hazard_cp_async(const int* src, int* out, int fixed) {
  int* s = reinterpret_cast<int*>(detail::dynamic_smem);
  const int t = threadIdx.x;
  s[t] = t;
  __syncthreads();
  int old = -1;
  if (fixed && t >= 32) old = s[t - 32];
  __syncthreads();  // (the fixed kernel's reads are done here)
  if (t < 32 && t % 4 == 0) specops::tc::cp_async16(s + t, src + t, true);
  specops::tc::cp_async_commit();
  if (!fixed && t >= 32) old = s[t - 32];  // the refill may land under this read
  __syncthreads();
  specops::tc::cp_async_wait<0>();
  __syncthreads();
  out[t] = old;
  out[64 + t] = s[t];
}

}  // namespace

// Runs one named self-test; returns what its kernel wrote. Raises (c10::Error) where the emulator
// must refuse.
std::vector<int> run(const std::string& name, int arg) {
  std::vector<int> out;
  if (name == "collectives") {
    out.assign(64 * 8, -1);
    launch("collectives", collectives, dim3(1), dim3(64), 0, nullptr)(out.data(), arg);
  } else if (name == "shared_and_atomics") {
    out.assign(3 * 128 + 3, -1);
    launch("shared_and_atomics", shared_and_atomics, dim3(3), dim3(128), 0, nullptr)(out.data());
  } else if (name == "divergent_barrier") {
    out.assign(64, 0);
    launch("divergent_barrier", divergent_barrier, dim3(1), dim3(64), 0, nullptr)(out.data(), arg);
  } else if (name == "missing_lane") {
    out.assign(64, 0);
    launch("missing_lane", missing_lane, dim3(1), dim3(64), 0, nullptr)(out.data(), arg);
  } else if (name == "early_exit_barrier") {
    out.assign(64, 0);
    launch("early_exit_barrier", early_exit_barrier, dim3(1), dim3(64), 0, nullptr)(out.data());
  } else if (name == "uninitialised_smem") {
    out.assign(32, 0);
    launch("uninitialised_smem", uninitialised_smem, dim3(1), dim3(32), 32 * sizeof(int), nullptr)(out.data());
  } else if (name == "mma" || name == "mma_nosync") {  // arg seeds the integer-valued A and B
    std::vector<float> a(256), b(256);
    for (int e = 0; e < 256; ++e) {
      a[e] = static_cast<float>((e * 7 + arg) % 9 - 4);
      b[e] = static_cast<float>((e * 5 + 3 * arg) % 7 - 3);
    }
    out.assign(2 * 256 + 512, 0);  // results, then A and B as ints for the caller's check
    launch("mma_16x16x16", mma_16x16x16, dim3(1), dim3(32), 3 * 16 * 24 * 2, nullptr)(a.data(), b.data(), out.data(),
                                                                                   name == "mma" ? 1 : 0);
    for (int e = 0; e < 256; ++e) {
      out[512 + e] = static_cast<int>(a[e]);
      out[768 + e] = static_cast<int>(b[e]);
    }
  } else if (name == "cp_async") {
    std::vector<int> src(128);
    for (int e = 0; e < 128; ++e) src[e] = 1000 + e;
    out.assign(96, 0);
    launch("cp_async_visibility", cp_async_visibility, dim3(1), dim3(32), 256 * sizeof(int), nullptr)(src.data(),
                                                                                                      out.data());
  } else if (name.rfind("hazard_", 0) == 0 && name != "hazard_cp_async") {  // arg: fixed
    auto* fn = name == "hazard_raw"    ? hazard_raw
               : name == "hazard_war"  ? hazard_war
               : name == "hazard_waw"  ? hazard_waw
               : name == "hazard_warp" ? hazard_warp
               : name == "hazard_atomic" ? hazard_atomic
                                       : throw std::invalid_argument("cudasim selftest: unknown test '" + name + "'");
    out.assign(64, -1);
    launch(name.c_str(), fn, dim3(1), dim3(64), 64 * sizeof(int), nullptr)(out.data(), arg);
  } else if (name == "hazard_cp_async") {  // arg: fixed
    std::vector<int> src(64);
    for (int e = 0; e < 64; ++e) src[e] = 1000 + e;
    out.assign(128, 0);
    launch("hazard_cp_async", hazard_cp_async, dim3(1), dim3(64), 64 * sizeof(int), nullptr)(src.data(), out.data(),
                                                                                             arg);
  } else if (name == "grid_y") {  // arg: grid y
    launch("empty_kernel", empty_kernel, dim3(1, static_cast<unsigned>(arg)), dim3(32), 0, nullptr)(nullptr);
  } else if (name == "block_threads") {  // arg: threads per block
    launch("empty_kernel", empty_kernel, dim3(1), dim3(static_cast<unsigned>(arg)), 0, nullptr)(nullptr);
  } else if (name == "dynamic_smem") {  // arg: bytes, launched without cudaFuncSetAttribute first
    launch("empty_kernel", empty_kernel, dim3(1), dim3(32), static_cast<size_t>(arg), nullptr)(nullptr);
  } else if (name == "dynamic_smem_optin") {  // arg: bytes, after cudaFuncSetAttribute(arg)
    const cudaError_t err = cudaFuncSetAttribute(uninitialised_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, arg);
    out.push_back(static_cast<int>(err));
    if (err == cudaSuccess) {
      std::vector<int> sink(32);
      launch("uninitialised_smem", uninitialised_smem, dim3(1), dim3(32), static_cast<size_t>(arg), nullptr)(
          sink.data());
    }
  } else {
    throw std::invalid_argument("cudasim selftest: unknown test '" + name + "'");
  }
  return out;
}

}  // namespace selftest
}  // namespace cudasim
