// v5_warp_specialized.cu: FlashAttention-3's scheduling ideas on any sm_80+ (mma.sync, cp.async):
// a producer warp fills a K/V ring and mbarriers hand stages over (no CTA-wide barrier in the
// loop), and each consumer warp computes S_{j+1} = Q K_{j+1}^T while it does the softmax of tile j.
// verdict: pays on long sequences only: 1.1x v4 on large, yet below FA2 there (a producer warp costs a consumer's registers)
// figure: 274 TFLOP/s on large (0.90x FA2); 0.99-1.07x FA2 over 4k-16k, H100 (benchmarks/ladder.py: benchmarks/results/2026-11-22_h100_step06_ladder.json)
//
// The kernel is ladder/harness.cuh's (what each switch does is described there); v5 turns on the two
// FA3 ideas and nothing else: a producer warp and the softmax overlapped with the next QK^T. Its 16-row
// warps keep Q_i in registers and leave room for the overlap's second S. The lecture's table of
// variants (ladder/v5_variants.py, the list at the end of this file) measures each idea on its own;
// v6 is the winner.
#include "harness.cuh"

struct V5Traits {
  static constexpr int kConsumerWarps = 7;       // + 1 producer warp: 8 warps, 255 registers each on sm_80
  static constexpr int kMTiles = 1;              // 16 rows per warp: BLOCK_M = 112
  static constexpr int kBlockN = 64;
  static constexpr int kStages = 3;
  static constexpr bool kProducerWarp = true;    // FA3 3.1: warp specialization, mbarrier ring
  static constexpr bool kOverlap = true;         // FA3 3.2: S_{j+1} = Q K_{j+1}^T during the softmax of j
  static constexpr bool kQInRegisters = true;
  static constexpr bool kLazyRescale = false;
  static constexpr int kMinBlocks = 1;
};

extern "C" int fa_launch(const FaParams* p, void* stream) { return ladder::launch<V5Traits>(p, stream); }

#ifdef V5_VARIANTS
// The variants measured for the lecture's table (built by ladder/v5_variants.py, not by the course).
// One row each, its columns in a fixed order (benchmarks/tables.py and the lecture read them from
// this list); v5::Cfg turns a row into the named traits the harness takes.
namespace v5 {
template <int NC, int MT, int BN, int STAGES, bool PRODUCER, bool OVERLAP, bool QREG, bool LAZY, int MINB>
struct Cfg {
  static constexpr int kConsumerWarps = NC, kMTiles = MT, kBlockN = BN, kStages = STAGES, kMinBlocks = MINB;
  static constexpr bool kProducerWarp = PRODUCER, kOverlap = OVERLAP, kQInRegisters = QREG, kLazyRescale = LAZY;
};
}  // namespace v5
#define V5_VARIANT_LIST(X)                                                                        \
  /*                          NC MT  BN ST  PROD   OVL    QREG   LAZY   MINB */                         \
  X(fa2_like,           v5::Cfg<4, 2, 64, 2, false, false, false, false, 2>)                           \
  X(fa2_like_lazy,      v5::Cfg<4, 2, 64, 2, false, false, false, true,  2>)                           \
  X(fa2_n32,            v5::Cfg<4, 2, 32, 4, false, false, false, false, 2>)                           \
  X(fa2_ovl_n32_lazy,   v5::Cfg<4, 2, 32, 4, false, true,  false, true,  2>)                           \
  X(fa2_8w_lazy,        v5::Cfg<8, 2, 64, 2, false, false, false, true,  1>)                           \
  X(fa2_8w_3st_lazy,    v5::Cfg<8, 2, 64, 3, false, false, false, true,  1>)                           \
  X(ws7x32,             v5::Cfg<7, 2, 64, 3, true,  false, false, false, 1>)                           \
  X(ws7x32_lazy,        v5::Cfg<7, 2, 64, 3, true,  false, false, true,  1>)                           \
  X(ws7x32_ovl_n32_lazy,v5::Cfg<7, 2, 32, 4, true,  true,  false, true,  1>)                           \
  X(ws3x32_lazy,        v5::Cfg<3, 2, 64, 2, true,  false, false, true,  2>)                           \
  X(ws7x16_ovl_q,       v5::Cfg<7, 1, 64, 3, true,  true,  true,  false, 1>)                           \
  X(ws7x16_ovl_q_lazy,  v5::Cfg<7, 1, 64, 3, true,  true,  true,  true,  1>)                           \
  X(ws7x16_q,           v5::Cfg<7, 1, 64, 3, true,  false, true,  false, 1>)                           \
  X(v4_like_4w,         v5::Cfg<4, 1, 64, 2, false, false, true,  false, 2>)
#define V5_CASE(name, ...) if (i == n++) return ladder::launch<__VA_ARGS__>(p, stream);
#define V5_NAME(name, ...) if (i == n++) return #name;
extern "C" int fa_launch_variant(const FaParams* p, void* stream, int i) {
  int n = 0;
  V5_VARIANT_LIST(V5_CASE)
  return (int)cudaErrorInvalidValue;
}
extern "C" const char* fa_variant_name(int i) {
  int n = 0;
  V5_VARIANT_LIST(V5_NAME)
  return nullptr;
}
#endif
