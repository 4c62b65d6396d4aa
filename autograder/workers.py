"""Isolation and the worker pool: each submission graded by its own nbgrader process, beside its judge.

Each submission is graded in a private workspace (its own copy of the gradebook) by its own
``nbgrader autograde`` process, under a wall-clock limit per cell and per notebook; a hang, a
crash or a killed kernel costs that submission its points and never stops the run. While the
kernel runs, a :class:`~autograder.judge.Judge` in this process serves its hidden cells and
decides every graded cell's points; nbgrader's own scores are not used. Only this process writes
the shared gradebook, one submission at a time; every finished submission is also recorded as
results/<student>/<assignment>.json, so an interrupted run started again skips what is done.
With ``--cluster``, ``cluster.py`` sends each submission to a Ray task that grades it with the same
function (:func:`grade_submission`) on another machine; recording stays here.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from . import gradebook, staging
from .model import HERE, JUDGE_ENV, SOLUTIONS, Result, atomic_write, hash_tree, notebooks_of, result_path
from .scan import as_records, scan_submission

# nvidia-smi numbers GPUs in PCI order; make CUDA (here and in the workers) agree
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
#: Code whose change changes grades: a recorded result made with other versions is graded again.
GRADING_SOURCES = [HERE / n for n in ("thresholds.toml", "plans.py", "checks.py", "judge.py", "scan.py")]
#: Status of a submission that was not graded for a reason of the grading machinery (a cluster task
#: lost every time): no record, no gradebook entry, no grade; the next run grades it.
UNGRADED = "ungraded: "


def _last_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for needle, what in (("DeadKernelError", "the kernel died (crash, segfault or killed process)"),
                         ("Kernel died", "the kernel died (crash, segfault or killed process)"),
                         ("CellTimeoutError", "a cell ran past the per-cell time limit")):
        if any(needle in ln for ln in lines):
            return what
    errs = [ln for ln in lines if "[ERROR]" in ln or "Error" in ln]
    return (errs or lines or ["(no output)"])[-1][:300]


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


def _run_isolated(cmd, cwd, env, timeout) -> tuple[int | None, str]:
    """Run ``cmd`` in its own session; on timeout kill its whole process group (kernel included)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        return None, out
    finally:
        _kill(proc)             # a kernel left behind by a crashed nbgrader goes too
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _cell_errors(folder: Path) -> dict[str, str]:
    """The error each graded cell of the executed notebooks ended with (grade_id -> 'Name: text')."""
    out = {}
    for path in sorted(folder.glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            gid = staging.grade_id(cell)
            for o in cell.get("outputs", []):
                if gid and o.get("output_type") == "error":
                    out[gid] = f"{o.get('ename')}: {o.get('evalue', '')}"[:2000]
    return out


def _apply_verdicts(res: Result, verdicts: dict, judge, trusted: bool) -> None:
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


def grade_one(submissions: Path, workspace: Path, student: str, a: str, *, timeout: float,
              cell_timeout: float | None, gpu: str | None, key: str, gpu_index: int | None = None,
              trusted: bool = False) -> Result:
    """Grade one submission in a private workspace; write results/<student>/<a>.json."""
    t0 = time.perf_counter()
    priv = workspace / "work" / f"{student}__{a}"
    res = grade_submission(submissions / student / a, priv, workspace / "release",
                           workspace / "work" / "template.db", student, a, timeout=timeout,
                           cell_timeout=cell_timeout, gpu=gpu, key=key, gpu_index=gpu_index,
                           trusted=trusted)
    # Publish: the graded notebooks and the staged copy go to the shared workspace, then the record.
    for sub in ("autograded", "submitted"):
        src, dst = priv / sub / student / a, workspace / sub / student / a
        if dst.exists():
            shutil.rmtree(dst)
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
    res.seconds = round(time.perf_counter() - t0, 2)
    atomic_write(result_path(workspace, student, a), json.dumps(res.to_json(), indent=1))
    return res


def grade_submission(src: Path, priv: Path, release_dir: Path, template_db: Path, student: str,
                     a: str, *, timeout: float, cell_timeout: float | None, gpu: str | None, key: str,
                     gpu_index: int | None = None, trusted: bool = False) -> Result:
    """Grade the submission folder ``src`` in the private workspace ``priv``, against the release
    ``release_dir`` and the template gradebook ``template_db``: a local worker (:func:`grade_one`)
    and a cluster task (``cluster.py``) both grade with this. The judge runs here, beside the
    nbgrader process; the graded notebooks and the staged copy are left in
    ``priv/autograded/<student>/<a>`` and ``priv/submitted/<student>/<a>``."""
    res = Result(student, a, key=key, gpu=gpu or "")
    t0 = time.perf_counter()
    if priv.exists():
        shutil.rmtree(priv)
    priv.mkdir(parents=True)
    shutil.copyfile(template_db, priv / "gradebook.db")
    staged = priv / "submitted" / student / a
    staging.stage(src, staged)
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
        from .judge import Judge            # torch: imported by the grading commands only

        judge = Judge(a, max_points, device="cpu" if gpu_index is None else f"cuda:{gpu_index}",
                      student_files=files, release_dir=release_dir / a)
        extra = {"FACOURSE_RELEASE": release_dir, JUDGE_ENV: judge.address}
        if cell_timeout:
            extra["FACOURSE_CELL_TIMEOUT"] = int(cell_timeout)
        if gpu is not None:
            extra["CUDA_VISIBLE_DEVICES"] = gpu
        cmd = [sys.executable, "-c", _BOOT, str(os.getpid()), "autograde", a, "--student", student,
               "--force"]
        try:
            rc, out = _run_isolated(cmd, HERE, staging.nbgrader_env(priv, **extra), timeout)
        finally:
            verdicts = judge.finish(_cell_errors(priv / "autograded" / student / a))
        (priv / "nbgrader.log").write_text(out or "", encoding="utf-8")
        if rc is None:
            gradebook.zero(res, template_db, f"timed out after {timeout:g} s (the whole notebook)")
        elif rc != 0 or not gradebook.read_gradebook(priv / "gradebook.db", student, a, res):
            gradebook.zero(res, template_db, f"autograde failed: {_last_error(out)}")
        else:
            if restored:
                res.status = f"graded (deleted cells restored: {', '.join(restored)})"
            _apply_verdicts(res, verdicts, judge, trusted)
    res.seconds = round(time.perf_counter() - t0, 2)
    return res


def visible_gpus() -> list[str]:
    """GPU ids for workers: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(out.splitlines()) if ln.startswith("GPU ")]


def autograde(submissions: Path, workspace: Path, selected: list[str] | None = None,
              timeout: float = 1800, quiet: bool = False, jobs: int = 1,
              cell_timeout: float | None = None, force: bool = False,
              trusted: set[str] | frozenset = frozenset(), cluster: str | None = None,
              retries: int = 2) -> list[Result]:
    """Grade every <student>/<assignment> under ``submissions``; returns one Result each.

    ``jobs`` submissions run at once, each in its own nbgrader process; with GPUs present each
    worker gets one GPU (CUDA_VISIBLE_DEVICES) and no more workers run than there are GPUs, so
    timings are never shared. A result whose submission, assignment source and thresholds are
    unchanged is reused unless ``force``. Students in ``trusted`` had their tamper flags
    reviewed by an instructor: their flags are still reported but cost no points.

    ``cluster`` (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``): each submission is a task on
    that Ray cluster instead (``cluster.py``; ``jobs`` does not apply, the cluster's CPUs and GPUs
    decide); this process still writes every record and the gradebook. A task lost ``retries``
    + 1 times comes back with a status starting with :data:`UNGRADED`: nothing is recorded for
    it, so the next run grades it.
    """
    from tqdm import tqdm

    submissions = submissions.resolve()
    workspace = workspace.resolve()
    pairs = staging.discover(submissions, selected)
    todo_assignments = sorted({a for _, a in pairs})
    if cluster is not None:
        from . import cluster as ray_cluster

        ray_cluster.connect(cluster)        # no Ray, or no cluster there: say so before any work
    staging.prepare(workspace, todo_assignments)
    source_key = {a: hash_tree(SOLUTIONS / a, *GRADING_SOURCES) for a in todo_assignments}

    gpus = visible_gpus() if cluster is None else []
    jobs = max(1, int(jobs))
    if gpus and jobs > len(gpus):
        if not quiet:
            print(f"note: {len(gpus)} GPU(s) here; running {len(gpus)} workers, one GPU each "
                  f"(asked for {jobs})", file=sys.stderr)
        jobs = len(gpus)
    free_gpus: queue.Queue = queue.Queue()
    for g in gpus:
        free_gpus.put(g)

    results: dict[tuple[str, str], Result] = {}
    todo = []
    for student, a in pairs:
        key = hash_tree(submissions / student / a) + source_key[a]
        old = result_path(workspace, student, a)
        if not force and old.exists():
            try:
                prev = Result.from_json(json.loads(old.read_text(encoding="utf-8")))
            except (ValueError, TypeError):
                prev = None
            if prev is not None and prev.key == key:
                prev.reused = True
                results[(student, a)] = prev
                continue
        todo.append((student, a, key))

    def work(student, a, key):
        gpu = free_gpus.get() if gpus else None
        try:
            return grade_one(submissions, workspace, student, a, timeout=timeout,
                             cell_timeout=cell_timeout, gpu=gpu, key=key,
                             gpu_index=gpus.index(gpu) if gpu is not None else None,
                             trusted=student in trusted)
        finally:
            if gpu is not None:
                free_gpus.put(gpu)

    for res in results.values():        # reused results: make sure the gradebook has them
        gradebook.merge_into_gradebook(workspace, res)
    bar = tqdm(total=len(pairs), initial=len(results), desc="autograding", unit="submission",
               disable=quiet, file=sys.stderr)

    def record(student, a, res):        # this process only: the gradebook, then the progress bar
        if not res.status.startswith(UNGRADED):
            gradebook.merge_into_gradebook(workspace, res)
        shutil.rmtree(workspace / "work" / f"{student}__{a}", ignore_errors=True)
        results[(student, a)] = res
        bar.set_postfix_str(f"{student}/{a}: {res.score:g}/{res.max_score:g}")
        bar.update(1)

    if cluster is not None:
        try:
            for student, a, res in ray_cluster.grade(
                    todo, submissions, workspace, source_key, timeout=timeout, cell_timeout=cell_timeout,
                    trusted=trusted, retries=retries, quiet=quiet):
                record(student, a, res)
        finally:
            bar.close()
        return [results[p] for p in pairs]
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(work, *t): t for t in todo}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                student, a, key = futures[fut]
                try:
                    res = fut.result()
                except Exception as err:      # a bug of ours, not the student's: say so, go on
                    res = Result(student, a, key="", status=f"grader error: {type(err).__name__}: {err}")
                record(student, a, res)
    except BaseException:
        with _RUNNING_LOCK:
            for proc in list(_RUNNING):
                _kill(proc)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
    return [results[p] for p in pairs]


