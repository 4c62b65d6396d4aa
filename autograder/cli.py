"""`python -m autograder`: regenerate the release, autograde submissions, report, export, bundle.

    python -m autograder release                  # solutions/ -> exercises/ (nbgrader generate_assignment)
    python -m autograder autograde SUBMISSIONS    # SUBMISSIONS/<student>/<assignment>/<notebook>.ipynb
           [--jobs N] [--timeout S] [--cell-timeout S] [--force]
    python -m autograder report                   # grades CSV + HTML report from the workspace
    python -m autograder export                   # grades CSV + table from the gradebook
    python -m autograder demo                     # release, autograde autograder/samples, print grades
    python -m autograder bundle OUT.zip           # the student archive: no solutions, no autograder

Each submission is graded by its own nbgrader process, in a private workspace with its own copy
of the gradebook, under a wall-clock limit per cell and per notebook; a hang, a crash or a killed
kernel costs that submission its points and never stops the run. Only this process writes the
shared gradebook, one submission at a time, and every finished submission is also recorded as
results/<student>/<assignment>.json, so an interrupted run started again skips what is done
(`--force` re-grades) and loses no grade. The original submission files are never modified.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
SAMPLES = HERE / "samples"
DEFAULT_WORKSPACE = ROOT / "grading"
PERF_TAG = "FACOURSE_PERF "        # a perf cell prints this, then one JSON object (autograder/perf.py)


class GradingError(Exception):
    """A problem with the command's input that the user can fix; printed without a traceback."""


@dataclass
class Result:
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    auto_max_score: float = 0.0   # points the autograder decides (max_score less written answers)
    manual_pending: float = 0.0   # points of written answers that wait for an instructor
    status: str = "graded"
    failed: list = field(default_factory=list)
    messages: dict = field(default_factory=dict)
    seconds: float = 0.0
    tests: list = field(default_factory=list)   # {name, notebook, score, max_score, auto}
    perf: list = field(default_factory=list)    # records printed by perf cells (GPU tier)
    key: str = ""                 # hash of submission + assignment source + thresholds
    gpu: str = ""                 # CUDA_VISIBLE_DEVICES the worker ran with ("" = none set)
    reused: bool = False          # True when a finished result was reused instead of re-grading

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("reused")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Result":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


# ----------------------------------------------------------------------------- helpers
def assignments() -> list[str]:
    """Assignment ids: folders of solutions/ that hold a notebook."""
    if not SOLUTIONS.is_dir():
        raise GradingError(f"no solutions/ folder at {SOLUTIONS}")
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def notebooks_of(assignment: str) -> list[str]:
    return sorted(p.stem for p in (SOLUTIONS / assignment).glob("*.ipynb"))


def _env(workspace: Path, **extra) -> dict:
    env = dict(os.environ)
    # nbgrader shells out to `alembic`: the interpreter's bin/ must be on PATH.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["FACOURSE_WORKSPACE"] = str(workspace)
    # Hidden tests import grading helpers (autograder.perf, autograder.guards) from the repository.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_nbgrader(args: list[str], workspace: Path, timeout: float | None = None, **extra):
    """Run one nbgrader command in its own process, with the course's nbgrader_config.py."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    return subprocess.run(cmd, cwd=HERE, env=_env(workspace, **extra), capture_output=True,
                          text=True, timeout=timeout)


def _last_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for needle, what in (("DeadKernelError", "the kernel died (crash, segfault or killed process)"),
                         ("Kernel died", "the kernel died (crash, segfault or killed process)"),
                         ("CellTimeoutError", "a cell ran past the per-cell time limit")):
        if any(needle in ln for ln in lines):
            return what
    errs = [ln for ln in lines if "[ERROR]" in ln or "Error" in ln]
    return (errs or lines or ["(no output)"])[-1][:300]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _hash_tree(*paths: Path) -> str:
    h = hashlib.sha256()
    for base in paths:
        files = sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and ".ipynb_checkpoints" not in p.parts) if base.is_dir() else [base]
        for p in files:
            if p.exists():
                h.update(str(p.relative_to(base.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- release
def release(selected: list[str] | None, workspace: Path, release_dir: Path | None = None,
            quiet: bool = False) -> None:
    """Regenerate the student version of each assignment (and record it in the gradebook)."""
    todo = selected or assignments()
    unknown = sorted(set(todo) - set(assignments()))
    if unknown:
        raise GradingError(f"no assignment {', '.join(unknown)} in solutions/; known: {', '.join(assignments())}")
    workspace.mkdir(parents=True, exist_ok=True)
    extra = {"FACOURSE_RELEASE": str(release_dir)} if release_dir else {}
    for a in todo:
        r = run_nbgrader(["generate_assignment", a, "--force"], workspace, **extra)
        if r.returncode != 0:
            raise GradingError(f"nbgrader generate_assignment {a} failed:\n{r.stdout}\n{r.stderr}")
        if not quiet:
            print(f"released {a} -> {(release_dir or EXERCISES) / a}")


# ----------------------------------------------------------------------------- staging
def _discover(submissions: Path, selected: list[str] | None) -> list[tuple[str, str]]:
    if not submissions.exists():
        raise GradingError(f"submission folder {submissions} does not exist")
    if not submissions.is_dir():
        raise GradingError(f"{submissions} is a file; expected a folder laid out as "
                           "<student>/<assignment>/<notebook>.ipynb")
    known = set(assignments())
    pairs = []
    for student in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for a in sorted(p.name for p in student.iterdir() if p.is_dir()):
            if a in known and (not selected or a in selected):
                pairs.append((student.name, a))
    if not pairs:
        raise GradingError(f"no submissions found under {submissions}: expected "
                           f"<student>/<assignment>/<notebook>.ipynb with an assignment among "
                           f"{', '.join(sorted(known))}")
    return pairs


def _precheck(folder: Path, assignment: str) -> str | None:
    """Problems nbgrader would crash on, stated plainly; None when the folder is gradable."""
    expected = notebooks_of(assignment)
    present = sorted(p.name for p in folder.glob("*.ipynb"))
    if not any(f"{nb}.ipynb" in present for nb in expected):
        return (f"missing notebook {', '.join(n + '.ipynb' for n in expected)} "
                f"(found: {', '.join(present) or 'no notebook'})")
    for nb in expected:
        path = folder / f"{nb}.ipynb"
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{nb}.ipynb is not a notebook (not valid JSON: {e})"
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            return f"{nb}.ipynb is not a notebook (JSON without a list of cells)"
    return None


def _gid(cell) -> str | None:
    return (cell.get("metadata") or {}).get("nbgrader", {}).get("grade_id")


def _restore_deleted_cells(path: Path, assignment: str, release_dir: Path = EXERCISES) -> list[str]:
    """Put back graded and locked cells a student deleted, from the release, at their place.

    nbgrader's own ``add_missing_cells`` fails when the cell before a deleted one is a plain
    locked cell; doing it here keeps every test running. Returns the restored grade_ids.
    """
    release_nb = json.loads((release_dir / assignment / path.name).read_text(encoding="utf-8"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    present = {_gid(c) for c in nb["cells"]} - {None}
    restored = []
    for i, cell in enumerate(release_nb["cells"]):
        g = _gid(cell)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if g is None or g in present or not (meta.get("grade") or meta.get("locked") or meta.get("solution")):
            continue
        at = 0      # after the nearest earlier release cell that the submission still has
        for prev in reversed(release_nb["cells"][:i]):
            if _gid(prev) in present:
                at = next(j for j, c in enumerate(nb["cells"]) if _gid(c) == _gid(prev)) + 1
                break
        nb["cells"].insert(at, cell)
        present.add(g)
        restored.append(g)
    if restored:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    return restored


def _stage(src: Path, dst: Path) -> None:
    """Copy one submission folder; grading never touches the original."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=False,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))


# ----------------------------------------------------------------------------- collecting
def _headline(msg: str) -> str:
    """One line of a failure: the check's 'likely cause' when it gave one, else the first line."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    cause = [ln for ln in lines if ln.startswith("likely cause:")]
    line = cause[-1] if cause else (lines[0] if lines else "")
    return line if len(line) <= 200 else line[:197] + "..."


def _graded_cells(db: Path, assignment: str) -> list[dict]:
    """Every graded cell of ``assignment`` in gradebook ``db``: name, notebook, max_score, auto."""
    from nbgrader.api import Gradebook

    out = []
    with Gradebook(f"sqlite:///{db}") as gb:
        a = gb.find_assignment(assignment)
        for nb in a.notebooks:
            for gc in nb.grade_cells:
                out.append({"name": gc.name, "notebook": nb.name, "max_score": float(gc.max_score),
                             "auto": gc.cell_type == "code", "score": 0.0})
    return out


def _read_gradebook(db: Path, student: str, assignment: str, res: Result) -> bool:
    """Fill score and per-test scores from gradebook ``db``; False when the submission is absent."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{db}") as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            return False
        res.score, res.max_score = float(sub.score), float(sub.max_score)
        res.tests, res.failed = [], []
        res.auto_max_score = res.manual_pending = 0.0
        for nb in sub.notebooks:
            for grade in nb.grades:
                t = {"name": grade.name, "notebook": nb.name, "max_score": float(grade.max_score),
                     "auto": grade.auto_score is not None, "score": float(grade.score or 0)}
                res.tests.append(t)
                if grade.auto_score is None:      # a written answer: graded by hand
                    if grade.manual_score is None:
                        res.manual_pending += float(grade.max_score)
                    continue
                res.auto_max_score += float(grade.max_score)
                if grade.max_score and grade.auto_score < grade.max_score:
                    res.failed.append(grade.name)
    return True


def _read_outputs(folder: Path, res: Result) -> None:
    """Error messages of failed cells and perf records, from the autograded notebooks."""
    for path in sorted(folder.glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            gid = _gid(cell)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and gid in res.failed:
                    res.messages[gid] = f"{out.get('ename')}: {out.get('evalue', '')}"
                if out.get("output_type") == "stream":
                    text = out.get("text", "")
                    text = "".join(text) if isinstance(text, list) else text
                    for line in text.splitlines():
                        if line.startswith(PERF_TAG):
                            try:
                                rec = json.loads(line[len(PERF_TAG):])
                            except ValueError:
                                continue
                            rec["cell"] = gid
                            res.perf.append(rec)


def _zero(res: Result, template_db: Path, why: str) -> None:
    """A submission that could not be graded: every test scores 0, and the status says why."""
    res.status = why
    res.tests = _graded_cells(template_db, res.assignment)
    res.score = 0.0
    res.max_score = sum(t["max_score"] for t in res.tests)
    res.auto_max_score = sum(t["max_score"] for t in res.tests if t["auto"])
    res.manual_pending = 0.0
    res.failed = [t["name"] for t in res.tests if t["auto"] and t["max_score"]]
    res.messages = {}


# ----------------------------------------------------------------------------- one submission
_RUNNING: set = set()           # process groups of running nbgrader workers
_RUNNING_LOCK = threading.Lock()
# Starts nbgrader so that it dies with this process (Linux: PR_SET_PDEATHSIG), even when this one
# is killed with SIGKILL; the kernel then exits too (ipykernel watches its parent).
_BOOT = """import ctypes, os, runpy, signal, sys
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


def grade_one(submissions: Path, workspace: Path, student: str, a: str, *, timeout: float,
              cell_timeout: float | None, gpu: str | None, key: str) -> Result:
    """Grade one submission in a private workspace; write results/<student>/<a>.json."""
    res = Result(student, a, key=key, gpu=gpu or "")
    t0 = time.perf_counter()
    release_dir = workspace / "release"
    template_db = workspace / "work" / "template.db"
    priv = workspace / "work" / f"{student}__{a}"
    if priv.exists():
        shutil.rmtree(priv)
    priv.mkdir(parents=True)
    shutil.copyfile(template_db, priv / "gradebook.db")
    staged = priv / "submitted" / student / a
    _stage(submissions / student / a, staged)
    problem = _precheck(staged, a)
    if problem:
        _zero(res, template_db, f"not graded: {problem}")
    else:
        restored = [g for nb in notebooks_of(a) if (staged / f"{nb}.ipynb").exists()
                    for g in _restore_deleted_cells(staged / f"{nb}.ipynb", a, release_dir)]
        extra = {"FACOURSE_RELEASE": release_dir}
        if cell_timeout:
            extra["FACOURSE_CELL_TIMEOUT"] = int(cell_timeout)
        if gpu is not None:
            extra["CUDA_VISIBLE_DEVICES"] = gpu
        cmd = [sys.executable, "-c", _BOOT, str(os.getpid()), "autograde", a, "--student", student,
               "--force"]
        rc, out = _run_isolated(cmd, HERE, _env(priv, **extra), timeout)
        (priv / "nbgrader.log").write_text(out or "", encoding="utf-8")
        if rc is None:
            _zero(res, template_db, f"timed out after {timeout:g} s (the whole notebook)")
        elif rc != 0 or not _read_gradebook(priv / "gradebook.db", student, a, res):
            _zero(res, template_db, f"autograde failed: {_last_error(out)}")
        else:
            if restored:
                res.status = f"graded (deleted cells restored: {', '.join(restored)})"
            _read_outputs(priv / "autograded" / student / a, res)
    # Publish: the graded notebooks and the staged copy go to the shared workspace, then the record.
    for sub in ("autograded", "submitted"):
        src, dst = priv / sub / student / a, workspace / sub / student / a
        if dst.exists():
            shutil.rmtree(dst)
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
    res.seconds = round(time.perf_counter() - t0, 2)
    _atomic_write(result_path(workspace, student, a), json.dumps(res.to_json(), indent=1))
    return res


def result_path(workspace: Path, student: str, a: str) -> Path:
    return workspace / "results" / student / f"{a}.json"


# ----------------------------------------------------------------------------- the gradebook
def merge_into_gradebook(workspace: Path, res: Result) -> None:
    """Record ``res`` in the shared gradebook (only the parent process writes it).

    Idempotent: the submission is created or updated in one transaction; manual grades an
    instructor already entered are kept.
    """
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{workspace / 'gradebook.db'}") as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")       # nbgrader's add_submission trips SQLAlchemy warnings
        try:
            gb.find_student(res.student)
        except MissingEntry:
            gb.add_student(res.student)
        try:
            sub = gb.find_submission(res.assignment, res.student)
        except MissingEntry:
            sub = gb.add_submission(res.assignment, res.student)
        scores = {(t["notebook"], t["name"]): t for t in res.tests}
        for nb in sub.notebooks:
            for grade in nb.grades:
                t = scores.get((nb.name, grade.name))
                if grade.cell.cell_type != "code":   # written answers: left to the instructor
                    continue
                grade.auto_score = float(t["score"]) if t else 0.0
                if grade.manual_score is None:
                    grade.needs_manual_grade = False
        gb.db.commit()


def _prepare(workspace: Path, todo: list[str]) -> None:
    """Release into the workspace (the gradebook must know each graded cell) and make the
    template gradebook that every worker copies."""
    release(todo, workspace, release_dir=workspace / "release", quiet=True)
    (workspace / "work").mkdir(parents=True, exist_ok=True)
    import sqlite3
    src = sqlite3.connect(workspace / "gradebook.db")
    dst = sqlite3.connect(workspace / "work" / "template.db")
    with dst:
        src.backup(dst)          # a consistent copy even if the gradebook is being read
    src.close()
    dst.close()


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
              cell_timeout: float | None = None, force: bool = False) -> list[Result]:
    """Grade every <student>/<assignment> under ``submissions``; returns one Result each.

    ``jobs`` submissions run at once, each in its own nbgrader process; with GPUs present each
    worker gets one GPU (CUDA_VISIBLE_DEVICES) and no more workers run than there are GPUs, so
    timings are never shared. A result whose submission, assignment source and thresholds are
    unchanged is reused unless ``force``.
    """
    from tqdm import tqdm

    submissions = submissions.resolve()
    workspace = workspace.resolve()
    pairs = _discover(submissions, selected)
    todo_assignments = sorted({a for _, a in pairs})
    _prepare(workspace, todo_assignments)
    source_key = {a: _hash_tree(SOLUTIONS / a, HERE / "thresholds.toml") for a in todo_assignments}

    gpus = visible_gpus()
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
        key = _hash_tree(submissions / student / a) + source_key[a]
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
                             cell_timeout=cell_timeout, gpu=gpu, key=key)
        finally:
            if gpu is not None:
                free_gpus.put(gpu)

    for res in results.values():        # reused results: make sure the gradebook has them
        merge_into_gradebook(workspace, res)
    bar = tqdm(total=len(pairs), initial=len(results), desc="autograding", unit="submission",
               disable=quiet, file=sys.stderr)
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
                merge_into_gradebook(workspace, res)
                shutil.rmtree(workspace / "work" / f"{student}__{a}", ignore_errors=True)
                results[(student, a)] = res
                bar.set_postfix_str(f"{student}/{a}: {res.score:g}/{res.max_score:g}")
                bar.update(1)
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


# ----------------------------------------------------------------------------- reports
def write_csv(results: list[Result], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "assignment", "score", "max_score", "manual_pending", "status",
                    "failed_tests", "seconds"])
        for r in results:
            w.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}",
                        f"{r.manual_pending:g}", r.status, " ".join(r.failed), f"{r.seconds:.1f}"])


def table(results: list[Result]) -> str:
    head = ("student", "assignment", "score", "status", "failed tests")
    rows = [(r.student, r.assignment, f"{r.score:g} / {r.max_score:g}",
             r.status + (f" ({r.manual_pending:g} pts await manual grading)" if r.manual_pending else ""),
             ", ".join(r.failed) or "-") for r in results]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)


def load_results(workspace: Path) -> list[Result]:
    """Every result recorded under <workspace>/results, sorted by student and assignment."""
    out = []
    for p in sorted((workspace / "results").glob("*/*.json")):
        try:
            out.append(Result.from_json(json.loads(p.read_text(encoding="utf-8"))))
        except (ValueError, TypeError):
            continue
    return sorted(out, key=lambda r: (r.student, r.assignment))


def export(workspace: Path) -> list[Result]:
    """Every submission in the gradebook, as Results (with the recorded status and messages)."""
    from nbgrader.api import Gradebook

    db = workspace / "gradebook.db"
    if not db.exists():
        raise GradingError(f"no gradebook at {db}: run `python -m autograder autograde` first")
    with Gradebook(f"sqlite:///{db}") as gb:
        pairs = sorted((s.student.id, a.name) for a in gb.assignments for s in a.submissions)
    out = []
    for student, a in pairs:
        res = Result(student, a)
        rec = result_path(workspace, student, a)
        if rec.exists():
            res = Result.from_json(json.loads(rec.read_text(encoding="utf-8")))
        _read_gradebook(db, student, a, res)        # the gradebook has the last word (manual grades)
        out.append(res)
    return out


def summary(results: list[Result], seconds: float | None = None) -> str:
    graded = [r for r in results if r.status.startswith("graded")]
    other = [r for r in results if not r.status.startswith("graded")]
    reused = sum(r.reused for r in results)
    line = (f"{len(results)} submission(s): {len(graded)} graded, {len(other)} scored 0 without "
            f"grading (see status)" + (f"; {reused} unchanged since the last run, reused" if reused else ""))
    if seconds is not None:
        line += f"; {seconds:.0f} s"
    return line


def _report(results: list[Result], csv_path: Path, show_messages: bool = True,
            workspace: Path | None = None, seconds: float | None = None) -> None:
    write_csv(results, csv_path)
    print()
    print(table(results))
    if show_messages:
        for r in results:
            for gid, msg in r.messages.items():
                print(f"  {r.student}/{r.assignment} {gid}: {_headline(msg)}")
    print(f"\n{summary(results, seconds)}")
    print(f"grades written to {csv_path}")
    if workspace is not None:
        from . import report
        index = report.write_report(results, workspace / "report")
        print(f"report written to {index}")


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE,
                   help="where submissions, graded notebooks and the gradebook go (default: grading/)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("release", help="regenerate exercises/ from solutions/")
    r.add_argument("assignments", nargs="*")

    def grading_options(g, jobs=1):
        g.add_argument("--timeout", type=float, default=1800,
                       help="seconds per submission, the whole notebook (default 1800)")
        g.add_argument("--cell-timeout", type=float, default=None,
                       help="seconds per cell (default: FACOURSE_CELL_TIMEOUT or 600)")
        g.add_argument("--jobs", "-j", type=int, default=jobs,
                       help=f"submissions graded at once (default {jobs}; with GPUs, at most one per GPU)")
        g.add_argument("--force", action="store_true",
                       help="re-grade submissions whose recorded result is up to date")

    g = sub.add_parser("autograde", help="grade a folder of submissions")
    g.add_argument("submissions", type=Path, help="folder laid out as <student>/<assignment>/<notebook>.ipynb")
    g.add_argument("--assignment", action="append", help="grade only this assignment (repeatable)")
    g.add_argument("--csv", type=Path, help="grades CSV (default: <workspace>/grades.csv)")
    grading_options(g)
    rp = sub.add_parser("report", help="grades CSV and HTML report (class and per student) from the workspace")
    rp.add_argument("--csv", type=Path)
    e = sub.add_parser("export", help="write the grades CSV from the gradebook")
    e.add_argument("--csv", type=Path)
    d = sub.add_parser("demo", help="release, autograde the bundled samples, print the grade table")
    grading_options(d, jobs=max(1, min(3, os.cpu_count() or 1)))
    b = sub.add_parser("bundle", help="build the student archive (no solutions, no autograder)")
    b.add_argument("out", type=Path, help="the .zip to write")
    args = p.parse_args(argv)
    ws = args.workspace.resolve()
    try:
        if args.cmd == "release":
            release(args.assignments, ws)
        elif args.cmd in ("autograde", "demo"):
            t0 = time.perf_counter()
            if args.cmd == "demo":
                release(None, ws)
            subs = args.submissions if args.cmd == "autograde" else SAMPLES
            results = autograde(subs, ws, getattr(args, "assignment", None), args.timeout,
                                jobs=args.jobs, cell_timeout=args.cell_timeout, force=args.force)
            _report(results, getattr(args, "csv", None) or ws / "grades.csv", workspace=ws,
                    seconds=time.perf_counter() - t0)
        elif args.cmd == "report":
            results = load_results(ws)
            if not results:
                raise GradingError(f"no graded submission under {ws / 'results'}: run "
                                   "`python -m autograder autograde` first")
            _report(results, args.csv or ws / "grades.csv", show_messages=False, workspace=ws)
        elif args.cmd == "export":
            _report(export(ws), args.csv or ws / "grades.csv", show_messages=False)
        elif args.cmd == "bundle":
            from . import bundle
            path, n = bundle.build(args.out)
            print(f"student bundle written to {path} ({n} files; no solutions/, no autograder/, "
                  "no hidden test)")
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
