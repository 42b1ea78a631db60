// topn_expand and select_topn_subtree on the CPU.
//
// topn_expand, two stages (the order is score_before of csrc/sampling_common.h everywhere):
//   1. one task per (sequence, parent): its best kp = min(per_parent_k, n, V) children by
//      parent_score + child_logprob, one pass over V with a bounded heap; a vectorised
//      prefilter (sampling_simd.h) skips blocks of 16 tokens that cannot beat its worst entry;
//   2. one task per sequence: the best n of its P * kp candidates.
// Taking kp <= n per parent loses nothing: within one parent the global order is the
// per-parent order, so the global best n hold at most n children of any parent.
//
// select_topn_subtree: one task per sequence; effective scores by the shared ancestor walk,
// then a partial sort under score_before and a prefix count for the new indices.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../registration.h"
#include "../sampling_common.h"
#include "sampling_simd.h"


namespace specops {
namespace {

struct Cand {
  float s;
  int64_t i;
};

inline bool before(const Cand& a, const Cand& b) { return score_before(a.s, a.i, b.s, b.i); }

// A row as fp32: fp32 rows are used in place, others converted into buf.
inline const float* as_float(const float* src, int64_t, std::vector<float>&) { return src; }

template <typename scalar_t>
const float* as_float(const scalar_t* src, int64_t V, std::vector<float>& buf) {
  buf.resize(V);
  for (int64_t i = 0; i < V; ++i) buf[i] = static_cast<float>(src[i]);
  return buf.data();
}

// Best kp of bias + c[0..V) under `before`, sorted, into heap (cleared first).
void row_top(const float* c, int64_t V, float bias, int64_t kp, std::vector<Cand>& heap) {
  heap.clear();
  if (!score_available(bias)) return;  // a padding parent: every child is -inf
  // A max-heap under `before` keeps the worst kept candidate on top. Tokens arrive in
  // increasing index, so a newcomer must beat the worst score strictly; until the heap is
  // full the bar is -inf (any available candidate).
  const simd::Loops& loops = simd::loops();
  float thr = -kInf;
  for (int64_t i = 0; i < V;) {
    i = loops.next_above(c, i, V, bias, thr);  // skips whole blocks below the bar
    const int64_t end = std::min<int64_t>(i + simd::kW, V);
    for (; i < end; ++i) {
      const Cand x{bias + c[i], i};
      if (!(x.s > thr)) continue;
      if (static_cast<int64_t>(heap.size()) < kp) {
        heap.push_back(x);
        std::push_heap(heap.begin(), heap.end(), before);
      } else {
        std::pop_heap(heap.begin(), heap.end(), before);
        heap.back() = x;
        std::push_heap(heap.begin(), heap.end(), before);
      }
      if (static_cast<int64_t>(heap.size()) == kp) thr = heap.front().s;
    }
  }
  std::sort_heap(heap.begin(), heap.end(), before);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> topn_expand_cpu(
    const at::Tensor& parent_scores,   // [B, P] fp32
    const at::Tensor& child_logprobs,  // [B, P, V] fp32/bf16/fp16
    int64_t n, int64_t per_parent_k) {
  SPECOPS_CHECK_DTYPE(parent_scores, at::kFloat);
  SPECOPS_CHECK_DIM(parent_scores, 2);
  SPECOPS_CHECK_DIM(child_logprobs, 3);
  TORCH_CHECK_VALUE(n >= 1, "topn_expand: n must be >= 1, got ", n);
  const int64_t B = child_logprobs.size(0), P = child_logprobs.size(1), V = child_logprobs.size(2);
  TORCH_CHECK_VALUE(parent_scores.size(0) == B && parent_scores.size(1) == P,
              "topn_expand: parent_scores must have shape [B, P] of child_logprobs");
  const int64_t kp = std::min({per_parent_k >= 1 ? per_parent_k : V, n, V});
  auto ps = parent_scores.contiguous();
  auto cl = child_logprobs.contiguous();
  auto scores = at::empty({B, n}, ps.options());                    // [B, n]
  auto tokens = at::empty({B, n}, ps.options().dtype(at::kInt));   // [B, n]
  auto parents = at::empty({B, n}, ps.options().dtype(at::kInt));  // [B, n]
  TORCH_CHECK_VALUE(P >= 1 && V >= 1, "topn_expand: child_logprobs must have P >= 1 and V >= 1");
  if (B == 0) return {scores, tokens, parents};
  std::vector<Cand> cand(B * P * std::max<int64_t>(kp, 0));  // [B, P, kp], sorted per parent
  std::vector<int64_t> cand_n(B * P, 0);                      // [B, P]
  const float* psp = ps.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, cl.scalar_type(), "topn_expand_cpu", [&] {
    const scalar_t* c = cl.data_ptr<scalar_t>();
    at::parallel_for(0, B * P, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> row;
      std::vector<Cand> heap;
      for (int64_t r = lo; r < hi; ++r) {
        row_top(as_float(c + r * V, V, row), V, psp[r], kp, heap);
        std::copy(heap.begin(), heap.end(), cand.begin() + r * kp);
        cand_n[r] = static_cast<int64_t>(heap.size());
      }
    });
  });
  float* os = scores.data_ptr<float>();
  int32_t* ot = tokens.data_ptr<int32_t>();
  int32_t* op = parents.data_ptr<int32_t>();
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Cand> all;
    for (int64_t b = lo; b < hi; ++b) {
      all.clear();
      for (int64_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < cand_n[b * P + p]; ++j) {
          const Cand& x = cand[(b * P + p) * kp + j];
          all.push_back({x.s, p * V + x.i});  // flat index: ties go to the lower parent, then token
        }
      const int64_t got = std::min<int64_t>(n, static_cast<int64_t>(all.size()));
      std::partial_sort(all.begin(), all.begin() + got, all.end(), before);
      for (int64_t j = 0; j < n; ++j) {
        const bool ok = j < got;
        os[b * n + j] = ok ? all[j].s : -kInf;
        ot[b * n + j] = ok ? static_cast<int32_t>(all[j].i % V) : -1;
        op[b * n + j] = ok ? static_cast<int32_t>(all[j].i / V) : -1;
      }
    }
  });
  return {scores, tokens, parents};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> select_topn_subtree_cpu(
    const at::Tensor& parents,    // [B, T] int32
    const at::Tensor& scores,     // [B, T] fp32
    const at::Tensor& num_nodes,  // [B] int32
    int64_t n) {
  SPECOPS_CHECK_DTYPE(parents, at::kInt);
  SPECOPS_CHECK_DTYPE(scores, at::kFloat);
  SPECOPS_CHECK_DTYPE(num_nodes, at::kInt);
  SPECOPS_CHECK_DIM(parents, 2);
  TORCH_CHECK_VALUE(n >= 1, "select_topn_subtree: n must be >= 1, got ", n);
  const int64_t B = parents.size(0), T = parents.size(1);
  TORCH_CHECK_VALUE(T >= 1, "select_topn_subtree: parents must have T >= 1");
  TORCH_CHECK_VALUE(scores.sizes() == parents.sizes(), "select_topn_subtree: scores must have the shape of parents");
  TORCH_CHECK_VALUE(num_nodes.dim() == 1 && num_nodes.size(0) == B, "select_topn_subtree: num_nodes must have shape [B]");
  auto par = parents.contiguous();
  auto sc = scores.contiguous();
  auto nn = num_nodes.contiguous();
  auto keep = at::empty({B, n}, par.options());        // [B, n]
  auto new_parents = at::empty({B, n}, par.options());  // [B, n]
  auto counts = at::empty({B}, par.options());          // [B]
  const int32_t* pp = par.data_ptr<int32_t>();
  const float* sp = sc.data_ptr<float>();
  const int32_t* np = nn.data_ptr<int32_t>();
  int32_t* ok = keep.data_ptr<int32_t>();
  int32_t* onp = new_parents.data_ptr<int32_t>();
  int32_t* oc = counts.data_ptr<int32_t>();
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Cand> order;
    std::vector<float> eff(T);
    std::vector<int32_t> pos(T);
    for (int64_t b = lo; b < hi; ++b) {
      const int32_t* pb = pp + b * T;
      const int32_t nv = static_cast<int32_t>(std::clamp<int64_t>(np[b], 1, T));
      order.clear();
      for (int32_t i = 0; i < T; ++i) {
        eff[i] = subtree_eff_score(pb, sp + b * T, i, nv);
        if (i > 0 && score_available(eff[i])) order.push_back({eff[i], i});
      }
      const int64_t take = std::min<int64_t>(n - 1, static_cast<int64_t>(order.size()));
      std::partial_sort(order.begin(), order.begin() + take, order.end(), before);
      std::fill(pos.begin(), pos.end(), 0);
      pos[0] = 1;
      for (int64_t j = 0; j < take; ++j) pos[order[j].i] = 1;
      // New index = number of kept nodes before it; parents[i] < i keeps the order topological.
      int32_t count = 0;
      for (int32_t i = 0; i < T; ++i) pos[i] = pos[i] ? count++ : -1;
      for (int64_t j = count; j < n; ++j) ok[b * n + j] = onp[b * n + j] = -1;
      for (int32_t i = 0; i < T; ++i) {
        if (pos[i] < 0) continue;
        const int32_t p = i == 0 ? -1 : pb[i];
        ok[b * n + pos[i]] = i;
        onp[b * n + pos[i]] = (p >= 0 && p < i) ? pos[p] : -1;
      }
      oc[b] = count;
    }
  });
  return {keep, new_parents, counts};
}

}  // namespace
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("topn_expand", &specops::topn_expand_cpu);
  m.impl("select_topn_subtree", &specops::select_topn_subtree_cpu);
}
