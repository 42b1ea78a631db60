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
#include "../kv_compact_args.h"

namespace specops {
namespace {

// Byte offset of logical row r from its slice base; false (skip the move) for an out-of-range page.
template <bool Paged>
__device__ __forceinline__ bool row_offset(const KvPaging& pg, const int32_t* table_row, const KvStrides& st,
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
                  KvStrides ks, KvStrides vs, KvPaging pg) {
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

// The widest vector (16, 8, 4 or 2 bytes) that divides every address the kernel forms.
int vector_bytes(const kvc::Call& c) {
  uint64_t all = reinterpret_cast<uint64_t>(c.k.data_ptr()) | reinterpret_cast<uint64_t>(c.v.data_ptr()) |
                 static_cast<uint64_t>(c.row_bytes);
  for (const KvStrides& s : {c.ks, c.vs})
    all |= static_cast<uint64_t>(s.l | s.b | s.h | s.s | s.page);
  for (int w : {16, 8, 4}) {
    if ((all & (w - 1)) == 0) return w;
  }
  return 2;
}

// One block per (layer, sequence, head) slice.
template <typename Vec, bool Paged>
void launch(const kvc::Call& c) {
  SPECOPS_LAUNCH(c.L * c.B * c.H, kThreads, 0, gpu::current_stream(), kv_compact_kernel<Vec, Paged>)(
      static_cast<char*>(c.k.data_ptr()), static_cast<char*>(c.v.data_ptr()), c.prefix.data_ptr<int32_t>(),
      c.idx.data_ptr<int32_t>(), c.lens.data_ptr<int32_t>(), c.B, c.H, c.rows, c.A,
      static_cast<int32_t>(c.row_bytes / sizeof(Vec)), c.ks, c.vs, c.pg);
  SPECOPS_LAUNCH_CHECK();
}

template <bool Paged>
void dispatch(const kvc::Call& c) {
  switch (vector_bytes(c)) {
    case 16: return launch<uint4, Paged>(c);
    case 8: return launch<uint2, Paged>(c);
    case 4: return launch<uint32_t, Paged>(c);
    default: return launch<uint16_t, Paged>(c);
  }
}

void run(const kvc::Call& c) { c.pg.table ? dispatch<true>(c) : dispatch<false>(c); }

}  // namespace
}  // namespace specops

SPECOPS_GPU_IMPL(m) { SPECOPS_KVC_REGISTER(m, specops::GpuDevice, specops::run); }
