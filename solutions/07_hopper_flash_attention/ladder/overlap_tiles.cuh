// overlap_tiles.cuh (ladder only, HFA_OVERLAP_TILES; v12_overlap_tiles): the producer and the consumers' loop over
// tiles with two Q slots, and the next tile's first S issued in the same turn as this tile's last P V, so that it runs
// under this tile's epilogue. In the harness's loop a tile starts with its first S alone at the tensor cores, waited
// for at once, after the last tile's epilogue and after its own Q, which the producer could load only once the last
// tile's final S was done. Both functions are the exercise solution's, with the Q ring and without the ladder's
// other variants.
#pragma once

namespace hfa {
static_assert(kQStages == 2, "HFA_OVERLAP_TILES: two Q slots");

// Q ring: tile round r (tiles with keys) uses slot r % 2, whose barriers' phase parity is (r / 2) & 1.
HP_DEVICE uint64_t* q_full_bar(Barriers& bars, int r) { return r & 1 ? &bars.q2_full : &bars.q_full; }
HP_DEVICE uint64_t* q_empty_bar(Barriers& bars, int r) { return r & 1 ? &bars.q2_empty : &bars.q_empty; }
HP_DEVICE uint32_t q_phase(int r) { return (r >> 1) & 1; }

template <int D>
HP_DEVICE void producer_two_q(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                              unsigned char* smem, Barriers& bars, const FaParams& p, const TileScheduler<D>& sched) {
  using L = SmemLayout<D>;
  const int group = p.Hq / p.Hkv;
  int it = 0, r = 0;
  for (int t = sched.first(); t < sched.total; t = sched.next(t)) {
    const Tile tile = sched(t);
    const int nb = num_kv_blocks(p, tile.m_block), lo = first_kv_block(p, tile.m_block);
    if (nb == 0) continue;
    mbar_wait(q_empty_bar(bars, r), q_phase(r) ^ 1);  // a fresh slot counts as released
    mbar_expect_tx(q_full_bar(bars, r), L::kQBytes);
#pragma unroll
    for (int c = 0; c < L::kPanels; ++c)
      tma_load_4d(smem + L::kQ + (r & 1) * L::kQBytes + c * BLOCK_M * 128, tm_q, q_full_bar(bars, r), c * PANEL,
                  tile.m_block * BLOCK_M, tile.h, tile.b);
    ++r;
    const int h_kv = tile.h / group;
    for (int j = nb - 1; j >= lo; --j, ++it) {
      const int s = slot(it);
      mbar_wait(&bars.k_empty[s], phase(it) ^ 1);
      mbar_expect_tx(&bars.k_full[s], L::kKVBytes);
#pragma unroll
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_4d(smem + L::kK + s * L::kKVBytes + c * BLOCK_N * 128, tm_k, &bars.k_full[s], c * PANEL, j * BLOCK_N,
                    h_kv, tile.b);
      mbar_wait(&bars.v_empty[s], phase(it) ^ 1);
      mbar_expect_tx(&bars.v_full[s], L::kKVBytes);
#pragma unroll
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_4d(smem + L::kV + s * L::kKVBytes + c * BLOCK_N * 128, tm_v, &bars.v_full[s], c * PANEL, j * BLOCK_N,
                    h_kv, tile.b);
    }
  }
}

template <typename T, int D>
HP_DEVICE void consumer_overlapped(unsigned char* smem, Barriers& bars, const FaParams& p,
                                   const TileScheduler<D>& sched, int wg) {
  using L = SmemLayout<D>;
  const float scale_log2 = p.scale * LOG2E;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  auto q_addr = [&](int round) { return smem_u32(smem + L::kQ + (round & 1) * L::kQBytes) + wg * 64 * 128; };
  float s[BLOCK_N / 2];
  uint32_t p_frag[BLOCK_N / 16][4];
  float alpha[2];
  Accum<D> acc;
  int it = 0, q_round = 0;
  auto with_keys = [&](int t) {  // the first tile from t on that has keys; rows that see none get O = 0 at once
    for (; t < sched.total && num_kv_blocks(p, sched(t).m_block) == 0; t = sched.next(t)) {
      Accum<D> none;
      none.zero();
      epilogue<T, D>(none, p, sched(t), wg);
    }
    return t;
  };
  if (HFA_PINGPONG && wg == 1) named_bar_arrive(kBarWarpgroup0, 2 * 128);  // warpgroup 0 issues first
  int t = with_keys(sched.first());
  if (t >= sched.total) return;
  mbar_wait(q_full_bar(bars, 0), 0);
  mbar_wait(&bars.k_full[slot(it)], phase(it));
  gemm_turn_begin(wg);
  gemm_qk<T, D>(s, q_addr(0), k_addr + slot(it) * L::kKVBytes);  // the first tile's first S
  gemm_turn_end(wg);
  Tile tile;
  while (true) {  // S of this tile's rightmost key block is in flight
    tile = sched(t);
    const int nb = num_kv_blocks(p, tile.m_block);
    const int m0_wg = tile.m_block * BLOCK_M + wg * 64, row0 = m0_wg + warp * 16 + lane / 4;
    auto needs_mask = [&](int n0) {
      return n0 + BLOCK_N > p.Skv || (p.causal && n0 + BLOCK_N - 1 > m0_wg + p.Skv - p.Sq) ||
             (HFA_WINDOW && window_cuts(p, n0, m0_wg + 63));
    };
    acc.zero();
    wgmma_wait<0>();
    pin_registers(s);
    release(&bars.k_empty[slot(it)], lane);
    if (needs_mask((nb - 1) * BLOCK_N)) apply_mask(s, (nb - 1) * BLOCK_N, row0, p, lane);
    online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);
    convert_p<T>(s, p_frag);

    for (int j = nb - 2, lo = first_kv_block(p, tile.m_block); j >= lo; --j, ++it) {
      const int sk = slot(it + 1), sv = slot(it);
      mbar_wait(&bars.k_full[sk], phase(it + 1));
      gemm_turn_begin(wg);
      gemm_qk<T, D>(s, q_addr(q_round), k_addr + sk * L::kKVBytes);
      mbar_wait(&bars.v_full[sv], phase(it));
      gemm_pv<T, D>(acc.o, p_frag, v_addr + sv * L::kKVBytes);
      gemm_turn_end(wg);
      wgmma_wait<1>();
      pin_registers(s);
      release(&bars.k_empty[sk], lane);
      if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);
      online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);
      wgmma_wait<0>();
      pin_registers(acc.o);
      pin_registers(p_frag);
      release(&bars.v_empty[sv], lane);
      rescale_o<D>(acc.o, alpha);
      convert_p<T>(s, p_frag);
    }
    release(q_empty_bar(bars, q_round), lane);  // every S of this tile is done

    t = with_keys(sched.next(t));
    mbar_wait(&bars.v_full[slot(it)], phase(it));
    if (t >= sched.total) break;
    // the last P V, and in the same turn the next tile's first S (its Q and K waited for before the turn)
    mbar_wait(q_full_bar(bars, q_round + 1), q_phase(q_round + 1));
    mbar_wait(&bars.k_full[slot(it + 1)], phase(it + 1));
    gemm_turn_begin(wg);
    gemm_pv<T, D>(acc.o, p_frag, v_addr + slot(it) * L::kKVBytes);
    gemm_qk<T, D>(s, q_addr(q_round + 1), k_addr + slot(it + 1) * L::kKVBytes);
    gemm_turn_end(wg);
    wgmma_wait<1>();  // P V is done; the next S may still run
    pin_registers(acc.o);
    pin_registers(p_frag);
    release(&bars.v_empty[slot(it)], lane);
    ++it;
    ++q_round;
    epilogue<T, D>(acc, p, tile, wg);
  }
  gemm_turn_begin(wg);  // the last tile's last P V
  gemm_pv<T, D>(acc.o, p_frag, v_addr + slot(it) * L::kKVBytes);
  gemm_turn_end(wg);
  wgmma_wait<0>();
  pin_registers(acc.o);
  release(&bars.v_empty[slot(it)], lane);
  epilogue<T, D>(acc, p, tile, wg);
}
}  // namespace hfa
