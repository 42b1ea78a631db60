// kv_compact on the CPU: one worker per (layer, sequence, head) slice copies its accepted
// rows forward, in order (overlap-safe: see the proof in csrc/kv_compact_common.h).
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

struct RowRun {  // rows [src, src + len) move to [dst, dst + len) of every slice
  int64_t src, dst, len;
};

// Consecutive non-identity moves with consecutive sources merge into one run.
void plan_runs(const int32_t* prefix, const int32_t* idx, const int32_t* lens, int64_t B, int32_t A,
               int64_t S, std::vector<RowRun>& runs, std::vector<int64_t>& first) {
  first.assign(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    first[b] = static_cast<int64_t>(runs.size());
    const int32_t n = kv_num_moves(lens[b], A);
    for (int32_t j = 0; j < n; ++j) {
      int64_t src, dst;
      if (!kv_move_rows(prefix[b], idx + b * A, j, S, &src, &dst)) continue;
      if (runs.size() > static_cast<size_t>(first[b])) {
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

void check_cache(const at::Tensor& c, const char* name, const at::Tensor& like) {
  TORCH_CHECK(c.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(c.dim() == 5, name, " must have rank 5 [L, B, Hkv, S, D]");
  TORCH_CHECK(c.sizes() == like.sizes() && c.scalar_type() == like.scalar_type(), name,
              " must match k_cache in shape and dtype");
  TORCH_CHECK(c.size(4) <= 1 || c.stride(4) == 1, name, " must have stride 1 in its last dimension");
  TORCH_CHECK(c.size(3) <= 1 || std::abs(c.stride(3)) >= c.size(4), name, " rows must not overlap");
}

}  // namespace

void kv_compact_cpu(const at::Tensor& k_cache,      // [L, B, Hkv, S, D] fp32/fp16/bf16, in place
                    const at::Tensor& v_cache,      // [L, B, Hkv, S, D] same dtype, in place
                    const at::Tensor& prefix_lens,  // [B] int32
                    const at::Tensor& accept_idx,   // [B, A] int32
                    const at::Tensor& accept_lens)  // [B] int32
{
  check_cache(k_cache, "k_cache", k_cache);
  check_cache(v_cache, "v_cache", k_cache);
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_idx, at::kInt);
  SPECOPS_CHECK_DTYPE(accept_lens, at::kInt);
  SPECOPS_CHECK_DIM(accept_idx, 2);
  const int64_t L = k_cache.size(0), B = k_cache.size(1), H = k_cache.size(2), S = k_cache.size(3),
                D = k_cache.size(4);
  TORCH_CHECK(prefix_lens.numel() == B && accept_lens.numel() == B && accept_idx.size(0) == B,
              "prefix_lens, accept_lens must have shape [B] and accept_idx [B, A]");
  TORCH_CHECK(prefix_lens.device().is_cpu() && accept_idx.device().is_cpu() && accept_lens.device().is_cpu(),
              "kv_compact: index tensors must be CPU tensors");
  const int32_t A = static_cast<int32_t>(accept_idx.size(1));
  if (k_cache.numel() == 0 || A == 0) return;

  const auto prefix = prefix_lens.contiguous();
  const auto idx = accept_idx.contiguous();
  const auto lens = accept_lens.contiguous();
  std::vector<RowRun> runs;
  std::vector<int64_t> first;
  plan_runs(prefix.data_ptr<int32_t>(), idx.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), B, A, S, runs,
            first);
  if (runs.empty()) return;

  const int64_t es = k_cache.element_size();
  const int64_t row_bytes = D * es;
  char* const bases[2] = {static_cast<char*>(k_cache.data_ptr()), static_cast<char*>(v_cache.data_ptr())};
  const at::Tensor* caches[2] = {&k_cache, &v_cache};
  int64_t stride[2][4];  // bytes per step in L, B, H, S
  for (int c = 0; c < 2; ++c)
    for (int d = 0; d < 4; ++d) stride[c][d] = caches[c]->stride(d) * es;

  int64_t moved_rows = 0;
  for (const RowRun& r : runs) moved_rows += r.len;
  // A task (one slice, K and V) moves moved_rows / B rows of each cache on average. Aim for
  // >= 64 KiB per parallel chunk so the wake-up of a worker is paid for by its copying.
  const int64_t bytes_per_task = std::max<int64_t>(1, 2 * row_bytes * moved_rows / B);
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / bytes_per_task);

  auto slice_of = [&](int c, int64_t t, int64_t* b_out) {  // task t = (l, b, h), h fastest
    const int64_t h = t % H, b = (t / H) % B, l = t / (H * B);
    *b_out = b;
    return bases[c] + l * stride[c][0] + b * stride[c][1] + h * stride[c][2];
  };
  // Slices lie megabytes apart, so the hardware prefetcher cannot guess the next one: ask for
  // the rows of the task kPrefetchAhead ahead while copying this one (sources to read,
  // destinations to own for writing), so the copy runs at bandwidth instead of at latency.
  auto prefetch = [&](int64_t t) {
    for (int c = 0; c < 2; ++c) {
      int64_t b;
      const char* slice = slice_of(c, t, &b);
      const int64_t rs = stride[c][3];
      for (int64_t i = first[b]; i < first[b + 1]; ++i) {
        const RowRun& r = runs[i];
        for (int64_t q = 0; q < r.len; ++q) {
          for (int64_t off = 0; off < row_bytes; off += 64) {
            __builtin_prefetch(slice + (r.src + q) * rs + off, 0, 3);
            __builtin_prefetch(slice + (r.dst + q) * rs + off, 1, 3);
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
        const int64_t rs = stride[c][3];
        for (int64_t i = first[b]; i < first[b + 1]; ++i) {
          const RowRun& r = runs[i];
          if (rs == row_bytes) {
            // One block; it may overlap itself (dst < src), which memmove copies forward correctly.
            std::memmove(slice + r.dst * rs, slice + r.src * rs, r.len * row_bytes);
          } else {
            // Rows apart in memory: distinct rows are disjoint, and in-order keeps sources intact.
            for (int64_t q = 0; q < r.len; ++q)
              std::memcpy(slice + (r.dst + q) * rs, slice + (r.src + q) * rs, row_bytes);
          }
        }
      }
    }
  });
}

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("kv_compact", &specops::kv_compact_cpu); }
