// Host-side arguments of tree_attention / tree_attention_paged shared by the CPU and CUDA
// launchers: the K/V view of a call (contiguous or paged), the checks (the device ones through the
// backend's Device, csrc/registration.h), the schedule the caller chose (split count and partials
// workspace: specops.TreeAttentionPlan decides them once per step; the kernels never do), the
// operands and the fields of the kernels' argument structs. Each launcher adds its limits.
//
// The public Python ops validate every argument with a ValueError/TypeError that names it; these
// checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "registration.h"
#include "tree_attention_common.h"

namespace specops {
namespace ta {

// The largest |sm_scale| (specops.ops.tree_attention.SM_SCALE_MAX): fp32 scores of fp16 inputs then
// stay finite for every input and head dim, and every backend gives the exact (softmax) result.
constexpr double kMaxSmScale = 65536.0;

inline void check_scale(const char* op, double sm_scale) {
  TORCH_CHECK_VALUE(std::isfinite(sm_scale) && std::abs(sm_scale) <= kMaxSmScale, op,
                    ": sm_scale must be a finite number in [-", kMaxSmScale, ", ", kMaxSmScale, "], got ", sm_scale);
}

// The K/V side of a call, contiguous or paged.
struct KvView {
  at::Tensor k, v;              // [B, Hkv, S, D], or paged [num_pages, page_size, Hkv, D]
  at::Tensor pages;             // paged: the page table [B, max_pages] int32; undefined: contiguous
  int64_t Hkv, S;               // S: rows a sequence can address (paged: max_pages * page_size)
  int64_t dim_b, dim_h, dim_s;  // the dims of k / v holding sequence (-1: none), head, row (slot)
};

// k_cache, v_cache [B, Hkv, S, D].
inline KvView contiguous_view(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  SPECOPS_CHECK_DIM(k_cache, 4);
  TORCH_CHECK_VALUE(q.dim() >= 1 && k_cache.size(0) == q.size(0), "tree_attention: k_cache must be [B, Hkv, S, D]");
  return KvView{k_cache, v_cache, at::Tensor(), k_cache.size(1), k_cache.size(2), 0, 1, 2};
}

// k_pages, v_pages [num_pages, page_size, Hkv, D]; page_table [B, max_pages] int32.
inline KvView paged_view(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                         const at::Tensor& page_table) {
  SPECOPS_CHECK_DIM(k_pages, 4);
  SPECOPS_CHECK_DIM(page_table, 2);
  SPECOPS_CHECK_DTYPE(page_table, at::kInt);
  TORCH_CHECK_VALUE(q.dim() >= 1 && page_table.size(0) == q.size(0), "tree_attention_paged: page_table must be [B, max_pages]");
  const int64_t page = k_pages.size(1);
  TORCH_CHECK_VALUE(page > 0 && (page & (page - 1)) == 0, "tree_attention_paged: page_size must be a power of two, got ",
              page);
  // No pool page: no row can be addressed (the kernels clamp page ids into [0, num_pages)).
  const int64_t rows = k_pages.size(0) == 0 ? 0 : page_table.size(1) * page;
  return KvView{k_pages, v_pages, page_table.contiguous(), k_pages.size(2), std::min<int64_t>(rows, INT32_MAX),
                -1, 2, 1};
}

inline void check_shapes(const char* op, const at::Tensor& q, const KvView& kv, const at::Tensor& prefix_lens,
                         const at::Tensor& block_lens, const at::Tensor& mask,
                         const std::optional<at::Tensor>& q_lens) {
  SPECOPS_CHECK_DIM(q, 4);
  SPECOPS_CHECK_DIM(mask, 3);
  SPECOPS_CHECK_DTYPE(prefix_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(block_lens, at::kInt);
  SPECOPS_CHECK_DTYPE(mask, at::kInt);
  TORCH_CHECK_VALUE(kv.k.scalar_type() == q.scalar_type() && kv.v.scalar_type() == q.scalar_type(), op,
              ": q and the K/V caches must share a dtype");
  TORCH_CHECK_VALUE(kv.v.sizes() == kv.k.sizes(), op, ": the V cache must have the K cache's shape");
  const int64_t B = q.size(0), Tq = q.size(1), Hq = q.size(2), D = q.size(3);
  TORCH_CHECK_VALUE(kv.k.size(3) == D, op, ": the caches' last dim must be q's head dim D");
  TORCH_CHECK_VALUE(kv.Hkv > 0 && Hq % kv.Hkv == 0, op, ": Hq must be a multiple of Hkv");
  TORCH_CHECK_VALUE(mask.size(0) == B && mask.size(1) == Tq, op, ": mask must be [B, Tq, W]");
  TORCH_CHECK_VALUE(prefix_lens.numel() == B && block_lens.numel() == B, op, ": lengths must be [B]");
  if (q_lens) {
    SPECOPS_CHECK_DTYPE((*q_lens), at::kInt);
    TORCH_CHECK_VALUE(q_lens->numel() == B, op, ": q_lens must be [B]");
  }
}

// The kv splits and their partials of one call. Shape: workspace fp32 [>= num_splits * R * (D + 1)],
// R = B * Tq * Hq: part_o [num_splits, R, D] then part_lse [num_splits, R]. Without a workspace
// (a direct torch.ops call) a split call allocates its own. A workspace passed in must share no
// byte with any input (``args``: name and tensor): the kernels write partials into it before they
// read the last K/V tile, so an aliased cache would be overwritten mid-call.
// `invariant`: the batch-invariant schedule (docs/batch_invariance.md, "Invariant attention"): each
// query row alone in its work item, key tiles over the row's virtual sequence (the prefix, then the
// block keys it sees in index order) aligned to absolute positions, no split.
struct Partials {
  int32_t n_splits = 1;
  bool invariant = false;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  at::Tensor owned;
};

inline Partials partials(const char* op, const at::Tensor& q, int64_t num_splits,
                         const std::optional<at::Tensor>& workspace, bool invariant, NamedTensors args) {
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= kMaxSplits, op, ": num_splits must lie in [1, ", kMaxSplits,
              "], got ", num_splits);
  TORCH_CHECK_VALUE(!invariant || num_splits == 1, op, ": invariant=True runs unsplit (num_splits must be 1), got ",
                    num_splits);
  Partials p;
  p.n_splits = static_cast<int32_t>(num_splits);
  p.invariant = invariant;
  if (num_splits == 1) return p;
  const int64_t rows = q.size(0) * q.size(1) * q.size(2), D = q.size(3), need = num_splits * rows * (D + 1);
  at::Tensor ws;
  if (workspace && workspace->defined()) {
    ws = *workspace;
    TORCH_CHECK_VALUE(ws.scalar_type() == at::kFloat && ws.is_contiguous() && ws.numel() >= need &&
                    ws.device() == q.device(),
                op, ": workspace must be a contiguous fp32 tensor of >= num_splits * B * Tq * Hq * (D + 1) = ",
                need, " elements on q's device");
    for (const auto& [name, t] : args)
      TORCH_CHECK_VALUE(t == nullptr || !bytes_overlap(ws, *t), op, ": workspace must not share memory with ", name,
                        " (the partials would overwrite it)");
  } else {
    ws = p.owned = at::empty({need}, q.options().dtype(at::kFloat));
  }
  p.part_o = ws.data_ptr<float>();
  p.part_lse = p.part_o + num_splits * rows * D;
  return p;
}

// The tensors a runner reads: q, k and v with stride 1 in the head dim, the rest contiguous (q_lens
// undefined when absent).
struct Operands {
  at::Tensor q, k, v, prefix, block, mask, q_lens;
};

inline Operands operands(const at::Tensor& q, const KvView& kv, const at::Tensor& prefix_lens,
                         const at::Tensor& block_lens, const at::Tensor& mask,
                         const std::optional<at::Tensor>& q_lens) {
  auto last_unit = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  return {last_unit(q), last_unit(kv.k), last_unit(kv.v), prefix_lens.contiguous(), block_lens.contiguous(),
          mask.contiguous(), q_lens ? q_lens->contiguous() : at::Tensor()};
}

// The fields the CPU kernel's Problem and the CUDA kernels' Args share: pointers, element strides
// (paged: through the view's dims, with the page table), sizes and the log2-scaled softmax scale.
template <class Fields>
void fill_fields(Fields& a, const Operands& t, const at::Tensor& out, const KvView& kv, double sm_scale) {
  const at::Tensor &q = t.q, &k = t.k, &v = t.v;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.out = out.data_ptr();
  a.prefix = t.prefix.data_ptr<int32_t>();
  a.block = t.block.data_ptr<int32_t>();
  a.q_lens = t.q_lens.defined() ? t.q_lens.data_ptr<int32_t>() : nullptr;
  a.mask = t.mask.data_ptr<int32_t>();
  a.sq_b = q.stride(0), a.sq_t = q.stride(1), a.sq_h = q.stride(2);
  a.sk_b = kv.dim_b < 0 ? 0 : k.stride(kv.dim_b), a.sk_h = k.stride(kv.dim_h), a.sk_s = k.stride(kv.dim_s);
  a.sv_b = kv.dim_b < 0 ? 0 : v.stride(kv.dim_b), a.sv_h = v.stride(kv.dim_h), a.sv_s = v.stride(kv.dim_s);
  if (kv.pages.defined()) {
    a.pages = kv.pages.data_ptr<int32_t>();
    a.s_pages = kv.pages.stride(0);
    a.sk_pg = k.stride(0), a.sv_pg = v.stride(0);
    a.log2_page = static_cast<int32_t>(__builtin_ctzll(static_cast<unsigned long long>(k.size(1))));
    a.num_pages = static_cast<int32_t>(k.size(0));
  }
  const int64_t Hq = q.size(2);
  a.B = q.size(0), a.Tq = q.size(1), a.Hq = Hq, a.Hkv = kv.Hkv, a.G = Hq / kv.Hkv, a.D = q.size(3), a.S = kv.S;
  a.W = t.mask.size(2);
  a.scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);  // * log2(e)
}

// A backend's limits beyond the shared checks, and its runner.
using LimitFn = void (*)(const char* op, const at::Tensor& q, const KvView& kv);
using RunFn = at::Tensor (*)(const at::Tensor& q, const KvView& kv, const at::Tensor& prefix_lens,
                             const at::Tensor& block_lens, const at::Tensor& mask,
                             const std::optional<at::Tensor>& q_lens, double sm_scale, const Partials& parts);

inline void no_limits(const char*, const at::Tensor&, const KvView&) {}

// Both layouts' entries: the checks, then the runner. `args`: every tensor argument by name (q_lens
// null when absent), for the device checks and the workspace's overlap check.
template <class Dev, LimitFn Limits, RunFn Run>
at::Tensor call(const char* op, const at::Tensor& q, const KvView& kv, const at::Tensor& prefix_lens,
                const at::Tensor& block_lens, const at::Tensor& mask, const std::optional<at::Tensor>& q_lens,
                double sm_scale, int64_t num_splits, const std::optional<at::Tensor>& workspace, bool invariant,
                NamedTensors args) {
  check_shapes(op, q, kv, prefix_lens, block_lens, mask, q_lens);
  check_device<Dev>(op, args);
  Limits(op, q, kv);
  check_scale(op, sm_scale);
  return Run(q, kv, prefix_lens, block_lens, mask, q_lens, sm_scale,
             partials(op, q, num_splits, workspace, invariant, args));
}

template <class Dev, LimitFn Limits, RunFn Run>
at::Tensor contiguous_entry(const at::Tensor& q,            // [B, Tq, Hq, D]
                            const at::Tensor& k_cache,      // [B, Hkv, S, D]
                            const at::Tensor& v_cache,      // [B, Hkv, S, D]
                            const at::Tensor& prefix_lens,  // [B] int32
                            const at::Tensor& block_lens,   // [B] int32
                            const at::Tensor& mask,         // [B, Tq, W] int32
                            const std::optional<at::Tensor>& q_lens,  // [B] int32
                            double sm_scale, int64_t num_splits,
                            const std::optional<at::Tensor>& workspace,  // fp32, see Partials
                            bool invariant) {
  return call<Dev, Limits, Run>("tree_attention", q, contiguous_view(q, k_cache, v_cache), prefix_lens, block_lens,
                                mask, q_lens, sm_scale, num_splits, workspace, invariant,
                                {{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"prefix_lens", &prefix_lens},
                                 {"block_lens", &block_lens}, {"mask", &mask}, {"q_lens", given(q_lens)}});
}

template <class Dev, LimitFn Limits, RunFn Run>
at::Tensor paged_entry(const at::Tensor& q,            // [B, Tq, Hq, D]
                       const at::Tensor& k_pages,      // [num_pages, page_size, Hkv, D]
                       const at::Tensor& v_pages,      // [num_pages, page_size, Hkv, D]
                       const at::Tensor& page_table,   // [B, max_pages] int32
                       const at::Tensor& prefix_lens,  // [B] int32
                       const at::Tensor& block_lens,   // [B] int32
                       const at::Tensor& mask,         // [B, Tq, W] int32
                       const std::optional<at::Tensor>& q_lens,  // [B] int32
                       double sm_scale, int64_t num_splits,
                       const std::optional<at::Tensor>& workspace,  // fp32, see Partials
                       bool invariant) {
  return call<Dev, Limits, Run>("tree_attention_paged", q, paged_view(q, k_pages, v_pages, page_table), prefix_lens,
                                block_lens, mask, q_lens, sm_scale, num_splits, workspace, invariant,
                                {{"q", &q}, {"k_pages", &k_pages}, {"v_pages", &v_pages}, {"page_table", &page_table},
                                 {"prefix_lens", &prefix_lens}, {"block_lens", &block_lens}, {"mask", &mask},
                                 {"q_lens", given(q_lens)}});
}

// The `.functional` overloads (no workspace argument: what a compiled graph calls).
template <class Dev, LimitFn Limits, RunFn Run>
at::Tensor contiguous_functional(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& prefix_lens, const at::Tensor& block_lens, const at::Tensor& mask,
                                 const std::optional<at::Tensor>& q_lens, double sm_scale, int64_t num_splits,
                                 bool invariant) {
  return contiguous_entry<Dev, Limits, Run>(q, k_cache, v_cache, prefix_lens, block_lens, mask, q_lens, sm_scale,
                                            num_splits, std::nullopt, invariant);
}

template <class Dev, LimitFn Limits, RunFn Run>
at::Tensor paged_functional(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                            const at::Tensor& page_table, const at::Tensor& prefix_lens, const at::Tensor& block_lens,
                            const at::Tensor& mask, const std::optional<at::Tensor>& q_lens, double sm_scale,
                            int64_t num_splits, bool invariant) {
  return paged_entry<Dev, Limits, Run>(q, k_pages, v_pages, page_table, prefix_lens, block_lens, mask, q_lens,
                                       sm_scale, num_splits, std::nullopt, invariant);
}

// Registers both ops and their `.functional` overloads for one backend.
#define SPECOPS_TA_REGISTER(m, DEV, LIMITS, RUN)                                                      \
  do {                                                                                                \
    m.impl("tree_attention", &specops::ta::contiguous_entry<DEV, LIMITS, RUN>);                       \
    m.impl("tree_attention_paged", &specops::ta::paged_entry<DEV, LIMITS, RUN>);                      \
    m.impl("tree_attention.functional", &specops::ta::contiguous_functional<DEV, LIMITS, RUN>);       \
    m.impl("tree_attention_paged.functional", &specops::ta::paged_functional<DEV, LIMITS, RUN>);      \
  } while (0)

}  // namespace ta
}  // namespace specops
