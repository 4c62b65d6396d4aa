// v6_hopper_window's kernel: step 07's Hopper kernel (its solution in v4_persistent's configuration:
// TMA, WGMMA, producer/consumer warpgroups, ping-pong, softmax overlap, persistent CTAs) with the
// sliding window of FaParams::window compiled in (HFA_WINDOW, hopper_common.cuh): a query tile's
// key-block loop starts at the window's first block (first_kv_block), and the blocks that cross the
// window's lower edge are masked like the diagonal ones (window_cuts, apply_mask).
// Built by v6_hopper_window.py with step 07's folder and its ladder/ on the include path and step 07's
// fa_binding.cpp (forward(q, k, v, causal, scale, window)), for sm_90a.
#define HFA_WINDOW 1
#define HFA_WIDE_STORES 1
#include "student_kernel_solution.cu"
