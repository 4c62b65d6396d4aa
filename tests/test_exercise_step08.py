"""Step 08, the backward pass: the exercise as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores every point a CPU can give
(correctness through the judge; bf16 and speed need a GPU and score 0 here, saying why); the
untouched stub scores 0 (``GRADING``, graded by tests/test_exercise_grading.py in one autograde run
with the other steps'). Each classic mistake, planted in the solution's kernels, loses the points
of a test whose message names it (the hidden tests run the same checks through the judge,
``judge.run_inprocess``). The GPU tier (every test, perf included) is ``python -m
autograder.gpu_selftest 08`` on a GPU machine.
"""
from __future__ import annotations

from conftest import assert_planted_bugs_named, solution_and_stub

STEP = "08_backward"
GPU_ONLY = {"test_bf16", "perf_large", "perf_long"}


# (the cell, the solution's text, the mistake, the test that loses its point, what its message names)
PLANTED = {
    "no_D": ("dkdv", "ds = p * (dp - delta[:, None])", "ds = p * dp", "test_small", "the D term is missing"),
    "gqa_not_summed": ("dkdv", "for g in range(GROUP):", "for g in range(1):", "test_small",
                       "GQA: dK and dV hold only"),
    "dq_scaled_twice": ("dq", "(dq * scale).to(", "(dq * scale * scale).to(", "test_small", "dQ is scaled twice"),
    "no_causal_mask_backward": ("dkdv", "    if CAUSAL:\n        keep = keep &", "    if False:\n        keep = keep &",
                                "test_small", "the causal mask is missing in the backward"),
    # the next row's lse, wrapping at the end of the head (in bounds: a read past LSE's end would give
    # whatever memory holds there, and the diagnosis with it)
    "lse_wrong_row": ("dq", "lse = tl.load(LSE + row_base + offs_m,", "lse = tl.load(LSE + row_base + (offs_m + 1) % Sq,",
                      "test_edge_d64_mqa", "another row's lse"),
    "saves_p": ("autograd", "        ctx.save_for_backward(q, k, v, o, lse)",
                "        ctx.save_for_backward(q, k, v, o, lse)\n        ctx.p = q.new_zeros(q.shape[0], q.shape[1], "
                "q.shape[2], k.shape[2])", "test_medium", "kept"),
    # the same P kept two containers deep, where a look one level down missed it
    "saves_p_nested": ("autograd", "        ctx.save_for_backward(q, k, v, o, lse)",
                       "        ctx.save_for_backward(q, k, v, o, lse)\n        ctx.state = [[q.new_zeros(q.shape[0], "
                       "q.shape[1], q.shape[2], k.shape[2])]]", "test_medium", "kept"),
    # GQA's head mapping interleaved (h % Hkv, not h // G) in one pass or both: each named for where it sits
    "gqa_dq_head_mod": ("dq", "(h // GROUP) * s", "(h % (Hq // GROUP)) * s", "test_small",
                        "the dQ pass reads K and V of KV head h % Hkv for query head h"),
    "gqa_dkdv_head_mod": ("dkdv", "h = h_kv * GROUP + g", "h = g * (Hq // GROUP) + h_kv", "test_small",
                          "the dK/dV pass sums KV head j's gradients over the query heads with h % Hkv = j"),
    "gqa_head_mod": (("dq", "dkdv"), ("(h // GROUP) * s", "h = h_kv * GROUP + g"),
                     ("(h % (Hq // GROUP)) * s", "h = g * (Hq // GROUP) + h_kv"), "test_small",
                     "the backward pairs query head h with KV head h % Hkv"),
    # the bottom-right causal mask of the forward, top-left in the backward's rebuilt P (Sq != Skv only)
    "top_left_backward": ("dkdv", "keep = keep & (offs_n[None, :] <= offs_m[:, None] + (Skv - Sq))",
                          "keep = keep & (offs_n[None, :] <= offs_m[:, None])", "test_edge_ragged",
                          "the backward's causal mask is aligned top-left"),
    # with Sq - Skv >= Skv - 1 top-left shows every row that sees a key all of them: no mask gives the same gradients
    "top_left_backward_no_mask_alike": ("dkdv", "keep = keep & (offs_n[None, :] <= offs_m[:, None] + (Skv - Sq))",
                                        "keep = keep & (offs_n[None, :] <= offs_m[:, None])", "test_edge_empty_rows",
                                        "the causal mask is missing in the backward, or aligned top-left"),
    # a backward with no kernel of its own (the given forward's kernel ran): computed by PyTorch, here as zeros
    "backward_without_kernels": ("autograd", "        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.causal, "
                                 "ctx.scale)", "        dq, dk, dv = q * 0 + do.sum() * 0, k * 0, v * 0", "test_small",
                                 "no Triton kernel read dO"),
}

# the demo's samples, graded by tests/test_exercise_grading.py: the solution scores every CPU point, the
# untouched stub 0, the solution with the planted 'no_causal_mask_backward' loses its test's points
GRADING = solution_and_stub(STEP, 16, GPU_ONLY, 5, PLANTED["no_causal_mask_backward"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names it."""
    assert_planted_bugs_named(tmp_path, STEP, ("setup", "forward"), PLANTED)


def test_one_query_row_has_no_other_rows_lse_to_blame():
    """With Sq = 1 (decode), "P rebuilt with another row's lse" is the row's own lse: the diagnosis would name it for
    any mistake that leaves the first batch right, so it is not offered there."""
    import torch

    from facourse import backward as bw
    one, many = torch.zeros(2, 8, 1, 64), torch.zeros(2, 8, 16, 64)
    k = torch.zeros(2, 2, 16, 64)
    assert "lse_next_row" not in bw._variants_for(one, k, True)
    assert "lse_next_row" in bw._variants_for(many, k, True)


def test_alignment_and_head_mapping_are_offered_only_where_they_change_the_gradients():
    """Top-left equals bottom-right when Sq = Skv, and no mask once Sq - Skv >= Skv - 1 (then one mistake names
    both); h % Hkv equals h // (Hq // Hkv) with one KV head (MQA) or none shared (Hq = Hkv)."""
    import torch

    from facourse import backward as bw

    def offered(Hq, Hkv, Sq, Skv, causal=True):
        return bw._variants_for(torch.zeros(1, Hq, Sq, 8), torch.zeros(1, Hkv, Skv, 8), causal)
    assert "top_left_backward" not in offered(8, 2, 64, 64) and "top_left_backward" not in offered(8, 2, 40, 56, False)
    assert {"top_left_backward", "no_mask_backward"} <= set(offered(8, 2, 40, 56)) & set(offered(8, 2, 56, 40))
    alike = offered(4, 1, 300, 100)
    assert "top_left_backward" in alike and "no_mask_backward" not in alike
    assert "gqa_head_mod" in offered(8, 2, 64, 64)
    assert all("gqa_head_mod" not in offered(*h, 64, 64) for h in ((8, 1), (8, 8)))
