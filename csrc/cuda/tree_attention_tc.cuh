// The tensor-core tree_attention kernel (fp16 / bf16) and its tile configuration: FlashAttention-2
// style, 4 warps x 16 query rows per block, K/V tiles of BN keys staged by cp.async (double
// buffered) and read once per GQA group, S = Q K^T and O += P V by mma.sync m16n8k16 from ldmatrix
// fragments, the online softmax and the visibility bits in registers (see tree_attention.cu).
//
// Inv: the batch-invariant schedule (tree_attention.cu): the 64-row tile holds one query's G heads
// (rows past G zero), its keys walked in virtual tiles.
//
// No include guard: tree_attention.cu includes it once, inside its anonymous namespace, after
// `Args`, `kFull`, `kv_off` and the row-tile and key-walk helpers (tile_row, virtual_length,
// walk_tile, walk_tiles, walk_row) both kernels share.

constexpr int kTcRows = 64;  // query rows per block: 16 per warp
constexpr int kTcWarps = 4;

// DP: D rounded up to 64, 128 or 256. BN keys per tile; shared rows padded by 16 bytes so the
// eight 16-byte rows an ldmatrix reads fall in distinct banks. BN = 32 from DP = 128 keeps the
// block's shared memory near 50 KB (3 blocks per SM on an A100, 4 on an H100) and the S tile small
// beside the DP / 2 fp32 O registers per thread.
template <int DP>
struct TcCfg {
  static constexpr int kBN = DP >= 128 ? 32 : 64;
  static constexpr int kLd = DP + 8;                                         // elements per smem row
  static constexpr size_t kSmem = static_cast<size_t>(kTcRows + 4 * kBN) * kLd * 2;  // Q, 2 x (K, V)
};

// 8 elements (16 bytes) of a row into shared memory, zero past n_valid: cp.async when aligned.
template <typename T>
__device__ __forceinline__ void load8(T* dst, const T* src, int n_valid, bool vec) {
  if (vec) {
    tc::cp_async16(dst, src, n_valid > 0);
  } else {
    for (int e = 0; e < 8; ++e) dst[e] = e < n_valid ? src[e] : T(0.f);
  }
}

// Paged: K/V in pages (tree_attention_paged), rows addressed through kv_off. Inv: see above.
template <typename scalar_t, int DP, bool Paged, bool Inv>
__global__ void __launch_bounds__(kTcWarps * 32) tree_attention_tc_kernel(Args a) {
  constexpr int BN = TcCfg<DP>::kBN, LD = TcCfg<DP>::kLd, kChunks = DP / 8;
  // (extern __shared__ arrays of one translation unit must not share a name with another type)
  SPECOPS_DYNAMIC_SMEM(unsigned char, tc_smem);
  scalar_t* qs = reinterpret_cast<scalar_t*>(tc_smem);  // [64][LD]
  scalar_t* ks = qs + kTcRows * LD;   // [2][BN][LD]
  scalar_t* vs = ks + 2 * BN * LD;    // [2][BN][LD]
  int32_t* anc = reinterpret_cast<int32_t*>(tc_smem + TcCfg<DP>::kSmem);  // Inv: visible block keys
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int b = blockIdx.y / a.Hkv, g = blockIdx.y % a.Hkv, split = blockIdx.z;
  const ta::SeqLens sl = ta::clamp_lens(a.prefix[b], a.block[b], a.q_lens ? a.q_lens[b] : a.Tq, a.S, a.W, a.Tq);
  const bool vec = a.vec != 0;
  const scalar_t* q = static_cast<const scalar_t*>(a.q);
  const scalar_t* kb = static_cast<const scalar_t*>(a.k) + b * a.sk_b + g * a.sk_h;
  const scalar_t* vb = static_cast<const scalar_t*>(a.v) + b * a.sv_b + g * a.sv_h;
  const int32_t* table_row = Paged ? a.pages + b * a.s_pages : nullptr;

  for (int c = tid; c < kTcRows * kChunks; c += blockDim.x) {  // Q rows; zeros for padding rows/dims
    const int r = c / kChunks, d = (c % kChunks) * 8;
    int i, h;
    tile_row<Inv>(a, kTcRows, g, r, &i, &h);
    const int n = i < sl.queries ? min(8, a.D - d) : 0;
    load8(qs + r * LD + d, n > 0 ? q + b * a.sq_b + i * a.sq_t + h * a.sq_h + d : q, n, vec);
  }
  int32_t vlen = 0;  // Inv: the virtual sequence's length
  if constexpr (Inv) {
    int i0, h0;
    tile_row<Inv>(a, kTcRows, g, 0, &i0, &h0);
    vlen = virtual_length(a, b, i0, sl, anc);
    __syncthreads();  // anc is complete before the first tile's rows are looked up
  }
  auto load_kv = [&](int32_t t, int buf) {  // tile t's keys; zero rows past its length
    const ta::KvTile kt = walk_tile<Inv>(sl, vlen, t, BN);
    for (int c = tid; c < BN * kChunks; c += blockDim.x) {
      const int n = c / kChunks, d = (c % kChunks) * 8, valid = n < kt.len ? min(8, a.D - d) : 0;
      const int64_t row = !Inv || valid > 0 ? walk_row<Inv>(sl, anc, kt, n) : 0;  // (Inv: anc ends at vlen)
      const scalar_t* kr = valid > 0 ? kb + kv_off<Paged, false>(a, table_row, row) + d : kb;
      const scalar_t* vr = valid > 0 ? vb + kv_off<Paged, true>(a, table_row, row) + d : vb;
      load8(ks + (buf * BN + n) * LD + d, kr, valid, vec);
      load8(vs + (buf * BN + n) * LD + d, vr, valid, vec);
    }
  };

  // This lane's two rows of the warp's 16 (C-fragment rows gid and gid + 8): their queries.
  int qi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int hq;
    tile_row<Inv>(a, kTcRows, g, warp * 16 + gid + 8 * h, &qi[h], &hq);
  }
  float o[DP / 8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  int32_t t0, t1;
  ta::split_range(walk_tiles<Inv>(sl, vlen, BN), a.n_splits, split, &t0, &t1);
  if (t0 < t1) load_kv(t0, 0);
  tc::cp_async_commit();
  for (int32_t t = t0; t < t1; ++t) {
    const int buf = (t - t0) & 1;
    if (t + 1 < t1) load_kv(t + 1, buf ^ 1);  // its buffer was released by the last barrier
    tc::cp_async_commit();
    tc::cp_async_wait<1>();  // Q and tile t have landed (this thread's copies)
    __syncthreads();         // ... and everyone's
    const ta::KvTile kt = walk_tile<Inv>(sl, vlen, t, BN);
    const scalar_t* kt_s = ks + buf * BN * LD;
    const scalar_t* vt_s = vs + buf * BN * LD;

    float s[BN / 8][4] = {};  // S = Q K^T: 16 rows x BN keys
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t af[4];
      tc::ldsm_x4(af, qs + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nb = 0; nb < BN / 8; nb += 2) {
        uint32_t kf[4];  // keys nb*8.. (dims kk*16.., +8), keys nb*8+8.. (same dims)
        tc::ldsm_x4(kf, kt_s + (nb * 8 + (lane / 16) * 8 + lane % 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
        const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
        tc::mma16816<scalar_t>(s[nb], af, b0);
        tc::mma16816<scalar_t>(s[nb + 1], af, b1);
      }
    }
    // Visibility: key n of the tile for each of the lane's rows (bit n of `bits`).
    uint64_t bits[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (kt.j0 < 0) {
        bits[h] = kt.len >= 64 ? ~0ull : ((1ull << kt.len) - 1);
      } else if (qi[h] < sl.queries) {
        const int32_t* mrow = a.mask + (static_cast<int64_t>(b) * a.Tq + qi[h]) * a.W;
        bits[h] = ta::mask_bits32(mrow, a.W, kt.j0, sl.block);
        if (BN > 32) bits[h] |= static_cast<uint64_t>(ta::mask_bits32(mrow, a.W, kt.j0 + 32, sl.block)) << 32;
      } else {
        bits[h] = 0;
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, n = nb * 8 + 2 * tig + (e & 1);
        s[nb][e] = ((bits[h] >> n) & 1ull) ? s[nb][e] * a.scale_log2 : -INFINITY;
        mx[h] = fmaxf(mx[h], s[nb][e]);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the row's 4 lanes (a quad) hold its BN scores
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
      const float m_new = fmaxf(m_run[h], mx[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // finite even for rows that saw nothing
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];  // per-lane partial sums, reduced over the quad at the end
    }
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = exp2f(s[nb][e] - m_use[e / 2]);  // -inf -> 0
        l_run[e / 2] += s[nb][e];
      }
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nb][e] *= alpha[e / 2];
    // O += P V, P from the S registers: the C fragments of keys 16kk.. and 16kk+8.. are the A
    // fragment of keys 16kk..16kk+15.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pf[4] = {tc::pack2<scalar_t>(s[2 * kk][0], s[2 * kk][1]),
                              tc::pack2<scalar_t>(s[2 * kk][2], s[2 * kk][3]),
                              tc::pack2<scalar_t>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              tc::pack2<scalar_t>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nb = 0; nb < DP / 8; nb += 2) {
        uint32_t vf[4];  // keys 16kk.. and 16kk+8.. of dims nb*8.., then of dims nb*8+8..
        tc::ldsm_x4_trans(vf, vt_s + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * LD + nb * 8 + (lane / 16) * 8);
        const uint32_t b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
        tc::mma16816<scalar_t>(o[nb], pf, b0);
        tc::mma16816<scalar_t>(o[nb + 1], pf, b1);
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before it is refilled
  }
  // A split with no tiles committed its Q copies and never waited: none may be in flight when the
  // block exits (the next block on this SM reuses the shared memory).
  tc::cp_async_wait<0>();

  scalar_t* out = static_cast<scalar_t*>(a.out);
  const int64_t rows = static_cast<int64_t>(a.B) * a.Tq * a.Hq;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(kFull, l, 1);
    l += __shfl_xor_sync(kFull, l, 2);
    const int i = qi[h];
    int i_again, hq;  // the row's head, recomputed: no register holds it through the key loop
    tile_row<Inv>(a, kTcRows, g, warp * 16 + gid + 8 * h, &i_again, &hq);
    if (i >= a.Tq) continue;
    const bool valid = i < sl.queries && l > 0.f;
    const float inv = valid ? 1.f / l : 0.f;
    const int64_t row = (static_cast<int64_t>(b) * a.Tq + i) * a.Hq + hq;
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = nb * 8 + 2 * tig + e;
        if (d >= a.D) continue;
        const float v = o[nb][2 * h + e] * inv;
        if (a.n_splits == 1) out[row * a.D + d] = static_cast<scalar_t>(v);
        else a.part_o[(split * rows + row) * a.D + d] = v;
      }
    if (a.n_splits > 1 && tig == 0) a.part_lse[split * rows + row] = valid ? ta::lse2(m_run[h], l) : -INFINITY;
  }
}
