// v9_prefetch_q: v6_block_n176 with the next tile's Q fetched into L2 (cp.async.bulk.prefetch.tensor) as soon as
// the producer has the tile's number, and the tile's first K loaded before its Q. Q is read from HBM once per tile
// and its slot frees only after the tile's last S, so its load was the one suspect of a stall between tiles
// (the v5 ring showed that K and V are not). Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 176
#define HFA_PREFETCH_Q 1
#define HFA_EARLY_K 1
#include "student_kernel_solution.cu"
