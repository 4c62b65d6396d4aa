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
  // YOUR CODE HERE (about 9 lines)
  FA_TODO("load_tile_async");  // the stub's marker: delete this line when you write the body
  (void)smem; (void)gmem; (void)row_stride; (void)rows_valid; (void)tid;
}

// ---------------------------------------------------------------------------------------------
// 2. S = Q_i K_j^T for this warp's 16 query rows and BLOCK_N keys, fp32 accumulate.
//    q_frag[kk] is the A fragment of Q columns 16kk..16kk+15 (already in registers).
//    sK is the [BLOCK_N][D] swizzled tile of K_j. s[n] is the C fragment of keys 8n..8n+7.
//    B = K_j^T is "col" for mma: column n of B is row n of K, so ldmatrix WITHOUT .trans.
template <int D, int BLOCK_N, typename T>
FA_DEVICE void qk_tile(float (&s)[BLOCK_N / 8][4], const uint32_t (&q_frag)[D / 16][4], const T* sK, int lane) {
  // YOUR CODE HERE (about 11 lines)
  FA_TODO("qk_tile");  // the stub's marker: delete this line when you write the body
  for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  (void)q_frag; (void)sK; (void)lane;
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
  // YOUR CODE HERE (about 24 lines)
  FA_TODO("online_softmax_update");  // the stub's marker: delete this line when you write the body
  (void)s; (void)m_i; (void)l_i; (void)o; (void)scale_log2;
}

// ---------------------------------------------------------------------------------------------
// 4. O_i += P V_j. p is the output of online_softmax_update (C fragments of 8 keys each): the
//    C fragments of keys 16kk..16kk+7 and 16kk+8..16kk+15 together ARE the A fragment of P for
//    k-step kk (convert with pack2<T>). sV is the [BLOCK_N][D] swizzled tile of V_j: B = V_j is
//    row-major [key][d], so ldmatrix WITH .trans. o[d] is the C fragment of columns 8d..8d+7.
template <int D, int BLOCK_N, typename T>
FA_DEVICE void pv_tile(float (&o)[D / 8][4], const float (&p)[BLOCK_N / 8][4], const T* sV, int lane) {
  // YOUR CODE HERE (about 15 lines)
  FA_TODO("pv_tile");  // the stub's marker: delete this line when you write the body
  (void)o; (void)p; (void)sV; (void)lane;
}

#include "fa_harness.cuh"
