// emu_hopper.h: the instructions of step 07's hopper_primitives.cuh on the host, for the CPU check
// (facourse.cuda_host_check). Included before student_kernel.cu; hopper_primitives.cuh itself (smem_desc,
// quad_max/quad_sum, pack2) comes next. One CTA of 384 threads runs the kernel of hopper_harness.cuh (its
// device part) on an emulated shared memory:
//
// * an mbarrier is the PTX ISA's state (pending arrivals, transaction bytes, completed phases);
//   mbar_wait blocks until the phase of that parity has completed;
// * TMA (tma_load_4d) copies a box of 64 columns from the tensor into shared memory as SWIZZLE_128B
//   stores it (16-byte chunk c of a 128-byte row r at c XOR r % 8, rows past the tensor zero) and
//   completes the box's bytes on the mbarrier;
// * WGMMA (wgmma_ss_n128, wgmma_rs) reads its operands through the shared-memory descriptors (start,
//   leading and stride offsets, the 128-byte swizzle on address bits 4-6 XOR 7-9) and writes the
//   accumulator layout of the PTX ISA (thread (warp w, lane l): d[4j + 2h + e] is row 16w + l/4 + 8h,
//   column 8j + 2(l%4) + e); the RS form's A is the mma.sync A fragment of each warp's 16 rows. A
//   product is asynchronous: it is computed at the wgmma_wait that ends its committed group, so an
//   accumulator or A register changed while the product is in flight is caught, and a product never
//   committed is never computed;
// * named barriers (bar.sync/bar.arrive) count threads; setmaxnreg does nothing.
//
// On top, the emulation checks the ring protocol as it runs: a consumer warp holds a slot (Q, K or V)
// from its wait on the slot's full barrier until its arrival on the empty one. A WGMMA that reads a
// slot its warp does not hold, a release while a WGMMA still reads the slot, a wait that returns for
// an earlier phase (wrong parity), two releases from one warp, a TMA that overwrites a slot a warp
// holds: each ends the run with a message naming it. A deadlock (every thread waiting) is reported
// with what each thread waits for. What this cannot show (the real instructions' timing and ordering,
// bank conflicts, registers and spills, the compiler's reordering around pin_registers) only a GPU
// checks.
#pragma once
#include "emu_warp.h"

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
inline size_t __cvta_generic_to_shared(const void* p) { return fa_shared_addr(p); }
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
                                           "tile_full[0]", "tile_full[1]", "tile_empty[0]", "tile_empty[1]",
                                           "q2_full", "q2_empty"};   // the last two: the ladder's second Q slot
constexpr int kFaBars = 16;
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
};
inline std::map<uint32_t, std::unique_ptr<FaMbar>> fa_mbars;
inline std::map<int, std::string> fa_waiting;   // thread -> what it waits for (deadlock reports)

inline FaMbar& fa_mbar(uint32_t a, const char* op) {
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
    ++fa_progress;
  }
}
inline void fa_mbar_init(uint32_t a, int count) {
  auto& b = fa_mbars[a];
  b = std::make_unique<FaMbar>();
  b->expected = b->pending = count;
}
struct FaGemm;
inline bool fa_gemm_reads(int region);
inline void fa_mbar_arrive(uint32_t a, long tx, bool expect) {
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
inline void fa_mbar_complete_tx(uint32_t a, long bytes) {
  FaMbar& b = fa_mbar(a, "a TMA completing its bytes");
  b.tx -= bytes;
  fa_mbar_try_complete(b);
}
inline bool fa_phase_done(const FaMbar& b, uint32_t parity) { return (uint32_t)(b.done & 1) != (parity & 1u); }
inline void fa_acquire(FaMbar& b, uint32_t a, uint32_t parity) {   // a consumer's wait returned
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
    fa_wait_until([&] { return fa_phase_done(b, parity); });
    fa_waiting.erase((int)threadIdx.x);
  }
  if (ev >= 0) fa_trace[ev][10] = b.done;
  fa_acquire(b, a, parity);
}
inline bool fa_spinning_v[FA_MAX_THREADS + 1];   // inside a loop of mbar_try_wait (counted as blocked)
#define fa_spinning (fa_spinning_v[fa_self])
inline bool fa_mbar_try_wait(uint32_t a, uint32_t parity) {
  FaMbar& b = fa_mbar(a, "mbar_try_wait");
  if (fa_phase_done(b, parity)) {
    if (fa_spinning) { fa_spinning = false; --fa_blocked; ++fa_progress; fa_waiting.erase((int)threadIdx.x); }
    fa_record({kFaWait, fa_bar_id(a), (int64_t)(parity & 1u), -1, -1, 0, 0, 0, 0, b.done, b.done});
    fa_acquire(b, a, parity);
    return true;
  }
  if (!fa_spinning) { fa_spinning = true; ++fa_blocked; fa_waiting[(int)threadIdx.x] = fa_wait_text(a, b, parity); }
  fa_yield();   // the student's loop tries again on its next turn
  return false;
}

// ---- named barriers (bar.sync / bar.arrive: `count` threads) ------------------------------------
struct FaNamed {
  int arrived = 0, count = 0;
  long gen = 0;
};
inline FaNamed fa_named[16];
inline void fa_named_bar(int id, int count, bool wait) {
  if (id < 0 || id > 15) fa_fail(fa_str("%s: named barrier %d does not exist (0..15)", fa_who().c_str(), id));
  FaNamed& n = fa_named[id];
  if (n.arrived > 0 && n.count != count)
    fa_fail(fa_str("%s: named barrier %d is used with %d and %d threads at once", fa_who().c_str(), id, n.count, count));
  n.count = count;
  const long gen = n.gen;
  if (++n.arrived == count) {
    n.arrived = 0;
    ++n.gen;
    ++fa_progress;
    return;
  }
  if (!wait) return;
  fa_waiting[(int)threadIdx.x] = fa_str("named %d %d %d", id, count, n.arrived);
  fa_wait_until([&] { return n.gen != gen; });
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
  bool tb;                    // B MN-major (RS: O += P V); SS is K-major (S = Q K^T)
  int n;                      // N: 128 (S) or D (O)
  uint64_t da, db;
  float* d;                   // the accumulator registers it writes
  std::vector<float> d_issue; // their values at issue (checked at the wait), when it is the first in flight on d
  uint32_t a[4];              // RS: this lane's A registers at issue
  const uint32_t* a_src;      // RS: where they live (changing them before the wait is a hazard)
  long group;                 // -1: not committed yet
};
inline std::vector<FaGemm> fa_gemms_v[FA_MAX_THREADS + 1];   // per thread: its products in flight,
inline bool fa_fenced_v[FA_MAX_THREADS + 1];                  // whether it fenced its registers,
inline long fa_groups_v[FA_MAX_THREADS + 1];                  // and its committed groups
#define fa_gemms (fa_gemms_v[fa_self])
#define fa_fenced (fa_fenced_v[fa_self])
#define fa_groups (fa_groups_v[fa_self])
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
__attribute__((always_inline)) inline float fa_operand(const FaGemm& g, uint16_t b) {  // a lambda would run at -O0
  return g.bf16 ? fa_bf2f(b) : fa_h2f(b);
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
  float a[2][16];      // the thread's two rows of A (rows 8 apart), read once for all its columns
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * w + (l >> 2) + 8 * h;
    for (int k = 0; k < 16; ++k) {
      if (!g.rs) {
        a[h][k] = fa_operand(g, fa_smem16(A.start + (row / 8) * A.stride + (row % 8) * 128 + 2 * k));
      } else {   // the mma.sync A fragment of the warp's 16 rows
        const int r16 = row - 16 * w, src = 4 * (r16 % 8) + (k % 8) / 2, reg = (r16 >= 8) + 2 * (k >= 8);
        const FaGemm& o = (*lanes[src])[index];
        a[h][k] = fa_operand(g, (uint16_t)((k & 1) ? o.a[reg] >> 16 : o.a[reg] & 0xffffu));
      }
    }
  }
  for (int i = 0; i < g.n / 2; ++i) {
    if ((i >> 1) & 1) continue;   // accumulators i and i + 2 share a column (rows 8 apart): both done at i
    const int col = 8 * (i >> 2) + 2 * (l & 3) + (i & 1);
    float b[16];
    for (int k = 0; k < 16; ++k) {
      const uint32_t at = g.tb ? B.start + (k / 8) * B.stride + (k % 8) * 128 + (col / 64) * B.lead + (col % 64) * 2
                               : B.start + (col / 8) * B.stride + (col % 8) * 128 + 2 * k;
      b[k] = fa_operand(g, fa_smem16(at));
    }
    for (int h = 0; h < 2; ++h) {
      float sum = 0.f;
      for (int k = 0; k < 16; ++k) sum += a[h][k] * b[k];
      g.d[i + 2 * h] = (g.acc ? g.d[i + 2 * h] : 0.f) + sum;
    }
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
inline uint32_t fa_u32(const void* ptr) { return fa_shared_addr(ptr); }
inline void mbar_init(uint64_t* bar, uint32_t arrivals) { fa_mbar_init(fa_u32(bar), (int)arrivals); }
inline void fence_barrier_init() {}
inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes) { fa_mbar_arrive(fa_u32(bar), bytes, true); }
inline void mbar_arrive(uint64_t* bar) { fa_mbar_arrive(fa_u32(bar), 0, false); }
inline bool mbar_try_wait(uint64_t* bar, uint32_t parity) { return fa_mbar_try_wait(fa_u32(bar), parity); }
inline uint64_t global_timer_ns() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) { fa_mbar_wait(fa_u32(bar), parity); }
inline void mbar_wait_spin(uint64_t* bar, uint32_t parity) { fa_mbar_wait(fa_u32(bar), parity); }
// The bulk reduce-add is step 08's backward's: step 07's kernel (all this emulator runs) has none.
inline void fa_not_step07(const char* what) {
  fa_fail(fa_str("%s: %s is an instruction of step 08's Hopper backward; step 07's kernel does not use it",
                 fa_who().c_str(), what));
}
inline void bulk_reduce_add_f32(float*, const void*, uint32_t) { fa_not_step07("bulk_reduce_add_f32"); }
inline void bulk_commit() { fa_not_step07("bulk_commit"); }
template <int N> inline void bulk_wait_read() { fa_not_step07("bulk_wait_read"); }
template <int N> inline void bulk_wait() { fa_not_step07("bulk_wait"); }
inline void fence_proxy_async_shared() {}
inline void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  fa_tma_load(dst, map, bar, c0, c1, c2, c3);
}
inline void prefetch_tensormap(const CUtensorMap*) {}
inline void tma_prefetch_4d(const CUtensorMap*, int, int, int, int) {}  // L2 only: nothing to emulate
inline void wgmma_fence() { fa_fenced = true; }
inline void wgmma_commit() { fa_gemm_commit(); }
template <int N> inline void wgmma_wait() { fa_gemm_wait(N); }
template <int N> inline void pin_registers(float (&)[N]) {}
template <int N> inline void pin_registers(uint32_t (&)[N][4]) {}
template <typename T, int N, int TA, int TB>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(TA == 0 && TB == 0, "the emulator runs step 07's kernel, whose shared-memory WGMMA is K-major");
  FaGemm g{};
  g.rs = false; g.bf16 = std::is_same<T, __nv_bfloat16>::value; g.acc = accumulate != 0; g.n = N;
  g.da = desc_a; g.db = desc_b; g.d = d; g.a_src = nullptr;
  fa_gemm_issue(std::move(g));
}
template <typename T>
inline void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  wgmma_ss<T, 128, 0, 0>(d, desc_a, desc_b, accumulate);
}
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 128 || N == 64, "wgmma_rs: N is the head dimension, 64 or 128");
  FaGemm g{};
  g.rs = true; g.bf16 = std::is_same<T, __nv_bfloat16>::value; g.acc = true; g.n = N; g.tb = true;
  g.da = 0; g.db = desc_b; g.d = d; g.a_src = a;
  std::memcpy(g.a, a, 16);
  fa_gemm_issue(std::move(g));
}
template <int N> inline void setmaxnreg_inc() {}
template <int N> inline void setmaxnreg_dec() {}
inline void named_bar_sync(int id, int count) { fa_named_bar(id, count, true); }
inline void named_bar_arrive(int id, int count) { fa_named_bar(id, count, false); }
inline float exp2_approx(float x) { return fa_exp2(x); }
}  // namespace hp
