// fa_primitives.cuh: the hardware primitives of step 06, one small function per PTX instruction.
// Given to you: read them, do not edit. Fragment layouts follow the PTX ISA, section "Matrix
// Fragments for mma.m16n8k16 with floating point type", and the ldmatrix section:
//
//   lane = threadIdx.x % 32,  g = lane / 4 (groupID),  t = lane % 4 (thread in group)
//   A (16x16, row-major)   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//                          a[2] = A[g][2t+8..+9]    a[3] = A[g+8][2t+8..+9]
//   B (16x8,  "col")       b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   C (16x8,  fp32)        c[0..1] = C[g][2t..2t+1] c[2..3] = C[g+8][2t..2t+1]
//   ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of lane L
//   receives row L/4, columns 2(L%4)..+1 of matrix i (.trans: column L/4, rows 2(L%4)..+1).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "fa_params.h"

#define FA_DEVICE __device__ __forceinline__
// The CPU check of this step (facourse.emu) compiles these headers with g++ and FA_CPU_EMULATION set:
// it brings C++ versions of the PTX instructions, so only those are left out (#ifndef) below.
// Marks a body of student_kernel.cu that is still the stub (the notebook reports it as not implemented).
#define FA_TODO(name)

FA_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#ifndef FA_CPU_EMULATION
// ---- cp.async: 16 bytes global -> shared, bypassing registers (and L1: .cg) -------------------
// When `valid` is false nothing is read and the 16 bytes in shared memory are zero-filled.
FA_DEVICE void cp_async_16(uint32_t dst, const void* src, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
FA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
FA_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ---- ldmatrix: four 8x8 b16 matrices from shared memory into registers -------------------------
FA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
FA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---- mma.sync m16n8k16: C[16x8] += A[16x16] B[16x8], fp32 accumulate ---------------------------
#endif  // FA_CPU_EMULATION
template <typename T> struct Mma;
#ifndef FA_CPU_EMULATION
template <> struct Mma<__half> {
  static FA_DEVICE void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__nv_bfloat16> {
  static FA_DEVICE void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
#endif  // FA_CPU_EMULATION
template <typename T>
FA_DEVICE void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Mma<T>::run(c, a, b0, b1);
}

// ---- two fp32 -> one register of two 16-bit values (x in the low half) --------------------------
template <typename T> FA_DEVICE uint32_t pack2(float x, float y);
template <> FA_DEVICE uint32_t pack2<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> FA_DEVICE uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---- the four lanes of a quad (same g) hold one row of a C fragment ------------------------------
FA_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
FA_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- XOR swizzle of a [rows][D] tile of 16-bit elements ------------------------------------------
// A row is D/8 chunks of 16 bytes. Chunk c of row r is stored at chunk c ^ (r % 8): the 8 rows an
// ldmatrix reads at one logical chunk land in 8 different chunks of a 128-byte line, so the 32 banks
// are each hit once (no conflict). Needs D >= 64.
// (The course's ladder builds these same files with row-major tiles, element (r, c) at r * D + c, to
// measure the bank conflicts the swizzle removes: rungs v2 and v3, whose harness traits, named by
// FA_HARNESS_TRAITS, say kSwizzle = false. The exercise never sets it.)
#ifdef FA_HARNESS_TRAITS
constexpr bool kSwizzleTiles = FA_HARNESS_TRAITS::kSwizzle;
#else
constexpr bool kSwizzleTiles = true;
#endif
template <int D>
FA_DEVICE int swizzle(int row, int col) {
  static_assert(D % 64 == 0, "the swizzle needs at least 8 chunks of 16 bytes per row");
  if constexpr (!kSwizzleTiles) return row * D + col;
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

// ---- the online softmax's scalar steps, for one row in log2 units (namespace fa: the names stay free
// for helpers of your own). Every online softmax of the step (yours, the ladder's) is made of these.
namespace fa {
// exp2 on MUFU.EX2 alone (ex2.approx.ftz: about 2 ulp; exp2f adds a fix-up for results below 2^-126,
// which P, stored as fp16/bf16 next, does not need)
#ifndef FA_CPU_EMULATION
FA_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif
// The running max as the offset of a row's exponents: m, or 0 while the row has seen only masked keys
// (m = -inf), where exp2(s - m) would compute -inf - (-inf) = NaN.
FA_DEVICE float finite_max(float m) { return m == -INFINITY ? 0.f : m; }
// alpha = exp2(m_old - m_new), the factor l and O are rescaled by when the running max moves from m_old
// to m_new: exactly 1 when it stays (exp2_approx(0) is not promised to be), 0 from a row that saw only
// masked keys.
FA_DEVICE float rescale_factor(float m_old, float m_new) {
  return m_new == m_old ? 1.f : exp2_approx(m_old - finite_max(m_new));
}
// How the running max moves: online_softmax_update's template argument Rescale. The exercise's is this
// one: the exact max of the scores seen so far, and O_i *= alpha at every tile. (ladder/harness.cuh
// holds the other, FlashAttention-4's lazy rescale, for the course's fastest rung.)
struct EagerRescale {
  static constexpr bool kLazy = false;   // true: O_i is rescaled only when some alpha of the warp != 1
  static FA_DEVICE float running_max(float m_old, float tile_max) { return fmaxf(m_old, tile_max); }
};
}  // namespace fa
