// driver_sm80.cpp: the CPU check of step 06 (facourse.cuda_host_check). Runs one of the student's device
// functions on inputs read from stdin (raw little-endian arrays) and writes its outputs to stdout; the
// first argument names the job (softmax, load, qk, pv).
#include "emu_sm80.h"
#include "student_kernel.cu"
#include <string>
#include <vector>

static void read_all(void* p, size_t n) {
  if (std::fread(p, 1, n, stdin) != n) { std::fprintf(stderr, "FA_HOST: short input\n"); std::exit(2); }
}
static void write_all(const void* p, size_t n) { std::fwrite(p, 1, n, stdout); }

template <class F> static void run_warp(F f) {   // f(lane) on 32 threads in lockstep at every primitive
  FaWarp w;
  fa_run_fibers(32, [&](int lane) { fa_warp = &w; fa_lane = lane; threadIdx.x = lane; f(lane); w.bar.arrive_and_drop(); });
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
  const std::string job = argv[1];
#ifndef FA_NO_SOFTMAX
  if (job == "softmax") { run_softmax(std::atoi(argv[2])); return 0; }
#endif
#ifndef FA_NO_LOAD
  if (job == "load") {
    const int rows = std::atoi(argv[2]), d = std::atoi(argv[3]), rv = std::atoi(argv[4]), rs = std::atoi(argv[5]);
    if (rows == 64 && d == 128) run_load<64, 128>(rv, rs);
    else if (rows == 128 && d == 128) run_load<128, 128>(rv, rs);
    else if (rows == 64 && d == 64) run_load<64, 64>(rv, rs);
    else return 2;
    return 0;
  }
#endif
#ifndef FA_NO_QK
  if (job == "qk") { if (std::atoi(argv[2]) == 64) run_qk<64>(); else run_qk<128>(); return 0; }
  if (job == "pv") { if (std::atoi(argv[2]) == 64) run_pv<64>(); else run_pv<128>(); return 0; }
#endif
  return 2;
}
