// hopper_common.cuh: what the producer, the consumer mainloop and the harness of step 07 share --
// the tile shapes, the shared-memory layout, the mbarriers of the K/V ring, the tile scheduler and
// the small helpers of the consumer (mask, online softmax, P conversion). Given: do not edit.
//
// One CTA = 3 warpgroups (FlashAttention-3, Shah et al. 2024, §3.1). Warpgroup 0 is the producer: one
// thread issues TMA copies of Q_i once per tile and of K_j, V_j into a STAGES-deep ring, each slot
// guarded by a "full" and an "empty" mbarrier. Warpgroups 1 and 2 are consumers, 64 query rows each
// (BLOCK_M = 128): S = Q_i K_j^T by WGMMA from shared memory, the online softmax in registers, then
// O_i += P V_j by WGMMA with P as the register A operand. Key blocks are visited right to left, so
// the masked (diagonal, ragged) blocks come first.
//
// Three compile-time switches are the rungs of the ladder (ladder/v*.cu), FA3's ablation:
//   HFA_PINGPONG    the two consumers take turns issuing GEMMs (named barriers): one warpgroup's
//                   softmax runs while the other's GEMMs run
//   HFA_OVERLAP     within a warpgroup, the softmax of S_j runs while O += P_{j+1} V_{j+1} is in flight
//   HFA_PERSISTENT  one CTA per SM; its producer takes the next tile from a global counter and
//                   hands it to the consumers, so loads for the next tile start during this one
// and tuning knobs: HFA_STAGES (default 2), the depth of the K/V ring (v5_stages3); HFA_BLOCK_N (default
// 128; 160, 176 or 192, wgmma_ss's widths), the keys per block (v6_block_n176); HFA_CONSUMER_REGS (default
// 232), the consumers' setmaxnreg; HFA_RESCALE_IN_TURN (default 0; v7_rescale_in_turn): O is rescaled after
// S_j is issued, under it, not after the wait for P V; HFA_TRIM_FIRST (default 0; v8_trim_first): the rightmost
// key block's S and P V GEMMs only as wide as the keys the warpgroup's rows see there (trim_width);
// HFA_PREFETCH_Q and HFA_EARLY_K (default 0; v9_prefetch_q): the producer fetches the next tile's Q into L2 as
// soon as it has the tile and loads its first K before its Q; HFA_WIDE_STORES (default 0; v10_wide_stores): the
// epilogue stores O 16 bytes a lane; HFA_LPT (default 0; v11_lpt_sections): causal tiles longest first within
// sections of heads (TileScheduler); HFA_OVERLAP_TILES (default 0; v12_overlap_tiles): two Q slots and the next
// tile's first S issued before this tile's epilogue (the producer and the consumers' loop of ladder/overlap_tiles.cuh);
// HFA_UNIFORM_WG (default 0; v13_uniform_wg): the consumers' warpgroup index through a shuffle (consumer_index);
// HFA_DESC_ADD (default 0; v14_desc_add): each k-step's WGMMA descriptor as the block's first plus its offset
// (gemm_qk, gemm_pv); and HFA_WINDOW (default 0, no rung of this step),
// the sliding window of FaParams::window (first_kv_block, window_cuts, apply_mask), for step 10's
// v6_hopper_window.
#pragma once
#include "fa_params.h"
#include "hopper_primitives.cuh"

// The stub's marker: a function of student_kernel.cu whose body still carries FA_TODO("name") is
// reported as not implemented by the notebook's compile check and CPU check. It compiles to nothing.
#ifndef FA_TODO
#define FA_TODO(name)
#endif

#ifndef HFA_PINGPONG
#define HFA_PINGPONG 1
#endif
#ifndef HFA_OVERLAP
#define HFA_OVERLAP 1
#endif
#ifndef HFA_PERSISTENT
#define HFA_PERSISTENT 1
#endif
#ifndef HFA_STAGES
#define HFA_STAGES 2
#endif
#ifndef HFA_BLOCK_N
#define HFA_BLOCK_N 128
#endif
#ifndef HFA_CONSUMER_REGS
#define HFA_CONSUMER_REGS 232
#endif
#ifndef HFA_RESCALE_IN_TURN
#define HFA_RESCALE_IN_TURN 0
#endif
#ifndef HFA_TRIM_FIRST
#define HFA_TRIM_FIRST 0
#endif
#ifndef HFA_PREFETCH_Q
#define HFA_PREFETCH_Q 0
#endif
#ifndef HFA_EARLY_K
#define HFA_EARLY_K 0
#endif
#ifndef HFA_WIDE_STORES
#define HFA_WIDE_STORES 0
#endif
#ifndef HFA_LPT
#define HFA_LPT 0
#endif
#ifndef HFA_LPT_MB
#define HFA_LPT_MB 16
#endif
#ifndef HFA_OVERLAP_TILES
#define HFA_OVERLAP_TILES 0
#endif
#ifndef HFA_WINDOW
#define HFA_WINDOW 0
#endif
#ifndef HFA_UNIFORM_WG
#define HFA_UNIFORM_WG 0
#endif
#ifndef HFA_DESC_ADD
#define HFA_DESC_ADD 0
#endif

namespace hfa {
using namespace hp;

constexpr int kConsumers = 2;                      // consumer warpgroups, 64 query rows each
constexpr int BLOCK_M = 64 * kConsumers;           // 128 query rows per tile
constexpr int BLOCK_N = HFA_BLOCK_N;               // keys per K_j, V_j block
constexpr int STAGES = HFA_STAGES;                 // depth of the K/V ring (3 at D 128: 224 KB of 227)
constexpr int NTHREADS = 128 * (1 + kConsumers);   // warpgroup 0 produces, the others consume
constexpr int PANEL = 64;                          // 16-bit columns per 128-byte swizzled panel
// setmaxnreg moves registers within the CTA's launch allocation (168 a thread at 384 threads; past it: a fault)
constexpr int kConsumerRegs = HFA_CONSUMER_REGS, kProducerRegs = (168 * NTHREADS - 256 * kConsumerRegs) / 128 / 8 * 8;
static_assert(kProducerRegs >= 24 && 128 * kProducerRegs + 256 * kConsumerRegs <= 168 * NTHREADS, "setmaxnreg split");
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
constexpr int kBarWarpgroup0 = 1;                  // named barriers 1, 2: whose turn to issue GEMMs
constexpr bool kOverlap = HFA_OVERLAP;
constexpr bool kRescaleInTurn = HFA_RESCALE_IN_TURN;  // rescale O between issuing S and P V (FA3's order)
constexpr bool kTrimFirst = HFA_TRIM_FIRST;        // the rightmost key block's GEMMs only trim_width columns wide
constexpr bool kPrefetchQ = HFA_PREFETCH_Q;        // the next tile's Q into L2 as soon as the producer knows the tile
constexpr bool kEarlyK = HFA_EARLY_K;              // the next tile's first K before its Q (whose slot frees last)
constexpr bool kWideStores = HFA_WIDE_STORES;      // the epilogue stores O 16 bytes a lane (a quad transpose first)
constexpr bool kDescAdd = HFA_DESC_ADD;            // k-step descriptors: the first plus an offset (smem_desc_add)
constexpr bool kLpt = HFA_LPT;                     // causal: longest tiles first across a section of heads
constexpr int64_t kLptL2Bytes = (int64_t)HFA_LPT_MB << 20;  // the K and V a section's heads read, at most (L2: 50-60 MB)
constexpr int kQStages = HFA_OVERLAP_TILES ? 2 : 1;  // Q slots (the second with q2_full, q2_empty)

// Shared memory: Q_i [kQStages][BLOCK_M x D], K and V rings [STAGES][BLOCK_N x D], then the mbarriers. A tile
// of D columns is D/64 panels of [rows x 64], each 128-byte swizzled (TMA's SWIZZLE_128B).
// D = 128: 32 + 64 + 64 KB.
template <int D>
struct SmemLayout {
  static constexpr int kPanels = D / PANEL;
  static constexpr int kQBytes = BLOCK_M * D * 2;
  static constexpr int kKVBytes = BLOCK_N * D * 2;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQStages * kQBytes;
  static constexpr int kV = kK + STAGES * kKVBytes;
  static constexpr int kBarriers = kV + STAGES * kKVBytes;
  static constexpr int kBytes = kBarriers + 256 + 1024;  // + the barriers + slack to align to 1 KB
};

struct Barriers {
  uint64_t q_full, q_empty;
  uint64_t k_full[STAGES], k_empty[STAGES];
  uint64_t v_full[STAGES], v_empty[STAGES];
  uint64_t tile_full[2], tile_empty[2];  // persistent: the producer hands tile numbers to the consumers
  int tile[2];
  int* counter;                          // persistent: the global tile counter
  uint64_t q2_full, q2_empty;            // HFA_OVERLAP_TILES: the second Q slot's
};

// The CTA's shared memory, aligned to 1 KB (swizzled panels start on 1024-byte boundaries), and its
// barriers at the end of it.
extern __shared__ unsigned char smem_raw[];
HP_DEVICE unsigned char* smem_base() { return smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023); }
template <int D>
HP_DEVICE Barriers& barriers() { return *reinterpret_cast<Barriers*>(smem_base() + SmemLayout<D>::kBarriers); }

// Position in the K/V ring: slot and the parity of the slot's current phase.
HP_DEVICE int slot(int it) { return it % STAGES; }
HP_DEVICE uint32_t phase(int it) { return (it / STAGES) & 1; }

// ============================================================================ tile scheduler
struct Tile {
  int m_block, h, b;
};

// Tiles are numbered so that the row blocks of one head are neighbours (they read the same K_j, V_j
// through L2), longest causal rows first. Non-persistent: tile = blockIdx.x, one per CTA.
// Persistent: gridDim.x = number of SMs; after its first tile a CTA's producer takes the next number
// from a global counter (a CTA that drew short causal rows simply takes more tiles, and the tiles in
// flight stay neighbours) and passes it to the consumers through a 2-slot ring in shared memory.
// HFA_LPT (v11_lpt_sections): causal tiles of one head run from 1 to Skv / BLOCK_N blocks, so in that order
// the last tiles handed out still include long ones and the other SMs idle while those finish. Instead the
// heads are cut into sections whose K and V fit in L2 (kLptL2Bytes, whole GQA groups), and within a section
// every head's longest row block comes first, then every head's next: the kernel ends on the shortest tiles.
template <int D>
struct TileScheduler {
  int m_blocks, heads, total, section;  // section: heads per LPT section (0: one head after another)
  mutable int k = 0;  // tiles handed over so far
  HP_DEVICE explicit TileScheduler(const FaParams& p)
      : m_blocks((p.Sq + BLOCK_M - 1) / BLOCK_M), heads(p.Hq), total(m_blocks * p.Hq * p.B), section(0) {
    if (kLpt && p.causal && !p.window) {
      const int64_t kv_head = 4 * (int64_t)p.Skv * D;  // K and V of one KV head, 16-bit
      const int kv_heads = (int)max((int64_t)1, kLptL2Bytes / kv_head);
      section = min(kv_heads * (p.Hq / p.Hkv), p.Hq * p.B);
    }
  }
  HP_DEVICE int first() const { return blockIdx.x; }
  HP_DEVICE int next(int) const {
    if (!HFA_PERSISTENT) return total;
    Barriers& bars = barriers<D>();
    const int s = k & 1;
    const uint32_t parity = (k >> 1) & 1;
    ++k;
    if (threadIdx.x < 128) {  // the producer takes a number and hands it over
      const int t = atomicAdd(bars.counter, 1) + (int)gridDim.x;
      mbar_wait(&bars.tile_empty[s], parity ^ 1);
      bars.tile[s] = t;
      mbar_arrive(&bars.tile_full[s]);
      return t;
    }
    mbar_wait(&bars.tile_full[s], parity);
    const int t = *reinterpret_cast<volatile int*>(&bars.tile[s]);
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(&bars.tile_empty[s]);
    return t;
  }
  HP_DEVICE Tile operator()(int t) const {
    if (kLpt && section > 0) {  // t's section starts at head s0 (b * Hq + h); within it row blocks descend, heads ascend
      const int s0 = t / (section * m_blocks) * section, width = min(section, total / m_blocks - s0);
      const int r = t - s0 * m_blocks, bh = s0 + r % width;
      return Tile{m_blocks - 1 - r / width, bh % heads, bh / heads};
    }
    const int bh = t / m_blocks;
    return Tile{m_blocks - 1 - t % m_blocks, bh % heads, bh / heads};
  }
};

// Key blocks that row block m_block needs: all of them, or (causal, bottom-right aligned) none past
// the diagonal of its last row.
HP_DEVICE int num_kv_blocks(const FaParams& p, int m_block) {
  int n = (p.Skv + BLOCK_N - 1) / BLOCK_N;
  if (p.causal) {
    const int last_row = min(m_block * BLOCK_M + BLOCK_M, p.Sq) - 1;
    const int last_key = last_row + p.Skv - p.Sq;
    n = last_key < 0 ? 0 : min(n, last_key / BLOCK_N + 1);
  }
  return n;
}

// A sliding window (HFA_WINDOW builds, p.window > 0, with causal): key j is visible to query i iff
// i + (Skv - Sq) - window < j <= i + (Skv - Sq). The first key block that row block m_block needs (its
// first row's lower edge), and whether key block n0 reaches below the lower edge of some row up to
// last_row (then it needs apply_mask). Without a window: block 0, and never.
HP_DEVICE int first_kv_block(const FaParams& p, int m_block) {
  if (!HFA_WINDOW || p.window <= 0) return 0;
  return max(0, m_block * BLOCK_M + p.Skv - p.Sq - p.window + 1) / BLOCK_N;
}
HP_DEVICE bool window_cuts(const FaParams& p, int n0, int last_row) {
  return HFA_WINDOW && p.window > 0 && n0 <= last_row + p.Skv - p.Sq - p.window;
}

// HFA_TRIM_FIRST: of key block n0 (the rightmost of a tile), the columns that some row of the warpgroup whose
// first row is m0_wg sees -- up to Skv and (causal) its last row's diagonal -- rounded up to a WGMMA width of
// 64, 128 or BLOCK_N. The columns past it are masked for all 64 rows, so S and P V need not compute them.
HP_DEVICE int trim_width(const FaParams& p, int n0, int m0_wg) {
  int last_key = p.Skv - 1;
  if (p.causal) last_key = min(last_key, min(m0_wg + 63, p.Sq - 1) + p.Skv - p.Sq);
  const int need = last_key + 1 - n0;
  return need <= 64 ? 64 : need <= 128 ? 128 : BLOCK_N;
}


// ============================================================================ consumer helpers
// This thread's share of O_i and its running statistics: rows r0 = 16*warp + lane/4 and r0 + 8 of
// the warpgroup's 64, columns 8j + 2(lane%4) + {0, 1} (the WGMMA accumulator layout).
template <int D>
struct Accum {
  float o[D / 2];
  float m[2];  // running row max of S * scale * log2(e)
  float l[2];  // running row sum of P (this lane's columns only; the quad is summed at the end)
  HP_DEVICE void zero() {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }
};


// Keys this thread's rows may not see get -inf: past the end, or past the bottom-right diagonal (or
// below a sliding window's lower edge).
HP_DEVICE void apply_mask(float (&s)[BLOCK_N / 2], int n0, int row0, const FaParams& p, int lane) {
  const int diag = p.Skv - p.Sq;
#pragma unroll
  for (int i = 0; i < BLOCK_N / 2; ++i) {
    const int col = n0 + (i / 4) * 8 + 2 * (lane & 3) + (i & 1);
    const int row = row0 + ((i >> 1) & 1) * 8;
    if (col >= p.Skv || (p.causal && col > row + diag) || window_cuts(p, col, row)) s[i] = -INFINITY;
  }
}

// The online-softmax update: m_new = max(m, rowmax(S) * c), alpha = 2^(m - m_new),
// P = 2^(S * c - m_new) (in place, fp32), l = alpha * l + rowsum(P), with c = scale * log2(e).
// A row that has seen no key yet keeps m = -inf and P = 0.
HP_DEVICE void online_softmax_update(float (&s)[BLOCK_N / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                     float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i)
      if (((i >> 1) & 1) == r) mx = fmaxf(mx, s[i]);
    const float m_new = fmaxf(m[r], quad_max(mx) * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = exp2_approx(m[r] - m_use);
    m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i)
      if (((i >> 1) & 1) == r) {
        s[i] = exp2_approx(fmaf(s[i], scale_log2, -m_use));
        sum += s[i];
      }
    l[r] = l[r] * alpha[r] + sum;
  }
}

// P as the WGMMA A operand: the accumulator of columns 16kk..16kk+15 is already the A fragment of
// step kk, two 16-bit values per register.
template <typename T>
HP_DEVICE void convert_p(const float (&s)[BLOCK_N / 2], uint32_t (&p)[BLOCK_N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

template <int D>
HP_DEVICE void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
}

// Ping-pong: a warpgroup waits for its turn before issuing GEMMs and hands the turn over after.
HP_DEVICE void gemm_turn_begin(int wg) {
  if (HFA_PINGPONG) named_bar_sync(kBarWarpgroup0 + wg, 2 * 128);
}
HP_DEVICE void gemm_turn_end(int wg) {
  if (HFA_PINGPONG) named_bar_arrive(kBarWarpgroup0 + (1 - wg), 2 * 128);
}
// After its wgmma_wait, one lane per warp releases a ring slot (the barriers count 4 * kConsumers).
HP_DEVICE void release(uint64_t* bar, int lane) {
  if (lane == 0) mbar_arrive(bar);
}


}  // namespace hfa
