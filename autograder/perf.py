"""Performance grading for the hidden perf cells (steps 05-07). Grading-only: not shipped.

A perf cell ends with ``perf_points(fn, step, config, points)``: nbgrader reads the number the
cell returns as its partial credit. Without a GPU the cell says so and scores 0.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

THRESHOLDS = Path(__file__).resolve().parent / "thresholds.toml"


def thresholds(step: str, path: Path = THRESHOLDS) -> dict:
    data = tomllib.loads(path.read_text())
    try:
        return data["steps"][step]
    except KeyError:
        raise KeyError(f"no thresholds for step {step!r} in {path}") from None


def points_for(ratio: float, t: dict, points: float) -> float:
    """All points at ``target``, half at ``min``, none below."""
    if ratio >= t["target"]:
        return float(points)
    if ratio >= t["min"]:
        return points / 2
    return 0.0


def perf_points(fn, step: str, config: str = "large", points: float = 2, dtype=None) -> float:
    import torch

    from facourse import bench_attention, has_gpu

    if not has_gpu():
        print(f"No GPU here: performance ({config}) is graded on a GPU machine; this cell scores 0.")
        return 0.0
    t = thresholds(step)
    res = bench_attention(fn, config, backend=t["reference"], dtype=dtype or torch.float16)
    got = points_for(res.ratio, t, points)
    print(res.summary())
    print(f"thresholds: min {t['min']} (half the points), target {t['target']} (all): "
          f"{got:g} of {points:g} points")
    return got
