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
  // YOUR CODE HERE (about 29 lines)
  FA_TODO("producer");  // the stub's marker: delete this line when you write the body
  (void)tm_q; (void)tm_k; (void)tm_v; (void)smem; (void)bars; (void)p; (void)sched;
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
  // YOUR CODE HERE (about 8 lines)
  FA_TODO("gemm_qk");  // the stub's marker: delete this line when you write the body
  for (int i = 0; i < BLOCK_N / 2; ++i) s[i] = 0.f;
  (void)q_addr; (void)k_addr;
}


// ---------------------------------------------------------------------------------------------
// 3. O += P V_j: BLOCK_N/16 calls of wgmma_rs (A = p[kk] from registers) between one fence and one
//    commit. V_j is [keys][D] with D contiguous: MN-major for this product. k-step kk starts 16 key
//    rows (16*128 bytes) further; 8-row groups are 1024 bytes apart (stride offset), the D/64 panels
//    BLOCK_N*128 bytes apart (leading offset).
template <typename T, int D>
HP_DEVICE void gemm_pv(float (&o)[D / 2], uint32_t (&p)[BLOCK_N / 16][4], uint32_t v_addr) {
  // YOUR CODE HERE (about 4 lines)
  FA_TODO("gemm_pv");  // the stub's marker: delete this line when you write the body
  (void)o; (void)p; (void)v_addr;
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
  // YOUR CODE HERE (about 64 lines)
  FA_TODO("consumer_mainloop");  // the stub's marker: delete this line when you write the body
  (void)acc; (void)smem; (void)bars; (void)p; (void)tile; (void)q_parity; (void)wg;
  (void)scale_log2;
  it += nb;
}



}  // namespace hfa

#include "hopper_harness.cuh"
