// fa_harness.cuh: the kernel and the launcher of exercise 06. Given to you: do not edit.
// It calls the four device functions you write in student_kernel.cu:
//   load_tile_async        the pipeline: one K/V (or Q) tile, global -> shared, with cp.async
//   qk_tile                S = Q_i K_j^T on tensor cores (ldmatrix + mma.sync)
//   online_softmax_update  m_i, l_i, the rescale of O_i, and P = exp(S - m_i) in registers
//   pv_tile                O_i += P V_j on tensor cores, P straight from registers
//
// One CTA computes BLOCK_M = 128 rows of O for one (batch, query head); NWARPS = 8 warps own 16
// rows each. K_j and V_j (BLOCK_N = 64 keys) go through a 2-stage cp.async ring in shared memory.
#pragma once

// FA_HARNESS_WARPS / FA_HARNESS_MIN_BLOCKS exist for the course's own measurements only
// (ladder/v5_variants.py: 4 warps, 2 CTAs per SM measured no faster); leave them unset.
#ifndef FA_HARNESS_WARPS
#define FA_HARNESS_WARPS 8
#endif
#ifdef FA_HARNESS_MIN_BLOCKS
#define FA_HARNESS_BOUNDS(threads) __launch_bounds__(threads, FA_HARNESS_MIN_BLOCKS)
#else
#define FA_HARNESS_BOUNDS(threads) __launch_bounds__(threads)
#endif

namespace fa {
constexpr int NWARPS = FA_HARNESS_WARPS;
constexpr int BLOCK_M = 16 * NWARPS;
constexpr int BLOCK_N = 64;
constexpr int NTHREADS = NWARPS * 32;
constexpr int STAGES = 2;

template <typename T, int D>
constexpr int smem_bytes() { return (BLOCK_M + 2 * STAGES * BLOCK_N) * D * (int)sizeof(T); }

// Keys that query `row` may not see get -inf: past the end (col >= Skv) or, when causal,
// past the bottom-right diagonal (col > row + Skv - Sq).
template <int NB>
FA_DEVICE void apply_mask(float (&s)[NB][4], int row_g, int n0, int Skv, int diag, bool causal, int lane) {
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int col = n0 + n * 8 + 2 * (lane & 3) + (e & 1);
      int row = row_g + (e >> 1) * 8;
      if (col >= Skv || (causal && col > row + diag)) s[n][e] = -INFINITY;
    }
}

template <typename T, int D>
__global__ void FA_HARNESS_BOUNDS(NTHREADS) fa_forward_kernel(const FaParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);   // [BLOCK_M][D], swizzled
  T* sK = sQ + BLOCK_M * D;                 // [STAGES][BLOCK_N][D]
  T* sV = sK + STAGES * BLOCK_N * D;        // [STAGES][BLOCK_N][D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_block = gridDim.x - 1 - blockIdx.x;   // longest causal rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = h / (p.Hq / p.Hkv);              // GQA: query head h reads KV head h // group
  const int m0 = m_block * BLOCK_M;
  const int diag = p.Skv - p.Sq;                    // bottom-right causal offset

  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)m0 * p.q_ss;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;

  // Tc: key tiles this row block needs (causal: none past the diagonal of its last row)
  int Tc = (p.Skv + BLOCK_N - 1) / BLOCK_N;
  if (p.causal) {
    int last_key = m0 + BLOCK_M - 1 + diag;
    Tc = last_key < 0 ? 0 : min(Tc, last_key / BLOCK_N + 1);
  }
  const float scale_log2 = p.scale * FA_LOG2E;      // exp(x * scale) = exp2(x * scale * log2 e)

  float o[D / 8][4];                                // O_i: this warp's 16 rows x D, C fragments
  float m_i[2] = {-INFINITY, -INFINITY};            // rows g and g + 8, in log2 units
  float l_i[2] = {0.f, 0.f};                        // per-lane partial row sums
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

  if (Tc > 0) {
    load_tile_async<BLOCK_M, D, NTHREADS>(sQ, Q, p.q_ss, p.Sq - m0, tid);
    cp_async_commit();
    load_tile_async<BLOCK_N, D, NTHREADS>(sK, K, p.k_ss, p.Skv, tid);
    load_tile_async<BLOCK_N, D, NTHREADS>(sV, V, p.v_ss, p.Skv, tid);
    cp_async_commit();
    cp_async_wait<1>();                             // Q_i has landed (K_0, V_0 may still fly)
    __syncthreads();

    uint32_t q_frag[D / 16][4];                     // Q_i stays in registers: A fragments
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      int row = warp * 16 + (lane & 15), col = kk * 16 + (lane >> 4) * 8;
      ldmatrix_x4(q_frag[kk], smem_addr(sQ + swizzle<D>(row, col)));
    }

    const int row_g = m0 + warp * 16 + lane / 4;
    for (int j = 0; j < Tc; ++j) {
      const int stage = j % STAGES;
      if (j + 1 < Tc) {                             // prefetch K_{j+1}, V_{j+1} into the other stage
        const int n1 = (j + 1) * BLOCK_N, nxt = (j + 1) % STAGES;
        load_tile_async<BLOCK_N, D, NTHREADS>(sK + nxt * BLOCK_N * D, K + (int64_t)n1 * p.k_ss, p.k_ss, p.Skv - n1, tid);
        load_tile_async<BLOCK_N, D, NTHREADS>(sV + nxt * BLOCK_N * D, V + (int64_t)n1 * p.v_ss, p.v_ss, p.Skv - n1, tid);
        cp_async_commit();
        cp_async_wait<1>();                         // K_j, V_j have landed
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();

      const int n0 = j * BLOCK_N;
      float s[BLOCK_N / 8][4];
      qk_tile<D, BLOCK_N, T>(s, q_frag, sK + stage * BLOCK_N * D, lane);    // S = Q_i K_j^T
      const bool needs_mask = (n0 + BLOCK_N > p.Skv) || (p.causal && n0 + BLOCK_N - 1 > m0 + diag);
      if (needs_mask) apply_mask(s, row_g, n0, p.Skv, diag, p.causal, lane);
      online_softmax_update<BLOCK_N / 8, D / 8>(s, m_i, l_i, o, scale_log2);  // P = exp(S - m_i)
      pv_tile<D, BLOCK_N, T>(o, s, sV + stage * BLOCK_N * D, lane);           // O_i += P V_j
      __syncthreads();                              // everyone is done with this stage
    }
  }

  // Epilogue: O_i = O_i / l_i, lse_i = m_i + log l_i; a row with no visible key: O = 0, lse = -inf
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
  float* lse = p.lse + ((int64_t)b * p.Hq + h) * p.Sq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + warp * 16 + lane / 4 + r * 8;
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

template <typename T, int D>
int launch(const FaParams& p, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;
  constexpr int smem = smem_bytes<T, D>();
  auto kernel = fa_forward_kernel<T, D>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return (int)err;
  dim3 grid((p.Sq + BLOCK_M - 1) / BLOCK_M, p.Hq, p.B);
  kernel<<<grid, NTHREADS, smem, stream>>>(p);
  return (int)cudaGetLastError();
}
}  // namespace fa

extern "C" int fa_launch(const FaParams* p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->D == 64) return p->is_bf16 ? fa::launch<__nv_bfloat16, 64>(*p, s) : fa::launch<__half, 64>(*p, s);
  if (p->D == 128) return p->is_bf16 ? fa::launch<__nv_bfloat16, 128>(*p, s) : fa::launch<__half, 128>(*p, s);
  return (int)cudaErrorInvalidValue;
}
