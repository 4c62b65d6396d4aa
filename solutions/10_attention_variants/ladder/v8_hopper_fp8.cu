// v8_hopper_fp8's kernel: step 07's Hopper kernel (TMA, WGMMA, a producer and two ping-ponging consumer
// warpgroups, persistent CTAs; the softmax placed under the P V product in the PTX, though ptxas hoists the
// wait above it, as in step 07: benchmarks/results/2026-11-27_h200_step10_v8_probes.txt) with both products in e4m3 and
// v7's quantisation: one descale per block of Q rows and per 128 keys of K and V (S of tile (i, j) times
// dq[i] dk[j], each P V_j times dv[j]), P cast times 2^8. D = 128 only: a row of 128 e4m3 is one
// 128-byte swizzled panel, so a tile of Q, K or V^T has the bytes (and the layout) of a 16-bit tile of 64
// columns, and step 07's scheduler, barriers and ring run on SmemLayout<64> unchanged.
//
// What e4m3 changes (PTX ISA, wgmma for .e4m3): k = 32 per instruction, and an 8-bit operand in shared
// memory must be K-major, so O = P V reads V^T [128 d rows x 128 keys] (the quantiser writes V
// transposed). P comes from the S accumulator, whose thread t of a quad holds columns {2t, 2t+1, 8+2t,
// 9+2t} of each 16, while the e4m3 A fragment wants {4t, ..., 4t+3} of each 16 (convert_p_e4m3: two
// shuffles within the quad per pair of registers, then byte permutes).
//
// Built by v8_hopper_fp8.py with step 07's folder and its ladder/ on the include path and
// v8_hopper_fp8_binding.cpp, for sm_90a.
#include <cuda_fp8.h>

#include "student_kernel_solution.cu"
#include "v8_hopper_fp8.h"

namespace hfa {
namespace fp8 {
constexpr int D = 128;
constexpr int DS = 64;                 // SmemLayout<DS>: a 128-column e4m3 tile = a 64-column 16-bit one
using L = SmemLayout<DS>;
constexpr float P_LOG2 = 8.f;          // P is cast times 2^8 (largest 256 < e4m3's 448), as v7 does

#define V8_ACC8(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
                   "+f"(d[b + 6]), "+f"(d[b + 7])
#define V8_R0_31 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define V8_R32_63 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
                  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// WGMMA in e4m3 (step 07's primitives have the 16-bit forms): k = 32 per instruction; 8-bit operands in shared
// memory are K-major only (no transpose immediates), so O = P V reads V^T. A from registers: 4 e4m3 per
// register, register r of a thread holding row 16w + l/4 + 8(r%2), columns 4(l%4) + 16(r/2) + {0..3}.
HP_DEVICE void wgmma_ss_e4m3_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" V8_R0_31 ", " V8_R32_63 "}, %64, %65, p, 1, 1;\n}\n"
               : V8_ACC8(0), V8_ACC8(8), V8_ACC8(16), V8_ACC8(24), V8_ACC8(32), V8_ACC8(40), V8_ACC8(48), V8_ACC8(56)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
HP_DEVICE void wgmma_rs_e4m3_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, 1, 1;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" V8_R0_31 ", " V8_R32_63
               "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : V8_ACC8(0), V8_ACC8(8), V8_ACC8(16), V8_ACC8(24), V8_ACC8(32), V8_ACC8(40), V8_ACC8(48), V8_ACC8(56)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#undef V8_ACC8
#undef V8_R0_31
#undef V8_R32_63

// S = Q_i K_j^T: four k-steps of 32 columns, 32 bytes apart in the one panel of each row.
HP_DEVICE void gemm_qk(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk)
    wgmma_ss_e4m3_n128(s, smem_desc(q_addr + kk * 32, 16, 1024), smem_desc(k_addr + kk * 32, 16, 1024), kk > 0);
  wgmma_commit();
}

// O += P V_j with V_j^T [d][keys] K-major: four k-steps of 32 keys.
HP_DEVICE void gemm_pv(float (&o)[64], const uint32_t (&p)[4][4], uint32_t vt_addr) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 32; ++kk) wgmma_rs_e4m3_n128(o, p[kk], smem_desc(vt_addr + kk * 32, 16, 1024));
  wgmma_commit();
}

HP_DEVICE uint32_t pack4_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// P (fp32, accumulator layout) -> the e4m3 A fragments of the four 32-key steps. Per 16 columns and row
// pair (h = 0, 1), thread t packs its 4 values of each row; the A fragment of row h wants two bytes from
// quad-mate (2t) % 4 and two from (2t + 1) % 4, the low pair when t < 2, the high pair otherwise. Each
// lane sends, in two shuffles, the pairs its two readers want (both rows in one register), so that
// every lane of the quad is read by exactly one lane per shuffle.
HP_DEVICE void convert_p_e4m3(const float (&s)[64], uint32_t (&p)[4][4], int lane) {
  const int t = lane & 3, src_a = (lane & ~3) | ((t & 1) << 1) | (t >> 1), src_b = src_a ^ 1;
  const bool odd = t & 1, swapped = t >= 2;  // swapped: shuffle a brings quad-mate (2t + 1) % 4's bytes
  const uint32_t send_a = odd ? 0x7632 : 0x5410, send_b = odd ? 0x5410 : 0x7632;
  const uint32_t take0 = swapped ? 0x1054 : 0x5410, take1 = swapped ? 0x3276 : 0x7632;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = 4 * (4 * kk + 2 * half);  // s[j + 2h + e]: columns 8(4kk + 2half) + 2t + e of row h
      const uint32_t row0 = pack4_e4m3(s[j], s[j + 1], s[j + 4], s[j + 5]);
      const uint32_t row1 = pack4_e4m3(s[j + 2], s[j + 3], s[j + 6], s[j + 7]);
#ifdef V8_PROBE_NO_EXCHANGE  // benchmarks/probes/v8_variants.py only: the exchange's cost (wrong results)
      p[kk][2 * half] = row0;
      p[kk][2 * half + 1] = row1;
      continue;
#endif
      const uint32_t x = __shfl_sync(0xffffffffu, __byte_perm(row0, row1, send_a), src_a);
      const uint32_t y = __shfl_sync(0xffffffffu, __byte_perm(row0, row1, send_b), src_b);
      p[kk][2 * half] = __byte_perm(x, y, take0);
      p[kk][2 * half + 1] = __byte_perm(x, y, take1);
    }
}

// The online softmax of one key block: step 07's online_softmax_update with P times 2^P_LOG2 (which its
// signature has no room for) and its maxima and sums as trees, for shorter dependency chains. The trees were
// not timed apart: the first build, with step 07's chains, ran 727 TFLOP/s on long (v8 probes record).
HP_DEVICE void softmax(float (&s)[64], float (&m)[2], float (&l)[2], float (&alpha)[2], float c) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) mx[i] = fmaxf(fmaxf(s[8 * i + 2 * r], s[8 * i + 2 * r + 1]), fmaxf(s[8 * i + 4 + 2 * r], s[8 * i + 5 + 2 * r]));
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
      for (int i = 0; i < w; ++i) mx[i] = fmaxf(mx[i], mx[i + w]);
    const float m_new = fmaxf(m[r], quad_max(mx[0]) * c);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = exp2_approx(m[r] - m_use);
    m[r] = m_new;
    const float off = P_LOG2 - m_use;
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int a = 4 * i + 2 * r;
      s[a] = exp2_approx(fmaf(s[a], c, off));
      s[a + 1] = exp2_approx(fmaf(s[a + 1], c, off));
      sum[i % 4] += s[a] + s[a + 1];
    }
    l[r] = l[r] * alpha[r] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
  }
}

// The producer: step 07's, with V^T's box at (key, 0) and one panel per tile.
HP_DEVICE void producer(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_vt,
                        unsigned char* smem, Barriers& bars, const FaParams& p, const TileScheduler<DS>& sched) {
  const int group = p.Hq / p.Hkv;
  int it = 0, q_round = 0;
  for (int t = sched.first(); t < sched.total; t = sched.next(t)) {
    const Tile tile = sched(t);
    const int nb = num_kv_blocks(p, tile.m_block);
    if (nb == 0) continue;
    if (q_round > 0) mbar_wait(&bars.q_empty, (q_round - 1) & 1);
    mbar_expect_tx(&bars.q_full, L::kQBytes);
    tma_load_4d(smem + L::kQ, tm_q, &bars.q_full, 0, tile.m_block * BLOCK_M, tile.h, tile.b);
    ++q_round;
    const int h_kv = tile.h / group;
    for (int j = nb - 1; j >= 0; --j, ++it) {
      const int s = slot(it);
      mbar_wait(&bars.k_empty[s], phase(it) ^ 1);
      mbar_expect_tx(&bars.k_full[s], L::kKVBytes);
      tma_load_4d(smem + L::kK + s * L::kKVBytes, tm_k, &bars.k_full[s], 0, j * BLOCK_N, h_kv, tile.b);
      mbar_wait(&bars.v_empty[s], phase(it) ^ 1);
      mbar_expect_tx(&bars.v_full[s], L::kKVBytes);
      tma_load_4d(smem + L::kV + s * L::kKVBytes, tm_vt, &bars.v_full[s], j * BLOCK_N, 0, h_kv, tile.b);
    }
  }
}

// One tile of one consumer warpgroup: step 07's software-pipelined mainloop (S_j and P_{j+1} V_{j+1} issued
// together, the softmax of S_j placed under the product in the PTX), with the descales: S_j times scale dq dk[j]; O is kept
// in units of the last product's dv, rescaled by alpha * dv[j+1] / dv[j] before P_j V_j joins it.
HP_DEVICE void mainloop(Accum<D>& acc, unsigned char* smem, Barriers& bars, const Fp8Params& f, const Tile& tile,
                        int nb, uint32_t q_parity, int& it, int wg) {
  const FaParams& p = f.base;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const uint32_t q_addr = smem_u32(smem + L::kQ) + wg * 64 * 128;
  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  const int m0_wg = tile.m_block * BLOCK_M + wg * 64, row0 = m0_wg + warp * 16 + lane / 4;
  const int64_t kv_row = ((int64_t)tile.b * p.Hkv + tile.h / (p.Hq / p.Hkv)) * f.nk;
  const float* dk = f.dk + kv_row;
  const float* dv = f.dv + kv_row;
  const float c_q = p.scale * LOG2E * f.dq[((int64_t)tile.b * p.Hq + tile.h) * f.nq + min(m0_wg, p.Sq - 1) / f.q_rows];
  auto needs_mask = [&](int n0) { return n0 + BLOCK_N > p.Skv || (p.causal && n0 + BLOCK_N - 1 > m0_wg + p.Skv - p.Sq); };
  float s[64];
  uint32_t p_frag[4][4];
  float alpha[2];
  mbar_wait(&bars.q_full, q_parity);

  int j = nb - 1;
  float dv_prev = dv[j];
  mbar_wait(&bars.k_full[slot(it)], phase(it));
  gemm_turn_begin(wg);
  gemm_qk(s, q_addr, k_addr + slot(it) * L::kKVBytes);
  gemm_turn_end(wg);
  wgmma_wait<0>();
  pin_registers(s);
  release(&bars.k_empty[slot(it)], lane);
  if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);
  softmax(s, acc.m, acc.l, alpha, c_q * dk[j]);
  convert_p_e4m3(s, p_frag, lane);

  for (j = nb - 2; j >= 0; --j, ++it) {
    const float c_j = c_q * dk[j], dv_j = dv[j];
    const int sk = slot(it + 1), sv = slot(it);
    mbar_wait(&bars.k_full[sk], phase(it + 1));
    gemm_turn_begin(wg);
    gemm_qk(s, q_addr, k_addr + sk * L::kKVBytes);
    mbar_wait(&bars.v_full[sv], phase(it));
    gemm_pv(acc.o, p_frag, v_addr + sv * L::kKVBytes);
    gemm_turn_end(wg);
    wgmma_wait<1>();
    pin_registers(s);
    release(&bars.k_empty[sk], lane);
    if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);
    softmax(s, acc.m, acc.l, alpha, c_j);
    wgmma_wait<0>();
    pin_registers(acc.o);
    pin_registers(p_frag);
    release(&bars.v_empty[sv], lane);
    const float ratio = dv_prev / dv_j;
    alpha[0] *= ratio;
    alpha[1] *= ratio;
    dv_prev = dv_j;
    rescale_o<D>(acc.o, alpha);
    convert_p_e4m3(s, p_frag, lane);  // only now: the registers of P_{j+1} were an operand in flight
  }
  release(&bars.q_empty, lane);

  mbar_wait(&bars.v_full[slot(it)], phase(it));
  gemm_turn_begin(wg);
  gemm_pv(acc.o, p_frag, v_addr + slot(it) * L::kKVBytes);
  gemm_turn_end(wg);
  wgmma_wait<0>();
  pin_registers(acc.o);
  release(&bars.v_empty[slot(it)], lane);
  ++it;
  // O in units of dv_prev (the last block's); P and l carry 2^P_LOG2, which O / l drops and lse must too
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc.o[i] *= dv_prev;
  acc.m[0] -= P_LOG2;
  acc.m[1] -= P_LOG2;
}

template <typename OutT>
__global__ void __launch_bounds__(NTHREADS, 1)
    fp8_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_vt, const Fp8Params f, int* tile_counter) {
  unsigned char* smem = smem_base();
  Barriers& bars = barriers<DS>();
  init_barriers(bars, &tm_q, &tm_k, &tm_vt, tile_counter);
  const TileScheduler<DS> sched(f.base);
  if (threadIdx.x < 128) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) producer(&tm_q, &tm_k, &tm_vt, smem, bars, f.base, sched);
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = threadIdx.x / 128 - 1;
  int it = 0, q_round = 0;
  if (HFA_PINGPONG && wg == 1) named_bar_arrive(kBarWarpgroup0, 2 * 128);
  for (int t = sched.first(); t < sched.total; t = sched.next(t)) {
    const Tile tile = sched(t);
    const int nb = num_kv_blocks(f.base, tile.m_block);
    Accum<D> acc;
    acc.zero();
    if (nb > 0) mainloop(acc, smem, bars, f, tile, nb, q_round++ & 1, it, wg);
    epilogue<OutT, D>(acc, f.base, tile, wg);
  }
}

template <typename OutT>
int launch(const Fp8Params& f, cudaStream_t stream) {
  const FaParams& p = f.base;
  if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;
  CUtensorMap tm_q, tm_k, tm_vt;
  int err = make_tensor_map<uint8_t>(&tm_q, p.q, D, p.Sq, p.Hq, p.B, p.q_ss, p.q_sh, p.q_sb, BLOCK_M);
  if (!err) err = make_tensor_map<uint8_t>(&tm_k, p.k, D, p.Skv, p.Hkv, p.B, p.k_ss, p.k_sh, p.k_sb, BLOCK_N);
  if (!err) err = make_tensor_map<uint8_t>(&tm_vt, p.v, p.Skv, D, p.Hkv, p.B, p.v_ss, p.v_sh, p.v_sb, D);
  if (err) return err;
  int* counter = nullptr;
  int grid = 0;
  err = persistent_setup(p, stream, &counter, &grid);
  if (err) return err;
  auto kernel = fp8_kernel<OutT>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
  if (e != cudaSuccess) return (int)e;
  kernel<<<grid, NTHREADS, L::kBytes, stream>>>(tm_q, tm_k, tm_vt, f, counter);
  return (int)cudaGetLastError();
}
}  // namespace fp8
}  // namespace hfa

extern "C" int fa8_launch(const Fp8Params* f, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (f->base.D != 128) return (int)cudaErrorInvalidValue;
  return f->base.is_bf16 ? hfa::fp8::launch<__nv_bfloat16>(*f, s) : hfa::fp8::launch<__half>(*f, s);
}
