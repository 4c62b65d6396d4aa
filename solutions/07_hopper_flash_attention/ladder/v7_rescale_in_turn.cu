// v7_rescale_in_turn: v6_block_n176 with O rescaled where FlashAttention-3's mainloop rescales it: after S_j is
// issued and before O += P_{j+1} V_{j+1}, inside the warpgroup's turn, so that the 64 multiplies run under the
// S GEMM instead of after the wait for the last product (a register pin keeps ptxas from hoisting them above
// the S issue; the SASS has them between the two GEMMs). Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_RESCALE_IN_TURN 1
#include "student_kernel_solution.cu"
