"""What an instructor does after `autograde` (issue 33): grades by hand, exports for an LMS, and
meets plain nbgrader, which refuses rather than grade in the student's kernel.

One grading run of step 02's samples (alice: the solution, bob: the untouched stub; step 02 has a
written answer graded by hand) through `python -m autograder autograde`; each test works on its own
copy of that workspace. Manual grades are entered with nbgrader's gradebook API as the formgrader
saves them (tests/test_formgrader_browser.py enters one through the formgrader itself).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, computed_once, this_run
from autograder import cli, model

A = "02_safe_softmax"
WRITTEN = "written_safe_softmax"


def _autograde(ws: Path, subs: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop(model.JUDGE_ENV, None)
    r = subprocess.run([sys.executable, "-m", "autograder", "--workspace", str(ws), "autograde", str(subs),
                        "--jobs", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def graded_samples(tmp_path_factory) -> tuple[Path, Path]:
    """(workspace, submissions) after one grading run of alice's and bob's step-02 samples: once per
    test run (conftest.computed_once), whichever worker asks first; tests/test_formgrader_browser.py
    starts from it too. Read-only: a test works on its own copy."""
    def run():
        root = tmp_path_factory.mktemp("graded")
        subs = root / "subs"
        for s in ("alice", "bob"):
            shutil.copytree(model.SAMPLES / s / A, subs / s / A)
        _autograde(root / "ws", subs)
        return [str(root / "ws"), str(subs)]
    ws, subs = computed_once(this_run() + "\0autograde 02_safe_softmax alice bob", run)
    return Path(ws), Path(subs)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return graded_samples(tmp_path_factory)


@pytest.fixture
def ws(graded, tmp_path):
    """A private copy of the graded workspace and of the submissions: (workspace, submissions)."""
    shutil.copytree(graded[0], tmp_path / "ws", symlinks=True)
    shutil.copytree(graded[1], tmp_path / "subs")
    return tmp_path / "ws", tmp_path / "subs"


def grade_by_hand(ws: Path, student: str, score: float, comment: str) -> None:
    """What the formgrader's save does (its API handlers): the score, the grade no longer pending, the comment."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        g = gb.find_grade(WRITTEN, A, A, student)
        g.manual_score, g.needs_manual_grade = score, False
        gb.find_comment(WRITTEN, A, A, student).manual_comment = comment
        gb.db.commit()


def needs_manual_grade(ws: Path, student: str) -> bool:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        return bool(gb.find_grade(WRITTEN, A, A, student).needs_manual_grade)


def rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def page(ws: Path, student: str) -> str:
    return (ws / "report" / "students" / f"{student}.html").read_text(encoding="utf-8")


def without_seconds(table: dict[str, dict]) -> dict[str, dict]:
    return {s: {k: v for k, v in r.items() if k != "seconds"} for s, r in table.items()}


@pytest.mark.slow
def test_manual_grades_round_trip(ws):
    """Points and comments given by hand appear in the table, grades.csv and the student pages of
    `report`, `export` and `autograde` alike; a resubmitted written answer marks its manual grade
    for review (in the gradebook too) until it is graded again."""
    ws, subs = ws
    before = rows(ws / "grades.csv")
    assert before["alice"]["score"] == "8" and before["alice"]["manual_pending"] == "2", before["alice"]
    assert "awaits grading by hand" in page(ws, "alice")
    grade_by_hand(ws, "alice", 1.5, "(a) right;\n(b) misses why the passes cannot fuse.")
    grade_by_hand(ws, "bob", 0.5, "Left as given.")
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:     # the box beside her code (no test carries it)
        gb.find_comment("safe_softmax", A, A, "alice").manual_comment = "Neat: one pass for the max."
        gb.db.commit()

    assert cli.main(["--workspace", str(ws), "report"]) == 0
    reported = rows(ws / "grades.csv")
    alice = reported["alice"]
    assert (alice["score"], alice["manual_pending"], alice["manual_points"]) == ("9.5", "0", "1.5"), alice
    assert alice["comments"] == (f"{WRITTEN}: (a) right; (b) misses why the passes cannot fuse. | "
                                 "safe_softmax: Neat: one pass for the max."), alice
    assert "Comments on your code" in page(ws, "alice") and "Neat: one pass for the max." in page(ws, "alice")
    assert reported["bob"]["score"] == "0.5" and reported["bob"]["manual_points"] == "0.5", reported["bob"]
    assert "1.5 / 2" in page(ws, "alice") and "misses why the passes cannot fuse" in page(ws, "alice")
    assert "graded by hand" in page(ws, "alice") and "Left as given." in page(ws, "bob")

    assert cli.main(["--workspace", str(ws), "export"]) == 0
    assert without_seconds(rows(ws / "grades.csv")) == without_seconds(reported), "export and report disagree"
    lms = rows(ws / "export" / "lms.csv")
    assert lms["alice"][f"{A} (10)"] == "9.5" and lms["alice"]["review"] == "", lms["alice"]
    assert "misses why the passes cannot fuse" in (ws / "export" / "feedback" / "alice" / f"{A}.html").read_text()

    # alice resubmits with another written answer; bob's submission is unchanged (reused)
    nb = subs / "alice" / A / f"{A}.ipynb"
    data = json.loads(nb.read_text(encoding="utf-8"))
    cell = next(c for c in data["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == WRITTEN)
    cell["source"] = "A new answer: the three passes each need the previous one's result."
    nb.write_text(json.dumps(data), encoding="utf-8")
    out = _autograde(ws, subs).stdout
    graded = rows(ws / "grades.csv")
    assert without_seconds(graded)["bob"] == without_seconds(reported)["bob"], "autograde and report disagree"
    alice = graded["alice"]
    assert alice["score"] == "9.5" and alice["manual_stale"] == WRITTEN, alice
    assert "changed since graded by hand" in alice["status"] and "changed since graded by hand" in out
    assert needs_manual_grade(ws, "alice") and not needs_manual_grade(ws, "bob")
    assert "changed since graded by hand" in page(ws, "alice")
    assert cli.main(["--workspace", str(ws), "export"]) == 0
    assert rows(ws / "export" / "lms.csv")["alice"]["review"] == A

    grade_by_hand(ws, "alice", 2, "Right.")         # reviewed and saved again: no longer stale
    assert cli.main(["--workspace", str(ws), "report"]) == 0
    alice = rows(ws / "grades.csv")["alice"]
    assert (alice["score"], alice["manual_stale"], alice["comments"]) == (
        "10", "", f"{WRITTEN}: Right. | safe_softmax: Neat: one pass for the max."), alice
    assert "changed since" not in page(ws, "alice")


@pytest.mark.slow
def test_lms_export_with_a_roster(ws, capsys):
    """One row per roster student (their LMS columns kept, a column per assignment, the total and what
    awaits review), a graded student missing from the roster still exported and named; one feedback
    page per (student, assignment); a roster without a student column is refused plainly."""
    ws, _ = ws
    roster = ws.parent / "roster.csv"
    roster.write_text("student,lms_id,email\ndave,u003,dave@example.edu\nalice,u001,alice@example.edu\n")
    assert cli.main(["--workspace", str(ws), "export", "--roster", str(roster), "--out", str(ws.parent / "lms")]) == 0
    assert "bob" in capsys.readouterr().err
    with open(ws.parent / "lms" / "lms.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["student", "lms_id", "email", f"{A} (10)", "total", "max_total", "review"], table[0]
    assert table[1:] == [["dave", "u003", "dave@example.edu", "", "0", "10", ""],
                         ["alice", "u001", "alice@example.edu", "8", "8", "10", A],
                         ["bob", "", "", "0", "0", "10", ""]], table
    for s in ("alice", "bob"):
        text = (ws.parent / "lms" / "feedback" / s / f"{A}.html").read_text()
        assert f"{A}:" in text and "BEGIN HIDDEN" not in text and "judge(" not in text
    bad = ws.parent / "bad.csv"
    bad.write_text("name,email\nalice,a@example.edu\n")
    assert cli.main(["--workspace", str(ws), "export", "--roster", str(bad)]) == 2
    assert "no 'student' column" in capsys.readouterr().err


def _nbgrader(args: list[str], ws: Path, cwd: Path = ROOT / "autograder") -> subprocess.CompletedProcess:
    env = dict(os.environ, FACOURSE_WORKSPACE=str(ws), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1")
    env.pop(model.JUDGE_ENV, None)
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_plain_nbgrader_refuses_and_its_feedback_hides_hidden_tests(ws):
    """`nbgrader autograde` with the course's configuration and no judge fails with the command to use,
    before it touches the gradebook or the graded notebooks; `nbgrader generate_feedback` shows no
    hidden test's source and no seed."""
    ws, _ = ws
    graded_nb = ws / "autograded" / "alice" / A / f"{A}.ipynb"
    kept, db = graded_nb.read_bytes(), (ws / "gradebook.db").read_bytes()
    r = _nbgrader(["autograde", A, "--student", "alice", "--force"], ws)
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "python -m autograder autograde" in r.stderr, r.stderr[-2000:]
    assert graded_nb.read_bytes() == kept and (ws / "gradebook.db").read_bytes() == db

    assert "(seed " in graded_nb.read_text() and "BEGIN HIDDEN TESTS" in graded_nb.read_text()
    r = _nbgrader(["generate_feedback", A, "--student", "alice", "--force"], ws)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    html = (ws / "feedback" / "alice" / A / f"{A}.html").read_text(encoding="utf-8")
    assert "check_softmax_fn" in html, "the feedback lost the visible tests"
    for secret in ("BEGIN HIDDEN TESTS", "judge_client", "judge(", "(seed 1", "(seed 2"):
        assert secret not in html, f"the feedback shows {secret!r}"


def test_formgrader_button_and_hidden_cells_award_nothing_without_a_judge(monkeypatch):
    """The formgrader's autograde (nbgrader's pre-convert hook, from the course's configuration) refuses
    without a judge, and a hidden cell run without one fails naming the command: no kernel awards points."""
    from traitlets.config.loader import PyFileConfigLoader

    from autograder import nbgrader_hooks
    from autograder.judge_client import JudgeFailure, judge

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT / "autograder")).load_config()
    assert config.Autograde.pre_convert_hook is nbgrader_hooks.judge_only
    assert config.GenerateFeedback.preprocessors[0] is nbgrader_hooks.HideHiddenTests
    monkeypatch.delenv(model.JUDGE_ENV, raising=False)
    with pytest.raises(nbgrader_hooks.JudgeMissing, match="python -m autograder autograde"):
        nbgrader_hooks.judge_only(assignment=A, student="alice", notebooks=[])
    monkeypatch.setenv(model.JUDGE_ENV, str(ROOT / "no-such-socket"))
    with pytest.raises(nbgrader_hooks.JudgeMissing):
        nbgrader_hooks.judge_only(assignment=A, student="alice", notebooks=[])
    monkeypatch.delenv(model.JUDGE_ENV)
    with pytest.raises(JudgeFailure, match="python -m autograder autograde"):
        judge("test_small", lambda x, dim=-1: x.softmax(dim))


def test_formgrader_and_export_need_a_graded_workspace(tmp_path, capsys):
    """Both commands say plainly what is missing (exit 2), not a traceback."""
    assert cli.main(["--workspace", str(tmp_path / "none"), "formgrader", "--no-browser"]) == 2
    assert "run `python -m autograder" in capsys.readouterr().err
    assert cli.main(["--workspace", str(tmp_path / "none"), "export"]) == 2
    assert "no gradebook" in capsys.readouterr().err
