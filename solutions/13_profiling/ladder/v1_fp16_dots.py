"""v1: v0 with fp16 operands for both dots (P cast to V's dtype): the tensor cores' fp16 path.

v1 verdict: fp16 dots, still spilling: 87 TFLOP/s on large (0.29x FA2), 201 on long (0.56x), 4.0x v0 on large (H200,
benchmarks/results/2026-12-05_h200_step13.json).

The kernel and its defects: v0_slow.py. Run on its own:  python v1_fp16_dots.py   (TRITON_INTERPRET=1 without a GPU)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v0_slow as prev  # noqa: E402  (the rung before this one)

fa, entry = prev.fa, prev.entry
SWITCHES = dict(prev.SWITCHES, F32_DOTS=False)
CONFIG, LAUNCH = prev.CONFIG, prev.LAUNCH

fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
