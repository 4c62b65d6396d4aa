// v14_desc_add: v13_uniform_wg with each k-step's WGMMA descriptor built as the block's first plus the k-step's byte
// offset >> 4, as CUTLASS iterates them (HFA_DESC_ADD, smem_desc_add), instead of smem_desc() of each k-step's address:
// Nsight Compute on noncausal_8k put 31 M ULOP3, 16 M USHF and 6 M UMOV more in v13 than in FlashAttention-4's Sm90
// forward, which ran 3.9% faster with 17% fewer instructions (2026-12-03_h200_step07_fa4_ncu.txt). Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_WIDE_STORES 1
#define HFA_LPT 1
#define HFA_UNIFORM_WG 1
#define HFA_DESC_ADD 1
#include "student_kernel_solution.cu"
