// v1_scalar.cu: FlashAttention-2's loop in plain CUDA: K_j, V_j tiles in shared memory, one warp per
// query row at a time, dot products with warp shuffles, online softmax per tile; no tensor cores.
// verdict: correct and simple, CUDA-core bound; the baseline every later rung is compared with.
// figure: 8 TFLOP/s on large (0.03x SDPA FA2), H100, 2026-11-22 (benchmarks/ladder.py: benchmarks/results/2026-11-22_h100_step06_ladder.json)
#include "fa_primitives.cuh"
#define FA_HARNESS_HELPERS_ONLY  // fa::num_key_tiles, fa::key_masked, fa::row_lse (the exercise harness's)
#include "fa_harness.cuh"

namespace v1 {
constexpr int BLOCK_M = 16;   // rows per CTA (4 warps x 4 rows)
constexpr int BLOCK_N = 32;   // keys per tile: lane n holds the score of key n
constexpr int NWARPS = 4;
constexpr int ROWS = BLOCK_M / NWARPS;

FA_DEVICE float to_float(__half x) { return __half2float(x); }
FA_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> FA_DEVICE T from_float(float x);
template <> FA_DEVICE __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> FA_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

FA_DEVICE float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
FA_DEVICE float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

template <typename T, int D>
__global__ void __launch_bounds__(NWARPS * 32) kernel(const FaParams p) {
  __shared__ float sK[BLOCK_N][D], sV[BLOCK_N][D];
  constexpr int E = D / 32;                      // elements of a row each lane owns: d = lane + 32 e
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M, h = blockIdx.y, b = blockIdx.z;
  const int h_kv = h / (p.Hq / p.Hkv), diag = p.Skv - p.Sq;
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  const float scale_log2 = p.scale * FA_LOG2E;

  float q[ROWS][E], o[ROWS][E], m_i[ROWS], l_i[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = m0 + warp * ROWS + r;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[r][e] = row < p.Sq ? to_float(Q[(int64_t)row * p.q_ss + lane + 32 * e]) : 0.f;
      o[r][e] = 0.f;
    }
    m_i[r] = -INFINITY;
    l_i[r] = 0.f;
  }
  const int Tc = fa::num_key_tiles(p, m0, diag, BLOCK_M, BLOCK_N);
  for (int j = 0; j < Tc; ++j) {
    const int n0 = j * BLOCK_N;
    __syncthreads();
    for (int i = tid; i < BLOCK_N * D; i += NWARPS * 32) {   // K_j, V_j -> shared memory (fp32)
      const int n = i / D, d = i % D;
      const bool ok = n0 + n < p.Skv;
      sK[n][d] = ok ? to_float(K[(int64_t)(n0 + n) * p.k_ss + d]) : 0.f;
      sV[n][d] = ok ? to_float(V[(int64_t)(n0 + n) * p.v_ss + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = m0 + warp * ROWS + r;
      float s_mine = -INFINITY;                      // lane n: score of key n0 + n
      for (int n = 0; n < BLOCK_N; ++n) {
        float part = 0.f;                            // S = Q K^T, one dot product per key
#pragma unroll
        for (int e = 0; e < E; ++e) part += q[r][e] * sK[n][lane + 32 * e];
        const float s = warp_sum(part);
        const int key = n0 + n;
        const bool visible = !fa::key_masked(key, row, p.Skv, diag, p.causal);
        if (lane == n) s_mine = visible ? s * scale_log2 : -INFINITY;
      }
      // the online softmax of one row, from fa_primitives.cuh's scalar steps (as the tensor-core rungs')
      const float m_new = fa::EagerRescale::running_max(m_i[r], warp_max(s_mine));
      const float alpha = fa::rescale_factor(m_i[r], m_new);          // exp(m_old - m_new)
      const float pr = fa::exp2_approx(s_mine - fa::finite_max(m_new)); // P = exp(S - m_new)
      l_i[r] = alpha * l_i[r] + warp_sum(pr);
      m_i[r] = m_new;
#pragma unroll
      for (int e = 0; e < E; ++e) o[r][e] *= alpha;
      for (int n = 0; n < BLOCK_N; ++n) {            // O += P V
        const float pn = __shfl_sync(0xffffffffu, pr, n);
#pragma unroll
        for (int e = 0; e < E; ++e) o[r][e] += pn * sV[n][lane + 32 * e];
      }
    }
  }
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
  float* lse = p.lse + ((int64_t)b * p.Hq + h) * p.Sq;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = m0 + warp * ROWS + r;
    if (row >= p.Sq) continue;
    const float inv = l_i[r] > 0.f ? 1.f / l_i[r] : 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) O[(int64_t)row * p.o_ss + lane + 32 * e] = from_float<T>(o[r][e] * inv);
    if (lane == 0) lse[row] = fa::row_lse(m_i[r], l_i[r]);
  }
}

template <typename T, int D>
int launch(const FaParams& p, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;
  dim3 grid((p.Sq + BLOCK_M - 1) / BLOCK_M, p.Hq, p.B);
  kernel<T, D><<<grid, NWARPS * 32, 0, stream>>>(p);
  return (int)cudaGetLastError();
}
}  // namespace v1

extern "C" int fa_launch(const FaParams* p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->D == 64) return p->is_bf16 ? v1::launch<__nv_bfloat16, 64>(*p, s) : v1::launch<__half, 64>(*p, s);
  if (p->D == 128) return p->is_bf16 ? v1::launch<__nv_bfloat16, 128>(*p, s) : v1::launch<__half, 128>(*p, s);
  return (int)cudaErrorInvalidValue;
}
