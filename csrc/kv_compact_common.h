// kv_compact index logic shared by the CPU (csrc/cpu/kv_compact.cpp) and CUDA
// (csrc/cuda/kv_compact.cu) kernels, so the CPU tests exercise what the GPU runs.
//
// Move j of sequence b takes row prefix + accept_idx[j] to row prefix + j (rows of one
// (layer, sequence, head) slice of the cache, S rows in all; paged: S = max_pages * page_size
// logical rows, placed by the page table).
#pragma once

#include <cstdint>

#include "common.h"

namespace specops {

// Where the rows of one cache live, in bytes per step: a (layer, sequence, head) slice at
// l * l + b * b + h * h, row r of it at r * s. Paged caches: b = 0, and row r of sequence b at
// page * page + slot * s, page and slot from the sequence's row of the page table (KvPaging).
struct KvStrides {
  int64_t l, b, h, s, page;
};

// Paged caches: the page table [B, max_pages] (null: contiguous), its row stride, and the pool's shape.
struct KvPaging {
  const int32_t* table = nullptr;
  int64_t s_table = 0;
  int32_t log2_page = 0, num_pages = 0;
};

// How many moves sequence b makes: accept_len clamped to [0, A]. The public op rejects
// values outside that range; the clamp only keeps unchecked input inside accept_idx.
SPECOPS_HD int32_t kv_num_moves(int32_t accept_len, int32_t A) {
  return accept_len < 0 ? 0 : (accept_len > A ? A : accept_len);
}

// Source and destination row of move j; false when the move must be skipped: it leaves
// [0, S) (only possible with unchecked input: the kernels never write out of bounds) or
// it is the identity (nothing to copy, and the row must not be copied onto itself).
SPECOPS_HD bool kv_move_rows(int32_t prefix, const int32_t* accept_idx_row, int32_t j, int64_t S,
                             int64_t* src, int64_t* dst) {
  *dst = static_cast<int64_t>(prefix) + j;
  *src = static_cast<int64_t>(prefix) + accept_idx_row[j];
  return *src != *dst && *src >= 0 && *src < S && *dst >= 0 && *dst < S;
}

// Paged caches ([L, num_pages, page_size, Hkv, D]): logical row r of a sequence is pool page
// *page = table_row[r >> log2_page], slot *slot = r % page_size. False when the page id leaves
// [0, num_pages): the move is skipped (unchecked input; the kernels never write out of bounds).
SPECOPS_HD bool kv_pool_row(const int32_t* table_row, int32_t log2_page, int32_t num_pages, int64_t r,
                            int64_t* page, int64_t* slot) {
  *page = page_of_row(table_row, log2_page, r);
  *slot = slot_of_row(log2_page, r);
  return *page >= 0 && *page < num_pages;
}

// Why a forward, in-order pass is overlap-safe (used by the CPU kernel per row and by the
// CUDA kernel per chunk of rows; the Triton kernel loads its whole block first instead).
// accept_idx is strictly increasing from accept_idx[0] >= 0, so accept_idx[j] >= j:
// every destination prefix + j lies at or before its source prefix + accept_idx[j].
// When move j reads its source, the rows written so far are prefix + j' for j' < j, and
// prefix + j' < prefix + j <= prefix + accept_idx[j]: no earlier move has overwritten the
// row move j reads, so each move copies the original value, exactly what gathering every
// source first and scattering second yields. A source equal to its destination
// (accept_idx[j] == j) is skipped, so every copied pair of rows is disjoint memory (the
// public op rejects caches whose distinct rows share memory). Each (layer, sequence,
// head) slice is written only by the worker that owns it, so workers never race.
// The same argument covers a run of consecutive moves copied as one block with memmove
// (dst < src, so a forward copy): later runs read rows past every row this run writes.
// Paged caches: the argument is about logical rows, so it holds as long as the rows a move writes
// are no other logical row the moves read or write. The public op checks that with check=True (a
// page a move writes is addressed by no other page-table entry of the call, of any sequence); then
// the slices of different sequences never write shared memory either, and rows of one page are
// disjoint memory like any two rows.

}  // namespace specops
