// specops::linear's AMX tiles (bf16 x and weight on a CPU with AMX-BF16), included by linear.cpp.
//
// Order: each output element is its own chain of TDPBF16PS accumulations over K in chunks of 32
// (16 bf16 pairs per instruction, the chunks in increasing k, K zero-padded to a multiple of 32),
// then the bias, then one rounding to bf16. The instruction computes every (row, column) element
// of a tile by the same arithmetic from that row and column alone, so row i of an M-row call is
// bit for bit the one-row call on row i (the batch-invariance contract), for every M, row tile,
// column split and thread count. It is not the lane order of the other CPU kernels: the hardware
// sums a chunk's pairs in its own fixed way, with input and output denormals flushed to zero, so
// an AMX machine's bf16 bits differ from an AVX-512 machine's (docs/batch_invariance.md, AMX).
//
// Speed: the weight rows are the A operand as they lie ([N, K] row-major: a tile is 16 weight rows
// x 32 k), x is the B operand, packed per call into the pair-interleaved layout the instruction
// reads (16 k pairs x 16 rows of x x 2). One tile instruction does 16 x 16 x 32 multiply-adds, so a
// block of up to 16 rows of x costs little more than one row: the weight's bytes, streamed once.
#pragma once

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#include <cpuid.h>

#define SPECOPS_HAS_AMX_PATH 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq"))) inline

namespace specops {
namespace amx {

constexpr int64_t kRows = 16;   // weight rows per tile (output columns n)
constexpr int64_t kChunk = 32;  // k per tile: 16 bf16 pairs, 64 bytes

// The CPU has AMX-BF16 and the kernel granted this process the tile state (Linux 5.16+ asks for it
// with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it a tile instruction faults).
inline bool available() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool bf16 = d & (1u << 22), tile = d & (1u << 24);
    if (!bf16 || !tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Eight 16 x 64-byte tiles: C (16 weight rows x 16 rows of x, fp32), A (16 weight rows x 32 k) and B
// (16 k pairs x 16 rows of x x 2); their roles are tile_rows'.
AMX_TARGET void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// A 16 x 16 block of 32-bit lanes transposed in registers: r[i] lane j -> r[j] lane i (the unpack /
// shuffle network; 64 shuffles where a gather per row cost ~10x the cycles).
AMX_TARGET void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// x [M, K] bf16 -> xb [ceil(M / 16), ceil(K / 32), 16, 16, 2]:
// xb[b, c, p, r, s] = x[16 b + r, 32 c + 2 p + s],
// zeros past M and K (a zero pair adds +0 to a chain that starts at +0: nothing changes).
// With K even a pair is one 32-bit word and a (block, chunk) is a 16 x 16 word transpose: 16 masked
// row loads, the shuffle network, 16 stores (a prefill's 220-row calls packed ~10x faster than word by word).
AMX_TARGET void pack_x(const c10::BFloat16* x, int64_t M, int64_t K, c10::BFloat16* xb) {
  const int64_t MB = (M + 15) / 16, C = (K + kChunk - 1) / kChunk;
  if (K % 2 == 0) {
    const int64_t words = K / 2;
    for (int64_t b = 0; b < MB; ++b)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t left = words - 16 * c;
        const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        __m512 r[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t m = 16 * b + i;
          r[i] = m < M ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mask, x + m * K + 32 * c))
                       : _mm512_setzero_ps();
        }
        transpose16(r);
        float* dst = reinterpret_cast<float*>(xb + (b * C + c) * 512);
        for (int p = 0; p < 16; ++p) _mm512_storeu_ps(dst + 16 * p, r[p]);
      }
    return;
  }
  std::memset(static_cast<void*>(xb), 0, static_cast<size_t>(MB * C * 512) * sizeof(c10::BFloat16));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      xb[((m / 16 * C + k / kChunk) * 16 + (k % kChunk) / 2) * 32 + (m % 16) * 2 + k % 2] = x[m * K + k];
}

// One row of x's 16 outputs (``v``: columns n..n + 16, past N masked off) -> out_row: + bias[n + j]
// where there is a bias (none: nothing added, so -0 stays -0), then c10's float -> bf16 rounding (round
// to nearest even; NaN -> 0x7FC0), 16 lanes at a time: the scalar conversion cost more than the tiles.
AMX_TARGET void store_row(__m512 v, const c10::BFloat16* bias, c10::BFloat16* out_row, int64_t N, int64_t n) {
  const __mmask16 mask = N - n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n)) - 1);
  if (bias) {
    const __m256i b16 = _mm256_maskz_loadu_epi16(mask, bias + n);
    v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b16), 16)));
  }
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out_row + n, mask, _mm512_cvtepi32_epi16(r));
}

// A stored C tile ([16 weight rows n0..][16 rows of x], fp32) -> out rows 16 block.. of x (those < M),
// columns n0..n0 + 16: transposed in registers, so each row of x's outputs is one vector.
AMX_TARGET void emit_tile(const float* cbuf, int64_t block, int64_t M, const c10::BFloat16* bias,
                          c10::BFloat16* out, int64_t N, int64_t n0) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(cbuf + 16 * i);
  transpose16(r);
  for (int64_t j = 0; j < 16 && block * 16 + j < M; ++j) store_row(r[j], bias, out + (block * 16 + j) * N, N, n0);
}

// How far ahead a packed tile stream is prefetched. A decoding step's 210 projections (cold, packed,
// one row) took 1.12-1.15x the AVX-512 lanes' time prefetching the whole next tile pair over the k
// loop, 1.00-1.01x with 2 KB ahead (1 KB: 1.00-1.04x; three interleaved process pairs each, 2-core
// Xeon VM with AMX).
constexpr int64_t kStreamAhead = 2048;

// Weight rows [n, n + 16) (and [n + 16, n + 32) when TWO_N) times every block of 16 rows of x,
// written to out [M, N] with the bias. The A tile of chunk c starts at a0 + c * step (a1 + c * step for
// the second 16 rows; elements), its rows ld bytes apart. Two blocks of x at a time: up to four
// independent accumulator tiles (the instruction's latency is ~3x its issue interval). A plain
// weight prefetches the next pf_bytes at ``pf`` over the k loop (the weight streams from memory once
// per call); a packed one (step 512) prefetches each stream kStreamAhead bytes ahead instead.
// Tiles: C 0, 1 (rows n.., x blocks mb, mb + 1), 2, 3 (rows n + 16..); A 4, 5; B 6, 7.
template <bool TWO_N>
AMX_TARGET void tile_rows(const c10::BFloat16* a0, const c10::BFloat16* a1, int64_t step, int64_t ld,
                          int64_t C, const c10::BFloat16* xb, int64_t M, const c10::BFloat16* bias,
                          c10::BFloat16* out, int64_t N, int64_t n, const char* pf, int64_t pf_bytes) {
  alignas(64) float cbuf[16 * 16];
  const int64_t MB = (M + 15) / 16, passes = (MB + 1) / 2;
  // A packed weight over several passes of x (over 32 rows): the next tile pair's bytes (pf) are
  // prefetched into L2 across every pass, where the stream-ahead covers the first pass only and
  // the later ones left the memory idle (SmolLM2's projections, 64 / 128 / 220 rows: 4.0 / 3.8 /
  // 3.9 % faster, 15 interleaved runs each in one process, 2-core Xeon VM with AMX).
  const bool spread = step == 512 && passes > 1 && pf;
  const int64_t iters = std::max<int64_t>(spread ? passes * C : C, 1);
  const int64_t pf_per_chunk = (pf_bytes / 64 + iters - 1) / iters;
  const char* const pf_end = pf ? pf + pf_bytes : nullptr;
  for (int64_t mb = 0; mb < MB; mb += 2) {
    const bool two = mb + 1 < MB;
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (TWO_N) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t c = 0; c < C; ++c) {
      if (mb == 0 && step == 512) {  // packed: each 1 KB chunk stream, kStreamAhead bytes ahead
        const char* p0 = reinterpret_cast<const char*>(a0 + c * step) + kStreamAhead;
        for (int i = 0; i < 16; ++i) _mm_prefetch(p0 + 64 * i, _MM_HINT_T0);
        if constexpr (TWO_N) {
          const char* p1 = reinterpret_cast<const char*>(a1 + c * step) + kStreamAhead;
          for (int i = 0; i < 16; ++i) _mm_prefetch(p1 + 64 * i, _MM_HINT_T0);
        }
      } else if (mb == 0 && step != 512) {
        for (int64_t i = 0; i < pf_per_chunk && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
      }
      if (spread)
        for (int64_t i = 0; i < pf_per_chunk && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
      _tile_loadd(4, a0 + c * step, ld);
      if constexpr (TWO_N) _tile_loadd(5, a1 + c * step, ld);
      _tile_loadd(6, xb + (mb * C + c) * 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (TWO_N) _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, xb + ((mb + 1) * C + c) * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (TWO_N) _tile_dpbf16ps(3, 5, 7);
      }
    }
    auto emit = [&](int64_t block, int64_t n0) { emit_tile(cbuf, block, M, bias, out, N, n0); };
    _tile_stored(0, cbuf, 64);
    emit(mb, n);
    if (two) {
      _tile_stored(1, cbuf, 64);
      emit(mb + 1, n);
    }
    if constexpr (TWO_N) {
      _tile_stored(2, cbuf, 64);
      emit(mb, n + kRows);
      if (two) {
        _tile_stored(3, cbuf, 64);
        emit(mb + 1, n + kRows);
      }
    }
  }
}

// The packed weight's shape for these tiles: [ceil(N / 16), ceil(K / 32), 512], tile t's chunk c the
// 16 x 32 block w[16 t + i, 32 c + k] at [t, c, 32 i + k], zeros past N and K (ops/linear pack_weight).
inline bool is_packed_shape(const at::Tensor& p, int64_t N, int64_t K) {
  return p.dim() == 3 && p.size(0) == (N + kRows - 1) / kRows && p.size(1) == (K + kChunk - 1) / kChunk &&
         p.size(2) == kRows * kChunk;
}

// Rows [0, M) x weight-row tiles [t_lo, t_hi) of 16, from the packed weight ``wp`` (one contiguous
// stream: 1 KB per tile and chunk) or else the plain one (16 rows read side by side; a tile whose rows
// run past N, or every tile when K is not a multiple of 32, reads a zero-padded copy made here).
AMX_TARGET void rows(const c10::BFloat16* xb, int64_t M, int64_t K, const c10::BFloat16* w,
                     const c10::BFloat16* wp, const c10::BFloat16* bias, c10::BFloat16* out, int64_t N,
                     int64_t t_lo, int64_t t_hi) {
  configure();
  const int64_t C = (K + kChunk - 1) / kChunk, Kc = C * kChunk;
  const char* const w_end = reinterpret_cast<const char*>(w + N * K);
  std::vector<c10::BFloat16> pad;
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const int64_t n = t * kRows;
    const char* pf;
    if (wp) {  // two tiles at a time (the last one alone), each a stream prefetched ahead
      const c10::BFloat16* a0 = wp + t * C * 512;
      const int64_t ahead = std::max<int64_t>(0, std::min<int64_t>(t_hi, t + 4) - (t + 2));  // the next pair's tiles
      pf = reinterpret_cast<const char*>(a0 + 2 * C * 512);
      if (t + 1 < t_hi)
        tile_rows<true>(a0, a0 + C * 512, 512, 64, C, xb, M, bias, out, N, n, ahead ? pf : nullptr, ahead * C * 1024), ++t;
      else
        tile_rows<false>(a0, a0, 512, 64, C, xb, M, bias, out, N, n, nullptr, 0);
      continue;
    }
    const c10::BFloat16* src = w + n * K;
    int64_t ld = K;
    if (Kc != K || n + kRows > N) {
      pad.assign(static_cast<size_t>(kRows * Kc), c10::BFloat16(0.f));
      for (int64_t j = 0; j < kRows && n + j < N; ++j)
        std::memcpy(pad.data() + j * Kc, w + (n + j) * K, static_cast<size_t>(K) * sizeof(c10::BFloat16));
      src = pad.data(), ld = Kc;
    }
    pf = reinterpret_cast<const char*>(w + std::min(N, n + kRows) * K);
    const int64_t pf_bytes = std::max<int64_t>(0, std::min<int64_t>(kRows * K * 2, w_end - pf));
    tile_rows<false>(src, src, kChunk, ld * 2, C, xb, M, bias, out, N, n, pf_bytes ? pf : nullptr, pf_bytes);
  }
  _tile_release();
}

}  // namespace amx
}  // namespace specops
#endif
