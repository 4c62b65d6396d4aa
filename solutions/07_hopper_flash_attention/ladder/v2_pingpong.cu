// v2_pingpong: + ping-pong: the two consumer warpgroups take turns issuing GEMMs (named barriers).
// Verdict: 471 TFLOP/s on `large` (+3% over v1; cuDNN's own figure varied 467-537 across runs, so its ratio 0.97x is noisy); 0.94-1.15x cuDNN at 4k-16k.
// Measured by ladder/gpu_check.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 0
#define HFA_PERSISTENT 0
#include "student_kernel_solution.cu"
