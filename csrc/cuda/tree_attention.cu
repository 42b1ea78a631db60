// tree_attention on CUDA: the CPU kernel's semantics with the same shared helpers
// (csrc/tree_attention_common.h: length clamping, prefix-then-block tile order, kv splits,
// mask bits, log-sum-exp combine). Two kernels, by dtype:
//
// * fp16 / bf16 (tree_attention_tc_kernel, in tree_attention_tc.cuh): tensor cores,
//   FlashAttention-2 style. A block of 4 warps owns 64 query rows of one (sequence, kv head) — row
//   m is query m / G of head g * G + m % G, so a K/V tile is staged in shared memory once for the
//   whole GQA group — and one kv split. K/V tiles of BN keys arrive by cp.async, double buffered;
//   each warp computes S = Q K^T for its 16 rows with mma.sync m16n8k16 from ldmatrix fragments,
//   applies the visibility bits and the online softmax in registers, and accumulates O += P V
//   with P reused from the S registers.
// * fp32 (tree_attention_kernel): CUDA cores. A block owns 16 rows; each warp walks its rows over
//   tiles of 32 keys: lane j scores key j, shuffles reduce max/sum, lane l accumulates head dims
//   l, l + 32, ... in fp32.
// Prefix tiles never test a mask; block tiles read 32 visibility bits per row per word.
// tree_attention_paged runs the same kernels with Paged = true: K/V rows come from a paged cache
// ([num_pages, page_size, Hkv, D]) through the sequence's page table, in kv_off, the kernels' one
// way to address a K/V row.
// invariant=True runs them with Inv = true, the batch-invariant schedule (docs/batch_invariance.md,
// "Invariant attention"): a block's row tile holds one query's G heads (padding rows zero), and its
// keys are the query's virtual sequence (prefix, then the visible block keys in index order, listed
// once per block in shared memory) in tiles aligned to virtual position 0, no split. Every tile
// then holds the same rows in the same places as in the query's AR view: the same bits.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "gpu.cuh"
#include "mma.cuh"
#include "../registration.h"
#include "../tree_attention_args.h"
#include "../tree_attention_common.h"

namespace specops {
namespace {

constexpr int kTile = 32;  // keys per tile: one per lane
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per block
constexpr unsigned kFull = 0xffffffffu;

struct Args {
  const void* q;  // [B, Tq, Hq, D]
  const void* k;  // [B, Hkv, S, D], or paged [num_pages, page_size, Hkv, D]
  const void* v;  // as k
  void* out;      // [B, Tq, Hq, D]
  const int32_t* prefix;  // [B]
  const int32_t* block;   // [B]
  const int32_t* q_lens;  // [B] or null
  const int32_t* mask;    // [B, Tq, W]
  float* part_o;          // [NS, B * Tq * Hq, D] when NS > 1
  float* part_lse;        // [NS, B * Tq * Hq]
  int64_t sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s;
  // Paged K/V (ta::kv_row_offset): page table [B, max_pages], its row stride, the page strides of
  // k and v; sk_b = sv_b = 0 and sk_s / sv_s step between the slots of a page.
  const int32_t* pages;
  int64_t s_pages, sk_pg, sv_pg;
  int32_t log2_page, num_pages;
  int32_t B, Tq, Hq, Hkv, G, D, S, W, n_splits;  // S: rows a sequence can address
  int32_t vec;  // tc kernel: every row of q, k, v starts 16-byte aligned and D % 8 == 0 (cp.async)
  float scale_log2;
};

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Query row r of this block's row tile of `rows`: its query *i (a.Tq for a padding row) and head *h.
// Inv: a tile holds one query's heads (ceil(G / rows) tiles per query), the same rows as in the
// query's AR view; otherwise tiles of `rows` consecutive (query, head) rows, heads fastest.
template <bool Inv>
__device__ __forceinline__ void tile_row(const Args& a, int rows, int g, int r, int* i, int* h) {
  if constexpr (Inv) {
    const int per = (a.G + rows - 1) / rows, gh = static_cast<int>(blockIdx.x % per) * rows + r;
    *i = gh < a.G ? static_cast<int>(blockIdx.x / per) : a.Tq;
    *h = g * a.G + gh;
  } else {
    const int m = static_cast<int>(blockIdx.x) * rows + r;
    *i = m / a.G;
    *h = g * a.G + m % a.G;
  }
}

// Inv: the number of keys in this block's key walk, the query's virtual sequence (0 for a padding
// query), with its visible block keys in index order written to anc (shared memory, room for
// min(32 W, S) keys; ta::visible_block_keys' list, filled by all threads: word w's keys go after the
// popcount of the words before it, no scan). Every thread calls it; a barrier must follow before
// anc is read.
__device__ int32_t virtual_length(const Args& a, int b, int i, const ta::SeqLens& sl, int32_t* anc) {
  if (i >= sl.queries) return 0;
  const int32_t* mrow = a.mask + (static_cast<int64_t>(b) * a.Tq + i) * a.W;
  int32_t n = 0;
  for (int32_t j32 = 0, w = 0; j32 < sl.block; j32 += 32, ++w) {
    const uint32_t bits = ta::mask_bits32(mrow, a.W, j32, sl.block);
    if (w % static_cast<int32_t>(blockDim.x) == static_cast<int32_t>(threadIdx.x)) {
      int32_t k = n;
      for (uint32_t rest = bits; rest; rest &= rest - 1) anc[k++] = j32 + __ffs(static_cast<int>(rest)) - 1;
    }
    n += __popc(bits);
  }
  return sl.prefix + n;
}

// Tile t of the block's key walk (`tile` keys): ta::kv_tile's prefix and block tiles, or (Inv)
// virtual positions [t * tile, (t + 1) * tile) of the vlen-key virtual sequence (start is then a
// virtual position, j0 = -1: every key is visible).
template <bool Inv>
__device__ __forceinline__ ta::KvTile walk_tile(const ta::SeqLens& sl, int32_t vlen, int32_t t, int32_t tile) {
  if constexpr (Inv) {
    ta::KvTile k;
    k.start = t * tile;
    k.len = vlen - k.start < tile ? vlen - k.start : tile;
    k.j0 = -1;
    return k;
  } else {
    return ta::kv_tile(sl, t, tile);
  }
}

template <bool Inv>
__device__ __forceinline__ int32_t walk_tiles(const ta::SeqLens& sl, int32_t vlen, int32_t tile) {
  if constexpr (Inv) return static_cast<int32_t>(ceil_div(vlen, tile));
  else return ta::num_kv_tiles(sl, tile);
}

// Cache row of key n (< kt.len) of a walk tile.
template <bool Inv>
__device__ __forceinline__ int64_t walk_row(const ta::SeqLens& sl, const int32_t* anc, const ta::KvTile& kt, int n) {
  if constexpr (Inv) return ta::virtual_row(sl, anc, kt.start + n);
  else return kt.start + n;
}

// Offset of logical K (V: kIsV) row r from the (sequence, kv head) base: the kernels' one way to
// address a K/V row (contiguous, or through the sequence's page table row when Paged).
template <bool Paged, bool kIsV>
__device__ __forceinline__ int64_t kv_off(const Args& a, const int32_t* table_row, int64_t r) {
  return ta::kv_row_offset<Paged>(table_row, a.log2_page, a.num_pages, kIsV ? a.sv_pg : a.sk_pg,
                                  kIsV ? a.sv_s : a.sk_s, r);
}

// DC: head-dim chunks of 32 per lane (D <= 32 * DC). Paged: K/V in pages (tree_attention_paged).
// Inv: the batch-invariant schedule (one query per block, virtual key tiles).
template <typename scalar_t, int DC, bool Paged, bool Inv>
__global__ void __launch_bounds__(kWarps * 32) tree_attention_kernel(Args a) {
  SPECOPS_DYNAMIC_SMEM(float, smem);
  const int D = a.D, Dp = a.D + 1;  // +1: lane j reading row j of K hits its own bank
  float* ks = smem;              // [kTile][Dp]
  float* vs = ks + kTile * Dp;   // [kTile][Dp]
  float* qs = vs + kTile * Dp;   // [kRows][D], pre-scaled into the base-2 domain
  int32_t* anc = reinterpret_cast<int32_t*>(qs + kRows * D);  // Inv: [min(32 W, S)] visible block keys
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y / a.Hkv, g = blockIdx.y % a.Hkv, split = blockIdx.z;
  const ta::SeqLens sl = ta::clamp_lens(a.prefix[b], a.block[b], a.q_lens ? a.q_lens[b] : a.Tq, a.S, a.W, a.Tq);
  const scalar_t* q = static_cast<const scalar_t*>(a.q);
  const scalar_t* kb = static_cast<const scalar_t*>(a.k) + b * a.sk_b + g * a.sk_h;
  const scalar_t* vb = static_cast<const scalar_t*>(a.v) + b * a.sv_b + g * a.sv_h;
  const int32_t* table_row = Paged ? a.pages + b * a.s_pages : nullptr;

  for (int e = threadIdx.x; e < kRows * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    int i, h;
    tile_row<Inv>(a, kRows, g, r, &i, &h);
    qs[e] = i < sl.queries ? static_cast<float>(q[b * a.sq_b + i * a.sq_t + h * a.sq_h + d]) * a.scale_log2 : 0.f;
  }
  int32_t vlen = 0;  // Inv: the virtual sequence's length; anc is published by the first tile's barrier
  if constexpr (Inv) {
    int i0, h0;
    tile_row<Inv>(a, kRows, g, 0, &i0, &h0);
    vlen = virtual_length(a, b, i0, sl, anc);
  }

  float m_run[kRowsPerWarp], l_run[kRowsPerWarp], o[kRowsPerWarp][DC];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m_run[rr] = -INFINITY;
    l_run[rr] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[rr][c] = 0.f;
  }

  int32_t t0, t1;
  ta::split_range(walk_tiles<Inv>(sl, vlen, kTile), a.n_splits, split, &t0, &t1);
  for (int32_t t = t0; t < t1; ++t) {
    const ta::KvTile kt = walk_tile<Inv>(sl, vlen, t, kTile);
    __syncthreads();  // every warp is done with the previous tile (and qs, anc are written)
    for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
      const int n = e / D, d = e % D;
      const bool in = n < kt.len;
      const int64_t row = in ? walk_row<Inv>(sl, anc, kt, n) : 0;
      ks[n * Dp + d] = in ? static_cast<float>(kb[kv_off<Paged, false>(a, table_row, row) + d]) : 0.f;
      vs[n * Dp + d] = in ? static_cast<float>(vb[kv_off<Paged, true>(a, table_row, row) + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      int i, h;
      tile_row<Inv>(a, kRows, g, r, &i, &h);
      if (i >= sl.queries) continue;  // warp-uniform
      const float* qr = qs + r * D;
      const float* kr = ks + lane * Dp;
      float s = 0.f;
      for (int d = 0; d < D; ++d) s = fmaf(qr[d], kr[d], s);
      bool visible = lane < kt.len;
      if (kt.j0 >= 0) {  // block tile: 32 visibility bits of this query at once
        const uint32_t bits = ta::mask_bits32(a.mask + (static_cast<int64_t>(b) * a.Tq + i) * a.W, a.W, kt.j0,
                                              sl.block);
        visible = visible && ((bits >> lane) & 1u);
      }
      s = visible ? s : -INFINITY;
      const float m_new = fmaxf(m_run[rr], warp_max(s));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // finite even for rows that saw nothing
      const float alpha = exp2f(m_run[rr] - m_use);
      const float p = visible ? exp2f(s - m_use) : 0.f;
      l_run[rr] = l_run[rr] * alpha + warp_sum(p);
      m_run[rr] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[rr][c] *= alpha;
      for (int j = 0; j < kt.len; ++j) {
        const float pj = __shfl_sync(kFull, p, j);
        const float* vr = vs + j * Dp;
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          const int d = lane + 32 * c;
          if (d < D) o[rr][c] = fmaf(pj, vr[d], o[rr][c]);
        }
      }
    }
  }

  scalar_t* out = static_cast<scalar_t*>(a.out);
  const int64_t rows = static_cast<int64_t>(a.B) * a.Tq * a.Hq;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    int i, h;
    tile_row<Inv>(a, kRows, g, warp * kRowsPerWarp + rr, &i, &h);
    if (i >= a.Tq) continue;
    const bool valid = i < sl.queries && l_run[rr] > 0.f;
    const float inv = valid ? 1.f / l_run[rr] : 0.f;
    const int64_t row = (static_cast<int64_t>(b) * a.Tq + i) * a.Hq + h;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d >= D) continue;
      if (a.n_splits == 1) out[row * D + d] = static_cast<scalar_t>(o[rr][c] * inv);
      else a.part_o[(split * rows + row) * D + d] = o[rr][c] * inv;
    }
    if (a.n_splits > 1 && lane == 0) a.part_lse[split * rows + row] = valid ? ta::lse2(m_run[rr], l_run[rr]) : -INFINITY;
  }
}

// ---- tensor-core kernel (fp16 / bf16): tree_attention_tc.cuh ----------------------------------

#include "tree_attention_tc.cuh"

// One block per output row: merges the n_splits partials by their log-sum-exp.
template <typename scalar_t>
__global__ void combine_kernel(Args a) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.Tq * a.Hq;
  const int64_t row = blockIdx.x;
  float mx = -INFINITY;
  for (int s = 0; s < a.n_splits; ++s) mx = fmaxf(mx, a.part_lse[s * rows + row]);
  float total = 0.f;
  for (int s = 0; s < a.n_splits; ++s) total += ta::combine_weight(a.part_lse[s * rows + row], mx);
  const float inv = mx == -INFINITY ? 0.f : 1.f / total;
  scalar_t* out = static_cast<scalar_t*>(a.out) + row * a.D;
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < a.n_splits && mx > -INFINITY; ++s)
      acc += ta::combine_weight(a.part_lse[s * rows + row], mx) * a.part_o[(s * rows + row) * a.D + d];
    out[d] = static_cast<scalar_t>(acc * inv);
  }
}

template <typename K>
void launch(K kernel, const Args& a, dim3 grid, int threads, size_t smem, cudaStream_t stream) {
  if (smem > 48 * 1024)
    SPECOPS_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  SPECOPS_LAUNCH(grid, threads, smem, stream, kernel)(a);
  SPECOPS_LAUNCH_CHECK();
}

// The launch shape of one call: rows and keys per block tile, shared memory, head-dim bucket
// (mirrored by specops/ops/tree_attention/splits.py's CUDA program geometry).
struct LaunchShape {
  bool tc;       // tensor-core kernel (fp16 / bf16)
  int rows;      // query rows per block
  int tile;      // keys per kv tile
  int threads;
  int dbucket;   // tc: DP (64 / 128 / 256); fp32: DC (32-dim chunks per lane: 2 / 4 / 8)
  size_t smem;
};

LaunchShape launch_shape(at::ScalarType dtype, int64_t D) {
  if (dtype == at::kFloat) {
    const int dc = D <= 64 ? 2 : (D <= 128 ? 4 : 8);
    return {false, kRows, kTile, kWarps * 32, dc, (2 * kTile * (D + 1) + kRows * D) * sizeof(float)};
  }
  if (D <= 64) return {true, kTcRows, TcCfg<64>::kBN, kTcWarps * 32, 64, TcCfg<64>::kSmem};
  if (D <= 128) return {true, kTcRows, TcCfg<128>::kBN, kTcWarps * 32, 128, TcCfg<128>::kSmem};
  return {true, kTcRows, TcCfg<256>::kBN, kTcWarps * 32, 256, TcCfg<256>::kSmem};
}

template <typename scalar_t, bool Paged, bool Inv>
void run(const Args& a, const LaunchShape& p, dim3 grid, size_t smem, cudaStream_t stream) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (p.dbucket == 2) launch(tree_attention_kernel<float, 2, Paged, Inv>, a, grid, p.threads, smem, stream);
    else if (p.dbucket == 4) launch(tree_attention_kernel<float, 4, Paged, Inv>, a, grid, p.threads, smem, stream);
    else launch(tree_attention_kernel<float, 8, Paged, Inv>, a, grid, p.threads, smem, stream);
  } else {
    if (p.dbucket == 64)
      launch(tree_attention_tc_kernel<scalar_t, 64, Paged, Inv>, a, grid, p.threads, smem, stream);
    else if (p.dbucket == 128)
      launch(tree_attention_tc_kernel<scalar_t, 128, Paged, Inv>, a, grid, p.threads, smem, stream);
    else launch(tree_attention_tc_kernel<scalar_t, 256, Paged, Inv>, a, grid, p.threads, smem, stream);
  }
  if (a.n_splits > 1) {
    const int64_t rows = static_cast<int64_t>(a.B) * a.Tq * a.Hq;
    SPECOPS_LAUNCH(static_cast<unsigned>(rows), 128, 0, stream, combine_kernel<scalar_t>)(a);
    SPECOPS_LAUNCH_CHECK();
  }
}

// Every row of q, k and v starts on a 16-byte boundary and D is a multiple of 8: the tc kernel
// can move 8-element chunks with cp.async.
bool rows_aligned16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.size(3) % 8) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16) return false;
    for (int d = 0; d < 3; ++d)
      if (t->size(d) > 1 && t->stride(d) % 8) return false;
  }
  return true;
}

using ta::KvView;

// The CUDA kernels' limits (the shared checks are ta::call's).
void limits(const char* op, const at::Tensor& q, const KvView& kv) {
  const int64_t B = q.size(0), D = q.size(3);
  TORCH_CHECK_VALUE(D <= 256, op, " (cuda): head dim D must be <= 256, got ", D);
  TORCH_CHECK_VALUE(B * kv.Hkv < 65536, op, " (cuda): B * Hkv must be < 65536, got ", B * kv.Hkv);
}

at::Tensor run_call(const at::Tensor& q,            // [B, Tq, Hq, D]
                    const KvView& kv,
                    const at::Tensor& prefix_lens,  // [B] int32
                    const at::Tensor& block_lens,   // [B] int32
                    const at::Tensor& mask,         // [B, Tq, W] int32
                    const std::optional<at::Tensor>& q_lens,  // [B] int32
                    double sm_scale, const ta::Partials& parts) {
  const int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Hkv = kv.Hkv, S = kv.S, W = mask.size(2);
  const gpu::DeviceGuard guard(q.device());
  auto out = at::empty({B, Tq, Hq, D}, q.options());
  if (out.numel() == 0) return out;
  const ta::Operands t = ta::operands(q, kv, prefix_lens, block_lens, mask, q_lens);  // outlives a's pointers
  const bool paged = kv.pages.defined();
  Args a{};
  ta::fill_fields(a, t, out, kv, sm_scale);
  a.vec = rows_aligned16(t.q, t.k, t.v) ? 1 : 0;

  // The kv splits (flash-decoding) and their partials are the caller's schedule
  // (specops/ops/tree_attention/splits.py): a split that finds no tile contributes a -inf log-sum-exp.
  // The invariant schedule (parts.invariant, unsplit) gives each query its own ceil(G / rows) row
  // tiles and lists its visible block keys in shared memory after the kernel's own: room for the
  // most a sequence can have, min(32 W, S) (ta::clamp_lens). That room changes no arithmetic; the
  // tiles are launch_shape's, a function of D and the dtype only.
  const LaunchShape p = launch_shape(q.scalar_type(), D);
  const bool inv = parts.invariant;
  TORCH_CHECK_VALUE(!inv || parts.n_splits == 1, "tree_attention: invariant=True runs unsplit, got num_splits = ",
                    parts.n_splits);
  const int64_t row_tiles = inv ? Tq * ceil_div(a.G, p.rows) : ceil_div(Tq * a.G, p.rows);
  const int64_t anc_room = inv ? std::min<int64_t>(32 * W, S) : 0;
  const size_t smem = p.smem + static_cast<size_t>(ceil_div(anc_room, 4)) * 16;
  if (inv) {
    int optin = 0;
    SPECOPS_GPU_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.get_device()));
    TORCH_CHECK_VALUE(smem <= static_cast<size_t>(optin), "tree_attention (cuda): invariant=True lists a query's ",
                      "visible block keys in shared memory, room for min(32 * W, S) = ", anc_room, " keys: ", smem,
                      " bytes with the kernel's tiles, over the device's ", optin, " (mask width W = ", W,
                      ", cache length S = ", S, ")");
  }
  a.n_splits = parts.n_splits;
  a.part_o = parts.part_o;
  a.part_lse = parts.part_lse;
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(B * Hkv), static_cast<unsigned>(a.n_splits));
  cudaStream_t stream = gpu::current_stream();
#define SPECOPS_TA_RUN                                                                            \
  [&] {                                                                                           \
    if (inv) paged ? run<scalar_t, true, true>(a, p, grid, smem, stream)                          \
                   : run<scalar_t, false, true>(a, p, grid, smem, stream);                        \
    else paged ? run<scalar_t, true, false>(a, p, grid, smem, stream)                             \
               : run<scalar_t, false, false>(a, p, grid, smem, stream);                           \
  }
  AT_DISPATCH_SWITCH(q.scalar_type(), "tree_attention_cuda",
                     AT_DISPATCH_CASE(at::ScalarType::Float, SPECOPS_TA_RUN)
                     AT_DISPATCH_CASE(at::ScalarType::Half, SPECOPS_TA_RUN)
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, SPECOPS_TA_RUN));
#undef SPECOPS_TA_RUN
  return out;
}

}  // namespace

}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  SPECOPS_TA_REGISTER(m, specops::GpuDevice, specops::limits, specops::run_call);
}
