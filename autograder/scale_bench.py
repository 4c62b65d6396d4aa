"""Scale benchmark: generate N submissions of step 01 and grade them in one parallel run.

    python -m autograder.scale_bench [--n 50] [--jobs 2] [--workspace /tmp/scale_ws]

A quarter each: the solution (7 points), the untouched stub (0), the solution with a top-left
causal mask (4), and a function returning zeros (0). Prints the wall-clock time of the run, the
time per submission, and fails (exit 1) when a score differs from what its kind should get.
The figures it printed on the course's 2-core CPU machine are in autograder/README.md.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import model, report, workers

A = "01_vanilla_attention"


def _solution() -> str:
    nb = json.loads((model.SOLUTIONS / A / f"{A}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution") and cell["cell_type"] == "code":
            return "\n".join(ln for ln in "".join(cell["source"]).splitlines()
                             if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    raise SystemExit("no solution cell in step 01")


def _fill(nb: dict, code: str | None) -> dict:
    nb = copy.deepcopy(nb)
    if code is not None:
        for cell in nb["cells"]:
            if cell["metadata"].get("nbgrader", {}).get("grade_id") == "vanilla_attention":
                cell["source"] = code.splitlines(True)
    return nb


def make_submissions(folder: Path, n: int) -> dict[str, float]:
    """Write ``n`` submissions under ``folder``; returns {student: expected score}."""
    release = json.loads((model.EXERCISES / A / f"{A}.ipynb").read_text(encoding="utf-8"))
    sol = _solution()
    top_left = sol.replace("j > i + (Skv - Sq)", "j > i")
    zeros = ("def vanilla_attention(q, k, v, causal=False, scale=None):\n"
             "    return torch.zeros_like(q)\n")
    kinds = [("solution", sol, 7.0), ("stub", None, 0.0), ("topleft", top_left, 4.0), ("zeros", zeros, 0.0)]
    expected = {}
    for i in range(n):
        kind, code, score = kinds[i % len(kinds)]
        student = f"s{i:03d}_{kind}"
        d = folder / student / A
        d.mkdir(parents=True)
        (d / f"{A}.ipynb").write_text(json.dumps(_fill(release, code)), encoding="utf-8")
        expected[student] = score
    return expected


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.scale_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--workspace", type=Path, default=None)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="facourse_scale_"))
    ws = args.workspace or tmp / "ws"
    if ws.exists():
        shutil.rmtree(ws)
    expected = make_submissions(tmp / "submitted", args.n)
    t0 = time.perf_counter()
    results = workers.autograde(tmp / "submitted", ws, jobs=args.jobs, quiet=False)
    wall = time.perf_counter() - t0
    report.print_report(results, ws / "grades.csv", show_messages=False, workspace=ws, seconds=wall)
    wrong = [(r.student, r.score, expected[r.student]) for r in results if r.score != expected[r.student]]
    per = [r.seconds for r in results]
    print(f"\n{args.n} submissions, --jobs {args.jobs}, {os.cpu_count()} CPU cores: {wall:.0f} s wall "
          f"({wall / args.n:.1f} s per submission); one submission's own time: median "
          f"{statistics.median(per):.1f} s, max {max(per):.1f} s")
    if wrong:
        print(f"WRONG scores (student, got, expected): {wrong}", file=sys.stderr)
        return 1
    print("every score as expected")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
