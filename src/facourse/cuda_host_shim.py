"""The C++ text of the CPU checks of steps 06 and 07 (``facourse.cuda_host_check``): host stand-ins for
the steps' primitive headers, and a driver program per step.

The student's ``student_kernel.cu`` is compiled by g++ (C++20) next to a stand-in of the header it
includes, so the student's device functions run unchanged, thread by thread. What both steps share
(``_COMMON``): a warp is 32 threads (``std::thread``s) that meet at a ``std::barrier`` inside every
warp-wide primitive:

* ``__shfl_xor_sync`` and friends (``quad_max``, ``quad_sum``): every lane posts its value, all meet,
  every lane reads its partner's; a lane that returns drops out of the barrier, so a lane skipping a
  shuffle cannot hang the others;
* a failure (``fa_fail``) ends the process with one message; a thread that waits counts as blocked,
  so a driver can tell a deadlock (every thread blocked, nothing moving) from a slow run.

Step 06 (``SHIM`` for ``fa_primitives.cuh``, ``DRIVER``): ``ldmatrix_x4`` (``.trans``), ``mma_16816``
(fp32 sums of fp16/bf16 products, each lane computing its C elements from the lanes' A and B
registers, after the PTX ISA's fragment tables) and ``cp_async_16`` (a counted 16-byte ``memcpy``,
the source checked against the rows the caller may read).

Step 07 (``HOPPER_SHIM`` for ``hopper_primitives.cuh``, ``HOPPER_DRIVER``): one CTA of 384 threads
runs the kernel of ``hopper_harness.cuh`` (its device part) on an emulated shared memory:

* an **mbarrier** is the PTX ISA's state (pending arrivals, transaction bytes, completed phases);
  ``mbar_wait`` blocks until the phase of that parity has completed;
* **TMA** (``tma_load_4d``) copies a box of 64 columns from the tensor into shared memory as
  ``SWIZZLE_128B`` stores it (16-byte chunk c of a 128-byte row r at c XOR r % 8, rows past the tensor
  zero) and completes the box's bytes on the mbarrier;
* **WGMMA** (``wgmma_ss_n128``, ``wgmma_rs``) reads its operands through the shared-memory
  descriptors (start, leading and stride offsets, the 128-byte swizzle on address bits 4-6 XOR 7-9)
  and writes the accumulator layout of the PTX ISA (thread (warp w, lane l): ``d[4j + 2h + e]`` is row
  16w + l/4 + 8h, column 8j + 2(l%4) + e); the RS form's A is the mma.sync A fragment of each warp's
  16 rows. A product is *asynchronous*: it is computed at the ``wgmma_wait`` that ends its committed
  group, so an accumulator or A register changed while the product is in flight is caught, and a
  product never committed is never computed;
* named barriers (``bar.sync``/``bar.arrive``) count threads; ``setmaxnreg`` does nothing.

On top, the emulation checks the ring protocol as it runs: a consumer warp *holds* a slot (Q, K or V)
from its wait on the slot's full barrier until its arrival on the empty one. A WGMMA that reads a
slot its warp does not hold, a release while a WGMMA still reads the slot, a wait that returns for an
earlier phase (wrong parity), two releases from one warp, a TMA that overwrites a slot a warp holds:
each ends the run with a message naming it. A deadlock (every thread waiting) is reported with what
each thread waits for.

What this cannot show (the real instructions' timing and ordering, bank conflicts, registers and
spills, the compiler's reordering around ``pin_registers``) only a GPU checks.
"""

_COMMON = r"""#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define FA_TODO(name)

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
inline std::atomic<bool> fa_failed{false};
[[noreturn]] inline void fa_fail(const std::string& msg, int code = 3) {
  if (!fa_failed.exchange(true)) {
    if (fa_on_fail) fa_on_fail();
    std::fflush(stdout);
    std::fprintf(stderr, "FA_HOST: %s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));   // another thread is ending the process
}

// ---- deadlock accounting: a thread inside a wait counts as blocked ------------------------------
inline std::atomic<long> fa_progress{0};
inline std::atomic<int> fa_blocked{0}, fa_live{0};
struct FaBlocked {
  FaBlocked() { ++fa_blocked; }
  ~FaBlocked() { --fa_blocked; ++fa_progress; }
};

// ---- warps: 32 threads in lockstep at every warp-wide primitive --------------------------------
struct FaWarp {
  std::barrier<> bar{32};
  uint64_t slot[32][8];
};
inline thread_local FaWarp* fa_warp = nullptr;
inline thread_local int fa_lane = 0;
inline thread_local fa_dim3 threadIdx;
inline fa_dim3 blockIdx, blockDim{256, 1, 1}, gridDim{1, 1, 1};
inline std::barrier<>* fa_cta = nullptr;   // __syncthreads, where a driver runs a whole CTA
inline void fa_sync() { FaBlocked b; fa_warp->bar.arrive_and_wait(); }
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
inline void __syncthreads() { if (fa_cta) { FaBlocked b; fa_cta->arrive_and_wait(); } }
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

// ---- two fp32 -> one register of two 16-bit values (x in the low half) -------------------------
template <typename T> inline uint32_t pack2(float x, float y);
template <> inline uint32_t pack2<__half>(float x, float y) { return fa_f2h(x) | ((uint32_t)fa_f2h(y) << 16); }
template <> inline uint32_t pack2<__nv_bfloat16>(float x, float y) { return fa_f2bf(x) | ((uint32_t)fa_f2bf(y) << 16); }
template <typename T> inline float fa_to_float(uint16_t b);
template <> inline float fa_to_float<__half>(uint16_t b) { return fa_h2f(b); }
template <> inline float fa_to_float<__nv_bfloat16>(uint16_t b) { return fa_bf2f(b); }

// A row of an accumulator fragment lives in the 4 lanes of a quad.
inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
"""

_SM80 = r"""// ---- step 06: fa_primitives.cuh's names ------------------------------------------------------
#define FA_DEVICE inline
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

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

_HOPPER = r"""// ---- step 07: hopper_primitives.cuh's names ---------------------------------------------------
#define HP_DEVICE inline
#define __global__
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__

// What cuTensorMapEncodeTiled would encode, as the emulated TMA needs it (the driver fills it in).
struct CUtensorMap {
  const unsigned char* base = nullptr;
  int64_t dim[4] = {};      // (d, s, h, b), innermost first
  int64_t stride[4] = {};   // in bytes; stride[0] is the element's size
  int box_cols = 64, box_rows = 0;
  int id = -1;              // 0: Q, 1: K, 2: V
};
inline const char* fa_map_name(int id) { return id == 0 ? "Q" : id == 1 ? "K" : id == 2 ? "V" : "?"; }

// The emulation's hot loops (TMA copies, WGMMA products, checks of a slot) are compiled optimised; the
// rest, the student's code and the harness among it, builds fast at -O0.
#define FA_HOT __attribute__((optimize("O2")))

// ---- the CTA's shared memory, at the addresses the kernel sees ----------------------------------
constexpr uint32_t kFaSmemOrigin = 0x230;   // dynamic shared memory need not start on a 1 KB boundary
inline unsigned char* fa_smem_window = nullptr;
inline size_t fa_smem_bytes = 0;
inline uint32_t fa_smem_base_addr = 0;     // smem_base() of the harness: offsets in messages are from it
inline uint32_t fa_shared_addr(const void* p) {
  return (uint32_t)((const unsigned char*)p - fa_smem_window) + kFaSmemOrigin;
}
inline std::string fa_who();
FA_HOT inline unsigned char* fa_shared_ptr(uint32_t a, size_t n, const char* what) {
  if (a < kFaSmemOrigin || (size_t)(a - kFaSmemOrigin) + n > fa_smem_bytes)
    fa_fail(fa_str("%s: %s at shared address %#x, outside the CTA's shared memory", fa_who().c_str(), what, a));
  return fa_smem_window + (a - kFaSmemOrigin);
}
FA_HOT inline uint32_t fa_swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }   // bits 4-6 ^= bits 7-9

// ---- who runs: the producer (warpgroup 0) or a consumer warp ------------------------------------
inline int fa_warp_of() { return (int)(threadIdx.x / 32); }
inline bool fa_is_consumer() { return threadIdx.x >= 128; }
inline std::string fa_who() {
  const int t = (int)threadIdx.x;
  if (t < 128) return t == 0 ? "the producer (thread 0)" : fa_str("producer warpgroup thread %d", t);
  return fa_str("consumer warpgroup %d (warp %d, lane %d)", t / 128 - 1, t / 32, t % 32);
}

// ---- names the driver gives: mbarriers by symbolic id, and the ring's slots ----------------------
inline const char* const fa_bar_names[] = {"q_full", "q_empty", "k_full[0]", "k_full[1]", "k_empty[0]",
                                           "k_empty[1]", "v_full[0]", "v_full[1]", "v_empty[0]", "v_empty[1]",
                                           "tile_full[0]", "tile_full[1]", "tile_empty[0]", "tile_empty[1]"};
constexpr int kFaBars = 14;
inline uint32_t fa_bar_addr[kFaBars] = {};
inline int fa_nbars = 0;
inline int fa_bar_id(uint32_t a) {
  for (int i = 0; i < fa_nbars; ++i) if (fa_bar_addr[i] == a) return i;
  return -1;
}
inline std::string fa_bar_name(uint32_t a) {
  const int i = fa_bar_id(a);
  return i >= 0 ? std::string(fa_bar_names[i]) : fa_str("the mbarrier at shared address %#x", a);
}
struct FaRegion {
  uint32_t lo = 0, hi = 0;   // [lo, hi) shared addresses
  int full = -1, empty = -1;  // its mbarriers' ids
  std::string name;
};
inline std::vector<FaRegion> fa_regions;
inline bool fa_track = false;   // check the ring protocol (kernel runs)
inline int fa_region_at(uint32_t a) {
  for (size_t r = 0; r < fa_regions.size(); ++r) if (a >= fa_regions[r].lo && a < fa_regions[r].hi) return (int)r;
  return -1;
}
inline int fa_region_of_bar(int id, bool full) {
  for (size_t r = 0; r < fa_regions.size(); ++r) if ((full ? fa_regions[r].full : fa_regions[r].empty) == id) return (int)r;
  return -1;
}
// A consumer warp holds a slot from its wait on the slot's full barrier to its arrival on the empty one.
struct FaHold { long phase = -1; long uses = 0; };
inline FaHold fa_hold[16][8];   // [warp of the CTA][region]

// ---- the producer's calls, recorded (thread 0) --------------------------------------------------
enum FaEvent { kFaWait = 1, kFaExpect = 2, kFaTma = 3, kFaArrive = 4, kFaVerify = 5 };
using FaRecord = std::array<int64_t, 11>;   // kind, bar, arg, map, dst, c0, c1, c2, c3, phase, returned
inline bool fa_tracing = false;
inline std::vector<FaRecord> fa_trace;
inline std::atomic<long> fa_consumer_gemms{0}, fa_consumer_waits{0}, fa_consumer_arrives{0};

inline std::mutex fa_mx;   // guards the mbarriers, named barriers, holds and the trace
inline long fa_record(FaRecord r) {
  if (!fa_tracing || threadIdx.x != 0) return -1;
  fa_trace.push_back(r);
  return (long)fa_trace.size() - 1;
}

// ---- mbarriers ---------------------------------------------------------------------------------
struct FaMbar {
  int expected = 0, pending = 0;
  long tx = 0, done = 0;   // transaction bytes still due; completed phases
  int arrivals[16] = {};   // this phase's arrivals per warp
  std::condition_variable cv;
};
inline std::map<uint32_t, std::unique_ptr<FaMbar>> fa_mbars;
inline std::map<int, std::string> fa_waiting;   // thread -> what it waits for (deadlock reports)

inline FaMbar& fa_mbar(uint32_t a, const char* op) {   // fa_mx held
  auto it = fa_mbars.find(a);
  if (it == fa_mbars.end())
    fa_fail(fa_str("%s: %s on %s, which is no initialised mbarrier", fa_who().c_str(), op, fa_bar_name(a).c_str()));
  return *it->second;
}
inline void fa_mbar_try_complete(FaMbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.done;
    b.pending = b.expected;
    std::fill(std::begin(b.arrivals), std::end(b.arrivals), 0);
    b.cv.notify_all();
    ++fa_progress;
  }
}
inline void fa_mbar_init(uint32_t a, int count) {
  std::lock_guard<std::mutex> lk(fa_mx);
  auto& b = fa_mbars[a];
  b = std::make_unique<FaMbar>();
  b->expected = b->pending = count;
}
struct FaGemm;
inline bool fa_gemm_reads(int region);
inline void fa_mbar_arrive(uint32_t a, long tx, bool expect) {
  std::lock_guard<std::mutex> lk(fa_mx);
  FaMbar& b = fa_mbar(a, expect ? "mbar_expect_tx" : "mbar_arrive");
  const int id = fa_bar_id(a), w = fa_warp_of();
  fa_record({expect ? kFaExpect : kFaArrive, id, tx, -1, -1, 0, 0, 0, 0, b.done, -1});
  if (fa_is_consumer()) {
    if (fa_region_of_bar(id, false) >= 0) ++fa_consumer_arrives;
    if (b.arrivals[w]++ > 0)
      fa_fail(fa_str("%s arrives on %s twice in one phase: the empty barriers count one arrival per consumer "
                     "warp, so one lane per warp releases (release(&bar, lane) does that)", fa_who().c_str(),
                     fa_bar_name(a).c_str()));
  }
  if (b.pending == 0)
    fa_fail(fa_str("%s: more arrivals on %s in one phase than the %d it was initialised with", fa_who().c_str(),
                   fa_bar_name(a).c_str(), b.expected));
  const int r = fa_region_of_bar(id, false);
  if (fa_track && r >= 0 && fa_is_consumer()) {
    FaHold& h = fa_hold[w][r];
    if (h.phase < 0)
      fa_fail(fa_str("%s releases %s (arrives on %s) without holding it: it did not wait on %s for this use, "
                     "or released it already", fa_who().c_str(), fa_regions[r].name.c_str(),
                     fa_bar_name(a).c_str(), fa_bar_names[fa_regions[r].full]));
    if (fa_gemm_reads(r))
      fa_fail(fa_str("%s releases %s (arrives on %s) while a WGMMA that reads it is still in flight: the producer "
                     "may overwrite the slot under it. Release after the wgmma_wait that ends that product",
                     fa_who().c_str(), fa_regions[r].name.c_str(), fa_bar_name(a).c_str()));
    h.phase = -1;
    ++h.uses;
  }
  b.tx += tx;
  --b.pending;
  fa_mbar_try_complete(b);
}
inline void fa_mbar_complete_tx(uint32_t a, long bytes) {   // fa_mx held
  FaMbar& b = fa_mbar(a, "a TMA completing its bytes");
  b.tx -= bytes;
  fa_mbar_try_complete(b);
}
inline bool fa_phase_done(const FaMbar& b, uint32_t parity) { return (uint32_t)(b.done & 1) != (parity & 1u); }
inline void fa_acquire(FaMbar& b, uint32_t a, uint32_t parity) {   // fa_mx held; a consumer's wait returned
  const int id = fa_bar_id(a), r = fa_region_of_bar(id, true);
  if (!fa_track || r < 0 || !fa_is_consumer()) return;
  FaHold& h = fa_hold[fa_warp_of()][r];
  const long got = b.done - 1;   // the fill whose phase just completed
  if (got < h.uses)
    fa_fail(fa_str("%s: its wait on %s with parity %u returned at once, for an earlier phase: that was fill %ld of "
                   "%s, which this warp used and released already; this is its use %ld, whose phase has parity "
                   "%ld (wrong parity: full barriers are waited with parity phase(it), `it` the ring position)",
                   fa_who().c_str(), fa_bar_name(a).c_str(), parity & 1u, got, fa_regions[r].name.c_str(),
                   h.uses, h.uses & 1));
  if (got > h.uses)
    fa_fail(fa_str("%s: %s was filled again (fill %ld) before this warp released fill %ld: the producer must wait "
                   "on %s before it reloads the slot", fa_who().c_str(), fa_regions[r].name.c_str(), got, h.uses,
                   fa_bar_names[fa_regions[r].empty]));
  h.phase = got;
}
inline std::string fa_wait_text(uint32_t a, const FaMbar& b, uint32_t parity) {
  const int id = fa_bar_id(a), r = fa_region_of_bar(id, true);
  const long uses = (fa_track && r >= 0 && fa_is_consumer()) ? fa_hold[fa_warp_of()][r].uses : -1;
  return fa_str("mbar %d %u %ld %d %ld %ld", id, parity & 1u, b.done, b.pending, b.tx, uses);
}
inline void fa_mbar_wait(uint32_t a, uint32_t parity) {
  std::unique_lock<std::mutex> lk(fa_mx);
  FaMbar& b = fa_mbar(a, "mbar_wait");
  const long ev = fa_record({kFaWait, fa_bar_id(a), (int64_t)(parity & 1u), -1, -1, 0, 0, 0, 0, b.done, -1});
  if (fa_is_consumer() && fa_region_of_bar(fa_bar_id(a), true) >= 0) ++fa_consumer_waits;
  const int r = fa_region_of_bar(fa_bar_id(a), true);
  if (fa_track && r >= 0 && fa_is_consumer() && fa_hold[fa_warp_of()][r].phase >= 0 && !fa_phase_done(b, parity))
    fa_fail(fa_str("%s waits on %s for a new fill while this warp still holds %s from its last use: it never "
                   "released it. Arrive on %s (release(&bar, lane)) after the wgmma_wait that ends the GEMM reading "
                   "the slot", fa_who().c_str(), fa_bar_name(a).c_str(), fa_regions[r].name.c_str(),
                   fa_bar_names[fa_regions[r].empty]));
  if (!fa_phase_done(b, parity)) {
    fa_waiting[(int)threadIdx.x] = fa_wait_text(a, b, parity);
    {
      FaBlocked blk;
      b.cv.wait(lk, [&] { return fa_phase_done(b, parity); });
    }
    fa_waiting.erase((int)threadIdx.x);
  }
  if (ev >= 0) fa_trace[ev][10] = b.done;
  fa_acquire(b, a, parity);
}
inline thread_local bool fa_spinning = false;
inline bool fa_mbar_try_wait(uint32_t a, uint32_t parity) {
  std::unique_lock<std::mutex> lk(fa_mx);
  FaMbar& b = fa_mbar(a, "mbar_try_wait");
  if (fa_phase_done(b, parity)) {
    if (fa_spinning) { fa_spinning = false; --fa_blocked; ++fa_progress; fa_waiting.erase((int)threadIdx.x); }
    fa_record({kFaWait, fa_bar_id(a), (int64_t)(parity & 1u), -1, -1, 0, 0, 0, 0, b.done, b.done});
    fa_acquire(b, a, parity);
    return true;
  }
  if (!fa_spinning) { fa_spinning = true; ++fa_blocked; fa_waiting[(int)threadIdx.x] = fa_wait_text(a, b, parity); }
  lk.unlock();
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  return false;
}

// ---- named barriers (bar.sync / bar.arrive: `count` threads) ------------------------------------
struct FaNamed {
  int arrived = 0, count = 0;
  long gen = 0;
  std::condition_variable cv;
};
inline FaNamed fa_named[16];
inline void fa_named_bar(int id, int count, bool wait) {
  if (id < 0 || id > 15) fa_fail(fa_str("%s: named barrier %d does not exist (0..15)", fa_who().c_str(), id));
  std::unique_lock<std::mutex> lk(fa_mx);
  FaNamed& n = fa_named[id];
  if (n.arrived > 0 && n.count != count)
    fa_fail(fa_str("%s: named barrier %d is used with %d and %d threads at once", fa_who().c_str(), id, n.count, count));
  n.count = count;
  const long gen = n.gen;
  if (++n.arrived == count) {
    n.arrived = 0;
    ++n.gen;
    n.cv.notify_all();
    ++fa_progress;
    return;
  }
  if (!wait) return;
  fa_waiting[(int)threadIdx.x] = fa_str("named %d %d %d", id, count, n.arrived);
  {
    FaBlocked blk;
    n.cv.wait(lk, [&] { return n.gen != gen; });
  }
  fa_waiting.erase((int)threadIdx.x);
}

// ---- TMA ---------------------------------------------------------------------------------------
// One box of box_rows x 64 elements at (c0, c1, c2, c3) into shared memory at `dst`, as SWIZZLE_128B
// stores it; elements outside the tensor arrive as 0.
FA_HOT inline void fa_tma_copy(uint32_t dst, const CUtensorMap& m, int c0, int c1, int c2, int c3) {
  const size_t bytes = (size_t)m.box_rows * 128;
  fa_shared_ptr(dst, bytes, "a TMA box");
  for (int r = 0; r < m.box_rows; ++r)
    for (int c = 0; c < m.box_cols; ++c) {
      const int64_t d = c0 + c, s = c1 + r;
      uint16_t v = 0;
      if (d >= 0 && d < m.dim[0] && s >= 0 && s < m.dim[1] && c2 >= 0 && c2 < m.dim[2] && c3 >= 0 && c3 < m.dim[3])
        std::memcpy(&v, m.base + c3 * m.stride[3] + c2 * m.stride[2] + s * m.stride[1] + d * m.stride[0], 2);
      std::memcpy(fa_smem_window + (fa_swizzle128(dst + r * 128 + 2 * c) - kFaSmemOrigin), &v, 2);
    }
}
inline void fa_tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  const uint32_t d = fa_shared_addr(dst), b = fa_shared_addr(bar);
  std::lock_guard<std::mutex> lk(fa_mx);
  const int id = map ? map->id : -1;
  fa_record({kFaTma, fa_bar_id(b), 0, id, (int64_t)d - (int64_t)fa_smem_base_addr, c0, c1, c2, c3,
             fa_mbars.count(b) ? fa_mbars[b]->done : -1, -1});
  if (id < 0 || id > 2) fa_fail(fa_str("%s: tma_load_4d with a tensor map that is none of tm_q, tm_k, tm_v", fa_who().c_str()));
  if (d % 1024)
    fa_fail(fa_str("%s: a TMA box of %s lands at shared address %#x, which is not on a 1024-byte boundary "
                   "(smem_base() + %ld): a 128-byte swizzled box must start on one", fa_who().c_str(),
                   fa_map_name(id), d, (long)d - (long)fa_smem_base_addr));
  const int r = fa_region_at(d);
  if (fa_track && r >= 0)
    for (int w = 4; w < 16; ++w)
      if (fa_hold[w][r].phase >= 0)
        fa_fail(fa_str("%s: a TMA of %s overwrites %s while consumer warp %d still holds it (it has not "
                       "arrived on %s yet): wait on %s before reloading the slot", fa_who().c_str(),
                       fa_map_name(id), fa_regions[r].name.c_str(), w, fa_bar_names[fa_regions[r].empty],
                       fa_bar_names[fa_regions[r].empty]));
  fa_tma_copy(d, *map, c0, c1, c2, c3);
  fa_mbar_complete_tx(b, (long)map->box_rows * map->box_cols * 2);
}

// ---- WGMMA -------------------------------------------------------------------------------------
struct FaDesc {
  uint32_t start, lead, stride, swizzle;
};
inline FaDesc fa_desc(uint64_t d) {
  return {(uint32_t)(d & 0x3FFF) << 4, (uint32_t)((d >> 16) & 0x3FFF) << 4, (uint32_t)((d >> 32) & 0x3FFF) << 4,
          (uint32_t)(d >> 62)};
}
struct FaGemm {
  bool rs, bf16, acc;
  int n;                      // N: 128 (S) or D (O)
  uint64_t da, db;
  float* d;                   // the accumulator registers it writes
  std::vector<float> d_issue; // their values at issue (checked at the wait), when it is the first in flight on d
  uint32_t a[4];              // RS: this lane's A registers at issue
  const uint32_t* a_src;      // RS: where they live (changing them before the wait is a hazard)
  long group;                 // -1: not committed yet
};
inline thread_local std::vector<FaGemm> fa_gemms;
inline thread_local bool fa_fenced = false;
inline thread_local long fa_groups = 0;
inline int fa_log_thread = -1;   // whose WGMMAs the driver writes out
inline std::vector<FaGemm> fa_gemm_log;
inline bool fa_gemm_reads(int region) {   // does one of this thread's products in flight read the region?
  for (const FaGemm& g : fa_gemms) {
    if (!g.rs && fa_region_at(fa_desc(g.da).start) == region) return true;
    if (fa_region_at(fa_desc(g.db).start) == region) return true;
  }
  return false;
}
inline void fa_gemm_check_operand(const FaDesc& d, const char* which) {
  if (d.swizzle != 1)
    fa_fail(fa_str("%s: a WGMMA %s descriptor has swizzle mode %u: every operand of this step is stored 128-byte "
                   "swizzled (mode 1, what smem_desc sets)", fa_who().c_str(), which, d.swizzle));
  if (!fa_track) return;
  const int r = fa_region_at(d.start);
  if (r < 0)
    fa_fail(fa_str("%s: a WGMMA %s descriptor starts at smem_base() + %ld, in none of Q, the K slots, the V slots",
                   fa_who().c_str(), which, (long)d.start - (long)fa_smem_base_addr));
  if (fa_hold[fa_warp_of()][r].phase < 0)
    fa_fail(fa_str("%s: a WGMMA reads %s (its %s operand), which this warp does not hold: wait on %s (parity "
                   "phase(it)) before the GEMM that reads it, and release it only after that GEMM's wgmma_wait",
                   fa_who().c_str(), fa_regions[r].name.c_str(), which, fa_bar_names[fa_regions[r].full]));
}
inline void fa_gemm_issue(FaGemm g) {
  if (!fa_fenced)
    fa_fail(fa_str("%s issues a WGMMA with no wgmma_fence() before it: each batch of WGMMAs starts with "
                   "wgmma_fence() (after the last wgmma_commit, the accumulators must be fenced again)",
                   fa_who().c_str()));
  {
    std::lock_guard<std::mutex> lk(fa_mx);
    if (!g.rs) fa_gemm_check_operand(fa_desc(g.da), "A");
    fa_gemm_check_operand(fa_desc(g.db), "B");
    if (fa_is_consumer()) ++fa_consumer_gemms;
  }
  bool first = true;
  for (const FaGemm& o : fa_gemms) first = first && o.d != g.d;
  if (first) g.d_issue.assign(g.d, g.d + g.n / 2);
  g.group = -1;
  if ((int)threadIdx.x == fa_log_thread) fa_gemm_log.push_back(g);
  fa_gemms.push_back(std::move(g));
}
inline void fa_gemm_commit() {
  ++fa_groups;
  for (FaGemm& g : fa_gemms) if (g.group < 0) g.group = fa_groups;
  fa_fenced = false;
}
FA_HOT inline uint16_t fa_smem16(uint32_t a) {
  uint16_t v;
  std::memcpy(&v, fa_shared_ptr(fa_swizzle128(a), 2, "a WGMMA operand"), 2);
  return v;
}
// Thread (warp w of its warpgroup, lane l) computes its accumulator elements of one product.
FA_HOT inline void fa_gemm_run(const FaGemm& g, const std::vector<FaGemm>* lanes[32], size_t index) {
  const int w = fa_warp_of() % 4, l = fa_lane;
  const FaDesc A = fa_desc(g.da), B = fa_desc(g.db);
  if (!g.d_issue.empty() && std::memcmp(g.d_issue.data(), g.d, g.d_issue.size() * 4) != 0)
    fa_fail(fa_str("%s: the accumulator of a WGMMA (%s) was changed between the WGMMA and the wgmma_wait that ends "
                   "it: until that wait its registers belong to the tensor cores (wait first, then mask, rescale or "
                   "read them)", fa_who().c_str(), g.rs ? "O += P V" : "S = Q K^T"));
  if (g.rs && std::memcmp(g.a, g.a_src, 16) != 0)
    fa_fail(fa_str("%s: the A registers of a wgmma_rs (P) were changed before the wgmma_wait that ends the product: "
                   "they are an operand in flight (convert the next P only after that wait)", fa_who().c_str()));
  auto value = [&](uint16_t b) { return g.bf16 ? fa_bf2f(b) : fa_h2f(b); };
  for (int i = 0; i < g.n / 2; ++i) {
    const int row = 16 * w + (l >> 2) + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (l & 3) + (i & 1);
    float sum = 0.f;
    for (int k = 0; k < 16; ++k) {
      float a;
      if (!g.rs) {
        a = value(fa_smem16(A.start + (row / 8) * A.stride + (row % 8) * 128 + 2 * k));
      } else {   // the mma.sync A fragment of the warp's 16 rows
        const int r16 = row - 16 * w, src = 4 * (r16 % 8) + (k % 8) / 2, reg = (r16 >= 8) + 2 * (k >= 8);
        const FaGemm& o = (*lanes[src])[index];
        a = value((uint16_t)((k & 1) ? o.a[reg] >> 16 : o.a[reg] & 0xffffu));
      }
      const uint32_t b = g.rs ? B.start + (k / 8) * B.stride + (k % 8) * 128 + (col / 64) * B.lead + (col % 64) * 2
                              : B.start + (col / 8) * B.stride + (col % 8) * 128 + 2 * k;
      sum += a * value(fa_smem16(b));
    }
    g.d[i] = (g.acc ? g.d[i] : 0.f) + sum;
  }
}
inline void fa_gemm_wait(int n) {
  for (const FaGemm& g : fa_gemms)
    if (g.group < 0)
      fa_fail(fa_str("%s: wgmma_wait<%d> with WGMMAs issued since the last wgmma_commit: a wait counts committed "
                     "groups only, so end each batch with wgmma_commit()", fa_who().c_str(), n));
  long oldest_kept = fa_groups - n + 1;   // groups >= this one may stay in flight
  size_t run = 0;
  while (run < fa_gemms.size() && fa_gemms[run].group < oldest_kept) ++run;
  if (run == 0) return;
  // wgmma.wait_group is warp-synchronous (.sync.aligned): every lane has issued its part before the
  // products run, and none goes on (to release a slot, say) before they are done.
  if (!fa_warp) fa_fail("a WGMMA outside a warp");
  const std::vector<FaGemm>* lanes[32] = {};
  fa_warp->slot[fa_lane][1] = (uint64_t)(uintptr_t)&fa_gemms;
  fa_sync();
  for (int i = 0; i < 32; ++i) {   // the RS form reads the A registers of the warp's other lanes
    lanes[i] = (const std::vector<FaGemm>*)(uintptr_t)fa_warp->slot[i][1];
    if (lanes[i] != nullptr && lanes[i]->size() < run)
      fa_fail(fa_str("%s: the lanes of warp %d have different WGMMAs in flight at a wgmma_wait (every lane of a "
                     "warpgroup issues the same WGMMAs)", fa_who().c_str(), fa_warp_of()));
  }
  for (size_t i = 0; i < run; ++i) fa_gemm_run(fa_gemms[i], lanes, i);
  fa_sync();
  fa_gemms.erase(fa_gemms.begin(), fa_gemms.begin() + run);
}

namespace hp {
inline uint32_t smem_u32(const void* ptr) { return fa_shared_addr(ptr); }
inline void mbar_init(uint64_t* bar, uint32_t arrivals) { fa_mbar_init(smem_u32(bar), (int)arrivals); }
inline void fence_barrier_init() {}
inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes) { fa_mbar_arrive(smem_u32(bar), bytes, true); }
inline void mbar_arrive(uint64_t* bar) { fa_mbar_arrive(smem_u32(bar), 0, false); }
inline bool mbar_try_wait(uint64_t* bar, uint32_t parity) { return fa_mbar_try_wait(smem_u32(bar), parity); }
inline uint64_t global_timer_ns() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) { fa_mbar_wait(smem_u32(bar), parity); }
inline void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  fa_tma_load(dst, map, bar, c0, c1, c2, c3);
}
inline void prefetch_tensormap(const CUtensorMap*) {}
inline uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lead_bytes >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
inline void wgmma_fence() { fa_fenced = true; }
inline void wgmma_commit() { fa_gemm_commit(); }
template <int N> inline void wgmma_wait() { fa_gemm_wait(N); }
template <int N> inline void pin_registers(float (&)[N]) {}
template <int N> inline void pin_registers(uint32_t (&)[N][4]) {}
template <typename T> struct WgmmaType;
template <> struct WgmmaType<__half> { static constexpr const char* name = "f16"; };
template <> struct WgmmaType<__nv_bfloat16> { static constexpr const char* name = "bf16"; };
template <typename T>
inline void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  FaGemm g{};
  g.rs = false; g.bf16 = std::is_same<T, __nv_bfloat16>::value; g.acc = accumulate != 0; g.n = 128;
  g.da = desc_a; g.db = desc_b; g.d = d; g.a_src = nullptr;
  fa_gemm_issue(std::move(g));
}
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 128 || N == 64, "wgmma_rs: N is the head dimension, 64 or 128");
  FaGemm g{};
  g.rs = true; g.bf16 = std::is_same<T, __nv_bfloat16>::value; g.acc = true; g.n = N;
  g.da = 0; g.db = desc_b; g.d = d; g.a_src = a;
  std::memcpy(g.a, a, 16);
  fa_gemm_issue(std::move(g));
}
template <int N> inline void setmaxnreg_inc() {}
template <int N> inline void setmaxnreg_dec() {}
inline void named_bar_sync(int id, int count) { fa_named_bar(id, count, true); }
inline void named_bar_arrive(int id, int count) { fa_named_bar(id, count, false); }
inline float exp2_approx(float x) { return fa_exp2(x); }
using ::pack2;
using ::quad_max;
using ::quad_sum;
}  // namespace hp
"""

#: fa_primitives.cuh's stand-in (step 06)
SHIM = ("""
// fa_primitives.cuh, the HOST stand-in of facourse.cuda_host_check (CPU check of step 06). Not CUDA.
#pragma once
""" + _COMMON + _SM80)

#: hopper_primitives.cuh's stand-in (step 07)
HOPPER_SHIM = ("""
// hopper_primitives.cuh, the HOST stand-in of facourse.cuda_host_check (CPU check of step 07). Not CUDA.
#pragma once
""" + _COMMON + _HOPPER)

#: inserted at the top of hopper_harness.cuh's namespace (step 07): what the driver routes through
HARNESS_ROUTING = r"""
// ---- the CPU check's routing (facourse.cuda_host_check): either side of the ring can be an oracle
// that follows a list of operations per tile, written from the schedule the check expects.
using FaOp = std::array<int64_t, 10>;   // tile, kind, bar, arg, map, dst, c0, c1, c2, c3
inline std::vector<FaOp> fa_producer_ops, fa_consumer_ops;
inline bool fa_use_oracle_producer = false, fa_use_oracle_consumer = false;
template <int D>
void fa_oracle_producer(const CUtensorMap*, const CUtensorMap*, const CUtensorMap*, unsigned char*, Barriers&,
                        const FaParams&, const TileScheduler<D>&);
template <typename T, int D>
void fa_oracle_consumer(unsigned char*, Barriers&, const FaParams&, const TileScheduler<D>&, int);
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
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane)
    lanes.emplace_back([&, lane] { fa_warp = &w; fa_lane = lane; threadIdx.x = lane; f(lane); w.bar.arrive_and_drop(); });
  for (auto& t : lanes) t.join();
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

HOPPER_DRIVER = r"""
// The driver of facourse.cuda_host_check for step 07: runs the student's functions of
// student_kernel.cu on the host stand-in of hopper_primitives.cuh, with inputs read from stdin (raw
// little-endian arrays), and writes the results to stdout. hopper_harness.cuh here is the device part
// of the given one, its calls of producer and consumer routed through fa_use_oracle_*.
#include <pthread.h>

#include <functional>

#include "student_kernel.cu"

namespace hfa {
alignas(1024) unsigned char smem_raw[SmemLayout<128>::kBytes + 2048];
const CUtensorMap* fa_maps[3] = {};

inline uint64_t* fa_bar_ptr(int64_t id) { return (uint64_t*)fa_shared_ptr(fa_bar_addr[id], 8, "an mbarrier"); }

// What a slot holds, against what the consumers expect there: box (map, row0, head, batch), all panels.
FA_HOT void fa_verify(const FaOp& o) {
  const CUtensorMap& m = *fa_maps[o[4]];
  const uint32_t region = fa_smem_base_addr + (uint32_t)o[5];
  const int rows = m.box_rows, panels = (int)m.dim[0] / 64;
  auto at = [&](uint32_t panel, int r, int c) {
    uint16_t v;
    std::memcpy(&v, fa_smem_window + (fa_swizzle128(panel + r * 128 + 2 * c) - kFaSmemOrigin), 2);
    return v;
  };
  auto box = [&](const CUtensorMap& mm, int64_t c0, int64_t r0, int64_t h, int64_t b, int r, int c) {
    const int64_t d = c0 + c, s = r0 + r;
    uint16_t v = 0;
    if (d >= 0 && d < mm.dim[0] && s >= 0 && s < mm.dim[1] && h >= 0 && h < mm.dim[2] && b >= 0 && b < mm.dim[3])
      std::memcpy(&v, mm.base + b * mm.stride[3] + h * mm.stride[2] + s * mm.stride[1] + d * mm.stride[0], 2);
    return v;
  };
  for (int c = 0; c < panels; ++c) {
    const uint32_t panel = region + c * rows * 128;
    bool ok = true;
    for (int r = 0; r < rows && ok; ++r)
      for (int e = 0; e < 64 && ok; ++e) ok = at(panel, r, e) == box(m, 64 * c, o[7], o[8], o[9], r, e);
    if (ok) continue;
    std::string found = "none";
    bool unwritten = true;
    for (int r = 0; r < rows && unwritten; ++r)
      for (int e = 0; e < 64 && unwritten; ++e) unwritten = at(panel, r, e) == 0x7e00;
    if (unwritten) found = "unwritten";
    for (int mi = 0; mi < 3 && found == "none"; ++mi) {
      const CUtensorMap& mm = *fa_maps[mi];
      for (int64_t b = 0; b < mm.dim[3] && found == "none"; ++b)
        for (int64_t h = 0; h < mm.dim[2] && found == "none"; ++h)
          for (int64_t c0 = 0; c0 + 64 <= mm.dim[0] && found == "none"; ++c0)
            for (int64_t r0 = -rows + 1; r0 < mm.dim[1] && found == "none"; ++r0) {
              bool same = true;
              for (int r = 0; r < rows && same; ++r)
                for (int e = 0; e < 64 && same; ++e) same = at(panel, r, e) == box(mm, c0, r0, h, b, r, e);
              if (same) found = fa_str("%d %ld %ld %ld %ld", mi, (long)c0, (long)r0, (long)h, (long)b);
            }
    }
    fa_fail(fa_str("VERIFY %s %ld %ld %ld %ld %d found %s", fa_regions[fa_region_at(region)].name.c_str(),
                   (long)o[4], (long)o[7], (long)o[8], (long)o[9], c, found.c_str()));
  }
}

template <int D>
void fa_oracle_producer(const CUtensorMap* tq, const CUtensorMap* tk, const CUtensorMap* tv, unsigned char* smem,
                        Barriers&, const FaParams&, const TileScheduler<D>& sched) {
  const CUtensorMap* maps[3] = {tq, tk, tv};
  size_t i = 0;
  for (int t = sched.first(); t < sched.total; t = sched.next(t))
    for (; i < fa_producer_ops.size() && fa_producer_ops[i][0] == t; ++i) {
      const FaOp& o = fa_producer_ops[i];
      if (o[1] == kFaWait) mbar_wait(fa_bar_ptr(o[2]), (uint32_t)o[3]);
      else if (o[1] == kFaExpect) mbar_expect_tx(fa_bar_ptr(o[2]), (uint32_t)o[3]);
      else if (o[1] == kFaTma)
        tma_load_4d(smem + o[5], maps[o[4]], fa_bar_ptr(o[2]), (int)o[6], (int)o[7], (int)o[8], (int)o[9]);
    }
}

template <typename T, int D>
void fa_oracle_consumer(unsigned char*, Barriers&, const FaParams&, const TileScheduler<D>& sched, int) {
  if (threadIdx.x % 32 != 0) return;   // one lane per consumer warp keeps the protocol
  size_t i = 0;
  for (int t = sched.first(); t < sched.total; t = sched.next(t))
    for (; i < fa_consumer_ops.size() && fa_consumer_ops[i][0] == t; ++i) {
      const FaOp& o = fa_consumer_ops[i];
      if (o[1] == kFaWait) mbar_wait(fa_bar_ptr(o[2]), (uint32_t)o[3]);
      else if (o[1] == kFaArrive) mbar_arrive(fa_bar_ptr(o[2]));
      else if (o[1] == kFaVerify && threadIdx.x == 128) fa_verify(o);
    }
}
}  // namespace hfa

using namespace hfa;

static void read_all(void* p, size_t n) {
  if (std::fread(p, 1, n, stdin) != n) { std::fprintf(stderr, "FA_HOST: short input\n"); std::exit(2); }
}
static void write_all(const void* p, size_t n) { std::fwrite(p, 1, n, stdout); }
static void write_trace() {   // also the failure hook: what the producer did until then
  const int64_t head[4] = {(int64_t)fa_trace.size(), fa_consumer_gemms, fa_consumer_waits, fa_consumer_arrives};
  write_all(head, sizeof head);
  for (const FaRecord& r : fa_trace) write_all(r.data(), sizeof(int64_t) * r.size());
}

static void fa_deadlock() {
  std::string msg = "DEADLOCK";
  {
    std::lock_guard<std::mutex> lk(fa_mx);
    for (const auto& [tid, what] : fa_waiting) msg += fa_str("\nwaiter %d %s", tid, what.c_str());
    for (int i = 0; i < fa_nbars; ++i)
      if (fa_mbars.count(fa_bar_addr[i])) {
        const FaMbar& b = *fa_mbars[fa_bar_addr[i]];
        msg += fa_str("\nbar %d %ld %d %ld", i, b.done, b.pending, b.tx);
      }
    for (int w = 4; w < 12; ++w)
      for (size_t r = 0; r < fa_regions.size(); ++r)
        msg += fa_str("\nhold %d %d %ld %ld", w, (int)r, fa_hold[w][r].phase, fa_hold[w][r].uses);
  }
  fa_fail(msg, 5);
}

static void fa_watch(const std::atomic<bool>& stop) {   // every thread waiting, nothing moving: a deadlock
  long last = -1;
  int still = 0;
  while (!stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const long progress = fa_progress;
    const int live = fa_live, blocked = fa_blocked;
    still = (live > 0 && blocked >= live && progress == last) ? still + 1 : 0;
    if (still >= 16) fa_deadlock();   // 0.8 s: a loaded machine may leave a woken thread waiting a while
    last = progress;
  }
}

// Threads first .. first+count-1 of one CTA, in warps of 32, with __syncthreads and the deadlock watch.
struct FaThread {
  int tid;
  FaWarp* warp;
  std::barrier<>* cta;
  const std::function<void()>* body;
};
static void* fa_thread_main(void* p) {
  FaThread& a = *(FaThread*)p;
  threadIdx.x = a.tid;
  fa_warp = a.warp;
  fa_lane = a.tid % 32;
  (*a.body)();
  if (!fa_gemms.empty())
    fa_fail(fa_str("%s finished with WGMMAs still in flight: a wgmma_wait<0>() is missing after its last GEMM "
                   "(the epilogue read the accumulators before the products were done)", fa_who().c_str()));
  if (fa_spinning) { fa_spinning = false; --fa_blocked; }
  fa_warp->bar.arrive_and_drop();
  a.cta->arrive_and_drop();
  --fa_live;
  ++fa_progress;
  return nullptr;
}
static void run_threads(int first, int count, const std::function<void()>& body) {
  std::vector<std::unique_ptr<FaWarp>> warps((count + 31) / 32);
  for (auto& w : warps) w = std::make_unique<FaWarp>();
  std::barrier<> cta(count);
  fa_cta = &cta;
  fa_live = count;
  std::atomic<bool> stop{false};
  std::thread watchdog([&] { fa_watch(stop); });
  std::vector<FaThread> args(count);
  std::vector<pthread_t> threads(count);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  for (int i = 0; i < count; ++i) {
    args[i] = {first + i, warps[i / 32].get(), &cta, &body};
    if (pthread_create(&threads[i], &attr, fa_thread_main, &args[i]) != 0) fa_fail("could not start a thread", 7);
  }
  for (pthread_t t : threads) pthread_join(t, nullptr);
  stop = true;
  watchdog.join();
  fa_cta = nullptr;
}

// The CTA's shared memory: never-written bytes read as NaN (0x7e00), the barriers and slots named.
template <int D>
static unsigned char* setup_smem(bool track) {
  using L = SmemLayout<D>;
  for (size_t i = 0; i < sizeof smem_raw; i += 2) { smem_raw[i] = 0x00; smem_raw[i + 1] = 0x7e; }
  fa_smem_window = smem_raw;
  fa_smem_bytes = sizeof smem_raw;
  unsigned char* base = smem_base();
  fa_smem_base_addr = smem_u32(base);
  Barriers& bars = barriers<D>();
  uint64_t* ids[kFaBars] = {&bars.q_full, &bars.q_empty, &bars.k_full[0], &bars.k_full[1], &bars.k_empty[0],
                            &bars.k_empty[1], &bars.v_full[0], &bars.v_full[1], &bars.v_empty[0], &bars.v_empty[1],
                            &bars.tile_full[0], &bars.tile_full[1], &bars.tile_empty[0], &bars.tile_empty[1]};
  for (int i = 0; i < kFaBars; ++i) fa_bar_addr[i] = smem_u32(ids[i]);
  fa_nbars = kFaBars;
  const uint32_t b = fa_smem_base_addr;
  fa_regions = {{b + L::kQ, b + L::kQ + L::kQBytes, 0, 1, "Q"}};
  for (int s = 0; s < STAGES; ++s) {
    fa_regions.push_back({b + L::kK + s * L::kKVBytes, b + L::kK + (s + 1) * L::kKVBytes, 2 + s, 4 + s,
                          fa_str("K slot %d", s)});
    fa_regions.push_back({b + L::kV + s * L::kKVBytes, b + L::kV + (s + 1) * L::kKVBytes, 6 + s, 8 + s,
                          fa_str("V slot %d", s)});
  }
  fa_track = track;
  return base;
}

static CUtensorMap make_map(const std::vector<uint16_t>& t, int D, int S, int H, int B, int rows, int id) {
  CUtensorMap m;
  m.base = (const unsigned char*)t.data();
  m.dim[0] = D; m.dim[1] = S; m.dim[2] = H; m.dim[3] = B;
  m.stride[0] = 2; m.stride[1] = 2 * (int64_t)D; m.stride[2] = m.stride[1] * S; m.stride[3] = m.stride[2] * H;
  m.box_rows = rows;
  m.id = id;
  return m;
}

static void write_log(const uint32_t* p_base) {
  const int64_t n = (int64_t)fa_gemm_log.size();
  write_all(&n, 8);
  for (const FaGemm& g : fa_gemm_log) {
    const int64_t kk = (p_base && g.a_src >= p_base && g.a_src < p_base + 4 * (BLOCK_N / 16)) ? (g.a_src - p_base) / 4 : -1;
    const int64_t r[7] = {(int64_t)g.da, (int64_t)g.db, g.acc, g.rs, g.bf16, g.n, kk};
    write_all(r, sizeof r);
  }
}

// S = Q K^T for one warpgroup's 64 rows: Q_i (128 rows) in its panels, K_j in ring slot 1.
template <typename T, int D>
static void run_qk(int wg) {
  using L = SmemLayout<D>;
  std::vector<uint16_t> q(128 * D), k(128 * D);
  static float s[128][64];
  read_all(q.data(), q.size() * 2); read_all(k.data(), k.size() * 2); read_all(s, sizeof s);
  unsigned char* base = setup_smem<D>(false);
  const CUtensorMap mq = make_map(q, D, 128, 1, 1, BLOCK_M, 0), mk = make_map(k, D, 128, 1, 1, BLOCK_N, 1);
  for (int c = 0; c < D / 64; ++c) {
    fa_tma_copy(smem_u32(base + L::kQ) + c * BLOCK_M * 128, mq, 64 * c, 0, 0, 0);
    fa_tma_copy(smem_u32(base + L::kK + L::kKVBytes) + c * BLOCK_N * 128, mk, 64 * c, 0, 0, 0);
  }
  const uint32_t q_addr = smem_u32(base + L::kQ) + wg * 64 * 128, k_addr = smem_u32(base + L::kK + L::kKVBytes);
  const int first = 128 * (wg + 1);
  fa_log_thread = first;
  run_threads(first, 128, [&] {
    gemm_qk<T, D>(s[threadIdx.x - first], q_addr, k_addr);
    wgmma_wait<0>();
  });
  const int64_t head[3] = {fa_smem_base_addr, q_addr, k_addr};
  write_all(head, sizeof head);
  write_log(nullptr);
  write_all(s, sizeof s);
}

// O += P V for warpgroup 0's 64 rows: P from registers (convert_p of the accumulator), V_j in ring slot 1.
template <typename T, int D>
static void run_pv() {
  using L = SmemLayout<D>;
  static float P[64][128], o[128][64];
  std::vector<uint16_t> v(128 * D);
  read_all(P, sizeof P); read_all(v.data(), v.size() * 2); read_all(o, sizeof o);
  unsigned char* base = setup_smem<D>(false);
  const CUtensorMap mv = make_map(v, D, 128, 1, 1, BLOCK_N, 2);
  for (int c = 0; c < D / 64; ++c) fa_tma_copy(smem_u32(base + L::kV + L::kKVBytes) + c * BLOCK_N * 128, mv, 64 * c, 0, 0, 0);
  const uint32_t v_addr = smem_u32(base + L::kV + L::kKVBytes);
  fa_log_thread = 128;
  static const uint32_t* p_base = nullptr;
  run_threads(128, 128, [&] {
    const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32;
    float acc[BLOCK_N / 2];
    for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = P[16 * w + (l >> 2) + 8 * ((i >> 1) & 1)][8 * (i >> 2) + 2 * (l & 3) + (i & 1)];
    uint32_t p[BLOCK_N / 16][4];
    convert_p<T>(acc, p);
    if ((int)threadIdx.x == fa_log_thread) p_base = &p[0][0];
    gemm_pv<T, D>(*reinterpret_cast<float(*)[D / 2]>(o[threadIdx.x - 128]), p, v_addr);
    wgmma_wait<0>();
  });
  const int64_t head[2] = {fa_smem_base_addr, v_addr};
  write_all(head, sizeof head);
  write_log(p_base);
  write_all(o, sizeof o);
}

// The whole CTA (gridDim 1, so it takes every tile), the producer or the consumers replaced by an oracle.
template <typename T, int D>
static void run_kernel(FaParams p, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                       const std::vector<uint16_t>& v) {
  const CUtensorMap mq = make_map(q, D, p.Sq, p.Hq, p.B, BLOCK_M, 0), mk = make_map(k, D, p.Skv, p.Hkv, p.B, BLOCK_N, 1),
                    mv = make_map(v, D, p.Skv, p.Hkv, p.B, BLOCK_N, 2);
  fa_maps[0] = &mq; fa_maps[1] = &mk; fa_maps[2] = &mv;
  setup_smem<D>(true);
  fa_tracing = true;
  fa_on_fail = write_trace;
  std::vector<uint16_t> o((size_t)p.B * p.Hq * p.Sq * D, 0x7e00);
  std::vector<float> lse((size_t)p.B * p.Hq * p.Sq, NAN);
  p.o = o.data(); p.lse = lse.data();
  int counter = 0;
  blockDim = {NTHREADS, 1, 1};
  run_threads(0, NTHREADS, [&] { hopper_fa_kernel<T, D>(mq, mk, mv, p, &counter); });
  fa_on_fail = nullptr;
  write_trace();
  write_all(o.data(), o.size() * 2);
  write_all(lse.data(), lse.size() * 4);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string mode = argv[1];
  const bool bf16 = std::atoi(argv[2]) != 0;
  const int D = std::atoi(argv[3]);
  auto dispatch = [&](auto fp16_128, auto fp16_64, auto bf16_128) {
    if (!bf16 && D == 128) fp16_128();
    else if (!bf16 && D == 64) fp16_64();
    else if (bf16 && D == 128) bf16_128();
    else std::exit(2);
  };
  if (mode == "qk") {
    const int wg = std::atoi(argv[4]);
    dispatch([&] { run_qk<__half, 128>(wg); }, [&] { run_qk<__half, 64>(wg); }, [&] { run_qk<__nv_bfloat16, 128>(wg); });
    return 0;
  }
  if (mode == "pv") {
    dispatch([] { run_pv<__half, 128>(); }, [] { run_pv<__half, 64>(); }, [] { run_pv<__nv_bfloat16, 128>(); });
    return 0;
  }
  if (mode == "kernel") {   // argv: kernel bf16 D B Hq Hkv Sq Skv causal oracle_producer oracle_consumer
    if (argc < 12) return 2;
    FaParams p{};
    p.B = std::atoi(argv[4]); p.Hq = std::atoi(argv[5]); p.Hkv = std::atoi(argv[6]);
    p.Sq = std::atoi(argv[7]); p.Skv = std::atoi(argv[8]); p.causal = std::atoi(argv[9]); p.D = D; p.is_bf16 = bf16;
    fa_use_oracle_producer = std::atoi(argv[10]) != 0;
    fa_use_oracle_consumer = std::atoi(argv[11]) != 0;
    int64_t nops[2];
    read_all(nops, sizeof nops);
    read_all(&p.scale, 4);
    std::vector<uint16_t> q((size_t)p.B * p.Hq * p.Sq * D), k((size_t)p.B * p.Hkv * p.Skv * D), v(k.size());
    read_all(q.data(), q.size() * 2); read_all(k.data(), k.size() * 2); read_all(v.data(), v.size() * 2);
    fa_producer_ops.resize(nops[0]); fa_consumer_ops.resize(nops[1]);
    if (nops[0]) read_all(fa_producer_ops.data(), nops[0] * sizeof(FaOp));
    if (nops[1]) read_all(fa_consumer_ops.data(), nops[1] * sizeof(FaOp));
    p.q = q.data(); p.k = k.data(); p.v = v.data();
    p.q_ss = D; p.q_sh = (int64_t)p.Sq * D; p.q_sb = p.q_sh * p.Hq;
    p.k_ss = p.v_ss = D; p.k_sh = p.v_sh = (int64_t)p.Skv * D; p.k_sb = p.v_sb = p.k_sh * p.Hkv;
    p.o_ss = D; p.o_sh = (int64_t)p.Sq * D; p.o_sb = p.o_sh * p.Hq;
    dispatch([&] { run_kernel<__half, 128>(p, q, k, v); }, [&] { run_kernel<__half, 64>(p, q, k, v); },
             [&] { run_kernel<__nv_bfloat16, 128>(p, q, k, v); });
    return 0;
  }
  return 2;
}
"""
