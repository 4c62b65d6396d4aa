// v4_swizzle.cu: v3 with XOR-swizzled shared memory (chunk c of row r at c ^ (r % 8)): every
// ldmatrix and cp.async phase is bank-conflict free without padding. This rung IS the exercise's
// solution (student_kernel_solution.cu + fa_harness.cuh) and the step's flash_attention_cuda.
// verdict: the solution kernel: FA2 on mma.sync, 2-stage cp.async, swizzle, causal tile skipping.
// figure: not yet measured on a GPU
#include "student_kernel_solution.cu"
