// student_kernel.cu: exercise 06, FlashAttention-2 forward on tensor cores (sm_80+).
//
// You write the four device functions below; fa_harness.cuh (included at the end) holds the kernel
// that calls them, in this order, for every key tile j of a row block i:
//
//     load_tile_async(K_j+1, V_j+1)                     # the pipeline: prefetch the next tile
//     s = qk_tile(Q_i, K_j)                             # S = Q_i K_j^T
//     online_softmax_update(s, m_i, l_i, o)             # m_i, l_i, O_i *= alpha, s becomes P
//     pv_tile(o, s, V_j)                                # O_i += P V_j
//
// Fragment layouts and the primitives you may call are in fa_primitives.cuh. Write the four
// function bodies (each says how long the solution is); keep the signatures and the includes.
#include "fa_primitives.cuh"

// ---------------------------------------------------------------------------------------------
// 1. The pipeline: copy a ROWS x D tile (row stride `row_stride` elements) from global to shared
//    memory with 16-byte cp.async copies, every thread of the CTA taking its share. Store it
//    XOR-swizzled (element (r, c) goes to smem[swizzle<D>(r, c)]). Rows r >= rows_valid must be
//    zero-filled and not read from global memory (cp_async_16's `valid` flag does both).
//    Do not commit or wait: the harness does.
template <int ROWS, int D, int NTHREADS, typename T>
FA_DEVICE void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int tid) {
  // BEGIN SOLUTION
  constexpr int CHUNKS = D / 8;  // 16-byte chunks in a row
  static_assert((ROWS * CHUNKS) % NTHREADS == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / NTHREADS; ++i) {
    const int idx = tid + i * NTHREADS;
    const int r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
    const bool valid = r < rows_valid;
    const T* src = valid ? gmem + r * row_stride + c : gmem;
    cp_async_16(smem_addr(smem + swizzle<D>(r, c)), src, valid);
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------------
// 2. S = Q_i K_j^T for this warp's 16 query rows and BLOCK_N keys, fp32 accumulate.
//    q_frag[kk] is the A fragment of Q columns 16kk..16kk+15 (already in registers).
//    sK is the [BLOCK_N][D] swizzled tile of K_j. s[n] is the C fragment of keys 8n..8n+7.
//    B = K_j^T is "col" for mma: column n of B is row n of K, so ldmatrix WITHOUT .trans.
template <int D, int BLOCK_N, typename T>
FA_DEVICE void qk_tile(float (&s)[BLOCK_N / 8][4], const uint32_t (&q_frag)[D / 16][4], const T* sK, int lane) {
  // BEGIN SOLUTION
#pragma unroll
  for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < BLOCK_N / 16; ++np) {
      // matrices 0..3: keys (0-7, 0-7, 8-15, 8-15) x columns (0-7, 8-15, 0-7, 8-15) of this 16x16 block
      const int row = np * 16 + (lane & 7) + (lane >> 4) * 8;
      const int col = kk * 16 + ((lane >> 3) & 1) * 8;
      uint32_t b[4];
      ldmatrix_x4(b, smem_addr(sK + swizzle<D>(row, col)));
      mma_16816<T>(s[2 * np], q_frag[kk], b[0], b[1]);
      mma_16816<T>(s[2 * np + 1], q_frag[kk], b[2], b[3]);
    }
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------------
// 3. The online-softmax update (FlashAttention-2, Algorithm 1, lines 8-10), in registers.
//    s: raw scores of this tile (masked keys are -inf); elements 0,1 of s[n] belong to row g,
//    elements 2,3 to row g + 8. m_i[r]: running max of row r in log2 units (scores * scale_log2).
//    l_i[r]: this lane's partial running sum (the harness adds the quad's four partials at the
//    end). On return s holds P = exp2(s * scale_log2 - m_i_new), and o is rescaled by
//    alpha = exp2(m_i_old - m_i_new). A row that has seen only -inf so far must stay NaN-free.
//    fa_primitives.cuh has the scalar steps (fa::exp2_approx, fa::finite_max, fa::rescale_factor).
//    Rescale: leave it be; the harness uses the default (the course's fastest rung passes another).
template <int NB, int DB, class Rescale = fa::EagerRescale>
FA_DEVICE void online_softmax_update(float (&s)[NB][4], float (&m_i)[2], float (&l_i)[2], float (&o)[DB][4],
                                     float scale_log2) {
  // BEGIN SOLUTION
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float row_max = -INFINITY;                       // m~_ij = rowmax(S_ij)
#pragma unroll
    for (int n = 0; n < NB; ++n) row_max = fmaxf(row_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    const float m_new = Rescale::running_max(m_i[r], quad_max(row_max) * scale_log2);  // max(m_i, m~_ij)
    const float m_use = fa::finite_max(m_new);       // all masked so far: avoid -inf - -inf
    alpha[r] = fa::rescale_factor(m_i[r], m_new);    // exp(m_old - m_new), 1 exactly when the max stays
    float row_sum = 0.f;
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      s[n][2 * r] = fa::exp2_approx(fmaf(s[n][2 * r], scale_log2, -m_use));       // P = exp(S - m_new)
      s[n][2 * r + 1] = fa::exp2_approx(fmaf(s[n][2 * r + 1], scale_log2, -m_use));
      row_sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l_i[r] = alpha[r] * l_i[r] + row_sum;                      // l = alpha l + rowsum(P)
    m_i[r] = m_new;
  }
  // O = alpha O (a lazy Rescale skips it when no row of the warp moved its max: one warp vote)
  if (!Rescale::kLazy || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int d = 0; d < DB; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------------
// 4. O_i += P V_j. p is the output of online_softmax_update (C fragments of 8 keys each): the
//    C fragments of keys 16kk..16kk+7 and 16kk+8..16kk+15 together ARE the A fragment of P for
//    k-step kk (convert with pack2<T>). sV is the [BLOCK_N][D] swizzled tile of V_j: B = V_j is
//    row-major [key][d], so ldmatrix WITH .trans. o[d] is the C fragment of columns 8d..8d+7.
template <int D, int BLOCK_N, typename T>
FA_DEVICE void pv_tile(float (&o)[D / 8][4], const float (&p)[BLOCK_N / 8][4], const T* sV, int lane) {
  // BEGIN SOLUTION
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
    uint32_t a[4];
    a[0] = pack2<T>(p[2 * kk][0], p[2 * kk][1]);          // row g,     keys 2t..2t+1
    a[1] = pack2<T>(p[2 * kk][2], p[2 * kk][3]);          // row g + 8, keys 2t..2t+1
    a[2] = pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);  // row g,     keys 2t+8..2t+9
    a[3] = pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);  // row g + 8, keys 2t+8..2t+9
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      // matrices 0..3: keys (0-7, 8-15, 0-7, 8-15) x columns (0-7, 0-7, 8-15, 8-15)
      const int row = kk * 16 + (lane & 15);
      const int col = dp * 16 + (lane >> 4) * 8;
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_addr(sV + swizzle<D>(row, col)));
      mma_16816<T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
  // END SOLUTION
}

#include "fa_harness.cuh"
