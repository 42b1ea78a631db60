// Helpers shared by the CPU (csrc/cpu) and CUDA (csrc/cuda) kernels.
//
// Everything here is plain index / bit logic with no torch types, compiled as
// __host__ __device__ under nvcc and as ordinary inline C++ otherwise, so the
// CPU backend's tests exercise exactly the code the GPU kernels run.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECOPS_HD __host__ __device__ __forceinline__
#else
#define SPECOPS_HD inline
#endif

namespace specops {

SPECOPS_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bit-packed visibility masks: bit (j % 32) of word (j / 32) of a row marks node j.
// Stored as int32 because torch has no uint32; the bit pattern is what matters.
SPECOPS_HD int32_t mask_bit(int32_t j) { return static_cast<int32_t>(1u << (j & 31)); }

SPECOPS_HD bool mask_test(const int32_t* row, int32_t j) {
  return (static_cast<uint32_t>(row[j >> 5]) >> (j & 31)) & 1u;
}

SPECOPS_HD void mask_set(int32_t* row, int32_t j) {
  row[j >> 5] = static_cast<int32_t>(static_cast<uint32_t>(row[j >> 5]) | (1u << (j & 31)));
}

// Row i of the ancestor mask of a tree given by parent pointers.
//   parents: [T] (this sequence), row: [W] words (output), n: valid nodes.
// Returns the depth of node i (0 for the root and for padding rows i >= n).
// Padding rows hold only their own bit. The walk stops at any pointer that does
// not go strictly backwards, so an unchecked malformed tree cannot loop forever.
SPECOPS_HD int32_t tree_mask_row(const int32_t* parents, int32_t i, int32_t n,
                                 int32_t* row, int32_t W) {
  for (int32_t w = 0; w < W; ++w) row[w] = 0;
  mask_set(row, i);
  if (i >= n) return 0;
  int32_t depth = 0;
  int32_t j = i;
  while (true) {
    const int32_t p = parents[j];
    if (p < 0 || p >= j) break;
    mask_set(row, p);
    ++depth;
    j = p;
  }
  return depth;
}

// Paged KV caches (vLLM / FlashInfer): a sequence's rows live in a pool of fixed-size pages of
// 2^log2_page rows; `table_row` ([max_pages], that sequence's row of the page table) lists its
// pages in order, so logical row r sits in pool page table_row[r >> log2_page], slot
// r & (2^log2_page - 1). The caller keeps r < max_pages << log2_page; the page id read from the
// table is not checked here (readers clamp it, writers skip the row: see the kernels).
SPECOPS_HD int32_t page_of_row(const int32_t* table_row, int32_t log2_page, int64_t r) {
  return table_row[r >> log2_page];
}

SPECOPS_HD int64_t slot_of_row(int32_t log2_page, int64_t r) { return r & ((int64_t{1} << log2_page) - 1); }

}  // namespace specops
