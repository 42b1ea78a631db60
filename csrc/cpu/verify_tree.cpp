// verify_tree on the CPU: sequences in parallel (at::parallel_for over B) running the shared walks
// of csrc/verify_common.h; the engine below supplies V-wide loops over one row at a time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "verify_cpu.h"

namespace specops {
namespace verify {
namespace cpu {

// Rows of one sequence plus scratch. Chunk sums are kept for every scratch row and for the last
// target row summed, so a draw after a pass reads one chunk, not the row again.
struct CpuTreeEngine {
  const float* P;      // [T, V] target rows of this sequence
  const float* Q;      // [T, V] draft rows, or nullptr
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

  const float* row(Vec v) const {
    if (v.kind == Vec::kTarget) return P + v.node * V_;
    if (v.kind == Vec::kDraft) return Q + v.node * V_;
    return buf + (v.kind - Vec::kBuf0) * V_;
  }
  float* mrow(Vec v) { return buf + (v.kind - Vec::kBuf0) * V_; }
  int64_t* chunks_of(int32_t slot) { return chunks + slot * num_chunks(V_); }
  float at(Vec v, int32_t tok) const { return in_vocab(tok, V_) ? row(v)[tok] : 0.0f; }

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
    return row_residual(mrow(dst), row(r), row(q), Z, Zq, V_, scale_, chunks_of(dst.kind - Vec::kBuf0));
  }
  int64_t residual_noreplace(Vec dst, Vec r, Vec q, float Z, float Zq, int32_t x, int64_t* wq) {
    return row_residual_noreplace(mrow(dst), mrow(Vec::buf(Vec::kBufQ)), row(r), row(q), Z, Zq, x, V_, scale_,
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

int32_t parse_mode(const std::string& mode) {
  if (mode == "mss") return kMss;
  if (mode == "mss_pointmass") return kMssPointmass;
  if (mode == "mss_noreplace") return kMssNoreplace;
  if (mode == "sample_match") return kSampleMatch;
  if (mode == "gsd") return kGsd;
  TORCH_CHECK(false, "verify_tree: mode must be one of mss, mss_pointmass, mss_noreplace, sample_match, gsd; got ",
              mode);
  return -1;
}

bool mode_needs_draft(int32_t mode) { return mode == kMss || mode == kMssNoreplace || mode == kGsd; }

int64_t mode_buffers(int32_t mode) {
  if (mode == kMss) return 2;
  if (mode == kMssNoreplace) return 3;
  if (mode == kMssPointmass) return 1;
  return 0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cpu(
    const at::Tensor& tokens,                    // [B, T] int32
    const at::Tensor& parents,                   // [B, T] int32
    const at::Tensor& target_probs,              // [B, T, V] fp32
    const at::Tensor& uniforms,                  // [B, T, 2] fp32
    const c10::optional<at::Tensor>& draft_probs,  // [B, T, V] fp32 or None
    const at::Tensor& num_nodes,                 // [B] int32
    c10::string_view mode_name) {
  const int32_t mode = parse_mode(std::string(mode_name));
  check_tree_args(tokens, parents, num_nodes, target_probs);
  SPECOPS_CHECK_DTYPE(target_probs, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_probs.size(2);
  TORCH_CHECK(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
              "uniforms must have shape [B, T, 2]");
  const bool has_q = draft_probs.has_value() && draft_probs->defined();
  TORCH_CHECK(has_q || !mode_needs_draft(mode), "verify_tree: mode ", mode_name, " needs draft_probs");
  at::Tensor q;
  if (has_q) {
    SPECOPS_CHECK_DTYPE(*draft_probs, at::kFloat);
    TORCH_CHECK(draft_probs->sizes() == target_probs.sizes(), "draft_probs must have the shape of target_probs");
    q = draft_probs->contiguous();
  }
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto p = target_probs.contiguous();
  auto un = uniforms.contiguous();
  auto accept_idx = at::full({B, T}, -1, tokens.options());
  auto accept_len = at::empty({B}, tokens.options());
  auto bonus = at::empty({B}, tokens.options());
  const int32_t* tk = tok.data_ptr<int32_t>();
  const int32_t* pa = par.data_ptr<int32_t>();
  const int32_t* n = nn.data_ptr<int32_t>();
  const float* pp = p.data_ptr<float>();
  const float* qp = has_q ? q.data_ptr<float>() : nullptr;
  const float* up = un.data_ptr<float>();
  int32_t* ai = accept_idx.data_ptr<int32_t>();
  int32_t* al = accept_len.data_ptr<int32_t>();
  int32_t* bo = bonus.data_ptr<int32_t>();
  const int32_t S = fix_shift(V);
  const float scale = exp2i(S), inv_scale = exp2i(-S);
  const int64_t nbuf = mode_buffers(mode);
  // Sequences are independent; a walk is sequential and its V-wide passes are what costs.
  at::parallel_for(0, B, sequences_per_task(V), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V);
    std::vector<int64_t> chunks(4 * num_chunks(V));
    std::vector<int32_t> scratch(T + 2);
    for (int64_t b = lo; b < hi; ++b) {
      CpuTreeEngine e{pp + b * T * V, qp ? qp + b * T * V : nullptr, up + b * T * 2, buf.data(), chunks.data(),
                      scratch.data(), V, scale, inv_scale};
      const int32_t* tb = tk + b * T;
      const int32_t* pb = pa + b * T;
      const int32_t nb = valid_nodes(n[b], static_cast<int32_t>(T));
      int32_t* out = ai + b * T;
      if (mode == kSampleMatch) {
        auto predict = [&](int32_t u) {
          const Vec row = Vec::target(u);
          return e.sample(row, e.sum_fix(row), e.u1(u));
        };
        match_walk(e, predict, tb, pb, nb, out, al + b, bo + b);
      } else if (mode == kGsd) {
        gsd_walk(e, tb, pb, nb, static_cast<int32_t>(T), out, al + b, bo + b);
      } else {
        mss_walk(e, mode, tb, pb, nb, out, al + b, bo + b);
      }
    }
  });
  return {accept_idx, accept_len, bonus};
}

}  // namespace cpu
}  // namespace verify
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("verify_tree", &specops::verify::cpu::verify_tree_cpu); }
