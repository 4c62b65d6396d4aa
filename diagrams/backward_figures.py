"""Step 08 figures: the backward pass of attention (course/08_backward).

- ``backward_loop_order``: left, the (query tile, key tile) grid of a causal attention with
  FlashAttention-2's backward loop order: one program per key tile (a column), walking down over the
  query tiles that see it, dK_j and dV_j accumulated in its registers and written once, dQ_i
  receiving an atomic add from every program; skipped, diagonal and full tiles as in
  ``causal_tiles``. Right, the body of the inner loop for one tile pair, coloured by the unit that
  does the work (tensor cores, special-function units, CUDA cores, memory).
- ``backward_flops``: left, the matmul FLOPs of the forward, of FA2's backward (atomic dQ) and of a
  backward with a separate dQ pass, per visible (query, key) pair in units of the head dimension d,
  split by matmul (counted from the algorithm; lecture 08 measures the same ratios with
  ``torch.utils.flop_counter``). Right, a model of one tile pair on an H100 (B_r = B_c = d = 128):
  tensor-core time at the dense FP16 peak (989 TFLOP/s, 132 SMs) against the special-function time of
  its B_r·B_c exponentials (16 exp2 per clock per SM at 1.83 GHz, CUDA C++ Programming Guide's
  throughput table, as in lecture 07; computed twice with a separate dQ pass). A model, not a
  measurement: no memory traffic, no overlap, peak rates.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402
COL = dict(full="#4a90d9", diag="#f5b041", skip="#eeeeee", kv="#16a085", q="#8e44ad", hbm="#d9534f",
           tc="#4a90d9", sfu="#f5b041", fma="#5cb85c", mem="#d9534f", reg="#5cb85c")

# one tile pair of the model (H100 SXM5, dense FP16 tensor cores; exp2 throughput from the
# CUDA C++ Programming Guide, 16 per clock per SM on compute capability 9.0)
SMS, CLOCK_GHZ, PEAK_TFLOPS, EXP2_PER_CLK_PER_SM = 132, 1.83, 989.4, 16
BR = BC = D = 128

# matmuls per pass: (name, FLOPs per visible pair in units of d)
FORWARD = [("S = QKᵀ", 2), ("O += PV", 2)]
BACKWARD = [("recompute S", 2), ("dV += PᵀdO", 2), ("dP = dO Vᵀ", 2), ("dK += dSᵀQ", 2),
            ("dQ += dS K", 2)]
BACKWARD_SEPARATE = BACKWARD[:4] + [("dQ pass:\nS, dP and dQ", 6)]


def tile_pair_model(n_matmuls: int, n_exp: int = 1) -> tuple[float, float]:
    """Microseconds of tensor-core work and of exp2 work for one B_r x B_c tile pair on one SM
    (n_exp: how many times the pair's B_r·B_c exponentials are computed)."""
    per_sm_flops = PEAK_TFLOPS * 1e12 / SMS
    t_mma = n_matmuls * 2 * BR * BC * D / per_sm_flops * 1e6
    t_exp = n_exp * BR * BC / (EXP2_PER_CLK_PER_SM * CLOCK_GHZ * 1e9) * 1e6
    return t_mma, t_exp


def _box(ax, x, y, w, h, text, color, fs=9, tc="black", lw=1.0, alpha=1.0):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=INK, lw=lw, alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def _arrow(ax, p, q, color=INK, lw=1.3, ls="-", rad=0.0, ms=11):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=ms, color=color, lw=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))


def _grid(ax):
    T, prog = 6, 2                                    # 6 x 6 tiles, the program of key tile 2 highlighted
    x0, y0 = 1.2, 1.6                                 # lower-left corner of the grid
    for i in range(T):                                # query tile i: row i from the top
        for j in range(T):
            kind = "skip" if j > i else "diag" if j == i else "full"
            y = y0 + (T - 1 - i)
            ax.add_patch(Rectangle((x0 + j, y), 1, 1, fc=COL[kind], ec="white", lw=1.5,
                                   alpha=1.0 if j == prog or kind == "skip" else 0.45))
    # the highlighted program's column
    ax.add_patch(Rectangle((x0 + prog, y0), 1, T, fill=False, ec=COL["kv"], lw=3))
    for j in range(T):
        _box(ax, x0 + j + 0.08, y0 + T + 0.2, 0.84, 0.55, f"K{j},V{j}", COL["kv"], fs=7.5, tc="white",
             alpha=1.0 if j == prog else 0.45)
    ax.text(x0 + T / 2, y0 + T + 1.05, "one program per key tile (grid: key tiles x batch x heads)",
            ha="center", fontsize=9)
    for i in range(T):
        ax.text(x0 - 0.12, y0 + T - 1 - i + 0.5, f"Q{i}, dO{i}\nlse{i}, D{i}", ha="right", va="center", fontsize=7)
    # the inner loop: down the column, from the first query tile that sees key tile `prog`
    _arrow(ax, (x0 + prog + 0.5, y0 + T - prog - 0.15), (x0 + prog + 0.5, y0 + 0.2), color=INK, lw=2.2, ms=14)
    ax.text(x0 + prog + 0.62, y0 + T - prog - 0.55, "inner loop\nover Q_i", fontsize=7.5, va="top")
    ax.text(x0 + prog + 0.5, y0 + T - prog + 0.3, "starts at the\ndiagonal", fontsize=7, ha="center", va="bottom")
    # dK_j, dV_j: registers, written once
    _box(ax, x0 + prog - 0.9, y0 - 1.25, 2.8, 0.7, "dK2, dV2 in registers,\nwritten to HBM once", COL["reg"], fs=8)
    _arrow(ax, (x0 + prog + 0.5, y0 + 0.1), (x0 + prog + 0.5, y0 - 0.52), color=COL["reg"], lw=2)
    # dQ column: fp32 in HBM, atomic adds from every program
    xq = x0 + T + 0.9
    ax.text(xq + 0.45, y0 + T + 0.45, "dQ (fp32, HBM)", ha="center", fontsize=8.5)
    for i in range(T):
        y = y0 + T - 1 - i
        _box(ax, xq, y + 0.12, 0.9, 0.76, f"dQ{i}", COL["hbm"], fs=8, tc="white")
        if i >= prog:
            _arrow(ax, (x0 + prog + 0.95, y + 0.5), (xq - 0.03, y + 0.5), color=COL["hbm"], lw=1.3, ls="--",
                   rad=-0.08 if i % 2 else 0.08)
    ax.text(xq + 0.45, y0 - 0.25, "atomic add from\nevery program:\norder not fixed", ha="center", va="top",
            fontsize=8, color=COL["hbm"])
    # legend
    for k, (kind, label) in enumerate((("full", "full: no mask"), ("diag", "diagonal: element mask"),
                                       ("skip", "skipped: never visited"))):
        ax.add_patch(Rectangle((0.0 + 2.9 * k, -0.95), 0.35, 0.35, fc=COL[kind], ec=INK, lw=0.6))
        ax.text(0.45 + 2.9 * k, -0.78, label, fontsize=7.5, va="center")
    ax.set_xlim(-0.6, xq + 1.6)
    ax.set_ylim(-1.2, y0 + T + 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("causal, bottom-right; program of key tile 2", fontsize=10)


def _body(ax):
    steps = [
        ("mem", "load Q_i, dO_i, lse_i, D_i", "HBM → shared memory"),
        ("tc", "S = scale · Q_i K_jᵀ", "matmul 1: recompute"),
        ("sfu", "P = exp(S − lse_i)", "B_r·B_c exponentials"),
        ("tc", "dV_j += Pᵀ dO_i", "matmul 2 (registers)"),
        ("tc", "dP = dO_i V_jᵀ", "matmul 3"),
        ("fma", "dS = P ∘ (dP − D_i)", "elementwise"),
        ("tc", "dK_j += scale · dSᵀ Q_i", "matmul 4 (registers)"),
        ("tc", "dQ_i += scale · dS K_j", "matmul 5"),
        ("mem", "atomic add dQ_i (fp32)", "read-modify-write in L2/HBM"),
    ]
    n = len(steps)
    for k, (kind, text, note) in enumerate(steps):
        y = n - 1 - k
        _box(ax, 0.0, y + 0.12, 3.6, 0.76, text, COL[kind], fs=9, tc="white" if kind in ("tc", "mem") else "black")
        ax.text(3.8, y + 0.5, note, fontsize=8, va="center")
        if k:
            _arrow(ax, (1.8, y + 1.12), (1.8, y + 0.9), lw=1.0, ms=8)
    for k, (kind, label) in enumerate((("tc", "tensor cores"), ("sfu", "special-function units"),
                                       ("fma", "CUDA cores"), ("mem", "memory"))):
        ax.add_patch(Rectangle((0.0 + 1.75 * k, -0.85), 0.3, 0.3, fc=COL[kind], ec=INK, lw=0.6))
        ax.text(0.38 + 1.75 * k, -0.7, label, fontsize=7.5, va="center")
    ax.set_xlim(-0.2, 6.9)
    ax.set_ylim(-1.1, n + 0.2)
    ax.axis("off")
    ax.set_title("inner loop body, one tile pair (i, j)", fontsize=10)


def backward_loop_order(out):
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 6.0), gridspec_kw={"width_ratios": [1.25, 1.0]})
    _grid(a)
    _body(b)
    fig.tight_layout()
    return _save(fig, "backward_loop_order", out)


def backward_flops(out):
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.0, 1.15]})
    colors = ["#4a90d9", "#8e44ad", "#16a085", "#f0ad4e", "#d9534f", "#95a5a6"]
    passes = (("forward", FORWARD), ("backward\n(FA2, atomic dQ)", BACKWARD), ("backward\n(separate dQ pass)", BACKWARD_SEPARATE))
    for x, (label, mm) in enumerate(passes):
        bottom = 0
        for k, (name, f) in enumerate(mm):
            c = colors[k] if label != "forward" else colors[[0, 4][k]]
            a.bar(x, f, bottom=bottom, color=c, ec="white", width=0.8)
            a.text(x, bottom + f / 2, name, ha="center", va="center", fontsize=7.5, color="white")
            bottom += f
        a.text(x, bottom + 0.25, f"{bottom}d  ({bottom / 4:g}x)", ha="center", fontsize=9, weight="bold")
    a.set_xticks(range(len(passes)), [p[0] for p in passes], fontsize=8.5)
    a.set_ylabel("matmul FLOPs per visible (query, key) pair, in units of d")
    a.set_ylim(0, 16)
    a.set_title("FLOPs: 2 matmuls forward, 5 backward", fontsize=10)
    for s in ("top", "right"):
        a.spines[s].set_visible(False)

    rows = (("forward", 2, 1), ("backward (atomic dQ)", 5, 1), ("backward (separate dQ)", 7, 2))
    for y, (label, n, n_exp) in enumerate(reversed(rows)):
        t_mma, t_exp = tile_pair_model(n, n_exp)
        b.barh(y, t_mma, color=COL["tc"], height=0.5)
        b.barh(y, t_exp, left=t_mma, color=COL["sfu"], height=0.5)
        b.text(t_mma / 2, y, f"{n} matmuls\n{t_mma:.2f} µs", ha="center", va="center", fontsize=7.5, color="white")
        b.text(t_mma + t_exp + 0.05, y, f"{n_exp}x exp: {t_exp:.2f} µs\n= {t_exp / t_mma:.0%} of the matmul time",
               va="center", fontsize=8)
    b.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8.5)
    b.set_xlim(0, 6.4)
    b.set_xlabel("µs on one SM (model: peak rates, no memory, no overlap)")
    b.set_title(f"one {BR} x {BC} tile pair, d = {D}, H100: tensor cores vs exponentials", fontsize=10)
    for s in ("top", "right"):
        b.spines[s].set_visible(False)
    fig.tight_layout()
    return _save(fig, "backward_flops", out)


FIGURES = {f.__name__: f for f in (backward_loop_order, backward_flops)}
