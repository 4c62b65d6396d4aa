// v3_cp_async.cu: a 2-stage cp.async pipeline: K_{j+1}, V_{j+1} stream into shared memory while the
// tensor cores work on K_j, V_j; BLOCK_M = 128 rows (8 warps x 16), Q_i kept in registers.
// verdict: hides global-memory latency; still row-major shared memory (ldmatrix bank conflicts).
// figure: 51 TFLOP/s on large (0.17x FA2): no gain over v2 while ldmatrix reads conflict, H100 (benchmarks/results/2026-11-22_h100_step06.json)
#include "common.cuh"

namespace v3 {
using namespace ladder;
constexpr int BLOCK_M = 128, BLOCK_N = 64, NWARPS = 8, NTHREADS = NWARPS * 32, STAGES = 2;

template <typename T, int D, class L>
__global__ void __launch_bounds__(NTHREADS) kernel_t(const FaParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BLOCK_M * D;                     // [STAGES][BLOCK_N][D]
  T* sV = sK + STAGES * BLOCK_N * D;
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
  if (Tc > 0) {
    load_tile_async<BLOCK_M, D, NTHREADS, L>(sQ, Q, p.q_ss, p.Sq - m0, tid);
    cp_async_commit();
    load_tile_async<BLOCK_N, D, NTHREADS, L>(sK, K, p.k_ss, p.Skv, tid);
    load_tile_async<BLOCK_N, D, NTHREADS, L>(sV, V, p.v_ss, p.Skv, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[D / 16][4];
    load_q_frag<D, L>(qf, sQ, warp, lane);
    const int row_g = m0 + warp * 16 + lane / 4;
    for (int j = 0; j < Tc; ++j) {
      const int st = j % STAGES;
      if (j + 1 < Tc) {                         // prefetch tile j + 1 into the other stage
        const int n1 = (j + 1) * BLOCK_N, nx = (j + 1) % STAGES;
        load_tile_async<BLOCK_N, D, NTHREADS, L>(sK + nx * BLOCK_N * D, K + (int64_t)n1 * p.k_ss, p.k_ss, p.Skv - n1, tid);
        load_tile_async<BLOCK_N, D, NTHREADS, L>(sV + nx * BLOCK_N * D, V + (int64_t)n1 * p.v_ss, p.v_ss, p.Skv - n1, tid);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int n0 = j * BLOCK_N;
      float s[BLOCK_N / 8][4];
      qk_tile<D, BLOCK_N, L>(s, qf, sK + st * BLOCK_N * D, lane);
      if (n0 + BLOCK_N > p.Skv || (p.causal && n0 + BLOCK_N - 1 > m0 + diag))
        apply_mask(s, row_g, n0, p.Skv, diag, p.causal, lane);
      online_softmax_update<BLOCK_N / 8, D / 8>(s, m_i, l_i, o, scale_log2);
      pv_tile<D, BLOCK_N, L>(o, s, sV + st * BLOCK_N * D, lane);
      __syncthreads();
    }
  }
  store_output<D, T>(p, b, h, m0 + warp * 16, o, m_i, l_i, lane);
}
template <typename T, int D> constexpr auto kernel = kernel_t<T, D, RowMajor<D>>;
}  // namespace v3
LADDER_DEFINE_LAUNCH(v3::kernel, v3::BLOCK_M, v3::NTHREADS, (v3::BLOCK_M + 4 * v3::BLOCK_N) * D * (int)sizeof(T))
