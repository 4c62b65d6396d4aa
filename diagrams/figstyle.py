"""What every figure of diagrams/ shares: the resolution, the ink colour, a blank drawing board and how
a figure is saved (white, cropped to its content, no software stamp: the same inputs give the same bytes)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110
INK = "#222222"


def blank(ax, xlim, ylim, equal=False):
    """``ax`` as a drawing board: no frame or ticks, x in ``xlim``, y in ``ylim``, equal units if ``equal``."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    if equal:
        ax.set_aspect("equal")
    ax.axis("off")
    return ax


def canvas(figsize, xlim, ylim, equal=False):
    """A figure of one :func:`blank` axes: (fig, ax)."""
    fig, ax = plt.subplots(figsize=figsize)
    return fig, blank(ax, xlim, ylim, equal)


def save(fig, name, out):
    """Write ``fig`` as ``out/name.png`` and close it; returns the path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name + ".png")
    fig.savefig(path, dpi=DPI, metadata={"Software": None}, facecolor="white", bbox_inches="tight",
                pad_inches=0.12)
    plt.close(fig)
    return path
