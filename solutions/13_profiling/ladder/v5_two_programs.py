"""v5: v4 on step 05's tiles, 64 x 64 on 4 warps with 2 stages: two programs an SM instead of one.

v5 verdict: two programs an SM: 344 TFLOP/s on large (1.13x FA2), 377 on long (1.05x), 1.03-1.18x at 4k-16k (the
solution) (H200, benchmarks/results/2026-12-05_h200_step13.json).

v4 keeps the SM's 8 warps busy with one program of 128 query rows (128 KiB of shared memory at 3 stages, 178
registers: one program an SM), so all of them wait at the same barriers and the dots pause while the softmax
runs. Two programs of 64 rows hold as many warps (occupancy unchanged) but run out of step: one's softmax
fills the other's wait (ncu: more tensor-pipe cycles active, at the same theoretical occupancy).

The kernel and its defects: v0_slow.py.
Run on its own:  python v5_two_programs.py   (TRITON_INTERPRET=1 without a GPU)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v4_causal_split as prev  # noqa: E402  (the rung before this one)

fa, entry = prev.fa, prev.entry
SWITCHES = prev.SWITCHES
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64}
LAUNCH = dict(prev.LAUNCH, num_warps=4, num_stages=2)

fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
