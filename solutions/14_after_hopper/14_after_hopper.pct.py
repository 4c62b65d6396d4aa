# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 14 — FlashAttention-4's softmax: a software exp2 and the conditional rescale
#
# On Blackwell the tensor cores got about twice as fast per SM as Hopper's, and the unit that computes
# exponentials (MUFU, 16 results a clock per SM) did not. A $128 \times 128$ tile of $S$ costs
# $4 \cdot 128 \cdot 128 \cdot D$ FLOPs of matrix products and $128 \cdot 128$ exponentials, so the
# softmax, which the tensor cores used to hide, becomes the slowest part (lecture 14 counts the clocks).
# FlashAttention-4 changes the softmax in two ways, and this exercise writes both, in PyTorch, on a CPU:
#
# **1. Part of the exponentials on the FMA pipes.** With $x = n + f$, $n = \lfloor x \rfloor$ and
# $f \in [0, 1)$,
#
# $$2^x = 2^n \cdot 2^f,\qquad 2^f \approx p(f) = 1 + c_1 f + c_2 f^2 + c_3 f^3 \in [1, 2),$$
#
# and multiplying a float32 by $2^n$ is an integer addition of $n$ to its 8-bit exponent field, which starts
# at bit 23: $\text{bits}(2^x) = \text{bits}(p(f)) + (n \ll 23)$. Horner's rule evaluates $p$ in three FMAs.
# The result feeds $P$, which the tensor cores take in bf16 or fp16 (unit roundoff $2^{-8}$ and $2^{-11}$), so
# a cubic suffices where it is fitted well: the bound here is $2^{-12}$.
#
# **2. The rescale only when it matters.** The online softmax (steps 03-05) moves a row's running maximum $m$
# whenever a key tile raises it, and rescales $\ell$ and the accumulator by $\alpha = 2^{m_{\text{old}} -
# m_{\text{new}}}$: a multiply of the whole $128 \times D$ accumulator, which on Blackwell lives in tensor
# memory and has to be read out and written back. But the result $O = \text{acc}/\ell$ is the same for **any**
# $m$ that $\ell$ and acc share; $m$ only has to keep $\tilde P = 2^{s - m}$ from overflowing. So FA4 keeps
# the old $m$ until a tile's row maximum passes it by more than a threshold $\tau$ (base-2 units; 8 in its
# forward), and $\tilde P$ may reach $2^\tau$ instead of 1, which fp32's $\ell$ and acc hold easily:
#
# $$m_{\text{new}} = \begin{cases} \max_j s_j & \text{if } \max_j s_j > m + \tau \\ m & \text{otherwise}\end{cases},\qquad
# \ell_{\text{new}} = \alpha\,\ell + \sum_j 2^{s_j - m_{\text{new}}},\qquad
# \text{acc}_{\text{new}} = \alpha\,\text{acc} + \tilde P V .$$
#
# **What you will learn**: range reduction and the exponent-bits trick; what a polynomial's accuracy has to be
# and how to fit one; why a stale maximum is still exact, and what $\tau$ bounds.
#
# **Sources**: FlashAttention-4, the FlashAttention authors' CuTe-DSL kernels for Blackwell
# (`flash_attn/cute/` in the flash-attention repository: the softmax's emulated exp2 and its rescale
# threshold); Milakov & Gimelshein (2018) for the online softmax; lecture 14 for Blackwell and the measurements
# of both ideas on Hopper.
#
# **The contract**:
# - `exp2_poly(x) -> y`: `x` a float32 tensor of any shape (on any device), `y` float32 of `x`'s shape with
#   relative error at most $2^{-12}$ wherever $2^x$ is a normal float32 ($x \ge -126$), a value in
#   $[0, 2^{-126}]$ below that (0 is fine: the GPU's `ex2.approx.ftz` flushes too), and exactly 0 for
#   $x = -\infty$ (a masked score). Only arithmetic, `floor`/`round`/`clamp`, integer and bit operations:
#   **no** `torch.exp`, `exp2`, `pow` with a tensor exponent, `ldexp`, `sigmoid` or the like, no values taken
#   out of PyTorch (NumPy, `math`, Python's `**` on `x.tolist()`) and no table of powers made beforehand (the
#   grader refuses all of these while it runs; a few coefficients in a tensor are fine).
# - `lazy_rescale_update(m, l, acc, s, v, threshold) -> (m, l, acc)`: one key tile of the update above.
#   `m`, `l`: float32 `[R]` (a row's running maximum and sum; the empty state is $m = -\infty$, $\ell = 0$);
#   `acc`: float32 `[R, D]`; `s`: float32 `[R, N]`, the tile's scores **in base 2** ($\log_2 e$ and the scale
#   already folded in; $-\infty$ where a key is masked); `v`: float32 `[N, D]`; `threshold`: $\tau \ge 0$. It
#   returns new tensors and leaves its inputs untouched. A row that has seen no finite score stays empty
#   ($m = -\infty$, $\ell = 0$, acc $= 0$), never NaN. $P$ is computed with `torch.exp2` here (or with your
#   `exp2_poly`: the tolerance, $2^{-11}$ of $\ell$ and of the accumulator's terms, leaves room for it).
#
# **What is graded** (7 points by the autograder, 2 by hand): two visible tests below, then hidden tests on
# inputs you do not see: `exp2_poly` on softmax inputs, on every fraction $f$ for $n$ from $-24$ to 8, and on
# the edges ($-\infty$, $x < -126$, whole numbers, values just below them); `lazy_rescale_update` driven over
# the key tiles of rows from the empty state, on attention scores, on maxima that grow by less than, exactly
# and more than the threshold (thresholds 8 and 2), with threshold 0, and on rows with masked tiles and no
# finite score. Each update is judged from the state before it: $m$ exactly, $\ell$ and acc to the
# tolerance; and at the end $O = \text{acc}/\ell$ against float64 attention.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from facourse import EXP2_CASES, RESCALE_CASES, check_exp2_fn, check_rescale_fn, check_visible

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_exp2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 1: `exp2_poly`
#
# Hints, in the order you will need them:
# 1. The coefficients first, once (`exp2_coefficients`, called by the cell after it): fit $c_1, c_2, c_3$ of
#    $1 + c_1 f + c_2 f^2 + c_3 f^3$ to $2^f$ on a fine grid of $f \in [0, 1]$ by least squares **on the relative
#    error** (divide each row of the system by $2^f$; `torch.linalg.lstsq` in float64; `torch.exp2` is allowed
#    there, outside `exp2_poly`). Keeping $c_0 = 1$ makes whole numbers exact. Taylor's coefficients at 0, the
#    cell's fallback, are not accurate enough at $f \to 1$: the cell prints the cubic's largest relative error.
# 2. Clamp $x$ from below (to $-127$ when $p(0) = 1$) so that $-\infty$ and $x < -126$ give 0 instead of a wrapped
#    exponent; then $n$ = `torch.floor(x)` (not `trunc`: $x$ is mostly negative) and $f = x - n$.
# 3. Horner: `p = ((c3 * f + c2) * f + c1) * f + 1.0`.
# 4. `p.view(torch.int32)` is its bits; add `n.to(torch.int32) << 23` and `.view(torch.float32)` back.

# %% nbgrader={"grade": false, "grade_id": "exp2_coefficients", "locked": false, "schema_version": 3, "solution": true, "task": false}
def exp2_coefficients():
    """(c1, c2, c3) of the cubic 1 + c1 f + c2 f^2 + c3 f^3 for 2^f on [0, 1], fitted to its relative error."""
    # torch.exp2 is fine here, outside exp2_poly
    # YOUR CODE HERE (about 4 lines)
    ### BEGIN SOLUTION
    f = torch.linspace(0, 1, 4097, dtype=torch.float64)
    A = torch.stack([f, f ** 2, f ** 3], 1) / torch.exp2(f)[:, None]        # rows weighted by 1 / 2^f
    c = torch.linalg.lstsq(A, (1 - 1 / torch.exp2(f))[:, None]).solution[:, 0]
    return tuple(float(t) for t in c)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "exp2_fit", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your coefficients, fitted once (until exp2_coefficients is written: Taylor's at 0, which are not accurate enough)
import math

try:
    C1, C2, C3 = exp2_coefficients()
except NotImplementedError:
    C1, C2, C3 = math.log(2), math.log(2) ** 2 / 2, math.log(2) ** 3 / 6
_f = torch.linspace(0, 1, 4097, dtype=torch.float64)
print(f"c = (1, {C1:.8f}, {C2:.8f}, {C3:.8f}): largest relative error of the cubic on [0, 1] "
      f"{float(((1 + _f * (C1 + _f * (C2 + _f * C3))) / torch.exp2(_f) - 1).abs().max()):.3g} (allowed 2^-12 = 2.44e-04)")


# %% nbgrader={"grade": false, "grade_id": "exp2_poly", "locked": false, "schema_version": 3, "solution": true, "task": false}
def exp2_poly(x):
    """2^x of a float32 tensor from a cubic for 2^f and the exponent bits: no exponential function."""
    # C1, C2, C3: from the cell above
    # YOUR CODE HERE (about 5 lines)
    ### BEGIN SOLUTION
    x = x.clamp(min=-127.0)                              # -inf and underflow: n + 127 = 0 gives bits 0
    n = torch.floor(x)                                   # x = n + f, f in [0, 1)
    f = x - n
    p = ((C3 * f + C2) * f + C1) * f + 1.0               # 2^f in [1, 2), three FMAs
    return (p.view(torch.int32) + (n.to(torch.int32) << 23)).view(torch.float32)   # times 2^n
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_exp2_softmax", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_exp2_fn(exp2_poly, "softmax")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_exp2_softmax", exp2_poly)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_rescale", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 2: `lazy_rescale_update`
#
# Hints:
# 1. The tile's row maximum `s.amax(-1)`; the new $m$ is it where it passes $m + \tau$ (strictly), else the
#    old $m$. (With $m = -\infty$ any finite maximum passes.)
# 2. Exponentiate only differences from the new $m$, with 0 in its place where it is still $-\infty$ (as in
#    step 03): $\tilde P = 2^{s - m_{\text{new}}}$ and $\alpha = 2^{m - m_{\text{new}}}$ (1 where $m$ stayed, 0 for
#    a row's first finite tile).
# 3. $\ell_{\text{new}} = \alpha \ell + \sum_j \tilde P_j$, $\text{acc}_{\text{new}} = \alpha\,\text{acc} + \tilde P V$.
#    Return new tensors.

# %% nbgrader={"grade": false, "grade_id": "lazy_rescale_update", "locked": false, "schema_version": 3, "solution": true, "task": false}
def lazy_rescale_update(m, l, acc, s, v, threshold=8.0):
    """One key tile of the online softmax with FlashAttention-4's conditional rescale (scores in base 2)."""
    # YOUR CODE HERE (about 7 lines)
    ### BEGIN SOLUTION
    rowmax = s.amax(-1)
    m_new = torch.where(rowmax > m + threshold, rowmax, m)                    # move m only past m + tau
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # rows with no score yet
    p = torch.exp2(s - base[:, None])                                          # P~ <= 2^tau
    alpha = torch.exp2(m - base)                                               # 1 where m stayed
    return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_exp2_fn(fn, case)` calls `fn(x)` on the inputs of a named case and compares with float64 $2^x$;
# `check_rescale_fn(fn, case)` drives `fn` over a row's key tiles from the empty state and judges every step
# from the state before it. Both name the elements, rows or tiles that are wrong and the likely cause. The
# hidden tests use the same checks, on these cases:

# %% nbgrader={"grade": false, "grade_id": "cases", "locked": true, "schema_version": 3, "solution": false, "task": false}
for name, what in {**EXP2_CASES, **RESCALE_CASES}.items():
    print(f"{name:8s} {what}")

# %% nbgrader={"grade": true, "grade_id": "test_rescale_random", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_rescale_fn(lazy_rescale_update, "random")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_rescale_random", lazy_rescale_update)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "visible_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The visible cases: the classic bugs of both functions fail one of them (trunc for floor, a Taylor cubic,
# -inf and underflow; a threshold ignored or not strict, a row with no score yet). It stops at the first failure.
check_visible(exp2_poly, "14_exp2")
check_visible(lazy_rescale_update, "14_rescale")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded with inputs you do not see. Try the cases yourself first, e.g.
# `check_exp2_fn(exp2_poly, "edges")` or `check_rescale_fn(lazy_rescale_update, "growing")`.

# %% nbgrader={"grade": true, "grade_id": "test_exp2_grid", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: every fraction f in [0, 1) at 2^-12 steps, for n from -24 to 8
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_exp2_grid", exp2_poly)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_exp2_edges", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: -inf, x below -126, whole numbers from -126 to 127, values just below them and up to 128
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_exp2_edges", exp2_poly)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_rescale_growing", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: maxima that grow by less than, exactly and more than the threshold, and fall; thresholds 8 and 2
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_rescale_growing", lazy_rescale_update)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_rescale_eager", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: threshold 0, the online softmax of steps 03-05
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_rescale_eager", lazy_rescale_update)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_rescale_masked", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: rows whose first tiles are all -inf, rows with no finite score, -inf holes
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_rescale_masked", lazy_rescale_update)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "question_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Written answer (2 points, graded by your instructor)
#
# (a) With $\tau = 8$ and the scores of a long row in fp32, how large can $\tilde P$, $\ell$ and the accumulator
# become before the final division, for a row of $N$ keys and $|V| \le 1$? Why does the same lazy rescale
# need a much smaller $\tau$ when $\tilde P$ is cast to e4m3 for an FP8 $\tilde P V$ (largest e4m3 value: 448)?
# (b) Your exp2 costs several instructions on the FMA and integer pipes (about ten a value in step 10's FP8
# kernel, lecture 10) where MUFU's costs one, on a unit that gives 16 results a clock per SM. Why does FlashAttention-4 move only a share of each tile's
# exponentials to the FMA pipes, and not all of them?

# %% [markdown] nbgrader={"grade": true, "grade_id": "written_after_hopper", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# (a) The stale $m$ is at most $\tau$ below the row's true running maximum, so every $\tilde P \le 2^8 = 256$,
# $\ell \le 256 N$ and $|\text{acc}| \le 256 N$: for $N = 10^6$ about $2.6 \cdot 10^8$, far below fp32's
# $3.4 \cdot 10^{38}$; rounding is relative, so nothing is lost. In FP8, $\tilde P$ itself is quantised: times
# its cast scale (e.g. $2^8$ to use e4m3's range) it must stay under 448, so $2^{\tau} \cdot 2^8 \le 448$
# forces $\tau < 1$ (step 10's v7 used 0.75), or the scale must shrink and small $\tilde P$ fall into e4m3's
# subnormals.
# (b) MUFU and the FMA pipes run in parallel: the exponentials are split so that both finish together.
# All on the FMA pipes would cost several times the issue slots of the exponentials (the polynomial and the
# integer work),
# and those pipes already run the softmax's other work (scale, max, subtract, sum, conversions), so they
# would become the bottleneck; a share balances MUFU's time against the FMA pipes' time.
#
# === BEGIN MARK SCHEME ===
# 2 points in all:
# - 1.0: (a) the bound 2^tau on P~ (and so on l and acc, times N) and that fp32 holds it; that e4m3's largest
#   value (with P's cast scale) caps tau in FP8. 0.5 for either half.
# - 1.0: (b) the two units work in parallel, the split balances them; all-software would make the FMA/issue
#   side the bottleneck. 0.5 for "software exp2 costs more instructions" without the balance argument.
# === END MARK SCHEME ===
# ### END SOLUTION
