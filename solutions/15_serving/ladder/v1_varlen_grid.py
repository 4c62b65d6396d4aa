"""v1: the exercise's solution: one Triton FlashAttention-2 kernel for packed sequences of different
lengths and for new tokens against a paged cache. Its code is the exercise's
(solutions/15_serving/15_serving.pct.py, the cells `setup`, `kv_offsets`, `kernel` and `launch`); this
file loads those cells (facourse.steps.exercise_module), so the rung and the exercise's solution are one
source.

The grid is FlashAttention-2's varlen grid: (cdiv(max_seqlen_q, BLOCK_M), B, Hq). A program reads its
sequence's offsets from cu_seqlens (or seq_lens and the block table), skips its work when its query tile
starts past the sequence's end, and runs step 05's loop over its own sequence's keys with the causal offset
kv_len - q_len, masking every tile (no causal stage split). Paged keys are found one row at a time: page
block_table[b, j // page_size], row j % page_size, so any page size works. One program per query head: the
G heads of a KV group each read its keys (from L2 after the first).

Run on its own:  python v1_varlen_grid.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
from facourse import steps
from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()          # before the cells import triton

_exercise = steps.exercise_module("15", ("setup", "kv_offsets", "kernel", "launch"))
serving_kernel = _exercise.serving_kernel
varlen_attention = _exercise.varlen_attention
paged_prefill = _exercise.paged_prefill


if __name__ == "__main__":
    from facourse.serving import PAGED_CASES, VARLEN_CASES, check_paged_prefill, check_varlen
    for case in VARLEN_CASES:
        check_varlen(varlen_attention, case, seed=0)
    for case in PAGED_CASES:
        check_paged_prefill(paged_prefill, case, seed=0)
