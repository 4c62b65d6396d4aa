// v11_lpt_sections: v10_wide_stores with causal tiles scheduled longest first across sections of heads whose K and V
// fit in L2 (HFA_LPT, hopper_common.cuh's TileScheduler). Head after head, each head's row blocks longest first,
// the last tiles handed out still include a head's longest (12 key blocks at 2k, 24 at 4k), and the other SMs idle
// while it finishes: on large the SMs were active 95.8% of the kernel's cycles. Non-causal tiles are all equal and
// keep their order. Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_WIDE_STORES 1
#define HFA_LPT 1
#include "student_kernel_solution.cu"
