"""Running a class: interrupts, two runs on one workspace, re-grading one student, bad inputs.

Nothing the grader does wrong may become a grade. The slow tests grade step 01's samples (alice 7,
bob 0, carol 4: a clean run's grades) through real nbgrader while they signal the command
(SIGINT, SIGTERM) at several points, start a second run beside it, or kill a worker; every grade
of the final run must equal the clean run's. The fast ones drive the worker pool with a stand-in
for the nbgrader step.
"""
import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, until
from autograder import gradebook, grader, model, staging, workers
from autograder.lock import LOCK_NAME, workspace_lock

A = "01_vanilla_attention"
CLEAN = {"alice": 7.0, "bob": 0.0, "carol": 4.0}      # step 01's samples, a clean run's grades
#: Marks the processes this module starts: other runs of step 01 may be grading on the same machine.
TAG = f"FACOURSE_GRADING_OPS_TEST={os.getpid()}".encode()


# ----------------------------------------------------------------------------- helpers
def _subs(tmp_path, students=("alice", "bob", "carol")) -> Path:
    subs = tmp_path / "subs"
    for s in students:
        shutil.copytree(model.SAMPLES / s / A, subs / s / A)
    return subs


def _cmd(ws, subs, *extra):
    return [sys.executable, "-m", "autograder", "--workspace", str(ws), "autograde", str(subs),
            "--cell-timeout", "120", *extra]


def _start(ws, subs, *extra):
    key, value = TAG.decode().split("=")
    return subprocess.Popen(_cmd(ws, subs, *extra), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, key: value})


def _in_flight(ws) -> list[str]:
    """Submissions whose nbgrader process has started (its kernel writes there)."""
    return [p.name for p in (ws / "work").glob("*__*") if (p / "gradebook.db").exists()
            and (p / "submitted").exists()] if (ws / "work").exists() else []


def _recorded(ws) -> dict[str, float]:
    return {p.parent.name: json.loads(p.read_text())["score"] for p in (ws / "results").glob(f"*/{A}.json")}


def _in_gradebook(ws) -> dict[str, float]:
    if not (ws / "gradebook.db").exists():
        return {}
    return {r.student: r.score for r in gradebook.export(ws)}


def _grading_processes() -> list[int]:
    """Pids of the nbgrader workers this module's runs started (grader._BOOT: "... autograde A
    --student S", with :data:`TAG` in their environment), and no one else's."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if not (b"autograde" in args and A.encode() in args and b"--student" in args and b"-c" in args):
                continue
            if TAG in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


def _assert_clean(ws, students=CLEAN):
    """Every grade recorded, in the gradebook and in grades.csv equals a clean run's."""
    want = {s: CLEAN[s] for s in students}
    assert _recorded(ws) == want
    assert _in_gradebook(ws) == want
    rows = (ws / "grades.csv").read_text().splitlines()[1:]
    assert {r.split(",")[0]: float(r.split(",")[2]) for r in rows} == want
    for s in students:
        r = model.Result.from_json(json.loads(model.result_path(ws, s, A).read_text()))
        assert r.status == "graded", r.status


# ----------------------------------------------------------------------------- slow: real nbgrader
@pytest.mark.slow
def test_sigint_and_sigterm_record_nothing_in_flight_and_the_rerun_equals_a_clean_run(tmp_path):
    """SIGINT while the release is prepared (before any submission starts), SIGINT with two
    notebooks running, SIGTERM after the first record: each run exits cleanly with a one-line
    summary, records nothing for the submissions in flight, leaves no process behind; the run
    that follows grades exactly as a clean run."""
    ws, subs = tmp_path / "ws", _subs(tmp_path, ("alice", "carol"))

    # 1. before a submission starts: the lock is taken, the workers are not
    proc = _start(ws, subs, "--jobs", "2")
    until(lambda: (ws / LOCK_NAME).exists() and (ws / LOCK_NAME).read_text(), "the run to take the lock")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted by SIGINT"), err
    assert not _recorded(ws) and not _in_gradebook(ws)

    # 2. mid-notebook: both submissions in flight
    proc = _start(ws, subs, "--jobs", "2")
    until(lambda: len(_in_flight(ws)) == 2 or proc.poll() is not None, "two notebooks to start")
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert last.startswith("interrupted by SIGINT: 0 of 2 submission(s) recorded"), last
    assert not _recorded(ws) and not _in_gradebook(ws), "a submission in flight was recorded"
    assert not list((ws / "work").glob("*__*")), "the stopped workers' folders were left behind"
    time.sleep(1)
    assert not _grading_processes(), _grading_processes()

    # 3. SIGTERM once the first submission is recorded, the second still in flight
    proc = _start(ws, subs, "--jobs", "1")
    until(lambda: _recorded(ws) or proc.poll() is not None, "the first record")
    until(lambda: _in_flight(ws) or proc.poll() is not None, "the second notebook to start", 60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert last.startswith("interrupted by SIGTERM: 1 of 2 submission(s) recorded"), last
    assert _recorded(ws) == {"alice": CLEAN["alice"]} and _in_gradebook(ws) == {"alice": CLEAN["alice"]}

    # the run after: alice reused, carol graded; every grade as a clean run's
    r = subprocess.run(_cmd(ws, subs, "--jobs", "2"), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 unchanged since the last run, reused" in r.stdout
    _assert_clean(ws, ("alice", "carol"))


@pytest.mark.slow
def test_two_runs_on_one_workspace_and_regrading_one_student(tmp_path):
    """A second run started while the first grades refuses (exit 2, a plain message, nothing touched);
    with --wait it queues behind the first, then reuses its grades; --student re-grades that
    student alone; a worker killed from outside leaves its submission ungraded (no 0), and the
    next run grades it. Every final grade equals a clean run's."""
    ws, subs = tmp_path / "ws", _subs(tmp_path, ("alice", "bob"))
    first = _start(ws, subs, "--jobs", "2")
    until(lambda: (ws / LOCK_NAME).exists() and (ws / LOCK_NAME).read_text(), "the first run to take the lock")
    waiting = _start(ws, subs, "--wait")
    second = subprocess.run(_cmd(ws, subs), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    assert second.stderr.startswith("error: another grading run is using the workspace")
    assert f"pid {first.pid}" in second.stderr and "--wait" in second.stderr
    assert "Traceback" not in second.stderr
    out, err = first.communicate(timeout=400)
    assert first.returncode == 0, err[-2000:]
    out, err = waiting.communicate(timeout=400)
    assert waiting.returncode == 0 and "waiting for the grading run that holds" in err, err[-2000:]
    assert "2 unchanged since the last run, reused" in out, out
    _assert_clean(ws, ("alice", "bob"))

    # --student: bob alone, afresh; alice's record untouched, the CSV still has both
    before = {s: model.result_path(ws, s, A).stat().st_mtime_ns for s in ("alice",)}
    r = subprocess.run(_cmd(ws, subs, "--student", "bob"), cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {s: model.result_path(ws, s, A).stat().st_mtime_ns for s in ("alice",)} == before
    _assert_clean(ws, ("alice", "bob"))

    # a lost worker: bob's nbgrader killed from outside; bob is not recorded, the others are kept
    model.result_path(ws, "bob", A).unlink()
    proc = _start(ws, subs, "--student", "bob")
    until(lambda: _grading_processes() or proc.poll() is not None, "bob's nbgrader")
    time.sleep(1)
    for pid in _grading_processes():
        os.killpg(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "bob/01_vanilla_attention: ungraded: the grading process was killed" in err, err
    assert "bob" not in _recorded(ws)
    r = subprocess.run(_cmd(ws, subs), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_clean(ws, ("alice", "bob"))


@pytest.mark.slow
def test_renamed_notebook_and_changed_grade_ids_are_repaired(tmp_path):
    """alice's notebook under another name, her solution cell's grade_id changed and a test cell's
    removed (nbgrader: KeyError 'grade_id', 0) grades as her clean run, and the status says why."""
    d = tmp_path / "subs" / "dave" / A
    d.mkdir(parents=True)
    nb = json.loads((model.SAMPLES / "alice" / A / f"{A}.ipynb").read_text())
    ids = [staging.grade_id(c) for c in nb["cells"]]
    sol = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    sol["metadata"]["nbgrader"]["grade_id"] = "my_version"
    test = nb["cells"][ids.index("test_small")]
    del test["metadata"]["nbgrader"]["grade_id"]
    (d / "attention_final.ipynb").write_text(json.dumps(nb))
    (res,) = workers.autograde(tmp_path / "subs", tmp_path / "ws", quiet=True, cell_timeout=120)
    assert res.score == CLEAN["alice"], (res.status, res.messages)
    assert res.status.startswith("graded") and "attention_final.ipynb taken as" in res.status, res.status
    assert "graded as the release's" in res.status, res.status


@pytest.mark.slow
def test_a_kernel_that_does_not_start_is_not_a_grade(tmp_path, monkeypatch):
    """A broken Jupyter set-up (the python3 kernel exits at once: nbgrader prints "Kernel died
    before replying to kernel_info" and gives 0): alice's submission is left ungraded, nothing
    recorded; once the kernel starts again she gets her clean run's grade (with Jupyter's own kernel, as
    grading starts it: the rest of the suite's kernels are tools/fast_kernel.py's)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-c", "raise SystemExit(1)",
                                                           "{connection_file}"],
                                                  "display_name": "Python 3", "language": "python"}))
    ws, subs = tmp_path / "ws", _subs(tmp_path, ("alice",))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    (res,) = workers.autograde(subs, ws, quiet=True, cell_timeout=120)
    assert res.status.startswith(grader.UNGRADED + "the notebook's kernel did not start"), res.status
    assert not _recorded(ws) and not _in_gradebook(ws)
    monkeypatch.delenv("JUPYTER_PATH")
    (res,) = workers.autograde(subs, ws, quiet=True, cell_timeout=120)
    assert (res.score, res.status, res.reused) == (CLEAN["alice"], "graded", False)
    assert _recorded(ws) == _in_gradebook(ws) == {"alice": CLEAN["alice"]}


@pytest.mark.slow
def test_a_deleted_written_answer_is_a_written_answer(tmp_path):
    """alice's step 02 without its written answer: the cell comes back from the release, nbgrader
    gives it an automatic 0, and it stays a written answer (no "no judge plan"); her tests score
    as in her clean run (8 of the 10 points; the 2 written ones are the instructor's)."""
    a = "02_safe_softmax"
    d = tmp_path / "subs" / "alice" / a
    shutil.copytree(model.SAMPLES / "alice" / a, d)
    nb = json.loads((d / f"{a}.ipynb").read_text())
    nb["cells"] = [c for c in nb["cells"] if staging.grade_id(c) != "written_safe_softmax"]
    (d / f"{a}.ipynb").write_text(json.dumps(nb))
    (res,) = workers.autograde(tmp_path / "subs", tmp_path / "ws", quiet=True, cell_timeout=120)
    assert (res.score, res.max_score, res.auto_max_score) == (8, 10, 8), res
    assert res.failed == [] and not res.messages, (res.failed, res.messages)
    assert "deleted cells restored: written_safe_softmax" in res.status, res.status
    written = [t for t in res.tests if t["name"] == "written_safe_softmax"]
    assert written and not written[0]["auto"], res.tests


# ----------------------------------------------------------------------------- fast: a stand-in grader
def _fake_subs(tmp_path, students=("s1", "s2", "s3", "s4")) -> Path:
    subs = tmp_path / "subs"
    for s in students:
        d = subs / s / A
        d.mkdir(parents=True)
        (d / f"{A}.ipynb").write_text(json.dumps({"cells": [], "student": s}))
    return subs


def _fake_grade_one(submissions, workspace, student, a, *, key, **_):
    res = model.Result(student, a, score=7.0, max_score=7.0, key=key)
    (workspace / "autograded" / student / a).mkdir(parents=True, exist_ok=True)    # as workers.grade_one publishes
    model.atomic_write(model.result_path(workspace, student, a), json.dumps(res.to_json()))
    return res


def test_a_graded_record_without_its_graded_notebook_is_graded_again(tmp_path, monkeypatch):
    """The formgrader grades written answers on the graded notebook: a record whose notebook is gone (nbgrader
    clears it before a refusal, or a person deleted it) is graded again; one that died is too."""
    monkeypatch.setattr(workers, "grade_one", _fake_grade_one)
    ws, subs = tmp_path / "ws", _fake_subs(tmp_path, ("s1", "s2", "s3"))
    workers.autograde(subs, ws, quiet=True)
    shutil.rmtree(ws / "autograded" / "s1" / A)
    path = model.result_path(ws, "s2", A)
    path.write_text(json.dumps({**json.loads(path.read_text()), "score": 0.0,
                                "status": "autograde failed: the kernel died (crash, segfault or killed process)"}))
    res = {r.student: r for r in workers.autograde(subs, ws, quiet=True)}
    assert [res[s].reused for s in ("s1", "s2", "s3")] == [False, False, True]


def test_a_notebook_that_cannot_be_read_awaits_no_grading_by_hand(tmp_path):
    """Step 02's notebook as broken JSON: 0 with a plain reason, and its written answer is unanswered, not an
    answer waiting for an instructor (no pending points, no review in the export)."""
    from autograder import manual
    a = "02_safe_softmax"
    (tmp_path / "subs" / "dave" / a).mkdir(parents=True)
    (tmp_path / "subs" / "dave" / a / f"{a}.ipynb").write_text("{ not json")
    (res,) = workers.autograde(tmp_path / "subs", tmp_path / "ws", quiet=True)
    assert res.status.startswith("not graded") and res.score == 0, res.status
    (shown,) = manual.with_manual_grades(tmp_path / "ws", [res])
    assert shown.manual_pending == 0 and any(t.get("manual") == manual.UNANSWERED for t in shown.tests), shown.tests


def test_a_notebook_past_its_time_limit_is_recorded_once_as_zero(tmp_path, monkeypatch):
    """nbgrader killed at the notebook's limit leaves its kernel saying "Parent appears to have exited": that is
    the submission's timeout (every test 0, recorded), not a kernel that did not start (ungraded, tried twice).
    The visible checks' seeds handed to the kernel are the submission's own: the same on a regrade."""
    calls = []

    def timed_out(cmd, cwd, env, timeout):
        calls.append(env.get("FACOURSE_VISIBLE_SEEDS"))
        return None, "[IPKernelApp] WARNING | Parent appears to have exited, shutting down."

    monkeypatch.setattr(grader, "run_isolated", timed_out)
    ws, subs = tmp_path / "ws", _subs(tmp_path, ("alice", "bob"))
    res = {r.student: r for r in workers.autograde(subs, ws, quiet=True, timeout=5)}
    assert len(calls) == 2 and all(calls) and calls[0] != calls[1], calls
    for r in res.values():
        assert r.status.startswith("timed out after 5 s") and r.score == 0, r.status
    assert _recorded(ws) == {"alice": 0.0, "bob": 0.0}
    workers.autograde(subs, ws, quiet=True, timeout=5, force=True)
    assert sorted(calls[2:]) == sorted(calls[:2])


def test_a_signal_while_the_gradebook_is_written_finishes_that_write_then_stops(tmp_path, monkeypatch):
    """SIGINT arriving in the middle of a gradebook write: the write completes (record and
    gradebook agree), the submissions not yet graded record nothing, the run raises Interrupted."""
    merged, real_merge = [], gradebook.merge_into_gradebook
    handler_before = signal.getsignal(signal.SIGINT)    # SIG_IGN where the suite runs as a background job

    def merge(workspace, res):
        if res.student == "s1":
            os.kill(os.getpid(), signal.SIGINT)     # lands mid-write
            time.sleep(0.2)
        real_merge(workspace, res)
        merged.append(res.student)

    def slow_grade_one(*args, **kw):     # stops as grader.grade_submission does
        time.sleep(0.5)
        if grader.STOP.is_set():
            raise grader.Interrupted("stopped")
        return _fake_grade_one(*args, **kw)

    monkeypatch.setattr(gradebook, "merge_into_gradebook", merge)
    monkeypatch.setattr(workers, "grade_one", slow_grade_one)
    ws = tmp_path / "ws"
    with pytest.raises(grader.Interrupted) as err:
        workers.autograde(_fake_subs(tmp_path), ws, quiet=True, jobs=1)
    assert err.value.signame == "SIGINT" and "not recorded" in err.value.summary
    assert merged and merged[0] == "s1"
    recorded = {p.parent.name for p in (ws / "results").glob("*/*.json")}
    assert recorded == set(merged) == {r.student for r in gradebook.export(ws)}, (recorded, merged)
    assert recorded == {"s1"}, "the run did not stop"
    assert signal.getsignal(signal.SIGINT) is handler_before, "the run left its own SIGINT handler behind"


def test_the_grading_machinery_failing_is_never_a_grade(tmp_path, monkeypatch):
    """A grader exception and a kernel that never started leave the submission ungraded: no
    record, nothing in the gradebook; the next run grades it."""
    def broken(submissions, workspace, student, a, *, key, **kw):
        if student == "s2":
            raise RuntimeError("a bug of the grader")
        if student == "s3":
            return model.Result(student, a, key=key, status=grader.UNGRADED + "the notebook's kernel did not start")
        return _fake_grade_one(submissions, workspace, student, a, key=key)

    monkeypatch.setattr(workers, "grade_one", broken)
    ws, subs = tmp_path / "ws", _fake_subs(tmp_path)
    res = {r.student: r for r in workers.autograde(subs, ws, quiet=True, jobs=2)}
    assert res["s2"].status.startswith(grader.UNGRADED + "grader error: RuntimeError")
    assert res["s3"].status.startswith(grader.UNGRADED)
    assert {p.parent.name for p in (ws / "results").glob("*/*.json")} == {"s1", "s4"}
    assert {r.student for r in gradebook.export(ws)} == {"s1", "s4"}
    monkeypatch.setattr(workers, "grade_one", _fake_grade_one)
    res = {r.student: r for r in workers.autograde(subs, ws, quiet=True)}
    assert [res[s].reused for s in ("s1", "s2", "s3", "s4")] == [True, False, False, True]
    assert all(r.score == 7 for r in res.values())


def test_what_nbgrader_says_when_the_grader_failed():
    assert grader.grader_fault(-9, "") and grader.grader_fault(-15, "anything")
    assert "did not start" in grader.grader_fault(1, "[AutogradeApp | ERROR] RuntimeError: Kernel died "
                                                     "before replying to kernel_info")
    assert grader.grader_fault(1, "Parent appears to have exited, shutting down.")
    # the submission's own doing: graded (0 with its reason), not a fault of the grader
    assert grader.grader_fault(1, "nbclient.exceptions.DeadKernelError: Kernel died") is None
    assert grader.grader_fault(None, "") is None and grader.grader_fault(0, "") is None


def test_a_recorded_grader_failure_is_graded_again(tmp_path, monkeypatch):
    """Records of the grader's own failures (as an older version wrote them: a kernel that lost
    its parent, a grader exception) are never reused as up to date."""
    monkeypatch.setattr(workers, "grade_one", _fake_grade_one)
    ws, subs = tmp_path / "ws", _fake_subs(tmp_path, ("s1", "s2", "s3"))
    workers.autograde(subs, ws, quiet=True)
    for s, status in (("s1", "autograde failed: [IPKernelApp] WARNING | Parent appears to have exited, "
                             "shutting down."), ("s2", "grader error: FileNotFoundError: nbgrader.log")):
        path = model.result_path(ws, s, A)
        rec = json.loads(path.read_text())
        path.write_text(json.dumps({**rec, "score": 0.0, "status": status}))
    res = {r.student: r for r in workers.autograde(subs, ws, quiet=True)}
    assert [res[s].reused for s in ("s1", "s2", "s3")] == [False, False, True]
    assert all(r.score == 7 for r in res.values())


def test_student_selects_and_regrades_only_those(tmp_path, monkeypatch):
    graded = []

    def counting(*args, **kw):
        graded.append(args[2])
        return _fake_grade_one(*args, **kw)

    monkeypatch.setattr(workers, "grade_one", counting)
    ws, subs = tmp_path / "ws", _fake_subs(tmp_path)
    workers.autograde(subs, ws, quiet=True)
    graded.clear()
    res = workers.autograde(subs, ws, quiet=True, students=["s2", "s4"])
    assert sorted(graded) == ["s2", "s4"] and [r.student for r in res] == ["s2", "s4"]
    assert not any(r.reused for r in res)
    with pytest.raises(model.GradingError, match="no submission folder for student nobody"):
        workers.autograde(subs, ws, quiet=True, students=["nobody"])


def test_unknown_assignments_and_loose_files_are_listed_as_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(workers, "grade_one", _fake_grade_one)
    subs = _fake_subs(tmp_path, ("s1",))
    (subs / "s1" / "01_vanila_attention").mkdir()
    (subs / "s1" / "notes.txt").write_text("hi")
    (subs / "s1" / "02_safe_softmax.ipynb").write_text("{}")
    (subs / "roster.csv").write_text("s1\n")
    skipped = []
    res = workers.autograde(subs, tmp_path / "ws", skipped=skipped)
    assert [r.assignment for r in res] == [A]
    assert any("s1/01_vanila_attention: not an assignment" in s and f"did you mean {A}/" in s for s in skipped)
    assert any("s1/02_safe_softmax.ipynb: a file, not an assignment folder" in s for s in skipped)
    assert any("s1/notes.txt" in s for s in skipped)
    assert "roster.csv: a file, not a student's folder" in skipped
    assert "skipped 4 folder(s) or file(s)" in capsys.readouterr().err
    with pytest.raises(model.GradingError, match="no assignment 99_x"):
        workers.autograde(subs, tmp_path / "ws", ["99_x"], quiet=True)


def test_the_workspace_lock_refuses_or_waits(tmp_path):
    ws = tmp_path / "ws"
    with workspace_lock(ws):
        with pytest.raises(model.GradingError, match=f"pid {os.getpid()}.*--wait"):
            with workspace_lock(ws):
                pass
        got = []
        t = threading.Thread(target=lambda: got.append(workspace_lock(ws, wait=True, quiet=True).__enter__()))
        t.start()
        time.sleep(0.3)
        assert not got, "a waiting run did not wait"
    t.join(5)
    assert got == [None]


def test_repair_names_each_change(tmp_path):
    rel = json.loads((ROOT / "exercises" / A / f"{A}.ipynb").read_text())
    nb = json.loads(json.dumps(rel))
    cells = nb["cells"]
    ids = [staging.grade_id(c) for c in cells]
    cells[ids.index("test_small")]["metadata"]["nbgrader"]["grade_id"] = "test_renamed"
    cells.append(json.loads(json.dumps(cells[ids.index("test_medium")])))     # a pasted copy of a test
    own = json.loads(json.dumps(next(c for c in cells if c["metadata"]["nbgrader"].get("solution"))))
    cells.append(own)          # a copy of the solution cell: the student's own code from now on
    nb["metadata"]["kernelspec"] = {"name": "conda-env-myenv-py", "display_name": "mine", "language": "python"}
    d = tmp_path / "sub"
    d.mkdir()
    (d / "mine.ipynb").write_text(json.dumps(nb))
    notes = staging.repair(d, A, ROOT / "exercises")
    out = json.loads((d / f"{A}.ipynb").read_text())["cells"]
    got = [staging.grade_id(c) for c in out]
    assert got.count("test_small") == 1 and got.count("test_medium") == 1 and "test_renamed" not in got
    assert len(out) == len(cells) - 1 and "nbgrader" not in out[-1]["metadata"]
    assert notes[0] == f"mine.ipynb taken as {A}.ipynb, the notebook of {A}"
    assert any("'test_renamed') graded as the release's 'test_small'" in n for n in notes), notes
    assert any("a copy of a locked cell, left out" in n for n in notes), notes
    assert any("run as the student's own code" in n for n in notes), notes
    assert "kernel 'conda-env-myenv-py' replaced by the release's 'python3'" in notes
    assert json.loads((d / f"{A}.ipynb").read_text())["metadata"]["kernelspec"]["name"] == "python3"
    assert staging.repair(d, A, ROOT / "exercises") == []


def test_untouched_written_answer_is_a_written_answer(tmp_path):
    """nbgrader gives an untouched written answer an automatic 0; it stays a written answer."""
    staging.prepare(tmp_path / "ws", ["02_safe_softmax"])
    template = tmp_path / "ws" / "work" / "template.db"
    res = model.Result("bob", "02_safe_softmax")
    res.tests = [{"name": "written_safe_softmax", "notebook": "02_safe_softmax", "max_score": 2.0,
                  "auto": True, "score": 0.0},
                 {"name": "test_small", "notebook": "02_safe_softmax", "max_score": 1.0, "auto": True,
                  "score": 0.0}]
    grader._written_answers_by_cell_type(res, template)
    assert [t["auto"] for t in res.tests] == [False, True] and res.auto_max_score == 1.0


def test_no_import_circle_in_the_autograder():
    """No module of autograder/ imports, even inside a function, one that imports it back."""
    pkg = ROOT / "autograder"
    deps = {}
    for path in pkg.glob("*.py"):
        mods = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                mods |= {node.module} if node.module else {a.name for a in node.names}
        deps[path.stem] = {m.split(".")[0] for m in mods if (pkg / f"{m.split('.')[0]}.py").exists()}

    def reach(start, seen):
        for m in deps.get(start, ()):
            if m not in seen:
                seen.add(m)
                reach(m, seen)
        return seen

    circles = sorted(m for m in deps if m in reach(m, set()))
    assert "workers" not in circles and "cluster" not in circles, circles


def test_a_kernel_that_did_not_start_is_tried_once_more(monkeypatch):
    """A notebook kernel that never answered (its ports taken at start-up under load) is the grading
    machinery's failure, before any student code ran: one more try; other faults are not retried."""
    tries = []

    def once(*args, **kw):
        tries.append(1)
        res = model.Result("s", "01_vanilla_attention", key="k")
        res.status = outcomes.pop(0)
        return res

    monkeypatch.setattr(grader, "grade_once", once)
    started_late = grader.UNGRADED + "the notebook's kernel did not start or lost its grader: Kernel died"
    outcomes = [started_late, "graded"]
    assert grader.grade_submission().status == "graded" and len(tries) == 2
    tries.clear()
    outcomes = [started_late, started_late]
    assert grader.grade_submission().status == started_late and len(tries) == 2
    tries.clear()
    killed = grader.UNGRADED + "the grading process was killed by signal 9 before it finished"
    outcomes = [killed]
    assert grader.grade_submission().status == killed and len(tries) == 1
