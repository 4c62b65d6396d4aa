"""Perf targets a student who matches the course's solution reaches (docs/DESIGN.md, "Performance rule").

Each target in autograder/thresholds.toml is at most 0.85x what the exercise's own solution measured in
the newest committed GPU self-test (`python -m autograder.gpu_selftest`, its printed table under
benchmarks/results/) on an H100 and on an H200.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from autograder import gpu_selftest
from autograder.perf import thresholds
from autograder.plans import plan_of

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GPUS = ("h100", "h200")
# a self-test line: verdict, case (padded to 28), test, points, message with the ratio first
LINE = re.compile(r"^(?:ok   |WRONG) (.{28}) (perf_\S+)\s+\S+/\S+\s+(.*)$")
SOLUTION = re.compile(r"step (\d\d) (?:TileLang )?solution")


def perf_steps() -> list[str]:
    """Assignments whose plan has perf tests."""
    from autograder.plans import PLANS
    return [a for a in PLANS if any(t.startswith("perf_") for t in plan_of(a))]


def solution_ratios(gpu: str, results: Path = RESULTS) -> dict[str, tuple[str, list[float]]]:
    """{step id: (file, ratios)} from the newest self-test file of ``gpu`` that has the step's solution rows."""
    found: dict[str, tuple[str, list[float]]] = {}
    for f in sorted(results.glob(f"*_{gpu}_gpu_selftest*.txt"), reverse=True):
        rows: dict[str, list[float]] = {}
        for line in f.read_text().splitlines():
            m = LINE.match(line)
            s = m and SOLUTION.fullmatch(m.group(1).strip())
            r = s and re.search(r"(\d+\.\d+)x\b", m.group(3))
            if r:
                rows.setdefault(s.group(1), []).append(float(r.group(1)))
        for step, ratios in rows.items():
            found.setdefault(step, (f.name, ratios))
    return found


@pytest.mark.parametrize("gpu", GPUS)
def test_every_target_is_at_most_085x_the_solution(gpu):
    ratios = solution_ratios(gpu)
    problems = []
    for a in perf_steps():
        step = a[:2]
        if step not in ratios:
            problems.append(f"{a}: no committed {gpu} self-test row of its solution's perf tests")
            continue
        name, rs = ratios[step]
        target = thresholds(a)["target"]
        if target > gpu_selftest.MARGIN * min(rs):
            problems.append(f"{a}: target {target} > {gpu_selftest.MARGIN} x {min(rs):.2f} "
                            f"(the solution's slowest perf ratio in {name})")
    assert not problems, "\n".join(problems)


def test_min_is_below_target():
    for a in perf_steps():
        t = thresholds(a)
        assert 0 < t["min"] < t["target"], a


def test_the_self_test_fails_a_solution_without_the_margin(capsys):
    row = {"case": "step 06 solution", "test": "perf_large", "points": 2, "max": 2, "as_expected": True,
           "perf": {"ratio": 0.0}, "message": ""}
    target = thresholds("06_cuda_flash_attention")["target"]
    fast, slow = (dict(row, perf={"ratio": target / gpu_selftest.MARGIN * f}) for f in (1.01, 0.99))
    ok, bad = gpu_selftest._margins([fast, slow])
    assert ok["as_expected"] and not bad["as_expected"]
    assert bad["test"] == "margin perf_large" and ">" in bad["message"]
    assert gpu_selftest._margins([dict(row, case="step 07 tuned")]) == []    # not the exercise's solution


def test_a_printed_row_is_read_back(tmp_path):
    text = "large: 249 TFLOP/s against SDPA FLASH_ATTENTION 308: 0.81x; thresholds min 0.45 (half the points)"
    rows = [gpu_selftest.line(True, "step 06 solution", "perf_large", f"2/2  {text}"),
            gpu_selftest.line(True, "step 06 tuned", "perf_large", "2/2  large: 1.50x"),
            gpu_selftest.line(True, "step 06 solution", "margin perf_large", "0.81x; target 0.65 <= 0.69")]
    (tmp_path / "2030-01-01_h100_gpu_selftest.txt").write_text("\n".join(rows) + "\n")
    assert solution_ratios("h100", tmp_path) == {"06": ("2030-01-01_h100_gpu_selftest.txt", [0.81])}


@pytest.mark.parametrize("step", sorted(gpu_selftest._CELLS))
def test_the_self_test_runs_every_test_of_steps_13_to_15(step):
    """Every test of the plan has a hidden cell, and the self-test's cells define each function those cells pass."""
    from facourse.steps import exercise_source, hidden_entries, load_step
    entries = hidden_entries(step)
    assert set(entries) == set(plan_of(load_step(step)["step"]["notebook"].removesuffix(".ipynb")))
    src = exercise_source(step, gpu_selftest._CELLS[step])
    assert all(f"def {fn}(" in src for fn in set(entries.values()))
