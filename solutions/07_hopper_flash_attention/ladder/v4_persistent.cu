// v4_persistent: + persistent CTAs fed by a global tile counter (the solution's configuration).
// Verdict: 494 TFLOP/s on `large` (+4% over v3), 1.06x cuDNN in that pairing, 1.64x FA2; 0.93-1.03x cuDNN at 4k-16k.
// A static every-132nd-tile schedule measured 0.81x cuDNN on `large` and 0.64x at causal 16k: with
// 132 = 4 (mod 16 or 128 row blocks) each CTA keeps drawing rows of similar length, so the CTAs finish
// far apart (the lecture's load-imbalance model predicts the slowdown). The counter balances them.
// Measured by ladder/gpu_check.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#include "student_kernel_solution.cu"
