"""The grading pipeline: release in sync and leak-free, samples graded, bad input refused clearly."""
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from conftest import ROOT, release_notebook, running
from autograder import cli, grader, gradebook, model, perf, staging, workers

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
           "BEGIN MARK SCHEME", "END MARK SCHEME")


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def test_release_is_in_sync_with_solutions(tmp_path):
    """Regenerating exercises/ from solutions/ changes nothing: the release is never hand-edited."""
    staging.release(None, tmp_path / "ws", release_dir=tmp_path / "release", quiet=True)
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
    assert model.assignments(), "no assignment in solutions/"
    for a in model.assignments():
        assert (ROOT / "exercises" / a).is_dir(), f"{a} has no release in exercises/"
        cells = [c for c in _cells(next((ROOT / "solutions" / a).glob("*.ipynb")))
                 if c["metadata"].get("nbgrader", {}).get("grade")]
        hidden = [c for c in cells if "BEGIN HIDDEN TESTS" in "".join(c["source"])]
        assert len(hidden) >= 5, f"{a}: fewer than five hidden test cells"


def test_samples_are_in_sync_with_solutions():
    """The demo's samples (autograder/samples) are what tools/make_samples.py writes now from solutions/,
    exercises/ and the steps' planted bugs: never hand-edited, never stale."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import make_samples
    finally:
        sys.path.remove(str(ROOT / "tools"))
    generated = make_samples.samples()
    assert {"02_safe_softmax", "05_triton_flash_attention", "08_backward", "12_ring_attention"} <= set(generated)
    bad = make_samples.stale()
    assert not bad, f"autograder/samples out of date ({', '.join(bad)}): run `python tools/make_samples.py`"
    for a, students in generated.items():           # the demo grades every one of them
        assert all((model.SAMPLES / s / a / f"{a}.ipynb").is_file() for s in students), a


@pytest.mark.slow
def test_interrupted_parallel_run_resumes_and_loses_no_grade(tmp_path):
    """Step 01's samples through the CLI with --jobs 2, killed (SIGKILL) after its first grade,
    then started again: every grade is right, finished ones are reused, the gradebook agrees.
    (The other steps' samples: tests/test_exercise_grading.py.)"""
    ws, subs = tmp_path / "ws", tmp_path / "subs"
    for student in ("alice", "bob", "carol"):
        shutil.copytree(model.SAMPLES / student / "01_vanilla_attention", subs / student / "01_vanilla_attention")
    cmd = [sys.executable, "-m", "autograder", "--workspace", str(ws), "autograde", str(subs), "--jobs", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while not list((ws / "results").glob("*/*.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = {p.parent.name for p in (ws / "results").glob("*/*.json")}
    assert first, "no submission finished before the kill"
    time.sleep(2)      # nbgrader workers die with their parent (PR_SET_PDEATHSIG)
    r = subprocess.run([*cmd, "--cell-timeout", "120"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "unchanged since the last run, reused" in r.stdout
    res = {x.student: x for x in gradebook.load_results(ws)}
    assert res["alice"].score == res["alice"].max_score == 7, res["alice"]
    assert res["bob"].score == 0 and res["bob"].status == "graded", res["bob"]
    assert res["carol"].score == 4 and set(res["carol"].failed) == {
        "test_asymmetric", "test_edge_ragged", "test_edge_empty_rows"}, res["carol"]
    assert "top-left" in res["carol"].messages["test_asymmetric"]
    assert {x.student: x.score for x in gradebook.export(ws)} == {"alice": 7, "bob": 0, "carol": 4}
    assert (ws / "grades.csv").read_text().splitlines()[0].startswith("student,assignment,score,max_score")
    assert (ws / "report" / "index.html").exists() and (ws / "report" / "students" / "carol.html").exists()
    assert "top-left" in (ws / "report" / "students" / "carol.html").read_text()
    # `report` rebuilds CSV and HTML from the workspace alone
    (ws / "grades.csv").unlink()
    assert cli.main(["--workspace", str(ws), "report"]) == 0
    assert len((ws / "grades.csv").read_text().splitlines()) == 4


def test_notebook_time_limit_kills_the_whole_process_group():
    """A worker past its limit goes, with every process it started (the kernel included)."""
    t0 = time.time()
    rc, out = grader.run_isolated(["bash", "-c", "sleep 300 & echo $!; wait"], ROOT, dict(os.environ), 2)
    assert rc is None and time.time() - t0 < 30
    child = int(out.split()[0])
    time.sleep(0.5)
    assert not running(child)


def test_every_process_of_a_submission_goes_also_in_a_session_of_its_own():
    """The notebook's kernel runs in a session of its own (Jupyter starts it so): past the limit it goes too, and
    one left behind by a process that ended (holding its output open) goes at once, without waiting for it."""
    t0 = time.time()
    rc, out = grader.run_isolated(["bash", "-c", "setsid sleep 300 & echo $!; wait"], ROOT, dict(os.environ), 2)
    child = int(out.split()[0])
    assert rc is None and time.time() - t0 < 30
    time.sleep(0.5)
    assert not running(child)
    t0 = time.time()
    rc, out = grader.run_isolated(["bash", "-c", "setsid sleep 300 & echo $!"], ROOT, dict(os.environ), 60)
    assert rc == 0 and time.time() - t0 < 20
    time.sleep(0.5)
    assert not running(int(out.split()[0]))


def test_the_cause_of_a_test_that_never_saw_its_function(tmp_path):
    """A cell that is no test stopping (its time limit) leaves the tests below a NameError: they say which
    cell stopped and why, with the limit."""
    nb = {"cells": [
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "occupancy", "solution": True, "grade": False}},
         "outputs": [{"output_type": "error", "ename": "CellTimeoutError", "evalue": ""}], "source": ""},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "test_a", "grade": True, "points": 1}},
         "outputs": [{"output_type": "error", "ename": "NameError", "evalue": "name 'occupancy' is not defined"}],
         "source": ""},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "test_b", "grade": True, "points": 1}},
         "outputs": [{"output_type": "error", "ename": "NotImplementedError", "evalue": ""}], "source": ""}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    errors = grader._cell_errors(tmp_path, 20)
    assert errors["test_a"].startswith("NameError: name 'occupancy' is not defined (an earlier cell stopped: "
                                       "cell occupancy: CellTimeoutError: the cell ran past the per-cell time "
                                       "limit (20 s))"), errors
    assert errors["test_b"] == f"NotImplementedError: {model.NOT_WRITTEN}"     # a stub, said so


def test_visible_checks_draw_the_submissions_own_seeds(monkeypatch):
    from facourse import rule
    monkeypatch.delenv(rule.VISIBLE_SEEDS_ENV, raising=False)
    assert rule.draw_seed() != rule.draw_seed() or rule.draw_seed() != rule.draw_seed()   # fresh: 2^31 values
    monkeypatch.setenv(rule.VISIBLE_SEEDS_ENV, "ab" * 32)
    monkeypatch.setattr(rule, "_VISIBLE_DRAWS", itertools.count())
    first = [rule.draw_seed() for _ in range(3)]
    monkeypatch.setattr(rule, "_VISIBLE_DRAWS", itertools.count())
    assert [rule.draw_seed() for _ in range(3)] == first and len(set(first)) == 3
    assert all(0 <= x < 2 ** 31 for x in first) and rule.draw_seed(5) == 5


def test_the_formgrader_refuses_before_clearing_the_graded_copy(tmp_path, monkeypatch):
    """nbgrader's Autograde clears the graded notebook before its pre-convert hook: with no judge serving, the
    formgrader's button must refuse first and leave it."""
    from nbgrader.converters import Autograde

    from autograder import nbgrader_hooks
    monkeypatch.setattr(Autograde, "init_destination", Autograde.init_destination)   # restored afterwards
    nbgrader_hooks.refuse_before_clearing()
    monkeypatch.delenv(model.JUDGE_ENV, raising=False)
    with pytest.raises(nbgrader_hooks.JudgeMissing):
        Autograde.init_destination(object(), "13_profiling", "carol")


def test_one_gpu_per_worker(tmp_path, monkeypatch):
    """With GPUs, each worker runs with its own CUDA_VISIBLE_DEVICES and no more workers than GPUs."""
    subs = tmp_path / "subs"
    for s in ("a", "b", "c", "d", "e"):
        d = subs / s / "01_vanilla_attention"
        d.mkdir(parents=True)
        (d / "01_vanilla_attention.ipynb").write_text("{}")
    busy, seen, lock = set(), [], threading.Lock()

    def fake_grade_one(submissions, workspace, student, a, *, timeout, cell_timeout, gpu, key, **_):
        with lock:
            assert gpu not in busy, "two workers share a GPU"
            busy.add(gpu)
            seen.append(gpu)
        time.sleep(0.2)
        with lock:
            busy.discard(gpu)
        return model.Result(student, a, gpu=gpu, key=key)

    monkeypatch.setattr(workers, "grade_one", fake_grade_one)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert workers.visible_gpus() == ["3", "5"]
    res = workers.autograde(subs, tmp_path / "ws", jobs=8, quiet=True)
    assert sorted(set(seen)) == ["3", "5"] and len(res) == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert workers.visible_gpus() == []


def test_bundle_has_no_grading_material(tmp_path):
    from autograder import bundle

    path, n = bundle.build(tmp_path / "student.zip")
    with zipfile.ZipFile(path) as z:
        names = [x.split("/", 1)[1] for x in z.namelist()]
        assert n == len(names) > 0
        for name in names:
            top = name.split("/")[0]
            assert top not in ("solutions", "autograder", "tests", "grading", ".ci"), name
            text = z.read("flashattention-course/" + name).decode("utf-8", errors="ignore")
            for m in MARKERS:
                assert m not in text, f"{name} contains {m}"
        z.extractall(tmp_path / "x")
    for need in ("pyproject.toml", "README.md", "environment.yml", "course.sh", "src/facourse/__init__.py",
                 "src/facourse/check.py", "exercises/01_vanilla_attention/01_vanilla_attention.ipynb"):
        assert need in names, f"{need} missing from the bundle"
    assert any(x.startswith("course/") for x in names) and any(x.startswith("diagrams/") for x in names)
    # the unpacked bundle is an installable package (a wheel builds from it without the grading side)
    root = tmp_path / "x" / "flashattention-course"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "whl"), str(root)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((tmp_path / "whl").glob("facourse-*.whl"))
    # a leak is refused: a file with a hidden-test marker would make the build fail
    assert bundle.leaks(ROOT, ["solutions/01_vanilla_attention/01_vanilla_attention.ipynb"])
    assert bundle.leaks(ROOT, ["exercises/../solutions/01_vanilla_attention/01_vanilla_attention.ipynb"])


def test_wrong_file_name_and_missing_folder(tmp_path):
    """Two notebooks, neither under the assignment's name: not graded, and the status says which
    name to use (a single notebook under another name is graded: tests/test_grading_ops.py)."""
    d = tmp_path / "subs" / "dave" / "01_vanilla_attention"
    d.mkdir(parents=True)
    for name in ("my_attempt.ipynb", "my_attempt_v2.ipynb"):
        (d / name).write_text(json.dumps(release_notebook("01_vanilla_attention")))
    res = workers.autograde(tmp_path / "subs", tmp_path / "ws", quiet=True)
    assert res[0].score == 0 and "missing notebook 01_vanilla_attention.ipynb" in res[0].status
    assert "my_attempt.ipynb" in res[0].status and "rename the one to grade" in res[0].status
    with pytest.raises(model.GradingError, match="does not exist"):
        workers.autograde(tmp_path / "nowhere", tmp_path / "ws", quiet=True)
    with pytest.raises(model.GradingError, match="no submissions found"):
        (tmp_path / "empty").mkdir()
        workers.autograde(tmp_path / "empty", tmp_path / "ws", quiet=True)


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


def test_a_fresh_workspace_takes_the_release_from_the_cache(tmp_path, monkeypatch):
    """The second fresh workspace of the same sources copies the release; nbgrader does not run."""
    monkeypatch.setattr(staging, "RELEASE_CACHE", tmp_path / "cache")
    a = ["01_vanilla_attention"]
    staging.prepare(tmp_path / "ws1", a)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # the new gradebook records the head of nbgrader's migrations that nbgrader's own `alembic heads` gives
    # (staging._RELEASE reads it in process)
    import sqlite3
    from nbgrader.api import get_alembic_version
    monkeypatch.setenv("PATH", staging.nbgrader_env(tmp_path)["PATH"])
    with sqlite3.connect(tmp_path / "ws1" / "gradebook.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(get_alembic_version(),)]
    monkeypatch.setattr(staging, "release", lambda *args, **kw: pytest.fail("released again"))
    staging.prepare(tmp_path / "ws2", a)
    assert (tmp_path / "ws2" / "release" / a[0] / f"{a[0]}.ipynb").is_file()
    assert {c["name"] for c in gradebook.graded_cells(tmp_path / "ws2" / "work" / "template.db", a[0])} >= {"test_small"}
