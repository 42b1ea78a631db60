// kv_compact on CUDA: one block per (layer, sequence, head) slice.
//
// The block flattens its accepted rows into (row, vector) items, consecutive threads taking
// consecutive vectors of a row (coalesced; 16-byte vectors whenever pointers and strides
// allow). It walks the items in chunks, in order: a chunk loads all its sources into
// registers, the block synchronises, then the chunk stores. Within a chunk this is
// gather-then-scatter; across chunks the in-order argument of csrc/kv_compact_common.h holds
// (a later chunk reads only rows at or past its own destinations, which no earlier chunk
// wrote, identities being skipped), so no second barrier is needed. Move logic is shared with
// the CPU backend through kv_move_rows. kv_compact_paged is the same kernel with Paged = true: rows
// are placed through the sequence's page table (kv_pool_row), slices have no sequence term.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "gpu.cuh"
#include "../kv_compact_common.h"
#include "../registration.h"

namespace specops {
namespace {

struct SliceStrides {  // bytes per step in L, B, H, S (paged: b = 0, s between slots, page between pages)
  int64_t l, b, h, s, page;
};

struct Paging {  // paged caches: the page table [B, max_pages] and the pool's shape
  const int32_t* table;
  int64_t s_table;
  int32_t log2_page, num_pages;
};

// Byte offset of logical row r from its slice base; false (skip the move) for an out-of-range page.
template <bool Paged>
__device__ __forceinline__ bool row_offset(const Paging& pg, const int32_t* table_row, const SliceStrides& st,
                                           int64_t r, int64_t* off) {
  if constexpr (Paged) {
    int64_t page, slot;
    const bool ok = kv_pool_row(table_row, pg.log2_page, pg.num_pages, r, &page, &slot);
    *off = page * st.page + slot * st.s;
    return ok;
  } else {
    *off = r * st.s;
    return true;
  }
}

constexpr int kThreads = 128;
constexpr int kUnroll = 4;  // vectors per thread per chunk and cache: 128 x 4 x 16 B = 8 KiB

template <typename Vec, bool Paged>
__global__ void __launch_bounds__(kThreads)
kv_compact_kernel(char* k,  // [L, B, H, S, D] bytes, in place; read and written, so not __restrict__
                  char* v,  // [L, B, H, S, D] bytes, in place
                  const int32_t* __restrict__ prefix,    // [B]
                  const int32_t* __restrict__ idx,       // [B, A]
                  const int32_t* __restrict__ lens,      // [B]
                  int64_t B, int64_t H, int64_t S, int32_t A, int32_t vecs_per_row,
                  SliceStrides ks, SliceStrides vs, Paging pg) {
  const int64_t t = blockIdx.x;
  const int64_t h = t % H, b = (t / H) % B, l = t / (H * B);
  const int32_t n = kv_num_moves(lens[b], A);
  const int32_t p = prefix[b];
  const int32_t* idx_row = idx + b * A;
  const int32_t* table_row = Paged ? pg.table + b * pg.s_table : nullptr;
  char* k_slice = k + l * ks.l + b * ks.b + h * ks.h;
  char* v_slice = v + l * vs.l + b * vs.b + h * vs.h;
  const int64_t items = static_cast<int64_t>(n) * vecs_per_row;
  // The trip count depends only on the block's sequence, so every thread reaches each barrier.
  for (int64_t base = 0; base < items; base += kThreads * kUnroll) {
    Vec kr[kUnroll], vr[kUnroll];
    int64_t dst_k[kUnroll], dst_v[kUnroll];  // byte offsets from the slices
    int32_t col[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      ok[u] = false;
      if (i < items) {
        const int32_t j = static_cast<int32_t>(i / vecs_per_row);
        col[u] = static_cast<int32_t>(i % vecs_per_row);
        int64_t src, dst, sk, sv;
        if (kv_move_rows(p, idx_row, j, S, &src, &dst) && row_offset<Paged>(pg, table_row, ks, src, &sk) &&
            row_offset<Paged>(pg, table_row, ks, dst, &dst_k[u])) {
          row_offset<Paged>(pg, table_row, vs, src, &sv);
          row_offset<Paged>(pg, table_row, vs, dst, &dst_v[u]);
          kr[u] = *reinterpret_cast<const Vec*>(k_slice + sk + col[u] * sizeof(Vec));
          vr[u] = *reinterpret_cast<const Vec*>(v_slice + sv + col[u] * sizeof(Vec));
          ok[u] = true;
        }
      }
    }
    __syncthreads();  // the whole chunk is read before any of it is written
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (ok[u]) {
        *reinterpret_cast<Vec*>(k_slice + dst_k[u] + col[u] * sizeof(Vec)) = kr[u];
        *reinterpret_cast<Vec*>(v_slice + dst_v[u] + col[u] * sizeof(Vec)) = vr[u];
      }
    }
  }
}

SliceStrides byte_strides(const at::Tensor& c, bool paged) {
  const int64_t es = c.element_size();
  if (paged) return {c.stride(0) * es, 0, c.stride(3) * es, c.stride(2) * es, c.stride(1) * es};
  return {c.stride(0) * es, c.stride(1) * es, c.stride(2) * es, c.stride(3) * es, 0};
}

// The widest vector (16, 8, 4 or 2 bytes) that divides every address the kernel forms.
int vector_bytes(const at::Tensor& k, const at::Tensor& v, int64_t row_bytes, bool paged) {
  uint64_t all = reinterpret_cast<uint64_t>(k.data_ptr()) | reinterpret_cast<uint64_t>(v.data_ptr()) |
                 static_cast<uint64_t>(row_bytes);
  for (const SliceStrides& s : {byte_strides(k, paged), byte_strides(v, paged)})
    all |= static_cast<uint64_t>(s.l | s.b | s.h | s.s | s.page);
  for (int w : {16, 8, 4}) {
    if ((all & (w - 1)) == 0) return w;
  }
  return 2;
}

// One block per (layer, sequence, head) slice; rows: the logical rows of a slice (S, or paged
// max_pages * page_size).
template <typename Vec, bool Paged>
void launch(const at::Tensor& k, const at::Tensor& v, const at::Tensor& prefix, const at::Tensor& idx,
            const at::Tensor& lens, int64_t row_bytes, int64_t B, int64_t rows, const Paging& pg) {
  const int64_t L = k.size(0), H = Paged ? k.size(3) : k.size(2);
  SPECOPS_LAUNCH(L * B * H, kThreads, 0, gpu::current_stream(), kv_compact_kernel<Vec, Paged>)(
      static_cast<char*>(k.data_ptr()), static_cast<char*>(v.data_ptr()), prefix.data_ptr<int32_t>(),
      idx.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), B, H, rows, static_cast<int32_t>(idx.size(1)),
      static_cast<int32_t>(row_bytes / sizeof(Vec)), byte_strides(k, Paged), byte_strides(v, Paged), pg);
  SPECOPS_LAUNCH_CHECK();
}

void check_index(const char* op, const at::Tensor& k, const at::Tensor& prefix_lens, const at::Tensor& accept_idx,
                 const at::Tensor& accept_lens, int64_t B) {
  for (const at::Tensor* t : {&prefix_lens, &accept_idx, &accept_lens})
    TORCH_CHECK_VALUE(SPECOPS_ON_GPU(*t) && t->device() == k.device(), op,
                ": " SPECOPS_GPU_NAME " tensors on one device expected");
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_idx, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_lens, at::kInt);
  SPECOPS_CHECK_DIM(accept_idx, 2);
  TORCH_CHECK_VALUE(prefix_lens.numel() == B && accept_lens.numel() == B && accept_idx.size(0) == B,
              "prefix_lens, accept_lens must have shape [B] and accept_idx [B, A]");
}

void check_caches(const char* op, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* t : {&k, &v})
    TORCH_CHECK_VALUE(SPECOPS_ON_GPU(*t) && t->device() == k.device(), op,
                ": " SPECOPS_GPU_NAME " tensors on one device expected");
  TORCH_CHECK_VALUE(k.dim() == 5 && v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type(), op,
              ": the K and V caches must be rank 5, of one shape and dtype");
  TORCH_CHECK_VALUE(k.size(4) <= 1 || (k.stride(4) == 1 && v.stride(4) == 1), op,
              ": the K and V caches must have stride 1 in their last dimension");
}

template <bool Paged>
void dispatch(const at::Tensor& k, const at::Tensor& v, const at::Tensor& prefix_lens, const at::Tensor& accept_idx,
              const at::Tensor& accept_lens, int64_t B, int64_t rows, const Paging& pg) {
  const gpu::DeviceGuard guard(k.device());
  const auto prefix = prefix_lens.contiguous();
  const auto idx = accept_idx.contiguous();
  const auto lens = accept_lens.contiguous();
  const int64_t row_bytes = k.size(4) * k.element_size();
  switch (vector_bytes(k, v, row_bytes, Paged)) {
    case 16: return launch<uint4, Paged>(k, v, prefix, idx, lens, row_bytes, B, rows, pg);
    case 8: return launch<uint2, Paged>(k, v, prefix, idx, lens, row_bytes, B, rows, pg);
    case 4: return launch<uint32_t, Paged>(k, v, prefix, idx, lens, row_bytes, B, rows, pg);
    default: return launch<uint16_t, Paged>(k, v, prefix, idx, lens, row_bytes, B, rows, pg);
  }
}

}  // namespace

void kv_compact_cuda(const at::Tensor& k_cache,      // [L, B, Hkv, S, D] fp32/fp16/bf16, in place
                     const at::Tensor& v_cache,      // [L, B, Hkv, S, D] same dtype, in place
                     const at::Tensor& prefix_lens,  // [B] int32
                     const at::Tensor& accept_idx,   // [B, A] int32
                     const at::Tensor& accept_lens)  // [B] int32
{
  check_caches("kv_compact", k_cache, v_cache);
  const int64_t B = k_cache.size(1);
  check_index("kv_compact", k_cache, prefix_lens, accept_idx, accept_lens, B);
  if (k_cache.numel() == 0 || accept_idx.size(1) == 0) return;
  dispatch<false>(k_cache, v_cache, prefix_lens, accept_idx, accept_lens, B, k_cache.size(3), Paging{});
}

void kv_compact_paged_cuda(const at::Tensor& k_pages,      // [L, num_pages, page_size, Hkv, D], in place
                           const at::Tensor& v_pages,      // [L, num_pages, page_size, Hkv, D], in place
                           const at::Tensor& page_table,   // [B, max_pages] int32
                           const at::Tensor& prefix_lens,  // [B] int32
                           const at::Tensor& accept_idx,   // [B, A] int32
                           const at::Tensor& accept_lens)  // [B] int32
{
  check_caches("kv_compact_paged", k_pages, v_pages);
  TORCH_CHECK_VALUE(SPECOPS_ON_GPU(page_table) && page_table.device() == k_pages.device(),
              "kv_compact_paged: page_table must be on the caches' device");
  SPECOPS_CHECK_DTYPE(page_table, at::kInt);
  SPECOPS_CHECK_DIM(page_table, 2);
  const int64_t P = k_pages.size(2), B = page_table.size(0);
  TORCH_CHECK_VALUE(P > 0 && (P & (P - 1)) == 0, "kv_compact_paged: page_size must be a power of two, got ", P);
  check_index("kv_compact_paged", k_pages, prefix_lens, accept_idx, accept_lens, B);
  if (k_pages.numel() == 0 || accept_idx.size(1) == 0 || B == 0) return;
  const auto table = page_table.contiguous();
  Paging pg{table.data_ptr<int32_t>(), table.size(1),
            static_cast<int32_t>(__builtin_ctzll(static_cast<unsigned long long>(P))),
            static_cast<int32_t>(k_pages.size(1))};
  dispatch<true>(k_pages, v_pages, prefix_lens, accept_idx, accept_lens, B, table.size(1) * P, pg);
}

}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  m.impl("kv_compact", &specops::kv_compact_cuda);
  m.impl("kv_compact_paged", &specops::kv_compact_paged_cuda);
}
