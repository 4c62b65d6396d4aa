// v2_mma.cu: tensor cores. S = Q_i K_j^T and O_i += P V_j with mma.sync m16n8k16 fed by ldmatrix
// (.trans for V); the online softmax stays in registers (quad shuffles), P is the A operand.
// verdict: the big jump (tensor cores), but loads are synchronous and smem is row-major (conflicts).
// figure: 53 TFLOP/s on large (0.18x FA2), 6.6x v1; 0.15-0.19x FA2 over 4k-16k, H100 (benchmarks/results/2026-11-22_h100_step06.json)
#include "common.cuh"

namespace v2 {
using namespace ladder;
constexpr int BLOCK_M = 64, BLOCK_N = 64, NWARPS = 4, NTHREADS = NWARPS * 32;

template <typename T, int D>
__global__ void __launch_bounds__(NTHREADS) kernel(const FaParams p) {
  using L = RowMajor<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BLOCK_M * D;
  T* sV = sK + BLOCK_N * D;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M, h = blockIdx.y, b = blockIdx.z;
  const int h_kv = h / (p.Hq / p.Hkv), diag = p.Skv - p.Sq;
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)m0 * p.q_ss;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  const int Tc = num_key_tiles(p, m0, BLOCK_M, BLOCK_N);
  const float scale_log2 = p.scale * FA_LOG2E;

  float o[D / 8][4], m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  uint32_t qf[D / 16][4];
  if (Tc > 0) {
    load_tile_sync<BLOCK_M, D, NTHREADS, L>(sQ, Q, p.q_ss, p.Sq - m0, tid);
    __syncthreads();
    load_q_frag<D, L>(qf, sQ, warp, lane);
  }
  const int row_g = m0 + warp * 16 + lane / 4;
  for (int j = 0; j < Tc; ++j) {
    const int n0 = j * BLOCK_N;
    __syncthreads();                                            // previous tile fully consumed
    load_tile_sync<BLOCK_N, D, NTHREADS, L>(sK, K + (int64_t)n0 * p.k_ss, p.k_ss, p.Skv - n0, tid);
    load_tile_sync<BLOCK_N, D, NTHREADS, L>(sV, V + (int64_t)n0 * p.v_ss, p.v_ss, p.Skv - n0, tid);
    __syncthreads();
    float s[BLOCK_N / 8][4];
    qk_tile<D, BLOCK_N, L>(s, qf, sK, lane);                    // S = Q_i K_j^T
    if (n0 + BLOCK_N > p.Skv || (p.causal && n0 + BLOCK_N - 1 > m0 + diag))
      apply_mask(s, row_g, n0, p.Skv, diag, p.causal, lane);
    online_softmax_update<BLOCK_N / 8, D / 8>(s, m_i, l_i, o, scale_log2);
    pv_tile<D, BLOCK_N, L>(o, s, sV, lane);                     // O_i += P V_j
  }
  store_output<D, T>(p, b, h, m0 + warp * 16, o, m_i, l_i, lane);
}
}  // namespace v2

LADDER_DEFINE_LAUNCH(v2::kernel, v2::BLOCK_M, v2::NTHREADS, (v2::BLOCK_M + 2 * v2::BLOCK_N) * D * (int)sizeof(T))
