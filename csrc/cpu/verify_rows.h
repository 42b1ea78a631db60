// Vectorised V-wide row passes of the CPU verification kernels (defined in verify_rows.cpp).
//
// Weights are the fixed-point weights of ../verify_common.h (fix_weight). Functions that take a
// `chunks` pointer also store the weight sum of every kChunk-wide chunk there, which lets a later
// row_sample find its chunk without a second pass over the row.
#pragma once

#include <cstdint>

namespace specops {
namespace verify {
namespace cpu {

constexpr int64_t kChunk = 2048;

inline int64_t num_chunks(int64_t V) { return (V + kChunk - 1) / kChunk; }

// Sequences per at::parallel_for task: a sequence costs a few V-wide passes, and waking a second
// thread only pays off above ~64K elements of work (below it the op runs on the calling thread).
inline int64_t sequences_per_task(int64_t V) { return V >= 65536 ? 1 : 65536 / (V > 0 ? V : 1); }

// Shape: x [V] -> sum of the weights (chunks [num_chunks(V)] optional, may be nullptr).
int64_t row_sum_fix(const float* x, int64_t V, float scale, int64_t* chunks);
// Same with the weights of det_exp(logp) (R6's bonus row of log-probabilities).
int64_t row_sum_fix_exp(const float* logp, int64_t V, float scale, int64_t* chunks);
// out = residual_value(r, Zq, Z, q) elementwise; returns its weight sum (chunks required).
int64_t row_residual(float* out, const float* r, const float* q, float Z, float Zq, int64_t V, float scale,
                     int64_t* chunks);
// R3w: the residual into out and q without token x into qout (in place allowed); *wq = its sum.
int64_t row_residual_noreplace(float* out, float* qout, const float* r, const float* q, float Z, float Zq, int64_t x,
                               int64_t V, float scale, int64_t* chunks, int64_t* wq);
// out = src with token x zeroed (R3p); returns its weight sum (chunks required).
int64_t row_drop_token(float* out, const float* src, int64_t x, int64_t V, float scale, int64_t* chunks);
// Inverse-CDF draw over the row's weights (their sum is W); chunks may be nullptr.
int32_t row_sample(const float* x, int64_t V, float scale, int64_t W, float u, const int64_t* chunks,
                   bool exp_weights);
// First index of the maximum, NaN counting as +inf.
int32_t row_argmax(const float* x, int64_t V);

}  // namespace cpu
}  // namespace verify
}  // namespace specops
