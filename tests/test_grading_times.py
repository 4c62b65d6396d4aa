"""The instructor guide's grading-time table (autograder/README.md, "Grading times and timeouts") against
the committed GPU grading records and the per-step defaults in autograder/workers.py."""
from __future__ import annotations

import csv
import re
from pathlib import Path

from autograder.workers import NOTEBOOK_TIMEOUT, cell_timeout_for, notebook_timeout

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "autograder" / "README.md"
RECORDS = sorted((ROOT / "benchmarks" / "results").glob("*_h100_gpu_grading"))
ROLES = ("correct", "stub", "bug", "slow")


def table() -> dict[str, list[str]]:
    """{step id: the row's cells} of the guide's table."""
    text = GUIDE.read_text(encoding="utf-8").split("## Grading times and timeouts", 1)[1]
    return {m.group(1): [c.strip() for c in m.group(2).split("|")]
            for m in re.finditer(r"^\| (\d\d) \|(.*)\|$", text.split("\n### ", 1)[0], re.M)}


def measured() -> dict[str, dict[str, int]]:
    """{step id: {role: seconds rounded as summary.txt prints them}} from the newest record of each step."""
    out: dict[str, dict[str, int]] = {}
    for rec in RECORDS:                                   # oldest first: a newer record replaces a step
        with open(rec / "grades.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        for step in {r["assignment"][:2] for r in rows}:
            out[step] = {r["student"]: round(float(r["seconds"])) for r in rows if r["assignment"][:2] == step}
    return out


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def test_every_step_has_its_h100_times_from_a_committed_record():
    rows, got = table(), measured()
    assert set(rows) == {a[:2] for a in NOTEBOOK_TIMEOUT}
    for step, cells in rows.items():
        times = got.get(step)
        assert times, f"step {step}: no committed H100 grading record"
        want = [times[r] for r in ROLES if r in times]
        assert _numbers(cells[2]) == want, f"step {step}: the guide says {cells[2]!r}, the record {want}"
        minutes = round(100 * sum(want) / len(want) / 60)
        assert cells[3] == f"{minutes} min", f"step {step}: a class of 100 is {minutes} min, the guide {cells[3]!r}"


def test_the_timeouts_are_the_workers_and_ten_times_the_slowest():
    rows, got = table(), measured()
    for a in NOTEBOOK_TIMEOUT:
        cells = rows[a[:2]]
        nb, cell = _numbers(cells[4])
        assert (nb, cell) == (notebook_timeout(a), cell_timeout_for(a, None)), f"{a}: the guide says {cells[4]!r}"
        slowest = max(_numbers(cells[0]) + list(got[a[:2]].values()))
        assert nb >= max(300, 10 * slowest), f"{a}: {nb:g} s is not ten times the slowest, {slowest:g} s"
