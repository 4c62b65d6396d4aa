"""`python -m autograder retime SUBMISSIONS STUDENT ASSIGNMENT`: re-time one submission by hand.

For an instructor who doubts a perf grade. In a fresh process on this GPU it runs the student's own
code cells (not the test cells), then times the entry point on the graded perf configurations two
ways: with the course's bench against the step's reference (what the perf cell reports), and
from the GPU's own record of the kernels it ran (PyTorch's profiler, CUPTI activity timestamps),
so a timing that Python code rewrote shows up as a disagreement. It prints both and exits 0. For
timing entirely outside the student's process, run the same command under NVIDIA Nsight Systems
(``nsys profile --stats=true python -m autograder retime ...``) and read its kernel table.
"""
from __future__ import annotations

import json
import os
import runpy
import shutil
import tempfile
from pathlib import Path

from .model import EXERCISES, GradingError
from .plans import plan_of
from .scan import student_cells


def _step(assignment: str) -> dict:
    """The step's manifest: its entry point and its kind."""
    from facourse.steps import load_step
    return load_step(assignment[:2])


def _given_andstudent_cells(nb: dict) -> list[str]:
    """Every code cell but the tests: the given set-up cells and the student's own."""
    out = []
    for cell in nb.get("cells", []):
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if cell.get("cell_type") != "code" or (meta.get("grade") and not meta.get("solution")):
            continue
        src = cell.get("source", "")
        out.append("".join(src) if isinstance(src, list) else src)
    return out


def retime(folder: Path, assignment: str) -> int:
    import torch

    from facourse import kinds

    from .perf import thresholds

    if not torch.cuda.is_available():
        raise GradingError("retime needs a GPU")
    configs = [t.perf["config"] for t in plan_of(assignment).values() if t.perf]
    if not configs:
        raise GradingError(f"{assignment} has no perf tests")
    m = _step(assignment)
    kind = kinds.of_step(m)
    nbs = sorted(folder.glob("*.ipynb"))
    if not nbs:
        raise GradingError(f"no notebook in {folder}")
    tmp = Path(tempfile.mkdtemp(prefix="retime_"))        # the copy goes when the timings are done
    try:
        work = tmp / assignment
        shutil.copytree(EXERCISES / assignment, work)              # the given files...
        for p in folder.iterdir():                                  # ...and what the student submitted
            if p.is_file():
                shutil.copy2(p, work / p.name)
        nb = json.loads(nbs[0].read_text(encoding="utf-8"))
        print(f"{len(student_cells(nb))} student cell(s); running the notebook's code cells (no test cell)")
        # one file, the cells in order (Triton's @jit reads a kernel's source from its file)
        code = "\n\n".join("\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
                           for src in _given_andstudent_cells(nb))
        (work / "_retimed_submission.py").write_text(code, encoding="utf-8")
        cwd = os.getcwd()
        os.chdir(work)
        try:
            ns = runpy.run_path(str(work / "_retimed_submission.py"), run_name="_retimed_submission")
        finally:
            os.chdir(cwd)
        fn = ns[m["entry_points"][0]]
        backend = thresholds(assignment)["reference"]
        for name in configs:
            res = kind.perf_bench(fn, name, backend)
            call = kind.timed_call(fn, name)                    # what the bench timed
            work, unit = kind.perf_work(name, "cuda") / kind.per_second, kind.work_unit
            rate = f"{kind.result_rate(res):.0f} {unit}"
            call()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
            gpu_us = sum(e.device_time_total for e in prof.key_averages()) / 5
            print(f"{name}{kind.label}: bench {res.t_student_ms:.3f} ms "
                  f"({rate}), reference {backend} {res.t_ref_ms:.3f} ms, ratio {res.ratio:.2f}x; "
                  f"the GPU's own kernel record: {gpu_us / 1000:.3f} ms of kernels per call "
                  f"({work / (gpu_us * 1e-6):.0f} {unit})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
