"""Grading one submission: its own nbgrader process in a private workspace, beside its judge.

A local worker (``workers.py``) and a cluster task (``cluster.py``) both grade with
:func:`grade_submission`; neither module imports the other, both import this one. A failure of the
grading machinery (the kernel did not start, the nbgrader process was killed, the run was
interrupted) never becomes a grade: the submission comes back with an :data:`UNGRADED` status, and
nothing is recorded for it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import gradebook, staging
from .model import HERE, JUDGE_ENV, NOT_WRITTEN, Result, notebooks_of
from .scan import as_records, scan_submission

# nvidia-smi numbers GPUs in PCI order; make CUDA (here and in the workers) agree
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
#: Code whose change changes grades: a recorded result made with other versions is graded again.
GRADING_SOURCES = [HERE / n for n in ("thresholds.toml", "plans.py", "checks.py", "judge.py", "scan.py")]
#: Status of a submission that was not graded for a reason of the grading machinery (a cluster task
#: lost every time, a kernel that did not start, a grader exception): no record, no gradebook
#: entry, no grade; the next run grades it.
UNGRADED = "ungraded: "
#: Set when the run is being interrupted: a worker that sees it records nothing.
STOP = threading.Event()


class Interrupted(BaseException):
    """The run was stopped by a signal (SIGINT, SIGTERM); nothing in flight was recorded.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` turns it into a grade."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


def _last_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for needle, what in (("DeadKernelError", "the kernel died (crash, segfault or killed process)"),
                         ("Kernel died", "the kernel died (crash, segfault or killed process)"),
                         ("CellTimeoutError", "a cell ran past the per-cell time limit")):
        if any(needle in ln for ln in lines):
            return what
    errs = [ln for ln in lines if "[ERROR]" in ln or "Error" in ln]
    return (errs or lines or ["(no output)"])[-1][:300]


# What nbgrader prints when the notebook's kernel never ran a cell, or lost the process above it:
# the grading machinery failed, not the submission.
_START_FAILURES = ("Kernel died before replying to kernel_info", "Kernel didn't respond in",
                   "No such kernel named", "Parent appears to have exited")


def grader_fault(rc: int | None, out: str) -> str | None:
    """Why a finished nbgrader process says nothing about the submission, or None when it does."""
    if rc is not None and rc < 0:
        return (f"the grading process was killed by signal {-rc} before it finished (not the "
                "submission's doing unless its code signals the processes above it: see its flags)")
    for needle in _START_FAILURES:
        if needle in (out or ""):
            line = next(ln for ln in out.splitlines() if needle in ln).strip()
            return f"the notebook's kernel did not start or lost its grader: {line[:200]}"
    return None


#: A record made when the notebook's kernel died: the submission's crash or a kill from outside (the OOM killer,
#: an operator), which cannot be told apart; graded again on the next run (the seeds are the same: a crash of the
#: submission's own recurs), never reused.
_DIED = "the kernel died"


def reusable(status: str) -> bool:
    """Whether a recorded status is the submission's own result; a record of the grader's failure
    (from this version or an older one, which recorded some) is graded again, never reused, and so is a
    kernel that died."""
    return not (status.startswith((UNGRADED, "grader error")) or any(n in status for n in (*_START_FAILURES, _DIED)))


_RUNNING: set = set()           # process groups of running nbgrader workers
_RUNNING_LOCK = threading.Lock()
# Starts nbgrader so that it dies with this process (Linux: PR_SET_PDEATHSIG), even when this one
# is killed with SIGKILL; the kernel then exits too (ipykernel watches its parent). It skips
# rfc3987_syntax as every grading process does (autograder/__init__.py): 3 CPU-seconds a submission.
_BOOT = """import ctypes, os, runpy, signal, sys
sys.modules["rfc3987_syntax"] = None
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
if os.getppid() != int(sys.argv.pop(1)):
    sys.exit(1)
sys.argv[0] = "nbgrader"
runpy.run_module("nbgrader", run_name="__main__", alter_sys=True)
"""


#: The environment variable each grading process tree carries (a token per run_isolated call): the notebook's
#: kernel runs in a session of its own, and once nbgrader is gone it is no child of anything here, so it is
#: found by this.
TOKEN_ENV = "FACOURSE_GRADING_TOKEN"


def run_isolated(cmd, cwd, env, timeout) -> tuple[int | None, str]:
    """Run ``cmd`` in its own session, its output in a file (a kernel that outlives it may hold a pipe open);
    on timeout, and whenever it ends, kill every process it started (the kernel included)."""
    token = f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env={**env, TOKEN_ENV: token}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        proc.token = token
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        if STOP.is_set():       # interrupted between the check before staging and this start
            _kill(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
            rc = None
        finally:
            _kill(proc)             # a kernel left behind by nbgrader goes too
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        log.seek(0)
        return rc, log.read()


def _tree(token: str) -> list[int]:
    """The processes whose environment carries ``token`` (Linux: /proc; elsewhere none are found)."""
    found, needle = [], f"{TOKEN_ENV}={token}".encode() + b"\0"
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (d / "environ").read_bytes():
                found.append(int(d.name))
        except (OSError, ValueError):
            continue
    return found


def _kill(proc) -> None:
    for pid in _tree(proc.token):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    """Interrupt the run: every worker records nothing from now on, and their processes go."""
    STOP.set()
    with _RUNNING_LOCK:
        for proc in list(_RUNNING):
            _kill(proc)


def _cell_errors(folder: Path, cell_timeout: float | None = None) -> dict[str, str]:
    """The error each graded cell of the executed notebooks ended with (grade_id -> 'Name: text'), with what
    stopped an earlier cell that is no test (a function's definition that timed out leaves a NameError)."""
    out, earlier = {}, []
    for path in sorted(folder.glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for i, cell in enumerate(cells):
            gid = staging.grade_id(cell)
            test = bool(((cell.get("metadata") or {}).get("nbgrader") or {}).get("grade"))
            for o in cell.get("outputs", []):
                if o.get("output_type") != "error":
                    continue
                text = f"{o.get('ename')}: {o.get('evalue', '')}"
                if o.get("ename") == "NotImplementedError" and not str(o.get("evalue", "")).strip():
                    text = f"NotImplementedError: {NOT_WRITTEN}"
                if o.get("ename") == "CellTimeoutError":
                    text = ("CellTimeoutError: the cell ran past the per-cell time limit"
                            + (f" ({cell_timeout:g} s)" if cell_timeout else ""))
                stopped = test and earlier and o.get("ename") == "NameError"
                note = f" (an earlier cell stopped: {earlier[-1]})" if stopped else ""
                if gid:
                    out[gid] = text[:2000] + note
                if not test:
                    earlier.append(f"cell {gid or i}: {text}"[:300])
    return out


def apply_verdicts(res: Result, verdicts: dict, judge, trusted: bool) -> None:
    """The judge's points replace nbgrader's for every autograded cell; flags may zero them."""
    for v in judge.violations:
        res.flags.append({"severity": "tamper", "where": "judge", "rule": v, "line": ""})
    tamper = [f for f in res.flags if f["severity"] == "tamper"]
    res.failed, res.messages, res.perf = [], {}, []
    for t in res.tests:
        if not t["auto"]:
            continue
        v = verdicts.get(t["name"])
        t["score"] = float(v.points) if v is not None else 0.0
        msg = v.message if v is not None else "no judge plan for this cell (autograder/plans.py)"
        if v is not None and v.perf:
            res.perf.append({**v.perf, "cell": t["name"]})
        if tamper and not trusted and t["max_score"]:
            judged = "passed" if t["score"] >= t["max_score"] else msg
            t["score"] = 0.0
            msg = ("flagged for review: " + "; ".join(f"{f['where']}: {f['rule']}" for f in tamper[:3])
                   + f" (an instructor who clears the flag re-grades with --trust STUDENT). The judge's "
                   f"own verdict: {judged}")
        if t["max_score"] and t["score"] < t["max_score"]:
            res.failed.append(t["name"])
            res.messages[t["name"]] = msg
    res.score = sum(t["score"] for t in res.tests)
    if tamper:
        res.status = ("graded; tamper flags waived by the instructor" if trusted else
                      f"flagged: {len(tamper)} tampering finding(s), judged tests score 0 pending review")


def _written_answers_by_cell_type(res: Result, template_db: Path) -> None:
    """A written answer left as released gets nbgrader's automatic 0 (an ``auto_score``): it is
    still a written answer, graded by hand, never a test the judge has no plan for."""
    code = {t["name"] for t in gradebook.graded_cells(template_db, res.assignment) if t["auto"]}
    for t in res.tests:
        t["auto"] = t["name"] in code
    res.auto_max_score = sum(t["max_score"] for t in res.tests if t["auto"])


#: what a second try may cure: a notebook kernel that never answered (its ports taken by another
#: process at start-up, under load); no student code has run by then
_RETRIED = "the notebook's kernel did not start"


def grade_submission(*args, **kwargs) -> Result:
    """:func:`grade_once`, tried a second time when the notebook's kernel did not start (the grading
    machinery's failure, before any student code ran); still ungraded after that, it is reported so."""
    res = grade_once(*args, **kwargs)
    if res.status.startswith(UNGRADED + _RETRIED):
        res = grade_once(*args, **kwargs)
    return res


def grade_once(src: Path, priv: Path, release_dir: Path, template_db: Path, student: str,
               a: str, *, timeout: float, cell_timeout: float | None, gpu: str | None, key: str,
               gpu_index: int | None = None, trusted: bool = False, seed_key: bytes | None = None) -> Result:
    """Grade the submission folder ``src`` in the private workspace ``priv``, against the release
    ``release_dir`` and the template gradebook ``template_db``: a local worker and a cluster task
    both grade with this. The judge runs here, beside the nbgrader process; the graded notebooks
    and the staged copy are left in ``priv/autograded/<student>/<a>`` and
    ``priv/submitted/<student>/<a>``. Raises :class:`Interrupted` when the run is being stopped;
    a failure of the grading machinery comes back with an :data:`UNGRADED` status. ``seed_key``
    (:func:`seeds.seed_key_for`) makes the judge's inputs the same on every regrade."""
    if STOP.is_set():
        raise Interrupted("stopped")
    res = Result(student, a, key=key, gpu=gpu or "")
    t0 = time.perf_counter()
    if priv.exists():
        shutil.rmtree(priv)
    priv.mkdir(parents=True)
    shutil.copyfile(template_db, priv / "gradebook.db")
    staged = priv / "submitted" / student / a
    staging.stage(src, staged)
    repairs = staging.repair(staged, a, release_dir)
    problem = staging.precheck(staged, a)
    if problem:
        gradebook.zero(res, template_db, f"not graded: {problem}")
    else:
        restored = [g for nb in notebooks_of(a) if (staged / f"{nb}.ipynb").exists()
                    for g in staging.restore_deleted_cells(staged / f"{nb}.ipynb", a, release_dir)]
        res.flags = as_records(scan_submission(staged, notebooks_of(a)))
        # what the judge compiles itself is read now, before any student code runs
        files = {p.name: p.read_bytes() for p in staged.glob("*.cu") if p.is_file()}
        max_points = {t["name"]: t["max_score"] for t in gradebook.graded_cells(template_db, a) if t["auto"]}
        from facourse.rule import VISIBLE_SEEDS_ENV

        from .judge import Judge            # torch: imported by the grading commands only

        judge = Judge(a, max_points, device="cpu" if gpu_index is None else f"cuda:{gpu_index}",
                      student_files=files, release_dir=release_dir / a, seed_key=seed_key)
        extra = {"FACOURSE_RELEASE": release_dir, JUDGE_ENV: judge.address}
        if seed_key:            # the visible checks' seeds: a regrade replays them (not the judge's, derived apart)
            extra[VISIBLE_SEEDS_ENV] = hmac.new(seed_key, b"visible checks", hashlib.sha256).hexdigest()
        if cell_timeout:
            extra["FACOURSE_CELL_TIMEOUT"] = int(cell_timeout)
        if gpu is not None:
            extra["CUDA_VISIBLE_DEVICES"] = gpu
        cmd = [sys.executable, "-c", _BOOT, str(os.getpid()), "autograde", a, "--student", student,
               "--force"]
        try:
            rc, out = run_isolated(cmd, HERE, staging.nbgrader_env(priv, **extra), timeout)
        finally:
            verdicts = judge.finish(_cell_errors(priv / "autograded" / student / a, cell_timeout))
        if STOP.is_set():       # killed by the interrupt, or finished as it came: either way not kept
            raise Interrupted("stopped")
        (priv / "nbgrader.log").write_text(out or "", encoding="utf-8")
        fault = grader_fault(rc, out or "") if rc is not None else None   # a timeout is the notebook's own
        if fault:
            res.status = UNGRADED + fault
            res.seconds = round(time.perf_counter() - t0, 2)
            return res
        if rc is None:
            gradebook.zero(res, template_db, f"timed out after {timeout:g} s (the whole notebook)")
        elif rc != 0 or not gradebook.read_gradebook(priv / "gradebook.db", student, a, res):
            gradebook.zero(res, template_db, f"autograde failed: {_last_error(out)}")
        else:
            _written_answers_by_cell_type(res, template_db)
            notes = ([f"deleted cells restored: {', '.join(restored)}"] if restored else []) + repairs
            if notes:
                res.status = f"graded ({'; '.join(notes)})"
            apply_verdicts(res, verdicts, judge, trusted)
    if repairs and not res.status.startswith("graded"):
        res.status += f" ({'; '.join(repairs)})"
    res.seconds = round(time.perf_counter() - t0, 2)
    return res
