// v10_wide_stores: v6_block_n176 with the epilogue's stores of O 16 bytes a lane. In the WGMMA accumulator layout a
// lane holds two adjacent columns of every 8, so v6 stores O 4 bytes at a time, 32 stores a thread, each warp's
// store touching 8 rows; Nsight Compute's source counters put 15% of the consumer warps' stall samples on large in
// the epilogue and the next tile's start, most of them on a full store queue. Here the four lanes of a quad
// transpose their pieces with two rounds of shuffles first (HFA_WIDE_STORES, hopper_harness.cuh's epilogue).
// Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_WIDE_STORES 1
#include "student_kernel_solution.cu"
