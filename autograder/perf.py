"""Performance grading for the hidden perf cells (steps 05-07). Grading-only: not shipped.

A perf cell ends with ``perf_points(fn, step, config, points)``: nbgrader reads the number the
cell returns as its partial credit. The function

1. checks the result on ``config`` at full size first (a wrong kernel earns no perf points);
2. times student and reference with ``facourse.bench_attention`` (same process, same inputs);
3. refuses a time faster than the GPU can compute (``guards.roofline_verdict``): 0 points;
4. awards half the points at the ``min`` ratio of thresholds.toml, all at ``target``;
5. prints one machine-readable line, ``FACOURSE_PERF {json}``, with the numbers, the reference
   backend and the machine (GPU, driver, torch, Triton, CUDA, cuDNN); the grading report
   collects these lines from the autograded notebook.

Without a GPU the cell says so, prints the line with ``status: "no GPU"`` and scores 0; so does
a GPU other than the one the step's kernel is built for (``capability=(9, 0)`` for step 07's sm_90a
kernel: ``status: "wrong GPU"``).
"""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tomllib
from pathlib import Path

THRESHOLDS = Path(__file__).resolve().parent / "thresholds.toml"
PERF_TAG = "FACOURSE_PERF "


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


def _driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
        return out.strip().splitlines()[0] if out.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def environment() -> dict:
    """The machine a grade was measured on: GPU, driver, and the versions that matter."""
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(terse=True),
           "torch": torch.__version__}
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:       # Triton is optional (no wheel on every platform)
        env["triton"] = "absent"
    env["cuda"] = torch.version.cuda or "none (CPU build)"
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_count"] = torch.cuda.device_count()
        cap = torch.cuda.get_device_capability()
        env["capability"] = f"sm_{cap[0]}{cap[1]}"
        env["driver"] = _driver()
        env["cudnn"] = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "absent"
    else:
        env["gpu"] = "none"
    return env


def emit(record: dict) -> None:
    """Print the machine-readable line the grading report collects."""
    print(PERF_TAG + json.dumps(record, sort_keys=True, default=str))


def perf_points(fn, step: str, config: str = "large", points: float = 2, dtype=None,
                expect_lse: bool = True, capability: tuple[int, int] | None = None) -> float:
    import torch

    from facourse import AttentionCheckError, bench_attention, check_entry_point, get_config, has_gpu

    from .guards import roofline_verdict

    rec = {"step": step, "config": config, "points_max": points, "points": 0.0}
    if not has_gpu():
        print(f"No GPU here: performance ({config}) is graded on a GPU machine; this cell scores 0.")
        emit({**rec, "status": "no GPU", "env": environment()})
        return 0.0
    if capability is not None and torch.cuda.get_device_capability() != tuple(capability):
        cap = torch.cuda.get_device_capability()
        print(f"This kernel is built for sm_{capability[0]}{capability[1]} and this GPU "
              f"({torch.cuda.get_device_name()}) is sm_{cap[0]}{cap[1]}: performance ({config}) is graded "
              f"on an sm_{capability[0]}{capability[1]} GPU; this cell scores 0.")
        emit({**rec, "status": "wrong GPU", "env": environment()})
        return 0.0
    t = thresholds(step)
    rec.update(min=t["min"], target=t["target"], env=environment())
    dtype = dtype or torch.float16
    try:
        check_entry_point(fn, get_config(config, "cuda"), dtype=dtype, expect_lse=expect_lse)
    except AttentionCheckError as err:
        print(f"The result on {config} is wrong, so its speed earns no points:\n{err}")
        emit({**rec, "status": "wrong result"})
        return 0.0
    res = bench_attention(fn, config, backend=t["reference"], dtype=dtype)
    rec.update(res.as_dict(), summary=res.summary())
    print(res.summary())
    flag = roofline_verdict(res.tflops_student, res.gpu)
    if flag:
        print(f"Not trusted: {flag}. This cell scores 0; the instructor sees it flagged.")
        emit({**rec, "status": "flagged", "flag": flag})
        return 0.0
    got = points_for(res.ratio, t, points)
    print(f"thresholds: min {t['min']} (half the points), target {t['target']} (all): "
          f"{got:g} of {points:g} points")
    emit({**rec, "status": "measured", "points": got})
    return got
