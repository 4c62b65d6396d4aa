"""Step 06 figure of the FlashAttention-3 ideas on mma.sync (ladder rung v5_warp_specialized.cu).

- ``sm80_ws_overlap``: top, one CTA of v5: a producer warp copies K_j and V_j with cp.async into a
  3-stage ring guarded by full/empty mbarriers; seven consumer warps own 16 rows of O_i each and
  never meet at a CTA-wide barrier. Bottom, one consumer warp's tile loop as two lanes of work
  (tensor cores, CUDA cores + special-function units), FA2 order against the overlapped order
  S_{j+1} = Q K_{j+1}^T ; softmax(S_j) ; O += P_j V_j. Schematic lengths, not a measurement.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws it too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402
COL = dict(hbm="#d9534f", prod="#f0ad4e", k="#16a085", v="#2e86c1", cons="#5cb85c", qk="#4a90d9",
           pv="#8e44ad", softmax="#f5b041", idle="#eeeeee", bar="#c0392b")


def _box(ax, x, y, w, h, text, color, fs=9, tc="black", lw=1.0, alpha=1.0):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=INK, lw=lw, alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def _arrow(ax, p, q, color=INK, lw=1.3, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=11, color=color, lw=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))


def _cta(ax):
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    ax.set_title("v5: one CTA = 1 producer warp + 7 consumer warps (8 warps: 255 registers each; a 9th would cut "
                 "every warp to 168)", fontsize=10)
    _box(ax, 0.1, 1.9, 1.5, 1.4, "HBM\nK, V", COL["hbm"], fs=9, tc="white")
    _box(ax, 2.2, 1.9, 1.9, 1.4, "producer\nwarp 7\ncp.async", COL["prod"], fs=9)
    _arrow(ax, (1.6, 2.6), (2.2, 2.6))
    for s in range(3):                                           # the ring: 3 stages of K and V
        x = 4.9 + 1.45 * s
        _box(ax, x, 3.0, 1.25, 0.75, f"K stage {s}", COL["k"], fs=8, tc="white")
        _box(ax, x, 1.55, 1.25, 0.75, f"V stage {s}", COL["v"], fs=8, tc="white")
        ax.text(x + 0.62, 3.95, "full / empty", ha="center", fontsize=7, color=COL["bar"])
        ax.text(x + 0.62, 1.25, "full / empty", ha="center", fontsize=7, color=COL["bar"])
    _arrow(ax, (4.1, 2.9), (4.9, 3.35))
    _arrow(ax, (4.1, 2.3), (4.9, 1.9))
    ax.text(6.95, 4.45, "shared memory (swizzled): Q_i + 3 x (K_j, V_j)", ha="center", fontsize=8)
    for w in range(7):                                          # consumer warps
        _box(ax, 9.6, 0.25 + 0.68 * w, 2.3, 0.55, f"warp {w}: O rows {16 * w}-{16 * w + 15}", COL["cons"], fs=7.5)
    _arrow(ax, (9.25, 3.35), (9.6, 3.1))
    _arrow(ax, (9.25, 1.9), (9.6, 2.2))
    ax.text(0.1, 0.55, "full[s]: the producer's 32 lanes arrive when their copies land (cp.async.mbarrier.arrive)\n"
                       "empty[s]: all 224 consumer threads arrive when done reading; the producer waits on it "
                       "before refilling s", fontsize=7.5, va="center", color=COL["bar"])


def _timeline(ax, y, segs, label):
    ax.text(-0.2, y + 0.3, label, ha="right", va="center", fontsize=8.5)
    for x0, w, kind, text in segs:
        _box(ax, x0, y, w, 0.6, text, COL[kind], fs=8, tc="white" if kind in ("qk", "pv") else "black")


def _loops(ax):
    ax.set_xlim(-3.2, 13.2)
    ax.set_ylim(-0.3, 4.6)
    ax.axis("off")
    ax.set_title("one consumer warp, tiles j = 0, 1, 2 (schematic lengths): FA2 order vs S_{j+1} issued before "
                 "softmax(S_j)", fontsize=10)
    qk, sm, pv = 1.0, 1.1, 1.0
    # FA2 order: QK_j, softmax_j, PV_j one after the other; tensor cores idle during the softmax
    t, tc, cc = 0.0, [], []
    for j in range(3):
        tc.append((t, qk, "qk", f"QK{j}"))
        t += qk
        cc.append((t, sm, "softmax", f"softmax {j}"))
        t += sm
        tc.append((t, pv, "pv", f"PV{j}"))
        t += pv
    ax.text(-3.1, 4.25, "FA2 order (v4)", fontsize=9, weight="bold")
    _timeline(ax, 3.35, tc, "tensor cores")
    _timeline(ax, 2.65, cc, "FMA + MUFU")
    # overlap: QK_{j+1} runs on the tensor cores while softmax_j runs on the CUDA cores
    t, tc, cc = 0.0, [(0.0, qk, "qk", "QK0")], []
    t = qk
    for j in range(3):
        if j + 1 < 3:
            tc.append((t, qk, "qk", f"QK{j + 1}"))
        cc.append((t, sm, "softmax", f"softmax {j}"))
        t += max(sm, qk if j + 1 < 3 else 0.0)
        tc.append((t, pv, "pv", f"PV{j}"))
        t += pv
    ax.text(-3.1, 1.65, "overlapped (v5)", fontsize=9, weight="bold")
    _timeline(ax, 0.75, tc, "tensor cores")
    _timeline(ax, 0.05, cc, "FMA + MUFU")
    ax.text(12.9, 0.4, "cost: a second S\nin registers", ha="right", fontsize=8, va="center")


def sm80_ws_overlap(out):
    fig, (a, b) = plt.subplots(2, 1, figsize=(11.5, 7.2), gridspec_kw={"height_ratios": [1.15, 1.0]})
    _cta(a)
    _loops(b)
    return _save(fig, "sm80_ws_overlap", out)


FIGURES = {"sm80_ws_overlap": sm80_ws_overlap}
