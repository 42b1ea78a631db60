// tree_attention helpers shared by the CPU (csrc/cpu) and CUDA (csrc/cuda) kernels: length
// clamping, the order of KV tiles (prefix tiles, then block tiles), work splitting, mask bits
// and the log-sum-exp combine. Plain index/bit/float logic, __host__ __device__ under nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"

namespace specops {
namespace ta {

constexpr int kMaxSplits = 64;  // most kv splits of one (sequence, kv head, query tile)

SPECOPS_HD int32_t clamp_i32(int32_t x, int32_t lo, int32_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// The lengths of one sequence, clamped into range. The public op validates them when
// check=True; with check=False this is what keeps every access in bounds.
struct SeqLens {
  int32_t prefix;   // committed keys [0, prefix)
  int32_t block;    // draft keys [prefix, prefix + block)
  int32_t queries;  // valid query rows [0, queries); the rest are padding
};

SPECOPS_HD SeqLens clamp_lens(int32_t prefix, int32_t block, int32_t q_len, int32_t S, int32_t W, int32_t Tq) {
  SeqLens r;
  r.prefix = clamp_i32(prefix, 0, S);
  const int64_t room64 = static_cast<int64_t>(32) * W < S - r.prefix ? static_cast<int64_t>(32) * W : S - r.prefix;
  r.block = clamp_i32(block, 0, static_cast<int32_t>(room64));
  r.queries = clamp_i32(q_len, 0, Tq);
  return r;
}

// The one place the kernels address a K/V row: the element offset of logical row r of a sequence
// from its (sequence, kv head) base. Contiguous caches ([B, Hkv, S, D]): r * s_row. Paged caches
// ([num_pages, page_size, Hkv, D], page_size = 2^log2_page; the base then holds no sequence term):
// page table_row[r >> log2_page] at s_page, slot r % page_size at s_row, the page id clamped into
// [0, num_pages) so that an unchecked page table never reads out of bounds (num_pages >= 1: with an
// empty pool the launchers set S = 0, so no row is ever addressed).
template <bool Paged>
SPECOPS_HD int64_t kv_row_offset(const int32_t* table_row, int32_t log2_page, int32_t num_pages, int64_t s_page,
                                 int64_t s_row, int64_t r) {
  if constexpr (Paged) {
    const int32_t page = clamp_i32(page_of_row(table_row, log2_page, r), 0, num_pages - 1);
    return page * s_page + slot_of_row(log2_page, r) * s_row;
  } else {
    return r * s_row;
  }
}

// A sequence's keys are walked in tiles of `tile`: the prefix tiles first (no mask test), then
// the block tiles (bit tests), so that no tile straddles the two.
struct KvTile {
  int32_t start;  // first cache row
  int32_t len;    // rows in this tile, 1..tile
  int32_t j0;     // block index of the first row, or -1 for a prefix tile
};

SPECOPS_HD int32_t num_kv_tiles(const SeqLens& s, int32_t tile) {
  return static_cast<int32_t>(ceil_div(s.prefix, tile) + ceil_div(s.block, tile));
}

SPECOPS_HD KvTile kv_tile(const SeqLens& s, int32_t t, int32_t tile) {
  const int32_t np = static_cast<int32_t>(ceil_div(s.prefix, tile));
  KvTile k;
  if (t < np) {
    k.start = t * tile;
    k.len = s.prefix - k.start < tile ? s.prefix - k.start : tile;
    k.j0 = -1;
  } else {
    k.j0 = (t - np) * tile;
    k.start = s.prefix + k.j0;
    k.len = s.block - k.j0 < tile ? s.block - k.j0 : tile;
  }
  return k;
}

// Split `part` of `parts` of `total` tiles: [*lo, *hi), sizes differing by at most one.
SPECOPS_HD void split_range(int32_t total, int32_t parts, int32_t part, int32_t* lo, int32_t* hi) {
  *lo = static_cast<int32_t>(static_cast<int64_t>(total) * part / parts);
  *hi = static_cast<int32_t>(static_cast<int64_t>(total) * (part + 1) / parts);
}

// One unit of parallel work: (sequence b, kv head g, query tile qt, kv split s), s fastest.
struct WorkItem {
  int32_t b, g, qt, s;
};

SPECOPS_HD WorkItem decode_item(int64_t item, int32_t Hkv, int32_t n_qtiles, int32_t n_splits) {
  WorkItem w;
  w.s = static_cast<int32_t>(item % n_splits);
  item /= n_splits;
  w.qt = static_cast<int32_t>(item % n_qtiles);
  item /= n_qtiles;
  w.g = static_cast<int32_t>(item % Hkv);
  w.b = static_cast<int32_t>(item / Hkv);
  return w;
}

// Query tile qt of n_qtiles over Tq queries: [*lo, *hi), balanced.
SPECOPS_HD void query_tile(int32_t Tq, int32_t n_qtiles, int32_t qt, int32_t* lo, int32_t* hi) {
  split_range(Tq, n_qtiles, qt, lo, hi);
}

// Up to 32 visibility bits of block keys [j0, j0 + 32) for the query whose mask row is `row`
// ([W] words): bit k <-> key j0 + k. Keys >= block (and words past W) read as invisible.
SPECOPS_HD uint32_t mask_bits32(const int32_t* row, int32_t W, int32_t j0, int32_t block) {
  const int32_t w = j0 >> 5, sh = j0 & 31;
  const uint32_t lo = w < W ? static_cast<uint32_t>(row[w]) : 0u;
  const uint32_t hi = w + 1 < W ? static_cast<uint32_t>(row[w + 1]) : 0u;
  uint32_t bits = sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
  const int32_t left = block - j0;
  if (left < 32) bits = left <= 0 ? 0u : bits & ((1u << left) - 1u);
  return bits;
}

// The batch-invariant schedule (docs/batch_invariance.md, "Invariant attention") walks one query
// row's *virtual sequence*: the prefix rows [0, prefix), then the block keys the row sees in index
// order, which is where AR decoding would have appended them. visible_block_keys writes those
// block indices to anc (room for `block` entries) and returns their count; virtual_row maps
// virtual position v to its cache row.
SPECOPS_HD int32_t visible_block_keys(const int32_t* row, int32_t W, int32_t block, int32_t* anc) {
  int32_t n = 0;
  for (int32_t j32 = 0; j32 < block; j32 += 32) {
    uint32_t bits = mask_bits32(row, W, j32, block);
    for (int32_t k = 0; bits; ++k, bits >>= 1)
      if (bits & 1u) anc[n++] = j32 + k;
  }
  return n;
}

SPECOPS_HD int32_t virtual_row(const SeqLens& s, const int32_t* anc, int32_t v) {
  return v < s.prefix ? v : s.prefix + anc[v - s.prefix];
}

// Log-sum-exp bookkeeping in base 2 (scores are pre-multiplied by log2(e)): a partial result
// with running max m and sum l has lse2 = m + log2(l), or -inf when it saw no key.
SPECOPS_HD float lse2(float m, float l) { return l > 0.f ? m + log2f(l) : -INFINITY; }

// Weight of a partial with log-sum-exp `lse` when the largest of the partials is `lse_max`.
SPECOPS_HD float combine_weight(float lse, float lse_max) {
  return lse == -INFINITY ? 0.f : exp2f(lse - lse_max);
}

}  // namespace ta
}  // namespace specops
