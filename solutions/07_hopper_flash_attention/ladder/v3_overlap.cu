// v3_overlap: + the softmax of S_j overlapped with O += P V_{j+1} inside each warpgroup.
// Verdict: 469 TFLOP/s on `large`, within noise of v2 at this tile size (0.88x cuDNN); 0.94-1.05x cuDNN at 4k-16k.
// Measured by benchmarks/ladder.py (checks fp16 + bf16, timings fp16): benchmarks/results/2026-11-22_h100_step07.json.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 0
#include "student_kernel_solution.cu"
