"""Step 09, decode against a paged KV cache: the exercise as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores every point a CPU can give
(correctness and bad inputs through the judge; bf16 and speed need a GPU and score 0 here, saying
why); the untouched stub scores 0 (``GRADING``, graded by tests/test_exercise_grading.py in one autograde
run with the other steps'). Each classic mistake, planted in the solution's kernels, loses
the points of a test whose message names it (the hidden tests run the same checks through the
judge, ``judge.run_inprocess``). The GPU tier (every test, perf included) is ``python -m
autograder.gpu_selftest 09`` on a GPU machine.
"""
from __future__ import annotations

from conftest import assert_planted_bugs_named, solution_and_stub

STEP = "09_decode_paged_kv"
GPU_ONLY = {"test_bf16", "perf_b64_8k_p16", "perf_b16_32k_p64"}


# (the cell, the solution's text, the mistake, the test that loses its point, what its message names)
PLANTED = {
    "merge_without_rescale": ("merge_kernel", "w = tl.math.exp2(lse_s - big_use)",
                              "w = tl.where(lse_s == float('-inf'), 0.0, 1.0)", "test_mixed", "the merge of the splits"),
    "page_not_from_table": ("split_kernel",
                            "page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0)",
                            "page = (offs_n // page_size + 0 * b)", "test_mixed", "the block table is ignored"),
    "gqa_mapping": ("split_kernel", "head = kvh * G + rows // SQ", "head = kvh + (rows // SQ) * (Hq // G)",
                    "test_mixed", "the query heads map to the wrong KV head"),
    "empty_sequence_nan": ("merge_kernel", "safe = tl.where(total == 0.0, 1.0, total)", "safe = total",
                           "test_mixed", "these rows see no key"),
    "last_page_dropped": ("split_kernel", "end = tl.minimum(start + split_len, L)",
                          "end = tl.minimum(start + split_len, (L // page_size) * page_size)", "test_mixed",
                          "the last, partial page is skipped"),
    # the keys loaded up to the end of the last page, not to seq_len: NaN from the rows past the last token
    "last_page_unmasked": ("split_kernel", "end = tl.minimum(start + split_len, L)",
                           "end = tl.minimum(start + split_len, tl.cdiv(L, page_size) * page_size)", "test_mixed",
                           "a last page is read past seq_len"),
    # w_s = exp(lse_s) without the max lse subtracted: inf / inf for the logits in the hundreds of test_page64
    "merge_unsafe_exp": ("merge_kernel", "w = tl.math.exp2(lse_s - big_use)",
                         "w = tl.math.exp2(lse_s)\n    big_use = big_use * 0.0", "test_page64",
                         "the merge exponentiates lse without subtracting the max"),
    # q is a view of [B, Sq, Hq, D] storage: its token stride is Hq * D, not D (test_spec's Sq > 1 rows alone)
    "q_token_stride_ignored": ("launch", "*q.stride()[:3]", "q.stride(0), q.stride(1), D", "test_spec",
                               "q is read with the wrong strides"),
    "no_validation": ("launch", "    validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale)\n", "",
                      "test_bad_inputs", "validate_paged_inputs"),
}

# the demo's samples, graded by tests/test_exercise_grading.py: the solution scores every CPU point, the
# untouched stub 0, the solution with the planted 'empty_sequence_nan' loses its test's points
GRADING = solution_and_stub(STEP, 15, GPU_ONLY, 6, PLANTED["empty_sequence_nan"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names it."""
    assert_planted_bugs_named(tmp_path, STEP, ("setup",), PLANTED)
