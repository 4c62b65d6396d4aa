// v1_ws: TMA + WGMMA + producer/consumer warpgroups with setmaxnreg.
// Verdict: already 1.50x FA2 on `large` (456 TFLOP/s fp16, H100, 2026-11-22), 0.86x cuDNN; 0.93-1.06x cuDNN at 4k-16k.
// Measured by ladder/gpu_check.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 0
#define HFA_OVERLAP 0
#define HFA_PERSISTENT 0
#include "student_kernel_solution.cu"
