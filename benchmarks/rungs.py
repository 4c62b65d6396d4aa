"""A ladder's rungs as callables, and the machine they run on: what the runner (ladder.py), the step-11
traces (traces.py), the timing probe and the GPU self-test share.

A Triton rung is loaded from its file; a CUDA rung is built with facourse.cuda_build's
load_cuda_extension (rung .cu + the step's binding; the manifest's arch, else this GPU's) into
LADDER_BUILD (default: a temporary folder), once per rung.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT / "src"), str(ROOT)) if p not in sys.path]

from facourse.steps import load_step, rung  # noqa: E402

BUILD = Path(os.environ.get("LADDER_BUILD", Path(tempfile.gettempdir()) / "facourse_ladder_build"))


def load_py(path: Path):
    """A Python rung's module, loaded from its file (a fresh module each call)."""
    spec = importlib.util.spec_from_file_location(f"ladder_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_cuda(m: dict, name: str, arch: str | None = None):
    """The torch extension of one CUDA rung (kernel .cu + the step's binding), built once. ``arch``:
    the manifest's, else the given one, else this machine's GPU."""
    from facourse.cuda_build import load_cuda_extension
    r = rung(m, name)
    sid = m["step"]["id"]
    return load_cuda_extension(f"fa{sid}_{name}", [m["ladder_dir"] / r["file"], m["dir"] / m["build"]["binding"]],
                               arch=m["build"].get("arch") or arch, include_dirs=[m["ladder_dir"], m["dir"]],
                               build_directory=str(_build_dir(sid, name)))


def _build_dir(sid: str, name: str) -> Path:
    d = BUILD / f"step{sid}" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def entry_point(step, name: str):
    """The rung's entry point, with the exercise's name and signature: fn(q, k, v, causal, scale) -> (o, lse)."""
    m = step if isinstance(step, dict) else load_step(step)
    r = rung(m, name)
    path = m["ladder_dir"] / r["file"]
    ep = r.get("entry_point", m["entry_points"][0])
    if path.suffix == ".py":
        from facourse.triton_setup import interpret_without_gpu
        interpret_without_gpu()
        return getattr(load_py(path), ep)
    from facourse import validate_inputs
    ext = build_cuda(m, name)

    def fn(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return tuple(ext.forward(q, k, v, bool(causal), float(scale)))

    fn.__name__ = f"{ep}_{name}"
    return fn


def prebuild(sid: str, name: str, arch: str) -> float:
    """Build one CUDA rung (in a pool worker: only the seconds travel back)."""
    t0 = time.time()
    build_cuda(load_step(sid), name, arch)
    return round(time.time() - t0, 1)


def env_info() -> dict:
    """The machine and versions a results file was measured with (facourse.schema.Env)."""
    import torch
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    gpu = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if gpu else "cpu", "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "triton": tv, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "capability": list(torch.cuda.get_device_capability()) if gpu else None,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if gpu else None}


def gpu_tag(gpu: str) -> str:
    """'h100' of 'NVIDIA H100 80GB HBM3': the results file's name part."""
    found = re.search(r"\b([A-Z]\d{2,3})\b", gpu)
    return found[1].lower() if found else re.sub(r"\W+", "", gpu.lower())[:12] or "cpu"
