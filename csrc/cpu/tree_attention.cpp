// tree_attention on the CPU: a tiled online-softmax (flash) kernel, parallel over work items
// (sequence, kv head, query tile, kv split) with a log-sum-exp combine of the splits.
//
// The kernel itself (tree_attention_kernel.h) is compiled once per instruction set below
// (AVX-512 with and without AVX512_BF16, AVX2, portable C++) and picked at run time, so the
// .so needs no -march flag. SPECOPS_CPU_ISA=generic|avx2|avx512|avx512bf16 caps the choice
// (tests use it to run every variant on one machine).
//
// tree_attention_paged runs the same kernel on a paged cache ([num_pages, page_size, Hkv, D] and a
// page table): the kernel addresses K/V rows only through ta::kv_row_offset, and copies fp32 paged
// rows into its packed tiles (kernel.h, `visit`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../registration.h"
#include "../tree_attention_args.h"
#include "../tree_attention_common.h"

namespace specops {
namespace ta {

constexpr int kTileN = 96;     // keys per K/V tile (a multiple of every register-tile height)
constexpr int kPadD = 32;      // O^T / packed-V rows: D + 16 (>= D + tile_rows - 1) rounded up to this
constexpr int kMaxRows = 192;  // query rows (queries x group heads) per work item
constexpr int kNarrow = 4;     // items of at most this many query rows take the narrow path (kernel.h)

// Everything a work item needs; pointers index the caller's tensors with element strides.
struct Problem {
  const void* q;  // [B, Tq, Hq, D]
  const void* k;  // [B, Hkv, S, D], or paged [num_pages, page_size, Hkv, D]
  const void* v;  // as k
  void* out;      // [B, Tq, Hq, D]
  const int32_t* prefix;  // [B]
  const int32_t* block;   // [B]
  const int32_t* q_lens;  // [B] or null (= Tq)
  const int32_t* mask;    // [B, Tq, W]
  int64_t sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_t, so_h;
  // Paged K/V (kv_row_offset): page table [B, max_pages] (null: contiguous), its row stride, the
  // page strides of k and v; sk_b = sv_b = 0 and sk_s / sv_s step between slots of a page.
  const int32_t* pages;
  int64_t s_pages, sk_pg, sv_pg;
  int32_t log2_page, num_pages;
  int32_t B, Tq, Hq, Hkv, G, D, S, W;  // S: rows a sequence can address (paged: max_pages * page_size)
  float scale_log2;  // sm_scale * log2(e)
  int32_t n_qtiles, n_splits;
  bool invariant;    // the batch-invariant schedule: one query per item, virtual tiles (ta::Partials)
  bool narrow;       // every item has <= kNarrow query rows: head dims in lanes (kernel.h, narrow_tile)
  int32_t Mp, Dp;    // padded query rows per item, padded head dim
  int64_t off_qt, off_ot, off_m, off_l, off_st, off_pt, off_kpk, off_vpk, off_cm, ws_floats;
  float* part_o;     // [n_splits, B, Tq, Hq, D] when n_splits > 1
  float* part_lse;   // [n_splits, B, Tq, Hq]
};

using ItemFn = void (*)(const Problem&, float*, int64_t);
using CombineFn = void (*)(const Problem&, int64_t, int64_t);

}  // namespace ta

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")
namespace ta_avx512bf16 {
using namespace ta;
#define TA_ISA 3
#include "tree_attention_kernel.h"
#undef TA_ISA
}  // namespace ta_avx512bf16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace ta_avx512 {
using namespace ta;
#define TA_ISA 2
#include "tree_attention_kernel.h"
#undef TA_ISA
}  // namespace ta_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace ta_avx2 {
using namespace ta;
#define TA_ISA 1
#include "tree_attention_kernel.h"
#undef TA_ISA
}  // namespace ta_avx2
#pragma GCC pop_options
#endif

namespace ta_generic {
using namespace ta;
#define TA_ISA 0
#include "tree_attention_kernel.h"
#undef TA_ISA
}  // namespace ta_generic

namespace {

enum Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

Isa cpu_isa() {
  static const Isa detected = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (avx512) return __builtin_cpu_supports("avx512bf16") ? kAvx512Bf16 : kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return kAvx2;
#endif
    return kGeneric;
  }();
  Isa isa = detected;
  if (const char* cap = std::getenv("SPECOPS_CPU_ISA")) {
    const Isa want = !std::strcmp(cap, "generic") ? kGeneric
                     : !std::strcmp(cap, "avx2") ? kAvx2
                     : !std::strcmp(cap, "avx512") ? kAvx512
                                                   : kAvx512Bf16;
    isa = std::min(isa, want);
  }
  return isa;
}

template <typename scalar_t>
std::pair<ta::ItemFn, ta::CombineFn> pick(Isa isa, int D, bool narrow) {
  constexpr bool bf16 = std::is_same_v<scalar_t, c10::BFloat16>;
#if defined(__x86_64__)
  if constexpr (bf16) {
    if (isa >= kAvx512Bf16 && D % 2 == 0 && !narrow)
      return {&ta_avx512bf16::run_item<scalar_t, true>, &ta_avx512bf16::combine<scalar_t>};
  }
  if (isa >= kAvx512) return {&ta_avx512::run_item<scalar_t, false>, &ta_avx512::combine<scalar_t>};
  if (isa >= kAvx2) return {&ta_avx2::run_item<scalar_t, false>, &ta_avx2::combine<scalar_t>};
#endif
  return {&ta_generic::run_item<scalar_t, false>, &ta_generic::combine<scalar_t>};
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

using ta::KvView;

at::Tensor run(const at::Tensor& q,            // [B, Tq, Hq, D]
               const KvView& kv,
               const at::Tensor& prefix_lens,  // [B] int32
               const at::Tensor& block_lens,   // [B] int32
               const at::Tensor& mask,         // [B, Tq, W] int32
               const std::optional<at::Tensor>& q_lens,  // [B] int32
               double sm_scale, const ta::Partials& parts) {
  const int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = kv.Hkv;
  auto out = at::empty({B, Tq, Hq, D}, q.options());
  if (out.numel() == 0) return out;
  const ta::Operands t = ta::operands(q, kv, prefix_lens, block_lens, mask, q_lens);  // outlives pb's pointers
  ta::Problem pb{};
  ta::fill_fields(pb, t, out, kv, sm_scale);
  pb.so_b = out.stride(0), pb.so_t = out.stride(1), pb.so_h = out.stride(2);

  // Query tiles: all G heads of a kv group for a balanced range of queries, <= kMaxRows rows; the
  // invariant schedule gives each query its own item (lanes never mix, but tiles are per query).
  pb.invariant = parts.invariant;
  const int64_t per_tile = pb.invariant ? 1 : std::max<int64_t>(1, ta::kMaxRows / pb.G);
  pb.n_qtiles = static_cast<int32_t>(ceil_div(Tq, per_tile));
  pb.Mp = static_cast<int32_t>(round_up(ceil_div(Tq, pb.n_qtiles) * pb.G, 16));
  // The path depends on the item's row capacity alone (G under the invariant schedule), never on
  // lengths, so an AR step and a verified block of the invariant schedule take the same one.
  pb.narrow = ceil_div(Tq, pb.n_qtiles) * pb.G <= ta::kNarrow;
  pb.Dp = static_cast<int32_t>(round_up(D + 16, ta::kPadD));

  int32_t max_tiles = 0, max_block = 0;  // the scratch and the thread count follow the real lengths
  for (int64_t b = 0; b < B; ++b) {
    const ta::SeqLens sl = ta::clamp_lens(pb.prefix[b], pb.block[b], static_cast<int32_t>(Tq), pb.S, pb.W, pb.Tq);
    max_tiles = std::max(max_tiles, pb.invariant ? static_cast<int32_t>(ceil_div(sl.prefix + sl.block, ta::kTileN))
                                                 : ta::num_kv_tiles(sl, ta::kTileN));
    max_block = std::max(max_block, sl.block);
  }
  // Each worker should get a few tens of microseconds of work, or the fork/join costs more than it
  // saves on small problems. The kernel runs at ~14 GFLOP/s of this count on one core of a 2-core
  // Xeon VM (a decode step of SmolLM2, 9 query heads over a 300-row prefix: 0.9 MFLOP in 64 us), so
  // 0.5 MFLOP is ~35 us. (At 4 MFLOP a worker, every decode step of a small model ran on one thread.)
  const double flop = 4.0 * B * Hq * Tq * (static_cast<double>(max_tiles) * ta::kTileN) * D;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), flop / 5e5 + 1));
  pb.n_splits = parts.n_splits;  // the caller's schedule (specops/ops/tree_attention/splits.py)
  pb.part_o = parts.part_o;
  pb.part_lse = parts.part_lse;
  const int64_t n_items = B * Hkv * pb.n_qtiles * pb.n_splits;

  // Per-thread scratch, in floats, every region 64-byte aligned.
  int64_t off = 0;
  auto region = [&off](int64_t floats) {
    const int64_t at = off;
    off += round_up(floats, 16);
    return at;
  };
  pb.off_qt = region((D + 1) * pb.Mp);
  pb.off_ot = region(static_cast<int64_t>(pb.Dp) * pb.Mp);
  pb.off_m = region(pb.Mp);
  pb.off_l = region(pb.Mp);
  pb.off_st = region(ta::kTileN * 64);
  pb.off_pt = region(ta::kTileN * 32);
  pb.off_kpk = region(ta::kTileN * D);
  pb.off_vpk = region(ta::kTileN * std::max<int64_t>(D, pb.Dp));
  pb.off_cm = region(static_cast<int64_t>(max_block + ta::kTileN) * (pb.Mp / 8));
  pb.ws_floats = off;
  const int64_t workers = std::min(threads, n_items);
  at::Tensor ws = at::empty({workers, pb.ws_floats}, q.options().dtype(at::kFloat));

  const Isa isa = cpu_isa();
  std::pair<ta::ItemFn, ta::CombineFn> fns;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "tree_attention_cpu", [&] {
    TORCH_CHECK_VALUE((!std::is_same_v<scalar_t, double>), "tree_attention: q must be fp32, fp16 or bf16");
    if constexpr (!std::is_same_v<scalar_t, double>) fns = pick<scalar_t>(isa, static_cast<int>(D), pb.narrow);
  });
  float* ws_base = ws.data_ptr<float>();
  std::atomic<int64_t> next{0};
  // One task per worker; workers pull items from a shared counter, so ragged items balance.
  at::parallel_for(0, workers, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t slot = lo; slot < hi; ++slot)
      for (int64_t it = next.fetch_add(1); it < n_items; it = next.fetch_add(1))
        fns.first(pb, ws_base + slot * pb.ws_floats, it);
  });
  if (pb.n_splits > 1) {
    at::parallel_for(0, B * Tq * Hq, 16, [&](int64_t lo, int64_t hi) { fns.second(pb, lo, hi); });
  }
  return out;
}

}  // namespace

}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  SPECOPS_TA_REGISTER(m, specops::CpuDevice, specops::ta::no_limits, specops::run);
}
