// Decision logic of the verification ops (verify_greedy, verify_tree, verify_joint), shared by
// csrc/cpu/verify*.cpp and csrc/cuda/verify*.cu so that the GPU's tree walk is the one the CPU
// tests exercise. specops/ops/verify/ref.py is the same algorithm in torch; triton_kernels/verify*.py
// mirror it. Keep the four in step. The rule codes R1-R6 are defined in docs/methods.md
// §Verification rules.
//
// Why integer outputs are bit-identical across backends:
//  * every fp32 value a decision depends on comes from a fixed sequence of single IEEE operations
//    (mul_rn/sub_rn/add_rn below: nvcc would otherwise contract a*b - c into an FMA);
//  * sums over the vocabulary are taken in fixed point (fix_weight: trunc(clamp(x, 0, 1) * 2^S) as
//    int64, S = 62 - ceil(log2 V), so no sum can overflow), and integer addition does not depend on
//    the reduction order the hardware picks;
//  * sampling is an inverse CDF over those integer weights.
// Everything here is plain C++ on raw pointers, __host__ __device__ under nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace specops {
namespace verify {

enum Mode : int32_t { kMss = 0, kMssPointmass = 1, kMssNoreplace = 2, kSampleMatch = 3, kGsd = 4 };

// ---- fp32 operations that must round the same everywhere -------------------------------------

#if defined(__CUDA_ARCH__)
SPECOPS_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
SPECOPS_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
SPECOPS_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
#else
SPECOPS_HD float mul_rn(float a, float b) { return a * b; }
SPECOPS_HD float add_rn(float a, float b) { return a + b; }
SPECOPS_HD float sub_rn(float a, float b) { return a - b; }
#endif

// The residual norm(max(0, p - q)) falls back to p when its mass is below this.
constexpr float kResidualFloor = 9.999999960041972002500187954865396022796630859375e-13f;  // fp32(1e-12)

SPECOPS_HD float inf_f() {
  const uint32_t bits = 0x7f800000u;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

// 2^e for -126 <= e <= 127, built from its bits (exact on every backend).
SPECOPS_HD float exp2i(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

// S such that V weights of at most 2^S sum below 2^63.
SPECOPS_HD int32_t fix_shift(int64_t V) {
  int32_t k = 0;
  while (k < 62 && (int64_t{1} << k) < V) ++k;
  return 62 - k;
}

// Fixed-point weight of a probability: trunc(clamp(x, 0, 1) * 2^S); NaN weighs 0.
SPECOPS_HD int64_t fix_weight(float x, float scale) {
  const float c = x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f;
  return static_cast<int64_t>(mul_rn(c, scale));
}

// The fp32 mass of an integer weight sum W (scale^-1 = 2^-S).
SPECOPS_HD float fix_mass(int64_t W, float inv_scale) { return mul_rn(static_cast<float>(W), inv_scale); }

// Child test of every rejection rule: accept with probability min(1, (r / Z) / (q / Zq)), where
// r / Z is the target's (residual) probability of the child's token and q / Zq the proposer's.
// Written without a division; the first test at a node has Z = Zq = 1, i.e. u * q < p.
SPECOPS_HD bool accept_child(float u, float q, float Z, float r, float Zq) {
  return mul_rn(mul_rn(u, q), Z) < mul_rn(r, Zq);
}

// One entry of the unnormalised residual max(0, r / Z - q / Zq) * Z * Zq.
SPECOPS_HD float residual_value(float r, float Zq, float Z, float q) {
  const float c = sub_rn(mul_rn(r, Zq), mul_rn(Z, q));
  return c > 0.0f ? c : 0.0f;
}

// True when the new residual (mass Zn, relative to Z * Zq) is too small to normalise.
SPECOPS_HD bool residual_fallback(float Zn, float Z, float Zq) {
  return !(Zn > 0.0f) || Zn < mul_rn(mul_rn(kResidualFloor, Z), Zq);
}

// Uniform choice of one of n >= 1 items.
SPECOPS_HD int32_t uniform_index(float u, int32_t n) {
  const float f = mul_rn(u, static_cast<float>(n));
  if (!(f > 0.0f)) return 0;
  const float top = static_cast<float>(n - 1);
  return static_cast<int32_t>(f < top ? f : top);
}

// Inverse-CDF threshold in [0, W - 1] for W > 0: the sample is the first index whose running
// weight sum exceeds it.
SPECOPS_HD int64_t sample_threshold(float u, int64_t W) {
  const float wf = static_cast<float>(W);
  const float f = mul_rn(u, wf);
  const int64_t t = f > 0.0f ? static_cast<int64_t>(f < wf ? f : wf) : 0;
  return t < W - 1 ? t : W - 1;
}

// exp(x) of a log-probability from single IEEE operations only (so it is bit-identical on every
// backend, unlike expf/__expf/tl.exp). x is clamped to [-50, 0]: below -50 the fixed-point weight
// is 0 anyway, above 0 it saturates at 1. Cody-Waite reduction + degree-7 Taylor polynomial.
constexpr float kLog2e = 1.44269502162933349609375f;       // fp32(log2 e)
constexpr float kLn2Hi = 0.693145751953125f;               // exact, few bits: k * kLn2Hi is exact
constexpr float kLn2Lo = 1.428606765330187045037746429443359375e-06f;
// fp32(1 / k!) for k = 3..7, written out exactly.
constexpr float kExpC3 = 0.16666667163372039794921875f;
constexpr float kExpC4 = 0.0416666679084300994873046875f;
constexpr float kExpC5 = 0.008333333767950534820556640625f;
constexpr float kExpC6 = 0.001388888922519981861114501953125f;
constexpr float kExpC7 = 0.000198412701138295233249664306640625f;

SPECOPS_HD float det_exp(float x) {
  x = x > -50.0f ? (x < 0.0f ? x : 0.0f) : -50.0f;  // NaN -> -50
  const float k = floorf(add_rn(mul_rn(x, kLog2e), 0.5f));
  const float r = sub_rn(sub_rn(x, mul_rn(k, kLn2Hi)), mul_rn(k, kLn2Lo));
  float p = kExpC7;  // Horner, highest power first
  p = add_rn(mul_rn(p, r), kExpC6);
  p = add_rn(mul_rn(p, r), kExpC5);
  p = add_rn(mul_rn(p, r), kExpC4);
  p = add_rn(mul_rn(p, r), kExpC3);
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  return mul_rn(p, exp2i(static_cast<int32_t>(k)));
}

// log(x) of a probability from single IEEE operations only (bit-identical on every backend, unlike
// logf / __logf / tl.log): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log x = e ln 2 + log1p(m - 1),
// the latter a degree-20 Taylor polynomial (|m - 1| <= 0.415: truncation < 2^-29). x below 2^-126
// (0, and the denormals a kernel may flush to 0) gives -inf; NaN stays NaN. R6's logits form.
constexpr float kSqrt2 = 1.41421353816986083984375f;  // fp32(sqrt 2)
// fp32((-1)^(n+1) / n) for n = 1..20, written out exactly.
#define SPECOPS_LOG1P_COEFFS                                                                              \
  {1.0f, -0.5f, 0.3333333432674407958984375f, -0.25f, 0.20000000298023223876953125f,                     \
   -0.16666667163372039794921875f, 0.14285714924335479736328125f, -0.125f,                                \
   0.111111111938953399658203125f, -0.100000001490116119384765625f, 0.0909090936183929443359375f,         \
   -0.083333335816860198974609375f, 0.076923079788684844970703125f, -0.071428574621677398681640625f,      \
   0.066666670143604278564453125f, -0.0625f, 0.0588235296308994293212890625f,                            \
   -0.0555555559694766998291015625f, 0.052631579339504241943359375f, -0.0500000007450580596923828125f}

SPECOPS_HD float det_log(float x) {
  if (x != x) return x;
  if (!(x >= exp2i(-126))) return -inf_f();
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  int32_t e = static_cast<int32_t>(bits >> 23) - 127;  // x > 0: no sign bit
  bits = (bits & 0x007fffffu) | 0x3f800000u;
  float m;
  memcpy(&m, &bits, sizeof(m));
  if (m > kSqrt2) {
    m = mul_rn(m, 0.5f);  // exact
    e += 1;
  }
  const float r = sub_rn(m, 1.0f);  // exact (Sterbenz)
  const float c[20] = SPECOPS_LOG1P_COEFFS;
  float p = c[19];  // Horner, highest power first
  for (int32_t n = 18; n >= 0; --n) p = add_rn(mul_rn(p, r), c[n]);
  const float ef = static_cast<float>(e);
  return add_rn(mul_rn(ef, kLn2Hi), add_rn(mul_rn(ef, kLn2Lo), mul_rn(p, r)));
}
#undef SPECOPS_LOG1P_COEFFS

// R6 prefix test tau < min(1, p_joint / q_joint) in log space; tau = 0 (log -inf) accepts all.
SPECOPS_HD bool joint_pass(float log_tau, float lp, float lq) {
  if (log_tau == -inf_f()) return true;
  return log_tau < 0.0f && sub_rn(lp, lq) > log_tau;
}

// Argmax order: NaN counts as +inf, ties go to the lower index.
SPECOPS_HD float argmax_key(float v) { return v != v ? inf_f() : v; }
SPECOPS_HD bool argmax_better(float v, int64_t i, float best, int64_t best_i) {
  const float a = argmax_key(v), b = argmax_key(best);
  return a > b || (a == b && i < best_i);
}

// ---- tree structure --------------------------------------------------------------------------

SPECOPS_HD int32_t valid_nodes(int32_t n, int32_t T) { return n < 1 ? 1 : (n > T ? T : n); }
SPECOPS_HD bool in_vocab(int32_t x, int64_t V) { return x >= 0 && x < V; }

// R6's walk over one chain of n >= 1 nodes (the root, then drafts tokens[0..n-2]): the longest
// prefix passing joint_pass (not the first failure), as its last node eta in [0, n - 1].
// logp(row, x) is the target's log-probability of token x in row `row` (x in [0, V)); lq[j - 1]
// the draft's joint log-probability of the first j drafts. p_joint accumulates in fp32, left to right.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LogP>
SPECOPS_HD int32_t joint_eta(const int32_t* tokens, int32_t n, int64_t V, float log_tau, const float* lq, LogP&& logp) {
  float joint = 0.0f;
  int32_t eta = 0;
  for (int32_t j = 1; j < n; ++j) {
    const int32_t x = tokens[j - 1];
    joint = add_rn(joint, in_vocab(x, V) ? logp(j - 1, x) : -inf_f());
    if (joint_pass(log_tau, joint, lq[j - 1])) eta = j;
  }
  return eta;
}

// Children of u among the first n nodes, in index order (the drafter's ranking), into kids.
SPECOPS_HD int32_t collect_children(const int32_t* parents, int32_t n, int32_t u, int32_t* kids) {
  int32_t count = 0;
  for (int32_t c = u + 1; c < n; ++c)
    if (parents[c] == u) kids[count++] = c;
  return count;
}

SPECOPS_HD void remove_at(int32_t* kids, int32_t count, int32_t j) {
  for (int32_t i = j; i + 1 < count; ++i) kids[i] = kids[i + 1];
}

// First child of u (index order) whose token is v, or -1.
SPECOPS_HD int32_t child_with_token(const int32_t* tokens, const int32_t* parents, int32_t n, int32_t u,
                                    int32_t v) {
  for (int32_t c = u + 1; c < n; ++c)
    if (parents[c] == u && tokens[c] == v) return c;
  return -1;
}

// ---- walks -----------------------------------------------------------------------------------
//
// An engine E owns one sequence's rows and scratch and provides (see CpuTreeEngine in
// csrc/cpu/verify_tree.cpp; the CUDA engine runs the same calls on a whole thread block, every
// thread walking the tree redundantly so the V-wide calls are made by all of them together):
//   float at(Vec, tok) (0 for tok outside [0, V)), u0(node), u1(node), scale(), inv_scale()
//   int64 sum_fix(Vec), residual(dst, r, q, Z, Zq), residual_noreplace(dst, r, q, Z, Zq, x, &wq),
//   drop_token(dst, src, x); void set_zero(Vec, tok); int32 sample(Vec, W, u)
//   int32* ints() (T + 2 ints shared by the walkers), single(f) (f runs once, fenced),
//   emit(int32* out, v) (one store).

struct Vec {
  int32_t kind;  // kTarget / kDraft: row `node` of target_probs / draft_probs; else a scratch row
  int32_t node;
  enum : int32_t { kTarget = 0, kDraft = 1, kBuf0 = 2, kBuf1 = 3, kBufQ = 4 };
  SPECOPS_HD static Vec target(int32_t u) { return {kTarget, u}; }
  SPECOPS_HD static Vec draft(int32_t c) { return {kDraft, c}; }
  SPECOPS_HD static Vec buf(int32_t k) { return {k, 0}; }
};

// R1 (greedy, predict = argmax) and R4 (sample-and-match, predict = a draw from P[u] with the
// node's uniform u1): descend into the first child whose token is the prediction; the prediction
// at the last node is the bonus.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class E, class Predict>
SPECOPS_HD void match_walk(E& e, Predict&& predict, const int32_t* tokens, const int32_t* parents, int32_t n,
                           int32_t* accept_idx, int32_t* accept_len, int32_t* bonus) {
  int32_t u = 0, len = 1;
  e.emit(accept_idx, 0);
  while (true) {
    const int32_t v = predict(u);
    const int32_t c = child_with_token(tokens, parents, n, u, v);
    if (c < 0) {
      e.emit(bonus, v);
      break;
    }
    e.emit(accept_idx + len, c);
    ++len;
    u = c;
  }
  e.emit(accept_len, len);
}

// R2 / R3 / R3p / R3w. At node u the current target distribution is R / Z (R starts as the row
// P[u], Z = 1) and, for R3w, the proposer's is Qr / Zq (Qr starts as the row of u's first child).
// Children are tried in index order (R3: in a uniformly random order). A rejected child updates
// R: R3 and R3w to the residual max(0, R / Z - q / Zq) (kept if its mass is < 1e-12, see
// residual_fallback), R3p zeroes the child's token; R3w also zeroes it in Qr. When no child is
// left the bonus is drawn from R.
// Uniforms: u0[c] is child c's acceptance coin. u1[d] is read for R3's random choice of the next
// child and for the bonus, where d is the last node tested at u (or u itself before any test):
// every uniform is read at most once.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class E>
SPECOPS_HD void mss_walk(E& e, int32_t mode, const int32_t* tokens, const int32_t* parents, int32_t n,
                         int32_t* accept_idx, int32_t* accept_len, int32_t* bonus) {
  int32_t* kids = e.ints();  // [0] = count, [1..] = untried children of u
  int32_t u = 0, len = 1;
  e.emit(accept_idx, 0);
  while (true) {
    e.single([&] { kids[0] = collect_children(parents, n, u, kids + 1); });
    int32_t nk = kids[0];
    Vec R = Vec::target(u);
    float Z = 1.0f;
    int64_t W = -1;  // sum_fix(R) once known
    Vec Qr = Vec::draft(nk > 0 ? kids[1] : 0);
    float Zq = 1.0f;
    int32_t d = u, accepted = -1;
    while (nk > 0) {
      const int32_t j = (mode == kMss && nk > 1) ? uniform_index(e.u1(d), nk) : 0;
      const int32_t s = kids[1 + j];
      e.single([&] { remove_at(kids + 1, nk, j); });
      --nk;
      const int32_t x = tokens[s];
      const float qx = mode == kMssPointmass ? 1.0f : e.at(mode == kMssNoreplace ? Qr : Vec::draft(s), x);
      d = s;
      if (accept_child(e.u0(s), qx, Z, e.at(R, x), Zq)) {
        accepted = s;
        break;
      }
      if (mode == kMssPointmass) {
        if (!in_vocab(x, e.V())) continue;  // probability 0: nothing to remove
        const bool fresh = R.kind == Vec::kTarget;
        const int64_t Wn = fresh ? e.drop_token(Vec::buf(Vec::kBuf0), R, x) : W - fix_weight(e.at(R, x), e.scale());
        const float Zn = fix_mass(Wn, e.inv_scale());
        if (residual_fallback(Zn, Z, 1.0f)) continue;
        if (fresh) R = Vec::buf(Vec::kBuf0);
        else e.set_zero(R, x);
        W = Wn;
        Z = Zn;
      } else {
        const Vec dst = Vec::buf(R.kind == Vec::kBuf0 ? Vec::kBuf1 : Vec::kBuf0);
        int64_t Wn, Wq = 0;
        if (mode == kMss) {
          Wn = e.residual(dst, R, Vec::draft(s), Z, Zq);
        } else {
          Wn = e.residual_noreplace(dst, R, Qr, Z, Zq, x, &Wq);
          Qr = Vec::buf(Vec::kBufQ);
        }
        const float Zn = fix_mass(Wn, e.inv_scale());
        if (!residual_fallback(Zn, Z, Zq)) {
          R = dst;
          W = Wn;
          Z = Zn;
        }
        if (mode == kMssNoreplace) Zq = fix_mass(Wq, e.inv_scale());
      }
    }
    if (accepted < 0) {
      if (W < 0) W = e.sum_fix(R);
      e.emit(bonus, e.sample(R, W, e.u1(d)));
      break;
    }
    e.emit(accept_idx + len, accepted);
    ++len;
    u = accepted;
  }
  e.emit(accept_len, len);
}

// R5 (GSD's reference rule, not lossless): every edge parent(c) -> c passes independently with
// probability min(1, P[parent](x_c) / Q[c](x_c)) (coin u0[c]); the path ends at the deepest node
// whose root path passes entirely, the lowest index among equals (= the first found by a DFS
// over children in index order, for trees in BFS or DFS order); bonus from P[end] with u1[end].
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class E>
SPECOPS_HD void gsd_walk(E& e, const int32_t* tokens, const int32_t* parents, int32_t n, int32_t T,
                         int32_t* accept_idx, int32_t* accept_len, int32_t* bonus) {
  int32_t* depth = e.ints();  // [0..T) = depth of a passing node or -1; [T] = the chosen end
  e.single([&] {
    depth[0] = 0;
    int32_t best = 0;
    for (int32_t c = 1; c < n; ++c) {
      const int32_t par = parents[c];
      depth[c] = -1;
      if (par < 0 || par >= c || depth[par] < 0) continue;
      const int32_t x = tokens[c];
      if (!accept_child(e.u0(c), e.at(Vec::draft(c), x), 1.0f, e.at(Vec::target(par), x), 1.0f)) continue;
      depth[c] = depth[par] + 1;
      if (depth[c] > depth[best]) best = c;
    }
    depth[T] = best;
  });
  const int32_t end = depth[T];
  const int32_t m = depth[end];
  for (int32_t k = m, c = end; k >= 0; --k, c = parents[c]) e.emit(accept_idx + k, c);
  e.emit(accept_len, m + 1);
  const Vec row = Vec::target(end);
  const int64_t W = e.sum_fix(row);
  e.emit(bonus, e.sample(row, W, e.u1(end)));
}

}  // namespace verify
}  // namespace specops
