// Verification on CUDA: one thread block per sequence. Every thread runs the shared walk of
// ../verify_common.h redundantly (so all of them reach the V-wide calls together); the engine
// below does those calls cooperatively: strided loops, int64 fixed-point block sums and scans
// (exact, so the reduction order cannot change a decision), (value, index) argmax reductions.
// Tree bookkeeping that the walk writes (e.single) runs on thread 0 between barriers.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include <climits>
#include <string>

#include "gpu.cuh"
#include "../registration.h"
#include "../verify_common.h"

namespace specops {
namespace verify {
namespace cuda {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Per-block scratch for reductions.
struct Shared {
  int64_t i64[kWarps];
  float f32[kWarps];
  int32_t i32[kWarps];
  int64_t chunk[kThreads];  // block_sample's chunk totals
  int64_t base;             // block_sample: the running sum before the chosen chunk
};

__device__ int64_t block_sum(int64_t v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFull, v, o);
  __syncthreads();  // the previous reader of sh is done
  if ((threadIdx.x & 31) == 0) sh.i64[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.i64[w];
  return total;
}

__device__ int32_t block_min(int32_t v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_down_sync(kFull, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.i32[threadIdx.x >> 5] = v;
  __syncthreads();
  int32_t m = INT_MAX;
  for (int w = 0; w < kWarps; ++w) m = min(m, sh.i32[w]);
  return m;
}

// Inclusive scan of one int64 per thread over the block; *total gets the block's sum.
__device__ int64_t block_scan(int64_t v, Shared& sh, int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t up = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += up;
  }
  __syncthreads();
  if (lane == 31) sh.i64[warp] = v;
  __syncthreads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.i64[w];
    all += sh.i64[w];
  }
  *total = all;
  return v + before;
}

// Inverse-CDF draw over weight(i), i < V, whose sum is W: the first index whose running sum
// exceeds the threshold. Two levels instead of a walk over V in block-wide steps: the row is cut
// into at most kThreads chunks of L tokens (a multiple of 32), each warp sums whole chunks with
// coalesced loads, one block scan over the chunk totals finds the chunk where the running sum
// passes the threshold, and a block scan inside that chunk the token: about six barriers for any
// V, where the walk took four per kThreads tokens (about a thousand at V = 128K). The weights
// are non-negative integers, so the result is the walk's (and the CPU kernel's) exactly.
template <class Weight>
__device__ int32_t block_sample(int64_t V, int64_t W, float u, Weight&& weight, Shared& sh) {
  if (W <= 0) return 0;
  const int64_t t = sample_threshold(u, W);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t L = ceil_div(ceil_div(V, kThreads), 32) * 32;
  const int64_t chunks = ceil_div(V, L);  // <= kThreads
  __syncthreads();  // a previous reader of sh.chunk is done
  for (int64_t c = warp; c < chunks; c += kWarps) {
    const int64_t end = min(V, (c + 1) * L);
    int64_t s = 0;
    for (int64_t i = c * L + lane; i < end; i += 32) s += weight(i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    if (lane == 0) sh.chunk[c] = s;
  }
  __syncthreads();
  const bool mine = threadIdx.x < chunks;
  int64_t all;
  const int64_t incl = block_scan(mine ? sh.chunk[threadIdx.x] : 0, sh, &all);
  const int32_t c = block_min(mine && incl > t ? static_cast<int32_t>(threadIdx.x) : INT_MAX, sh);
  if (c == INT_MAX) return static_cast<int32_t>(V - 1);  // W overstated the weights
  if (static_cast<int32_t>(threadIdx.x) == c) sh.base = incl - sh.chunk[c];
  __syncthreads();
  int64_t run = sh.base;
  const int64_t end = min(V, (c + 1) * L);
  for (int64_t start = c * L; start < end; start += kThreads) {
    const int64_t i = start + threadIdx.x;
    const int64_t w = i < end ? weight(i) : 0;
    int64_t step;
    const int64_t in = block_scan(w, sh, &step);
    const int32_t first = block_min(i < end && run + in > t ? static_cast<int32_t>(threadIdx.x) : INT_MAX, sh);
    if (first != INT_MAX) return static_cast<int32_t>(start + first);
    run += step;
  }
  return static_cast<int32_t>(V - 1);
}

template <class Weight>
__device__ int64_t block_sum_weights(int64_t V, Weight&& weight, Shared& sh) {
  int64_t s = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) s += weight(i);
  return block_sum(s, sh);
}

template <class scalar_t>
__device__ int32_t block_argmax(const scalar_t* row, int64_t V, Shared& sh) {
  float best = -inf_f();
  int32_t best_i = INT_MAX;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = static_cast<float>(row[i]);
    if (best_i == INT_MAX || argmax_better(v, i, best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_down_sync(kFull, best, o);
    const int32_t oi = __shfl_down_sync(kFull, best_i, o);
    if (oi != INT_MAX && (best_i == INT_MAX || argmax_better(ov, oi, best, best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.f32[threadIdx.x >> 5] = best;
    sh.i32[threadIdx.x >> 5] = best_i;
  }
  __syncthreads();
  best = sh.f32[0];
  best_i = sh.i32[0];
  for (int w = 1; w < kWarps; ++w)
    if (sh.i32[w] != INT_MAX && (best_i == INT_MAX || argmax_better(sh.f32[w], sh.i32[w], best, best_i))) {
      best = sh.f32[w];
      best_i = sh.i32[w];
    }
  return best_i == INT_MAX ? 0 : best_i;
}

struct CudaTreeEngine {
  const float* P;    // [T, V] target rows of this sequence
  const float* Q;    // [T, V] draft rows or nullptr
  const float* U;    // [T, 2]
  float* buf;        // [nbuf, V] scratch rows
  int32_t* scratch;  // [T + 2] tree bookkeeping (global, written by thread 0)
  Shared* sh;
  int64_t V_;
  float scale_, inv_scale_;

  __device__ int64_t V() const { return V_; }
  __device__ float scale() const { return scale_; }
  __device__ float inv_scale() const { return inv_scale_; }
  __device__ float u0(int32_t node) const { return U[2 * node]; }
  __device__ float u1(int32_t node) const { return U[2 * node + 1]; }
  __device__ int32_t* ints() { return scratch; }
  template <class F>
  __device__ void single(F&& f) {
    __syncthreads();
    if (threadIdx.x == 0) f();
    __syncthreads();
  }
  __device__ void emit(int32_t* out, int32_t v) {
    if (threadIdx.x == 0) *out = v;
  }
  __device__ const float* row(Vec v) const {
    if (v.kind == Vec::kTarget) return P + v.node * V_;
    if (v.kind == Vec::kDraft) return Q + v.node * V_;
    return buf + (v.kind - Vec::kBuf0) * V_;
  }
  __device__ float* mrow(Vec v) { return buf + (v.kind - Vec::kBuf0) * V_; }
  __device__ float at(Vec v, int32_t tok) const { return in_vocab(tok, V_) ? row(v)[tok] : 0.0f; }

  __device__ int64_t sum_fix(Vec v) {
    const float* x = row(v);
    const float sc = scale_;
    return block_sum_weights(V_, [&](int64_t i) { return fix_weight(x[i], sc); }, *sh);
  }
  __device__ int32_t sample(Vec v, int64_t W, float u) {
    const float* x = row(v);
    const float sc = scale_;
    return block_sample(V_, W, u, [&](int64_t i) { return fix_weight(x[i], sc); }, *sh);
  }
  // The block_sum after each writing loop is also the barrier that publishes the writes.
  __device__ int64_t residual(Vec dst, Vec r, Vec q, float Z, float Zq) {
    const float* rr = row(r);
    const float* qq = row(q);
    float* out = mrow(dst);
    int64_t w = 0;
    for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
      const float v = residual_value(rr[i], Zq, Z, qq[i]);
      out[i] = v;
      w += fix_weight(v, scale_);
    }
    return block_sum(w, *sh);
  }
  __device__ int64_t residual_noreplace(Vec dst, Vec r, Vec q, float Z, float Zq, int32_t x, int64_t* wq) {
    // From the second rejection at a node, q is the scratch row kBufQ that this loop rewrites in
    // place: every thread must have read q[x] (the walk's acceptance test) before the thread
    // that owns index x zeroes it, or threads take different decisions and reach different barriers.
    __syncthreads();
    const float* rr = row(r);
    const float* qq = row(q);
    float* out = mrow(dst);
    float* qout = mrow(Vec::buf(Vec::kBufQ));
    int64_t w = 0, w2 = 0;
    for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
      const float qi = qq[i];
      const float v = residual_value(rr[i], Zq, Z, qi);
      out[i] = v;
      w += fix_weight(v, scale_);
      const float qn = i == x ? 0.0f : qi;
      qout[i] = qn;
      w2 += fix_weight(qn, scale_);
    }
    const int64_t total = block_sum(w, *sh);
    *wq = block_sum(w2, *sh);
    return total;
  }
  __device__ int64_t drop_token(Vec dst, Vec src, int32_t x) {
    const float* s = row(src);
    float* out = mrow(dst);
    int64_t w = 0;
    for (int64_t i = threadIdx.x; i < V_; i += kThreads) {
      const float v = i == x ? 0.0f : s[i];
      out[i] = v;
      w += fix_weight(v, scale_);
    }
    return block_sum(w, *sh);
  }
  __device__ void set_zero(Vec v, int32_t tok) {
    float* m = mrow(v);
    single([&] { m[tok] = 0.0f; });
  }
};

__global__ void __launch_bounds__(kThreads)
    verify_tree_kernel(const int32_t* __restrict__ tokens,    // [B, T]
                       const int32_t* __restrict__ parents,   // [B, T]
                       const int32_t* __restrict__ num_nodes,  // [B]
                       const float* __restrict__ target,      // [B, T, V]
                       const float* __restrict__ draft,       // [B, T, V] or nullptr
                       const float* __restrict__ uniforms,    // [B, T, 2]
                       float* __restrict__ buf,               // [B, nbuf, V]
                       int32_t* __restrict__ scratch,         // [B, T + 2]
                       int32_t* __restrict__ accept_idx,      // [B, T]
                       int32_t* __restrict__ accept_len,      // [B]
                       int32_t* __restrict__ bonus,           // [B]
                       int32_t T, int64_t V, int32_t nbuf, int32_t mode, int32_t S) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  CudaTreeEngine e{target + b * T * V,
                   draft ? draft + b * T * V : nullptr,
                   uniforms + b * T * 2,
                   buf + b * nbuf * V,
                   scratch + b * (T + 2),
                   &sh,
                   V,
                   exp2i(S),
                   exp2i(-S)};
  const int32_t* tb = tokens + b * T;
  const int32_t* pb = parents + b * T;
  const int32_t n = valid_nodes(num_nodes[b], T);
  int32_t* out = accept_idx + b * T;
  if (mode == kSampleMatch) {
    auto predict = [&](int32_t u) {
      const Vec row = Vec::target(u);
      return e.sample(row, e.sum_fix(row), e.u1(u));
    };
    match_walk(e, predict, tb, pb, n, out, accept_len + b, bonus + b);
  } else if (mode == kGsd) {
    gsd_walk(e, tb, pb, n, T, out, accept_len + b, bonus + b);
  } else {
    mss_walk(e, mode, tb, pb, n, out, accept_len + b, bonus + b);
  }
}

struct EmitOnly {
  __device__ void emit(int32_t* out, int32_t v) {
    if (threadIdx.x == 0) *out = v;
  }
};

template <class scalar_t>
__global__ void __launch_bounds__(kThreads)
    verify_greedy_kernel(const int32_t* __restrict__ tokens,    // [B, T]
                         const int32_t* __restrict__ parents,   // [B, T]
                         const int32_t* __restrict__ num_nodes,  // [B]
                         const scalar_t* __restrict__ logits,   // [B, T, V]
                         int32_t* __restrict__ accept_idx,      // [B, T]
                         int32_t* __restrict__ accept_len,      // [B]
                         int32_t* __restrict__ bonus,           // [B]
                         int32_t T, int64_t V) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const scalar_t* rows = logits + b * T * V;
  EmitOnly e;
  auto predict = [&](int32_t u) { return block_argmax(rows + u * V, V, sh); };
  match_walk(e, predict, tokens + b * T, parents + b * T, valid_nodes(num_nodes[b], T), accept_idx + b * T,
             accept_len + b, bonus + b);
}

__global__ void __launch_bounds__(kThreads)
    verify_joint_kernel(const int32_t* __restrict__ draft_tokens,  // [B, g]
                        const float* __restrict__ logprobs,        // [B, g + 1, V]
                        const float* __restrict__ joint_q,         // [B, g]
                        const float* __restrict__ log_tau,         // [B]
                        const float* __restrict__ uniforms,        // [B]
                        int32_t* __restrict__ accept_idx,          // [B, g + 1]
                        int32_t* __restrict__ accept_len,          // [B]
                        int32_t* __restrict__ bonus,               // [B]
                        int32_t g, int64_t V, int32_t S) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const float* rows = logprobs + b * (g + 1) * V;
  float joint = 0.0f;
  int32_t eta = 0;
  for (int32_t j = 1; j <= g; ++j) {  // every thread, redundantly: g is small
    const int32_t x = draft_tokens[b * g + j - 1];
    joint = add_rn(joint, in_vocab(x, V) ? rows[(j - 1) * V + x] : -inf_f());
    if (joint_pass(log_tau[b], joint, joint_q[b * g + j - 1])) eta = j;
  }
  for (int32_t j = threadIdx.x; j <= eta; j += kThreads) accept_idx[b * (g + 1) + j] = j;
  if (threadIdx.x == 0) accept_len[b] = eta + 1;
  const float* row = rows + eta * V;
  const float scale = exp2i(S);
  auto weight = [&](int64_t i) { return fix_weight(det_exp(row[i]), scale); };
  const int32_t tok = block_sample(V, block_sum_weights(V, weight, sh), uniforms[b], weight, sh);
  if (threadIdx.x == 0) bonus[b] = tok;
}

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

void check_tree(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& num_nodes,
                const at::Tensor& rows) {
  SPECOPS_CHECK_DTYPE(tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(tokens, 2);
  SPECOPS_CHECK_DIM(rows, 3);
  TORCH_CHECK(parents.sizes() == tokens.sizes(), "parents must have the shape of tokens");
  TORCH_CHECK(num_nodes.dim() == 1 && num_nodes.size(0) == tokens.size(0), "num_nodes must have shape [B]");
  TORCH_CHECK(rows.size(0) == tokens.size(0) && rows.size(1) == tokens.size(1) && rows.size(2) >= 1,
              "probability rows must have shape [B, T, V]");
  TORCH_CHECK(SPECOPS_ON_GPU(tokens) && SPECOPS_ON_GPU(parents) && SPECOPS_ON_GPU(num_nodes) && SPECOPS_ON_GPU(rows),
              "verify: " SPECOPS_GPU_NAME " tensors expected");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> outputs(const at::Tensor& like, int64_t B, int64_t T) {
  return {at::full({B, T}, -1, like.options()), at::empty({B}, like.options()), at::empty({B}, like.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                                                                const at::Tensor& target_probs,
                                                                const at::Tensor& uniforms,
                                                                const c10::optional<at::Tensor>& draft_probs,
                                                                const at::Tensor& num_nodes,
                                                                c10::string_view mode_name) {
  const int32_t mode = parse_mode(std::string(mode_name));
  check_tree(tokens, parents, num_nodes, target_probs);
  SPECOPS_CHECK_DTYPE(target_probs, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  const gpu::DeviceGuard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_probs.size(2);
  TORCH_CHECK(uniforms.dim() == 3 && uniforms.size(0) == B && uniforms.size(1) == T && uniforms.size(2) == 2,
              "uniforms must have shape [B, T, 2]");
  const bool has_q = draft_probs.has_value() && draft_probs->defined();
  TORCH_CHECK(has_q || mode == kMssPointmass || mode == kSampleMatch, "verify_tree: mode ", mode_name,
              " needs draft_probs");
  at::Tensor q;
  if (has_q) {
    SPECOPS_CHECK_DTYPE(*draft_probs, at::kFloat);
    TORCH_CHECK(draft_probs->sizes() == target_probs.sizes(), "draft_probs must have the shape of target_probs");
    q = draft_probs->contiguous();
  }
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  const int64_t nbuf = mode == kMss ? 2 : (mode == kMssNoreplace ? 3 : (mode == kMssPointmass ? 1 : 0));
  auto buf = at::empty({B, nbuf, V}, target_probs.options());
  auto scratch = at::empty({B, T + 2}, tokens.options());
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto p = target_probs.contiguous();
  auto un = uniforms.contiguous();
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_tree_kernel)(
      tok.data_ptr<int32_t>(), par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), p.data_ptr<float>(),
      has_q ? q.data_ptr<float>() : nullptr, un.data_ptr<float>(), nbuf ? buf.data_ptr<float>() : nullptr,
      scratch.data_ptr<int32_t>(), accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(),
      bonus.data_ptr<int32_t>(), static_cast<int32_t>(T), V, static_cast<int32_t>(nbuf), mode,
      fix_shift(V));
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_greedy_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                                                                  const at::Tensor& target_logits,
                                                                  const at::Tensor& num_nodes) {
  check_tree(tokens, parents, num_nodes, target_logits);
  const gpu::DeviceGuard guard(tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1), V = target_logits.size(2);
  auto [accept_idx, accept_len, bonus] = outputs(tokens, B, T);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto tok = tokens.contiguous();
  auto par = parents.contiguous();
  auto nn = num_nodes.contiguous();
  auto logits = target_logits.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "verify_greedy_cuda", [&] {
    SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_greedy_kernel<scalar_t>)(
        tok.data_ptr<int32_t>(), par.data_ptr<int32_t>(), nn.data_ptr<int32_t>(), logits.data_ptr<scalar_t>(),
        accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(), bonus.data_ptr<int32_t>(),
        static_cast<int32_t>(T), V);
  });
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_joint_cuda(const at::Tensor& draft_tokens,
                                                                 const at::Tensor& target_logprobs,
                                                                 const at::Tensor& draft_joint_logprobs,
                                                                 const at::Tensor& log_tau, const at::Tensor& uniforms) {
  SPECOPS_CHECK_DTYPE(draft_tokens, at::kInt);
  SPECOPS_CHECK_DTYPE(target_logprobs, at::kFloat);
  SPECOPS_CHECK_DTYPE(draft_joint_logprobs, at::kFloat);
  SPECOPS_CHECK_DTYPE(log_tau, at::kFloat);
  SPECOPS_CHECK_DTYPE(uniforms, at::kFloat);
  SPECOPS_CHECK_DIM(draft_tokens, 2);
  SPECOPS_CHECK_DIM(target_logprobs, 3);
  const int64_t B = draft_tokens.size(0), g = draft_tokens.size(1), V = target_logprobs.size(2);
  TORCH_CHECK(target_logprobs.size(0) == B && target_logprobs.size(1) == g + 1 && V >= 1,
              "target_logprobs must have shape [B, g + 1, V]");
  TORCH_CHECK(draft_joint_logprobs.sizes() == draft_tokens.sizes(), "draft_joint_logprobs must have shape [B, g]");
  TORCH_CHECK(log_tau.numel() == B && uniforms.numel() == B, "log_tau and uniforms must have shape [B]");
  TORCH_CHECK(SPECOPS_ON_GPU(draft_tokens) && SPECOPS_ON_GPU(target_logprobs), "verify_joint: " SPECOPS_GPU_NAME " tensors expected");
  const gpu::DeviceGuard guard(draft_tokens.device());
  auto [accept_idx, accept_len, bonus] = outputs(draft_tokens, B, g + 1);
  if (B == 0) return {accept_idx, accept_len, bonus};
  auto tok = draft_tokens.contiguous();
  auto lp = target_logprobs.contiguous();
  auto lq = draft_joint_logprobs.contiguous();
  auto lt = log_tau.contiguous();
  auto un = uniforms.contiguous();
  SPECOPS_LAUNCH(B, kThreads, 0, gpu::current_stream(), verify_joint_kernel)(
      tok.data_ptr<int32_t>(), lp.data_ptr<float>(), lq.data_ptr<float>(), lt.data_ptr<float>(),
      un.data_ptr<float>(), accept_idx.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(),
      bonus.data_ptr<int32_t>(), static_cast<int32_t>(g), V, fix_shift(V));
  SPECOPS_LAUNCH_CHECK();
  return {accept_idx, accept_len, bonus};
}

}  // namespace cuda
}  // namespace verify
}  // namespace specops

SPECOPS_GPU_IMPL(m) {
  m.impl("verify_greedy", &specops::verify::cuda::verify_greedy_cuda);
  m.impl("verify_tree", &specops::verify::cuda::verify_tree_cuda);
  m.impl("verify_joint", &specops::verify::cuda::verify_joint_cuda);
}
