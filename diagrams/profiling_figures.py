"""Step 13 figures: the course's kernels under Nsight Compute (course/13_profiling).

Every figure is drawn from the committed Nsight Compute run, ``course/results/measured.json``'s "13_ncu"
(``facourse.profiling.load_run``: benchmarks/counters.py's records, copied there by benchmarks/tables.py), and
shows whichever targets that run holds. Without it the committed figures are kept (each function returns None).
"The main kernel" of a target is its longest one (a split-KV decode also launches a short merge; step 01's
attention launches a dozen kernels).

- ``measured_roofline``: left, the measured roofline (Williams, Waterman and Patterson, "Roofline: an
  insightful visual performance model", CACM 2009): the memory roof (the run's copy: 2 x 1 GiB over its
  duration) and the compute roof (the run's fp16 GEMM: 2 x 8192^3 FLOPs over its duration), both profiled at
  ncu's locked base clocks; each kernel that carries the course's count of useful FLOPs ("work": its target's
  only kernel, or its only tensor-core kernel) at intensity = work / DRAM bytes and attained = work /
  duration, its DRAM bytes ncu's ``dram__bytes.sum.per_second`` times ``gpu__time_duration.sum``. Right, the share of the
  tensor cores' executed FLOPs (``sm__ops_path_tensor_src_fp16.sum``) that the course counts as useful.
- ``occupancy_limits``: per target's main kernel, the blocks per SM each resource allows as ncu reported them
  (``launch__occupancy_limit_registers``, ``_shared_mem``, ``_warps``, ``_blocks``), the smallest framed;
  beside them ncu's theoretical occupancy (``sm__maximum_warps_per_active_cycle_pct``) and the achieved one
  (``sm__warps_active.avg.pct_of_peak_sustained_active``).
- ``stall_reasons``: for a few main kernels, the cycles a warp spends between two of its issued instructions,
  split by what it waited for (``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``; the
  reasons sum to ncu's "warp cycles per issued instruction"; ``selected`` is the issue cycle itself).

Sources: NVIDIA's Nsight Compute Kernel Profiling Guide (metric names, the Occupancy, Speed of Light and
Warp State Statistics sections, the stall reasons); Williams, Waterman and Patterson (2009).

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITS = ("registers", "shared_mem", "warps", "blocks")
STALL = "smsp__average_warps_issue_stalled_"
STALL_END = "_per_issue_active.ratio"
#: colour by step ("cal": the calibration copy and GEMM; "sdpa": PyTorch's FlashAttention-2 and cuDNN backends)
STEP_COLOR = {"cal": "#888888", "01": "#8d6e63", "05": "#4a90d9", "06": "#16a085", "07": "#8e44ad",
              "08": "#e67e22", "09": "#c0392b", "sdpa": "#222222"}
#: the kernels whose stalls are compared, when the run has them: step 05's first and last rungs, step 06's
#: tensor-core rung before and after its swizzle, the Hopper forward and backward, decode without and with its
#: tuning, the references
STALL_TARGETS = ("05_v2", "05_v6", "06_v2", "06_v4", "07_v14", "08_v4", "09_v1", "09_v4", "sdpa_flash", "sdpa_cudnn")
#: the reasons drawn in colour (the rest are summed into "other"): the ones lecture 13 explains
REASONS = {"selected": "#bbbbbb", "not_selected": "#dddddd", "long_scoreboard": "#d9534f", "barrier": "#f0ad4e",
           "wait": "#5bc0de", "short_scoreboard": "#16a085", "mio_throttle": "#5cb85c",
           "math_pipe_throttle": "#8e44ad", "gmma": "#4a90d9", "dispatch_stall": "#c39bd3"}
OTHER = "#f4f4f4"


def load():
    """The committed run (facourse.profiling.load_run), or None without one."""
    try:
        from facourse.profiling import load_run
    except ImportError:                  # run from a checkout without the package installed
        sys.path.insert(0, os.path.join(HERE, "..", "src"))
        from facourse.profiling import load_run
    try:
        return load_run()
    except FileNotFoundError:
        return None


def main_kernels(run: dict) -> list[dict]:
    """Each target's longest kernel, in the run's order."""
    best: dict = {}
    for k in run["kernels"]:
        t = k["target"]
        if t not in best or k["gpu__time_duration.sum"] > best[t]["gpu__time_duration.sum"]:
            best[t] = k
    return list(best.values())


def _label(k: dict, width: int = 22) -> str:
    name = k["Kernel Name"].removeprefix("void ").replace("<unnamed>::", "").split("<")[0].split("(")[0]
    return f"{k['target']}  {name[:width]}"


def _color(k: dict) -> str:
    return STEP_COLOR.get(k["step"], INK)


def _missing(name: str):
    print(f"{name}: course/results/measured.json has no \"13_ncu\"; the committed figure is kept")
    return None


# ----------------------------------------------------------------------------- the measured roofline
def measured_roofline(out):
    run = load()
    if run is None:
        return _missing("measured_roofline")
    pi, beta = run["roofs"]["tflops"] * 1e12, run["roofs"]["gbps"] * 1e9     # FLOP/s, bytes/s
    pts = []
    for k in run["kernels"]:
        if not k.get("work"):
            continue
        s = k["gpu__time_duration.sum"] * 1e-9
        moved = k["dram__bytes.sum.per_second"] * s
        ops = k.get("sm__ops_path_tensor_src_fp16.sum") or 0
        pts.append(dict(k=k, x=k["work"] / moved if moved else math.inf, y=k["work"] / s / 1e12,
                        useful=k["work"] / ops if ops else None))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.8, 5.2), gridspec_kw=dict(width_ratios=[1.55, 1], wspace=0.5))
    xs = [p["x"] for p in pts if math.isfinite(p["x"])]
    lo, hi = 10 ** math.floor(math.log10(min(xs + [1.0]) / 2)), 10 ** math.ceil(math.log10(max(xs + [1e3]) * 3))
    grid = [lo * (hi / lo) ** (i / 400) for i in range(401)]
    ax.plot(grid, [min(pi, x * beta) / 1e12 for x in grid], color=INK, lw=2)
    ridge = pi / beta
    ax.axvline(ridge, color="#999999", lw=0.8, ls=":")
    ax.text(ridge * 1.08, pi / 1e12 * 0.035, f"ridge\n{ridge:.0f} FLOP/byte", fontsize=8, color="#555555")
    ax.text(ridge / 1.15, pi / 1e12 * 1.12, f"GEMM: {run['roofs']['tflops']:.0f} TFLOP/s", ha="right", fontsize=8.5)
    # labels in a column right of their points, one above the other where points crowd (log y, `gap` apart),
    # then each crowded column moved down as a whole if its top label would leave the axes
    top = math.log10(pi / 1e12 * 2.2) - 0.06
    labels = []                                          # [point, log x, log y of its label]
    gap = 0.1
    for p in sorted(pts, key=lambda p: p["y"]):
        k = p["k"]
        gemm = k["target"] == "gemm"
        ax.plot(p["x"], p["y"], "s" if gemm else "o", ms=7, color=_color(k), mec="white", mew=0.8, zorder=3)
        if gemm:
            ax.annotate("GEMM", (p["x"], p["y"]), xytext=(p["x"] / 1.5, p["y"] * 1.15), fontsize=7.5,
                        ha="right", color=_color(k))
            continue
        lx, ly = math.log10(p["x"]), math.log10(p["y"])
        for q in sorted(labels, key=lambda q: q[2]):
            if abs(lx - q[1]) < 0.45 and abs(ly - q[2]) < gap:
                ly = q[2] + gap
        labels.append([p, lx, ly])
    for q in labels:
        column = [r for r in labels if abs(r[1] - q[1]) < 0.45]
        over = max(r[2] for r in column) - top
        if over > 0:
            for r in column:
                r[2] -= over
    for p, _, ly in labels:
        ax.annotate(p["k"]["target"], (p["x"], p["y"]), xytext=(p["x"] * 2.0, 10 ** ly), fontsize=7.5,
                    va="center", color=_color(p["k"]), bbox=dict(fc="white", ec="none", pad=0.2, alpha=0.85),
                    arrowprops=dict(arrowstyle="-", color="#bbbbbb", lw=0.5, shrinkA=0, shrinkB=3))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min([p["y"] for p in pts] + [pi / 1e12]) / 4, pi / 1e12 * 2.2)
    xc = ridge / 6                                       # the memory roof's label, under it, along its slope
    (x0, y0), (x1, y1) = ax.transData.transform([(xc, xc * beta / 1e12), (xc * 10, xc * 10 * beta / 1e12)])
    ax.text(xc, xc * beta / 1e12 / 1.6, f"copy: {run['roofs']['gbps']:.0f} GB/s", fontsize=8.5, ha="center",
            va="top", rotation=math.degrees(math.atan2(y1 - y0, x1 - x0)), rotation_mode="anchor")
    ax.set_xlabel("intensity: useful FLOPs per byte of DRAM traffic (ncu's dram__bytes)")
    ax.set_ylabel("useful TFLOP/s (the course's FLOP count / ncu's duration)")
    ax.set_title(f"measured roofline, {run['env']['gpu']}, clocks locked to base by ncu", fontsize=10)
    ax.grid(True, which="major", color="#eeeeee", lw=0.6)
    # useful share
    rows = [p for p in pts if p["useful"] is not None]
    for i, p in enumerate(rows):
        bx.barh(i, p["useful"], color=_color(p["k"]), height=0.65)
        bx.text(p["useful"] + 0.01, i, f"{p['useful']:.2f}", va="center", fontsize=8)
    bx.set_yticks(range(len(rows)), [_label(p["k"], 16) for p in rows], fontsize=7.5)
    bx.invert_yaxis()
    bx.set_xlim(0, 1.15)
    bx.axvline(1.0, color="#999999", lw=0.8, ls=":")
    bx.set_xlabel("useful share: the course's FLOPs / the tensor cores' executed FLOPs\n"
                  "(sm__ops_path_tensor_src_fp16.sum: masked and padded tiles count too)", fontsize=8.5)
    bx.set_title("how much of the tensor cores' work was useful", fontsize=10)
    for s in ("top", "right"):
        bx.spines[s].set_visible(False)
    fig.text(0.01, -0.1, f"{run['source']} (ncu {run['profile']['tool'].split('(')[0].split()[-1]}, "
             f"{run['env']['date']}). A point above the memory roof reads DRAM faster than the copy moved its "
             "useful bytes (a copy both reads and writes).\nKernels without the course's FLOP count (one of "
             "several kernels of a target, unless its only tensor-core one) are not drawn; the right panel only "
             "has tensor-core kernels.", fontsize=7.5, color="#444444")
    return _save(fig, "measured_roofline", out)


# ----------------------------------------------------------------------------- occupancy
def occupancy_limits(out):
    run = load()
    if run is None:
        return _missing("occupancy_limits")
    ks = main_kernels(run)
    n = len(ks)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 0.34 * n + 1.9), sharey=True,
                                 gridspec_kw=dict(width_ratios=[1.0, 1.1], wspace=0.05))
    for i, k in enumerate(ks):
        lim = [int(k[f"launch__occupancy_limit_{x}"]) for x in LIMITS]
        for j, v in enumerate(lim):
            bind = v == min(lim)
            ax.add_patch(Rectangle((j - 0.46, i - 0.42), 0.92, 0.84, fc="#f5b041" if bind else "#f4f4f4",
                                   ec=INK if bind else "white", lw=1.2 if bind else 0.5))
            ax.text(j, i, str(v), ha="center", va="center", fontsize=8.5, weight="bold" if bind else "normal")
        smem = (k["launch__shared_mem_per_block_static"] + k["launch__shared_mem_per_block_dynamic"]) / 1024
        ax.text(4.0, i, f"{k['launch__registers_per_thread']:>3} regs  {k['launch__block_size']:>4} thr  "
                f"{smem:5.1f} KB", va="center", fontsize=7.3, family="monospace", color="#444444")
        theo = k["sm__maximum_warps_per_active_cycle_pct"]
        ach = k["sm__warps_active.avg.pct_of_peak_sustained_active"]
        bx.barh(i - 0.18, theo, height=0.34, color="#4a90d9")
        bx.barh(i + 0.18, ach, height=0.34, color="#16a085")
        bx.text(max(theo, ach) + 1, i, f"{theo:.0f} / {ach:.0f}", va="center", fontsize=7.5)
    ax.set_xlim(-0.55, 6.9)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xticks(range(4), ["registers", "shared\nmemory", "warps", "blocks"], fontsize=8.5)
    ax.xaxis.tick_top()
    ax.set_yticks(range(n), [_label(k) for k in ks], fontsize=7.8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title("blocks per SM each resource allows (ncu's launch__occupancy_limit_*);\n"
                 "framed: the smallest, which sets the occupancy", fontsize=9.5, pad=30)
    bx.set_xlim(0, 118)
    bx.set_xlabel("% of the SM's 64 warp slots", fontsize=8.5)
    bx.legend(handles=[Patch(color="#4a90d9", label="theoretical (sm__maximum_warps_per_active_cycle_pct)"),
                       Patch(color="#16a085", label="achieved (sm__warps_active.avg.pct_of_peak_sustained_active)")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7.5, frameon=False, ncol=1)
    bx.set_title("occupancy: theoretical / achieved", fontsize=9.5, pad=34)
    for s in ("top", "right", "left"):
        bx.spines[s].set_visible(False)
    bx.tick_params(axis="y", length=0)
    fig.text(0.01, 0.0, f"{run['env']['gpu']}, {run['env']['date']}; each target's longest kernel "
             "(registers a thread, threads a block, static + dynamic shared memory a block).",
             fontsize=7.5, color="#444444")
    return _save(fig, "occupancy_limits", out)


# ----------------------------------------------------------------------------- warp stalls
def stall_reasons(out):
    run = load()
    if run is None:
        return _missing("stall_reasons")
    by = {k["target"]: k for k in main_kernels(run)}
    ks = [by[t] for t in STALL_TARGETS if t in by]
    fig, ax = plt.subplots(figsize=(11.5, 0.42 * len(ks) + 1.9))
    top = max(sum(v for n, v in k.items() if n.startswith(STALL) and n.endswith(STALL_END)) for k in ks)
    for i, k in enumerate(ks):
        st = {n[len(STALL):-len(STALL_END)]: v for n, v in k.items() if n.startswith(STALL) and n.endswith(STALL_END)}
        x = 0.0
        for r, c in REASONS.items():
            v = st.get(r, 0.0)
            ax.barh(i, v, left=x, color=c, height=0.66, ec="white", lw=0.4)
            if v >= max(0.45, 0.035 * top):              # a number only where it fits
                ax.text(x + v / 2, i, f"{v:.1f}", ha="center", va="center", fontsize=7,
                        color="white" if r in ("long_scoreboard", "math_pipe_throttle", "gmma", "barrier") else INK)
            x += v
        rest = sum(v for r, v in st.items() if r not in REASONS)
        ax.barh(i, rest, left=x, color=OTHER, height=0.66, ec="#cccccc", lw=0.4)
        x += rest
        ax.text(x + 0.1, i, f"{x:.1f} cycles; {k['smsp__warps_active.avg.per_cycle_active']:.1f} warps active, "
                f"issuing {k['smsp__issue_active.avg.pct_of_peak_sustained_active']:.0f}% of cycles", va="center",
                fontsize=7.3, color="#444444")
    ax.set_yticks(range(len(ks)), [_label(k) for k in ks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.6)
    ax.set_xlabel("cycles a warp spends per issued instruction, by reason "
                  "(smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio; per scheduler)", fontsize=8.5)
    ax.legend(handles=[Patch(fc=c, ec="#cccccc", label=r) for r, c in list(REASONS.items()) + [("other", OTHER)]],
              ncol=6, fontsize=7.5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.text(0.01, -0.05, f"{run['env']['gpu']}, {run['env']['date']}; each target's longest kernel. The bar's "
             "length is ncu's warp cycles per issued instruction; 'selected' is the issuing cycle itself (1).",
             fontsize=7.5, color="#444444")
    return _save(fig, "stall_reasons", out)


FIGURES = {f.__name__: f for f in (measured_roofline, occupancy_limits, stall_reasons)}
