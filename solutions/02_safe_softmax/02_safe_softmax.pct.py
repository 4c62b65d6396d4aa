# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 02 — Safe softmax
#
# Attention turns every row of scores into weights with a softmax:
#
# $$\operatorname{softmax}(x)_j = \frac{e^{x_j}}{\sum_k e^{x_k}} = \frac{e^{x_j - m}}{\ell},\qquad
# m = \max_k x_k,\qquad \ell = \sum_k e^{x_k - m}.$$
#
# Both forms are equal for every constant $m$ (multiply top and bottom by $e^{-m}$), but only the second
# one survives floating point: $e^{x}$ overflows above $x \approx 11.1$ in float16 and $x \approx 88.7$ in
# float32, and logits of attention reach the tens and hundreds. With $m$ the row max, every exponent is
# $\le 0$, so every $e^{x_j - m} \in (0, 1]$ and $\ell \in [1, n]$: nothing overflows and the largest term
# is exactly 1.
#
# **What you will learn**: why the max is subtracted, what it costs (a second pass over the row, which
# step 03 removes), and the one row every attention kernel must define by hand: a row whose entries are
# **all** $-\infty$ (a query that sees no key, e.g. $S_q > S_{kv}$ with bottom-right causal masking).
# There $m = -\infty$ and $x - m = -\infty - (-\infty) = \text{NaN}$.
# **This course defines the softmax of a fully $-\infty$ row as all zeros** (the row contributes nothing,
# as attention's $o = 0$, $\text{lse} = -\infty$ for such rows).
#
# **Paper**: the "safe softmax" is Algorithm 2 of Milakov & Gimelshein, *Online normalizer calculation for
# softmax* (2018), §2; FlashAttention (Dao et al., 2022) §2.2 builds on it.
#
# **The contract**: `safe_softmax(x, dim=-1)` returns a tensor of `x`'s shape and dtype (float16, bfloat16
# or float32; compute in float32 inside), the softmax along `dim`, zeros for fully $-\infty$ rows, and leaves
# `x` untouched.
#
# **What is graded** (8 points by the autograder, 2 by hand): the visible test on `small` below, then hidden
# tests, on inputs drawn from seeds you do not see, over the attention scores of the other four
# configurations (`medium`, `large`, `noncausal`, `asymmetric`), rows of many lengths, logits that overflow
# `exp` in float16 and float32, rows with $-\infty$ entries, fully $-\infty$ rows, float16 inputs, and
# softmax over a dim other than the last. A written answer at the end is graded by your instructor.
#
# Read `course/02_safe_softmax.ipynb` first if you have not.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from facourse import SOFTMAX_CASES, check_softmax_fn, check_visible

# %% [markdown] nbgrader={"grade": false, "grade_id": "task", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task
#
# Implement `safe_softmax(x, dim=-1)` without calling `torch.softmax` (or `F.softmax`, or `logsumexp`).
#
# Hints, in the order you will need them:
# 1. Work in float32: `xf = x.float()`, and cast the result back with `.to(x.dtype)`.
# 2. `m = xf.amax(dim=dim, keepdim=True)`; `keepdim=True` keeps the reduced dim so that `xf - m` broadcasts
#    along any `dim`, not only the last.
# 3. A fully $-\infty$ row has $m = -\infty$: subtract 0 there instead (`torch.where(torch.isneginf(m), 0, m)`),
#    so that its exponentials are $e^{-\infty} = 0$ and $\ell = 0$.
# 4. Divide by $\ell$ only where $\ell > 0$; the other rows are zeros by definition.

# %% nbgrader={"grade": false, "grade_id": "safe_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
def safe_softmax(x, dim=-1):
    """Softmax of x along dim with the row max subtracted; fully -inf rows give zeros. Same dtype as x."""
    # YOUR CODE HERE (about 6 lines)
    ### BEGIN SOLUTION
    xf = x.float()
    m = xf.amax(dim=dim, keepdim=True)                                   # m = max_k x_k
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)           # a fully -inf row subtracts 0
    e = torch.exp(xf - m)                                                # e_j = exp(x_j - m) <= 1
    l = e.sum(dim=dim, keepdim=True)                                     # l = sum_k e_k
    return (e / torch.where(l > 0, l, torch.ones_like(l))).to(x.dtype)   # e / l; l == 0 rows stay 0
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_softmax_fn` draws the inputs of a named case, calls `safe_softmax(x, dim=...)` and compares with a
# float64 reference, allowing twice PyTorch's own rounding error in that dtype plus a small slack. When it
# fails it names the rows and the likely cause. Run it as often as you like; the hidden tests use the same
# check, on the cases listed here:

# %% nbgrader={"grade": false, "grade_id": "cases", "locked": true, "schema_version": 3, "solution": false, "task": false}
for name, what in SOFTMAX_CASES.items():
    print(f"{name:11s} {what}")

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_softmax_fn(safe_softmax, "small")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "visible_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The visible cases: the classic bugs of a softmax fail one of them (overflow-sized logits, fully -inf
# rows, a dim other than the last). It stops at the first failure with the check's message.
check_visible(safe_softmax, "02")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded with inputs you do not see. Passing `small` and the visible cases is
# necessary, not sufficient: the hidden tests draw from seeds you never see. Try any case yourself, e.g.
# `check_softmax_fn(safe_softmax, "overflow")`.

# %% nbgrader={"grade": true, "grade_id": "test_configs", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: the attention scores of medium, large, noncausal and asymmetric
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_configs", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: rows of many lengths
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_ragged", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_overflow", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: logits that overflow exp() in float16 and float32
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_overflow", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_masked", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: rows containing -inf entries
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_masked", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_all_masked", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: fully -inf rows give zeros
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_all_masked", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_half", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: float16 inputs
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_half", safe_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_other_dims", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: softmax along dims other than the last
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_other_dims", safe_softmax)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "question_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Written answer (2 points, graded by your instructor)
#
# (a) Your `safe_softmax` reads each row of `x` from memory how many times, and why can it not do with fewer
# as written? (b) Take float16 logits $x = (12, 0)$. What does the unsafe formula $e^{x_j} / \sum_k e^{x_k}$
# return in float16, and what does yours return? (c) Why is "zeros" the right output for a row that is all
# $-\infty$ in attention, rather than NaN or the uniform $1/n$?
#
# Answer in the cell below, in a few sentences.

# %% [markdown] nbgrader={"grade": true, "grade_id": "written_safe_softmax", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# (a) Three passes: one to find $m = \max_k x_k$, one to sum $\ell = \sum_k e^{x_k - m}$ (it needs the final
# $m$), one to write $e^{x_j - m} / \ell$ (it needs the final $\ell$). Each pass depends on the result of
# the one before, so with the plain formulas none can be fused; step 03's running $(m, \ell)$ fuses the
# first two.
# (b) $e^{12} \approx 162755 > 65504$ is inf in float16, so the unsafe formula gives
# $(\infty/\infty, 1/\infty) = (\text{NaN}, 0)$. With $m = 12$: $(e^0, e^{-12}) / (1 + e^{-12}) \approx
# (0.99999, 6.1 \cdot 10^{-6})$, both finite.
# (c) A fully masked row is a query that may see no key: its attention output must be the empty sum, 0,
# and it must not pollute later computation (NaN spreads through every matmul it touches; $1/n$ would
# let the query attend uniformly to keys it must not see). Zeros also match $\ell = 0$, $\text{lse} = -\infty$.
#
# === BEGIN MARK SCHEME ===
# 2 points in all, in halves:
# - 0.5: (a) three passes (max, sum, normalise), each needing the previous result.
# - 0.5: (b) unsafe gives NaN (and 0) because e^12 overflows fp16 (max 65504); safe gives about (1, 6e-6).
# - 1.0: (c) the row sees no key: output is the empty sum 0; NaN would propagate into O / later layers, and
#   uniform 1/n would attend to masked keys. Half credit for "avoids NaN" without saying why 1/n is wrong.
# === END MARK SCHEME ===
# ### END SOLUTION
