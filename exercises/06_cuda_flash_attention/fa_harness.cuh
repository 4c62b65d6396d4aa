// fa_harness.cuh: the kernel and the launcher of exercise 06. Given to you: do not edit.
// It calls the four device functions you write in student_kernel.cu:
//   load_tile_async        the pipeline: one K/V (or Q) tile, global -> shared, with cp.async
//   qk_tile                S = Q_i K_j^T on tensor cores (ldmatrix + mma.sync)
//   online_softmax_update  m_i, l_i, the rescale of O_i, and P = exp(S - m_i) in registers
//   pv_tile                O_i += P V_j on tensor cores, P straight from registers
//
// One CTA computes BLOCK_M = 128 rows of O for one (batch, query head); NWARPS = 8 warps own 16
// rows each. K_j and V_j (BLOCK_N = 64 keys) go through a 2-stage cp.async ring in shared memory.
//
// The course's ladder builds this same harness with other traits (ladder/v2_mma.cu, v3_cp_async.cu:
// fewer warps, synchronous loads, row-major tiles), and its v5/v6 kernel (ladder/harness.cuh) shares
// num_key_tiles, apply_mask and epilogue below, and calls your online_softmax_update's solution
// (v1, the scalar baseline: num_key_tiles, key_masked and row_lse). The exercise always uses
// ExerciseTraits.
#pragma once

// FA_HARNESS_WARPS / FA_HARNESS_MIN_BLOCKS exist for the course's own measurements only
// (ladder/v5_variants.py: 4 warps, 2 CTAs per SM measured no faster); leave them unset.
#ifndef FA_HARNESS_WARPS
#define FA_HARNESS_WARPS 8
#endif
#ifndef FA_HARNESS_MIN_BLOCKS
#define FA_HARNESS_MIN_BLOCKS 0
#endif

namespace fa {
// The exercise's kernel shape. (A ladder rung names its own traits in FA_HARNESS_TRAITS.)
struct ExerciseTraits {
  static constexpr int kWarps = FA_HARNESS_WARPS;       // 16 query rows per warp
  static constexpr int kStages = 2;                     // K/V stages in shared memory
  static constexpr bool kCpAsync = true;                // load_tile_async (else synchronous, 1 stage)
  static constexpr bool kSwizzle = true;                // XOR-swizzled tiles (see swizzle<D>)
  static constexpr int kMinBlocks = FA_HARNESS_MIN_BLOCKS;  // CTAs per SM for __launch_bounds__ (0: any)
};
#ifdef FA_HARNESS_TRAITS
using Traits = FA_HARNESS_TRAITS;
#else
using Traits = ExerciseTraits;
#endif
static_assert(Traits::kCpAsync ? Traits::kStages >= 2 : Traits::kStages == 1,
              "cp.async runs a ring of >= 2 stages; synchronous loads use one buffer");

constexpr int NWARPS = Traits::kWarps;
constexpr int BLOCK_M = 16 * NWARPS;
constexpr int BLOCK_N = 64;
constexpr int NTHREADS = NWARPS * 32;
constexpr int STAGES = Traits::kStages;

template <typename T, int D>
constexpr int smem_bytes() { return (BLOCK_M + 2 * STAGES * BLOCK_N) * D * (int)sizeof(T); }

// ---- device helpers (the ladder's kernels call these too) ------------------------------------------
// Tc: key tiles the row block [m0, m0 + block_m) needs (causal: none past the diagonal of its last row;
// diag = Skv - Sq, the bottom-right causal offset)
FA_DEVICE int num_key_tiles(const FaParams& p, int m0, int diag, int block_m, int block_n) {
  int Tc = (p.Skv + block_n - 1) / block_n;
  if (p.causal) {
    int last_key = m0 + block_m - 1 + diag;
    Tc = last_key < 0 ? 0 : min(Tc, last_key / block_n + 1);
  }
  return Tc;
}

// The mask: query `row` may not see key `key` when the key is past the end (key >= Skv) or, when
// causal, past the bottom-right diagonal (key > row + diag, diag = Skv - Sq).
FA_DEVICE bool key_masked(int key, int row, int Skv, int diag, bool causal) {
  return key >= Skv || (causal && key > row + diag);
}

// The mask on a warp's C fragments of S: keys the query may not see get -inf.
template <int NB>
FA_DEVICE void apply_mask(float (&s)[NB][4], int row_g, int n0, int Skv, int diag, bool causal, int lane) {
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int col = n0 + n * 8 + 2 * (lane & 3) + (e & 1);
      int row = row_g + (e >> 1) * 8;
      if (key_masked(col, row, Skv, diag, causal)) s[n][e] = -INFINITY;
    }
}

// lse of a row from its running max m (log2 units) and sum l: m + log l in natural log; -inf when the
// row saw no key (l = 0)
FA_DEVICE float row_lse(float m, float l) { return l > 0.f ? (m + log2f(l)) * FA_LN2 : -INFINITY; }

// Epilogue of a warp's 16 rows row0..row0+15: O_i = O_i / l_i, lse_i = m_i + log l_i (natural log);
// a row with no visible key: O = 0, lse = -inf.
template <int D, typename T>
FA_DEVICE void epilogue(const FaParams& p, int b, int h, int row0, const float (&o)[D / 8][4], const float (&m_i)[2],
                        const float (&l_i)[2], int lane) {
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
  float* lse = p.lse + ((int64_t)b * p.Hq + h) * p.Sq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + lane / 4 + r * 8;
    const float l = quad_sum(l_i[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row < p.Sq) {
      T* out = O + (int64_t)row * p.o_ss + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t*>(out + d * 8) = pack2<T>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
      if ((lane & 3) == 0) lse[row] = row_lse(m_i[r], l);
    }
  }
}

#ifndef FA_HARNESS_HELPERS_ONLY  // (ladder/harness.cuh and v1_scalar.cu take the helpers above, not this kernel)
// The ladder's v2 only (kCpAsync = false): the same tile as load_tile_async, through registers.
template <int ROWS, int D, int NTHREADS_, typename T>
FA_DEVICE void load_tile_sync(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int tid) {
  constexpr int CHUNKS = D / 8;
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / NTHREADS_; ++i) {
    const int idx = tid + i * NTHREADS_, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < rows_valid) val = *reinterpret_cast<const uint4*>(gmem + r * row_stride + c);
    *reinterpret_cast<uint4*>(smem + swizzle<D>(r, c)) = val;
  }
}

// ---- the kernel ------------------------------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(NTHREADS, Traits::kMinBlocks) fa_forward_kernel(const FaParams p) {
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

  const int Tc = num_key_tiles(p, m0, diag, BLOCK_M, BLOCK_N);   // key tiles this row block needs
  const float scale_log2 = p.scale * FA_LOG2E;      // exp(x * scale) = exp2(x * scale * log2 e)

  float o[D / 8][4];                                // O_i: this warp's 16 rows x D, C fragments
  float m_i[2] = {-INFINITY, -INFINITY};            // rows g and g + 8, in log2 units
  float l_i[2] = {0.f, 0.f};                        // per-lane partial row sums
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

  if (Tc > 0) {
    if constexpr (Traits::kCpAsync) {
      load_tile_async<BLOCK_M, D, NTHREADS>(sQ, Q, p.q_ss, p.Sq - m0, tid);
      cp_async_commit();
      load_tile_async<BLOCK_N, D, NTHREADS>(sK, K, p.k_ss, p.Skv, tid);
      load_tile_async<BLOCK_N, D, NTHREADS>(sV, V, p.v_ss, p.Skv, tid);
      cp_async_commit();
      cp_async_wait<1>();                           // Q_i has landed (K_0, V_0 may still fly)
    } else {
      load_tile_sync<BLOCK_M, D, NTHREADS>(sQ, Q, p.q_ss, p.Sq - m0, tid);
    }
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
      if constexpr (!Traits::kCpAsync) {            // one buffer: wait for the previous tile, load K_j, V_j
        const int n0 = j * BLOCK_N;
        __syncthreads();
        load_tile_sync<BLOCK_N, D, NTHREADS>(sK, K + (int64_t)n0 * p.k_ss, p.k_ss, p.Skv - n0, tid);
        load_tile_sync<BLOCK_N, D, NTHREADS>(sV, V + (int64_t)n0 * p.v_ss, p.v_ss, p.Skv - n0, tid);
      } else if (j + 1 < Tc) {                      // prefetch K_{j+1}, V_{j+1} into the other stage
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
      if constexpr (Traits::kCpAsync) __syncthreads();   // everyone is done with this stage
    }
  }

  epilogue<D, T>(p, b, h, m0 + warp * 16, o, m_i, l_i, lane);   // O_i / l_i, lse_i
}

// ---- the host wrapper --------------------------------------------------------------------------------
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
#endif  // FA_HARNESS_HELPERS_ONLY
}  // namespace fa

#ifndef FA_HARNESS_HELPERS_ONLY
extern "C" int fa_launch(const FaParams* p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->D == 64) return p->is_bf16 ? fa::launch<__nv_bfloat16, 64>(*p, s) : fa::launch<__half, 64>(*p, s);
  if (p->D == 128) return p->is_bf16 ? fa::launch<__nv_bfloat16, 128>(*p, s) : fa::launch<__half, 128>(*p, s);
  return (int)cudaErrorInvalidValue;
}
#endif
