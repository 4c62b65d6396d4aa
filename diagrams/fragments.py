"""Fragment layouts of mma.sync m16n8k16 and ldmatrix (step 06), as index functions and figures.

The index functions restate the PTX ISA tables ("Matrix Fragments for mma.m16n8k16 with floating
point type"; "ldmatrix"): tests/test_cuda_step06.py uses them to emulate a warp on the CPU, and the
figures below draw them. FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py.

Drawn by `python diagrams/draw.py` with the course's other figures.
"""
from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:                        # figstyle beside this file, also when a test imports it
    sys.path.insert(0, HERE)
from figstyle import blank, canvas  # noqa: E402

DPI = 110


# ----------------------------------------------------------------------------- index functions
def a_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of element a_i (i = 0..7; register i // 2) of the 16x16 A fragment of `lane`."""
    g, t = lane >> 2, lane & 3
    row = g + 8 * ((i >> 1) & 1)
    col = 2 * t + (i & 1) + 8 * (i >> 2)
    return row, col


def b_coords(lane: int, i: int) -> tuple[int, int]:
    """(row k, col n) of element b_i (i = 0..3; register i // 2) of the 16x8 B fragment."""
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + 8 * (i >> 1), g


def c_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of accumulator element c_i (i = 0..3) of the 16x8 C/D fragment."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def ldmatrix_coords(lane: int, j: int, trans: bool = False) -> tuple[int, int]:
    """(row, col) inside an 8x8 matrix of the j-th 16-bit value (j = 0, 1) a lane receives."""
    if trans:
        return 2 * (lane & 3) + j, lane >> 2
    return lane >> 2, 2 * (lane & 3) + j


# ----------------------------------------------------------------------------- drawing
LANE_COLORS = plt.get_cmap("tab20").colors


def _grid(ax, rows, cols, label_fn, title, x0=0.0, y0=0.0, cell=1.0, reg_fn=None):
    for r in range(rows):
        for c in range(cols):
            lane, text = label_fn(r, c)
            fc = LANE_COLORS[lane % 8 * 2 + (lane // 8) % 2] if lane is not None else "white"
            ax.add_patch(Rectangle((x0 + c * cell, y0 + (rows - 1 - r) * cell), cell, cell, fc=fc,
                                   ec="#333333", lw=0.4, alpha=0.85))
            ax.text(x0 + (c + 0.5) * cell, y0 + (rows - 0.5 - r) * cell, text, ha="center",
                    va="center", fontsize=5.2)
    ax.text(x0 + cols * cell / 2, y0 + rows * cell + 0.5, title, ha="center", va="bottom", fontsize=9)


def _owner_maps():
    a, b, c = {}, {}, {}
    for lane in range(32):
        for i in range(8):
            a[a_coords(lane, i)] = (lane, i)
        for i in range(4):
            b[b_coords(lane, i)] = (lane, i)
            c[c_coords(lane, i)] = (lane, i)
    return a, b, c


def mma_m16n8k16_fragments(out):
    """Which lane holds which element of A (16x16), B (16x8) and C (16x8) for mma m16n8k16."""
    a, b, c = _owner_maps()
    fig, ax = canvas((13, 6.2), (-0.5, 36.5), (-3.2, 17.8), equal=True)
    _grid(ax, 16, 16, lambda r, col: (a[(r, col)][0], f"T{a[(r, col)][0]}\na{a[(r, col)][1]}"),
          "A  (16 x 16, row-major): a0..a7 in 4 registers", 0, 0)
    _grid(ax, 16, 8, lambda r, col: (b[(r, col)][0], f"T{b[(r, col)][0]}\nb{b[(r, col)][1]}"),
          "B  (16 x 8, k x n): b0..b3 in 2 registers", 18, 0)
    _grid(ax, 16, 8, lambda r, col: (c[(r, col)][0], f"T{c[(r, col)][0]}\nc{c[(r, col)][1]}"),
          "C / D  (16 x 8, fp32): c0..c3", 28, 0)
    ax.text(18, -1.4, "lane = threadIdx.x % 32,  g = lane / 4,  t = lane % 4.   "
            "A: a0,a1 = A[g][2t..2t+1]; a2,a3 = A[g+8][..]; a4..a7: columns + 8.   "
            "B: b0,b1 = B[2t..2t+1][g]; b2,b3: rows + 8.   C: c0,c1 = C[g][2t..2t+1]; c2,c3 = C[g+8][..]",
            ha="center", fontsize=8)
    ax.text(18, -2.6, "The C fragment of S = Q K^T for keys 16kk..16kk+15 (two n-blocks) has exactly the "
            "layout of the A fragment of P for k-step kk: P never leaves the registers.",
            ha="center", fontsize=8.5, color="#8b0000")
    return _save(fig, "mma_m16n8k16_fragments", out)


def ldmatrix_x4(out):
    """ldmatrix.x4 (and .trans): which lanes give row addresses and what each lane receives."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4))
    for ax, trans in zip(axes, (False, True)):
        blank(ax, (-1.5, 18), (-0.5, 19.5), equal=True)
        owner = {}
        for lane in range(32):
            for j in range(2):
                owner[ldmatrix_coords(lane, j, trans)] = lane
        for m in range(4):
            x0, y0 = (m // 2) * 9.5, (1 - m % 2) * 9.5
            _grid(ax, 8, 8, lambda r, col: (owner[(r, col)], f"T{owner[(r, col)]}"),
                  f"matrix {m}: rows addressed by lanes {8 * m}..{8 * m + 7} -> register {m}", x0, y0)
            for r in range(8):
                ax.text(x0 - 0.2, y0 + 7.5 - r, f"L{8 * m + r}", ha="right", va="center", fontsize=5.5)
        ax.set_title("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") +
                     ("\nlane L receives row L/4, columns 2(L%4), 2(L%4)+1" if not trans else
                      "\nlane L receives column L/4, rows 2(L%4), 2(L%4)+1 (a B fragment of row-major V)"),
                     fontsize=9)
    fig.tight_layout()
    return _save(fig, "ldmatrix_x4", out)


def swizzle_banks(out):
    """Padding-free XOR swizzle: chunk c of row r is stored at chunk c ^ (r % 8)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, swz in zip(axes, (False, True)):
        blank(ax, (-0.2, 8.2), (-1, 8.2), equal=True)
        for r in range(8):
            for c in range(8):
                phys = c ^ r if swz else c
                hit = c == 0
                ax.add_patch(Rectangle((phys, 7 - r), 1, 1, fc="#d62728" if hit else "#eeeeee", ec="#333333",
                                       lw=0.5))
                ax.text(phys + 0.5, 7.5 - r, f"r{r}c{c}", ha="center", va="center", fontsize=6)
        ax.set_title(("XOR swizzle: chunk c -> c ^ (row % 8)\n8 rows of chunk 0 hit 8 different bank groups"
                      if swz else "row-major, 256-byte rows\nldmatrix of chunk 0: 8 rows, same 4 banks (8-way conflict)"),
                     fontsize=9)
        ax.text(4, -0.6, "16-byte chunk position within a 128-byte line (4 banks each)", ha="center", fontsize=8)
    fig.tight_layout()
    return _save(fig, "swizzle_banks", out)


def _save(fig, name, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return path


FIGURES = {f.__name__: f for f in (mma_m16n8k16_fragments, ldmatrix_x4, swizzle_banks)}
