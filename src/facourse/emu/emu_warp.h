// emu_warp.h: the CPU check of steps 06 and 07 (facourse.cuda_host_check), what both steps share.
// Host C++ (g++ -std=c++20), not CUDA: the student's device functions and the real primitive headers
// of the step compile against it and run unchanged, thread by thread. The headers see
// FA_CPU_EMULATION and leave out their inline PTX; emu_sm80.h and emu_hopper.h stand in for it.
//
// A warp is 32 threads that meet at a barrier inside every warp-wide primitive: a shuffle posts every
// lane's value, all meet, every lane reads its partner's; a lane that returns drops out of the barrier,
// so a lane skipping a shuffle cannot hang the others. Each emulated thread is a fiber (ucontext), and
// all of a run's fibers take turns on one OS thread, switching only where a thread waits: with an OS
// thread each, the 384 threads of a Hopper CTA meeting at every shuffle spent most of their CPU time in
// the kernel's scheduler. A failure (fa_fail) ends the process with one message; a thread that waits
// counts as blocked, and a whole round of turns in which every thread is blocked and nothing moved is a
// deadlock, which the driver reports (fa_on_deadlock).
#pragma once
#define FA_CPU_EMULATION 1
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

// ---- 16-bit float types (bit patterns) ---------------------------------------------------------
struct __half { uint16_t __x; };
struct __nv_bfloat16 { uint16_t __x; };
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
using half = __half;
using nv_bfloat16 = __nv_bfloat16;
inline uint16_t fa_f2h(float f) { _Float16 h = (_Float16)f; uint16_t b; std::memcpy(&b, &h, 2); return b; }
// fp16 -> float by table: without F16C, g++ turns (float)_Float16 into a libgcc call, which took a third
// of the Hopper emulator's time (its GEMMs convert every operand)
struct FaHalfTable {
  float f[65536];
  FaHalfTable() {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t x = (uint16_t)b;
      _Float16 h;
      std::memcpy(&h, &x, 2);
      f[b] = (float)h;
    }
  }
};
inline const FaHalfTable fa_half_table;
__attribute__((always_inline)) inline float fa_h2f(uint16_t b) { return fa_half_table.f[b]; }
inline uint16_t fa_f2bf(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
__attribute__((always_inline)) inline float fa_bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f;
}
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

// ---- failures: the first one ends the process with its message ---------------------------------
inline std::string fa_str(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}
inline void (*fa_on_fail)() = nullptr;   // the driver's hook: write out what it has so far
inline bool fa_failed = false;
[[noreturn]] inline void fa_fail(const std::string& msg, int code = 3) {
  if (!fa_failed) {   // a failure inside the hook ends the run with its own message
    fa_failed = true;
    if (fa_on_fail) fa_on_fail();
  }
  std::fflush(stdout);
  std::fprintf(stderr, "FA_HOST: %s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

// ---- deadlock accounting: a thread inside a wait counts as blocked ------------------------------
inline long fa_progress = 0;
inline int fa_blocked = 0, fa_live = 0;
struct FaBlocked {
  FaBlocked() { ++fa_blocked; }
  ~FaBlocked() { --fa_blocked; ++fa_progress; }
};

// ---- fibers: the emulated threads of one run, taking turns on this OS thread --------------------
constexpr int FA_MAX_THREADS = 1024;
constexpr int FA_DRIVER = FA_MAX_THREADS;   // fa_self outside a run: the driver's own code
constexpr size_t FA_STACK = 512 << 10;      // per thread, reserved, not committed (one guard page below)
inline int fa_self = FA_DRIVER;             // the thread whose turn it is
inline void (*fa_on_deadlock)() = nullptr;  // the driver's report; without one, a deadlock runs into its time limit
struct FaFiber {
  ucontext_t ctx;
  bool done = false;
};
inline std::vector<FaFiber> fa_fibers;
inline ucontext_t fa_driver_ctx;
inline long fa_idle_turns = 0, fa_idle_since = -1;
inline const std::function<void(int)>* fa_fiber_body = nullptr;

// The next unfinished thread's turn. Every wait calls it until its condition holds, so a round of turns in
// which all live threads were blocked and fa_progress did not move is a deadlock.
inline void fa_yield() {
  const int n = (int)fa_fibers.size(), me = fa_self;
  if (fa_blocked >= fa_live && fa_progress == fa_idle_since) {
    if (++fa_idle_turns > 2L * fa_live + 2) {
      if (fa_on_deadlock) fa_on_deadlock();
      fa_idle_turns = 0;
    }
  } else {
    fa_idle_turns = 0;
    fa_idle_since = fa_progress;
  }
  int next = me;
  do next = (next + 1) % n; while (fa_fibers[next].done && next != me);
  if (next == me) return;
  fa_self = next;
  swapcontext(&fa_fibers[me].ctx, &fa_fibers[next].ctx);
}
template <class P> inline void fa_wait_until(P ready) {   // a blocked wait: other threads run until ready()
  if (ready()) return;
  FaBlocked b;
  while (!ready()) fa_yield();
}
inline void fa_fiber_main(int i) {
  (*fa_fiber_body)(i);
  fa_fibers[i].done = true;
  --fa_live;
  ++fa_progress;
  if (fa_live == 0) setcontext(&fa_driver_ctx);
  fa_yield();
}
// body(i) for i in 0 .. count-1, each an emulated thread; returns when all have returned.
inline void fa_run_fibers(int count, const std::function<void(int)>& body) {
  if (count < 1 || count > FA_MAX_THREADS) { std::fprintf(stderr, "FA_HOST: %d threads\n", count); std::_Exit(7); }
  static std::vector<char*> stacks;   // kept for the next run (a driver runs a warp once per call)
  const long page = sysconf(_SC_PAGESIZE);
  while ((int)stacks.size() < count) {
    void* mem = mmap(nullptr, FA_STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) { std::fprintf(stderr, "FA_HOST: no memory for a thread's stack\n"); std::_Exit(7); }
    mprotect(mem, page, PROT_NONE);   // an overflow faults here instead of writing over another stack
    stacks.push_back((char*)mem);
  }
  fa_fibers.assign(count, FaFiber{});
  fa_fiber_body = &body;
  fa_live = count;
  fa_blocked = 0;
  for (int i = 0; i < count; ++i) {
    FaFiber& f = fa_fibers[i];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stacks[i] + page;
    f.ctx.uc_stack.ss_size = FA_STACK;
    f.ctx.uc_link = &fa_driver_ctx;
    makecontext(&f.ctx, (void (*)())fa_fiber_main, 1, i);
  }
  fa_self = 0;
  swapcontext(&fa_driver_ctx, &fa_fibers[0].ctx);
  fa_self = FA_DRIVER;
  fa_fibers.clear();
  fa_fiber_body = nullptr;
}

// A barrier of `count` threads (std::barrier's arrive_and_wait and arrive_and_drop, for fibers).
struct FaBarrier {
  int expected, arrived = 0;
  long phase = 0;
  explicit FaBarrier(int count) : expected(count) {}
  void complete() { arrived = 0; ++phase; ++fa_progress; }
  void arrive_and_wait() {
    const long mine = phase;
    if (++arrived == expected) return complete();
    fa_wait_until([&] { return phase != mine; });
  }
  void arrive_and_drop() {
    if (--expected > 0 && arrived == expected) complete();
  }
};

// ---- warps: 32 threads in lockstep at every warp-wide primitive --------------------------------
struct FaWarp {
  FaBarrier bar{32};
  uint64_t slot[32][8];
};
// what a GPU keeps per thread, one entry per emulated thread (and one for the driver's own code)
inline FaWarp* fa_warp_v[FA_MAX_THREADS + 1];
inline int fa_lane_v[FA_MAX_THREADS + 1];
inline fa_dim3 fa_thread_idx_v[FA_MAX_THREADS + 1];
#define fa_warp (fa_warp_v[fa_self])
#define fa_lane (fa_lane_v[fa_self])
#define threadIdx (fa_thread_idx_v[fa_self])
inline fa_dim3 blockIdx, blockDim{256, 1, 1}, gridDim{1, 1, 1};
inline FaBarrier* fa_cta = nullptr;   // __syncthreads, where a driver runs a whole CTA
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
inline void __syncthreads() { if (fa_cta) fa_cta->arrive_and_wait(); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __trap() { std::fprintf(stderr, "FA_HOST: __trap()\n"); std::_Exit(6); }
inline float fa_exp2(float x) { return std::exp2(x); }
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

template <typename T> inline float fa_to_float(uint16_t b);
template <> inline float fa_to_float<__half>(uint16_t b) { return fa_h2f(b); }
template <> inline float fa_to_float<__nv_bfloat16>(uint16_t b) { return fa_bf2f(b); }
