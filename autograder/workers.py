"""The worker pool: submissions graded side by side, each by its own nbgrader process and judge.

Each submission is graded in a private workspace (its own copy of the gradebook) by its own
``nbgrader autograde`` process (``grader.py``), under a wall-clock limit per cell and per
notebook; a hang, a crash or a killed kernel costs that submission its points and never stops the
run. Only this process writes the shared gradebook, one submission at a time; every finished
submission is also recorded as results/<student>/<assignment>.json, so an interrupted run started
again skips what is done. One run at a time holds a workspace (``lock.py``). SIGINT and SIGTERM
stop a run cleanly: the submissions in flight record nothing, the finished ones stay recorded.
With ``--cluster``, ``cluster.py`` sends each submission to a Ray task that grades it with the
same function (:func:`grader.grade_submission`) on another machine; recording stays here.
"""
from __future__ import annotations

import contextlib
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
from .grader import GRADING_SOURCES, STOP, UNGRADED, Interrupted, grade_submission, reusable, stop_all
from .lock import workspace_lock
from .model import SOLUTIONS, Result, atomic_write, hash_tree, result_path
from .seeds import seed_key_for

#: Seconds a whole notebook may run, per step, unless --timeout says otherwise: about ten times the
#: slowest submission measured on a CPU machine or an H100 (autograder/README.md, "Grading times
#: and timeouts"), so that a hung notebook frees its worker in minutes, not half an hour.
NOTEBOOK_TIMEOUT = {
    "01_vanilla_attention": 300, "02_safe_softmax": 300, "03_online_softmax": 300,
    "04_tiled_attention": 400, "05_triton_flash_attention": 600, "06_cuda_flash_attention": 900,
    "07_hopper_flash_attention": 1500, "08_backward": 1050, "09_decode_paged_kv": 600,
    "10_attention_variants": 1100, "11_interchangeable_kernels": 900, "12_ring_attention": 300,
}
DEFAULT_NOTEBOOK_TIMEOUT = 900


def notebook_timeout(a: str, timeout: float | None = None) -> float:
    """The whole notebook's limit for assignment ``a``: ``timeout`` when given, else the step's."""
    return float(timeout) if timeout else float(NOTEBOOK_TIMEOUT.get(a, DEFAULT_NOTEBOOK_TIMEOUT))


def cell_timeout_for(a: str, cell_timeout: float | None, timeout: float | None = None) -> float:
    """One cell's limit: ``cell_timeout``, else FACOURSE_CELL_TIMEOUT, else half the notebook's
    (a hung cell then scores 0 on its own and the notebook's other tests still run)."""
    if cell_timeout:
        return float(cell_timeout)
    if os.environ.get("FACOURSE_CELL_TIMEOUT"):
        return float(os.environ["FACOURSE_CELL_TIMEOUT"])
    return max(60.0, notebook_timeout(a, timeout) / 2)


def grade_one(submissions: Path, workspace: Path, student: str, a: str, *, timeout: float,
              cell_timeout: float | None, gpu: str | None, key: str, gpu_index: int | None = None,
              trusted: bool = False) -> Result:
    """Grade one submission in a private workspace; write results/<student>/<a>.json (not for a
    submission the grading machinery failed: :data:`UNGRADED`)."""
    t0 = time.perf_counter()
    priv = workspace / "work" / f"{student}__{a}"
    res = grade_submission(submissions / student / a, priv, workspace / "release",
                           workspace / "work" / "template.db", student, a, timeout=timeout,
                           cell_timeout=cell_timeout, gpu=gpu, key=key, gpu_index=gpu_index,
                           trusted=trusted, seed_key=seed_key_for(workspace, student, a))
    if res.status.startswith(UNGRADED):
        return res
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


@contextlib.contextmanager
def _signals(state: dict):
    """SIGINT and SIGTERM while grading: before the workers start, stop at once (nothing is
    recorded yet); once they run, :func:`grader.stop_all` and let the pool wind down, so that no
    record and no gradebook write is cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        state.setdefault("signal", signal.Signals(signum).name)
        if state.get("defer"):
            stop_all()
        else:
            raise Interrupted(state["signal"])

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def autograde(submissions: Path, workspace: Path, selected: list[str] | None = None,
              timeout: float | None = None, quiet: bool = False, jobs: int = 1,
              cell_timeout: float | None = None, force: bool = False,
              trusted: set[str] | frozenset = frozenset(), cluster: str | None = None,
              retries: int = 2, students: list[str] | None = None, wait_lock: bool = False,
              skipped: list[str] | None = None) -> list[Result]:
    """Grade every <student>/<assignment> under ``submissions``; returns one Result each.

    ``jobs`` submissions run at once, each in its own nbgrader process; with GPUs present each
    worker gets one GPU (CUDA_VISIBLE_DEVICES) and no more workers run than there are GPUs, so
    timings are never shared. A result whose submission, assignment source and thresholds are
    unchanged is reused unless ``force``; ``students`` grades only those, afresh. Students in
    ``trusted`` had their tamper flags reviewed by an instructor: their flags are still reported
    but cost no points. ``timeout`` (the whole notebook) and ``cell_timeout`` default per step
    (:data:`NOTEBOOK_TIMEOUT`). Folders that are not assignments are listed in ``skipped``.

    One run at a time per workspace: another run's lock makes this one refuse
    (:class:`GradingError`), or wait with ``wait_lock``. SIGINT or SIGTERM raise
    :class:`grader.Interrupted` once every worker has stopped; the submissions in flight record
    nothing (its ``summary`` says how many), the finished ones stay recorded.

    ``cluster`` (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``): each submission is a task on
    that Ray cluster instead (``cluster.py``; ``jobs`` does not apply, the cluster's CPUs and GPUs
    decide); this process still writes every record and the gradebook. A task lost ``retries``
    + 1 times comes back with a status starting with :data:`UNGRADED`: nothing is recorded for
    it, so the next run grades it.
    """
    submissions = submissions.resolve()
    workspace = workspace.resolve()
    skipped = [] if skipped is None else skipped
    pairs = staging.discover(submissions, selected, students, skipped)
    if skipped and not quiet:
        print(f"skipped {len(skipped)} folder(s) or file(s) that are not submissions:", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)
    state: dict = {}
    STOP.clear()
    with _signals(state), workspace_lock(workspace, wait=wait_lock, quiet=quiet):
        return _autograde(submissions, workspace, pairs, state, timeout=timeout, quiet=quiet,
                          jobs=jobs, cell_timeout=cell_timeout, force=force or bool(students),
                          trusted=trusted, cluster=cluster, retries=retries)


def _autograde(submissions, workspace, pairs, state, *, timeout, quiet, jobs, cell_timeout, force,
               trusted, cluster, retries) -> list[Result]:
    from tqdm import tqdm

    todo_assignments = sorted({a for _, a in pairs})
    if cluster is not None:
        from . import cluster as ray_cluster

        ray_cluster.connect(cluster)        # no Ray, or no cluster there: say so before any work
    staging.prepare(workspace, todo_assignments)
    source_key = {a: hash_tree(SOLUTIONS / a, *GRADING_SOURCES) for a in todo_assignments}
    limits = {a: (notebook_timeout(a, timeout), cell_timeout_for(a, cell_timeout, timeout))
              for a in todo_assignments}

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
            # a graded record whose graded notebook is gone (deleted by hand, or by nbgrader before a refusal)
            # is graded again: the formgrader grades written answers on that notebook
            graded_copy = (workspace / "autograded" / student / a).is_dir()
            if (prev is not None and prev.key == key and reusable(prev.status)
                    and (graded_copy or not prev.status.startswith(("graded", "flagged")))):
                prev.reused = True
                results[(student, a)] = prev
                continue
        todo.append((student, a, key))

    def work(student, a, key):
        gpu = free_gpus.get() if gpus else None
        try:
            return grade_one(submissions, workspace, student, a, timeout=limits[a][0],
                             cell_timeout=limits[a][1], gpu=gpu, key=key,
                             gpu_index=gpus.index(gpu) if gpu is not None else None,
                             trusted=student in trusted)
        finally:
            if gpu is not None:
                free_gpus.put(gpu)

    for res in results.values():        # reused results: make sure the gradebook has them
        gradebook.merge_into_gradebook(workspace, res)
    reused = len(results)
    bar = tqdm(total=len(pairs), initial=len(results), desc="autograding", unit="submission",
               disable=quiet, file=sys.stderr)

    def record(student, a, res):        # this process only: the gradebook, then the progress bar
        if not res.status.startswith(UNGRADED):
            gradebook.merge_into_gradebook(workspace, res)
        shutil.rmtree(workspace / "work" / f"{student}__{a}", ignore_errors=True)
        results[(student, a)] = res
        bar.set_postfix_str(f"{student}/{a}: {res.score:g}/{res.max_score:g}")
        bar.update(1)

    def interrupted() -> Interrupted:
        for student, a, _ in todo:      # what stopped workers left behind
            if (student, a) not in results:
                shutil.rmtree(workspace / "work" / f"{student}__{a}", ignore_errors=True)
        err = Interrupted(state.get("signal", "a signal"))
        done = [r for r in results.values() if not r.status.startswith(UNGRADED)]
        err.summary = (f"interrupted by {err.signame}: {len(done)} of {len(pairs)} submission(s) "
                       f"recorded ({reused} reused from earlier runs), {len(pairs) - len(done)} not "
                       "recorded, nothing of them kept; run the same command again to grade them")
        return err

    state["defer"] = True
    if cluster is not None:
        try:
            for student, a, res in ray_cluster.grade(
                    todo, submissions, workspace, source_key, limits=limits, trusted=trusted,
                    retries=retries, quiet=quiet, stop=STOP):
                record(student, a, res)
        finally:
            bar.close()
        if STOP.is_set():
            raise interrupted()
        return [results[p] for p in pairs]
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(work, *t): t for t in todo}
    pending = set(futures)

    def collect(done):
        for fut in done:
            student, a, key = futures[fut]
            if fut.cancelled():
                continue
            try:
                res = fut.result()
            except Interrupted:         # stopped in flight: nothing recorded
                continue
            except Exception as err:    # a bug of ours, not the student's: no grade, say so, go on
                res = Result(student, a, key="", status=f"{UNGRADED}grader error: {type(err).__name__}: {err}")
            record(student, a, res)

    try:
        while pending and not STOP.is_set():
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            collect(done)
        if STOP.is_set():
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()                  # a worker that started since the signal
            # a cancelled future never counts as done for wait(): wait for the running ones only
            done, pending = wait({f for f in pending if not f.cancelled()}, timeout=120)
            collect(done)               # finished before the signal: recorded like any other
            raise interrupted()
    except BaseException:
        stop_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
    return [results[p] for p in pairs]
