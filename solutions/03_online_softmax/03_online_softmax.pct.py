# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 03 — Online softmax and the (m, l) merge
#
# Safe softmax (step 02) reads each row three times: once for the max $m$, once for the sum
# $\ell = \sum_k e^{x_k - m}$, once to write $e^{x_j - m}/\ell$. The sum needs the *final* max, so the first
# two passes cannot be fused as written. Milakov & Gimelshein's trick is to keep, for the part of the row
# seen so far, the pair $(m, \ell)$ of its max and of its sum *relative to that max*, and to fix the sum up
# whenever the max grows:
#
# $$m^{\text{new}} = \max\left(m, \max_{j \in \text{block}} x_j\right),\qquad
# \ell^{\text{new}} = \underbrace{e^{\,m - m^{\text{new}}}}_{\alpha}\,\ell + \sum_{j \in \text{block}} e^{x_j - m^{\text{new}}}.$$
#
# More generally, the states $(m_a, \ell_a)$ and $(m_b, \ell_b)$ of two disjoint parts of a row **merge** into
# the state of their union:
#
# $$m = \max(m_a, m_b),\qquad \ell = \ell_a\, e^{m_a - m} + \ell_b\, e^{m_b - m}.$$
#
# The merge is commutative and associative with the empty state $(-\infty, 0)$ as its identity, so a row
# can be cut into blocks and reduced in any order: left to right (one pass, this exercise; the inner loop of
# FlashAttention, step 04) or as a tree across thread blocks (split-K, flash-decoding).
# Only differences $m_a - m \le 0$ are exponentiated, so nothing overflows; and when $m = -\infty$ (two
# empty states) the exponents are $-\infty - (-\infty) = \text{NaN}$ unless you guard them.
#
# ![the (m, l) update of one block](../../diagrams/online_softmax_update.png)
#
# **What you will learn**: the running-max recurrence FlashAttention is built on, the $\alpha$ rescale,
# why it is exact (not an approximation), and how to keep the empty state NaN-free.
#
# **Paper**: Milakov & Gimelshein, *Online normalizer calculation for softmax* (2018), §3 (Algorithm 3, the
# online normalizer) and §3.1 (the merge operator $\oplus$ of $(m, d)$ pairs and its associativity).
#
# **The contract**:
# - `merge_softmax_states(m_a, l_a, m_b, l_b) -> (m, l)`: tensors of one shape (float32), elementwise; an
#   empty state is $m = -\infty$, $\ell = 0$, and the merge of two empty states is empty, never NaN.
# - `online_softmax(x, block_size) -> y`: the softmax over the last dim of `x` (any leading shape, dtype
#   float16/bfloat16/float32, `y` in `x`'s dtype). **One** pass over the columns in blocks of `block_size`
#   computes the row states $(m, \ell)$ with the recurrence above; a second pass writes
#   $y = e^{x - m}/\ell$ block by block. A fully $-\infty$ row gives zeros (as in step 02).
#   The last block may be shorter than `block_size`.
#
# **What is graded** (10 points by the autograder, 2 by hand): two visible tests below, then hidden tests on
# inputs you do not see: the merge with empty states, with maxima in the thousands and chained over many
# blocks; `online_softmax` over the attention scores of `medium`, `large`, `noncausal`, `asymmetric`, rows
# of many lengths (no multiple of `block_size`), logits that overflow `exp`, rows with $-\infty$ entries
# (some whose first blocks are all $-\infty$) and fully $-\infty$ rows (these two with the course's merge in
# place of yours, so that they grade your loop and a merge mistake costs only the merge's tests), and
# float16 inputs, each with several block sizes.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from facourse import SOFTMAX_CASES, check_merge_fn, check_softmax_fn, check_visible

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_merge", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 1: the merge
#
# Implement `merge_softmax_states(m_a, l_a, m_b, l_b)`.
#
# Hints: `torch.maximum` gives $m$. Before exponentiating $m_a - m$, replace $m$ by 0 where it is
# $-\infty$ (then both exponents are $e^{-\infty} = 0$ and $\ell = 0$: the empty state). Do not compute
# $e^{m_a}$ on its own: with maxima in the thousands it is inf.

# %% nbgrader={"grade": false, "grade_id": "merge_softmax_states", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_softmax_states(m_a, l_a, m_b, l_b):
    """The state (m, l) of the union of two parts of a row whose states are (m_a, l_a) and (m_b, l_b)."""
    # YOUR CODE HERE (about 4 lines)
    ### BEGIN SOLUTION
    m = torch.maximum(m_a, m_b)                                          # m = max(m_a, m_b)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)      # two empty states: stay empty
    l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)    # l = l_a e^(m_a-m) + l_b e^(m_b-m)
    return m, l
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_merge_random", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_merge_fn(merge_softmax_states, "random")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_merge_random", merge_softmax_states)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_online", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 2: online softmax
#
# Implement `online_softmax(x, block_size)`.
#
# Hints, in the order you will need them:
# 1. Start from the empty state: `m = torch.full(x.shape[:-1], -inf)`, `l = torch.zeros(x.shape[:-1])`
#    (float32, on `x.device`).
# 2. Pass 1: `for j in range(0, n, block_size)`, take `x_j = x[..., j:j + block_size].float()` (the last one
#    may be shorter), form the block's own state $(m_j, \ell_j)$ and merge it into $(m, \ell)$ with your
#    `merge_softmax_states`. That merge **is** the $\alpha$ rescale.
# 3. Pass 2: write each block of the output, $e^{x_j - m}/\ell$, with the same guards as step 02 for
#    fully $-\infty$ rows ($m = -\infty$, $\ell = 0$).
# 4. Do not call `torch.softmax`, and do not take the max of the whole row at once: that is step 02.

# %% nbgrader={"grade": false, "grade_id": "online_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
def online_softmax(x, block_size):
    """Softmax over the last dim of x: one pass over column blocks for (m, l), one pass to normalise."""
    n = x.shape[-1]
    # YOUR CODE HERE (about 14 lines)
    ### BEGIN SOLUTION
    m = torch.full(x.shape[:-1], float("-inf"), dtype=torch.float32, device=x.device)   # empty state
    l = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    for j in range(0, n, block_size):                                  # pass 1: the running (m, l)
        x_j = x[..., j:j + block_size].float()
        m_j = x_j.amax(dim=-1)                                         # the block's own state
        m_j_safe = torch.where(torch.isneginf(m_j), torch.zeros_like(m_j), m_j)
        l_j = torch.exp(x_j - m_j_safe[..., None]).sum(dim=-1)
        m, l = merge_softmax_states(m, l, m_j, l_j)                    # l = alpha l + l_j
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)[..., None]
    inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[..., None]  # fully -inf rows give 0
    y = torch.empty_like(x)
    for j in range(0, n, block_size):                                  # pass 2: y = exp(x - m) / l
        y[..., j:j + block_size] = (torch.exp(x[..., j:j + block_size].float() - m_safe) * inv_l).to(x.dtype)
    return y
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_softmax_fn(fn, case, block_size=...)` calls `fn(x, block_size)` on the inputs of a named case and
# compares with a float64 softmax (twice PyTorch's own rounding plus a small slack; new allocations are
# filled with NaN so an unwritten block shows). `check_merge_fn(fn, case)` merges the states of two parts of
# random rows and compares with the state of the whole. Both name the wrong rows and the likely cause. The
# hidden tests use the same checks, on these cases (`other_dims` is for step 02 only):

# %% nbgrader={"grade": false, "grade_id": "cases", "locked": true, "schema_version": 3, "solution": false, "task": false}
for name, what in SOFTMAX_CASES.items():
    print(f"{name:11s} {what}")

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_softmax_fn(online_softmax, "small", block_size=32)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", online_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "visible_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The visible cases: the classic bugs of online softmax and of the merge fail one of them (a missing
# alpha rescale, a last block that is shorter, blocks that are all -inf, empty states). It stops at
# the first failure with the check's message.
check_visible(merge_softmax_states, "03_merge")
check_visible(online_softmax, "03")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded with inputs you do not see. Try the cases yourself first, e.g.
# `check_merge_fn(merge_softmax_states, "empty")` or `check_softmax_fn(online_softmax, "ragged", block_size=64)`.

# %% nbgrader={"grade": true, "grade_id": "test_merge_empty", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: merging empty states
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_merge_empty", merge_softmax_states)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_merge_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: maxima in the thousands
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_merge_large", merge_softmax_states)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_merge_chain", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: many blocks merged left to right and as a tree
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_merge_chain", merge_softmax_states)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_configs", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: the attention scores of medium, large, noncausal and asymmetric
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_configs", online_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: rows of many lengths, no multiple of block_size
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_ragged", online_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_overflow", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: logits that overflow exp() in float16 and float32 (the course's merge in place of yours)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_overflow", online_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_masked", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: rows with -inf entries, some with all -inf first blocks, and fully -inf rows (with the course's merge)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_masked", online_softmax)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_half", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: float16 inputs
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_half", online_softmax)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "question_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Written answer (2 points, graded by your instructor)
#
# (a) Show that the merge is associative: merging $a$ with $b$ and then with $c$ gives the same $(m, \ell)$ as
# merging $a$ with the merge of $b$ and $c$. (b) Your `online_softmax` reads `x` twice instead of step 02's
# three times. FlashAttention reads each row of scores only **once** and never writes it to memory: which
# part of the second pass does it fold into the first, and what does it rescale by $\alpha$ besides $\ell$?

# %% [markdown] nbgrader={"grade": true, "grade_id": "written_online_softmax", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# (a) A state $(m, \ell)$ of a set of logits $X$ stands for the number $\ell\, e^{m} = \sum_{x \in X} e^{x}$
# (kept in a form that cannot overflow) together with $m = \max X$. The merge returns $\max(m_a, m_b)$ and
# $\ell$ with $\ell e^{m} = \ell_a e^{m_a} + \ell_b e^{m_b}$. Both max and $+$ are associative, so both ways of
# merging $a, b, c$ give $m = \max(m_a, m_b, m_c)$ and $\ell e^{m} = \ell_a e^{m_a} + \ell_b e^{m_b} + \ell_c e^{m_c}$,
# hence the same $\ell$ (for $m = -\infty$ both give the empty state). Only rounding can differ.
# (b) The second pass exists to compute $y = e^{x - m}/\ell$, but attention never needs $y$ itself, only
# $O = \sum_j y_j V_j$. FlashAttention accumulates the unnormalised $\sum_j e^{x_j - m} V_j$ during the single
# pass, rescaling this accumulator by $\alpha = e^{m_{\text{old}} - m_{\text{new}}}$ whenever the max grows,
# exactly as $\ell$ is rescaled, and divides by $\ell$ once at the end.
#
# === BEGIN MARK SCHEME ===
# 2 points in all:
# - 1.0: (a) a correct argument: via the represented sum l·e^m (or by cases on which maximum is largest);
#   mentions that max and + are associative. 0.5 for checking one ordering numerically without argument.
# - 1.0: (b) the P·V product (the output accumulator O) is built in the same pass, the accumulator is
#   rescaled by alpha like l, and the division by l happens once at the end. 0.5 if O's rescale is missing.
# === END MARK SCHEME ===
# ### END SOLUTION
