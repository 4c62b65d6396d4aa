// ladder/common.cuh: what the rungs v2..v6 share. The tile products and the online softmax are the
// exercise's (see student_kernel_solution.cu), here generic over the shared-memory layout:
//   RowMajor<D>: element (r, c) at r * D + c      (ldmatrix phases hit the same banks: conflicts)
//   Swizzled<D>: chunk c/8 of row r at (c/8) ^ (r % 8)                      (conflict-free)
#pragma once
#include "fa_primitives.cuh"

namespace ladder {

template <int D> struct RowMajor { static FA_DEVICE int at(int r, int c) { return r * D + c; } };
template <int D> struct Swizzled { static FA_DEVICE int at(int r, int c) { return swizzle<D>(r, c); } };

// Synchronous copy of a ROWS x D tile: 16-byte loads through registers, zero rows >= rows_valid.
template <int ROWS, int D, int NTHREADS, class L, typename T>
FA_DEVICE void load_tile_sync(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int tid) {
  constexpr int CHUNKS = D / 8;
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / NTHREADS; ++i) {
    const int idx = tid + i * NTHREADS, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < rows_valid) val = *reinterpret_cast<const uint4*>(gmem + r * row_stride + c);
    *reinterpret_cast<uint4*>(smem + L::at(r, c)) = val;
  }
}

// The same tile with cp.async (no register round trip; zero-filled past rows_valid).
template <int ROWS, int D, int NTHREADS, class L, typename T>
FA_DEVICE void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int tid) {
  constexpr int CHUNKS = D / 8;
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / NTHREADS; ++i) {
    const int idx = tid + i * NTHREADS, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
    const bool valid = r < rows_valid;
    cp_async_16(smem_addr(smem + L::at(r, c)), valid ? gmem + r * row_stride + c : gmem, valid);
  }
}

// Q rows [16 w, 16 w + 16) of the tile -> A fragments, one per 16 columns.
template <int D, class L, typename T>
FA_DEVICE void load_q_frag(uint32_t (&qf)[D / 16][4], const T* sQ, int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], smem_addr(sQ + L::at(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8)));
}

// S = Q_i K_j^T (16 rows x BLOCK_N keys)
template <int D, int BLOCK_N, class L, typename T>
FA_DEVICE void qk_tile(float (&s)[BLOCK_N / 8][4], const uint32_t (&qf)[D / 16][4], const T* sK, int lane) {
#pragma unroll
  for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int np = 0; np < BLOCK_N / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, smem_addr(sK + L::at(np * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8)));
      mma_16816<T>(s[2 * np], qf[kk], b[0], b[1]);
      mma_16816<T>(s[2 * np + 1], qf[kk], b[2], b[3]);
    }
}

// O_i += P V_j, P from registers (C fragments of S = A fragments of P)
template <int D, int BLOCK_N, class L, typename T>
FA_DEVICE void pv_tile(float (&o)[D / 8][4], const float (&p)[BLOCK_N / 8][4], const T* sV, int lane) {
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                           pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_addr(sV + L::at(kk * 16 + (lane & 15), dp * 16 + (lane >> 4) * 8)));
      mma_16816<T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// m_i, l_i (per-lane partial), O_i *= alpha, S -> P = exp2(S * scale_log2 - m_i)
template <int NB, int DB>
FA_DEVICE void online_softmax_update(float (&s)[NB][4], float (&m_i)[2], float (&l_i)[2], float (&o)[DB][4],
                                     float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NB; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    const float m_new = fmaxf(m_i[r], quad_max(mx) * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m_i[r] - m_use);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      s[n][2 * r] = exp2f(fmaf(s[n][2 * r], scale_log2, -m_use));
      s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], scale_log2, -m_use));
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l_i[r] = alpha * l_i[r] + sum;
    m_i[r] = m_new;
#pragma unroll
    for (int d = 0; d < DB; ++d) { o[d][2 * r] *= alpha; o[d][2 * r + 1] *= alpha; }
  }
}

template <int NB>
FA_DEVICE void apply_mask(float (&s)[NB][4], int row_g, int n0, int Skv, int diag, bool causal, int lane) {
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n0 + n * 8 + 2 * (lane & 3) + (e & 1), row = row_g + (e >> 1) * 8;
      if (col >= Skv || (causal && col > row + diag)) s[n][e] = -INFINITY;
    }
}

// Key tiles a row block [m0, m0 + BLOCK_M) needs: causal tiles past the last row's diagonal are skipped.
FA_DEVICE int num_key_tiles(const FaParams& p, int m0, int BLOCK_M, int BLOCK_N) {
  int Tc = (p.Skv + BLOCK_N - 1) / BLOCK_N;
  if (p.causal) {
    const int last_key = m0 + BLOCK_M - 1 + p.Skv - p.Sq;
    Tc = last_key < 0 ? 0 : min(Tc, last_key / BLOCK_N + 1);
  }
  return Tc;
}

// O_i / l_i and lse_i for this warp's rows g and g + 8 (empty rows: 0 and -inf)
template <int D, typename T>
FA_DEVICE void store_output(const FaParams& p, int b, int h, int row0, const float (&o)[D / 8][4], const float (&m_i)[2],
                            const float (&l_i)[2], int lane) {
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
  float* lse = p.lse + ((int64_t)b * p.Hq + h) * p.Sq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + lane / 4 + 8 * r;
    const float l = quad_sum(l_i[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row < p.Sq) {
      T* out = O + (int64_t)row * p.o_ss + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t*>(out + d * 8) = pack2<T>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
      if ((lane & 3) == 0) lse[row] = l > 0.f ? (m_i[r] + log2f(l)) * FA_LN2 : -INFINITY;
    }
  }
}

// fa_launch for a kernel template K<T, D>(FaParams) with `threads` threads and `smem(D, sizeof T)` bytes
#define LADDER_DEFINE_LAUNCH(KERNEL, BLOCK_M, THREADS, SMEM_BYTES)                                            \
  template <typename T, int D>                                                                                 \
  static int ladder_launch(const FaParams& p, cudaStream_t stream) {                                           \
    if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;                                                          \
    constexpr int smem = SMEM_BYTES;                                                                           \
    auto kernel = KERNEL<T, D>;                                                                                \
    if (smem > 48 * 1024) {                                                                                    \
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);         \
      if (e != cudaSuccess) return (int)e;                                                                     \
    }                                                                                                          \
    dim3 grid((p.Sq + (BLOCK_M) - 1) / (BLOCK_M), p.Hq, p.B);                                                  \
    kernel<<<grid, THREADS, smem, stream>>>(p);                                                                \
    return (int)cudaGetLastError();                                                                            \
  }                                                                                                            \
  extern "C" int fa_launch(const FaParams* p, void* stream) {                                                  \
    cudaStream_t s = static_cast<cudaStream_t>(stream);                                                        \
    if (p->D == 64) return p->is_bf16 ? ladder_launch<__nv_bfloat16, 64>(*p, s) : ladder_launch<__half, 64>(*p, s); \
    if (p->D == 128) return p->is_bf16 ? ladder_launch<__nv_bfloat16, 128>(*p, s) : ladder_launch<__half, 128>(*p, s); \
    return (int)cudaErrorInvalidValue;                                                                         \
  }

}  // namespace ladder
