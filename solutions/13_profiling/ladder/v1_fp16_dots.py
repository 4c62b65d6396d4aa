"""v1: v0 with fp16 operands for both dots (P cast to V's dtype): the tensor cores' fp16 path.

v1 verdict: not measured yet (benchmarks/counters.py and benchmarks/ladder.py 13).

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
