// ladder/harness.cuh: the kernel of the ladder's rungs v5 and v6: FlashAttention-2's loop on mma.sync
// and cp.async with FlashAttention-3's and -4's ideas as named switches (Shape below). A rung is a
// traits struct and `fa_launch` = ladder::launch<Traits>. The masking, the epilogue and the key-tile
// count are the exercise harness's (fa_harness.cuh: fa::apply_mask, fa::epilogue, fa::num_key_tiles),
// the online softmax the exercise's solution (student_kernel_solution.cu: online_softmax_update, with
// LazyRescale below as its Rescale where a rung asks for it), the PTX wrappers fa_primitives.cuh's.
// (The rungs v2..v4 are the exercise harness itself, with other traits; v1 is the scalar baseline.)
//
// What this kernel adds to the exercise's (v4), in the order the lecture takes them:
//  1. Producer/consumer warp specialization (FA3 section 3.1; kProducerWarp). Warp NC issues every
//     cp.async of K and V; warps 0..NC-1 only compute. A stage is handed over by two mbarriers: full[s]
//     (the producer's copies landed: `cp.async.mbarrier.arrive`) and empty[s] (every consumer thread
//     is done reading it). K and V have separate barriers, so QK^T of a tile can start before its
//     V has arrived. Nothing in the loop waits for the whole CTA, so consumer warps drift apart
//     and one warp's softmax runs while another's matrix products keep the tensor cores busy.
//     sm_80 has no setmaxnreg and registers are split over the SM's 4 sub-partitions: 8 warps get
//     255 registers each, 9 warps only 168. So v5 runs 7 consumer warps + 1 producer (BLOCK_M =
//     112), one CTA per SM.
//  2. Intra-warp overlap of softmax and the next QK^T (FA3 section 3.2; kOverlap). The loop body is
//         S_next = Q K_{j+1}^T ; P = softmax(S_cur) ; O += P V_j ; S_cur = S_next
//     S_next does not depend on the softmax, so ptxas interleaves its HMMAs with the softmax's
//     FMUL/MUFU in one basic block (the peeled loop keeps that block free of branches). Costs a
//     second S in registers, which is why v5's warps own 16 rows (Q_i stays in registers).
//  3. FA2's 32-row warp tiles (kMTiles = 2: every ldmatrix'd K/V fragment feeds 4 MMAs) and
//     FlashAttention-4's conditional rescale of O (kLazyRescale): v6.
// Kept from v4: XOR swizzle, P from registers, exp2 with the scale folded in, causal tile skipping
// with longest row blocks first, GQA by head index. New helpers: ldmatrix addresses with one XOR
// (LaneOffsets), copies without divisions (copy_tile).
#pragma once
#include <type_traits>

// The exercise's solution (its device functions; online_softmax_update is the one this kernel calls)
// and, at its end, fa_harness.cuh's helpers only (fa::num_key_tiles, fa::apply_mask, fa::epilogue):
// not the exercise's kernel.
#define FA_HARNESS_HELPERS_ONLY
#include "student_kernel_solution.cu"

namespace ladder {

// ---- mbarrier (sm_80+): a 64-bit shared-memory counter with a phase bit --------------------------
// init(count); every arrival decrements; at zero the phase completes (its parity flips) and the
// count is re-armed. wait(parity) returns once the phase with that parity has completed.
FA_DEVICE void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
FA_DEVICE void mbar_arrive(uint64_t* bar) {  // release: my earlier reads of the stage are done
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive once every cp.async this thread issued so far has landed (the copies stay asynchronous).
FA_DEVICE void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
FA_DEVICE void mbar_wait(uint64_t* bar, int parity) {  // acquire
  uint32_t done;
  do {
#if __CUDA_ARCH__ >= 900
    // sm_90: try_wait may suspend the thread until the phase completes (no busy spinning)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
  } while (!done);
}

// ---- the kernel's shape, from a rung's named traits ------------------------------------------------
// A rung's traits struct (v5_warp_specialized.cu, v6_fa2_tiles_lazy.cu) names:
//   kConsumerWarps   warps that compute, each owning kMTiles x 16 rows of O_i (BLOCK_M = 16 x both)
//   kMTiles          16-row m-tiles per warp (2: FA2's 32-row warp tiles; 1: Q_i fits in registers)
//   kBlockN          keys per K/V stage
//   kStages          stages in the K/V ring
//   kProducerWarp    one extra warp issues every K/V copy (else all warps load, FA2-style, after a
//                    __syncthreads, still completing on the full mbarriers)
//   kOverlap         S_{j+1} = Q K_{j+1}^T computed before the softmax of tile j
//   kQInRegisters    Q_i kept in registers (else ldmatrix from shared memory at every tile)
//   kLazyRescale     FlashAttention-4's conditional rescale (LazyRescale below)
//   kMinBlocks       CTAs per SM the register budget is cut for (__launch_bounds__)
template <class Traits>
struct Shape {
  static constexpr int NC = Traits::kConsumerWarps, MT = Traits::kMTiles, BLOCK_M = NC * MT * 16;
  static constexpr int BLOCK_N = Traits::kBlockN, STAGES = Traits::kStages;
  static constexpr bool PRODUCER = Traits::kProducerWarp, OVERLAP = Traits::kOverlap;
  static constexpr bool QREG = Traits::kQInRegisters, LAZY = Traits::kLazyRescale;
  static constexpr int MINB = Traits::kMinBlocks, NTHREADS = (NC + (PRODUCER ? 1 : 0)) * 32;
  template <typename T, int D>
  static constexpr int smem_bytes() {
    return (BLOCK_M + 2 * STAGES * BLOCK_N) * D * (int)sizeof(T) + 4 * STAGES * 8;
  }
};

// threadIdx.x read again (S2R). What is derived from it cannot be hoisted out of a loop (asm volatile):
// it is recomputed where it is used instead of held, or spilled, across the main loop (see Consumer).
FA_DEVICE int tid_again() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// FlashAttention-4's conditional rescale, as the Rescale of the exercise's online_softmax_update:
// keep the stale max unless the row max grew by more than a threshold (log2 units). O and l are
// scaled by the same stale max, so O / l is unchanged, and O is rescaled only when some row of the
// 16-row m-tile moved its max (a warp vote), which after the first tiles is rare. The threshold is
// 8 for fp16 (P <= 2^8; measured within the course's accuracy rule) and 0 for bf16: with 7 stored
// mantissa bits, a P_max of 2^delta rounds where exp2(0) = 1 would not, and mqa/bf16 failed the 2x-PyTorch
// rule with 8 (1.29x the allowance). With 0 the skip is exact: alpha == 1 exactly, nothing rounds.
template <typename T>
struct LazyRescale {
  static constexpr bool kLazy = true;
  static constexpr float kThreshold = std::is_same<T, __half>::value ? 8.f : 0.f;
  static FA_DEVICE float running_max(float m_old, float tile_max) {
    const float m_new = fa::EagerRescale::running_max(m_old, tile_max);   // m_i' = max(m_i, rowmax S)
    return m_new - m_old > kThreshold ? m_new : m_old;                     // NaN (-inf - -inf): keep
  }
};

// ---- ldmatrix addresses with one XOR each ------------------------------------------------------------
// In a swizzled [rows][D] tile, chunk c of row r sits at chunk c ^ (r % 8). Every row a lane points
// ldmatrix at has r % 8 == lane % 8, and chunk 2 kk + c0 (c0 = 0 or 1) is stored at
// (2 kk) ^ (c0 ^ lane % 8): so the byte address of step kk is (lane's address at kk = 0) ^ (kk << 5),
// provided the tile starts on a 256-byte boundary (every tile here does). One register per lane and
// pattern; no per-tile index arithmetic, nothing for the compiler to hoist into registers.
//   K (B operand, no .trans), step (np, kk): row np*16 + lane%8 + 8*(lane/16), chunk 2kk + (lane/8)%2
//   Q (A operand) and V (B operand, .trans), step (i, kk): row i*16 + lane%16, chunk 2kk + lane/16
template <int D>
struct LaneOffsets {
  uint32_t k0, a0;
  FA_DEVICE explicit LaneOffsets(int lane) {
    const int x = lane & 7;
    k0 = (((lane & 7) + (lane >> 4) * 8) * D + ((((lane >> 3) & 1) ^ x) << 3)) * 2;
    a0 = ((lane & 15) * D + (((lane >> 4) ^ x) << 3)) * 2;
  }
  // byte address of step (i, kk) in the tile at `base` (16 rows per i)
  FA_DEVICE uint32_t at_k(uint32_t base, int i, int kk) const { return ((base + k0) ^ (kk << 5)) + i * 16 * D * 2; }
  FA_DEVICE uint32_t at_a(uint32_t base, int i, int kk) const { return ((base + a0) ^ (kk << 5)) + i * 16 * D * 2; }
};

// S[mt] = Q[mt] K_j^T for the warp's MT m-tiles: one ldmatrix of K feeds MT x 2 MMAs.
template <int MT, int D, int BN, bool QREG, typename T>
FA_DEVICE void qk_tile(float (&s)[MT][BN / 8][4], const uint32_t (&qf)[QREG ? MT : 1][QREG ? D / 16 : 1][4],
                       uint32_t sQw, uint32_t sK, const LaneOffsets<D>& off) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (QREG) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mt][r] = qf[mt][kk][r];
      } else {
        ldmatrix_x4(a[mt], off.at_a(sQw, mt, kk));
      }
    }
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, off.at_k(sK, np, kk));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// O[mt] += P[mt] V_j: one ldmatrix.trans of V feeds MT x 2 MMAs; P is converted from the C fragments.
template <int MT, int D, int BN, typename T>
FA_DEVICE void pv_tile(float (&o)[MT][D / 8][4], const float (&p)[MT][BN / 8][4], uint32_t sV,
                       const LaneOffsets<D>& off) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack2<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack2<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack2<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack2<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, off.at_a(sV, kk, dp));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// ---- the copies: a ROWS x D tile, global -> swizzled shared, by NT threads --------------------------
// Thread t always copies chunk t % (D/8) of rows t / (D/8) + i * (NT / (D/8)): the global address
// advances by a constant, the swizzled shared offset repeats every 8 rows (no divisions in the loop).
// Rows >= rows_valid are zero-filled without a global read (cp.async src-size 0; `any`: a valid
// address to name instead). lane_src: thread t's first element of a tile at src (row t / (D/8),
// chunk t % (D/8)). I: int, or unsigned where no sign words may enter the 64-bit address arithmetic.
template <int D, typename T, typename I>
FA_DEVICE const T* lane_src(const T* src, int64_t stride, I t) {
  return src + (t / (D / 8)) * stride + (t % (D / 8)) * 8;
}
template <int ROWS, int D, int NT, bool FULL, typename T, typename I>
FA_DEVICE void copy_tile_rows(uint32_t dst, const T* g, int64_t stride, int rows_valid, I t, const void* any) {
  constexpr int CPR = D / 8, RPI = NT / CPR, N = ROWS / RPI;
  static_assert(NT % CPR == 0 && ROWS % RPI == 0, "the tile must split evenly over the threads");
  const I c = t % CPR, r0 = t / CPR;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int row = (int)r0 + i * RPI;
    const bool valid = FULL || row < rows_valid;
    cp_async_16(dst + row * D * 2 + ((c ^ (row & 7)) << 4), valid ? static_cast<const void*>(g) : any, valid);
    g += RPI * stride;
  }
}
// the tile whose element of thread t is g (= lane_src(tile, stride, t))
template <int ROWS, int D, int NT, typename T, typename I>
FA_DEVICE void copy_tile_at(uint32_t dst, const T* g, int64_t stride, int rows_valid, I t, const void* any) {
  if (rows_valid >= ROWS) copy_tile_rows<ROWS, D, NT, true>(dst, g, stride, rows_valid, t, any);
  else copy_tile_rows<ROWS, D, NT, false>(dst, g, stride, rows_valid, t, any);
}
template <int ROWS, int D, int NT, typename T>
FA_DEVICE void copy_tile(uint32_t dst, const T* src, int64_t stride, int rows_valid, int t) {
  copy_tile_at<ROWS, D, NT>(dst, lane_src<D>(src, stride, t), stride, rows_valid, t, src);
}

// ---- the producer: one warp, every K and V tile ----------------------------------------------------
// K_j, V_j -> stage j % STAGES by NT threads (thread t of NT); each thread arrives on full[stage]
// once its own copies have landed (full[] expects NT arrivals). FA2-style loads: gK, gV are thread
// t's elements of K_0, V_0 (lane_src): one 64-bit pointer each held through the loop, instead of
// the head's K and V and the thread's 64-bit offsets.
template <class C, typename T, int D, int NT>
FA_DEVICE void load_kv(const FaParams& p, const T* gK, const T* gV, uint32_t sK, uint32_t sV, uint64_t* full_k,
                       uint64_t* full_v, int j, unsigned t) {
  constexpr int BN = C::BLOCK_N;
  const int s = j % C::STAGES, n0 = j * BN;
  copy_tile_at<BN, D, NT>(sK + s * BN * D * 2, gK + (int64_t)n0 * p.k_ss, p.k_ss, p.Skv - n0, t, p.k);
  cp_async_mbar_arrive(full_k + s);
  copy_tile_at<BN, D, NT>(sV + s * BN * D * 2, gV + (int64_t)n0 * p.v_ss, p.v_ss, p.Skv - n0, t, p.v);
  cp_async_mbar_arrive(full_v + s);
}

template <class C, typename T, int D>
FA_DEVICE void producer(const FaParams& p, const T* K, const T* V, uint32_t sK, uint32_t sV, uint64_t* full_k,
                        uint64_t* full_v, uint64_t* empty_k, uint64_t* empty_v, int Tc, int lane) {
  constexpr int BN = C::BLOCK_N, STAGES = C::STAGES;
  for (int j = 0; j < Tc; ++j) {
    const int s = j % STAGES, n0 = j * BN, parity = ((j / STAGES) + 1) & 1;   // use j/STAGES - 1 released
    if (j >= STAGES) mbar_wait(empty_k + s, parity);       // every consumer is done with K of stage s
    copy_tile<BN, D, 32>(sK + s * BN * D * 2, K + (int64_t)n0 * p.k_ss, p.k_ss, p.Skv - n0, lane);
    cp_async_mbar_arrive(full_k + s);
    if (j >= STAGES) mbar_wait(empty_v + s, parity);
    copy_tile<BN, D, 32>(sV + s * BN * D * 2, V + (int64_t)n0 * p.v_ss, p.v_ss, p.Skv - n0, lane);
    cp_async_mbar_arrive(full_v + s);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// ---- a consumer warp: MT x 16 rows of O_i, m_i, l_i in registers -----------------------------------
template <class C, typename T, int D>
struct Consumer {
  static constexpr int MT = C::MT, BN = C::BLOCK_N, STAGES = C::STAGES;
  static constexpr bool QREG = C::QREG;
  using Rescale = std::conditional_t<C::LAZY, LazyRescale<T>, fa::EagerRescale>;
  const FaParams& p;
  uint32_t sQw, sK, sV;                 // shared addresses: this warp's rows of Q_i, the K and V rings
  uint64_t *full_k, *full_v, *empty_k, *empty_v;
  int lane, m0, row0, diag;             // m0, row0: first query row of the block, of this warp
  float scale_log2;
  LaneOffsets<D> off;
  uint32_t qf[QREG ? MT : 1][QREG ? D / 16 : 1][4];
  float o[MT][D / 8][4], m_i[MT][2], l_i[MT][2];

  FA_DEVICE void init() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      m_i[mt][0] = m_i[mt][1] = -INFINITY;
      l_i[mt][0] = l_i[mt][1] = 0.f;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
    }
  }
  FA_DEVICE void load_q_regs() {
    if constexpr (QREG) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldmatrix_x4(qf[mt][kk], off.at_a(sQw, mt, kk));
    }
  }
  // The loop without overlap (v6's), at the top of each tile: the bases of the ldmatrix addresses
  // become opaque (an empty asm), so each tile XORs its addresses from them (a LOP3 each) instead of
  // the compiler hoisting all MT x D/16 of Q's, and K's lane offset, into registers held through the
  // masked loop: with the mask's row indices (row0_again) that was 24 B of spills in v6 at D = 128.
  FA_DEVICE void reload_addresses() { asm volatile("" : "+r"(sQw), "+r"(off.k0), "+r"(off.a0)); }
  FA_DEVICE void wait_k(int j) { mbar_wait(full_k + j % STAGES, (j / STAGES) & 1); __syncwarp(); }
  FA_DEVICE void wait_v(int j) { mbar_wait(full_v + j % STAGES, (j / STAGES) & 1); __syncwarp(); }
  // S = Q_i K_j^T
  FA_DEVICE void qk(int j, float (&s)[MT][BN / 8][4]) {
    qk_tile<MT, D, BN, QREG, T>(s, qf, sQw, sK + (j % STAGES) * BN * D * 2, off);
  }
  // hand K_j's stage back to the producer (after the softmax: an arrive between the MMAs and the
  // softmax would not stop ptxas from interleaving them, but keeps the source order honest)
  FA_DEVICE void release_k(int j) {
    if constexpr (C::PRODUCER) mbar_arrive(empty_k + j % STAGES);
  }
  // row0 again, from threadIdx.x read again: nothing held for it through the loop without overlap
  FA_DEVICE int row0_again() const { return m0 + tid_again() / 32 * MT * 16; }
  // m_i, l_i, O_i *= alpha, S -> P (masked tiles: the ragged end and the causal diagonal; w_row0: row0)
  template <bool MASKED>
  FA_DEVICE void softmax(int j, float (&s)[MT][BN / 8][4], int w_row0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (MASKED) fa::apply_mask(s[mt], w_row0 + mt * 16 + lane / 4, j * BN, p.Skv, diag, p.causal, lane);
      online_softmax_update<BN / 8, D / 8, Rescale>(s[mt], m_i[mt], l_i[mt], o[mt], scale_log2);
    }
  }
  // O_i += P V_j, then hand V's stage back
  FA_DEVICE void pv(int j, const float (&s)[MT][BN / 8][4]) {
    pv_tile<MT, D, BN, T>(o, s, sV + (j % STAGES) * BN * D * 2, off);
    if constexpr (C::PRODUCER) mbar_arrive(empty_v + j % STAGES);
  }
};

template <class C, typename T, int D>
__global__ void __launch_bounds__(C::NTHREADS, C::MINB) kernel(const FaParams p) {
  constexpr int NC = C::NC, MT = C::MT, BLOCK_M = C::BLOCK_M, BN = C::BLOCK_N, STAGES = C::STAGES;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  static_assert((BLOCK_M * D * 2) % 256 == 0 && (BN * D * 2) % 256 == 0, "tiles start on 256-byte boundaries");
  T* sQ = reinterpret_cast<T*>(smem_raw);                  // [BLOCK_M][D]
  T* sK = sQ + BLOCK_M * D;                                // [STAGES][BN][D]
  T* sV = sK + STAGES * BN * D;                            // [STAGES][BN][D]
  uint64_t* full_k = reinterpret_cast<uint64_t*>(sV + STAGES * BN * D);
  uint64_t* full_v = full_k + STAGES;                      // the copies of stage s landed
  uint64_t* empty_k = full_v + STAGES;                     // every consumer is done with stage s
  uint64_t* empty_v = empty_k + STAGES;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;  // longest causal row blocks first
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / (p.Hq / p.Hkv), diag = p.Skv - p.Sq;
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)m0 * p.q_ss;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  const int Tc = fa::num_key_tiles(p, m0, diag, BLOCK_M, BN);

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k + s, C::PRODUCER ? 32 : C::NTHREADS);
      mbar_init(full_v + s, C::PRODUCER ? 32 : C::NTHREADS);
      mbar_init(empty_k + s, NC * 32);
      mbar_init(empty_v + s, NC * 32);
    }
  }
  __syncthreads();

  if constexpr (C::PRODUCER) {
    if (warp == NC) {                                      // the producer warp, then it leaves
      producer<C, T, D>(p, K, V, smem_addr(sK), smem_addr(sV), full_k, full_v, empty_k, empty_v, Tc, lane);
      return;                                              // (no CTA-wide barrier follows)
    }
  }

  const int q_row0 = warp * MT * 16;                       // this warp's rows within the block
  Consumer<C, T, D> c{p, smem_addr(sQ + q_row0 * D), smem_addr(sK), smem_addr(sV), full_k, full_v, empty_k, empty_v,
                      lane, m0, m0 + q_row0, diag, p.scale * FA_LOG2E, LaneOffsets<D>(lane)};
  c.init();
  if (Tc > 0) {
    // Q_i: each warp copies its own MT x 16 rows (no CTA barrier needed)
    copy_tile<MT * 16, D, 32>(c.sQw, Q + (int64_t)q_row0 * p.q_ss, p.q_ss, p.Sq - m0 - q_row0, lane);
    cp_async_commit();
    const T* gK = lane_src<D>(K, p.k_ss, (unsigned)tid);   // FA2-style loads only: this thread's K_0, V_0
    const T* gV = lane_src<D>(V, p.v_ss, (unsigned)tid);
    if constexpr (!C::PRODUCER)                            // FA2-style: every thread loads the first stages
      for (int j = 0; j < STAGES && j < Tc; ++j) load_kv<C, T, D, C::NTHREADS>(p, gK, gV, smem_addr(sK), smem_addr(sV), full_k, full_v, j, tid);
    cp_async_wait<0>();
    __syncwarp();
    c.load_q_regs();

    // the first tile that needs a mask (ragged end or causal diagonal); the condition is monotone in j
    int j_mask = p.Skv / BN;
    if (p.causal) j_mask = min(j_mask, max(0, (m0 + diag + 1) / BN));
    j_mask = min(j_mask, Tc);

    // FA2-style only: at the top of tile j, the stage of tile j - 1 is free for tile j - 1 + STAGES
    auto refill = [&](int j) {
      if constexpr (!C::PRODUCER) {
        __syncthreads();
        if (j >= 1 && j - 1 + STAGES < Tc) load_kv<C, T, D, C::NTHREADS>(p, gK, gV, smem_addr(sK), smem_addr(sV), full_k, full_v, j - 1 + STAGES, tid);
      }
    };
    if constexpr (C::OVERLAP) {
      float s_cur[MT][BN / 8][4], s_nxt[MT][BN / 8][4];
      c.wait_k(0);
      c.qk(0, s_cur);
      c.release_k(0);
      int j = 0;
      // the loop body, twice: without and with the mask; the last tile is peeled (no S_{j+1})
#define V5_OVERLAP_STEP(MASKED)                                                                  \
      refill(j);                                                                                 \
      c.wait_k(j + 1);                                                                           \
      c.qk(j + 1, s_nxt);                       /* S_{j+1} = Q_i K_{j+1}^T   (tensor cores)   */ \
      c.template softmax<MASKED>(j, s_cur, c.row0); /* P_j = exp2(S_j - m_i) (FMA, MUFU)      */ \
      c.release_k(j + 1);                                                                        \
      c.wait_v(j);                                                                               \
      c.pv(j, s_cur);                           /* O_i += P_j V_j                             */ \
      _Pragma("unroll") for (int mt = 0; mt < MT; ++mt)                                          \
        _Pragma("unroll") for (int n = 0; n < BN / 8; ++n)                                       \
          _Pragma("unroll") for (int e = 0; e < 4; ++e) s_cur[mt][n][e] = s_nxt[mt][n][e];
      for (; j < min(j_mask, Tc - 1); ++j) { V5_OVERLAP_STEP(false) }
      for (; j < Tc - 1; ++j) { V5_OVERLAP_STEP(true) }
#undef V5_OVERLAP_STEP
      refill(j);
      c.template softmax<true>(j, s_cur, c.row0);
      c.wait_v(j);
      c.pv(j, s_cur);
    } else {
      float s[MT][BN / 8][4];
      int j = 0;
#define V5_STEP(MASKED)                      \
      c.reload_addresses();                  \
      refill(j);                             \
      c.wait_k(j);                           \
      c.qk(j, s);                            \
      c.release_k(j);                        \
      c.template softmax<MASKED>(j, s, c.row0_again()); \
      c.wait_v(j);                           \
      c.pv(j, s);
      for (; j < j_mask; ++j) { V5_STEP(false) }
      for (; j < Tc; ++j) { V5_STEP(true) }
#undef V5_STEP
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) fa::epilogue<D, T>(p, b, h, m0 + q_row0 + mt * 16, c.o[mt], c.m_i[mt], c.l_i[mt], lane);
}

// ---- the host wrapper: a rung's fa_launch is launch<Traits> ------------------------------------------
template <class Traits, typename T, int D>
int launch_typed(const FaParams& p, cudaStream_t stream) {
  using C = Shape<Traits>;
  if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;
  constexpr int smem = C::template smem_bytes<T, D>();
  auto k = kernel<C, T, D>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  dim3 grid((p.Sq + C::BLOCK_M - 1) / C::BLOCK_M, p.Hq, p.B);
  k<<<grid, C::NTHREADS, smem, stream>>>(p);
  return (int)cudaGetLastError();
}

template <class Traits>
int launch(const FaParams* p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->D == 64) return p->is_bf16 ? launch_typed<Traits, __nv_bfloat16, 64>(*p, s) : launch_typed<Traits, __half, 64>(*p, s);
  if (p->D == 128) return p->is_bf16 ? launch_typed<Traits, __nv_bfloat16, 128>(*p, s) : launch_typed<Traits, __half, 128>(*p, s);
  return (int)cudaErrorInvalidValue;
}
}  // namespace ladder
