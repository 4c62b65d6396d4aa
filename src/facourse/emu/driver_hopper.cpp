// driver_hopper.cpp: the CPU check of step 07 (facourse.cuda_host_check). Runs the student's functions
// of student_kernel.cu on emu_hopper.h's instructions, with inputs read from stdin (raw little-endian
// arrays), and writes the results to stdout; the first argument names the job (qk, pv, kernel).
// hopper_harness.cuh here is the device part of the given one, its calls of producer and consumer
// routed through fa_use_oracle_* (routing_hopper.h).
#include <functional>

#include "emu_hopper.h"
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
  for (const auto& [tid, what] : fa_waiting) msg += fa_str("\nwaiter %d %s", tid, what.c_str());
  for (int i = 0; i < fa_nbars; ++i)
    if (fa_mbars.count(fa_bar_addr[i])) {
      const FaMbar& b = *fa_mbars[fa_bar_addr[i]];
      msg += fa_str("\nbar %d %ld %d %ld", i, b.done, b.pending, b.tx);
    }
  for (int w = 4; w < 12; ++w)
    for (size_t r = 0; r < fa_regions.size(); ++r)
      msg += fa_str("\nhold %d %d %ld %ld", w, (int)r, fa_hold[w][r].phase, fa_hold[w][r].uses);
  fa_fail(msg, 5);
}

// Threads first .. first+count-1 of one CTA, in warps of 32, with __syncthreads and the deadlock report.
static void run_threads(int first, int count, const std::function<void()>& body) {
  std::vector<std::unique_ptr<FaWarp>> warps((count + 31) / 32);
  for (auto& w : warps) w = std::make_unique<FaWarp>();
  FaBarrier cta(count);
  fa_cta = &cta;
  fa_on_deadlock = fa_deadlock;
  fa_run_fibers(count, [&](int i) {
    const int tid = first + i;
    threadIdx.x = tid;
    fa_warp = warps[i / 32].get();
    fa_lane = tid % 32;
    fa_gemms.clear();   // a new thread: no products in flight, nothing fenced or committed
    fa_fenced = fa_spinning = false;
    fa_groups = 0;
    body();
    if (!fa_gemms.empty())
      fa_fail(fa_str("%s finished with WGMMAs still in flight: a wgmma_wait<0>() is missing after its last GEMM "
                     "(the epilogue read the accumulators before the products were done)", fa_who().c_str()));
    if (fa_spinning) { fa_spinning = false; --fa_blocked; }
    fa_warp->bar.arrive_and_drop();
    cta.arrive_and_drop();
  });
  fa_on_deadlock = nullptr;
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
                            &bars.tile_full[0], &bars.tile_full[1], &bars.tile_empty[0], &bars.tile_empty[1],
                            &bars.q2_full, &bars.q2_empty};
  for (int i = 0; i < kFaBars; ++i) fa_bar_addr[i] = smem_u32(ids[i]);
  fa_nbars = kFaBars;
  const uint32_t b = fa_smem_base_addr;
  fa_regions = {{b + L::kQ, b + L::kQ + L::kQBytes, 0, 1, "Q"}};
  if (kQStages > 1) fa_regions.push_back({b + L::kQ + L::kQBytes, b + L::kQ + 2 * L::kQBytes, 14, 15, "Q slot 1"});
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
  const std::string job = argv[1];
  const bool bf16 = std::atoi(argv[2]) != 0;
  const int D = std::atoi(argv[3]);
  auto dispatch = [&](auto fp16_128, auto fp16_64, auto bf16_128) {
    if (!bf16 && D == 128) fp16_128();
    else if (!bf16 && D == 64) fp16_64();
    else if (bf16 && D == 128) bf16_128();
    else std::exit(2);
  };
  if (job == "qk") {
    const int wg = std::atoi(argv[4]);
    dispatch([&] { run_qk<__half, 128>(wg); }, [&] { run_qk<__half, 64>(wg); }, [&] { run_qk<__nv_bfloat16, 128>(wg); });
    return 0;
  }
  if (job == "pv") {
    dispatch([] { run_pv<__half, 128>(); }, [] { run_pv<__half, 64>(); }, [] { run_pv<__nv_bfloat16, 128>(); });
    return 0;
  }
  if (job == "kernel") {   // argv: kernel bf16 D B Hq Hkv Sq Skv causal oracle_producer oracle_consumer
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
