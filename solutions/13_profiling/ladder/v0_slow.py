"""v0: the slow kernel exercise 13 hands out: step 05's FlashAttention-2 forward with four defects, each
one a counter of lecture 13 shows.

v0 verdict: four defects: 22 TFLOP/s on large (0.07x FA2), 45 on long (0.13x) (H200,
benchmarks/results/2026-12-05_h200_step13.json).

The kernel is step 05's ``step05_kernel.attn_fwd`` (shared by step 05's v2-v6); this rung's switches and
launch, and the counter each defect should show:
- ``F32_DOTS=True``: Q, K^T, P and V cast to fp32 before ``tl.dot``, which Triton runs as TF32 on the tensor
  cores (a cast kept from a CPU debugging session): half the fp16 rate, operands twice the bytes
  (``sm__ops_path_tensor_src_tf32`` instead of ``..._fp16``; ``tf32`` in the PTX on a CPU);
- 128 x 128 tiles with 4 warps: the fp32 accumulator and S of 128 rows in 128 threads do not fit 255
  registers, and ptxas spills 1464 bytes a thread to the stack in local memory (``derived__local_spilling_requests``;
  ``ptxas -v`` on a CPU);
- ``num_stages=1``: each K and V tile is loaded, then used, with no load in flight under the dots
  (warp stalls on ``long_scoreboard``);
- ``CAUSAL_SPLIT=False``: every key tile visited and masked, the ones above the diagonal too (a useful share
  of about 0.5 on `large`, lecture 13 section 6).

Each later rung removes one: v1 fp16 dots, v2 8 warps (no spills), v3 128 x 64 tiles and 3 stages (K and V
loads in flight; 128 x 128 with 3 stages needs 224 KB of shared memory, the H100's opt-in limit less 3 KB,
and no sm_80), v4 the causal split (step 05's v3 idea), v5 two programs an SM (step 05's tiles). Registers,
spills and shared memory of each are compile-time facts, checked on a CPU (tests/test_step13_ladder.py).

Run on its own:  python v0_slow.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "05_triton_flash_attention",
                             "ladder"))
import step05_kernel as fa  # noqa: E402  (sets up the interpreter without a GPU, before triton)

# ----------------------------------------------------------------------------- switches and launch
SWITCHES = dict(EXP2=False, CAUSAL_SPLIT=False, DESC=fa.POINTERS.value, F32_DOTS=True)
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128}
LAUNCH = {"num_warps": 4, "num_stages": 1}


def entry(switches, config, launch):
    """The rung's entry point: step 05's kernel with ``switches``, ``config`` tiles and ``launch`` (v1-v4 too)."""
    def fast_attention(q, k, v, causal=False, scale=None):
        """FlashAttention-2 forward. q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (any strides). Returns (o, lse)."""
        return fa.launch_fixed(q, k, v, causal, scale, switches, config, launch)
    return fast_attention


fast_attention = entry(SWITCHES, CONFIG, LAUNCH)

if __name__ == "__main__":
    fa.run_standalone(fast_attention, sys.argv)
