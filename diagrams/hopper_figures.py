"""Step 07 (Hopper) figures, and the warpgroup timeline model the second one is drawn from.

- ``hopper_pipeline``: tensor maps -> TMA (one producer thread) -> a shared-memory ring of K_j/V_j
  stages guarded by full/empty mbarriers -> WGMMA in two consumer warpgroups -> registers -> epilogue.
- ``warpgroup_pingpong``: timelines of the consumer warpgroups in the idealised model below, for
  v1 (no order between the warpgroups), v2 (ping-pong) and the intra-warpgroup overlap of v3.

The model (``schedule``, ``tensor_core_busy``): per key block a warpgroup runs GEMM0 (S = Q K_j^T),
GEMM1 (O += P V) and the softmax. The tensor cores are one shared resource that executes one WGMMA at
a time; each GEMM of one warpgroup (64 x 128 x 128) takes ``g``; the softmax of one warpgroup takes
``s`` on the CUDA cores and never waits for the other warpgroup's softmax. course/07 prints its
tensor-core utilisation for several s/g. It is a model, not a measurement.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402
COL = dict(hbm="#d9534f", smem="#5bc0de", reg="#5cb85c", prod="#f0ad4e", q="#8e44ad", k="#16a085",
           v="#2e86c1", gemm0="#4a90d9", gemm1="#8e44ad", softmax="#f5b041", idle="#eeeeee",
           bar="#c0392b")


# ----------------------------------------------------------------------------- the timeline model
def schedule(mode: str, n_iter: int = 5, g: float = 1.0, s: float = 1.0, load: float = 0.5, stages: int = 2):
    """Segments ``(row, start, length, kind, label)`` of ``n_iter`` key blocks.

    Turn k of a warpgroup issues GEMM0 of block k and GEMM1 of block k-1 back to back (the software
    pipeline of hopper_fa.cuh; turn 0 has GEMM0 only, turn n_iter GEMM1 only), then runs softmax k.
    A GEMM waits for its tile (K_k or V_{k-1}); the producer loads K0, V0, K1, ... each in ``load``,
    as soon as the warpgroups have released the ring slot (``stages`` deep) it goes into.
    mode: "lockstep" (v1: the warpgroups issue at the same time and the tensor cores interleave their
    WGMMAs, so both finish late), "pingpong" (v2: named barriers make them take turns), "overlap" (v3:
    ping-pong, and softmax k starts as soon as GEMM0 k is done, while GEMM1 k-1 still runs), and
    "single" / "single_overlap" (one warpgroup alone, without / with the intra-warpgroup overlap).
    Rows: ``("producer",)``, ``("wg", w, "mma")`` (WGMMAs of warpgroup w executing), ``("wg", w, "softmax")``.
    """
    n_wg = 1 if mode in ("single", "single_overlap") else 2
    overlap = mode in ("overlap", "single_overlap")
    segs, arrival, released = [], {}, {}  # released[(name, k)]: every warpgroup is done with that tile
    prod_free = 0.0

    def tile(name, k):  # arrival time of K_k / V_k, loading it (in producer order) if not yet loaded
        nonlocal prod_free
        if (name, k) not in arrival:
            t = max(prod_free, released.get((name, k - stages), 0.0))
            segs.append((("producer",), t, load, "load" + name, f"{name}{k}"))
            prod_free = arrival[(name, k)] = t + load
        return arrival[(name, k)]

    def done(name, k, t):
        released[(name, k)] = max(released.get((name, k), 0.0), t)

    ready = [0.0] * n_wg  # when warpgroup w may issue its next turn
    tc_free = 0.0         # when the tensor cores finish the last issued WGMMA
    for k in range(n_iter + 1):
        gemms = []
        if k > 0:
            tile("V", k - 1)
        if k < n_iter:
            gemms.append(("gemm0", f"QK{k}", "K", k))
            tile("K", k)
        if k > 0:
            gemms.append(("gemm1", f"PV{k - 1}", "V", k - 1))
        if mode == "lockstep":  # interleaved: each GEMM of each warpgroup takes n_wg * g
            t = max(ready)
            for kind, lab, name, kk in gemms:
                t = max(t, arrival[(name, kk)])
                for w in range(n_wg):
                    segs.append((("wg", w, "mma"), t, n_wg * g, kind, lab))
                t += n_wg * g
                done(name, kk, t)
            for w in range(n_wg):
                if k < n_iter:
                    segs.append((("wg", w, "softmax"), t, s, "softmax", f"softmax {k}"))
                ready[w] = t + (s if k < n_iter else 0.0)
            continue
        for w in range(n_wg):
            t = max(ready[w], tc_free)
            qk_done = t
            for kind, lab, name, kk in gemms:
                t = max(t, arrival[(name, kk)])
                segs.append((("wg", w, "mma"), t, g, kind, lab))
                t += g
                done(name, kk, t)
                if kind == "gemm0":
                    qk_done = t
            tc_free = t
            if k < n_iter:
                s0 = qk_done if overlap else t
                segs.append((("wg", w, "softmax"), s0, s, "softmax", f"softmax {k}"))
                ready[w] = max(t, s0 + s)
            else:
                ready[w] = t
    return segs


def tensor_core_busy(segs) -> float:
    """Fraction of the makespan during which the tensor cores execute a WGMMA."""
    mma = [(t, t + d) for row, t, d, kind, _ in segs if row[-1] == "mma"]
    end = max(t + d for _, t, d, _, _ in segs)
    # lockstep rows overlap in time (the same tensor cores, interleaved): take the union
    busy, cur_s, cur_e = 0.0, None, None
    for a, b in sorted(mma):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    busy += cur_e - cur_s
    return busy / end


# ----------------------------------------------------------------------------- drawing helpers
def _box(ax, x, y, w, h, text, color, fs=9, tc="black", alpha=1.0, lw=1.0, ec=INK, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=ec, lw=lw, alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc, weight=weight)


def _arrow(ax, p, q, color=INK, lw=1.4, ls="-", rad=0.0, ms=11):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=ms, color=color, lw=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))


def _barrier(ax, x, y, label, color):
    ax.add_patch(FancyBboxPatch((x, y), 0.62, 0.26, boxstyle="round,pad=0.02,rounding_size=0.12", fc=color,
                                ec=INK, lw=0.7))
    ax.text(x + 0.31, y + 0.13, label, ha="center", va="center", fontsize=6.3, color="white", weight="bold")


# ----------------------------------------------------------------------------- figure 1
def hopper_pipeline(out):
    """TMA -> smem ring with full/empty mbarriers -> WGMMA consumers -> registers -> epilogue."""
    fig, ax = plt.subplots(figsize=(13, 6.6))
    ax.set_xlim(0, 13.8)
    ax.set_ylim(-0.2, 7.4)
    ax.axis("off")

    # HBM
    ax.add_patch(Rectangle((0.1, 0.3), 2.1, 6.1, fc=COL["hbm"], alpha=0.16, ec=COL["hbm"]))
    ax.text(1.15, 6.1, "HBM", fontsize=11, weight="bold", color=COL["hbm"], ha="center")
    for i, (name, c) in enumerate((("q  [B, Hq, Sq, D]", COL["q"]), ("k  [B, Hkv, Skv, D]", COL["k"]),
                                   ("v  [B, Hkv, Skv, D]", COL["v"]))):
        _box(ax, 0.3, 5.0 - 0.85 * i, 1.7, 0.55, name, "white", fs=7.5, ec=c, lw=1.6)
    _box(ax, 0.3, 0.55, 1.7, 0.55, "o, lse", "white", fs=8, ec=COL["hbm"], lw=1.6)
    ax.text(1.15, 2.05, "tensor maps\n(cuTensorMapEncodeTiled,\nhost): dims, byte strides,\n"
            "box 64 cols x 128 rows,\nSWIZZLE_128B", ha="center", va="center", fontsize=7, family="monospace")

    # producer
    ax.add_patch(Rectangle((2.6, 3.0), 2.2, 3.4, fc=COL["prod"], alpha=0.18, ec=COL["prod"]))
    ax.text(3.7, 6.1, "producer", fontsize=10.5, weight="bold", ha="center", color="#a05a00")
    ax.text(3.7, 5.75, "warpgroup 0, setmaxnreg 40", fontsize=7.5, ha="center")
    ax.text(3.7, 4.55, "one thread:\n\nwait empty[s]\n(parity ^ 1)\nexpect_tx(full[s],\n   32 KB)\n"
            "cp.async.bulk\n  .tensor.4d x 2\n  (two 64-col panels)", ha="center", va="center", fontsize=7.4,
            family="monospace")
    _arrow(ax, (2.0, 5.27), (2.6, 5.0), color=COL["q"])
    _arrow(ax, (2.0, 4.42), (2.6, 4.5), color=COL["k"])
    _arrow(ax, (2.0, 3.57), (2.6, 4.0), color=COL["v"])

    # shared memory
    x0 = 5.3
    ax.add_patch(Rectangle((x0, 0.3), 3.2, 6.1, fc=COL["smem"], alpha=0.16, ec=COL["smem"]))
    ax.text(x0 + 1.6, 6.1, "shared memory (160 KB of 227)", fontsize=10, weight="bold", ha="center",
            color="#2a7f99")
    _box(ax, x0 + 0.2, 5.15, 2.0, 0.6, "Q_i  128 x 128\n(32 KB, loaded once per tile)", "white", fs=7, ec=COL["q"],
         lw=1.6)
    _barrier(ax, x0 + 2.35, 5.47, "full", COL["bar"])
    _barrier(ax, x0 + 2.35, 5.15, "empty", "#7f8c8d")
    for st in range(2):
        yk = 4.0 - 1.75 * st
        _box(ax, x0 + 0.2, yk, 2.0, 0.55, f"K stage {st}: K_j  128 x 128", "white", fs=7, ec=COL["k"], lw=1.6)
        _box(ax, x0 + 0.2, yk - 0.7, 2.0, 0.55, f"V stage {st}: V_j  128 x 128", "white", fs=7, ec=COL["v"], lw=1.6)
        for yy in (yk, yk - 0.7):
            _barrier(ax, x0 + 2.35, yy + 0.29, "full", COL["bar"])
            _barrier(ax, x0 + 2.35, yy - 0.01, "empty", "#7f8c8d")
    ax.text(x0 + 1.6, 0.55, "each tile: 2 panels of [rows x 64],\n128-byte swizzled, 1 KB aligned",
            ha="center", fontsize=7.3)
    for yy in (5.45, 4.27, 3.57, 2.52, 1.82):
        _arrow(ax, (4.8, min(max(yy, 3.2), 5.3)), (x0 + 0.2, yy), color="#a05a00", lw=1.0)

    # consumers
    x1 = 9.5
    for w in range(2):
        y = 3.55 - 2.5 * w
        ax.add_patch(Rectangle((x1, y), 4.0, 2.3, fc=COL["reg"], alpha=0.14, ec=COL["reg"]))
        ax.text(x1 + 2.0, y + 2.03, f"consumer warpgroup {w + 1}: rows {64 * w}..{64 * w + 63}, setmaxnreg 232",
                fontsize=7.8, weight="bold", ha="center", color="#2d6a2d")
        _box(ax, x1 + 0.15, y + 1.25, 1.75, 0.55, "S = Q K_j^T\nwgmma SS (desc, desc)", COL["gemm0"], fs=7,
             tc="white")
        _box(ax, x1 + 2.1, y + 1.25, 1.75, 0.55, "online softmax\nm, l, P in registers", COL["softmax"], fs=7)
        _box(ax, x1 + 2.1, y + 0.35, 1.75, 0.55, "P -> A fragment\n(cvt, no smem trip)", "#d5f5e3", fs=7)
        _box(ax, x1 + 0.15, y + 0.35, 1.75, 0.55, "O += P V_j\nwgmma RS (regs, desc)", COL["gemm1"], fs=7,
             tc="white")
        _arrow(ax, (x1 + 1.9, y + 1.52), (x1 + 2.1, y + 1.52), lw=1.0)
        _arrow(ax, (x1 + 2.97, y + 1.25), (x1 + 2.97, y + 0.9), lw=1.0)
        _arrow(ax, (x1 + 2.1, y + 0.62), (x1 + 1.9, y + 0.62), lw=1.0)
    # smem -> consumers (descriptors), consumers -> empty barriers (arrive)
    _arrow(ax, (x0 + 3.0, 4.6), (x1, 4.9), color="#2a7f99", lw=1.6)
    _arrow(ax, (x0 + 3.0, 3.0), (x1, 2.3), color="#2a7f99", lw=1.6)
    ax.text(x0 + 3.6, 3.75, "WGMMA\nreads\nsmem\nthrough\ndescriptors", fontsize=7, ha="center", va="center",
            color="#2a7f99")
    _arrow(ax, (x1 + 0.1, 0.9), (x0 + 3.0, 1.3), color="#7f8c8d", ls="--", lw=1.2)
    ax.text(x0 + 3.75, 0.62, "after wgmma wait:\narrive on empty[s]", fontsize=7, ha="center", color="#555555")
    _box(ax, x1 - 0.2, 6.1, 4.3, 0.5, "tile scheduler: which (Q_i, head, batch) next;\n"
         "persistent (v4): grid = #SMs, next tile from a global counter", "#fdfefe", fs=6.8, ec="#7f8c8d")
    # epilogue
    _box(ax, x1 + 0.4, -0.1, 3.2, 0.42, "epilogue: O / l, lse = m + log l  ->  HBM", "white", fs=7.5, ec=COL["hbm"],
         lw=1.4)
    _arrow(ax, (x1 + 0.4, 0.11), (2.0, 0.75), color=COL["hbm"], rad=-0.05)
    _arrow(ax, (x1 + 2.0, 1.05), (x1 + 2.0, 0.34), color=COL["hbm"], lw=1.2)

    ax.text(6.6, 7.15, "One CTA of the Hopper kernel: TMA fills a 2-stage K/V ring, two consumer warpgroups "
            "run WGMMA on it", ha="center", fontsize=11)
    ax.text(6.6, 6.82, "full[s]: 1 arrival (expect_tx) + 32 KB of TMA transactions;   empty[s]: 8 arrivals "
            "(one lane per consumer warp);   waits name the phase parity", ha="center", fontsize=8,
            color="#555555")
    return _save(fig, "hopper_pipeline", out)


# ----------------------------------------------------------------------------- figure 2
def _timeline_panel(ax, segs, rows, title, g, xmax, busy):
    ys = {}
    for i, (row, label) in enumerate(rows):
        ys[row] = len(rows) - 1 - i
        ax.text(-0.15, ys[row] + 0.4, label, ha="right", va="center", fontsize=8)
    colors = dict(gemm0=COL["gemm0"], gemm1=COL["gemm1"], softmax=COL["softmax"], loadK=COL["k"], loadV=COL["v"])
    for row, t, d, kind, lab in segs:
        if row not in ys or t >= xmax:
            continue
        wide = d > 1.01 * g and kind != "softmax"  # a stretched (interleaved) GEMM
        d = min(d, xmax - t)
        ax.add_patch(Rectangle((t, ys[row] + 0.08), d, 0.64, fc=colors[kind], ec="white", lw=1.2,
                               alpha=0.55 if wide else 0.95, hatch="//" if wide else None))
        ax.text(t + d / 2, ys[row] + 0.4, lab, ha="center", va="center", fontsize=7,
                color="black" if kind == "softmax" or wide else "white")
    # the tensor cores: busy where any warpgroup's WGMMA runs
    if ("tc",) in ys:
        for row, t, d, kind, _ in segs:
            if row[-1] == "mma" and t < xmax:
                ax.add_patch(Rectangle((t, ys[("tc",)] + 0.2), min(d, xmax - t), 0.4, fc="#555555", ec="none"))
        ax.add_patch(Rectangle((0, ys[("tc",)] + 0.2), xmax, 0.4, fc="none", ec="#555555", lw=0.6))
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.15, len(rows))
    ax.set_yticks([])
    for sp in ("left", "right", "top"):
        ax.spines[sp].set_visible(False)
    ax.set_title(f"{title}   [model, long run: tensor cores busy {100 * busy:.0f}%]", fontsize=9.5, loc="left")


def warpgroup_pingpong(out):
    """Consumer warpgroup timelines: v1 (no order), v2 (ping-pong), intra-warpgroup overlap (v3)."""
    g, s, n, xmax, load = 1.0, 1.5, 5, 23.0, 0.5
    two = [(("producer",), "producer (TMA)"), (("wg", 0, "mma"), "WG1 WGMMA"), (("wg", 0, "softmax"), "WG1 softmax"),
           (("wg", 1, "mma"), "WG2 WGMMA"), (("wg", 1, "softmax"), "WG2 softmax"), (("tc",), "tensor cores")]
    one = [(("producer",), "producer (TMA)"), (("wg", 0, "mma"), "WGMMA"), (("wg", 0, "softmax"), "softmax"), (("tc",), "tensor cores")]
    fig, axes = plt.subplots(4, 1, figsize=(13, 11.6), gridspec_kw=dict(height_ratios=[6, 6, 4, 4]))
    panels = [("lockstep", two, "v1: both consumer warpgroups issue together; the tensor cores interleave their "
                                "WGMMAs (hatched), then both sit in softmax"),
              ("pingpong", two, "v2 ping-pong: WG1's bar.arrive (red) lets WG2 issue; WG2's GEMMs run under WG1's "
                                "softmax"),
              ("single", one, "one warpgroup, no overlap: softmax k waits for QK k and PV k-1"),
              ("single_overlap", one, "one warpgroup, intra-warpgroup overlap (v3): softmax k starts when QK k is "
                                      "done, PV k-1 still in flight")]
    for ax, (mode, rows, title) in zip(axes, panels):
        busy = tensor_core_busy(schedule(mode, 64, g, s))
        _timeline_panel(ax, schedule(mode, n, g, s), rows, title, g, xmax, busy)
    axes[3].set_xlabel("time, in units of one 64 x 128 x 128 WGMMA chain of one warpgroup", fontsize=8.5)
    # the ping-pong hand-over: bar.sync before a turn, bar.arrive for the other warpgroup after it
    for row, t, d, kind, lab in schedule("pingpong", n, g, s):
        if row == ("wg", 0, "mma") and kind == "gemm1" and t + d < xmax:
            axes[1].annotate("", xy=(t + d, 2.75), xytext=(t + d, 4.1),
                             arrowprops=dict(arrowstyle="-|>", color=COL["bar"], lw=1.0, ls="--"))
    fig.suptitle("Model of one CTA's warpgroups: QK and PV = 1 unit each, softmax = "
                 f"{s:g} units, one WGMMA at a time on the tensor cores\n"
                 "blue QK, purple PV, orange softmax; producer: green K_j and blue V_j loads "
                 f"({load:g} units each) into a 2-stage ring", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return _save(fig, "warpgroup_pingpong", out)


FIGURES = {f.__name__: f for f in (hopper_pipeline, warpgroup_pingpong)}
