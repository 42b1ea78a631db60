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

#include "../kv_compact_args.h"

namespace specops {
namespace {

struct RowRun {  // logical rows [src, src + len) move to [dst, dst + len) of every slice
  int64_t src, dst, len;
};

// Byte offset of logical row r of sequence b from its slice base (the move is known valid).
int64_t row_offset(const KvStrides& lay, const KvPaging& pg, int64_t b, int64_t r) {
  if (!pg.table) return r * lay.s;
  int64_t page, slot;
  kv_pool_row(pg.table + b * pg.s_table, pg.log2_page, pg.num_pages, r, &page, &slot);
  return page * lay.page + slot * lay.s;
}

// Consecutive non-identity moves with consecutive sources merge into one run; paged, only while
// both stay inside one page (rows r - 1 and r share a page iff r % page_size != 0).
void plan_runs(const int32_t* prefix, const int32_t* idx, const int32_t* lens, int64_t B, int32_t A,
               int64_t S, const KvPaging& pg, std::vector<RowRun>& runs, std::vector<int64_t>& first) {
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

// The moves of every (layer, sequence, head) slice: L * B * H tasks.
void compact(const kvc::Call& c) {
  const int64_t B = c.B, H = c.H, row_bytes = c.row_bytes;
  const KvStrides lay[2] = {c.ks, c.vs};
  const KvPaging& pg = c.pg;
  std::vector<RowRun> runs;
  std::vector<int64_t> first;
  plan_runs(c.prefix.data_ptr<int32_t>(), c.idx.data_ptr<int32_t>(), c.lens.data_ptr<int32_t>(), B, c.A, c.rows, pg,
            runs, first);
  if (runs.empty()) return;

  char* const bases[2] = {static_cast<char*>(c.k.data_ptr()), static_cast<char*>(c.v.data_ptr())};
  int64_t moved_rows = 0;
  for (const RowRun& r : runs) moved_rows += r.len;
  // A task (one slice, K and V) moves moved_rows / B rows of each cache on average. Aim for
  // >= 64 KiB per parallel chunk so the wake-up of a worker is paid for by its copying.
  const int64_t bytes_per_task = std::max<int64_t>(1, 2 * row_bytes * moved_rows / B);
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / bytes_per_task);

  auto slice_of = [&](int ci, int64_t t, int64_t* b_out) {  // task t = (l, b, h), h fastest
    const int64_t h = t % H, b = (t / H) % B, l = t / (H * B);
    *b_out = b;
    return bases[ci] + l * lay[ci].l + b * lay[ci].b + h * lay[ci].h;
  };
  // Slices lie megabytes apart, so the hardware prefetcher cannot guess the next one: ask for
  // the rows of the task kPrefetchAhead ahead while copying this one (sources to read,
  // destinations to own for writing), so the copy runs at bandwidth instead of at latency.
  auto prefetch = [&](int64_t t) {
    for (int ci = 0; ci < 2; ++ci) {
      int64_t b;
      const char* slice = slice_of(ci, t, &b);
      const int64_t rs = lay[ci].s;
      for (int64_t i = first[b]; i < first[b + 1]; ++i) {
        const RowRun& r = runs[i];
        const char* src = slice + row_offset(lay[ci], pg, b, r.src);
        const char* dst = slice + row_offset(lay[ci], pg, b, r.dst);
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

  at::parallel_for(0, c.L * B * H, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < std::min(hi, lo + kPrefetchAhead); ++t) prefetch(t);
    for (int64_t t = lo; t < hi; ++t) {
      if (t + kPrefetchAhead < hi) prefetch(t + kPrefetchAhead);
      for (int ci = 0; ci < 2; ++ci) {
        int64_t b;
        char* slice = slice_of(ci, t, &b);
        const int64_t rs = lay[ci].s;
        for (int64_t i = first[b]; i < first[b + 1]; ++i) {
          const RowRun& r = runs[i];
          char* src = slice + row_offset(lay[ci], pg, b, r.src);
          char* dst = slice + row_offset(lay[ci], pg, b, r.dst);
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

}  // namespace
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { SPECOPS_KVC_REGISTER(m, specops::CpuDevice, specops::compact); }
