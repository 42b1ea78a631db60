// kv_compact on the CPU: one worker per (layer, sequence, head) slice copies its accepted
// rows forward, in order (overlap-safe: see the proof in csrc/kv_compact_common.h).
// kv_compact_paged runs the same code on a paged cache: rows are placed through the page table
// (row_offset), and runs of rows never cross a page.
//
// The moves of a sequence are the same in every layer and head, so they are planned once
// per sequence as runs of consecutive rows; when rows are contiguous in memory a run is a
// single memmove. glibc's memcpy/memmove pick AVX2 / AVX-512 code at run time, which gives
// wide copies without -march flags. The copy is dtype-agnostic: rows are D * itemsize bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "../kv_compact_common.h"
#include "../registration.h"

namespace specops {
namespace {

struct RowRun {  // logical rows [src, src + len) move to [dst, dst + len) of every slice
  int64_t src, dst, len;
};

// Where rows live. Contiguous: a slice (l, b, h) at l * l + b * b + h * h bytes, row r at r * s.
// Paged: b = 0 and row r of sequence b at page * page + slot * s (page, slot from its table row).
struct Layout {
  int64_t l, b, h, s, page;  // bytes per step
};

struct Paging {
  const int32_t* table = nullptr;  // [B, max_pages] (null: contiguous)
  int64_t s_table = 0;
  int32_t log2_page = 0, num_pages = 0;
};

// Byte offset of logical row r of sequence b from its slice base (the move is known valid).
int64_t row_offset(const Layout& lay, const Paging& pg, int64_t b, int64_t r) {
  if (!pg.table) return r * lay.s;
  int64_t page, slot;
  kv_pool_row(pg.table + b * pg.s_table, pg.log2_page, pg.num_pages, r, &page, &slot);
  return page * lay.page + slot * lay.s;
}

// Consecutive non-identity moves with consecutive sources merge into one run; paged, only while
// both stay inside one page (rows r - 1 and r share a page iff r % page_size != 0).
void plan_runs(const int32_t* prefix, const int32_t* idx, const int32_t* lens, int64_t B, int32_t A,
               int64_t S, const Paging& pg, std::vector<RowRun>& runs, std::vector<int64_t>& first) {
  first.assign(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    first[b] = static_cast<int64_t>(runs.size());
    const int32_t n = kv_num_moves(lens[b], A);
    for (int32_t j = 0; j < n; ++j) {
      int64_t src, dst;
      if (!kv_move_rows(prefix[b], idx + b * A, j, S, &src, &dst)) continue;
      bool same_page = true;
      if (pg.table) {
        int64_t sp, ss, dp, ds;
        const int32_t* row = pg.table + b * pg.s_table;
        if (!kv_pool_row(row, pg.log2_page, pg.num_pages, src, &sp, &ss) ||
            !kv_pool_row(row, pg.log2_page, pg.num_pages, dst, &dp, &ds))
          continue;
        same_page = ss != 0 && ds != 0;
      }
      if (same_page && runs.size() > static_cast<size_t>(first[b])) {
        RowRun& last = runs.back();
        if (last.src + last.len == src && last.dst + last.len == dst) {
          ++last.len;
          continue;
        }
      }
      runs.push_back({src, dst, 1});
    }
  }
  first[B] = static_cast<int64_t>(runs.size());
}

// c is the cache `name`, like the K cache `like_name` (the one it must match).
void check_cache(const char* op, const at::Tensor& c, const char* name, const at::Tensor& like, const char* like_name) {
  TORCH_CHECK_VALUE(c.device().is_cpu(), op, ": ", name, " must be a CPU tensor");
  TORCH_CHECK_VALUE(c.dim() == 5, op, ": ", name, " must have rank 5");
  TORCH_CHECK_VALUE(c.sizes() == like.sizes() && c.scalar_type() == like.scalar_type(), name, " must match ", like_name,
              " in shape and dtype");
  TORCH_CHECK_VALUE(c.size(4) <= 1 || c.stride(4) == 1, name, " must have stride 1 in its last dimension");
}

void check_index(const char* op, const at::Tensor& prefix_lens, const at::Tensor& accept_idx,
                 const at::Tensor& accept_lens, int64_t B) {
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_idx, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_lens, at::kInt);
  SPECOPS_CHECK_DIM(accept_idx, 2);
  TORCH_CHECK_VALUE(prefix_lens.numel() == B && accept_lens.numel() == B && accept_idx.size(0) == B,
              "prefix_lens, accept_lens must have shape [B] and accept_idx [B, A]");
  TORCH_CHECK_VALUE(prefix_lens.device().is_cpu() && accept_idx.device().is_cpu() && accept_lens.device().is_cpu(),
              op, ": index tensors must be CPU tensors");
}

// The moves of every (layer, sequence, head) slice: L * B * H tasks, slices of `rows` logical rows.
void compact(const at::Tensor& k, const at::Tensor& v, const Layout (&lay)[2], const Paging& pg, int64_t L,
             int64_t B, int64_t H, int64_t rows, int64_t row_bytes, const at::Tensor& prefix_lens,
             const at::Tensor& accept_idx, const at::Tensor& accept_lens) {
  const int32_t A = static_cast<int32_t>(accept_idx.size(1));
  const auto prefix = prefix_lens.contiguous();
  const auto idx = accept_idx.contiguous();
  const auto lens = accept_lens.contiguous();
  std::vector<RowRun> runs;
  std::vector<int64_t> first;
  plan_runs(prefix.data_ptr<int32_t>(), idx.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), B, A, rows, pg, runs,
            first);
  if (runs.empty()) return;

  char* const bases[2] = {static_cast<char*>(k.data_ptr()), static_cast<char*>(v.data_ptr())};
  int64_t moved_rows = 0;
  for (const RowRun& r : runs) moved_rows += r.len;
  // A task (one slice, K and V) moves moved_rows / B rows of each cache on average. Aim for
  // >= 64 KiB per parallel chunk so the wake-up of a worker is paid for by its copying.
  const int64_t bytes_per_task = std::max<int64_t>(1, 2 * row_bytes * moved_rows / B);
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / bytes_per_task);

  auto slice_of = [&](int c, int64_t t, int64_t* b_out) {  // task t = (l, b, h), h fastest
    const int64_t h = t % H, b = (t / H) % B, l = t / (H * B);
    *b_out = b;
    return bases[c] + l * lay[c].l + b * lay[c].b + h * lay[c].h;
  };
  // Slices lie megabytes apart, so the hardware prefetcher cannot guess the next one: ask for
  // the rows of the task kPrefetchAhead ahead while copying this one (sources to read,
  // destinations to own for writing), so the copy runs at bandwidth instead of at latency.
  auto prefetch = [&](int64_t t) {
    for (int c = 0; c < 2; ++c) {
      int64_t b;
      const char* slice = slice_of(c, t, &b);
      const int64_t rs = lay[c].s;
      for (int64_t i = first[b]; i < first[b + 1]; ++i) {
        const RowRun& r = runs[i];
        const char* src = slice + row_offset(lay[c], pg, b, r.src);
        const char* dst = slice + row_offset(lay[c], pg, b, r.dst);
        for (int64_t q = 0; q < r.len; ++q) {
          for (int64_t off = 0; off < row_bytes; off += 64) {
            __builtin_prefetch(src + q * rs + off, 0, 3);
            __builtin_prefetch(dst + q * rs + off, 1, 3);
          }
        }
      }
    }
  };
  constexpr int64_t kPrefetchAhead = 2;

  at::parallel_for(0, L * B * H, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < std::min(hi, lo + kPrefetchAhead); ++t) prefetch(t);
    for (int64_t t = lo; t < hi; ++t) {
      if (t + kPrefetchAhead < hi) prefetch(t + kPrefetchAhead);
      for (int c = 0; c < 2; ++c) {
        int64_t b;
        char* slice = slice_of(c, t, &b);
        const int64_t rs = lay[c].s;
        for (int64_t i = first[b]; i < first[b + 1]; ++i) {
          const RowRun& r = runs[i];
          char* src = slice + row_offset(lay[c], pg, b, r.src);
          char* dst = slice + row_offset(lay[c], pg, b, r.dst);
          if (rs == row_bytes) {
            // One block; it may overlap itself (dst < src), which memmove copies forward correctly.
            std::memmove(dst, src, r.len * row_bytes);
          } else {
            // Rows apart in memory: distinct rows are disjoint, and in-order keeps sources intact.
            for (int64_t q = 0; q < r.len; ++q) std::memcpy(dst + q * rs, src + q * rs, row_bytes);
          }
        }
      }
    }
  });
}

Layout byte_layout(const at::Tensor& c, bool paged) {
  const int64_t es = c.element_size();
  if (paged) return {c.stride(0) * es, 0, c.stride(3) * es, c.stride(2) * es, c.stride(1) * es};
  return {c.stride(0) * es, c.stride(1) * es, c.stride(2) * es, c.stride(3) * es, 0};
}

}  // namespace

void kv_compact_cpu(const at::Tensor& k_cache,      // [L, B, Hkv, S, D] fp32/fp16/bf16, in place
                    const at::Tensor& v_cache,      // [L, B, Hkv, S, D] same dtype, in place
                    const at::Tensor& prefix_lens,  // [B] int32
                    const at::Tensor& accept_idx,   // [B, A] int32
                    const at::Tensor& accept_lens)  // [B] int32
{
  check_cache("kv_compact", k_cache, "k_cache", k_cache, "k_cache");
  check_cache("kv_compact", v_cache, "v_cache", k_cache, "k_cache");
  for (const at::Tensor* c : {&k_cache, &v_cache})
    TORCH_CHECK_VALUE(c->size(3) <= 1 || std::abs(c->stride(3)) >= c->size(4), "kv_compact: cache rows must not overlap");
  const int64_t L = k_cache.size(0), B = k_cache.size(1), H = k_cache.size(2), S = k_cache.size(3),
                D = k_cache.size(4);
  check_index("kv_compact", prefix_lens, accept_idx, accept_lens, B);
  if (k_cache.numel() == 0 || accept_idx.size(1) == 0) return;
  const Layout lay[2] = {byte_layout(k_cache, false), byte_layout(v_cache, false)};
  compact(k_cache, v_cache, lay, Paging{}, L, B, H, S, D * k_cache.element_size(), prefix_lens, accept_idx,
          accept_lens);
}

void kv_compact_paged_cpu(const at::Tensor& k_pages,      // [L, num_pages, page_size, Hkv, D], in place
                          const at::Tensor& v_pages,      // [L, num_pages, page_size, Hkv, D], in place
                          const at::Tensor& page_table,   // [B, max_pages] int32
                          const at::Tensor& prefix_lens,  // [B] int32
                          const at::Tensor& accept_idx,   // [B, A] int32
                          const at::Tensor& accept_lens)  // [B] int32
{
  check_cache("kv_compact_paged", k_pages, "k_pages", k_pages, "k_pages");
  check_cache("kv_compact_paged", v_pages, "v_pages", k_pages, "k_pages");
  SPECOPS_CHECK_DTYPE(page_table, at::kInt);
  SPECOPS_CHECK_DIM(page_table, 2);
  TORCH_CHECK_VALUE(page_table.device().is_cpu(), "kv_compact_paged: page_table must be a CPU tensor");
  const int64_t L = k_pages.size(0), N = k_pages.size(1), P = k_pages.size(2), H = k_pages.size(3),
                D = k_pages.size(4), B = page_table.size(0);
  TORCH_CHECK_VALUE(P > 0 && (P & (P - 1)) == 0, "kv_compact_paged: page_size must be a power of two, got ", P);
  check_index("kv_compact_paged", prefix_lens, accept_idx, accept_lens, B);
  if (k_pages.numel() == 0 || accept_idx.size(1) == 0 || B == 0) return;
  const auto table = page_table.contiguous();
  Paging pg;
  pg.table = table.data_ptr<int32_t>();
  pg.s_table = table.size(1);
  pg.log2_page = static_cast<int32_t>(__builtin_ctzll(static_cast<uint64_t>(P)));
  pg.num_pages = static_cast<int32_t>(N);
  const Layout lay[2] = {byte_layout(k_pages, true), byte_layout(v_pages, true)};
  compact(k_pages, v_pages, lay, pg, L, B, H, table.size(1) * P, D * k_pages.element_size(), prefix_lens,
          accept_idx, accept_lens);
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("kv_compact", &specops::kv_compact_cpu);
  m.impl("kv_compact_paged", &specops::kv_compact_paged_cpu);
}
