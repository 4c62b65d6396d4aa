"""v3: v2 with 128 x 64 tiles and 3 stages: the next K and V tiles load while this one's dots run.

v3 verdict: K and V loads in flight: 143 TFLOP/s on large (0.47x FA2), 322 on long (0.89x) (H200,
benchmarks/results/2026-12-05_h200_step13.json).

The kernel and its defects: v0_slow.py. Run on its own:  python v3_pipelined.py   (TRITON_INTERPRET=1 without a GPU)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v2_eight_warps as prev  # noqa: E402  (the rung before this one)

fa, entry = prev.fa, prev.entry
SWITCHES = prev.SWITCHES
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64}
LAUNCH = dict(prev.LAUNCH, num_stages=3)

fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
