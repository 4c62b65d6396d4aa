// hopper_primitives.cuh: the Hopper (sm_90a) instructions of step 07, one small named device
// function each, written as inline PTX. Nothing here knows about attention.
//
//   mbarrier    mbar_init, mbar_expect_tx, mbar_arrive, mbar_wait (phase parity)
//   TMA         tma_load_4d (cp.async.bulk.tensor), prefetch_tensormap; bulk_reduce_add_f32,
//               bulk_commit/wait, fence_proxy_async_shared (step 08's Hopper backward adds dQ with them)
//   WGMMA       smem_desc (shared-memory matrix descriptor), smem_desc_add, wgmma_fence/commit/wait,
//               wgmma_ss_n128 (A and B from shared memory), wgmma_rs<N> (A from registers),
//               wgmma_ss<T, N, TA, TB> (the shared-memory form at N 64 to 192, either operand MN-major)
//   warpgroups  setmaxnreg_inc/dec, named_bar_sync/arrive
//   math        exp2_approx, quad_max/quad_sum, pack2 (two floats -> one f16x2/bf16x2 register)
//
// Compile with -gencode=arch=compute_90a,code=sm_90a: wgmma and setmaxnreg exist only in the
// arch-specific target (the plain sm_90 pass rejects them).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only: the host encodes maps through the runtime's entry point)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#define HP_DEVICE __device__ __forceinline__
// The CPU check of this step (facourse.emu) compiles these headers with g++ and FA_CPU_EMULATION set:
// it brings C++ versions of the PTX instructions, so only those are left out (#ifndef) below.

namespace hp {

HP_DEVICE uint32_t smem_u32(const void* ptr) { return static_cast<uint32_t>(__cvta_generic_to_shared(ptr)); }

#ifndef FA_CPU_EMULATION
// ------------------------------------------------------------------------------ mbarrier
// An mbarrier completes a phase when its pending arrivals reach zero AND the transaction bytes it
// was told to expect (expect_tx) have landed. Waiters name the phase by its parity (0, 1, 0, ...).
HP_DEVICE void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Make the initialised barriers visible to the async proxy (TMA) before any thread uses them.
HP_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also announces `bytes` of TMA traffic this phase must wait for.
HP_DEVICE void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
HP_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
HP_DEVICE bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
HP_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// Block until the phase with this parity has completed. A fresh barrier sits in phase 0, so a wait
// on parity 1 returns at once: producers start their "slot is empty" waits there. A wait longer
// than HP_DEADLOCK_NS is a deadlock (a lost arrival, a wrong parity): trap, so that the launch fails
// with an error instead of hanging the GPU.
#ifndef HP_DEADLOCK_NS
#define HP_DEADLOCK_NS 4000000000ull
#endif
#ifndef HP_WAIT_SPIN  // 1: every wait without the trap (a measurement switch: a deadlock then hangs)
#define HP_WAIT_SPIN 0
#endif
HP_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = HP_WAIT_SPIN ? 0 : global_timer_ns();
  while (!mbar_try_wait(bar, parity))
    if (!HP_WAIT_SPIN && global_timer_ns() - t0 > HP_DEADLOCK_NS) __trap();
}
// The same wait without the deadlock trap, for code whose registers are tight: a trap in a warpgroup's
// code made ptxas serialise every WGMMA of step 08's backward consumers for want of registers (C7512).
// Use it only where a partner (the producer, waiting on the matching "empty" barrier) keeps the trap.
HP_DEVICE void mbar_wait_spin(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ------------------------------------------------------------------------------ TMA
// Copy one box of a 4-D tensor (coordinates innermost first) into shared memory; the barrier's
// transaction count drops by the box's bytes when it lands. Rows past the tensor's end arrive as 0.
HP_DEVICE void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Fetch one box of a 4-D tensor into L2 only (no shared memory, no barrier): a later tma_load_4d of it hits L2.
HP_DEVICE void tma_prefetch_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
HP_DEVICE void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Add `bytes` of fp32 from shared memory into global memory, element by element in L2 (atomic per
// element, in no fixed order across CTAs); completion is tracked by bulk groups.
HP_DEVICE void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               ::"l"(dst), "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
HP_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Wait until at most N bulk groups still read their shared-memory source (the buffer may be reused)...
template <int N>
HP_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// ... or are still in flight at all (their writes done and visible to this thread).
template <int N>
HP_DEVICE void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
// This thread's ordinary shared-memory stores become visible to the async proxy (WGMMA, bulk copies)
// that reads them next: after the stores, before the barrier that hands the buffer over.
HP_DEVICE void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif  // FA_CPU_EMULATION

// ------------------------------------------------------------------------------ WGMMA
// Shared-memory matrix descriptor (PTX ISA, "matrix descriptor"): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 62-63 swizzle
// (1 = 128-byte). Every operand of this step is stored in 128-byte swizzled panels of 64 columns,
// exactly as TMA's SWIZZLE_128B writes them; a panel starts on a 1024-byte boundary.
HP_DEVICE uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lead_bytes >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// The descriptor of the operand `bytes` further on: the address field is the low 14 bits of (address >> 4), and a
// CTA's shared memory (under 256 KB) keeps address + bytes inside it, so the sum never carries into the next field.
HP_DEVICE uint64_t smem_desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
template <typename T> struct WgmmaType;
template <> struct WgmmaType<__half> { static constexpr const char* name = "f16"; };
template <> struct WgmmaType<__nv_bfloat16> { static constexpr const char* name = "bf16"; };
#ifndef FA_CPU_EMULATION
HP_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
HP_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Wait until at most N committed groups of this warpgroup are still in flight.
template <int N>
HP_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Registers that an in-flight wgmma reads or writes must not be touched (or moved) by the compiler
// until the wait: this empty asm pins them.
template <int N>
HP_DEVICE void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
HP_DEVICE void pin_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

#define HP_ACC8(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
                   "+f"(d[b + 6]), "+f"(d[b + 7])
#define HP_R0_31 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HP_R32_63 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
                  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define HP_R32_39 "%32, %33, %34, %35, %36, %37, %38, %39"
#define HP_R64_79 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define HP_R80_87 "%80, %81, %82, %83, %84, %85, %86, %87"
#define HP_R88_95 "%88, %89, %90, %91, %92, %93, %94, %95"

// The shared-memory form in PTX: A's and B's descriptors, the accumulate flag and the two transpose
// immediates are the operands after the N/2 accumulators (their numbers: A_ .. TB_).
#define HP_WGMMA_SS(SHAPE, TY, REGS, A_, B_, P_, TA_, TB_, ...)                                              \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " P_ ", 0;\n"                                            \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" REGS "}, " A_ ", " B_ ", p, 1, 1, " \
               TA_ ", " TB_ ";\n}\n"                                                                        \
               : __VA_ARGS__                                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB))
#define HP_WGMMA_SS_T(SHAPE, REGS, A_, B_, P_, TA_, TB_, ...)                     \
  if constexpr (std::is_same<T, __half>::value)                                   \
    HP_WGMMA_SS(SHAPE, "f16", REGS, A_, B_, P_, TA_, TB_, __VA_ARGS__);           \
  else                                                                            \
    HP_WGMMA_SS(SHAPE, "bf16", REGS, A_, B_, P_, TA_, TB_, __VA_ARGS__)

// D[64 x N] (+)= A[64 x 16] * B[16 x N], both from shared memory. TA = 0: A K-major (rows of k values,
// as Q in S = Q K^T); TA = 1: A MN-major (A^T stored, its m contiguous: step 08's dQ = dS K reads dS^T).
// TB likewise for B (0: K-major, as K in S = Q K^T; 1: MN-major, as V in O = P V).
// Accumulator layout per thread (warp w of the warpgroup, lane l): d[4j + 2h + e] is row
// 16w + l/4 + 8h, column 8j + 2(l%4) + e -- the mma.sync C fragment, stacked N/8 times along N.
template <typename T, int N, int TA, int TB>
HP_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(N == 64 || N == 80 || N == 128 || N == 160 || N == 176 || N == 192,
                "wgmma_ss: N is 64, 80, 128, 160, 176 or 192");
  if constexpr (N == 192) {  // wider key blocks of S = Q K^T (step 07's HFA_BLOCK_N)
    HP_WGMMA_SS_T("m64n192k16", HP_R0_31 ", " HP_R32_63 ", " HP_R64_79 ", " HP_R80_87 ", " HP_R88_95, "%96", "%97", "%98", "%99",
                  "%100", HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48),
                  HP_ACC8(56), HP_ACC8(64), HP_ACC8(72), HP_ACC8(80), HP_ACC8(88));
  } else if constexpr (N == 176) {
    HP_WGMMA_SS_T("m64n176k16", HP_R0_31 ", " HP_R32_63 ", " HP_R64_79 ", " HP_R80_87, "%88", "%89", "%90", "%91", "%92",
                  HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48), HP_ACC8(56),
                  HP_ACC8(64), HP_ACC8(72), HP_ACC8(80));
  } else if constexpr (N == 160) {
    HP_WGMMA_SS_T("m64n160k16", HP_R0_31 ", " HP_R32_63 ", " HP_R64_79, "%80", "%81", "%82", "%83", "%84",
                  HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48), HP_ACC8(56),
                  HP_ACC8(64), HP_ACC8(72));
  } else if constexpr (N == 128) {
    HP_WGMMA_SS_T("m64n128k16", HP_R0_31 ", " HP_R32_63, "%64", "%65", "%66", "%67", "%68",
                  HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48), HP_ACC8(56));
  } else if constexpr (N == 80) {  // step 08's query blocks of 80 rows (its non-causal backward at D 128)
    HP_WGMMA_SS_T("m64n80k16", HP_R0_31 ", " HP_R32_39, "%40", "%41", "%42", "%43", "%44",
                  HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32));
  } else {
    HP_WGMMA_SS_T("m64n64k16", HP_R0_31, "%32", "%33", "%34", "%35", "%36",
                  HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24));
  }
}
#undef HP_WGMMA_SS_T
#undef HP_WGMMA_SS

// S = Q K^T: N = 128, A and B K-major.
template <typename T>
HP_DEVICE void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  wgmma_ss<T, 128, 0, 0>(d, desc_a, desc_b, accumulate);
}

// D[64 x N] += A[64 x 16] * B[16 x N] with A in registers (the mma.sync A fragment of each warp's
// 16 rows: 4 registers of two 16-bit values) and B MN-major in shared memory (the last immediate,
// "transpose B", is 1): O += P V with P straight from the softmax registers. N = 128 or 64.
template <typename T, int N>
HP_DEVICE void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 128 || N == 64, "wgmma_rs: N is the head dimension, 64 or 128");
  constexpr bool f16 = std::is_same<T, __half>::value;
  if constexpr (N == 128 && f16) {
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" HP_R0_31 ", " HP_R32_63
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48), HP_ACC8(56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  } else if constexpr (N == 128) {
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" HP_R0_31 ", " HP_R32_63
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24), HP_ACC8(32), HP_ACC8(40), HP_ACC8(48), HP_ACC8(56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  } else if constexpr (f16) {
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" HP_R0_31
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  } else {
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" HP_R0_31
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : HP_ACC8(0), HP_ACC8(8), HP_ACC8(16), HP_ACC8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  }
}
#undef HP_ACC8
#undef HP_R0_31
#undef HP_R32_63
#undef HP_R32_39
#undef HP_R64_79
#undef HP_R80_87
#undef HP_R88_95

// ------------------------------------------------------------------------------ warpgroups
// Hand registers from the producer warpgroup to the consumers (the whole warpgroup executes it).
template <int N>
HP_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
HP_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
// Named barriers 1..15 (0 is __syncthreads): sync waits for `count` threads, arrive does not wait.
HP_DEVICE void named_bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
HP_DEVICE void named_bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory"); }

// ------------------------------------------------------------------------------ math
HP_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif  // FA_CPU_EMULATION
// A row of an accumulator fragment lives in the 4 lanes of a quad (lanes 4r .. 4r+3).
HP_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
HP_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
template <typename T>
HP_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

}  // namespace hp
