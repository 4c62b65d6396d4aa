// v12_overlap_tiles: v11_lpt_sections with two Q slots, so that the next tile's Q loads while this tile runs, and the
// next tile's first S issued in the same turn as this tile's last P V, so that it runs under the epilogue
// (HFA_OVERLAP_TILES: the producer and the consumers' loop of ladder/overlap_tiles.cuh). Two Q slots and 176-key
// blocks would need 240 KB of shared memory at D 128, past the 227 KB a CTA may have: the key blocks are 160 wide
// (within 1% of 176 in v6, 2026-11-28_h200_step07_block_n.txt). Verdict: step.toml.
#define HFA_PINGPONG 1
#define HFA_OVERLAP 1
#define HFA_PERSISTENT 1
#define HFA_BLOCK_N 160
#define HFA_WIDE_STORES 1
#define HFA_LPT 1
#define HFA_OVERLAP_TILES 1
#include "student_kernel_solution.cu"
