// Host-side arguments of kv_compact / kv_compact_paged shared by the CPU and CUDA launchers: the
// checks (the device ones through the backend's Device, csrc/registration.h), the geometry of a call
// and its byte strides, and the registered entry points. Each backend supplies the runner.
//
// The public Python ops validate every argument with a ValueError/TypeError that names it; these
// checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>

#include "kv_compact_common.h"
#include "registration.h"

namespace specops {
namespace kvc {

// One call with moves to make: what a backend's runner reads.
struct Call {
  at::Tensor k, v;               // [L, B, Hkv, S, D], or paged [L, num_pages, page_size, Hkv, D]; in place
  at::Tensor prefix, idx, lens;  // [B], [B, A], [B] int32, contiguous
  at::Tensor table;              // paged: the page table [B, max_pages], contiguous; else undefined
  KvPaging pg;                   // the table's pointer and the pool's shape (table null: contiguous)
  KvStrides ks, vs;              // the byte strides of k and v
  int64_t L, B, H, rows, row_bytes;  // rows: the logical rows of a slice (S, or max_pages * page_size)
  int32_t A;
};

inline KvStrides byte_strides(const at::Tensor& c, bool paged) {
  const int64_t es = c.element_size();
  if (paged) return {c.stride(0) * es, 0, c.stride(3) * es, c.stride(2) * es, c.stride(1) * es};
  return {c.stride(0) * es, c.stride(1) * es, c.stride(2) * es, c.stride(3) * es, 0};
}

// c is the cache `name`, like the K cache `like_name` (the one it must match).
inline void check_cache(const char* op, const at::Tensor& c, const char* name, const at::Tensor& like,
                        const char* like_name) {
  TORCH_CHECK_VALUE(c.dim() == 5, op, ": ", name, " must have rank 5, got ", c.dim());
  TORCH_CHECK_VALUE(c.sizes() == like.sizes() && c.scalar_type() == like.scalar_type(), name, " must match ",
                    like_name, " in shape and dtype");
  TORCH_CHECK_VALUE(c.size(4) <= 1 || c.stride(4) == 1, name, " must have stride 1 in its last dimension");
}

inline void check_index(const at::Tensor& prefix_lens, const at::Tensor& accept_idx, const at::Tensor& accept_lens,
                        int64_t B) {
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_idx, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_lens, at::kInt);
  SPECOPS_CHECK_DIM(accept_idx, 2);
  TORCH_CHECK_VALUE(prefix_lens.numel() == B && accept_lens.numel() == B && accept_idx.size(0) == B,
                    "prefix_lens, accept_lens must have shape [B] and accept_idx [B, A]");
}

// table: the contiguous page table (undefined: contiguous caches).
inline Call make_call(const at::Tensor& k, const at::Tensor& v, const at::Tensor& prefix_lens,
                      const at::Tensor& accept_idx, const at::Tensor& accept_lens, int64_t B, int64_t rows,
                      const at::Tensor& table) {
  const bool paged = table.defined();
  Call c{k, v, prefix_lens.contiguous(), accept_idx.contiguous(), accept_lens.contiguous(), table};
  if (paged) {
    c.pg = KvPaging{table.data_ptr<int32_t>(), table.size(1),
                    static_cast<int32_t>(__builtin_ctzll(static_cast<unsigned long long>(k.size(2)))),
                    static_cast<int32_t>(k.size(1))};
  }
  c.ks = byte_strides(k, paged);
  c.vs = byte_strides(v, paged);
  c.L = k.size(0), c.B = B, c.H = paged ? k.size(3) : k.size(2), c.rows = rows;
  c.row_bytes = k.size(4) * k.element_size();
  c.A = static_cast<int32_t>(accept_idx.size(1));
  return c;
}

using RunFn = void (*)(const Call&);

template <class Dev, RunFn Run>
void contiguous_entry(const at::Tensor& k_cache,      // [L, B, Hkv, S, D] fp32/fp16/bf16, in place
                      const at::Tensor& v_cache,      // [L, B, Hkv, S, D] same dtype, in place
                      const at::Tensor& prefix_lens,  // [B] int32
                      const at::Tensor& accept_idx,   // [B, A] int32
                      const at::Tensor& accept_lens)  // [B] int32
{
  check_device<Dev>("kv_compact", {{"k_cache", &k_cache}, {"v_cache", &v_cache}, {"prefix_lens", &prefix_lens},
                                   {"accept_idx", &accept_idx}, {"accept_lens", &accept_lens}});
  check_cache("kv_compact", k_cache, "k_cache", k_cache, "k_cache");
  check_cache("kv_compact", v_cache, "v_cache", k_cache, "k_cache");
  for (const at::Tensor* c : {&k_cache, &v_cache})
    TORCH_CHECK_VALUE(c->size(3) <= 1 || std::abs(c->stride(3)) >= c->size(4),
                      "kv_compact: cache rows must not overlap");
  const int64_t B = k_cache.size(1);
  check_index(prefix_lens, accept_idx, accept_lens, B);
  if (k_cache.numel() == 0 || accept_idx.size(1) == 0) return;
  const typename Dev::Guard guard(k_cache.device());
  Run(make_call(k_cache, v_cache, prefix_lens, accept_idx, accept_lens, B, k_cache.size(3), at::Tensor()));
}

template <class Dev, RunFn Run>
void paged_entry(const at::Tensor& k_pages,      // [L, num_pages, page_size, Hkv, D], in place
                 const at::Tensor& v_pages,      // [L, num_pages, page_size, Hkv, D], in place
                 const at::Tensor& page_table,   // [B, max_pages] int32
                 const at::Tensor& prefix_lens,  // [B] int32
                 const at::Tensor& accept_idx,   // [B, A] int32
                 const at::Tensor& accept_lens)  // [B] int32
{
  check_device<Dev>("kv_compact_paged", {{"k_pages", &k_pages}, {"v_pages", &v_pages}, {"page_table", &page_table},
                                         {"prefix_lens", &prefix_lens}, {"accept_idx", &accept_idx},
                                         {"accept_lens", &accept_lens}});
  check_cache("kv_compact_paged", k_pages, "k_pages", k_pages, "k_pages");
  check_cache("kv_compact_paged", v_pages, "v_pages", k_pages, "k_pages");
  SPECOPS_CHECK_DTYPE(page_table, at::kInt);
  SPECOPS_CHECK_DIM(page_table, 2);
  const int64_t P = k_pages.size(2), B = page_table.size(0);
  TORCH_CHECK_VALUE(P > 0 && (P & (P - 1)) == 0, "kv_compact_paged: page_size must be a power of two, got ", P);
  check_index(prefix_lens, accept_idx, accept_lens, B);
  if (k_pages.numel() == 0 || accept_idx.size(1) == 0 || B == 0) return;
  const typename Dev::Guard guard(k_pages.device());
  Run(make_call(k_pages, v_pages, prefix_lens, accept_idx, accept_lens, B, page_table.size(1) * P,
                page_table.contiguous()));
}

// Registers both ops for one backend.
#define SPECOPS_KVC_REGISTER(m, DEV, RUN)                                \
  do {                                                                   \
    m.impl("kv_compact", &specops::kvc::contiguous_entry<DEV, RUN>);     \
    m.impl("kv_compact_paged", &specops::kvc::paged_entry<DEV, RUN>);    \
  } while (0)

}  // namespace kvc
}  // namespace specops
