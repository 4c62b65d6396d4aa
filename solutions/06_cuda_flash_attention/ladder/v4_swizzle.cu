// v4_swizzle.cu: v3 with XOR-swizzled shared memory (chunk c of row r at c ^ (r % 8)): every
// ldmatrix and cp.async phase is bank-conflict free without padding. This rung IS the exercise's
// solution (student_kernel_solution.cu + fa_harness.cuh) and the step's flash_attention_cuda.
// verdict: the solution kernel: FA2 on mma.sync, 2-stage cp.async, swizzle, causal tile skipping.
// figure: 248 TFLOP/s on large (0.81x FA2), 4.7x v3; 0.82-0.93x FA2 over 4k-16k, H100 (benchmarks/ladder.py: benchmarks/results/2026-11-22_h100_step06_ladder.json)
// Its traits are fa::ExerciseTraits (fa_harness.cuh): 8 warps x 16 rows, 2 cp.async stages, swizzled tiles.
#include "student_kernel_solution.cu"
