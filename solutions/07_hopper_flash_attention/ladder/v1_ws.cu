// v1_ws: TMA + WGMMA + producer/consumer warpgroups with setmaxnreg.
// Verdict: already 1.49x FA2 on `large` (457 TFLOP/s fp16, H100, 2026-11-22), 0.85x cuDNN; 0.92-1.03x cuDNN at 4k-16k.
// Measured by benchmarks/ladder.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 0
#define HFA_OVERLAP 0
#define HFA_PERSISTENT 0
#include "student_kernel_solution.cu"
