// kv_compact index logic shared by the CPU (csrc/cpu/kv_compact.cpp) and CUDA
// (csrc/cuda/kv_compact.cu) kernels, so the CPU tests exercise what the GPU runs.
//
// Move j of sequence b takes row prefix + accept_idx[j] to row prefix + j (rows of one
// (layer, sequence, head) slice of the cache, S rows in all).
#pragma once

#include <cstdint>

#include "common.h"

namespace specops {

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

}  // namespace specops
