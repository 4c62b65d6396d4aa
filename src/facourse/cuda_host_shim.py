"""The C++ text of step 06's CPU check (``facourse.cuda_host_check``): a host stand-in for
``fa_primitives.cuh`` and a driver program.

The student's ``student_kernel.cu`` is compiled by g++ (C++20) next to ``SHIM`` (saved as
``fa_primitives.cuh``) and an empty ``fa_harness.cuh``. A warp is 32 ``std::thread``s that meet at a
``std::barrier`` inside every warp-wide primitive, so the student's device functions run unchanged,
lane by lane:

* ``__shfl_xor_sync`` and friends (``quad_max``, ``quad_sum``): every lane posts its value, all meet,
  every lane reads its partner's;
* ``ldmatrix_x4`` (``.trans``): lanes post their row addresses into the emulated shared memory, then
  each lane reads the values the PTX ISA gives it;
* ``mma_16816``: lanes post their A, B, C fragments, then each lane computes its C elements (fp32
  sums of fp16/bf16 products);
* ``cp_async_16``: a 16-byte ``memcpy`` (or 16 zero bytes when ``valid`` is false), counted, with the
  source checked against the rows the caller may read.

A lane that returns drops out of the barrier, so a lane skipping a shuffle cannot hang the others.
What this cannot show (the real instructions' timing, bank conflicts, registers, the whole kernel)
only a GPU checks.
"""

SHIM = r"""
// fa_primitives.cuh, the HOST stand-in of facourse.cuda_host_check (CPU check of step 06). Not CUDA.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>

#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define FA_DEVICE inline
#define FA_TODO(name)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

// ---- 16-bit float types (bit patterns) ---------------------------------------------------------
struct __half { uint16_t __x; };
struct __nv_bfloat16 { uint16_t __x; };
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
using half = __half;
using nv_bfloat16 = __nv_bfloat16;
inline uint16_t fa_f2h(float f) { _Float16 h = (_Float16)f; uint16_t b; std::memcpy(&b, &h, 2); return b; }
inline float fa_h2f(uint16_t b) { _Float16 h; std::memcpy(&h, &b, 2); return (float)h; }
inline uint16_t fa_f2bf(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float fa_bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __half __float2half(float f) { return {fa_f2h(f)}; }
inline __half __float2half_rn(float f) { return {fa_f2h(f)}; }
inline float __half2float(__half h) { return fa_h2f(h.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {fa_f2bf(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {fa_f2bf(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return fa_bf2f(h.__x); }
inline __half2 __floats2half2_rn(float x, float y) { return {{fa_f2h(x)}, {fa_f2h(y)}}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float x, float y) { return {{fa_f2bf(x)}, {fa_f2bf(y)}}; }
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
struct fa_dim3 { unsigned x = 0, y = 0, z = 0; };

// ---- one emulated warp -------------------------------------------------------------------------
struct FaWarp {
  std::barrier<> bar{32};
  uint64_t slot[32][8];
};
inline FaWarp* fa_warp = nullptr;
inline thread_local int fa_lane = 0;
inline thread_local fa_dim3 threadIdx;
inline fa_dim3 blockIdx, blockDim{256, 1, 1}, gridDim{1, 1, 1};
inline void fa_sync() { fa_warp->bar.arrive_and_wait(); }
inline void fa_no_warp(const char* what) {
  std::fprintf(stderr, "FA_HOST: %s called where no warp runs (load_tile_async is run thread by thread)\n", what);
  std::exit(3);
}
template <class V> inline uint64_t fa_bits(V v) { uint64_t b = 0; std::memcpy(&b, &v, sizeof(V)); return b; }
template <class V> inline V fa_from(uint64_t b) { V v; std::memcpy(&v, &b, sizeof(V)); return v; }
template <class V> inline V fa_exchange(V v, int src) {
  if (!fa_warp) fa_no_warp("a warp shuffle");
  fa_warp->slot[fa_lane][0] = fa_bits(v);
  fa_sync();
  V r = (src >= 0 && src < 32) ? fa_from<V>(fa_warp->slot[src][0]) : v;
  fa_sync();
  return r;
}
template <class V> inline V __shfl_xor_sync(unsigned, V v, int m, int = 32) { return fa_exchange(v, fa_lane ^ m); }
template <class V> inline V __shfl_sync(unsigned, V v, int src, int w = 32) { return fa_exchange(v, (fa_lane & ~(w - 1)) + (src % w)); }
template <class V> inline V __shfl_down_sync(unsigned, V v, int d, int w = 32) {
  int s = fa_lane + d; return fa_exchange(v, (s & ~(w - 1)) == (fa_lane & ~(w - 1)) ? s : fa_lane);
}
template <class V> inline V __shfl_up_sync(unsigned, V v, int d, int w = 32) {
  int s = fa_lane - d; return fa_exchange(v, s >= (fa_lane & ~(w - 1)) ? s : fa_lane);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  if (!fa_warp) fa_no_warp("__ballot_sync");
  fa_warp->slot[fa_lane][0] = pred ? 1 : 0;
  fa_sync();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)fa_warp->slot[i][0] << i;
  fa_sync();
  return r;
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline void __syncwarp(unsigned = 0xffffffffu) { if (fa_warp) fa_sync(); }
inline void __syncthreads() {}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return std::min(1.f, std::max(0.f, x)); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
template <class V> inline V min(V a, V b) { return a < b ? a : b; }
template <class V> inline V max(V a, V b) { return a < b ? b : a; }

// ---- shared memory and cp.async ---------------------------------------------------------------
inline unsigned char* fa_smem_base = nullptr;   // the emulated shared memory
inline size_t fa_smem_size = 0;
inline const unsigned char* fa_gmem_lo = nullptr;   // what cp_async_16 may read when valid
inline const unsigned char* fa_gmem_hi = nullptr;
inline std::atomic<long> fa_cp_calls{0}, fa_cp_bad_src{0}, fa_cp_bad_dst{0}, fa_cp_misaligned{0};
inline uint32_t smem_addr(const void* p) {
  return (uint32_t)((const unsigned char*)p - fa_smem_base);
}
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

// ---- mma.sync m16n8k16 (fp32 accumulate) -------------------------------------------------------
template <typename T> inline float fa_to_float(uint16_t b);
template <> inline float fa_to_float<__half>(uint16_t b) { return fa_h2f(b); }
template <> inline float fa_to_float<__nv_bfloat16>(uint16_t b) { return fa_bf2f(b); }
template <typename T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
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

template <typename T> struct Mma {
  static inline void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_16816<T>(c, a, b0, b1); }
};

// ---- two fp32 -> one register of two 16-bit values (x in the low half) -------------------------
template <typename T> inline uint32_t pack2(float x, float y);
template <> inline uint32_t pack2<__half>(float x, float y) { return fa_f2h(x) | ((uint32_t)fa_f2h(y) << 16); }
template <> inline uint32_t pack2<__nv_bfloat16>(float x, float y) { return fa_f2bf(x) | ((uint32_t)fa_f2bf(y) << 16); }

inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

constexpr bool kSwizzleTiles = true;
template <int D>
inline int swizzle(int row, int col) {
  static_assert(D % 64 == 0, "the swizzle needs at least 8 chunks of 16 bytes per row");
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

namespace fa {
inline float exp2_approx(float x) { return std::exp2(x); }
inline float finite_max(float m) { return m == -INFINITY ? 0.f : m; }
inline float rescale_factor(float m_old, float m_new) {
  return m_new == m_old ? 1.f : exp2_approx(m_old - finite_max(m_new));
}
struct EagerRescale {
  static constexpr bool kLazy = false;
  static inline float running_max(float m_old, float tile_max) { return fmaxf(m_old, tile_max); }
};
}  // namespace fa
"""

DRIVER = r"""
// The driver of facourse.cuda_host_check: runs one of the student's device functions on inputs read
// from stdin (raw little-endian arrays) and writes its outputs to stdout.
#include "student_kernel.cu"
#include <string>
#include <thread>
#include <vector>

static void read_all(void* p, size_t n) {
  if (std::fread(p, 1, n, stdin) != n) { std::fprintf(stderr, "FA_HOST: short input\n"); std::exit(2); }
}
static void write_all(const void* p, size_t n) { std::fwrite(p, 1, n, stdout); }

template <class F> static void run_warp(F f) {   // f(lane) on 32 threads in lockstep at every primitive
  FaWarp w;
  fa_warp = &w;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane)
    lanes.emplace_back([&, lane] { fa_lane = lane; threadIdx.x = lane; f(lane); w.bar.arrive_and_drop(); });
  for (auto& t : lanes) t.join();
  fa_warp = nullptr;
}

#ifndef FA_NO_SOFTMAX
constexpr int NB = 8, DB = 16;   // BLOCK_N = 64 keys, D = 128
static void run_softmax(int ncalls) {
  for (int c = 0; c < ncalls; ++c) {
    static float s[32][NB][4], m[32][2], l[32][2], o[32][DB][4];
    float scale_log2;
    read_all(s, sizeof s); read_all(m, sizeof m); read_all(l, sizeof l); read_all(o, sizeof o);
    read_all(&scale_log2, 4);
    run_warp([&](int lane) { online_softmax_update<NB, DB>(s[lane], m[lane], l[lane], o[lane], scale_log2); });
    write_all(s, sizeof s); write_all(m, sizeof m); write_all(l, sizeof l); write_all(o, sizeof o);
  }
}
#endif

#ifndef FA_NO_LOAD
template <int ROWS, int D>
static void run_load(int rows_valid, int row_stride) {
  constexpr int NTHREADS = 256;
  std::vector<uint16_t> g((size_t)ROWS * row_stride);
  read_all(g.data(), g.size() * 2);
  const size_t guard = 2 * (size_t)D;   // elements after the tile: writes there are out of bounds
  std::vector<uint16_t> smem((size_t)ROWS * D + guard, 0x7e00);   // NaN: never written
  fa_smem_base = (unsigned char*)smem.data();
  fa_smem_size = smem.size() * 2;
  const __half* gmem = (const __half*)g.data();
  fa_gmem_lo = (const unsigned char*)g.data();
  const int rv = rows_valid < ROWS ? rows_valid : ROWS;   // rows it may read
  fa_gmem_hi = rv > 0 ? (const unsigned char*)(g.data() + (size_t)(rv - 1) * row_stride + D) : fa_gmem_lo;
  fa_cp_calls = fa_cp_bad_src = fa_cp_bad_dst = fa_cp_misaligned = 0;
  for (int tid = 0; tid < NTHREADS; ++tid) {
    threadIdx.x = tid;
    load_tile_async<ROWS, D, NTHREADS>((__half*)smem.data(), gmem, (int64_t)row_stride, rows_valid, tid);
  }
  long counts[4] = {fa_cp_calls, fa_cp_bad_src, fa_cp_bad_dst, fa_cp_misaligned};
  write_all(smem.data(), smem.size() * 2);
  write_all(counts, sizeof counts);
}
#endif

#ifndef FA_NO_QK
template <int D>
static void run_qk() {   // S = Q K^T of 16 query rows and 64 keys: the harness's q_frag, the student's qk_tile
  std::vector<uint16_t> q(16 * D), k(64 * D), smem((16 + 64) * D);
  read_all(q.data(), q.size() * 2); read_all(k.data(), k.size() * 2);
  for (int r = 0; r < 16; ++r) for (int c = 0; c < D; ++c) smem[swizzle<D>(r, c)] = q[r * D + c];
  for (int r = 0; r < 64; ++r) for (int c = 0; c < D; ++c) smem[16 * D + swizzle<D>(r, c)] = k[r * D + c];
  fa_smem_base = (unsigned char*)smem.data(); fa_smem_size = smem.size() * 2;
  const __half* sQ = (const __half*)smem.data();
  const __half* sK = sQ + 16 * D;
  static float s[32][8][4];
  run_warp([&](int lane) {
    uint32_t q_frag[D / 16][4];
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(q_frag[kk], smem_addr(sQ + swizzle<D>(lane & 15, kk * 16 + (lane >> 4) * 8)));
    qk_tile<D, 64, __half>(s[lane], q_frag, sK, lane);
  });
  write_all(s, sizeof s);
}

template <int D>
static void run_pv() {   // O += P V of 16 rows and 64 keys: the student's pv_tile
  std::vector<uint16_t> v(64 * D), smem(64 * D);
  static float p[32][8][4], o[32][D / 8][4];
  read_all(p, sizeof p); read_all(v.data(), v.size() * 2); read_all(o, sizeof o);
  for (int r = 0; r < 64; ++r) for (int c = 0; c < D; ++c) smem[swizzle<D>(r, c)] = v[r * D + c];
  fa_smem_base = (unsigned char*)smem.data(); fa_smem_size = smem.size() * 2;
  const __half* sV = (const __half*)smem.data();
  run_warp([&](int lane) { pv_tile<D, 64, __half>(o[lane], p[lane], sV, lane); });
  write_all(o, sizeof o);
}
#endif

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
#ifndef FA_NO_SOFTMAX
  if (mode == "softmax") { run_softmax(std::atoi(argv[2])); return 0; }
#endif
#ifndef FA_NO_LOAD
  if (mode == "load") {
    const int rows = std::atoi(argv[2]), d = std::atoi(argv[3]), rv = std::atoi(argv[4]), rs = std::atoi(argv[5]);
    if (rows == 64 && d == 128) run_load<64, 128>(rv, rs);
    else if (rows == 128 && d == 128) run_load<128, 128>(rv, rs);
    else if (rows == 64 && d == 64) run_load<64, 64>(rv, rs);
    else return 2;
    return 0;
  }
#endif
#ifndef FA_NO_QK
  if (mode == "qk") { if (std::atoi(argv[2]) == 64) run_qk<64>(); else run_qk<128>(); return 0; }
  if (mode == "pv") { if (std::atoi(argv[2]) == 64) run_pv<64>(); else run_pv<128>(); return 0; }
#endif
  return 2;
}
"""
