"""Step 14 figures: after Hopper (course/14_after_hopper).

- ``exp_cycle_budget``: left, the cycles one SM spends on one 128 x 128 tile of S at head dimension 128:
  the tensor cores on its two products (S = Q K^T and O += P V, 4·M·N·D FLOPs) against the special-function
  unit (MUFU) on its M·N exponentials, for an H100 in fp16 and in fp8 and for an SM whose tensor rate per
  clock is twice Hopper's (Blackwell B200's bf16 and fp8, as modelled here). Right, the ratio of the two,
  t_exp / t_mma = R / (64·D), against the head dimension D. A model of peak rates, not a measurement: no
  memory traffic, no other softmax instruction, no overlap.
- ``fa4_cta``: FlashAttention-4's forward CTA on Blackwell as the FA authors' CuTe-DSL kernel lays it out
  (``flash_attn/cute/flash_fwd_sm100.py`` of Dao-AILab/flash-attention, commit 0251105a read for this
  lecture): sixteen warps (two softmax warpgroups, one per 128-row Q tile; a correction warpgroup; one MMA
  warp whose single elected thread issues every tcgen05.mma; an epilogue warp; a load warp; an idle warp),
  the Tensor Memory columns each buffer takes (S0/P0 0-127, S1/P1 128-255, O0 256-383, O1 384-511 of the
  512), and the 2-CTA variant (cta_group::2: one MMA of M = 256 over two SMs, each holding its own 128 Q
  rows and half of every K and V tile). A schematic: no lengths are measurements.

Per-SM, per-clock rates (RATES) and where they come from:
- H100 SXM5 dense FP16/BF16 tensor cores: 989.4 TFLOP/s (NVIDIA H100 datasheet: 1,979 with sparsity, dense
  is half) over 132 SMs at 1.83 GHz = 4096 FLOP per clock per SM. 4096 is also what the whitepapers give:
  the A100 whitepaper's 256 dense FP16 FMA per clock per tensor core, four tensor cores per SM (2048 FLOP),
  doubled clock for clock on the H100 SM (H100 whitepaper); the clock is the one the datasheet's rate
  implies at that per-SM rate (diagrams/draw.py uses the same convention).
- H100 SXM5 dense FP8: 1,979 TFLOP/s (datasheet, 3,958 with sparsity) = 8192 FLOP per clock per SM.
- exp2 (MUFU.EX2): 16 results per clock per SM on compute capability 9.0 (CUDA C++ Programming Guide,
  "Arithmetic Instructions" throughput table). FA3's paper (§3.2) gives 3.9 TFLOPS of special functions on
  an H100 SXM5: 16 x 132 SMs x 1.83 GHz = 3.87e12.
- fp32 FMA: 128 results per clock per SM on compute capability 9.0 (the same table).
- "2x tensor rate": NVIDIA publishes no per-SM, per-clock tensor rate for B200, and no clock we could tie
  the datasheet's aggregate to, so Blackwell is modelled as Hopper's SM with twice the tensor rate per clock
  and the same MUFU rate. What supports that: the FlashAttention-4 authors write that BF16 tensor throughput
  goes from 1 to 2.25 PFLOP/s from H100 to B200 while the number of special-function units stays the same
  (Together AI blog, "FlashAttention-4", 2026); CUTLASS's tcgen05 MMA programming guide gives tcgen05 2x-4x
  the throughput of Hopper's WGMMA depending on the data type.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from figstyle import INK, blank, save as _save  # noqa: E402

COL = dict(tc="#4a90d9", sfu="#f5b041", fma="#5cb85c", mem="#d9534f", q="#8e44ad", kv="#16a085",
           grey="#bbbbbb", soft0="#f8c471", soft1="#f5b041", corr="#e59866", mma="#4a90d9", load="#16a085",
           epi="#af7ac5", idle="#eeeeee")

# H100 SXM5: the datasheet's dense FP16 rate, its SM count, and the clock that rate implies at 4096 FLOP/clk/SM
H100_TFLOPS_FP16, H100_TFLOPS_FP8, H100_SMS, H100_CLOCK_GHZ = 989.4, 1978.9, 132, 1.83
EXP2_PER_CLK_PER_SM = 16          # MUFU.EX2, CUDA C++ Programming Guide, compute capability 9.0
FFMA_PER_CLK_PER_SM = 128         # fp32 FMA, the same table


def per_sm_per_clock(tflops: float, sms: int = H100_SMS, clock_ghz: float = H100_CLOCK_GHZ) -> float:
    """FLOP per clock per SM from an aggregate rate, an SM count and a clock."""
    return tflops * 1e12 / (sms * clock_ghz * 1e9)


# name -> tensor-core FLOP per clock per SM, exp2 per clock per SM, what it is; Blackwell modelled as Hopper's SM
# with the tensor rate doubled (the module docstring says why)
DOUBLED_BF16, DOUBLED_FP8 = "2x tensor, bf16\n(B200, modelled)", "2x tensor, fp8\n(B200, modelled)"
RATES = {
    "H100 fp16": dict(tensor=round(per_sm_per_clock(H100_TFLOPS_FP16)), exp2=EXP2_PER_CLK_PER_SM,
                      note="datasheet 989 TFLOP/s dense, 132 SMs, 1.83 GHz"),
    "H100 fp8": dict(tensor=round(per_sm_per_clock(H100_TFLOPS_FP8)), exp2=EXP2_PER_CLK_PER_SM,
                     note="datasheet 1,979 TFLOP/s dense, 132 SMs, 1.83 GHz"),
    DOUBLED_BF16: dict(tensor=2 * round(per_sm_per_clock(H100_TFLOPS_FP16)), exp2=EXP2_PER_CLK_PER_SM,
                       note="Hopper's SM with twice the tensor rate, same MUFU"),
    DOUBLED_FP8: dict(tensor=2 * round(per_sm_per_clock(H100_TFLOPS_FP8)), exp2=EXP2_PER_CLK_PER_SM,
                      note="Hopper's SM with twice the tensor rate, same MUFU"),
}
TILE_M = TILE_N = 128
HEAD_DIM = 128


def tile_cycles(tensor_per_clk: float, exp2_per_clk: float, M: int = TILE_M, N: int = TILE_N,
                D: int = HEAD_DIM) -> tuple[float, float]:
    """(tensor-core cycles, MUFU cycles) one SM spends on one M x N tile of S at head dimension D:
    S = Q K^T and O += P V are 2·M·N·D FLOPs each; the softmax takes M·N exponentials."""
    return 4 * M * N * D / tensor_per_clk, M * N / exp2_per_clk


def exp_cycle_budget(out):
    names = list(RATES)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.6), gridspec_kw=dict(width_ratios=[1.35, 1]))
    w = 0.36
    for i, n in enumerate(names):
        t_mma, t_exp = tile_cycles(RATES[n]["tensor"], RATES[n]["exp2"])
        for dx, t, col, lab in ((-w / 2, t_mma, COL["tc"], "tensor cores: QKᵀ and PV"),
                                (w / 2, t_exp, COL["sfu"], "MUFU: the tile's 16,384 exp2")):
            ax.bar(i + dx, t, w, color=col, edgecolor=INK, lw=0.8, label=lab if i == 0 else None)
            ax.text(i + dx, t + 30, f"{t:.0f}", ha="center", va="bottom", fontsize=8.5)
    ax.set_xticks(range(len(names)), names, fontsize=8.5)
    ax.set_ylabel("cycles of one SM per 128 x 128 tile (D = 128)")
    ax.set_ylim(0, 2450)
    ax.legend(loc="upper right", fontsize=8.5, frameon=False)
    ax.set_title("One tile of S: the two products against its exponentials (peak rates)", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)

    dims = [64, 96, 128, 192, 256]
    styles = [("o", "-", 5), ("s", "-", 9), ("^", "--", 5), ("D", "-", 5)]
    for n, (mk, ls, ms) in zip(names, styles):
        r = [tile_cycles(RATES[n]["tensor"], RATES[n]["exp2"], D=d) for d in dims]
        bx.plot(dims, [e / m for m, e in r], marker=mk, ls=ls, ms=ms, lw=1.3, mfc="none" if ms > 5 else None,
                label=n.replace("\n", " ") + (" (= H100 fp8)" if "bf16" in n else ""))
    bx.axhline(1.0, color="#888888", ls=":", lw=1)
    bx.text(258, 1.04, "exp2 as long as the products", fontsize=7.5, color="#555555", ha="right")
    bx.set_xticks(dims)
    bx.set_xlabel("head dimension D")
    bx.set_ylabel("t_exp / t_mma  =  R / (64 D)")
    bx.set_title("The exponentials' share grows as D shrinks and R grows", fontsize=10)
    bx.legend(fontsize=7.5, frameon=False)
    bx.grid(True, alpha=0.25)
    bx.spines[["top", "right"]].set_visible(False)
    fig.text(0.01, -0.06, "R: tensor-core FLOP per clock per SM (H100: the datasheet's dense rate / (132 SMs x 1.83 GHz); "
             "'2x tensor': Hopper's SM with R doubled, a model of Blackwell).\nMUFU: 16 exp2 per clock per SM "
             "(CUDA C++ Programming Guide, compute capability 9.0). A model: no memory traffic, no other "
             "instruction, no overlap.",
             fontsize=7.5, color="#444444")
    fig.tight_layout()
    return _save(fig, "exp_cycle_budget", out)


# ----------------------------------------------------------------------------- FA4's CTA
# The roles of flash_fwd_sm100.py's sixteen warps: (warps, name, what it does, colour)
WARP_ROLES = [
    ((0, 1, 2, 3), "softmax WG 0", "rows of Q tile 0: tcgen05.ld S0,\nmax, exp2 (some in software),\nP0 written back over S0", COL["soft0"]),
    ((4, 5, 6, 7), "softmax WG 1", "the same for Q tile 1\n(S1, P1)", COL["soft1"]),
    ((8, 9, 10, 11), "correction WG", "rescales O0 / O1 in TMEM when a\nrow's max moved; at the end O / l", COL["corr"]),
    ((12,), "MMA warp", "one elected thread issues\nevery tcgen05.mma", COL["mma"]),
    ((13,), "epilogue warp", "O: smem -> global (TMA)", COL["epi"]),
    ((14,), "load warp", "TMA: Q0, Q1 once; K_j, V_j ring", COL["load"]),
    ((15,), "idle", "", COL["idle"]),
]
# Tensor Memory columns (32-bit cells, 128 lanes x 512 columns): (first column, columns, label, colour)
TMEM_MAP = [(0, 128, "S0 (fp32)\nP0: 16-bit, in 64-127", COL["soft0"]),
            (128, 128, "S1 (fp32)\nP1: 16-bit, in 192-255", COL["soft1"]),
            (256, 128, "O0 (fp32)", COL["tc"]), (384, 128, "O1 (fp32)", "#85c1e9")]


def _box(ax, x, y, w, h, text, color, fs=8, tc="black", lw=0.9, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=INK, lw=lw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc, weight=weight)


def _arrow(ax, p, q, color=INK, lw=1.2, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=10, color=color, lw=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))


def fa4_cta(out):
    fig = plt.figure(figsize=(13, 7.4))
    ax = blank(fig.add_axes([0.0, 0.31, 0.60, 0.69]), (0, 10), (0, 7.4))
    tx = blank(fig.add_axes([0.63, 0.37, 0.37, 0.59]), (-2.2, 9.8), (0, 7.4))
    px = blank(fig.add_axes([0.0, 0.0, 1.0, 0.29]), (0, 20), (0, 4.2))

    # left: the warps of one CTA and what each does
    ax.text(0.1, 7.15, "one CTA (512 threads): two 128-row Q tiles against the same K_j, V_j",
            fontsize=9.5, weight="bold")
    y, centre = 6.6, {}
    for warps, name, what, col in WARP_ROLES:
        h = 0.8 if len(warps) == 4 else 0.5
        label = f"warps {warps[0]}-{warps[-1]}" if len(warps) > 1 else f"warp {warps[0]}"
        _box(ax, 0.1, y - h, 2.2, h, f"{name}\n({label})", col, fs=8, weight="bold")
        if what:
            ax.text(2.45, y - h / 2, what, fontsize=7.5, va="center")
        centre[name] = y - h / 2
        y -= h + 0.12
    _box(ax, 6.6, 0.5, 3.3, 1.5, "shared memory\nQ0, Q1 (128 x D each)\nK_j, V_j: a ring of stages", "#d6eaf8", fs=8)
    _box(ax, 6.6, 3.6, 3.3, 1.5, "tensor cores: tcgen05.mma\nA from smem (or P from TMEM),\nB from smem, D in TMEM",
         "#aed6f1", fs=7.8)
    _arrow(ax, (5.0, centre["load warp"]), (6.6, 1.25), color=COL["load"])
    ax.text(5.6, 1.0, "TMA", fontsize=8, color=COL["load"], weight="bold")
    _arrow(ax, (4.6, centre["MMA warp"]), (6.6, 4.35), color=COL["mma"])
    ax.text(5.3, 3.75, "issue", fontsize=8, color=COL["mma"], weight="bold")
    _arrow(ax, (8.25, 2.0), (8.25, 3.6))
    ax.text(8.4, 2.8, "operands", fontsize=7.5)
    ax.text(8.25, 5.35, "S and O go to Tensor Memory (right)", fontsize=7.5, ha="center")

    # right: Tensor Memory
    tx.text(3.8, 7.15, "Tensor Memory: 128 lanes x 512 columns of 32 bits (256 KiB)",
            fontsize=9, ha="center", weight="bold")
    scale = 9.4 / 512
    for c0, n, lab, col in TMEM_MAP:
        tx.add_patch(Rectangle((c0 * scale, 1.2), n * scale, 5.2, fc=col, ec=INK, lw=0.9, alpha=0.9))
        tx.text((c0 + n / 2) * scale, 3.8, lab, ha="center", va="center", fontsize=7.8, rotation=90)
        tx.text(c0 * scale, 0.9, f"{c0}", ha="center", fontsize=7.5)
    tx.text(512 * scale, 0.9, "512", ha="center", fontsize=7.5)
    tx.text(4.7, 0.4, "column", ha="center", fontsize=8)
    for k in range(5):
        yy = 6.4 - k * 1.3
        tx.plot([0, 9.4], [yy, yy], color=INK, lw=0.5, ls=":" if 0 < k < 4 else "-")
    for k in range(4):
        tx.text(-0.15, 6.4 - (k + 0.5) * 1.3, f"lanes {32 * k}-{32 * k + 31}\n(warp {k} of a\nwarpgroup)",
                fontsize=6.6, ha="right", va="center")

    # bottom: one MMA over a CTA pair
    px.text(0.2, 4.15, "cta_group::2 (FA4's choice for non-causal forwards): one tcgen05.mma of M = 256 spans "
            "the two SMs of a CTA pair;\neach SM holds its own 128 rows of Q and of the accumulators, and half of "
            "every K and V tile, which the MMA reads from both SMs (one Q stage shown)", fontsize=9.5, va="top", weight="bold")
    for k, x0 in enumerate((0.4, 10.4)):
        _box(px, x0, 0.3, 9.2, 2.8, "", "#fbfcfc", lw=1.0)
        px.text(x0 + 0.15, 2.88, f"SM {k} (CTA {k} of the pair)", fontsize=8.5, weight="bold", va="center")
        _box(px, x0 + 0.3, 0.55, 2.2, 2.0, f"Q rows\n{128 * k}-{128 * k + 127}\n(A: its own)", COL["q"], fs=8,
             tc="white")
        _box(px, x0 + 2.9, 1.6, 2.6, 0.95, f"K_j: keys {64 * k}-{64 * k + 63}\n(half of B)", COL["kv"], fs=7.8,
             tc="white")
        _box(px, x0 + 2.9, 0.55, 2.6, 0.95, f"V_j: columns {64 * k}-{64 * k + 63}\nof D (half of B)", "#48c9b0", fs=7.6)
        _box(px, x0 + 5.9, 0.55, 3.0, 2.0, f"TMEM: S and O\nof rows {128 * k}-{128 * k + 127}", "#aed6f1", fs=8)
    fig.text(0.01, -0.02, "From flash_fwd_sm100.py (Dao-AILab/flash-attention, commit 0251105a): warp ids, TMEM "
             "offsets, the 2-CTA tiler. TMEM size and tcgen05 semantics: PTX ISA, tcgen05 sections. A schematic.",
             fontsize=7.5, color="#444444")
    return _save(fig, "fa4_cta", out)


FIGURES = {f.__name__: f for f in (exp_cycle_budget, fa4_cta)}
