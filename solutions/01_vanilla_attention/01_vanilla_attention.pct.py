# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 01 — Vanilla attention
#
# You will write attention the way the textbook states it, and the way every faster kernel in this
# course is checked against:
#
# $$S = \text{scale}\cdot QK^\top,\qquad P = \operatorname{softmax}(S + M),\qquad O = PV$$
#
# with $\text{scale} = 1/\sqrt{D}$ unless given, and $M$ the causal mask ($0$ where a key is visible,
# $-\infty$ where it is not).
#
# **The contract** (the same for every step of the course):
#
# - `q` is `[B, Hq, Sq, D]`; `k` and `v` are `[B, Hkv, Skv, D]`, and `Hq` is a multiple of `Hkv`.
#   Query head `h` reads KV head `h // (Hq // Hkv)` (grouped-query attention; `Hkv == 1` is MQA).
# - `causal=True` is **bottom-right aligned**: key `j` is visible to query `i` iff `j <= i + (Skv - Sq)`.
#   When `Sq == Skv` this is the familiar lower triangle. When `Sq < Skv` (a chunk of new queries against
#   a KV cache) the last query sees every key. When `Sq > Skv`, the first `Sq - Skv` rows see **no key**:
#   their output must be zeros, not NaN.
# - The output has `q`'s shape and dtype. Inputs may be non-contiguous views (`stride(-1) == 1`).
#
# **What is graded** (7 points): the visible test below on `small`, then hidden tests on `medium`, `large`,
# `noncausal`, `asymmetric` (Sq = 128 against Skv = 2048) and two edge cases (ragged lengths 200 × 333;
# Sq > Skv with empty rows), on inputs drawn from seeds you do not see. Without a GPU the five
# configurations run at CPU sizes in float32; with one, at full size in float16.
#
# Read `course/01_vanilla_attention.ipynb` first if you have not.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import torch

from facourse import check_entry_point, validate_inputs

# %% [markdown] nbgrader={"grade": false, "grade_id": "task", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task
#
# Implement `vanilla_attention(q, k, v, causal=False, scale=None)`.
#
# Hints, in the order you will need them:
# 1. GQA: `k.repeat_interleave(Hq // Hkv, dim=1)` gives every query head its KV head (which mapping
#    does `repeat_interleave` produce, `h // group` or `h % Hkv`?).
# 2. Compute the scores and the softmax in float32 even when the inputs are float16: the scores of
#    the hidden tests can be large, and fp16 keeps only about three significant digits.
# 3. `torch.softmax` of a row that is all `-inf` is NaN. Rows with no visible key must give zeros.
# 4. Cast the output back to `q.dtype`.

# %% nbgrader={"grade": false, "grade_id": "vanilla_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def vanilla_attention(q, k, v, causal=False, scale=None):
    """Attention with the full S and P matrices. Returns o, shaped and typed like q."""
    validate_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # YOUR CODE HERE (about 10 lines)
    ### BEGIN SOLUTION
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1).float()          # head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1).float()
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * scale   # S = scale · Q Kᵀ
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), float("-inf"))  # bottom-right causal mask
    p = torch.softmax(s, dim=-1)                              # P = softmax(S)
    p = torch.nan_to_num(p, nan=0.0)                          # rows with no visible key
    return torch.matmul(p, v).to(q.dtype)                    # O = P V
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_entry_point` draws inputs for a configuration, calls your function on non-contiguous views,
# and compares with a float64 reference. When it fails it tells you which rows and heads are wrong
# and the most likely cause. Run it as often as you like; the hidden tests use the same check.

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_entry_point(vanilla_attention, "small")
check_entry_point(vanilla_attention, "small", scale=0.05)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", vanilla_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded by the autograder with inputs you do not see. Passing `small` above is
# necessary, not sufficient: think about GQA head mapping, `Sq != Skv`, and rows that see no key.
# You can try the same configurations yourself: `check_entry_point(vanilla_attention, "asymmetric")`.

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "medium"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", vanilla_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", vanilla_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "noncausal"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", vanilla_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "asymmetric"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", vanilla_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: ragged lengths
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", vanilla_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: Sq > Skv, causal: rows that see no key
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", vanilla_attention)
### END HIDDEN TESTS
