// The tree-walk engine shared by csrc/cpu/verify.cpp, verify_tree.cpp and verify_logits.cpp (the
// row passes are in verify_rows.h; the launchers' argument checks in ../verify_args.h).
#pragma once

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "../registration.h"
#include "../verify_args.h"
#include "../verify_common.h"
#include "verify_rows.h"

namespace specops {
namespace verify {
namespace cpu {

// Bit i % 32 of word i / 32: token i allowed (apply_token_bitmask's layout).
inline bool token_allowed(const int32_t* words, int64_t i) {
  return (static_cast<uint32_t>(words[i >> 5]) >> (i & 31)) & 1u;
}

// Row u's logits in fp32 with the tokens its bitmask words disallow at -inf: apply_token_bitmask's
// rule, on the one row a walk reads (widening is exact, so the row's warping is unchanged).
template <class T>
const float* masked_row(const T* row, const int32_t* words, int64_t V, float* out) {
  for (int64_t i = 0; i < V; ++i)
    out[i] = token_allowed(words, i) ? static_cast<float>(row[i]) : -std::numeric_limits<float>::infinity();
  return out;
}
template <class T>
const float* masked_row(const T* row, const int32_t* words, int64_t V, std::vector<float>& tmp) {
  tmp.resize(V);
  return masked_row(row, words, V, tmp.data());
}

// A tree call's per-sequence inputs and outputs (verify_greedy, verify_tree, verify_tree_logits: a
// TreeCall's tensors), which one task per sequence reads and writes.
struct TreeIo {
  const int32_t* tokens;     // [B, T]
  const int32_t* parents;    // [B, T]
  const int32_t* num_nodes;  // [B]
  const float* uniforms;     // [B, T, 2] (verify_tree*; verify_greedy: null)
  int32_t* accept_idx;       // [B, T]
  int32_t* accept_len;       // [B]
  int32_t* bonus;            // [B]

  explicit TreeIo(const TreeCall& c)
      : tokens(c.tokens.data_ptr<int32_t>()), parents(c.parents.data_ptr<int32_t>()),
        num_nodes(c.num_nodes.data_ptr<int32_t>()),
        uniforms(c.uniforms.defined() ? c.uniforms.data_ptr<float>() : nullptr),
        accept_idx(c.accept_idx.data_ptr<int32_t>()), accept_len(c.accept_len.data_ptr<int32_t>()),
        bonus(c.bonus.data_ptr<int32_t>()) {}
};

// R6's per-sequence inputs and outputs (verify_joint, verify_joint_logits: a JointCall's tensors),
// which one task per sequence reads and writes.
struct JointIo {
  int64_t g;
  const int32_t* tokens;   // [B, g]
  const float* joint_q;    // [B, g]
  const float* log_tau;    // [B]
  const float* uniforms;   // [B]
  int32_t* accept_idx;     // [B, g + 1]
  int32_t* accept_len;     // [B]
  int32_t* bonus;          // [B]

  explicit JointIo(const JointCall& c)
      : g(c.g), tokens(c.tokens.data_ptr<int32_t>()), joint_q(c.joint_q.data_ptr<float>()),
        log_tau(c.log_tau.data_ptr<float>()), uniforms(c.uniforms.data_ptr<float>()),
        accept_idx(c.accept_idx.data_ptr<int32_t>()), accept_len(c.accept_len.data_ptr<int32_t>()),
        bonus(c.bonus.data_ptr<int32_t>()) {}

  // Sequence b accepts its first eta drafts (accept_idx 0..eta; the rest stay -1) and `token`.
  void accept(int64_t b, int32_t eta, int32_t token) const {
    for (int32_t j = 0; j <= eta; ++j) accept_idx[b * (g + 1) + j] = j;
    accept_len[b] = eta + 1;
    bonus[b] = token;
  }
};

// One sequence's walk state for the shared walks of ../verify_common.h. Rows supplies the target
// and draft rows: row(Vec) -> const float* [V] and at(Vec, tok) for kinds kTarget / kDraft (dense
// tensors in verify_tree.cpp, rows warped from logits on demand in verify_logits.cpp). Chunk sums
// are kept for every scratch row and for the last target row summed, so a draw after a pass reads
// one chunk, not the row again.
template <class Rows>
struct CpuTreeEngine {
  Rows rows;
  const float* U;      // [T, 2] uniforms
  float* buf;          // [3, V] scratch: residual double buffer + the R3w proposer row
  int64_t* chunks;     // [4, num_chunks(V)]: scratch rows 0..2, then the target row `summed`
  int32_t* scratch;    // [T + 2]
  int64_t V_;
  float scale_, inv_scale_;
  int32_t summed = -1;  // target row whose chunk sums are in chunks[3]

  int64_t V() const { return V_; }
  float scale() const { return scale_; }
  float inv_scale() const { return inv_scale_; }
  float u0(int32_t node) const { return U[2 * node]; }
  float u1(int32_t node) const { return U[2 * node + 1]; }
  int32_t* ints() { return scratch; }
  template <class F>
  void single(F&& f) { f(); }
  void emit(int32_t* out, int32_t v) { *out = v; }

  const float* row(Vec v) { return v.kind < Vec::kBuf0 ? rows.row(v) : buf + (v.kind - Vec::kBuf0) * V_; }
  float* mrow(Vec v) { return buf + (v.kind - Vec::kBuf0) * V_; }
  int64_t* chunks_of(int32_t slot) { return chunks + slot * num_chunks(V_); }
  float at(Vec v, int32_t tok) {
    if (!in_vocab(tok, V_)) return 0.0f;
    return v.kind < Vec::kBuf0 ? rows.at(v, tok) : mrow(v)[tok];
  }

  int64_t sum_fix(Vec v) {
    if (v.kind == Vec::kTarget) summed = v.node;
    return row_sum_fix(row(v), V_, scale_, v.kind == Vec::kTarget ? chunks_of(3) : nullptr);
  }
  int32_t sample(Vec v, int64_t W, float u) {
    const int64_t* c = v.kind >= Vec::kBuf0 ? chunks_of(v.kind - Vec::kBuf0)
                                            : (v.kind == Vec::kTarget && v.node == summed ? chunks_of(3) : nullptr);
    return row_sample(row(v), V_, scale_, W, u, c, false);
  }
  int64_t residual(Vec dst, Vec r, Vec q, float Z, float Zq) {
    const float* rr = row(r);
    return row_residual(mrow(dst), rr, row(q), Z, Zq, V_, scale_, chunks_of(dst.kind - Vec::kBuf0));
  }
  int64_t residual_noreplace(Vec dst, Vec r, Vec q, float Z, float Zq, int32_t x, int64_t* wq) {
    const float* rr = row(r);
    return row_residual_noreplace(mrow(dst), mrow(Vec::buf(Vec::kBufQ)), rr, row(q), Z, Zq, x, V_, scale_,
                                  chunks_of(dst.kind - Vec::kBuf0), wq);
  }
  int64_t drop_token(Vec dst, Vec src, int32_t x) {
    return row_drop_token(mrow(dst), row(src), x, V_, scale_, chunks_of(dst.kind - Vec::kBuf0));
  }
  void set_zero(Vec v, int32_t tok) {
    float* m = mrow(v);
    chunks_of(v.kind - Vec::kBuf0)[tok / kChunk] -= fix_weight(m[tok], scale_);
    m[tok] = 0.0f;
  }
};

// The walk of `mode` over one sequence (n valid nodes of T).
template <class E>
void run_walk(E& e, int32_t mode, const int32_t* tokens, const int32_t* parents, int32_t n, int32_t T,
              int32_t* accept_idx, int32_t* accept_len, int32_t* bonus) {
  if (mode == kSampleMatch) {
    auto predict = [&](int32_t u) {
      const Vec row = Vec::target(u);
      return e.sample(row, e.sum_fix(row), e.u1(u));
    };
    match_walk(e, predict, tokens, parents, n, accept_idx, accept_len, bonus);
  } else if (mode == kGsd) {
    gsd_walk(e, tokens, parents, n, T, accept_idx, accept_len, bonus);
  } else {
    mss_walk(e, mode, tokens, parents, n, accept_idx, accept_len, bonus);
  }
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops
