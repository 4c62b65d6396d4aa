// v4_hopper's kernel: the attention backward on Hopper (sm_90a) with step 07's primitives and harness
// (TMA, mbarriers, WGMMA, producer/consumer warpgroups), FlashAttention-3's plan (Shah et al. 2024, §3 and
// appendix B): one CTA per block of 128 keys keeps K_j and V_j in shared memory and walks the query blocks
// of BM rows (80 without a causal mask at D 128, FA3's choice; else 64), accumulating dK_j and dV_j in
// registers; dQ is shared by every key block, so each CTA adds its part into an fp32 buffer in global memory
// with a bulk reduce-add, and a small kernel converts it.
//
// Roles (3 warpgroups): warpgroup 0, thread 0 loads K_j, V_j once, then Q_i and dO_i into a 2-deep ring;
// thread 32 is the dQ writer; warpgroups 1 and 2 each own 64 of the 128 keys (the first consumer warp also
// stages m2_i, delta_i one step ahead). Per query block, one consumer warpgroup computes, with S^T and not S
// so that P^T and dS^T come out of the tensor cores in the register layout of the A operand:
//     S^T  = K_w Q_i^T                 WGMMA SS, 64 x BM, K-major A and B      } in flight together
//     dP^T = V_w dO_i^T                WGMMA SS, 64 x BM                       }
//     P^T  = 2^(S^T c - m2_i)          registers, under dP^T (c = scale log2 e; m2 = lse log2 e, v3's preprocess)
//     dV_w += P^T dO_i                 WGMMA RS, dO MN-major: this warpgroup's operands only, so it runs under
//                                      the next two lines and the barrier (at BM 80 issued after dS^T: registers)
//     dS^T = P^T (dP^T - delta_i)      registers, and stored transposed (stmatrix), as dS [BM][128 keys]
//     dQ_i^T = K_j^T dS_i^T            WGMMA SS from K (A MN-major) and dS (B K-major), after the barrier, so
//                                      that BM is WGMMA's N (80 is no multiple of 64): at D 128 warpgroup w
//                                      makes dQ's columns 64w..64w+63 from all 128 keys; at D 64 its own 64
//                                      keys' share of all 64 columns (two partial tiles, summed by the conversion)
//     dK_w += dS^T Q_i                 WGMMA RS, Q MN-major, behind dQ
// and, while dK runs, hands its dQ fragments (fp32, BM / 2 per thread, in fragment order) to the writer through
// shared memory (two buffers at BM 64; one at 80, for room); the writer adds each tile into dq_acc with one
// cp.reduce.async.bulk.
// (dV, dK both before the barrier and dQ last left the tensor cores idle under dS^T and under the hand-over;
// this order, 240 registers and stepped descriptors ran 1.04-1.05x that on one H100, 0.98-1.00x on another:
// 2026-11-28_h100_step08_v4_probes.txt.)
//
// Deterministic mode (FaBwdParams::sems): the writer of key block n adds tile (b, h, i) only when the
// tile's semaphore reads n (key blocks 0..n-1 have added theirs), waits for its add to land, then bumps
// it. Every key block that touches query block i is a block n' <= n, and CTAs take tickets in key-block
// order (within a section, Work), so the block it waits for has started and never waits on it.
//
// Built by v4_hopper.py with step 07's folder and its ladder/ on the include path and v4_hopper_binding.cpp,
// for sm_90a. The forward of step 07 (fa_launch) comes with the include. The builds before this one and what
// each was worth: benchmarks/results/2026-11-27_h200_step08_v4_probes.txt, and the blocks of 80 against 64:
// 2026-11-28_h200_step08_v4_bm80_probes.txt; dQ counted in the kernel (no zeroing, no conversion pass), S^T issued
// a step ahead and persistent CTAs, all slower: 2026-11-28_h200_step08_v4_dq_passes_probes.txt. The step's (head,
// block) by a cursor and the mask only where a step needs it (a quarter fewer instructions a step, after Nsight Compute
// counted 1.53x FlashAttention-4's): 2026-12-02_h200_step08_v4_cursor_probes.txt, 2026-12-02_h200_fa4_reference.txt.
// The warpgroup index through a shuffle, so that K's and V's descriptors stay uniform (a sixth fewer again, up to 1%
// faster): 2026-12-02_h200_step08_v4_uniform_probes.txt.
#include "student_kernel_solution.cu"
#include "v4_hopper.h"

namespace hfa {
namespace bwd {
constexpr int BN = 128;                    // keys per CTA, 64 per consumer warpgroup
constexpr int RING = 2;                    // Q/dO ring depth
constexpr int kBarDs = 1;                  // named barrier: both warpgroups' dS^T are in shared memory
constexpr int kThreads = 384;
// floats of one step's dQ hand-over, [warpgroup][BM / 8 chunks of 4][thread][4], and its buffers
template <int BM> constexpr int kDqTile = 128 * BM;
template <int BM> constexpr int kDqBufs = BM == 64 ? 2 : 1;
#ifndef V4_BM80
#define V4_BM80 1          // non-causal at D 128: query blocks of 80 rows (FA3's hdim-128 backward)
#endif
#ifndef V4_ROTATE
#define V4_ROTATE 1        // non-causal: each key block starts at its own diagonal (Work::first)
#endif
// setmaxnreg: the producer warpgroup gives up all but 24 registers a thread so that the consumers hold 240 (at 232
// the mainloop spilled 16 bytes and ptxas serialised its WGMMAs, C7512); both move within the CTA's launch
// allocation, 168 a thread at 384 threads (past it: a fault)
constexpr int kProducerRegsBwd = 24, kConsumerRegsBwd = 240;
static_assert(128 * kProducerRegsBwd + 256 * kConsumerRegsBwd <= kThreads * 168, "setmaxnreg past the allocation");
#ifndef V4_PROBE_NO_REDUCE
#define V4_PROBE_NO_REDUCE 0   // benchmarks/probes only (dQ wrong): the writer skips the bulk reduce-add
#endif

// Shared memory (D 128, BM 64: K, V 32 KB each; Q, dO rings 2 x 16 KB each; dS double-buffered, 2 x 16 KB, and
// the dQ hand-over 2 x 32 KB: 225 KB of the 227; at BM 80 the rings and dS 2 x 20 KB, one 40 KB hand-over: 226 KB).
// Every panel starts on a 1024-byte boundary (BM * 128 bytes a panel of BM rows).
template <int D, int BM>
struct Layout {
  static constexpr int kKVBytes = BN * D * 2, kRowBytes = BM * D * 2, kDSBytes = BN * BM * 2;
  static constexpr int kK = 0, kV = kK + kKVBytes, kQ = kV + kKVBytes;
  static constexpr int kDO = kQ + RING * kRowBytes;
  static constexpr int kDS = kDO + RING * kRowBytes;       // dS [BM queries][BN keys], 2 panels of 64 keys; 2 buffers
  static constexpr int kDQ = kDS + 2 * kDSBytes;           // kDqBufs hand-over buffers of kDqTile floats
  static constexpr int kStats = kDQ + kDqBufs<BM> * kDqTile<BM> * 4;  // [2 steps][m2, delta][BM] fp32
  static constexpr int kBars = kStats + 2 * 2 * BM * 4;
  static constexpr int kBytes = kBars + 256 + 1024;
  static_assert(kBytes <= 227 * 1024, "shared memory past the 227 KB a CTA may have");
};

struct Bars {
  uint64_t kv_full;
  uint64_t q_full[RING], q_empty[RING], do_full[RING], do_empty[RING];
  uint64_t dq_full[2], dq_empty[2];
  int ticket;
};

// A CTA's work: key block n of KV head h_kv, against query blocks [m_lo, m_hi) of each query head of the
// group (causal: the first block with a row that sees key n * BN). Tickets run key block first within sections
// of f.section (b, h_kv) pairs: the longest causal blocks start first, a key block's predecessors have tickets
// before it (the deterministic order needs them started), and the resident CTAs share a few heads' Q, dO rows
// and dQ tiles in L2 (with one section of every pair, the resident CTAs span every head and share nothing).
template <int BM>
struct Work {
  int n_block, h_kv, b, group, m_lo, m_hi, steps, first, order;
  HP_DEVICE Work(const FaBwdParams& f, int t) {
    const FaParams& p = f.base;
    const int n_blocks = (p.Skv + BN - 1) / BN, pairs = p.B * p.Hkv;
    const int sec = f.section > 0 ? min(f.section, pairs) : pairs;
    const int s0 = t / (sec * n_blocks) * sec, width = min(sec, pairs - s0), r = t - s0 * n_blocks;
    const int bh = s0 + r % width;
    n_block = r / width;
    h_kv = bh % p.Hkv;
    b = bh / p.Hkv;
    group = p.Hq / p.Hkv;
    m_hi = (p.Sq + BM - 1) / BM;
    m_lo = p.causal ? min(m_hi, max(0, n_block * BN - (p.Skv - p.Sq)) / BM) : 0;
    steps = group * (m_hi - m_lo);
    order = f.order;
    // Non-causal, every key block of a head would add into the same dQ tile at the same time: start each at
    // its own diagonal instead and wrap around (V4_ROTATE; not in the deterministic mode, whose order is fixed)
    first = V4_ROTATE && order == 0 && !p.causal && !f.sems && m_hi > 0 ? (n_block * BN / BM) % m_hi : 0;
  }
  // Step -> (query head, query block). Order 0: heads outermost, blocks ascending from `first`; order 1: blocks
  // descending from the last, heads innermost, so a head's key blocks read the same rows at the same time.
  HP_DEVICE int h(int step) const { return h_kv * group + (order ? step % group : step / (m_hi - m_lo)); }
  HP_DEVICE int m(int step) const { return order ? m_hi - 1 - step / group : m_lo + (step + first) % (m_hi - m_lo); }
  // The same walk step by step (c: the step within its run of one head, order 0, or of one block, order 1): the
  // division by a runtime count above costs some 25 instructions, and the consumers, the stager and the dQ writer
  // each need (h, m) every step
  struct Cursor {
    int h, m, c;
  };
  HP_DEVICE Cursor start() const { return {h(0), m(0), 0}; }
  HP_DEVICE void next(Cursor& k) const {
    if (order) {
      if (++k.c == group) k.c = 0, --k.m;
      k.h = h_kv * group + k.c;
    } else {
      if (++k.m == m_hi) k.m = m_lo;
      if (++k.c == m_hi - m_lo) k.c = 0, ++k.h;
    }
  }
};

HP_DEVICE int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
HP_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// An operand's descriptor at `bytes` past its base: the offset added to the 14-bit address field (no carry below
// 228 KB), so that an unrolled GEMM builds one descriptor per operand, not one per instruction (1.00-1.03x on
// one H100: probe 6 of 2026-11-28_h100_step08_v4_probes.txt)
HP_DEVICE uint64_t desc_at(uint64_t base, uint32_t bytes) { return base + (bytes >> 4); }

// dS^T's fragments in 16-bit pairs (x[j / 2][2 (j % 2) + h]: key 16 warp + lane/4 + 8h of warpgroup wg's 64,
// queries 8j + 2(lane%4) + {0, 1}) stored transposed, as dS [BM queries][64 keys] in panel wg of a tile of two
// 128-byte swizzled panels (a K-major WGMMA operand, as TMA writes Q): each stmatrix .trans stores four of the
// warp's 8 x 8 blocks, (j, h) for j = 2kk, 2kk + 1 and h = 0, 1; lane l gives the address of row l % 8 of
// block l / 8, whose 8 keys are one 16-byte chunk.
template <int BM>
HP_DEVICE void store_ds(unsigned char* tile, const uint32_t (&x)[BM / 16][4], int wg, int warp, int lane) {
  const int blk = lane / 8, h = blk % 2, chunk = 2 * warp + h;
#pragma unroll
  for (int kk = 0; kk < BM / 16; ++kk) {
    const int q = 8 * (2 * kk + blk / 2) + lane % 8;
    const uint32_t addr = smem_u32(tile + wg * BM * 128 + q * 128 + ((chunk ^ (q & 7)) << 4));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(x[kk][0]), "r"(x[kk][1]), "r"(x[kk][2]), "r"(x[kk][3]) : "memory");
  }
}

// ============================================================================ producer, dQ writer
template <int D, int BM>
HP_DEVICE void load_tiles(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                          const CUtensorMap* tm_do, unsigned char* smem, Bars& bars, const Work<BM>& w) {
  using L = Layout<D, BM>;
  if (w.steps == 0) return;
  mbar_expect_tx(&bars.kv_full, 2 * L::kKVBytes);
#pragma unroll
  for (int c = 0; c < D / PANEL; ++c) {
    tma_load_4d(smem + L::kK + c * BN * 128, tm_k, &bars.kv_full, c * PANEL, w.n_block * BN, w.h_kv, w.b);
    tma_load_4d(smem + L::kV + c * BN * 128, tm_v, &bars.kv_full, c * PANEL, w.n_block * BN, w.h_kv, w.b);
  }
  auto k = w.start();
  for (int it = 0; it < w.steps; ++it, w.next(k)) {
    const int s = it % RING, h = k.h, m = k.m;
    const uint32_t ph = (it / RING) & 1;
    mbar_wait(&bars.q_empty[s], ph ^ 1);
    mbar_expect_tx(&bars.q_full[s], L::kRowBytes);
#pragma unroll
    for (int c = 0; c < D / PANEL; ++c)
      tma_load_4d(smem + L::kQ + s * L::kRowBytes + c * BM * 128, tm_q, &bars.q_full[s], c * PANEL, m * BM, h, w.b);
    mbar_wait(&bars.do_empty[s], ph ^ 1);
    mbar_expect_tx(&bars.do_full[s], L::kRowBytes);
#pragma unroll
    for (int c = 0; c < D / PANEL; ++c)
      tma_load_4d(smem + L::kDO + s * L::kRowBytes + c * BM * 128, tm_do, &bars.do_full[s], c * PANEL, m * BM, h, w.b);
  }
}

// m2 and delta of step it into stats slot it % 2: float2 pairs lane and lane + 32 of its BM / 2, by each lane of
// the first consumer warp, a step ahead, with cp.async (no registers held across the step: at BM 80 they
// spilled); it waits for them before the consumers' barrier. Rows past sq_pad (v3's preprocess pads to 128, a
// block of 80 may end past it) are padding: m2 +inf, delta 0. (Copied by the producer and handed over through
// the slot's mbarrier, every read was a race to compute-sanitizer's racecheck, which does not follow mbarriers.)
HP_DEVICE void cp_async_8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
template <int BM>
HP_DEVICE void stage_stats(float2* stats, const FaBwdParams& f, const Work<BM>& w, int it,
                           const typename Work<BM>::Cursor& k, int lane) {
  const int64_t base = ((int64_t)w.b * f.base.Hq + k.h) * f.sq_pad;
#pragma unroll
  for (int pair = lane; pair < BM / 2; pair += 32) {
    const int row = k.m * BM + 2 * pair;
    float2* m2 = stats + (it & 1) * BM + pair;
    float2* delta = m2 + BM / 2;
    if (row < f.sq_pad) {
      cp_async_8(m2, f.m2 + base + row);
      cp_async_8(delta, f.delta + base + row);
    } else {
      *m2 = make_float2(INFINITY, INFINITY);
      *delta = make_float2(0.f, 0.f);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
HP_DEVICE void stats_wait() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

template <int D, int BM>
HP_DEVICE void dq_writer(unsigned char* smem, Bars& bars, const FaBwdParams& f, const Work<BM>& w) {
  const FaParams& p = f.base;
  const int m_blocks = (p.Sq + BM - 1) / BM;
  constexpr int NB = kDqBufs<BM>;
  auto k = w.start();
  for (int it = 0; it < w.steps; ++it, w.next(k)) {
    const int64_t tile = ((int64_t)w.b * p.Hq + k.h) * m_blocks + k.m;
    const int b = it % NB;
    mbar_wait(&bars.dq_full[b], (it / NB) & 1);
    if (f.sems) {  // deterministic: key blocks add in order
      const uint64_t t0 = global_timer_ns();
      while (ld_acquire(f.sems + tile) != w.n_block) {
        __nanosleep(64);
        if (global_timer_ns() - t0 > HP_DEADLOCK_NS) __trap();  // a lost turn: fail, do not hang
      }
      fence_proxy_async_global();
    }
    if (!V4_PROBE_NO_REDUCE)
      bulk_reduce_add_f32(f.dq_acc + tile * kDqTile<BM>, smem + Layout<D, BM>::kDQ + b * kDqTile<BM> * 4,
                          kDqTile<BM> * 4);
    bulk_commit();
    if (f.sems) {
      // the add has landed in global memory: the next key block may go (passing the turn only after the next
      // step's add was issued chained the key blocks a step apart: 0.73-0.96x the default, against 0.95-0.97x)
      bulk_wait<0>();
      fence_proxy_async_global();
      __threadfence();
      atomicAdd(f.sems + tile, 1);
      mbar_arrive(&bars.dq_empty[b]);
    } else if (NB == 1) {
      bulk_wait_read<0>();  // one buffer: the consumers write the next step's dQ once this add has read it
      mbar_arrive(&bars.dq_empty[0]);
    } else if (it > 0) {
      bulk_wait_read<1>();  // the previous step's add has read its buffer; this one may still be reading
      mbar_arrive(&bars.dq_empty[b ^ 1]);
    }
  }
  bulk_wait<0>();
}

// ============================================================================ consumers
template <typename T, int D, int BM>
HP_DEVICE void dkdv_mainloop(unsigned char* smem, Bars& bars, const FaBwdParams& f, const Work<BM>& w, int wg) {
  using L = Layout<D, BM>;
  constexpr int NB = kDqBufs<BM>;
  // BM 80: P^T's 16-bit copy made with dS^T, once S^T and dP^T are spent, and dV issued after them (P^T, dP^T
  // and the copy live at once spilled and serialised the WGMMAs, C7512)
  constexpr bool kLateDv = BM > 64;
  const FaParams& p = f.base;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, tid = threadIdx.x % 128;
  const float c = p.scale * LOG2E;
  const int off = p.Skv - p.Sq, key_wg = w.n_block * BN + wg * 64, key0 = key_wg + warp * 16 + lane / 4;
  uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  // a step masks when the key block is ragged (keys past Skv read as 0, their P must be 0 too) or its query
  // block starts below causal_below: a predicate and one register live across the loop (an int for both
  // spilled at BM 80)
  const bool causal = BM == 64 && p.causal;  // fa_bwd_block_m: blocks of 80 are never causal; no mask test there
  const bool ragged = key_wg + 64 > p.Skv;
  const int causal_below = causal ? key_wg + 63 - off : INT_MIN;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  float2* stats = reinterpret_cast<float2*>(smem + L::kStats);
  const bool stager = wg == 0 && warp == 0;
  if (w.steps > 0) {
    if (stager) {
      stage_stats(stats, f, w, 0, w.start(), lane);
      stats_wait();
    }
    named_bar_sync(kBarDs, 256);
    mbar_wait_spin(&bars.kv_full, 0);
  }

  auto cur = w.start();
  for (int it = 0; it < w.steps; ++it) {
    auto nxt = cur;
    w.next(nxt);
    // the compiler would keep every descriptor of K and V live across the loop (64-bit each): recompute them
    asm volatile("" : "+r"(k_addr), "+r"(v_addr));
    const uint32_t k_wg = k_addr + wg * 64 * 128, v_wg = v_addr + wg * 64 * 128;  // this warpgroup's key rows
    const int s = it % RING, q0 = cur.m * BM;
    const uint32_t ph = (it / RING) & 1;
    const uint32_t q_addr = smem_u32(smem + L::kQ + s * L::kRowBytes), do_addr = smem_u32(smem + L::kDO + s * L::kRowBytes);
    const float* m2 = reinterpret_cast<const float*>(stats + (it & 1) * BM);
    const float* delta = m2 + BM;
    const bool stage = stager && it + 1 < w.steps;
    if (stage) stage_stats(stats, f, w, it + 1, nxt, lane);  // step it + 1's, in before this step's barrier
    // S^T and dP^T in flight together, then dQ in S^T's registers; P^T and dS^T stay in registers as the A
    // operands of dV and dK (16-bit pairs: pair (j, h) in [j / 2][2 (j % 2) + h], the A fragment of k-step j / 2)
    float acc[BM / 2], acc2[BM / 2];
    uint32_t pt[BM / 16][4], ds[BM / 16][4];

    // Row = key key0 + 8h, column = query q0 + 8j + 2(lane%4) + e.
    // d = A B^T over the head dimension, A this warpgroup's 64 key rows of K or V, B the BM rows of Q or dO
    auto gemm_rows = [&](float (&d)[BM / 2], uint32_t a, uint32_t b) {
      const uint64_t da = smem_desc(a, 16, 1024), db = smem_desc(b, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        wgmma_ss<T, BM, 0, 0>(d, desc_at(da, (kk / 4) * BN * 128 + (kk % 4) * 32),
                              desc_at(db, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
      wgmma_commit();
    };
    // acc += A B over this step's BM rows of Q or dO (B, MN-major), A = P^T or dS^T in registers
    auto gemm_keys = [&](float (&acc_kd)[D / 2], const uint32_t (&a)[BM / 16][4], uint32_t b) {
      const uint64_t db = smem_desc(b, BM * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) wgmma_rs<T, D>(acc_kd, a[kk], desc_at(db, kk * 16 * 128));
      wgmma_commit();
    };
    mbar_wait_spin(&bars.q_full[s], ph);
    gemm_rows(acc, k_wg, q_addr);                                         // S^T = K_w Q_i^T
    mbar_wait_spin(&bars.do_full[s], ph);
    gemm_rows(acc2, v_wg, do_addr);                                       // dP^T = V_w dO_i^T
    wgmma_wait<1>();
    pin_registers(acc);
    // P^T = 2^(S^T c - m2) in place, 0 where the key is hidden (causal, past Skv), under the dP^T product; the
    // mask's tests compiled in only where a step needs them (evaluated on every step, they were 40 FSEL a thread)
    auto p_of_s = [&](auto masked_t) {
      constexpr bool kMasked = decltype(masked_t)::value;
#pragma unroll
      for (int j = 0; j < BM / 8; ++j) {
        const float2 mm = *reinterpret_cast<const float2*>(m2 + 8 * j + 2 * (lane & 3));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float x[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + 8 * h, q = q0 + 8 * j + 2 * (lane & 3) + e;
            x[e] = exp2_approx(fmaf(acc[4 * j + 2 * h + e], c, -(e ? mm.y : mm.x)));
            if (kMasked && (key >= p.Skv || (causal && key > q + off))) x[e] = 0.f;
            acc[4 * j + 2 * h + e] = x[e];
          }
          if constexpr (!kLateDv) pt[j / 2][2 * (j % 2) + h] = pack2<T>(x[0], x[1]);
        }
      }
    };
    if (ragged || q0 < causal_below) p_of_s(std::true_type{});
    else p_of_s(std::false_type{});
    if constexpr (!kLateDv) {
      // dV_w += P^T dO_i needs this warpgroup's registers only: it runs under dS^T and the barrier
      wgmma_fence();
      gemm_keys(dv, pt, do_addr);
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    pin_registers(acc2);
    // dS^T = P^T (dP^T - delta), P^T in fp32 (in its 16-bit form, bf16's rounding of P put dK 5% past the
    // check's bound on the overflow case)
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * (lane & 3));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * j + 2 * h;
        ds[j / 2][2 * (j % 2) + h] = pack2<T>(acc[i] * (acc2[i] - dd.x), acc[i + 1] * (acc2[i + 1] - dd.y));
        if constexpr (kLateDv) pt[j / 2][2 * (j % 2) + h] = pack2<T>(acc[i], acc[i + 1]);
      }
    }
    if constexpr (kLateDv) {  // dV runs under the store of dS^T and the barrier
      wgmma_fence();
      gemm_keys(dv, pt, do_addr);
    }
    unsigned char* ds_buf = smem + L::kDS + (it & 1) * L::kDSBytes;
    const uint64_t d_ds = smem_desc(smem_u32(ds_buf), 16, 1024), d_k = smem_desc(k_addr, BN * 128, 1024);
    store_ds<BM>(ds_buf, ds, wg, warp, lane);
    fence_proxy_async_shared();
    if (stage) stats_wait();
    named_bar_sync(kBarDs, 256);  // both warpgroups' rows of dS^T are in (dQ reads all 128 keys), and step it + 1's stats
    wgmma_fence();
    // dQ_i^T = K^T dS^T: A = K^T (K's rows, MN-major), B = dS (K-major); row = column of dQ, column = query
    if constexpr (D == 128) {     // dQ_i's columns 64wg.. from all 128 keys: K's panel wg
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_ss<T, BM, 1, 0>(acc, desc_at(d_k, (wg * BN + kk * 16) * 128),
                              desc_at(d_ds, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
    } else {                      // all 64 columns from this warpgroup's 64 keys: dS's panel wg
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss<T, BM, 1, 0>(acc, desc_at(d_k, (wg * 64 + kk * 16) * 128), desc_at(d_ds, wg * BM * 128 + kk * 32),
                              kk > 0);
    }
    wgmma_commit();
    gemm_keys(dk, ds, q_addr);    // dK_w += dS^T Q_i, behind dQ: it runs while dQ goes to the hand-over buffer
    wgmma_wait<1>();
    pin_registers(acc);
    pin_registers(dv);
    pin_registers(pt);
    if (lane == 0) mbar_arrive(&bars.do_empty[s]);
    const int b = it % NB;
    mbar_wait_spin(&bars.dq_empty[b], ((it / NB) & 1) ^ 1);  // the writer's add of step it - NB has read it
    float4* out = reinterpret_cast<float4*>(smem + L::kDQ + b * kDqTile<BM> * 4) + wg * (BM / 8) * 128 + tid;
#pragma unroll
    for (int q4 = 0; q4 < BM / 8; ++q4)
      out[q4 * 128] = make_float4(acc[4 * q4], acc[4 * q4 + 1], acc[4 * q4 + 2], acc[4 * q4 + 3]);
    fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) mbar_arrive(&bars.dq_full[b]);
    wgmma_wait<0>();
    pin_registers(dk);
    pin_registers(ds);
    if (lane == 0) mbar_arrive(&bars.q_empty[s]);
    cur = nxt;
  }

  // dK = scale * sum dS^T Q, dV = sum P^T dO: rows key0 + 8h, columns 8j + 2(lane%4) + {0,1}
  const int64_t base = ((int64_t)w.b * p.Hkv + w.h_kv) * p.Skv;
  T* dK = static_cast<T*>(f.dk) + base * D;
  T* dV = static_cast<T*>(f.dv) + base * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + 8 * h;
    if (key >= p.Skv) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int64_t at = (int64_t)key * D + 8 * j + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(dK + at) = pack2<T>(dk[4 * j + 2 * h] * p.scale, dk[4 * j + 2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dV + at) = pack2<T>(dv[4 * j + 2 * h], dv[4 * j + 2 * h + 1]);
    }
  }
}

// ============================================================================ kernels
template <typename T, int D, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const FaBwdParams f) {
  unsigned char* smem = smem_base();
  Bars& bars = *reinterpret_cast<Bars*>(smem + Layout<D, BM>::kBars);
  if (threadIdx.x == 0) {
    prefetch_tensormap(&tm_q);
    prefetch_tensormap(&tm_k);
    prefetch_tensormap(&tm_v);
    prefetch_tensormap(&tm_do);
    mbar_init(&bars.kv_full, 1);
    for (int s = 0; s < RING; ++s) {
      mbar_init(&bars.q_full[s], 1);
      mbar_init(&bars.do_full[s], 1);
      mbar_init(&bars.q_empty[s], 8);   // one lane per consumer warp
      mbar_init(&bars.do_empty[s], 8);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(&bars.dq_full[b], 8);
      mbar_init(&bars.dq_empty[b], 1);
    }
    fence_barrier_init();
    bars.ticket = atomicAdd(f.counter, 1);
  }
  __syncthreads();
  const Work<BM> w(f, bars.ticket);
  if (threadIdx.x < 128) {
    setmaxnreg_dec<kProducerRegsBwd>();
    if (threadIdx.x == 0) load_tiles<D, BM>(&tm_q, &tm_k, &tm_v, &tm_do, smem, bars, w);
    if (threadIdx.x == 32) dq_writer<D, BM>(smem, bars, f, w);
    return;  // the producer warpgroup is done; only the consumers go on (with 240 registers each)
  }
  setmaxnreg_inc<kConsumerRegsBwd>();
  // the warpgroup's index through a shuffle, which nvcc knows is warp-uniform: the K and V descriptors built
  // from it stay on the uniform datapath (from threadIdx.x alone they took 48 R2UR a step)
  dkdv_mainloop<T, D, BM>(smem, bars, f, w, __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) - 1);
}

// dQ = scale * dq_acc, from the fragment order of the hand-over: float4 i of a tile is warpgroup i / (16 BM),
// chunk (i / 128) % (BM / 8), thread i % 128, and holds dQ^T's rows d, d + 8 (d = 64 wg + 16 warp + lane / 4 at
// D 128) at queries q, q + 1 (q = 8 chunk + 2 (lane % 4)); at D 64 the two warpgroups' tiles are partial sums
// of one tile. The tile goes through shared memory so that dQ's rows are written whole (written straight from
// the fragment order, each warp's 4-byte stores covered half of every sector: 402 MB in 289 us, 15% of the
// backward on large on an H100).
template <typename T, int D, int BM>
__global__ void __launch_bounds__(256) dq_convert(const FaBwdParams f) {
  constexpr int kPitch = D + 8;  // 16-bit values per row of the staged tile; + 8: the quads' rows in distinct banks
  __shared__ __align__(16) T rows[BM * kPitch];
  const FaParams& p = f.base;
  const int m_blocks = (p.Sq + BM - 1) / BM, m = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const float4* tile = reinterpret_cast<const float4*>(f.dq_acc + (bh * m_blocks + m) * kDqTile<BM>);
  constexpr int kDistinct = D == 128 ? kDqTile<BM> / 4 : kDqTile<BM> / 8;
  for (int i = threadIdx.x; i < kDistinct; i += 256) {
    float4 v = tile[i];
    if constexpr (D == 64) {
      const float4 u = tile[i + kDistinct];
      v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
    }
    const int wg = i / (16 * BM), chunk = (i / 128) % (BM / 8), t = i % 128, lane = t % 32;
    const int d = 64 * wg + 16 * (t / 32) + lane / 4, q = 8 * chunk + 2 * (lane & 3);
    rows[q * kPitch + d] = T(v.x * p.scale);
    rows[(q + 1) * kPitch + d] = T(v.y * p.scale);
    rows[q * kPitch + d + 8] = T(v.z * p.scale);
    rows[(q + 1) * kPitch + d + 8] = T(v.w * p.scale);
  }
  __syncthreads();
  T* dq = static_cast<T*>(f.dq) + (bh * p.Sq + (int64_t)m * BM) * D;
  constexpr int kPerRow = D / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < BM * kPerRow; i += 256) {
    const int row = i / kPerRow, c = i % kPerRow;
    if (m * BM + row < p.Sq)
      *reinterpret_cast<uint4*>(dq + row * D + 8 * c) = *reinterpret_cast<const uint4*>(rows + row * kPitch + 8 * c);
  }
}

template <typename T, int D, int BM>
int launch(const FaBwdParams& f, cudaStream_t stream) {
  using L = Layout<D, BM>;
  const FaParams& p = f.base;
  if (BM != 64 && p.causal) return (int)cudaErrorInvalidValue;  // the mainloop drops the causal mask at BM 80
  CUtensorMap tm_q, tm_k, tm_v, tm_do;
  int err = make_tensor_map<T>(&tm_q, p.q, D, p.Sq, p.Hq, p.B, p.q_ss, p.q_sh, p.q_sb, BM);
  if (!err) err = make_tensor_map<T>(&tm_k, p.k, D, p.Skv, p.Hkv, p.B, p.k_ss, p.k_sh, p.k_sb, BN);
  if (!err) err = make_tensor_map<T>(&tm_v, p.v, D, p.Skv, p.Hkv, p.B, p.v_ss, p.v_sh, p.v_sb, BN);
  if (!err) err = make_tensor_map<T>(&tm_do, p.o, D, p.Sq, p.Hq, p.B, p.o_ss, p.o_sh, p.o_sb, BM);
  if (err) return err;
  auto kernel = bwd_kernel<T, D, BM>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
  if (e != cudaSuccess) return (int)e;
  const int grid = (p.Skv + BN - 1) / BN * p.Hkv * p.B;
  kernel<<<grid, kThreads, L::kBytes, stream>>>(tm_q, tm_k, tm_v, tm_do, f);
  dq_convert<T, D, BM><<<dim3((p.Sq + BM - 1) / BM, p.B * p.Hq), 256, 0, stream>>>(f);
  return (int)cudaGetLastError();
}
}  // namespace bwd
}  // namespace hfa

extern "C" int fa_bwd_block_m(int D, int causal) { return V4_BM80 && D == 128 && !causal ? 80 : 64; }

extern "C" int fa_bwd_launch(const FaBwdParams* f, void* stream) {
  using namespace hfa::bwd;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const FaParams& p = f->base;
  const int bm = fa_bwd_block_m(p.D, p.causal);
  if (p.D == 64) return p.is_bf16 ? launch<__nv_bfloat16, 64, 64>(*f, s) : launch<__half, 64, 64>(*f, s);
  if (p.D == 128 && bm == 80) return p.is_bf16 ? launch<__nv_bfloat16, 128, 80>(*f, s) : launch<__half, 128, 80>(*f, s);
  if (p.D == 128) return p.is_bf16 ? launch<__nv_bfloat16, 128, 64>(*f, s) : launch<__half, 128, 64>(*f, s);
  return (int)cudaErrorInvalidValue;
}
