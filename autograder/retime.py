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



def _exercise(assignment: str) -> dict:
    """The step's manifest's [exercise]: its entry point and (step 08) its mode."""
    from facourse.steps import load_step
    return load_step(assignment[:2])["exercise"]


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

    from facourse import bench_attention, get_config
    from facourse.bench import MODES, timed_call

    from .perf import thresholds

    if not torch.cuda.is_available():
        raise GradingError("retime needs a GPU")
    configs = [t.perf["config"] for t in plan_of(assignment).values() if t.perf]
    if not configs:
        raise GradingError(f"{assignment} has no perf tests")
    exercise = _exercise(assignment)
    mode = exercise.get("mode", "forward")
    nbs = sorted(folder.glob("*.ipynb"))
    if not nbs:
        raise GradingError(f"no notebook in {folder}")
    work = Path(tempfile.mkdtemp(prefix="retime_")) / assignment
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
    fn = ns[exercise["entry_point"]]
    backend = thresholds(assignment)["reference"]
    for name in configs:
        if mode == "decode":                  # step 09: the paged decode, timed as its perf cell times it
            from facourse.decode import bench_decode, get_decode_case, make_paged_inputs
            res = bench_decode(fn, name, backend=backend)
            inputs = make_paged_inputs(get_decode_case(name, "cuda"), 0, "cuda", torch.float16)
            call = lambda: fn(*inputs)      # noqa: E731
            work, unit = get_decode_case(name, "cuda").kv_bytes(torch.float16) / 1e9, "GB/s of K/V"
            rate = f"{res.gbps_student:.0f} {unit}"
        else:
            res = bench_attention(fn, name, backend=backend, dtype=torch.float16, mode=mode)
            cfg = get_config(name, "cuda")
            from facourse import make_inputs
            q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, "bshd")
            call = timed_call(fn, q, k, v, torch.randn_like(q), cfg.causal, mode)   # what the bench timed
            work, unit = cfg.flops() * MODES[mode] / 1e12, "TFLOP/s"
            rate = f"{res.tflops_student:.0f} {unit}"
        call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        gpu_us = sum(e.device_time_total for e in prof.key_averages()) / 5
        print(f"{name}{'' if mode == 'forward' else f' ({mode})'}: bench {res.t_student_ms:.3f} ms "
              f"({rate}), reference {backend} {res.t_ref_ms:.3f} ms, ratio {res.ratio:.2f}x; "
              f"the GPU's own kernel record: {gpu_us / 1000:.3f} ms of kernels per call "
              f"({work / (gpu_us * 1e-6):.0f} {unit})")
    return 0
