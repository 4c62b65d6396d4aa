// student_kernel.cu: exercise 07, FlashAttention forward on Hopper (sm_90a) with TMA and WGMMA.
//
// hopper_harness.cuh (included at the end) runs one CTA of three warpgroups per tile of 128 query
// rows. You write the producer and the consumer mainloop; the harness calls them like this:
//
//     warpgroup 0, one thread:   producer(...)            TMA: Q_i, then K_j, V_j into the ring
//     warpgroups 1 and 2:        consumer_mainloop(...)    per key block: gemm_qk, softmax, gemm_pv
//                                epilogue (given)          O_i / l_i, lse_i
//
// What you may call: hopper_primitives.cuh (mbar_*, tma_load_4d, smem_desc, wgmma_*, pin_registers)
// and hopper_common.cuh (SmemLayout, Barriers, slot/phase, num_kv_blocks, apply_mask,
// online_softmax_update, convert_p, rescale_o, gemm_turn_begin/end, release). Keep the signatures
// and the includes. The hidden tests check the five configurations and the edge cases, time the
// kernel against cuDNN, and read its SASS: HGMMA and UTMALDG must be there.
#include "hopper_common.cuh"

namespace hfa {

// ---------------------------------------------------------------------------------------------
// 1. The producer (one thread). For every tile of the scheduler with at least one key block:
//    wait until the consumers released Q (q_empty; not before the first tile), announce
//    L::kQBytes on q_full and load Q_i panel by panel (box: 64 columns x BLOCK_M rows, coordinates
//    (column, row, head, batch)). Then for key blocks j = nb-1 down to 0, ring position `it`: wait
//    for slot(it) to be empty (k_empty, parity phase(it) ^ 1: a fresh barrier counts as released),
//    announce L::kKVBytes on k_full and load K_j; the same for V_j with v_empty and v_full.
//    GQA: query head h reads KV head h / (Hq / Hkv).
template <int D>
HP_DEVICE void producer(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                        unsigned char* smem, Barriers& bars, const FaParams& p, const TileScheduler<D>& sched) {
  // BEGIN SOLUTION
  using L = SmemLayout<D>;
  const int group = p.Hq / p.Hkv;  // GQA: query head h reads KV head h / group
  int it = 0, q_round = 0;
  for (int t = sched.first(); t < sched.total; t = sched.next(t)) {
    const Tile tile = sched(t);
    const int nb = num_kv_blocks(p, tile.m_block), lo = first_kv_block(p, tile.m_block);
    if (nb == 0) continue;
    // LADDER ONLY { v9_prefetch_q: Q is read from HBM once per tile and its slot frees only after the tile's last S,
    // so the new Q's latency would fall between two tiles: fetch it into L2 now, and load the first K before Q
    if (kPrefetchQ && q_round > 0)
#pragma unroll
      for (int c = 0; c < L::kPanels; ++c) tma_prefetch_4d(tm_q, c * PANEL, tile.m_block * BLOCK_M, tile.h, tile.b);
    if (kEarlyK) {  // the loop's first K, issued here instead
      mbar_wait(&bars.k_empty[slot(it)], phase(it) ^ 1);
      mbar_expect_tx(&bars.k_full[slot(it)], L::kKVBytes);
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_4d(smem + L::kK + slot(it) * L::kKVBytes + c * BLOCK_N * 128, tm_k, &bars.k_full[slot(it)],
                    c * PANEL, (nb - 1) * BLOCK_N, tile.h / group, tile.b);
    }
    // } LADDER ONLY
    if (q_round > 0) mbar_wait(&bars.q_empty, (q_round - 1) & 1);
    mbar_expect_tx(&bars.q_full, L::kQBytes);
#pragma unroll
    for (int c = 0; c < L::kPanels; ++c)
      tma_load_4d(smem + L::kQ + c * BLOCK_M * 128, tm_q, &bars.q_full, c * PANEL, tile.m_block * BLOCK_M, tile.h, tile.b);
    ++q_round;
    const int h_kv = tile.h / group;
    for (int j = nb - 1; j >= lo; --j, ++it) {  // lo > 0: a sliding window (HFA_WINDOW builds)
      const int s = slot(it);
      if (!kEarlyK || j < nb - 1) {
        mbar_wait(&bars.k_empty[s], phase(it) ^ 1);   // a fresh slot counts as released
        mbar_expect_tx(&bars.k_full[s], L::kKVBytes);
#pragma unroll
        for (int c = 0; c < L::kPanels; ++c)
          tma_load_4d(smem + L::kK + s * L::kKVBytes + c * BLOCK_N * 128, tm_k, &bars.k_full[s], c * PANEL, j * BLOCK_N,
                      h_kv, tile.b);
      }
      mbar_wait(&bars.v_empty[s], phase(it) ^ 1);
      mbar_expect_tx(&bars.v_full[s], L::kKVBytes);
#pragma unroll
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_4d(smem + L::kV + s * L::kKVBytes + c * BLOCK_N * 128, tm_v, &bars.v_full[s], c * PANEL, j * BLOCK_N,
                    h_kv, tile.b);
    }
  }
  // END SOLUTION
}




// ---------------------------------------------------------------------------------------------
// 2. S = Q_i K_j^T for this warpgroup's 64 rows: D/16 calls of wgmma_ss_n128 between one
//    wgmma_fence and one wgmma_commit (no wait: the caller waits). Both operands are K-major in
//    128-byte swizzled panels of 64 columns: k-step kk reads panel kk/4 at byte offset 32*(kk%4);
//    a panel of Q is BLOCK_M*128 bytes, of K BLOCK_N*128 bytes; 8-row groups are 1024 bytes apart
//    (the descriptor's stride offset; its leading offset is unused for this layout: pass 16).
//    The first step overwrites s (accumulate = 0), the others add.
template <typename T, int D>
HP_DEVICE void gemm_qk(float (&s)[BLOCK_N / 2], uint32_t q_addr, uint32_t k_addr) {
  // BEGIN SOLUTION
  wgmma_fence();
  // LADDER ONLY { v14_desc_add: the first k-step's descriptors built once, the others by adding the offset
  if constexpr (kDescAdd) {
    const uint64_t da0 = smem_desc(q_addr, 16, 1024), db0 = smem_desc(k_addr, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<T, BLOCK_N, 0, 0>(s, smem_desc_add(da0, (kk / 4) * BLOCK_M * 128 + (kk % 4) * 32),
                                 smem_desc_add(db0, (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
    return;
  }
  // } LADDER ONLY
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t da = smem_desc(q_addr + (kk / 4) * BLOCK_M * 128 + off, 16, 1024);
    const uint64_t db = smem_desc(k_addr + (kk / 4) * BLOCK_N * 128 + off, 16, 1024);
    wgmma_ss<T, BLOCK_N, 0, 0>(s, da, db, kk > 0);  // wgmma_ss_n128 at BLOCK_N = 128
  }
  wgmma_commit();
  // END SOLUTION
}


// ---------------------------------------------------------------------------------------------
// 3. O += P V_j: BLOCK_N/16 calls of wgmma_rs (A = p[kk] from registers) between one fence and one
//    commit. V_j is [keys][D] with D contiguous: MN-major for this product. k-step kk starts 16 key
//    rows (16*128 bytes) further; 8-row groups are 1024 bytes apart (stride offset), the D/64 panels
//    BLOCK_N*128 bytes apart (leading offset).
template <typename T, int D>
HP_DEVICE void gemm_pv(float (&o)[D / 2], uint32_t (&p)[BLOCK_N / 16][4], uint32_t v_addr) {
  // BEGIN SOLUTION
  wgmma_fence();
  // LADDER ONLY { v14_desc_add
  if constexpr (kDescAdd) {
    const uint64_t dv0 = smem_desc(v_addr, BLOCK_N * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) wgmma_rs<T, D>(o, p[kk], smem_desc_add(dv0, kk * 16 * 128));
    wgmma_commit();
    return;
  }
  // } LADDER ONLY
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk)
    wgmma_rs<T, D>(o, p[kk], smem_desc(v_addr + kk * 16 * 128, BLOCK_N * 128, 1024));
  wgmma_commit();
  // END SOLUTION
}




// ---------------------------------------------------------------------------------------------
// 4. The consumer mainloop of one tile, software-pipelined (FlashAttention-3, §3.2): first S of the
//    rightmost block and its softmax; then for each further block j, right to left, issue
//    S_j = Q K_j^T (K_j in slot(it + 1)) and O += P V_{j+1} (V_{j+1} in slot(it)) back to back inside
//    one gemm_turn, wait for S only (kOverlap: wgmma_wait<1>), release K, mask, softmax; then wait
//    for the product, release V, rescale O and only then convert the new P (the old P registers were
//    an operand in flight). After the loop release Q (q_empty) and do the last O += P V.
//    Full barriers are waited with parity phase(...). One lane per warp releases (release()).
//    Start by waiting for Q_i (q_full, parity q_parity). Masks: apply_mask where a block reaches past
//    Skv or past the causal diagonal of this warpgroup's first row. `it` must end advanced by nb.
template <typename T, int D>
HP_DEVICE void consumer_mainloop(Accum<D>& acc, unsigned char* smem, Barriers& bars, const FaParams& p,
                                 const Tile& tile, int nb, uint32_t q_parity, int& it, int wg, float scale_log2) {
  // BEGIN SOLUTION
  using L = SmemLayout<D>;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const uint32_t q_addr = smem_u32(smem + L::kQ) + wg * 64 * 128;  // this warpgroup's 64 rows of Q_i
  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  const int m0_wg = tile.m_block * BLOCK_M + wg * 64, row0 = m0_wg + warp * 16 + lane / 4;
  auto needs_mask = [&](int n0) {  // past Skv, past the causal diagonal, below a sliding window's lower edge
    return n0 + BLOCK_N > p.Skv || (p.causal && n0 + BLOCK_N - 1 > m0_wg + p.Skv - p.Sq) ||
           (HFA_WINDOW && window_cuts(p, n0, m0_wg + 63));
  };
  float s[BLOCK_N / 2];
  uint32_t p_frag[BLOCK_N / 16][4];
  float alpha[2];
  // LADDER ONLY { kTrimFirst (v8_trim_first): the rightmost block's GEMMs only as wide as the keys this warpgroup's
  // rows see there (trim_width: 64, 128 or BLOCK_N): S at 128 columns when they cover them (the rest -inf), P V
  // over the first 64 or 128 keys. Each width is a whole fence-to-wait sequence of its own: an S of 64 columns, or
  // P V k-steps skipped by a branch inside one wait, made ptxas serialise the kernel's WGMMAs (C7511, C7520).
  const int w_first = kTrimFirst ? trim_width(p, (nb - 1) * BLOCK_N, m0_wg) : BLOCK_N;
  const bool trim_s = kTrimFirst && BLOCK_N > 128 && w_first <= 128;
  auto qk_first = [&](uint32_t k_slot) {  // S of the rightmost block, 128 columns, issued and waited for
    float s_n[64];  // registers of its own: products into a prefix of s serialised the WGMMAs and spilled
    gemm_turn_begin(wg);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss_n128<T>(s_n, smem_desc(q_addr + (kk / 4) * BLOCK_M * 128 + (kk % 4) * 32, 16, 1024),
                       smem_desc(k_slot + (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32, 16, 1024), kk > 0);
    wgmma_commit();
    gemm_turn_end(wg);
    wgmma_wait<0>();
    pin_registers(s_n);
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) s[i] = i < 64 ? s_n[i] : -INFINITY;
  };
  auto pv_first = [&](uint32_t v_slot) {  // O += P V of the rightmost block, its first 64 or 128 keys
    auto pv = [&](auto keys) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < decltype(keys)::value / 16; ++kk)
        wgmma_rs<T, D>(acc.o, p_frag[kk], smem_desc(v_slot + kk * 16 * 128, BLOCK_N * 128, 1024));
      wgmma_commit();
    };
    if (w_first == 64) pv(std::integral_constant<int, 64>{});
    else if (w_first == 128) pv(std::integral_constant<int, 128>{});
    else gemm_pv<T, D>(acc.o, p_frag, v_slot);
  };
  // } LADDER ONLY
  mbar_wait(&bars.q_full, q_parity);  // Q_i has landed

  // S for the rightmost key block; its softmax starts the running statistics (O is still 0)
  mbar_wait(&bars.k_full[slot(it)], phase(it));
  if (trim_s) {
    qk_first(k_addr + slot(it) * L::kKVBytes);
  } else {
    gemm_turn_begin(wg);
    gemm_qk<T, D>(s, q_addr, k_addr + slot(it) * L::kKVBytes);
    gemm_turn_end(wg);
    wgmma_wait<0>();
    pin_registers(s);
  }
  release(&bars.k_empty[slot(it)], lane);
  if (needs_mask((nb - 1) * BLOCK_N)) apply_mask(s, (nb - 1) * BLOCK_N, row0, p, lane);
  online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);
  convert_p<T>(s, p_frag);

  for (int j = nb - 2, lo = first_kv_block(p, tile.m_block); j >= lo; --j, ++it) {
    const int sk = slot(it + 1), sv = slot(it);  // K_j sits one slot ahead of V_{j+1}
    mbar_wait(&bars.k_full[sk], phase(it + 1));
    gemm_turn_begin(wg);
    gemm_qk<T, D>(s, q_addr, k_addr + sk * L::kKVBytes);                   // S = Q_i K_j^T
    if constexpr (kRescaleInTurn) {  // while S runs (no product holds O); the pin keeps ptxas from hoisting it
      pin_registers(acc.o);
      rescale_o<D>(acc.o, alpha);
    }
    mbar_wait(&bars.v_full[sv], phase(it));
    if (kTrimFirst && j == nb - 2) pv_first(v_addr + sv * L::kKVBytes);
    else gemm_pv<T, D>(acc.o, p_frag, v_addr + sv * L::kKVBytes);          // O += P V_{j+1}
    gemm_turn_end(wg);
    if constexpr (kOverlap) wgmma_wait<1>();  // S is ready; the P V product may still be running
    else wgmma_wait<0>();
    pin_registers(s);
    release(&bars.k_empty[sk], lane);
    if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);
    online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);
    wgmma_wait<0>();
    pin_registers(acc.o);   // O and the P it read stay put until the product is done
    pin_registers(p_frag);
    release(&bars.v_empty[sv], lane);
    if constexpr (!kRescaleInTurn) rescale_o<D>(acc.o, alpha);
    convert_p<T>(s, p_frag);  // only now: the registers of P_{j+1} were an operand in flight
  }
  release(&bars.q_empty, lane);  // every S of this tile is done: the producer may load the next Q

  // O += P V for the leftmost key block
  mbar_wait(&bars.v_full[slot(it)], phase(it));
  if constexpr (kRescaleInTurn) rescale_o<D>(acc.o, alpha);
  gemm_turn_begin(wg);
  if (kTrimFirst && nb == 1) pv_first(v_addr + slot(it) * L::kKVBytes);
  else gemm_pv<T, D>(acc.o, p_frag, v_addr + slot(it) * L::kKVBytes);
  gemm_turn_end(wg);
  wgmma_wait<0>();
  pin_registers(acc.o);
  release(&bars.v_empty[slot(it)], lane);
  ++it;
  // END SOLUTION
}



}  // namespace hfa

#include "hopper_harness.cuh"
