"""The grading pipeline: release in sync and leak-free, samples graded, bad input refused clearly."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, fill, grade_submissions, release_notebook, solution_code
from autograder import cli, perf

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
           "BEGIN MARK SCHEME", "END MARK SCHEME")


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def test_release_is_in_sync_with_solutions(tmp_path):
    """Regenerating exercises/ from solutions/ changes nothing: the release is never hand-edited."""
    cli.release(None, tmp_path / "ws", release_dir=tmp_path / "release", quiet=True)
    fresh = sorted(p.relative_to(tmp_path / "release") for p in (tmp_path / "release").rglob("*") if p.is_file())
    committed = sorted(p.relative_to(ROOT / "exercises") for p in (ROOT / "exercises").rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts)
    assert fresh == committed, "exercises/ and a fresh release hold different files: run `python -m autograder release`"
    for rel in fresh:
        a, b = (tmp_path / "release" / rel).read_bytes(), (ROOT / "exercises" / rel).read_bytes()
        assert a == b, f"exercises/{rel} is out of date: run `python -m autograder release`"


def test_release_contains_no_solution_and_no_hidden_test():
    for path in (ROOT / "exercises").rglob("*"):
        if path.is_file() and path.suffix in (".ipynb", ".py", ".cu", ".cuh", ".md", ".txt"):
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in MARKERS:
                assert m not in text, f"{path.relative_to(ROOT)} contains '{m}'"
    assert not list((ROOT / "exercises").rglob("ladder")), "a solution ladder leaked into the release"


def test_every_assignment_is_released_and_has_tests():
    assert cli.assignments(), "no assignment in solutions/"
    for a in cli.assignments():
        assert (ROOT / "exercises" / a).is_dir(), f"{a} has no release in exercises/"
        cells = [c for c in _cells(next((ROOT / "solutions" / a).glob("*.ipynb")))
                 if c["metadata"].get("nbgrader", {}).get("grade")]
        hidden = [c for c in cells if "BEGIN HIDDEN TESTS" in "".join(c["source"])]
        assert len(hidden) >= 5, f"{a}: fewer than five hidden test cells"


@pytest.mark.slow
def test_samples_grade_as_labelled(tmp_path):
    """The bundled samples: the correct one full marks, the stub 0, the planted bug in between."""
    res = {r.student: r for r in cli.autograde(cli.SAMPLES, tmp_path / "ws", quiet=True)}
    assert res["alice"].score == res["alice"].max_score == 7, res["alice"]
    assert res["bob"].score == 0 and res["bob"].status == "graded", res["bob"]
    assert res["carol"].score == 4 and set(res["carol"].failed) == {
        "test_asymmetric", "test_edge_ragged", "test_edge_empty_rows"}, res["carol"]
    assert "top-left" in res["carol"].messages["test_asymmetric"]
    rows = (tmp_path / "grades.csv")
    cli.write_csv(list(res.values()), rows)
    assert rows.read_text().splitlines()[0].startswith("student,assignment,score,max_score")


@pytest.mark.slow
def test_solution_full_stub_zero_and_broken_submissions(tmp_path):
    a = "01_vanilla_attention"
    nb = release_notebook(a)
    res = grade_submissions(tmp_path, a, {
        "solution": fill(nb, solution_code(a)),
        "stub": nb,
        "notjson": "this is { not a notebook",
        "deleted_test": {**nb, "cells": [c for c in nb["cells"]
                                         if c["metadata"].get("nbgrader", {}).get("grade_id") != "test_small"]},
        "edited_test": fill(fill(nb, solution_code(a)), {"test_medium": "pass"}),
    })
    assert res["solution"].score == res["solution"].auto_max_score == 7
    assert res["stub"].score == 0
    assert res["notjson"].score == 0 and "not a notebook" in res["notjson"].status
    # a deleted test cell comes back and runs (the stub then fails it); an edited one is restored
    assert "test_small" in res["deleted_test"].failed and res["deleted_test"].score == 0
    assert "deleted cells restored: test_small" in res["deleted_test"].status
    assert res["edited_test"].score == 7


def test_wrong_file_name_and_missing_folder(tmp_path):
    d = tmp_path / "subs" / "dave" / "01_vanilla_attention"
    d.mkdir(parents=True)
    (d / "my_attempt.ipynb").write_text(json.dumps(release_notebook("01_vanilla_attention")))
    res = cli.autograde(tmp_path / "subs", tmp_path / "ws", quiet=True)
    assert res[0].score == 0 and "missing notebook 01_vanilla_attention.ipynb" in res[0].status
    assert "my_attempt.ipynb" in res[0].status
    with pytest.raises(cli.GradingError, match="does not exist"):
        cli.autograde(tmp_path / "nowhere", tmp_path / "ws", quiet=True)
    with pytest.raises(cli.GradingError, match="no submissions found"):
        (tmp_path / "empty").mkdir()
        cli.autograde(tmp_path / "empty", tmp_path / "ws", quiet=True)


def test_cli_reports_errors_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "autograder", "--workspace", str(tmp_path), "autograde",
                        str(tmp_path / "missing")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "autograder", "release", "99_nothing"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no assignment 99_nothing" in r.stderr


def test_perf_points_follow_thresholds():
    t = perf.thresholds("05_triton_flash_attention")
    assert (t["min"], t["target"], t["reference"]) == (0.5, 0.7, "FLASH_ATTENTION")
    assert perf.thresholds("07_hopper_flash_attention")["reference"] == "CUDNN_ATTENTION"
    assert perf.points_for(0.49, t, 2) == 0 and perf.points_for(0.5, t, 2) == 1
    assert perf.points_for(0.69, t, 2) == 1 and perf.points_for(0.7, t, 2) == 2
    with pytest.raises(KeyError):
        perf.thresholds("99_none")


def test_perf_points_without_gpu_score_zero_and_say_so(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert perf.perf_points(lambda *a, **k: None, "05_triton_flash_attention") == 0.0
    assert "No GPU here" in capsys.readouterr().out
