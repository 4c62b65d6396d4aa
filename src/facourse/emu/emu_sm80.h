// emu_sm80.h: the instructions of step 06's fa_primitives.cuh on the host, for the CPU check
// (facourse.cuda_host_check). Included before student_kernel.cu; fa_primitives.cuh itself (its
// swizzle, pack2, quad_max/quad_sum, mma_16816 and the online softmax's scalar steps) comes next.
//
// ldmatrix_x4 (.trans), mma.sync m16n8k16 (fp32 sums of fp16/bf16 products, each lane computing its
// C elements from the lanes' A and B registers, after the PTX ISA's fragment tables) and cp_async_16
// (a counted 16-byte memcpy, the source checked against the rows the caller may read).
#pragma once
#include "emu_warp.h"

// ---- shared memory and cp.async ---------------------------------------------------------------
inline unsigned char* fa_smem_base = nullptr;   // the emulated shared memory
inline size_t fa_smem_size = 0;
inline const unsigned char* fa_gmem_lo = nullptr;   // what cp_async_16 may read when valid
inline const unsigned char* fa_gmem_hi = nullptr;
inline std::atomic<long> fa_cp_calls{0}, fa_cp_bad_src{0}, fa_cp_bad_dst{0}, fa_cp_misaligned{0};
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)((const unsigned char*)p - fa_smem_base); }
inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  ++fa_cp_calls;
  if ((size_t)dst + 16 > fa_smem_size) { ++fa_cp_bad_dst; return; }
  if (dst % 16) ++fa_cp_misaligned;
  if (!valid) { std::memset(fa_smem_base + dst, 0, 16); return; }
  const unsigned char* s = (const unsigned char*)src;
  if (s < fa_gmem_lo || s + 16 > fa_gmem_hi) { ++fa_cp_bad_src; return; }
  if (((uintptr_t)s - (uintptr_t)fa_gmem_lo) % 16) ++fa_cp_misaligned;
  std::memcpy(fa_smem_base + dst, s, 16);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}

// ---- ldmatrix ----------------------------------------------------------------------------------
inline uint16_t fa_smem16(uint32_t byte_addr) {
  if ((size_t)byte_addr + 2 > fa_smem_size) { std::fprintf(stderr, "FA_HOST: ldmatrix reads outside shared memory\n"); std::exit(4); }
  uint16_t v; std::memcpy(&v, fa_smem_base + byte_addr, 2); return v;
}
inline void fa_ldmatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  if (!fa_warp) fa_no_warp("ldmatrix");
  fa_warp->slot[fa_lane][0] = addr;
  fa_sync();
  const int L = fa_lane;
  for (int i = 0; i < 4; ++i) {
    uint16_t v[2];
    for (int j = 0; j < 2; ++j) {
      if (!trans) v[j] = fa_smem16((uint32_t)fa_warp->slot[8 * i + L / 4][0] + 2 * (2 * (L % 4) + j));
      else v[j] = fa_smem16((uint32_t)fa_warp->slot[8 * i + 2 * (L % 4) + j][0] + 2 * (L / 4));
    }
    r[i] = (uint32_t)v[0] | ((uint32_t)v[1] << 16);
  }
  fa_sync();
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { fa_ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { fa_ldmatrix(r, addr, true); }

// ---- mma.sync m16n8k16 (fp32 accumulate): Mma<T>::run, which fa_primitives.cuh's mma_16816 calls --
template <typename T> struct Mma {
  static inline void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (!fa_warp) fa_no_warp("mma_16816");
    uint64_t* me = fa_warp->slot[fa_lane];
    for (int i = 0; i < 4; ++i) me[i] = a[i];
    me[4] = b0; me[5] = b1;
    fa_sync();
    auto half_of = [](uint32_t reg, int h) { return (uint16_t)(h ? reg >> 16 : reg & 0xffffu); };
    const int g = fa_lane >> 2, t = fa_lane & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      float acc = 0.f;
      for (int k = 0; k < 16; ++k) {
        const int la = 4 * (row % 8) + (k % 8) / 2, ra = (row >= 8) + 2 * (k >= 8);
        const int lb = 4 * col + (k % 8) / 2, rb = 4 + (k >= 8);
        acc += fa_to_float<T>(half_of((uint32_t)fa_warp->slot[la][ra], k & 1)) *
               fa_to_float<T>(half_of((uint32_t)fa_warp->slot[lb][rb], k & 1));
      }
      c[i] += acc;
    }
    fa_sync();
  }
};

namespace fa {
inline float exp2_approx(float x) { return std::exp2(x); }
}  // namespace fa
