// v6_hopper_window's kernel: step 07's Hopper kernel (its solution in v4_persistent's configuration:
// TMA, WGMMA, producer/consumer warpgroups, ping-pong, softmax overlap, persistent CTAs) with the
// sliding window of FaParams::window compiled in (HFA_WINDOW, hopper_common.cuh): a query tile's
// key-block loop starts at the window's first block (first_kv_block), and the blocks that cross the
// window's lower edge are masked like the diagonal ones (window_cuts, apply_mask).
// Built by v6_hopper_window.py with step 07's folder and its ladder/ on the include path and step 07's
// fa_binding.cpp (forward(q, k, v, causal, scale, window)), for sm_90a.
// With step 07's v10 stores of O, and v13's and v14's descriptors (the consumers' warpgroup index through a
// shuffle, each k-step's descriptor the block's first plus an offset): 2-3% faster on the windows by each of the three
// timing methods (results/2026-12-03_h200_step10_window_switches.txt). Its tiles are short (about nine key
// blocks), so v11's longest-first order (causal only) and v12's overlapped tiles do not apply or do not pay.
#define HFA_WINDOW 1
#define HFA_WIDE_STORES 1
#define HFA_UNIFORM_WG 1
#define HFA_DESC_ADD 1
#include "student_kernel_solution.cu"
