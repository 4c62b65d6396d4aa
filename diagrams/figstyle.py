"""What every figure of diagrams/ shares: the resolution, the ink colour and how a figure is saved
(white, cropped to its content, no software stamp: the same inputs give the same bytes)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110
INK = "#222222"


def save(fig, name, out):
    """Write ``fig`` as ``out/name.png`` and close it; returns the path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name + ".png")
    fig.savefig(path, dpi=DPI, metadata={"Software": None}, facecolor="white", bbox_inches="tight",
                pad_inches=0.12)
    plt.close(fig)
    return path
