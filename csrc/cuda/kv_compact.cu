// kv_compact on CUDA: one block per (layer, sequence, head) slice.
//
// The block flattens its accepted rows into (row, vector) items, consecutive threads taking
// consecutive vectors of a row (coalesced; 16-byte vectors whenever pointers and strides
// allow). It walks the items in chunks, in order: a chunk loads all its sources into
// registers, the block synchronises, then the chunk stores. Within a chunk this is
// gather-then-scatter; across chunks the in-order argument of csrc/kv_compact_common.h holds
// (a later chunk reads only rows at or past its own destinations, which no earlier chunk
// wrote, identities being skipped), so no second barrier is needed. Move logic is shared with
// the CPU backend through kv_move_rows.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../kv_compact_common.h"
#include "../registration.h"

namespace specops {
namespace {

struct SliceStrides {  // bytes per step in L, B, H, S
  int64_t l, b, h, s;
};

constexpr int kThreads = 128;
constexpr int kUnroll = 4;  // vectors per thread per chunk and cache: 128 x 4 x 16 B = 8 KiB

template <typename Vec>
__global__ void __launch_bounds__(kThreads)
kv_compact_kernel(char* k,  // [L, B, H, S, D] bytes, in place; read and written, so not __restrict__
                  char* v,  // [L, B, H, S, D] bytes, in place
                  const int32_t* __restrict__ prefix,    // [B]
                  const int32_t* __restrict__ idx,       // [B, A]
                  const int32_t* __restrict__ lens,      // [B]
                  int64_t B, int64_t H, int64_t S, int32_t A, int32_t vecs_per_row,
                  SliceStrides ks, SliceStrides vs) {
  const int64_t t = blockIdx.x;
  const int64_t h = t % H, b = (t / H) % B, l = t / (H * B);
  const int32_t n = kv_num_moves(lens[b], A);
  const int32_t p = prefix[b];
  const int32_t* idx_row = idx + b * A;
  char* k_slice = k + l * ks.l + b * ks.b + h * ks.h;
  char* v_slice = v + l * vs.l + b * vs.b + h * vs.h;
  const int64_t items = static_cast<int64_t>(n) * vecs_per_row;
  // The trip count depends only on the block's sequence, so every thread reaches each barrier.
  for (int64_t base = 0; base < items; base += kThreads * kUnroll) {
    Vec kr[kUnroll], vr[kUnroll];
    int64_t dst_row[kUnroll];
    int32_t col[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      ok[u] = false;
      if (i < items) {
        const int32_t j = static_cast<int32_t>(i / vecs_per_row);
        col[u] = static_cast<int32_t>(i % vecs_per_row);
        int64_t src;
        if (kv_move_rows(p, idx_row, j, S, &src, &dst_row[u])) {
          kr[u] = *reinterpret_cast<const Vec*>(k_slice + src * ks.s + col[u] * sizeof(Vec));
          vr[u] = *reinterpret_cast<const Vec*>(v_slice + src * vs.s + col[u] * sizeof(Vec));
          ok[u] = true;
        }
      }
    }
    __syncthreads();  // the whole chunk is read before any of it is written
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (ok[u]) {
        *reinterpret_cast<Vec*>(k_slice + dst_row[u] * ks.s + col[u] * sizeof(Vec)) = kr[u];
        *reinterpret_cast<Vec*>(v_slice + dst_row[u] * vs.s + col[u] * sizeof(Vec)) = vr[u];
      }
    }
  }
}

SliceStrides byte_strides(const at::Tensor& c) {
  const int64_t es = c.element_size();
  return {c.stride(0) * es, c.stride(1) * es, c.stride(2) * es, c.stride(3) * es};
}

// The widest vector (16, 8, 4 or 2 bytes) that divides every address the kernel forms.
int vector_bytes(const at::Tensor& k, const at::Tensor& v, int64_t row_bytes) {
  uint64_t all = reinterpret_cast<uint64_t>(k.data_ptr()) | reinterpret_cast<uint64_t>(v.data_ptr()) |
                 static_cast<uint64_t>(row_bytes);
  for (const SliceStrides& s : {byte_strides(k), byte_strides(v)})
    all |= static_cast<uint64_t>(s.l | s.b | s.h | s.s);
  for (int w : {16, 8, 4}) {
    if ((all & (w - 1)) == 0) return w;
  }
  return 2;
}

template <typename Vec>
void launch(const at::Tensor& k, const at::Tensor& v, const at::Tensor& prefix, const at::Tensor& idx,
            const at::Tensor& lens, int64_t row_bytes) {
  const int64_t L = k.size(0), B = k.size(1), H = k.size(2), S = k.size(3);
  SPECOPS_LAUNCH(L * B * H, kThreads, 0, gpu::current_stream(), kv_compact_kernel<Vec>)(
      static_cast<char*>(k.data_ptr()), static_cast<char*>(v.data_ptr()), prefix.data_ptr<int32_t>(),
      idx.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), B, H, S, static_cast<int32_t>(idx.size(1)),
      static_cast<int32_t>(row_bytes / sizeof(Vec)), byte_strides(k), byte_strides(v));
  SPECOPS_LAUNCH_CHECK();
}

}  // namespace

void kv_compact_cuda(const at::Tensor& k_cache,      // [L, B, Hkv, S, D] fp32/fp16/bf16, in place
                     const at::Tensor& v_cache,      // [L, B, Hkv, S, D] same dtype, in place
                     const at::Tensor& prefix_lens,  // [B] int32
                     const at::Tensor& accept_idx,   // [B, A] int32
                     const at::Tensor& accept_lens)  // [B] int32
{
  for (const at::Tensor* t : {&k_cache, &v_cache, &prefix_lens, &accept_idx, &accept_lens})
    TORCH_CHECK(SPECOPS_ON_GPU(*t) && t->device() == k_cache.device(), "kv_compact: " SPECOPS_GPU_NAME " tensors on one device expected");
  TORCH_CHECK(k_cache.dim() == 5 && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "k_cache and v_cache must be [L, B, Hkv, S, D] of one shape and dtype");
  TORCH_CHECK(k_cache.size(4) <= 1 || (k_cache.stride(4) == 1 && v_cache.stride(4) == 1),
              "k_cache and v_cache must have stride 1 in their last dimension");
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_idx, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_lens, at::kInt);
  SPECOPS_CHECK_DIM(accept_idx, 2);
  const int64_t B = k_cache.size(1);
  TORCH_CHECK(prefix_lens.numel() == B && accept_lens.numel() == B && accept_idx.size(0) == B,
              "prefix_lens, accept_lens must have shape [B] and accept_idx [B, A]");
  if (k_cache.numel() == 0 || accept_idx.size(1) == 0) return;
  const gpu::DeviceGuard guard(k_cache.device());
  const auto prefix = prefix_lens.contiguous();
  const auto idx = accept_idx.contiguous();
  const auto lens = accept_lens.contiguous();
  const int64_t row_bytes = k_cache.size(4) * k_cache.element_size();
  switch (vector_bytes(k_cache, v_cache, row_bytes)) {
    case 16: return launch<uint4>(k_cache, v_cache, prefix, idx, lens, row_bytes);
    case 8: return launch<uint2>(k_cache, v_cache, prefix, idx, lens, row_bytes);
    case 4: return launch<uint32_t>(k_cache, v_cache, prefix, idx, lens, row_bytes);
    default: return launch<uint16_t>(k_cache, v_cache, prefix, idx, lens, row_bytes);
  }
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) { m.impl("kv_compact", &specops::kv_compact_cuda); }
