"""v4: v3 with step 05's causal split: tiles above the diagonal skipped, only the diagonal's masked, longest query
tiles first.

v4 verdict: causal tiles skipped, 1.9x v3 on large: 275 TFLOP/s (0.90x FA2); 339 on long (0.94x) (H200,
benchmarks/results/2026-12-05_h200_step13.json).

The kernel and its defects: v0_slow.py.
Run on its own:  python v4_causal_split.py   (TRITON_INTERPRET=1 without a GPU)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v3_pipelined as prev  # noqa: E402  (the rung before this one)

fa, entry = prev.fa, prev.entry
SWITCHES = dict(prev.SWITCHES, CAUSAL_SPLIT=True)
CONFIG, LAUNCH = prev.CONFIG, prev.LAUNCH

fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
