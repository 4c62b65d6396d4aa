// v5_stages3: v4_persistent with a K/V ring three blocks deep instead of two (Q 32 KB + 3 x 64 KB at D 128),
// so the producer can run one more block ahead of the consumers: the tail of one tile and the head of
// the next (a short loop: step 10's window has 9 key blocks per tile) overlap more.
// Verdict: it does not pay: 487 TFLOP/s on large against v4's 495 in one run, at or under v4 at 4k-16k, and
// 391-399 TFLOP/s on step 10's 1024 window against 396-401 (H100, 2026-11-27; step.toml has the rest).
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_STAGES 3
#include "student_kernel_solution.cu"
