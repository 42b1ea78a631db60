// The row pieces of warp_probs (csrc/cpu/sampling.cpp) that verify_tree_logits reuses, so that a
// probability it evaluates from logits is the value warp_probs would have written, bit for bit.
//
// A warped row is determined by its statistics: the logit max m, the temperature t, the kept set
// {z >= lo} with z = (x - m) / t, and the fp32 normaliser sum over it (greedy rows: the argmax).
// row_stats runs warp_probs' passes up to the normaliser; row_probs and prob_at then give the row,
// or one entry of it, from the logits and those statistics.
#pragma once

#include <cstdint>
#include <memory>

namespace specops {
namespace warp {

struct RowStats {
  float m;          // max logit (unused by greedy rows)
  float t;          // temperature
  float lo;         // keep z >= lo
  float sum;        // fp32 sum of exp(z) over the kept set
  int32_t argmax;   // greedy rows: the index of the one-hot; -1 for every other row
};

// Per-thread scratch of the row passes: a few [V] rows (z and the radix select's candidates).
struct Scratch;
struct ScratchDeleter {
  void operator()(Scratch* s) const;
};
std::unique_ptr<Scratch, ScratchDeleter> make_scratch(int64_t V);
// The z row of the last row_stats / row_probs call (valid until the next call with this scratch).
const float* scratch_z(const Scratch& s);

// Statistics of one row x [V] (warp_probs' rule for t, k, p); e [V] receives exp(z) on the top-k
// set (only meaningful where z >= stats.lo), and scratch_z(s) the row's z.
template <typename scalar_t>
RowStats row_stats(const scalar_t* x, int64_t V, float t, int32_t k, float p, float* e, Scratch& s);
// The warped row into out [V] (= warp_probs' output row).
template <typename scalar_t>
void row_probs(const scalar_t* x, int64_t V, const RowStats& st, float* out, Scratch& s);
// After row_stats(..., e, s) with no other call on s since: finishes e into the warped row in place.
void finish_probs(const RowStats& st, float* e, int64_t V, const Scratch& s);
// Entry tok of the warped row (tok in [0, V)).
template <typename scalar_t>
float prob_at(const scalar_t* x, int64_t tok, const RowStats& st);

}  // namespace warp
}  // namespace specops
