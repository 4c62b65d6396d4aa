"""Performance grading's rules (steps 05-09): the thresholds and the machine. Grading-only.

A perf cell goes through the judge like every hidden test (``judge.py``): the kernel checks the
result at full size and times student and reference with the course's bench (``bench``:
the step kind's, ``facourse.kinds``); the judge
decides with these rules: half the points at the ``min`` ratio of thresholds.toml, all at
``target``; and records the machine a grade was measured on (GPU, driver, torch, Triton, CUDA,
cuDNN) with every perf record.
"""
from __future__ import annotations

import platform
import shutil
import subprocess
import tomllib
from pathlib import Path

THRESHOLDS = Path(__file__).resolve().parent / "thresholds.toml"


def thresholds(step: str, path: Path = THRESHOLDS) -> dict:
    data = tomllib.loads(path.read_text())
    try:
        return data["steps"][step]
    except KeyError:
        raise KeyError(f"no thresholds for step {step!r} in {path}") from None


def bench(fn, config: str, backend: str, mode: str = "forward"):
    """The one bench for a perf test: its kind's (``facourse.kinds``: attention forward or backward in
    TFLOP/s, a paged decode in GB/s of K and V read, a variant in TFLOP/s of visible pairs), fp16,
    against ``backend`` (SDPA's; a variant's window: compiled FlexAttention)."""
    from facourse import kinds

    return kinds.get(mode).perf_bench(fn, config, backend)


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
