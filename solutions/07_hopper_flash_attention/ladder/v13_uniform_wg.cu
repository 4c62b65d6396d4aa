// v13_uniform_wg: v11_lpt_sections with the consumers' warpgroup index taken through __shfl_sync (HFA_UNIFORM_WG,
// hopper_harness.cuh). WGMMA reads its shared-memory descriptors from uniform registers, one copy a warp; from
// threadIdx.x / 128, which nvcc does not treat as the same in all 32 lanes, the descriptors that depend on the index
// were built per thread and copied over by R2UR (16 in the masked key-block loop, 72 in the fp16 kernel at D 128);
// lane 0's value through a shuffle is uniform to the compiler, and they stay on the uniform datapath (41 R2UR left,
// none in that loop). The same change in step 08's backward: 2026-12-02_h200_step08_v4_uniform_probes.txt.
// Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_WIDE_STORES 1
#define HFA_LPT 1
#define HFA_UNIFORM_WG 1
#include "student_kernel_solution.cu"
