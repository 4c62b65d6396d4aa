# %% [markdown]
# # Lecture 02 — Safe softmax
#
# $$\operatorname{softmax}(x)_i \;=\; \frac{e^{x_i}}{\sum_{j=1}^{N} e^{x_j}}
# \;=\; \frac{e^{x_i - m}}{\sum_{j=1}^{N} e^{x_j - m}}, \qquad m = \max_j x_j$$
#
# The two forms are equal in exact arithmetic. In fp16 the left one returns NaN for logits as
# small as 12; the right one never overflows. Every attention kernel computes the right one.
#
# **What you will learn**
# - why `exp` overflows in fp16 at $x \approx 11.1$ and in bf16/fp32 at $x \approx 88.7$, and how an
#   overflow (or a total underflow) turns a softmax row into NaN;
# - the max-subtraction identity and its one-line proof;
# - the three-pass *safe softmax* (max, sum, normalize), written plainly in PyTorch and checked;
# - why three passes over the row are what lecture 03 removes, and what a row with no visible key
#   (all $-\infty$) does to a naive safe softmax.
#
# **Paper section followed.** Milakov & Gimelshein, *Online normalizer calculation for softmax*
# (2018), §2 (Algorithm 1, "naive softmax", and Algorithm 2, "safe softmax"); FlashAttention
# (Dao et al. 2022), §3.1, which starts from the same safe softmax.
#
# Exercise 02 asks you to write `safe_softmax(x, dim=-1)`; this notebook explains the ideas with
# a simpler, row-at-a-time version.

# %%
import math
import time

import torch

_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. How big can a float get?
#
# | format | bits (sign / exponent / mantissa) | largest finite | $\ln(\text{max})$: exp overflows above | smallest positive normal |
# |---|---|---|---|---|
# | fp16 | 1 / 5 / 10 | 65 504 | 11.09 | $6.1\cdot10^{-5}$ |
# | bf16 | 1 / 8 / 7 | $3.39\cdot10^{38}$ | 88.72 | $1.2\cdot10^{-38}$ |
# | fp32 | 1 / 8 / 23 | $3.40\cdot10^{38}$ | 88.72 | $1.2\cdot10^{-38}$ |
#
# fp16 keeps three significant digits but only five exponent bits, so $e^{x}$ leaves its range at
# $x = \ln 65504 \approx 11.09$. bf16 has fp32's range with fewer digits. The table is computed below
# from `torch.finfo`, not typed in.

# %%
for dt in (torch.float16, torch.bfloat16, torch.float32):
    fi = torch.finfo(dt)
    print(f"{str(dt):15s} max={fi.max:.4g}  exp overflows for x > ln(max) = {math.log(fi.max):6.2f}"
          f"   smallest normal={fi.tiny:.3g}")

# %% [markdown]
# ## 2. Watch it break
#
# `exp(12)` is about 162 755: more than fp16 can hold.

# %%
x = torch.tensor(12.0, dtype=torch.float16)
print("exp(12) in fp16 :", torch.exp(x).item())
print("exp(12) in fp32 :", torch.exp(x.float()).item())
print("exp(89) in bf16 :", torch.exp(torch.tensor(89.0, dtype=torch.bfloat16)).item())

# %% [markdown]
# A softmax written straight from the definition, on a row of fp16 logits:

# %%
def softmax_naive(x):
    """The textbook formula: e^x / sum(e^x), in x's dtype. Do not use."""
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


big = torch.tensor([12.0, 3.0, 1.0], dtype=torch.float16)      # one large logit
small = torch.tensor([-20.0, -21.0, -22.0], dtype=torch.float16)  # all very negative
print("overflow :", softmax_naive(big))    # inf / inf = NaN
print("underflow:", softmax_naive(small))  # 0 / 0 = NaN
print("correct  :", torch.softmax(big.double(), -1), torch.softmax(small.double(), -1))

# %% [markdown]
# Both failures are total: one NaN in a row of $P$ makes the whole output row $O_i = P_i V$ NaN,
# and from there the loss. The second case is the quiet one: nothing overflows, every $e^{x_j}$
# rounds to zero, and $0/0$ is NaN.
#
# **Do attention logits get that big?** $S_{ij} = q_i \cdot k_j / \sqrt{d}$. With unit-variance
# entries the logits have standard deviation about 1, but trained models have outlier features and
# growing activations; a logit of 12 is ordinary. The course's `overflow` edge case scales q and k
# so that logits reach the hundreds. A measurement: how many rows of $P$ does the naive fp16
# softmax destroy there?

# %%
from facourse import get_config, make_inputs

cfg = get_config("overflow")
q, k, v = make_inputs(cfg, seed=0, device="cpu", dtype=torch.float32)
s = (q @ k.repeat_interleave(cfg.group, dim=1).transpose(-1, -2)) / math.sqrt(cfg.D)  # S = Q K^T / sqrt(d)
print(f"logits: max {s.max().item():.1f}, min {s.min().item():.1f}")
for factor in (1 / 64, 2 / 64, 3 / 64, 1.0):  # 1/64 undoes the config's logit_scale = 64
    logits = (s * factor).half()
    p = softmax_naive(logits)
    bad_rows = torch.isnan(p).any(dim=-1).float().mean().item()
    print(f"logits x {factor:6.4f} (max {logits.max().item():6.1f}): "
          f"{100 * bad_rows:5.1f}% of rows of P contain NaN")

# %% [markdown]
# ## 3. The identity
#
# For any constant $c$:
#
# $$\frac{e^{x_i - c}}{\sum_j e^{x_j - c}} = \frac{e^{-c}\,e^{x_i}}{e^{-c}\sum_j e^{x_j}}
#   = \frac{e^{x_i}}{\sum_j e^{x_j}}. \qquad\blacksquare$$
#
# Choose $c = m = \max_j x_j$. Then every exponent $x_j - m \le 0$, so every term is in $(0, 1]$:
# **no overflow**. And the term with $x_j = m$ is exactly $e^0 = 1$, so the denominator is
# $\ge 1$: **no $0/0$**. Underflow of the *other* terms to zero is harmless: their true
# probabilities are below $e^{-\text{(a lot)}}$ anyway.
#
# The same constant gives the log-sum-exp that the attention kernels return for the backward pass:
#
# $$\operatorname{lse}(x) = \log\sum_j e^{x_j} = m + \log\sum_j e^{x_j - m}.$$

# %% [markdown]
# ## 4. Three passes
#
# Milakov & Gimelshein's Algorithm 2, one row $x \in \mathbb{R}^N$:
#
# 1. $m = \max_j x_j$ &nbsp;&nbsp;(read $x$)
# 2. $\ell = \sum_j e^{x_j - m}$ &nbsp;&nbsp;(read $x$ again)
# 3. $y_i = e^{x_i - m} / \ell$ &nbsp;&nbsp;(read $x$ a third time, write $y$)
#
# Written one element at a time, so that each pass is visible. The arithmetic is done in
# float32 whatever the input dtype (kernels do the same: fp16 in, fp32 inside, fp16 out).

# %%
def softmax_three_pass(row):
    """Safe softmax of a 1-D tensor, one element at a time: max, sum, normalize."""
    x = row.float()
    n = x.shape[0]
    m = -math.inf
    for j in range(n):                 # pass 1: m = max_j x_j
        m = max(m, x[j].item())
    l = 0.0
    for j in range(n):                 # pass 2: l = sum_j exp(x_j - m)
        l += math.exp(x[j].item() - m)
    y = torch.empty(n)
    for i in range(n):                 # pass 3: y_i = exp(x_i - m) / l
        y[i] = math.exp(x[i].item() - m) / l
    return y.to(row.dtype)


print(softmax_three_pass(big))
print(softmax_three_pass(small))

# %% [markdown]
# The same three passes, vectorized over the last dimension. Each line is one pass over the data:

# %%
def softmax_three_pass_rows(x):
    """Safe softmax over the last dimension of x (float32 inside, x's dtype out)."""
    xf = x.float()
    m = xf.amax(dim=-1, keepdim=True)          # pass 1: m = rowmax(x)
    l = torch.exp(xf - m).sum(-1, keepdim=True)  # pass 2: l = rowsum(exp(x - m))
    return (torch.exp(xf - m) / l).to(x.dtype)   # pass 3: y = exp(x - m) / l


# %% [markdown]
# ### Check it
#
# Against float64 `torch.softmax`, on ordinary logits, on the overflow logits of section 2 in fp16,
# and element-by-element against the loop version.

# %%
def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


x32 = torch.randn(64, 1000) * 3
ref = torch.softmax(x32.double(), -1)
print("fp32 random     :", max_err(softmax_three_pass_rows(x32), ref))
s16 = s.half()
y16 = softmax_three_pass_rows(s16)
print("fp16 overflow S :", max_err(y16, torch.softmax(s16.double(), -1)), " any NaN:", torch.isnan(y16).any().item())
row = torch.randn(50) * 10
print("loop vs rows    :", max_err(softmax_three_pass(row), softmax_three_pass_rows(row)))
assert max_err(softmax_three_pass_rows(x32), ref) < 1e-6
assert not torch.isnan(y16).any() and max_err(y16, torch.softmax(s16.double(), -1)) < 1e-3

# %% [markdown]
# ## 5. A row with nothing to attend to
#
# Causal masking writes $-\infty$ into $S$ where a key is invisible. With bottom-right alignment
# and $S_q > S_{kv}$ (lecture 04), some rows are masked **entirely**. Then $m = -\infty$ and
# $x_j - m = -\infty - (-\infty) = \text{NaN}$: the safe softmax fails on exactly the rows it was
# meant to make safe. The course's contract says such a row outputs zeros (and $\text{lse} = -\infty$).
# A common fix: when $m = -\infty$, subtract $0$ instead, so every term is $e^{-\infty} = 0$, then
# treat $0/0$ as $0$.

# %%
masked = torch.tensor([[1.0, 2.0, -math.inf], [-math.inf, -math.inf, -math.inf]])
print("three-pass on a fully masked row:\n", softmax_three_pass_rows(masked))
m = masked.amax(-1, keepdim=True)
m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)    # subtract 0 when the row is empty
e = torch.exp(masked - m_safe)
l = e.sum(-1, keepdim=True)
y = torch.where(l > 0, e / l.clamp_min(1e-30), torch.zeros_like(e))
print("with the empty-row rule:\n", y)

# %% [markdown]
# ## 6. What three passes cost
#
# A softmax does a handful of FLOPs per element: on a GPU it is limited by memory traffic, not
# arithmetic (lecture 00's roofline). When the row does not fit on chip, each pass is one more trip
# through HBM. Count the bytes for the score matrix of one attention layer, $B=1$, $H=32$,
# $N = 8192$, fp16, and turn them into time at the H100's 3.35 TB/s:

# %%
B, H, N, bytes_per = 1, 32, 8192, 2
elems = B * H * N * N
hbm = 3.35e12  # H100 SXM HBM3, bytes/s (datasheet)
for name, reads, writes in (("three-pass safe softmax", 3, 1),
                            ("online softmax (lecture 03)", 2, 1),
                            ("ideal: read once, write once", 1, 1)):
    b = (reads + writes) * elems * bytes_per
    print(f"{name:30s}: {b / 2**30:5.0f} GiB moved, >= {1e3 * b / hbm:5.1f} ms at 3.35 TB/s")

# %% [markdown]
# And on a GPU, measured (this CPU's `exp` is slow enough to hide the memory traffic, so the cell
# only runs with a GPU): one read pass (`amax`), our three-pass softmax, and PyTorch's fused softmax,
# which keeps a row on chip, reads it from HBM once and writes it once. On an H100 80GB HBM3 it printed
# (8192 × 32768 fp16, three runs: `benchmarks/results/2026-11-27_h100_lectures_00_02.txt`): one read
# pass 0.21 ms; three-pass 6.11 ms = 29-30 read passes; `torch.softmax` 0.47 ms = 2.2-2.3 read
# passes. Eager PyTorch is worse than "three passes": every line of `softmax_three_pass_rows`
# launches kernels that write and read full-size fp32 temporaries (`x.float()`, `x - m`, `exp`, the
# division). Counting passes is counting HBM trips, and fusion (one kernel, data kept on chip) is
# what removes them: the theme of the whole course.

# %%
from facourse import gpu_or_skip

if gpu_or_skip("the softmax bandwidth measurement"):
    xg = torch.randn(8192, 32768, device="cuda", dtype=torch.float16)

    def cuda_ms(f, reps=20):
        f(xg)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            f(xg)
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / reps

    t1 = cuda_ms(lambda t: t.amax(-1))
    for name, f in (("one read pass", lambda t: t.amax(-1)), ("three-pass", softmax_three_pass_rows),
                    ("torch.softmax", lambda t: torch.softmax(t, -1))):
        t = cuda_ms(f)
        print(f"{name:14s}: {t:6.2f} ms = {t / t1:4.1f} read passes")

# %% [markdown]
# ## Summary
#
# - $e^x$ overflows fp16 at $x \approx 11.1$, bf16 and fp32 at $88.7$; an all-underflowing row is
#   $0/0$. Either way a row of $P$ becomes NaN.
# - $\operatorname{softmax}(x) = \operatorname{softmax}(x - c)$ for any $c$; with $c = \max x$ every
#   term is $\le 1$ and the denominator is $\ge 1$.
# - Safe softmax reads the row three times (max, sum, normalize). Attention over a long row cannot
#   afford to: the row of $S$ is $N$ long and is never stored.
# - Fully masked rows need their own rule (output 0, lse $= -\infty$).
#
# **Next:** lecture 03 computes $m$ and $\ell$ in *one* pass, and makes the state mergeable.
