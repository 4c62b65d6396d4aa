# %% [markdown]
# # 14 — After Hopper: Blackwell, and FlashAttention-4's softmax
#
# The attention forward has not changed since lecture 05. In base 2, with $\log_2 e$ folded into the
# scale, one row $i$ against the key tiles $j = 1, \ldots, T$:
#
# $$s_{ij} = \text{scale} \cdot \log_2 e \cdot q_i \cdot k_j, \qquad
#   m_i \leftarrow \max\big(m_i, \max_{j \in \text{tile}} s_{ij}\big), \qquad
#   \tilde p_{ij} = 2^{\,s_{ij} - m_i}, \qquad
#   o_i = \frac{\sum_j \tilde p_{ij}\, v_j}{\sum_j \tilde p_{ij}} .$$
#
# What changes is the machine. On Blackwell (B200, compute capability 10.0) the tensor cores do about twice
# the work per SM and clock that Hopper's do, and the unit that computes $2^x$ does not. The two products
# of a tile ($S = QK^\top$, $O \mathrel{+}= \tilde P V$) then take about as long as the tile's exponentials,
# and the softmax, which the tensor cores used to hide (lecture 07's ping-pong), sets the pace.
# FlashAttention-4 (FA4) answers with a new kernel layout for Blackwell and two changes to the softmax's
# arithmetic: it computes part of the $2^x$ with a polynomial on the FMA pipes, and it moves $m_i$ only when
# the maximum has grown by more than a threshold. This lecture does the first part on paper (no GPU the
# course can reach runs Blackwell code) and the second on this CPU, then reads what the two ideas did to
# the course's own Hopper kernels.
#
# **What you will learn**
# - why the exponential becomes the bottleneck: the cycles of one tile on the tensor cores and on the
#   special-function unit (MUFU), for an H100 in fp16 and in fp8 and for an SM with twice Hopper's tensor
#   rate; and the instruction budget per score that this leaves the softmax;
# - Blackwell on paper: `tcgen05.mma` issued by one thread, accumulators in **Tensor Memory** (TMEM),
#   the **2-CTA** MMA across a pair of SMs, and how FA4 lays out a CTA around them;
# - FA4's **software exp2**: range reduction, a polynomial for $2^f$ on $[0, 1)$, $2^n$ added into the
#   exponent bits; how accurate polynomials of degree 2, 3 and 4 are, measured against bf16's and fp16's
#   rounding;
# - FA4's **conditional rescaling**: why a stale maximum is exact, what the threshold $\tau$ costs in range,
#   and how often a tile needs a rescale with $\tau = 0$ and with $\tau = 8$, counted on random rows;
# - what both ideas did on Hopper, in the course's committed measurements, and why: they lose there; and
#   what to measure first on a Blackwell GPU.
#
# **Sources followed.** FlashAttention-4: the FA authors' CuTe-DSL kernels in the Dao-AILab/flash-attention
# repository, `flash_attn/cute/` (read at commit 0251105a): `flash_fwd_sm100.py` (the Blackwell forward:
# its warps, its Tensor Memory columns, its 2-CTA variant, its rescale threshold), `softmax.py` (the
# conditional rescale), `utils.py` (the emulated exp2); and the authors' announcement, *FlashAttention-4:
# Algorithm and Kernel Pipelining Co-Design for Asymmetric Hardware Scaling* (Together AI blog, 2026).
# NVIDIA's PTX ISA, the `tcgen05` sections (Tensor Memory, `tcgen05.alloc`, `tcgen05.ld`/`st`,
# `tcgen05.mma`), and CUTLASS's *tcgen05 MMA Programming Guide*. The CUDA C++ Programming Guide's
# "Arithmetic Instructions" throughput table (16 exp2 and 128 fp32 FMAs per clock per SM on compute
# capability 9.0). Shah et al., *FlashAttention-3* (2024), §3.2: "3.9 TFLOPS of special functions" on an
# H100 SXM5 against 989 TFLOPS of FP16 matmul. NVIDIA's H100 datasheet and Hopper whitepaper. Lecture 07
# (ping-pong, the per-score arithmetic) and lecture 10 (FP8, where both ideas were measured first).
#
# Exercise 14 asks for `exp2_poly(x)`, the whole software $2^x$ (range reduction, polynomial, exponent bits,
# $-\infty$ and $x < -126$), and `lazy_rescale_update(m, l, acc, s, v, threshold)`, one tile of the online
# softmax with FA4's threshold. This lecture fits and measures the polynomial on $[0, 1)$ and counts
# rescales; the two functions are the exercise's.

# %%
import math
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

ROOT = Path.cwd().parent if Path.cwd().name == "course" else Path.cwd()
sys.path.insert(0, str(ROOT / "diagrams"))
import after_hopper_figures as ah  # noqa: E402  (the rates and the tile model the figure is drawn from)
# (it selects matplotlib's file backend for drawing; the magic below restores inline plots)

# %matplotlib inline

# %% [markdown]
# ## 1. Why the exponential becomes the bottleneck
#
# Take one tile of $S$: $M$ query rows against $N$ keys at head dimension $D$. Its two products cost
# $2MND$ FLOPs each, and its softmax takes $MN$ exponentials. On one SM whose tensor cores do $R$ FLOPs a
# clock and whose MUFU gives $E$ results a clock,
#
# $$t_{\text{mma}} = \frac{4MND}{R}, \qquad t_{\text{exp}} = \frac{MN}{E}, \qquad
#   \frac{t_{\text{exp}}}{t_{\text{mma}}} = \frac{R}{4DE} = \frac{R}{64\,D} \quad (E = 16).$$
#
# The tile's size cancels: only the head dimension and the ratio of the two units matter. Lecture 07 did
# this per score for an H100 in fp16 (the exponential alone is half the products' time at $D = 128$). The
# table below derives $R$ per SM and clock from each data sheet's dense rate, and models Blackwell as
# Hopper's SM with $R$ doubled and the same MUFU. That is a model, said as one: NVIDIA publishes no per-SM,
# per-clock tensor rate for the B200 and no clock to divide its aggregate by. What supports it: the FA4
# authors write that BF16 tensor throughput goes from 1 to 2.25 PFLOP/s from H100 to B200 while the
# number of special-function units stays the same, and CUTLASS's tcgen05 guide gives `tcgen05` two to
# four times the throughput of Hopper's WGMMA, depending on the data type. The sources of each rate are in
# `diagrams/after_hopper_figures.py`. The MUFU rate we also measured: on an H200 a loop of independent
# `ex2.approx.ftz.f32` gave 16.00 results a clock per SM, timed by each block's `clock64`, and a loop of fp32 FMAs
# 123-124 of the guide's 128, its loop counter taking the rest
# (`benchmarks/results/2026-12-04_h200_step14_unit_rates.txt`, `benchmarks/probes/unit_rates.cu`).

# %%
print(f"H100 SXM5: {ah.H100_SMS} SMs at {ah.H100_CLOCK_GHZ} GHz")
print(f"  dense fp16 {ah.H100_TFLOPS_FP16:.0f} TFLOP/s -> {ah.per_sm_per_clock(ah.H100_TFLOPS_FP16):.0f} FLOP/clock/SM;"
      f" dense fp8 {ah.H100_TFLOPS_FP8:.0f} TFLOP/s -> {ah.per_sm_per_clock(ah.H100_TFLOPS_FP8):.0f}")
sfu = ah.EXP2_PER_CLK_PER_SM * ah.H100_SMS * ah.H100_CLOCK_GHZ * 1e9
print(f"  MUFU: {ah.EXP2_PER_CLK_PER_SM} exp2/clock/SM = {sfu / 1e12:.2f} T exp2/s "
      "(FA3's paper, section 3.2: 3.9 TFLOPS of special functions)")
assert abs(sfu / 1e12 - 3.9) < 0.05

M = N = ah.TILE_M
D = ah.HEAD_DIM
print(f"\none {M} x {N} tile at D = {D}: {4 * M * N * D / 1e6:.2f} MFLOP of products, {M * N} exponentials")
print(f"{'':34s}{'R FLOP/clk/SM':>14s}{'t_mma':>8s}{'t_exp':>8s}{'t_exp/t_mma':>12s}{'issue slots/score':>19s}")
for name, r in ah.RATES.items():
    t_mma, t_exp = ah.tile_cycles(r["tensor"], r["exp2"])
    assert t_exp / t_mma == r["tensor"] / (64 * D)           # the closed form above
    slots = 4 * 32 * t_mma / (M * N)                          # 4 schedulers x 32 lanes, per score
    print(f"{name.replace(chr(10), ' '):34s}{r['tensor']:14d}{t_mma:8.0f}{t_exp:8.0f}{t_exp / t_mma:12.2f}{slots:19.0f}")

# %% [markdown]
# ![One 128 x 128 tile: tensor-core cycles against MUFU cycles for H100 fp16, H100 fp8 and an SM with twice the tensor rate; the ratio against the head dimension](../diagrams/exp_cycle_budget.png)
#
# On an H100 in fp16 the exponentials take half the products' time: FA3's ping-pong hides them under the
# other warpgroup's GEMMs (lecture 07). In fp8, or with the tensor rate doubled, they take as long as the
# products, and at $D = 64$ twice as long: no schedule hides a unit that is busy for the whole tile. Two
# levers remain, and FA4 pulls both: compute some exponentials somewhere else, and do less of the softmax's
# other work.
#
# The last column is the other half of the budget. A scheduler (four per SM) issues one warp instruction a
# clock, 32 lanes wide, so while the tensor cores spend $t_{\text{mma}}$ on a tile, an SM can issue
# $128\, t_{\text{mma}}$ thread instructions, $512 D / R$ per score: 16 on an H100 in fp16, 8 in fp8 or
# with the doubled rate. Every instruction of the softmax (the max, the scale and subtract, the exponential,
# the row sum, the conversion to 16 bits, the loads and stores of $S$ and $P$, the rescale of the
# accumulator) comes out of that budget. The course's FP8 rung on Hopper already spends more: its key loop
# issues 565 instructions a warp for a tile in which each thread holds 64 scores, about 8.8 per score
# (`2026-12-03_cpu_step10_fp8_loop_sass.txt`, read from the SASS on a CPU). A software $2^x$ costs several
# instructions where `MUFU.EX2` costs one, so it can only pay where issue slots are left over and MUFU is the
# unit that is full. Section 5 reads which of the two holds on Hopper.
#
# ## 2. Blackwell on paper
#
# None of the course's machines is a Blackwell GPU (they are H100s and H200s, compute capability 9.0), so
# what follows is read, not run: from the PTX ISA's `tcgen05` sections, CUTLASS's tcgen05 guide, and FA4's
# `flash_fwd_sm100.py`. The course's Hopper kernel (step 07) does not run there either: `wgmma` exists only
# on `sm_90a`, and code built for an `a` target (architecture-specific features) runs on that architecture
# alone. The Triton rungs of steps 05 and 08-10 are compiled by Triton for whatever GPU runs them.
#
# **`tcgen05.mma`, issued by one thread.** Hopper's `wgmma.mma_async` is issued by a warpgroup, 128
# threads, and its accumulator lives in their registers. Blackwell's fifth-generation tensor-core MMA is
# issued by a single thread; it reads $A$ from shared memory (or from Tensor Memory) and $B$ from shared
# memory, accumulates into $D$ in **Tensor Memory**, and runs asynchronously: `tcgen05.commit` makes an
# mbarrier track its completion, as TMA's loads are tracked (lecture 07). No register holds an
# accumulator, so the warps that compute the softmax keep their registers for the softmax.
#
# **Tensor Memory.** Each SM has 128 lanes by 512 columns of 32-bit cells, 256 KiB, as large as a Hopper
# SM's register file. A CTA allocates columns with `tcgen05.alloc` (a power of two from 32 to 512 columns,
# every lane of each column), frees them with `tcgen05.dealloc`, and gives up its right to allocate more with
# `tcgen05.relinquish_alloc_permit`. Threads reach it only through `tcgen05.ld` and `tcgen05.st` (and
# `tcgen05.cp` from shared memory), a warp at a time, and warp $w$ of a warpgroup only its quarter of the
# lanes, $32 (w \bmod 4)$ to $32 (w \bmod 4) + 31$. In the `32x32b` shape, lane $t$ of the warp receives row
# $t$ of that quarter: **one thread holds one row of $S$**, and a row's max and sum need no shuffle between
# threads.
#
# **The 2-CTA MMA.** With `.cta_group::2`, the two CTAs of a pair (in one cluster, on two SMs) execute one
# MMA together: $M = 256$, each CTA providing its own 128 rows of $A$ and holding its 128 rows of $D$ in its
# Tensor Memory, and each providing half of $B$'s columns, which the MMA reads from both SMs. For
# $S = QK^\top$ each SM then stores half of each $K$ tile, for $O \mathrel{+}= \tilde PV$ half of each $V$
# tile. What that buys, in one line of arithmetic: the shared memory of an SM delivers 128 bytes a clock
# (the figure lecture 00 uses; the FA4 authors write that it did not grow from H100 to B200), and at twice
# Hopper's tensor rate $S = QK^\top$ for a $128 \times 128$ tile at $D = 128$ in bf16 takes 512 clocks, while
# its operands, $Q$ and $K$ from shared memory, are 64 KiB: 512 clocks of shared-memory reads too, if each
# operand byte passes through that port once. The cell counts both products of a tile ($\tilde P$ comes from
# Tensor Memory), with one CTA and with a pair (a model: NVIDIA does not document how the tensor cores read
# shared memory).

# %%
SMEM_BYTES_PER_CLK = 128
R2 = ah.RATES[ah.DOUBLED_BF16]["tensor"]             # twice Hopper's bf16 rate (the model of section 1)
tile = 128 * 128 * 2                                    # a 128 x 128 bf16 operand tile, bytes
for group, b_share in (("cta_group::1", 1.0), ("cta_group::2", 0.5)):
    qk = tile + b_share * tile                          # S = Q K^T: Q (A) from smem, K (B) from smem
    pv = b_share * tile                                 # O += P V: P (A) from Tensor Memory, V (B) from smem
    mma = 2 * (2 * 128 * 128 * 128) / R2                # both products, clocks at the doubled rate
    print(f"{group}: per SM and tile {(qk + pv) / 1024:.0f} KiB of operands from shared memory = "
          f"{(qk + pv) / SMEM_BYTES_PER_CLK:.0f} clocks, against {mma:.0f} clocks of tensor cores")

# %% [markdown]
# **FA4's forward CTA.** `flash_fwd_sm100.py` gives each CTA 512 threads, sixteen warps with one job each,
# and two query tiles of 128 rows (`q_stage = 2`) that share every $K_j$ and $V_j$ tile of 128 keys:
#
# - warps 0-3 and 4-7, **two softmax warpgroups**, one per query tile: load their $S$ from Tensor Memory,
#   take each row's max, compute $\tilde P = 2^{s - m}$ (part of it in software, section 3), and write
#   $\tilde P$ back into Tensor Memory, in 16 bits, over half of $S$'s columns;
# - warps 8-11, a **correction warpgroup**: rescales each tile's accumulator $O$ in Tensor Memory when its
#   rows' maxima moved (section 4), and at the end divides by $\ell$ and hands $O$ to the epilogue;
# - warp 12, the **MMA warp**: one elected thread issues every `tcgen05.mma`: $S_0 = Q_0K_j^\top$,
#   $S_1 = Q_1K_j^\top$, $O_0 \mathrel{+}= \tilde P_0 V_j$ with $\tilde P_0$ read from Tensor Memory, and so on;
# - warp 13 the **epilogue** (TMA store of $O$), warp 14 the **load warp** (TMA: $Q_0$, $Q_1$ once, then the
#   ring of $K_j$, $V_j$ stages), warp 15 idle.
#
# Tensor Memory holds the whole working set: $S_0$ in columns 0-127, $S_1$ in 128-255, $O_0$ in 256-383,
# $O_1$ in 384-511, all 512 columns. The two softmax warpgroups take turns as lecture 07's two consumers
# did: while one computes its exponentials, the tensor cores run the other tile's products. Registers are
# shared out as on Hopper, with `setmaxnreg`: most to the softmax warps. FA4 uses the 2-CTA MMA for
# non-causal forwards without a window, split-KV, variable lengths or block sparsity (`interface.py` at the
# commit read): each CTA then keeps its two 128-row query tiles and half of each $K$ and $V$ stage.
#
# ![FA4's forward CTA on Blackwell: sixteen warps and their jobs, Tensor Memory's 512 columns (S0/P0, S1/P1, O0, O1), and the 2-CTA MMA over a pair of SMs](../diagrams/fa4_cta.png)
#
# Compare with the course's Hopper kernel (lecture 07): there each consumer warpgroup holds a 64-row
# $S$ and $O$ in registers, issues its own WGMMAs, and rescales $O$ itself, in the same instruction stream
# as its exponentials. On Blackwell each of those jobs has its own warps, and the accumulator never
# enters the softmax warps' registers.
#
# ## 3. The software exp2
#
# **Range reduction.** Write $x = n + f$ with $n = \lfloor x \rfloor$ and $f = x - n \in [0, 1)$. Then
#
# $$2^x = 2^n \cdot 2^f, \qquad 2^f \in [1, 2).$$
#
# **A polynomial for $2^f$.** On $[0, 1)$ one polynomial $p(f) = c_0 + c_1 f + \cdots + c_d f^d$ approximates
# $2^f$, evaluated by Horner's rule, $p(f) = c_0 + f\,(c_1 + f\,(c_2 + f\,c_3))$ for $d = 3$: $d$ FMAs.
#
# **$2^n$ in the exponent bits.** A normal float32 is $1.b_1 b_2 \ldots b_{23} \times 2^{e - 127}$, with the
# 8-bit biased exponent $e$ in bits 23-30. Since $p(f) \in [1, 2)$ has $e = 127$, multiplying it by $2^n$
# only changes $e$ to $127 + n$, which is **adding the integer $n \cdot 2^{23}$ to the float's 32 bits read
# as an integer**. No multiply, no table. It holds while $1 \le 127 + n \le 254$. Below $n = -126$ the true
# result is subnormal or zero, while the sum's exponent field reaches 0 (where the bits mean a subnormal, not
# $p(f) \cdot 2^n$) and then borrows from the sign bit: the input must be clamped, or the result flushed to 0
# (the GPU's `ex2.approx.ftz` flushes). In attention $x = s - m \le 0$ (at most $\tau$
# with section 4's threshold), and a masked score is $x = -\infty$, which must give exactly 0.
#
# FA4's `utils.py` does the floor itself with floating-point arithmetic: adding $1.5 \cdot 2^{23}$ to $x$ in
# round-down mode leaves $\lfloor x \rfloor$ in the low bits of the sum's mantissa, subtracting the constant
# again gives $n$ as a float (for $f = x - n$), and the integer is already where a shift puts it into the
# exponent. It clamps $x$ at $-127$ first, uses a cubic with $c_0 = 1$ (its table holds degrees 0 to 5), and
# evaluates two scores per instruction with packed fp32 FMAs (PTX's `fma.rn.f32x2`): about six
# instructions per exponential, against MUFU's one. The course's Triton version on Hopper costs about eleven (`2026-12-03_cpu_step10_fp8_loop_sass.txt`).
#
# **How good must $p$ be?** $\tilde P$ goes to the tensor cores in bf16 or fp16, whose unit roundoff is
# $u = 2^{-8}$ and $2^{-11}$ (8 and 11 significant bits): a relative error well below $u$ disappears in that
# rounding. The cell fits polynomials of degree 2, 3 and 4 to $2^f$ on a dense grid of $[0, 1)$, four ways:
# Taylor's series about 0; least squares on the **relative** error; the same with $p(0) = 1$ and $p(1) = 2$
# pinned (whole numbers exact, and no jump where $f$ wraps from $1^-$ to 0, so $2^x$ stays monotone across
# integers); and the minimax fit (Lawson's reweighting of least squares, which drives the largest error
# down). It prints the largest relative error of each, as it is and in bits, evaluated in float64 and, by
# Horner in float32, as the GPU would.

# %%
GRID = 1 << 14
f = (torch.arange(GRID, dtype=torch.float64) + 0.5) / GRID           # midpoints of a dense grid of [0, 1)
two_f = torch.exp2(f)
U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}                            # unit roundoff of P's two formats


def horner(c, x):
    """p(x) = c[0] + x (c[1] + x (c[2] + ...)), in x's dtype: one FMA per degree."""
    out = torch.full_like(x, float(c[-1]))
    for a in reversed(c[:-1]):
        out = out * x + float(a)
    return out


def rel_err(c, x=f, dtype=torch.float64):
    return (horner(c, x.to(dtype)).double() / torch.exp2(x) - 1).abs()


def fit_taylor(d):
    return [math.log(2) ** k / math.factorial(k) for k in range(d + 1)]


def fit_lsq(d, weights=None):
    """Least squares of the relative error (p(f) - 2^f) / 2^f, optionally weighted."""
    A = torch.stack([f ** k for k in range(d + 1)], 1) / two_f[:, None]
    b = torch.ones_like(f)
    if weights is not None:
        A, b = A * weights.sqrt()[:, None], b * weights.sqrt()
    return torch.linalg.lstsq(A, b[:, None]).solution[:, 0].tolist()


def fit_pinned(d):
    """p(f) = 1 + f + f (f - 1) q(f): p(0) = 1 and p(1) = 2 exactly; q by least squares, relative."""
    A = torch.stack([f * (f - 1) * f ** k for k in range(d - 1)], 1) / two_f[:, None]
    q = torch.linalg.lstsq(A, ((two_f - 1 - f) / two_f)[:, None]).solution[:, 0].tolist()
    c = [1.0, 1.0] + [0.0] * (d - 1)
    for k, a in enumerate(q):                                          # f (f - 1) f^k = f^(k+2) - f^(k+1)
        c[k + 2] += a
        c[k + 1] -= a
    return c


def fit_minimax(d, rounds=40):
    """Lawson: reweight least squares by each point's error until the largest error stops falling."""
    w = torch.ones_like(f) / GRID
    for _ in range(rounds):
        c = fit_lsq(d, w)
        w = w * rel_err(c)
        w = w / w.sum()
    return c


FITS = {"Taylor at 0": fit_taylor, "least squares": fit_lsq, "p(0)=1, p(1)=2": fit_pinned, "minimax": fit_minimax}
COEFFS = {(d, name): fit(d) for d in (2, 3, 4) for name, fit in FITS.items()}
print(f"largest relative error of p(f) against 2^f on {GRID} points of [0, 1)  (bits: -log2 of it)")
print(f"{'degree':>6s} {'fit':>16s} {'float64':>10s} {'bits':>5s} {'float32':>10s} {'jump at integers':>17s}")
for (d, name), c in COEFFS.items():
    e64, e32 = rel_err(c).max().item(), rel_err(c, dtype=torch.float32).max().item()
    jump = abs(2 * horner(c, torch.zeros(1, dtype=torch.float64)) / horner(c, torch.ones(1, dtype=torch.float64)) - 1).item()
    print(f"{d:6d} {name:>16s} {e64:10.2e} {-math.log2(e64):5.1f} {e32:10.2e} {jump:17.1e}")
for fmt, u in U.items():
    print(f"{fmt} unit roundoff u = 2^{math.log2(u):.0f} = {u:.2e} ({-math.log2(u):.0f} bits)")

# %% [markdown]
# Read the table by its bits column against $u$'s: a quadratic reaches about 8 to 9 bits at best, at bf16's
# rounding and well short of fp16's; a cubic fitted on the relative error reaches about 13, below both; a
# quartic about 18, more than $\tilde P$ can keep. Taylor's series is the worst fit of each degree by far:
# it is exact at 0 and its error piles up towards $f = 1$. Pinning $p(0) = 1$ and $p(1) = 2$ costs little
# against the free least-squares fit, makes whole numbers exact, and leaves no jump where $f$ wraps (the
# free quadratic and quartic jump there by about their error). Float32 evaluation changes the cubic's error
# only in its last digits. So FA4's cubic is the smallest degree below both formats' rounding. The plot shows
# where the error of the pinned fits lies across $[0, 1)$.

# %%
fig, ax = plt.subplots(figsize=(8.5, 3.6))
for d in (2, 3, 4):
    ax.semilogy(f, rel_err(COEFFS[(d, "p(0)=1, p(1)=2")]).clamp_min(1e-12), lw=1.1, label=f"degree {d}, p(0)=1, p(1)=2")
for fmt, u in U.items():
    ax.axhline(u, color="#666666", ls="--" if fmt == "bf16" else ":", lw=1)
    ax.text(1.0, u * 1.15, f"{fmt}: u = 2^{math.log2(u):.0f}", ha="right", fontsize=8, color="#444444")
ax.set_xlabel("f")
ax.set_ylabel("|p(f) / 2^f - 1|")
ax.set_ylim(1e-8, 3e-2)
ax.legend(fontsize=8, loc="lower left")
ax.set_title("Relative error of the fitted polynomial on [0, 1), against the rounding of P's formats", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# What reaches the tensor cores is $p(f)$ rounded to bf16 or fp16. The cell rounds both $p(f)$ and the exact
# $2^f$ to each format and counts the grid points where the two give a different number, and the largest
# error after rounding, in units of $u$ (exact rounding gives at most $u$, by definition).

# %%
print(f"{'degree':>6s} {'format':>6s} {'rounds differently':>19s} {'max error after rounding':>25s}")
for d in (2, 3, 4):
    p = horner(COEFFS[(d, "p(0)=1, p(1)=2")], f.float())
    for fmt, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        mine, exact = p.to(dt).double(), two_f.to(dt).double()
        differ = (mine != exact).double().mean().item()
        worst = ((mine / two_f - 1).abs().max() / U[fmt]).item()
        print(f"{d:6d} {fmt:>6s} {differ:18.2%}  {worst:20.2f} u   (2^f rounded: {((exact / two_f - 1).abs().max() / U[fmt]).item():.2f} u)")

# %% [markdown]
# With the cubic, bf16 rounds a small share of the grid to the neighbouring number and never beyond $u$;
# fp16, three bits finer, sees the cubic's error more often and a little beyond $u$ at worst; the quadratic
# is visible in both. An error of about $u$ in each weight moves $o$, a weighted average of rows of $V$, by
# about $u$ of its size at most: far inside the course's correctness rule. Exercise 14 fits its own cubic and
# builds the whole $2^x$ around it.
#
# ## 4. Conditional rescaling
#
# Lecture 03's online softmax keeps, for each row, a running maximum $m$, a running sum $\ell$ and an
# unnormalised accumulator $\text{acc}$, with the invariant (base 2, after the tiles seen so far)
#
# $$\ell = \sum_{k \text{ seen}} 2^{s_k - m}, \qquad \text{acc} = \sum_{k \text{ seen}} 2^{s_k - m}\, v_k,
#   \qquad o = \frac{\text{acc}}{\ell} = \frac{\sum_k 2^{s_k} v_k}{\sum_k 2^{s_k}} .$$
#
# The factor $2^{-m}$ cancels in $o$: **any** $m$ gives the right output, as long as $\ell$ and acc use the
# same one. The maximum is there only to keep $2^{s_k - m} \le 1$, so that nothing overflows. When a new tile
# raises the maximum from $m$ to $m'$, both are rescaled by $\alpha = 2^{m - m'}$ to keep the invariant with
# $m'$. FA4 keeps the stale $m$ instead, as long as the tile's row maximum is at most $m + \tau$:
#
# $$m' = \begin{cases} \max_{k \in \text{tile}} s_k & \text{if } \max_{k \in \text{tile}} s_k > m + \tau \\
#                       m & \text{otherwise,}\end{cases}$$
#
# and rescales (with $\alpha = 2^{m - m'}$) only in the first case. With the stale $m$ the invariant still
# holds, so $o$ is exact; what changes is the range: $\tilde p = 2^{s - m}$ may now reach $2^{\tau}$ instead of
# 1. In fp32, $\ell$ and acc have room for that many times over; $\tilde P$ itself goes to the tensor cores in
# 16 bits, so $2^\tau$ must stay below the format's largest number (fp16: 65504, about $2^{16}$), and the
# relative precision of a float does not depend on its size, so a larger $\tilde p$ is rounded no worse.
# FA4's forward uses $\tau = 8$ for 16-bit inputs; for FP8 inputs it uses $\tau = 0$ and spends the same
# headroom differently, lifting $\tilde P$ by $2^8$ before its cast to e4m3 (lecture 10 took that path). Its
# `softmax.py` writes the test as "keep the old maximum while $(m - m') \cdot \text{scale} \ge -\tau$",
# per row; its correction warps then rescale a warp's 32 rows of $O$ in Tensor Memory if **any** of those
# rows moved (a vote across the warp), and skip the tile otherwise.
#
# What it saves is the rescale itself: reading a $128 \times D$ fp32 accumulator out of Tensor Memory,
# multiplying it and writing it back, 64 KiB at $D = 128$, plus the wait between the softmax warps that
# compute $\alpha$ and the correction warps that apply it. How often is it needed? The cell counts, on random
# rows, the tiles whose row maximum exceeds $m + \tau$ along each row (the first tile sets $m$ and is not
# counted), per row and per warp of 32 rows as FA4's vote sees it, with $\tau = 0$ (the classic update) and
# $\tau = 8$. Scores are $q \cdot k / \sqrt{D}$ of Gaussian $q$, $k$ times a spread $\sigma$, in base 2;
# real attention logits are often wider than $\sigma = 1$. The last rows add a bias that grows along the
# keys, as ALiBi's does towards the query (lecture 10): a maximum that keeps climbing.

# %%
ROWS, KEYS, BLOCK_N, DH = 256, 4096, 128, 128
LOG2E = 1 / math.log(2)
g = torch.Generator().manual_seed(14)
base = torch.randn(ROWS, DH, generator=g, dtype=torch.float64) @ torch.randn(KEYS, DH, generator=g, dtype=torch.float64).T
base = base / math.sqrt(DH)                                   # N(0, 1) scores, natural-log units


def count_rescales(s2, tau):
    """s2: [rows, keys] scores in base 2. Walk each row's tiles of BLOCK_N keys with a running maximum that
    moves only when a tile's row maximum passes it by more than tau; return which (row, tile) moved it and the
    largest log2 of P seen (P <= 2^tau)."""
    tile_max = s2.view(s2.shape[0], -1, BLOCK_N).amax(-1)    # [rows, tiles]
    m = tile_max[:, 0].clone()
    moved = torch.zeros_like(tile_max, dtype=torch.bool)
    top = torch.zeros_like(m)
    for j in range(1, tile_max.shape[1]):
        moved[:, j] = tile_max[:, j] > m + tau
        top = torch.maximum(top, torch.where(moved[:, j], 0.0, tile_max[:, j] - m))
        m = torch.where(moved[:, j], tile_max[:, j], m)
    return moved[:, 1:], top.max().item()


CASES = {f"Gaussian, sigma = {sd}": base * sd * LOG2E for sd in (1, 3, 8)}
CASES |= {f"sigma = 1, bias 2^{k} per key": (base + 2.0 ** k * torch.arange(KEYS, dtype=torch.float64)) * LOG2E
          for k in (-8, -4)}                                  # natural-log units per key, growing towards the query
print(f"{ROWS} rows x {KEYS} keys, tiles of {BLOCK_N} ({KEYS // BLOCK_N - 1} tiles after the first); "
      "share of tiles that rescale")
print(f"{'scores':>30s} {'tau':>4s} {'per row':>8s} {'per warp (32 rows)':>19s} {'max log2 P':>11s}")
for name, s2 in CASES.items():
    for tau in (0.0, 8.0):
        moved, top = count_rescales(s2, tau)
        per_warp = moved.view(ROWS // 32, 32, -1).any(1)
        print(f"{name:>30s} {tau:4.0f} {moved.double().mean().item():8.1%} {per_warp.double().mean().item():19.1%} {top:11.2f}")

# %% [markdown]
# Read it row by row. With $\tau = 0$ every case rescales often: on Gaussian scores a row's maximum grows
# at tile $j$ with probability $1/j$, whatever $\sigma$, and for a warp of 32 rows some row almost always grows,
# so FA4's vote would rescale most tiles. With $\tau = 8$ a Gaussian row of $\sigma = 1$ never needs one: its
# maximum over 4096 keys is only a few units of $\log_2$ above its first tile's. Wider scores need some:
# few per row, but at $\sigma = 8$ a warp of 32 rows still finds one in nearly half the tiles; a gentle
# climb (the small bias) falls from most tiles to a few per row; and a maximum that climbs by more than
# $\tau$ per tile (the steep bias) rescales at every tile whatever $\tau$ is. The last column is the price:
# $\tilde P$ stays below $2^\tau$ and comes close to it when scores are wide, well inside fp16 and bf16; with
# $\tau = 0$ it never passes 1. Exercise 14 writes the update itself, with $\ell$ and acc.
#
# ## 5. Measured on Hopper
#
# Both ideas were tried in the course's FP8 Triton rung `v7_fp8_fa3` (lecture 10 describes the kernel and the
# switches), because FP8 is where Hopper's tensor rate matches the doubled one of section 1. Every figure
# below is the committed record's, with its file.
#
# **The software exp2, all of it.** On an H100 (`2026-11-27_h100_step10_fp8_exp2_fma.txt`: torch 2.11, Triton
# 3.6, CUDA 13.0; inputs already in e4m3; the course's bench, interleaved with SDPA's cuDNN backend on the fp16
# inputs, L2 flushed, median, two rounds; checked first on every FP8 case in fp16 and bf16) `v7_fp8_fa3` with
# every exponential of $\tilde P$ on the FMA pipes ran at 462 TFLOP/s at 16k non-causal against 841 TFLOP/s with
# `MUFU.EX2`, and 361 TFLOP/s against 574 TFLOP/s on `large`: from 1.257x cuDNN's fp16 speed to 0.687x at 16k.
# The RMSE on FA3's outlier inputs did not move (the cubic is far below e4m3's rounding).
#
# **A share of it.** On an H200 (`2026-12-03_h200_step10_fp8_exp2_part.txt`, same software and method, two
# rounds alternating) the last eighth of each tile's 128 key columns in software cost 20-27% of the speed on
# `long` and at 16k non-causal, and a quarter 23-30%. In the key loop's SASS
# (`2026-12-03_cpu_step10_fp8_loop_sass.txt`) the eighth takes 8 of the 67 `MUFU` instructions out of a warp's
# tile and puts 223 others in (565 to 780), 120 of them `PRMT` and `LOP3` that rebuild the e4m3 operand's
# byte order after the tile is split. The record's reading of why: at the committed speed a scheduler's share of MUFU is busy
# 41-42% of the time and its issue slots 43-44%. Neither unit is full. Each warp waits for its $S$, then issues
# its softmax's dependent instructions with one other warp beside it, so the loop's time follows its
# instruction count, and every exponential moved off MUFU adds about ten.
#
# **The conditional rescale.** On an H200 (`2026-11-28_h200_step10_fp8_lazy.txt`: e4m3 inputs, the course's
# bench against cuDNN on the fp16 inputs, two rounds) the switch `LAZY_RESCALE` (a threshold of 0.75, in
# e4m3's range, lecture 10) ran at 613 TFLOP/s at 16k non-causal against 851 TFLOP/s without it: 0.71-0.72x
# v7's speed. The branch around the rescale inside the key loop is its one structural change, and Triton may
# no longer pipeline that loop; its accuracy on a CPU is lecture 10's. The switch stays off.
#
# **FA4's own Hopper kernels.** FA4's repository also has a Hopper path, a CuTe-DSL port of FlashAttention-3,
# and in the source we read neither idea is in it: the threshold lives in the Blackwell softmax only, and the
# Hopper forward computes every exponential on MUFU. On one H200 (`2026-12-02_h200_fa4_reference.txt`:
# flash-attn-4 4.0.0b36 and nvidia-cutlass-dsl 4.8.1, fp16, D 128; the course's bench and `do_bench`, each
# against SDPA's cuDNN backend on the same tensors, outputs checked against cuDNN's first) FA4's Hopper forward
# ran at 1.02-1.03x cuDNN on `large`, 1.06-1.09x cuDNN without a mask (4k to 16k keys) and 1.09-1.14x causal;
# the course's step 07 solution at 0.995-1.00x, 1.00-1.03x and 1.07-1.12x, 2-6% behind FA4. Its backward ran at
# 1.09x cuDNN's on `large`.
#
# **Why they lose on Hopper, and what changes on Blackwell.** On Hopper the softmax of `v7` is bound by its
# own chain of instructions, with MUFU less than half busy: moving work from MUFU to the FMA pipes adds
# instructions to the one resource that limits, and a branch in a Triton loop costs its pipelining. The same
# two ideas pay where the premises differ, and on Blackwell they do:
#
# - **MUFU becomes the full unit.** At twice the tensor rate the exponentials need the whole tile's time
#   (section 1); any exponential moved off MUFU shortens the critical unit, as long as the issue budget has
#   room. FA4 moves only a fraction of each row to the polynomial (its `ex2_emu_freq` setting), and none on
#   `sm_103` (B300), whose hardware exp2 its code calls fast.
# - **The software exp2 is cheaper.** Packed fp32 FMAs evaluate two exponentials per instruction: about six
#   instructions each against Triton's eleven on Hopper. And the tile split that cost `v7` its byte permutes
#   has no counterpart: FA4 picks, at compile time, which pairs of a thread's row go to the polynomial, and
#   $\tilde P$ goes back to Tensor Memory in 16 bits.
# - **The softmax warps do less else.** They issue no MMA, hold no accumulator, and read one row per thread
#   from Tensor Memory (no shuffles for the max and the sum); the rescale is another warpgroup's job, so
#   skipping it does not branch inside the softmax's loop, it spares the correction warps a round trip of
#   $O$ through Tensor Memory and the softmax warps a wait.
#
# ## 6. What to measure when you get a Blackwell GPU
#
# The course's numbers for Blackwell are a model until someone runs these on one (with the GPU, date,
# versions, clocks, timing method and reference written next to each, as in `benchmarks/results/`):
#
# 1. **The two rates of section 1**: MUFU.EX2 results per clock per SM (a loop of independent `ex2.approx`
#    per thread) and dense bf16 `tcgen05.mma` FLOPs per clock per SM, at a locked clock. They replace the
#    model's doubling, and the figure's third bars.
# 2. **FA4's forward with and without the software exp2** (`ex2_emu_freq` 0 against its default) at
#    $D = 64$ and 128, causal and not: the gain the polynomial buys, and whether its share is tuned where
#    MUFU and the issue slots meet.
# 3. **The threshold**: FA4 with $\tau = 0$ against $\tau = 8$, and the number of tiles its correction warps
#    actually rescale (section 4's count, on real model activations instead of Gaussian rows).
# 4. **The 2-CTA MMA** on and off for non-causal shapes, with Nsight Compute's shared-memory throughput:
#    section 2's arithmetic says a single CTA reads shared memory for three quarters of the tile's time.
# 5. **The course's own Triton kernels** (steps 05 and 08-10) compiled for `sm_100`, against cuDNN and FA4 on
#    the five configurations and `long`: how much of Blackwell a kernel gets without Tensor Memory in its source.
#
# ## Summary
#
# - Per tile, $t_{\text{exp}} / t_{\text{mma}} = R / (64 D)$: half on an H100 in fp16 at $D = 128$, equal in
#   fp8 and on an SM with twice Hopper's tensor rate (our model of Blackwell), twice at $D = 64$; the issue
#   budget per score falls from 16 instructions to 8.
# - Blackwell's `tcgen05.mma` is issued by one thread, accumulates in Tensor Memory (128 lanes x 512
#   columns x 32 bits per SM) and can span two SMs (`cta_group::2`, $M = 256$, each SM holding half of $B$).
#   FA4's CTA gives each job its own warps: two softmax warpgroups, a correction warpgroup, one MMA warp,
#   load and epilogue warps; $S_0$, $S_1$, $O_0$, $O_1$ fill Tensor Memory's 512 columns.
# - Software exp2: $2^x = 2^n\, p(f)$, $n = \lfloor x \rfloor$, $p$ a cubic by Horner, $n \cdot 2^{23}$ added to
#   the bits; a cubic fitted on the relative error is below bf16's and fp16's rounding, a quadratic is not.
# - Conditional rescaling: $\ell$ and acc stay exact with any shared $m$; keep the stale one until a row's
#   maximum passes it by more than $\tau$ ($\tau = 8$: $\tilde P \le 2^8$, fine in 16 bits and fp32); most tiles
#   then need no rescale, unless the maximum climbs steeply.
# - On Hopper both lost in the course's FP8 kernel (software exp2 for an eighth of the columns: 20-27% of the
#   speed lost on `long` and at 16k, `2026-12-03_h200_step10_fp8_exp2_part.txt`; the lazy rescale: 0.71-0.72x
#   v7's speed, `2026-11-28_h200_step10_fp8_lazy.txt`), because its softmax is bound by its instruction chain,
#   not by MUFU; they are Blackwell's answers to a Blackwell problem.
#
# **Next:** exercise 14 writes `exp2_poly` and `lazy_rescale_update`, checked on a CPU.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
