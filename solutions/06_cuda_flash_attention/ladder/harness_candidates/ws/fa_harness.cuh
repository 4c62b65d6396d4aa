// CANDIDATE harness, not the exercise's (measured, not adopted): the exercise's four functions under a
// producer warp + softmax overlap: 0.62-0.73x FA2 with the solution's functions, against 0.79-0.90x for
// fa_harness.cuh (benchmarks/results/2026-11-22_h100_step06_v5_variants.json, rows solution_ws, solution_v4).
// Built as in ladder/v5_variants.py's docstring; kept so that the measurement can be repeated.
// fa_harness.cuh: the kernel and the launcher of exercise 06. Given to you: do not edit.
// It calls the four device functions you write in student_kernel.cu:
//   load_tile_async        the pipeline: one K/V (or Q) tile, global -> shared, with cp.async
//   qk_tile                S = Q_i K_j^T on tensor cores (ldmatrix + mma.sync)
//   online_softmax_update  m_i, l_i, the rescale of O_i, and P = exp(S - m_i) in registers
//   pv_tile                O_i += P V_j on tensor cores, P straight from registers
//
// One CTA computes BLOCK_M = 112 rows of O for one (batch, query head) with 8 warps: warps 0..6
// (consumers) own 16 rows each; warp 7 (the producer) only copies K_j and V_j (BLOCK_N = 64 keys)
// into a 3-stage ring in shared memory. mbarriers hand each stage over: full (the copies landed)
// and empty (every consumer is done reading). A consumer computes S_{j+1} = Q_i K_{j+1}^T before
// the softmax of tile j, so the tensor cores have work while the softmax runs (FlashAttention-3's
// two ideas, on mma.sync). 8 warps, not 9: registers are split between the 4 sub-partitions of an
// SM, so a 9th warp would cut every warp's registers from 255 to 168.
#pragma once

namespace fa {
constexpr int NCONSUMERS = 7;
constexpr int BLOCK_M = NCONSUMERS * 16;
constexpr int BLOCK_N = 64;
constexpr int NTHREADS = (NCONSUMERS + 1) * 32;
constexpr int STAGES = 3;

template <typename T, int D>
constexpr int smem_bytes() { return (BLOCK_M + 2 * STAGES * BLOCK_N) * D * (int)sizeof(T) + 4 * STAGES * 8; }

// ---- mbarrier: a shared-memory counter with a phase bit (sm_80+) ----------------------------------
FA_DEVICE void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
FA_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
FA_DEVICE void cp_async_mbar_arrive(uint64_t* bar) {  // arrives when this thread's cp.asyncs have landed
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
FA_DEVICE void mbar_wait(uint64_t* bar, int parity) {  // until the phase of this parity has completed
  uint32_t done;
  do {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
  } while (!done);
  __syncwarp();
}

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
__global__ void __launch_bounds__(NTHREADS, 1) fa_forward_kernel(const FaParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);   // [BLOCK_M][D], swizzled
  T* sK = sQ + BLOCK_M * D;                 // [STAGES][BLOCK_N][D]
  T* sV = sK + STAGES * BLOCK_N * D;        // [STAGES][BLOCK_N][D]
  uint64_t* full_k = reinterpret_cast<uint64_t*>(sV + STAGES * BLOCK_N * D);
  uint64_t* full_v = full_k + STAGES;
  uint64_t* empty_k = full_v + STAGES;
  uint64_t* empty_v = empty_k + STAGES;

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
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k + s, 32);                    // the producer's 32 lanes
      mbar_init(full_v + s, 32);
      mbar_init(empty_k + s, NCONSUMERS * 32);      // every consumer thread
      mbar_init(empty_v + s, NCONSUMERS * 32);
    }
  }
  __syncthreads();

  if (warp == NCONSUMERS) {                         // ---- the producer warp
    for (int j = 0; j < Tc; ++j) {
      const int s = j % STAGES, n0 = j * BLOCK_N, parity = (j / STAGES + 1) & 1;
      if (j >= STAGES) mbar_wait(empty_k + s, parity);     // consumers released K of this stage
      load_tile_async<BLOCK_N, D, 32>(sK + s * BLOCK_N * D, K + (int64_t)n0 * p.k_ss, p.k_ss, p.Skv - n0, lane);
      cp_async_mbar_arrive(full_k + s);
      if (j >= STAGES) mbar_wait(empty_v + s, parity);
      load_tile_async<BLOCK_N, D, 32>(sV + s * BLOCK_N * D, V + (int64_t)n0 * p.v_ss, p.v_ss, p.Skv - n0, lane);
      cp_async_mbar_arrive(full_v + s);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;                                         // no CTA-wide barrier follows
  }

  // ---- the consumer warps
  const float scale_log2 = p.scale * FA_LOG2E;      // exp(x * scale) = exp2(x * scale * log2 e)
  float o[D / 8][4];                                // O_i: this warp's 16 rows x D, C fragments
  float m_i[2] = {-INFINITY, -INFINITY};            // rows g and g + 8, in log2 units
  float l_i[2] = {0.f, 0.f};                        // per-lane partial row sums
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

  if (Tc > 0) {
    // Q_i: each consumer warp copies its own 16 rows (32 threads), then keeps them in registers
    load_tile_async<16, D, 32>(sQ + warp * 16 * D, Q + (int64_t)warp * 16 * p.q_ss, p.q_ss, p.Sq - m0 - warp * 16, lane);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    uint32_t q_frag[D / 16][4];                     // Q_i stays in registers: A fragments
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      int row = warp * 16 + (lane & 15), col = kk * 16 + (lane >> 4) * 8;
      ldmatrix_x4(q_frag[kk], smem_addr(sQ + swizzle<D>(row, col)));
    }

    const int row_g = m0 + warp * 16 + lane / 4;
    float s[BLOCK_N / 8][4], s_next[BLOCK_N / 8][4];
    mbar_wait(full_k, 0);
    qk_tile<D, BLOCK_N, T>(s, q_frag, sK, lane);                              // S_0 = Q_i K_0^T
    mbar_arrive(empty_k);
    for (int j = 0; j < Tc; ++j) {
      const int stage = j % STAGES, n0 = j * BLOCK_N, nxt = (j + 1) % STAGES;
      const bool needs_mask = (n0 + BLOCK_N > p.Skv) || (p.causal && n0 + BLOCK_N - 1 > m0 + diag);
      if (needs_mask) apply_mask(s, row_g, n0, p.Skv, diag, p.causal, lane);
      if (j + 1 < Tc) {
        mbar_wait(full_k + nxt, ((j + 1) / STAGES) & 1);
        // one branch-free block: the MMAs of S_{j+1} = Q_i K_{j+1}^T do not depend on the softmax
        // of tile j, so the scheduler interleaves them with its FMUL/MUFU work
        qk_tile<D, BLOCK_N, T>(s_next, q_frag, sK + nxt * BLOCK_N * D, lane);
        online_softmax_update<BLOCK_N / 8, D / 8>(s, m_i, l_i, o, scale_log2);  // P = exp(S - m_i)
        mbar_arrive(empty_k + nxt);
      } else {
        online_softmax_update<BLOCK_N / 8, D / 8>(s, m_i, l_i, o, scale_log2);
      }
      mbar_wait(full_v + stage, (j / STAGES) & 1);
      pv_tile<D, BLOCK_N, T>(o, s, sV + stage * BLOCK_N * D, lane);            // O_i += P V_j
      mbar_arrive(empty_v + stage);
#pragma unroll
      for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = s_next[n][e];
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
