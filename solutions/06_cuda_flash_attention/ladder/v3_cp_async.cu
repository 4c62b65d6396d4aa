// v3_cp_async.cu: a 2-stage cp.async pipeline: K_{j+1}, V_{j+1} stream into shared memory while the
// tensor cores work on K_j, V_j; BLOCK_M = 128 rows (8 warps x 16), Q_i kept in registers.
// verdict: hides global-memory latency; still row-major shared memory (ldmatrix bank conflicts).
// figure: 53 TFLOP/s on large (0.17x FA2): no gain over v2 while ldmatrix reads conflict; 0.16-0.18x FA2 over 4k-16k, H100 (benchmarks/ladder.py: benchmarks/results/2026-11-22_h100_step06_ladder.json)
//
// The exercise's harness and solution (v4) with row-major tiles: v4 is this rung plus the swizzle.
struct V3Traits {
  static constexpr int kWarps = 8;
  static constexpr int kStages = 2;
  static constexpr bool kCpAsync = true;
  static constexpr bool kSwizzle = false;
  static constexpr int kMinBlocks = 0;
};
#define FA_HARNESS_TRAITS V3Traits
#include "student_kernel_solution.cu"
