"""diagrams/: every figure a notebook references exists, and draw.py is deterministic."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIAGRAMS = os.path.join(ROOT, "diagrams")
DRAW = os.path.join(DIAGRAMS, "draw.py")
REF = re.compile(r"\.\./diagrams/([A-Za-z0-9_.\-]+\.png)")
CHEAP = "gqa_heads"  # a figure with no data, quick to draw


def _notebooks():
    pats = ["course/*.ipynb", "solutions/**/*.ipynb"]
    return sorted({p for pat in pats for p in glob.glob(os.path.join(ROOT, pat), recursive=True)})


def _referenced():
    refs = {}
    for nb in _notebooks():
        with open(nb, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
        for c in cells:
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for name in REF.findall(src):
                refs.setdefault(name, []).append(os.path.relpath(nb, ROOT))
    return refs


def test_referenced_figures_exist():
    refs = _referenced()
    missing = {n: nbs for n, nbs in refs.items() if not os.path.isfile(os.path.join(DIAGRAMS, n))}
    assert not missing, f"notebooks reference figures that diagrams/ lacks: {missing}"


def test_every_figure_drawn_and_small():
    out = subprocess.run([sys.executable, DRAW, "--list"], capture_output=True, text=True, check=True)
    names = out.stdout.split()
    assert len(names) >= 8
    for n in names:
        p = os.path.join(DIAGRAMS, n + ".png")
        assert os.path.isfile(p), f"{n}.png is not committed: run python diagrams/draw.py {n}"
        assert os.path.getsize(p) < 256_000, f"{n}.png is over 250 KB"


def test_draw_is_deterministic(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        subprocess.run([sys.executable, DRAW, CHEAP, "--out", str(d)], check=True, capture_output=True)
    bytes_a = (a / f"{CHEAP}.png").read_bytes()
    assert bytes_a == (b / f"{CHEAP}.png").read_bytes(), "two runs of draw.py gave different bytes"
    # against the committed file: pixels (a different matplotlib may encode the PNG differently)
    new = mpimg.imread(a / f"{CHEAP}.png")
    old = mpimg.imread(os.path.join(DIAGRAMS, f"{CHEAP}.png"))
    assert new.shape == old.shape, f"{CHEAP}.png changed size {old.shape} -> {new.shape}: redraw and commit"
    diff = float(np.abs(new.astype(np.float32) - old.astype(np.float32)).mean())
    assert diff < 0.01, f"{CHEAP}.png differs from the committed one (mean |diff| {diff:.4f}): redraw and commit"
