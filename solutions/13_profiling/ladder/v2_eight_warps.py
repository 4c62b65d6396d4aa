"""v2: v1 with 8 warps: 64 rows of the accumulator and of S a warpgroup, no spills.

v2 verdict: no spills on 8 warps: 117 TFLOP/s on large (0.38x FA2), 258 on long (0.72x) (H200,
benchmarks/results/2026-12-05_h200_step13.json).

The kernel and its defects: v0_slow.py. Run on its own:  python v2_eight_warps.py   (TRITON_INTERPRET=1 without a GPU)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v1_fp16_dots as prev  # noqa: E402  (the rung before this one)

fa, entry = prev.fa, prev.entry
SWITCHES, CONFIG = prev.SWITCHES, prev.CONFIG
LAUNCH = dict(prev.LAUNCH, num_warps=8)

fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
