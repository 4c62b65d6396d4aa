// v2_pingpong: + ping-pong: the two consumer warpgroups take turns issuing GEMMs (named barriers).
// Verdict: 468 TFLOP/s on `large` (0.88x cuDNN), +2% over v1 (cuDNN's own figure moves by several percent between pairings); 0.94-1.05x cuDNN at 4k-16k.
// Measured by benchmarks/ladder.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 0
#define HFA_PERSISTENT 0
#include "student_kernel_solution.cu"
