"""Shared fixtures: grading notebooks built from the release with code put into solution cells."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `autograder` is a folder of the repo, not an installed package

from autograder import model, workers  # noqa: E402
from facourse.steps import hidden_entries  # noqa: E402,F401  (the tests import it from here too)


def pip_install(*requirements: str, timeout: float = 900):
    """``pip install`` into this interpreter, one test process at a time (the suite's workers share one
    environment, and two pips at once in it can leave a package half there). Returns the CompletedProcess."""
    import fcntl
    import subprocess
    with open(Path(sys.prefix) / ".pytest-pip-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                               *requirements], capture_output=True, text=True, timeout=timeout)


def computed_once(key: str, compute):
    """``compute()`` (JSON data), computed by the first test process that asks for ``key`` and read by the
    others: it waits under a file lock for the file named by ``key``'s hash (in the temporary folder). A
    module-scoped fixture runs once in every pytest-xdist worker that gets one of the module's tests, and
    worksteal spreads a module over the workers: a fixture that costs a minute ran up to four times."""
    import fcntl
    import hashlib
    import tempfile
    out = Path(tempfile.gettempdir()) / f"facourse_once_{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(compute()))
            tmp.replace(out)
        return json.loads(out.read_text())


def this_run() -> str:
    """What names this test run in ``computed_once`` keys: pytest-xdist's run id, shared by its workers (a
    run without workers is one process: its pid)."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid {os.getpid()}"


def until(cond, what: str, limit: float = 240) -> None:
    """Wait for ``cond()``; fail naming ``what`` after ``limit`` seconds."""
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < limit, f"timed out waiting for {what}"
        time.sleep(0.1)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (gone, or a zombie waiting for a reaper, is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def load_module(path: Path, name: str | None = None):
    """The Python file at ``path`` as a fresh module (ladder files and scripts are not packages)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def release_notebook(assignment: str) -> dict:
    """The student version of an assignment's notebook, as committed in exercises/."""
    (path,) = (ROOT / "exercises" / assignment).glob("*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))


def fill(nb: dict, code: dict[str, str]) -> dict:
    """A copy of ``nb`` whose cells named by grade_id get new source (a student's answer)."""
    nb = copy.deepcopy(nb)
    seen = set()
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in code:
            cell["source"] = code[gid].strip("\n").splitlines(True)
            seen.add(gid)
    missing = set(code) - seen
    assert not missing, f"no cell with grade_id {missing} in the release"
    return nb


def solution_code(assignment: str) -> dict[str, str]:
    """The solution source of every solution cell, with the solution markers removed."""
    (path,) = (ROOT / "solutions" / assignment).glob("*.ipynb")
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution") and cell["cell_type"] == "code":
            src = "".join(cell["source"])
            out[meta["grade_id"]] = "\n".join(
                ln for ln in src.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    return out


class Files(dict):
    """A submission of several files: file name -> notebook (a dict), text, bytes, or a Path to copy
    (step 07: the released notebook and the student's ``student_kernel.cu``)."""


def _write(path: Path, content) -> None:
    if isinstance(content, Path):
        shutil.copy(content, path)
    elif isinstance(content, dict):
        path.write_text(json.dumps(content), encoding="utf-8")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def write_submissions(subs: Path, assignment: str, notebooks: dict) -> None:
    """Lay out ``subs/<student>/<assignment>/``: one notebook per student (a dict, or raw text/bytes
    for broken files), or the files of a :class:`Files`."""
    (nb_name,) = model.notebooks_of(assignment)
    for student, nb in notebooks.items():
        d = subs / student / assignment
        d.mkdir(parents=True)
        for name, content in (nb.items() if isinstance(nb, Files) else [(f"{nb_name}.ipynb", nb)]):
            _write(d / name, content)


def grade_submissions(tmp_path: Path, assignment: str, notebooks: dict[str, dict | str | bytes],
                      timeout: float = 900) -> dict[str, model.Result]:
    """Autograde one notebook per student (a dict, or raw text/bytes for broken files)."""
    return grade_assignments(tmp_path, {assignment: notebooks}, timeout=timeout)[assignment]


def grade_assignments(tmp_path: Path, submissions: dict[str, dict], timeout: float = 900,
                      jobs: int = 2) -> dict[str, dict[str, model.Result]]:
    """ONE autograde run (``jobs`` nbgrader processes at a time) for several assignments:
    ``{assignment: {student: submission}}`` -> ``{assignment: {student: Result}}``. The workspace
    is ``tmp_path / "ws"``. One run instead of one per assignment keeps both workers of the pool busy
    to the end (tests/test_exercise_grading.py grades every kernel step's exercise this way)."""
    subs = tmp_path / "submitted"
    for assignment, notebooks in submissions.items():
        write_submissions(subs, assignment, notebooks)
    results = workers.autograde(subs, tmp_path / "ws", list(submissions), timeout=timeout, quiet=True,
                                jobs=jobs)
    out: dict[str, dict[str, model.Result]] = {a: {} for a in submissions}
    for r in results:
        out[r.assignment][r.student] = r
    return out


#: The demo's students (``python -m autograder demo``; autograder/samples, written by
#: tools/make_samples.py from the steps' ``GRADING``): the solution, the untouched stub, one planted bug.
SAMPLE_STUDENTS = ("alice", "bob", "carol")


def planted_cells(step: str, planted: tuple) -> dict[str, str]:
    """The solution cells of ``planted`` (cell, the solution's text, the mistake, ...; a mistake in several
    places gives the three as tuples of the same length) with the mistake in them."""
    solution, out = solution_code(step), {}
    for cell, old, new in (zip(*planted[:3]) if isinstance(planted[0], tuple) else [planted[:3]]):
        code = out.get(cell, solution[cell])
        assert old in code, f"planted bug out of date: {old!r} is no longer in {step}'s {cell!r} cell"
        out[cell] = code.replace(old, new)
    return out


def solution_and_stub(step: str, max_points: float, gpu_only: set, gpu_points: float, planted: tuple,
                      answers: dict[str, str] | None = None) -> dict:
    """A step's ``GRADING`` (tests/test_exercise_grading.py), whose submissions are the demo's samples:
    ``alice`` the solution, put into the released notebook (with ``answers`` in its written-answer
    cells), scores every point but those of ``gpu_only`` (``gpu_points`` in all), which the judge gives
    0 here saying there is no GPU, and leaves two points per written answer to the instructor; ``bob``,
    the untouched release, scores 0; ``carol``, the solution with the mistake of ``planted`` (the cell,
    the solution's text, the mistake, the test that loses its points, what its message names; one row
    of a step module's ``PLANTED``) keeps some points, loses that test's, and its message names it."""
    cell, old, new, test, says = planted

    def submissions():
        release = release_notebook(step)
        solved = {**solution_code(step), **(answers or {})}
        return {"alice": fill(release, solved), "bob": release,
                "carol": fill(release, {**solved, **planted_cells(step, planted)})}

    def check(res, workspace):
        sol, stub, bug = res["alice"], res["bob"], res.get("carol")
        assert sol.status == "graded", sol.status
        assert sol.auto_max_score == max_points
        assert set(sol.failed) == gpu_only, (sol.failed, sol.messages)
        assert all("No GPU here" in sol.messages[c] for c in gpu_only), sol.messages
        assert sol.score == max_points - gpu_points
        assert sol.manual_pending == 2 * len(answers or {}), sol.manual_pending
        assert stub.status == "graded" and stub.score == 0, (stub.score, stub.failed)
        if bug is None:         # not graded in this run (tests/test_exercise_grading.py, PLANTED_TOO)
            return
        assert bug.status == "graded", bug.status
        assert test in bug.failed, (test, bug.failed)
        assert says in bug.messages[test], f"carol's {test} does not name the planted mistake {says!r}:\n" \
            f"{bug.messages[test]}"
        assert 0 < bug.score < sol.score, ("a planted bug keeps some points, not all", bug.score, bug.failed)

    return {step: (submissions, check)}


_PLANTED_RUNNER = """
import json, sys
sys.path[:0] = [{src!r}, {root!r}]
step, code, bugs, entries, tests_of, fresh = json.loads(open(sys.argv[1]).read())
from autograder.judge import run_inprocess
for bug, cells in bugs.items():
    scope = {{}}
    for cell, src in dict(code, **cells).items():     # cell by cell: one that raises (a stub) stops only itself
        try:
            exec(compile(src, "<planted " + bug + ": " + cell + ">", "exec"), scope)
        except Exception:
            pass
    out, tests = {{}}, tests_of[bug]
    for entry in dict.fromkeys(entries[t] for t in tests):
        fn = scope.get(entry, lambda *a, **k: (_ for _ in ()).throw(NameError(entry)))
        key = None if fresh else ("planted:" + bug).encode()      # the bug's own seeds: one verdict every run
        for test, v in run_inprocess(step, fn, [t for t in tests if entries[t] == entry], seed_key=key).items():
            out[test] = {{"points": v.points, "max": v.max_points, "message": v.message}}
    print(json.dumps({{"bug": bug, "verdicts": out}}), flush=True)
"""


def assert_planted(got: dict, expect: dict) -> None:
    """Each planted bug's verdicts (``planted_verdicts``) against ``expect``: {bug: (the test it fails, what that
    test's message says, the tests it passes)}."""
    for bug, (fails, says, passes) in expect.items():
        v = got[bug]
        assert v[fails]["points"] == 0, f"{bug}: expected {fails} to fail: {v[fails]}"
        assert says in v[fails]["message"], f"{bug}: {fails}'s message does not say {says!r}:\n{v[fails]['message']}"
        wrong = [t for t in passes if v[t]["points"] != v[t]["max"]]
        assert not wrong, f"{bug}: {wrong} should pass: {[v[t]['message'][:300] for t in wrong]}"


def planted_verdicts(tmp_path: Path, step: str, given: tuple, bugs: dict, tests=None) -> dict:
    """Each bug of ``bugs`` ({bug: {solution cell: its buggy code}}), put into the exercise's solution
    (its ``given`` code cells and every solution cell, in order), graded through the judge on ``tests``
    (a list, or {bug: list}; default: every hidden test) as the hidden cells call it: ``{bug: {test:
    {"points", "max", "message"}}}``. One subprocess for all of them (Triton's interpreter must be chosen before triton
    is imported), in place of one nbgrader process per bug. Each bug's inputs are drawn from seeds of its name, as a
    regrade draws a submission's, so a run's verdicts are every run's; FACOURSE_PLANTED_SEEDS=fresh draws new ones
    (a sweep for diagnoses that hold on some seeds only)."""
    import subprocess

    solution = solution_code(step)
    (path,) = (ROOT / "solutions" / step).glob("*.ipynb")
    code = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in given or gid in solution:
            code[gid] = solution.get(gid) or "".join(cell["source"])
    for bug, cells in bugs.items():
        assert set(cells) <= set(solution), f"{bug}: {set(cells) - set(solution)} is no solution cell"
    entries = hidden_entries(step)
    tests_of = tests if isinstance(tests, dict) else {bug: list(tests or entries) for bug in bugs}
    fresh = os.environ.get("FACOURSE_PLANTED_SEEDS") == "fresh"
    (tmp_path / "in.json").write_text(json.dumps([step, code, bugs, entries, tests_of, fresh]))
    runner = tmp_path / "run.py"
    runner.write_text(_PLANTED_RUNNER.format(src=str(ROOT / "src"), root=str(ROOT)))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", FIB_CACHE_PATH=str(tmp_path / "fib_cache"))
    env.pop("FACOURSE_JUDGE", None)
    r = subprocess.run([sys.executable, str(runner), str(tmp_path / "in.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    got = {d["bug"]: d["verdicts"] for d in map(json.loads, (ln for ln in r.stdout.splitlines()
                                                              if ln.startswith('{"bug": ')))}   # not what cells print
    assert set(got) == set(bugs), r.stdout
    return got


def assert_planted_bugs_named(tmp_path: Path, step: str, given: tuple, planted: dict) -> None:
    """Each bug of ``planted`` ({bug: (cell, the solution's text, the mistake, the test, what its message
    names)}), put into the solution, scores 0 in its test through the judge (which hands it the
    function its hidden cell names), whose message names it. A bug in several places gives cell, text
    and mistake as tuples of the same length."""
    bugs = {bug: planted_cells(step, p) for bug, p in planted.items()}
    got = planted_verdicts(tmp_path, step, given, bugs, tests={bug: [p[3]] for bug, p in planted.items()})
    for bug, (cell, old, new, test, says) in planted.items():
        v = got[bug][test]
        assert v["points"] == 0, f"{bug}: {test} still scored {v['points']}"
        assert says in v["message"], f"{bug}: {test}'s message does not name it:\n{v['message']}"


def unpack(zip_path: Path, dest: Path) -> Path:
    """Extract ``zip_path`` into ``dest`` as `unzip` does (file modes kept: course.sh stays executable)."""
    import zipfile

    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            target = Path(z.extract(info, dest))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                target.chmod(mode)
    return dest


@pytest.fixture(scope="session")
def student_archive(tmp_path_factory) -> Path:
    """The student archive (`python -m autograder bundle`), built once per test process and
    unpacked: the path of its ``flashattention-course/`` folder. Tests may write inside it."""
    from autograder import bundle

    tmp = tmp_path_factory.mktemp("archive")
    path, _ = bundle.build(tmp / "student.zip")
    return unpack(path, tmp / "unpacked") / "flashattention-course"


@pytest.fixture(autouse=True, scope="session")
def _cpu_threads():
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    yield


#: The longest tests (minutes each on two cores: one autograde run of many submissions each), put
#: where each pytest-xdist worker starts with one of them (longest_first).
LONGEST = ("tests/test_grading_corpus.py::test_bad_submission_corpus_in_one_parallel_run",
           "tests/test_exercise_grading.py::test_every_kernel_step_graded_in_one_run",
           "tests/test_book.py::test_book_builds_from_the_archive")


def _xdist_schedule(config) -> tuple[int, str]:
    """(number of workers, --dist mode) of this pytest-xdist worker's run; (0, "no") elsewhere. A
    worker's own options say neither: its controller's command line (workerinput) does."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return 0, "no"
    argv, dist = list(workerinput.get("mainargv", [])), "load"        # -n N alone: load
    for i, arg in enumerate(argv):
        if arg == "--dist" and i + 1 < len(argv):
            dist = argv[i + 1]
        elif arg.startswith("--dist="):
            dist = arg.split("=", 1)[1]
    return int(workerinput.get("workercount", 0)), dist


def longest_first(config, items) -> None:
    """Reorder ``items`` so that each of the first workers gets one test of LONGEST first, the short
    tests then filling in around them: no worker finishes its share and idles while the other runs
    a test of several minutes to its end. The schedulers send each worker its first tests as a
    slice of this order (--dist worksteal, as course.sh runs it: contiguous equal shares, stolen
    from the tail; --dist load, -n alone: chunks of a quarter of a share); a test of LONGEST goes
    to the start of each worker's first slice. Any order is correct: this one is only faster."""
    longest = [i for name in LONGEST for i in items if i.nodeid == name]
    n_workers, dist = _xdist_schedule(config)
    if not longest or n_workers < 2 or dist not in ("worksteal", "load"):
        return
    rest = [i for i in items if i not in longest]
    groups = [longest[w::n_workers] for w in range(n_workers)]       # worker w starts with groups[w]
    if dist == "worksteal":
        sizes = [len(items) * (w + 1) // n_workers - len(items) * w // n_workers for w in range(n_workers)]
    else:
        sizes = [max(2, (len(items) // n_workers) // 4)] * n_workers
        groups = [g[:1] for g in groups] + [longest[n_workers:]]     # the others: next to be sent
        sizes.append(0)
    order = []
    for group, size in zip(groups, sizes):
        take = max(0, size - len(group))
        order += group + rest[:take]
        rest = rest[take:]
    items[:] = order + rest


@pytest.hookimpl(trylast=True)         # after -k/-m deselection: the order the schedulers see
def pytest_collection_modifyitems(config, items):
    """The longest tests first, one per worker (longest_first); GPU-tier tests skip with a reason
    on a machine without a GPU."""
    longest_first(config, items)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU tier: this machine has no CUDA GPU (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ----------------------------------------------------------------------------- CUDA exercises' visible cells
_CUDA_VISIBLE_RUNNER = textwrap.dedent("""
    import contextlib, io, json, os, resource, sys, time, traceback
    nb_path, plan_path, out_path = sys.argv[1:4]

    def cpu_seconds():      # this process's CPU time and its finished children's (g++, the emulator)
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + r.ru_utime + r.ru_stime
    nb = json.load(open(nb_path))
    plan = json.load(open(plan_path))          # [[folder, [grade_ids to skip]], ...]
    results = {}
    for folder, skip in plan:
        os.chdir(folder)
        ns, cells = {"__name__": "__main__"}, {}
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            meta = cell["metadata"].get("nbgrader", {})
            gid = meta.get("grade_id")
            if gid in skip or (meta.get("grade") and gid not in %(visible)r):
                continue                               # hidden tests: the judge's, not visible
            src = "".join(cell["source"]).split("### BEGIN HIDDEN TESTS")[0]
            buf, t0, c0, err = io.StringIO(), time.perf_counter(), cpu_seconds(), None
            try:
                with contextlib.redirect_stdout(buf):
                    exec(compile(src, f"cell_{gid}", "exec"), ns)
            except Exception as e:                     # Run All would stop here; the test looks further
                err = type(e).__name__ + ": " + str(e)
            cells[gid] = {"out": buf.getvalue(), "error": err, "s": round(time.perf_counter() - t0, 2),
                          "cpu": round(cpu_seconds() - c0, 2)}
        results[folder] = cells
    json.dump(results, open(out_path, "w"))
""" % {"visible": ("test_small",)})


def run_cuda_visible(tmp_path: Path, step: Path, notebook: str, given: tuple, kernels: dict[str, str],
                     skip=(), processes: int = 1) -> dict[str, dict]:
    """Exercises 06 and 07 on a machine without a GPU: {case: student_kernel.cu text} -> {case: {grade_id:
    {"out", "error", "s", "cpu"}}}, each case in a copy of the exercise's folder (its ``given`` files), its visible
    cells run as a student's Run All (without stopping), the cases spread over ``processes`` subprocesses
    (they share one build cache, as one student's machine)."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from facourse import cuda_host_check as hc
    cases = list(kernels)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               CUDA_VISIBLE_DEVICES="",                          # a student's machine without a GPU
               FACOURSE_HOST_CHECK_CACHE=str(tmp_path / "host_builds"))   # first builds, timed as such
    env.pop("FACOURSE_JUDGE", None)
    (tmp_path / "runner.py").write_text(_CUDA_VISIBLE_RUNNER)
    for case, text in kernels.items():
        d = tmp_path / case
        d.mkdir()
        for f in given:
            shutil.copy(step / f, d / f)
        (d / "student_kernel.cu").write_text(text)

    if processes > 1 and shutil.which("g++"):   # the standard headers precompiled once, not by each process
        old = os.environ.get("FACOURSE_HOST_CHECK_CACHE")
        os.environ["FACOURSE_HOST_CHECK_CACHE"] = env["FACOURSE_HOST_CHECK_CACHE"]
        try:
            hc.precompile_std_headers(tmp_path / cases[0] / "student_kernel.cu", shutil.which("g++"))
        finally:
            os.environ.pop("FACOURSE_HOST_CHECK_CACHE") if old is None else os.environ.update(
                FACOURSE_HOST_CHECK_CACHE=old)

    def run(k: int) -> dict:
        mine = cases[k::processes]
        plan, out = tmp_path / f"plan{k}.json", tmp_path / f"out{k}.json"
        plan.write_text(json.dumps([[str(tmp_path / c), list(skip)] for c in mine]))
        r = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(step / notebook), str(plan), str(out)],
                           env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return json.loads(out.read_text())

    with ThreadPoolExecutor(processes) as pool:
        res = {k: v for part in pool.map(run, range(processes)) for k, v in part.items()}
    return {case: res[str(tmp_path / case)] for case in kernels}
