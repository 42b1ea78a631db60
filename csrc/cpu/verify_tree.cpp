// verify_tree on the CPU: one task per sequence (at::parallel_for over B) running the shared walks
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

struct CpuTreeEngine {
  const float* P;  // [T, V] target rows of this sequence
  const float* Q;  // [T, V] draft rows, or nullptr
  const float* U;  // [T, 2] uniforms
  float* buf;      // [3, V] scratch: residual double buffer + the R3w proposer row
  int32_t* scratch;  // [T + 2]
  int64_t V_;
  float scale_, inv_scale_;

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
  float at(Vec v, int32_t tok) const { return in_vocab(tok, V_) ? row(v)[tok] : 0.0f; }

  int64_t sum_fix(Vec v) const { return cpu::sum_fix(row(v), V_, scale_); }
  int32_t sample(Vec v, int64_t W, float u) const { return sample_fix(row(v), V_, scale_, W, u); }

  int64_t residual(Vec dst, Vec r, Vec q, float Z, float Zq) {
    const float* rr = row(r);
    const float* qq = row(q);
    float* out = mrow(dst);
    const float sc = scale_;
    int64_t w = 0;
    for (int64_t i = 0; i < V_; ++i) {
      const float v = residual_value(rr[i], Zq, Z, qq[i]);
      out[i] = v;
      w += fix_weight(v, sc);
    }
    return w;
  }

  // R3w: the residual against Qr, and Qr minus the rejected token x (in place into kBufQ).
  int64_t residual_noreplace(Vec dst, Vec r, Vec q, float Z, float Zq, int32_t x, int64_t* wq) {
    const float* rr = row(r);
    const float* qq = row(q);
    float* out = mrow(dst);
    float* qout = mrow(Vec::buf(Vec::kBufQ));
    const float sc = scale_;
    int64_t w = 0, w2 = 0;
    for (int64_t i = 0; i < V_; ++i) {
      const float qi = qq[i];
      const float v = residual_value(rr[i], Zq, Z, qi);
      out[i] = v;
      w += fix_weight(v, sc);
      const float qn = i == x ? 0.0f : qi;
      qout[i] = qn;
      w2 += fix_weight(qn, sc);
    }
    *wq = w2;
    return w;
  }

  int64_t drop_token(Vec dst, Vec src, int32_t x) {
    const float* s = row(src);
    float* out = mrow(dst);
    const float sc = scale_;
    int64_t w = 0;
    for (int64_t i = 0; i < V_; ++i) {
      const float v = i == x ? 0.0f : s[i];
      out[i] = v;
      w += fix_weight(v, sc);
    }
    return w;
  }

  void set_zero(Vec v, int32_t tok) { mrow(v)[tok] = 0.0f; }
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
  // One sequence per task: the walk is sequential, the V-wide passes inside it are what costs.
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(nbuf * V);
    std::vector<int32_t> scratch(T + 2);
    for (int64_t b = lo; b < hi; ++b) {
      CpuTreeEngine e{pp + b * T * V, qp ? qp + b * T * V : nullptr, up + b * T * 2, buf.data(), scratch.data(),
                      V, scale, inv_scale};
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
