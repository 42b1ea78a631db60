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

#include "../sampling_common.h"
#include "../topn_args.h"
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

void topn_expand_cpu(const topn::Expand& e) {
  const int64_t B = e.B, P = e.P, V = e.V, n = e.n, kp = e.kp;
  std::vector<Cand> cand(B * P * std::max<int64_t>(kp, 0));  // [B, P, kp], sorted per parent
  std::vector<int64_t> cand_n(B * P, 0);                      // [B, P]
  const float* psp = e.parent_scores.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, e.child_logprobs.scalar_type(), "topn_expand_cpu", [&] {
    const scalar_t* c = e.child_logprobs.data_ptr<scalar_t>();
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
  float* os = e.scores.data_ptr<float>();
  int32_t* ot = e.tokens.data_ptr<int32_t>();
  int32_t* op = e.parents.data_ptr<int32_t>();
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
}

void select_topn_subtree_cpu(const topn::Select& s) {
  const int64_t B = s.B, T = s.T, n = s.n;
  const int32_t* pp = s.parents.data_ptr<int32_t>();
  const float* sp = s.scores.data_ptr<float>();
  const int32_t* np = s.num_nodes.data_ptr<int32_t>();
  int32_t* ok = s.keep.data_ptr<int32_t>();
  int32_t* onp = s.new_parents.data_ptr<int32_t>();
  int32_t* oc = s.counts.data_ptr<int32_t>();
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
}

}  // namespace
}  // namespace specops

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  SPECOPS_TOPN_REGISTER(m, specops::CpuDevice, INT32_MAX, specops::topn_expand_cpu, specops::select_topn_subtree_cpu);
}
