"""`python -m autograder`: regenerate the release, autograde submissions, export grades.

    python -m autograder release                 # solutions/ -> exercises/ (nbgrader generate_assignment)
    python -m autograder autograde SUBMISSIONS   # SUBMISSIONS/<student>/<assignment>/<notebook>.ipynb
    python -m autograder export                  # grades CSV + table from the gradebook
    python -m autograder demo                    # release, autograde autograder/samples, print grades

Submissions are copied into the workspace (grading/ by default) and graded there, each by its
own nbgrader process with a wall-clock limit, so one that hangs or crashes costs its own points
and never stops the run; the original files are never modified.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
SAMPLES = HERE / "samples"
DEFAULT_WORKSPACE = ROOT / "grading"


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
    # Hidden tests import grading helpers (autograder.perf) from the repository.
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
    errs = [ln for ln in lines if "[ERROR]" in ln or "Error" in ln]
    return (errs or lines or ["(no output)"])[-1][:300]


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


# ----------------------------------------------------------------------------- autograde
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
        if not isinstance(data, dict) or "cells" not in data:
            return f"{nb}.ipynb is not a notebook (JSON without cells)"
    return None


def _restore_deleted_cells(path: Path, assignment: str) -> list[str]:
    """Put back graded and locked cells a student deleted, from the release, at their place.

    nbgrader's own ``add_missing_cells`` fails when the cell before a deleted one is a plain
    locked cell; doing it here keeps every test running. Returns the restored grade_ids.
    """
    release_nb = json.loads((EXERCISES / assignment / path.name).read_text(encoding="utf-8"))
    nb = json.loads(path.read_text(encoding="utf-8"))

    def gid(cell):
        return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

    present = {gid(c) for c in nb["cells"]} - {None}
    restored = []
    for i, cell in enumerate(release_nb["cells"]):
        g = gid(cell)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if g is None or g in present or not (meta.get("grade") or meta.get("locked") or meta.get("solution")):
            continue
        # after the nearest earlier release cell that the submission still has
        at = 0
        for prev in reversed(release_nb["cells"][:i]):
            if gid(prev) in present:
                at = next(j for j, c in enumerate(nb["cells"]) if gid(c) == gid(prev)) + 1
                break
        nb["cells"].insert(at, cell)
        present.add(g)
        restored.append(g)
    if restored:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    return restored


def _stage(src: Path, dst: Path) -> None:
    """Copy one submission folder into the workspace; grading never touches the original."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))


def _collect(workspace: Path, student: str, assignment: str, res: Result) -> None:
    """Fill score, failed tests and their messages from the gradebook and the graded notebook."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{workspace / 'gradebook.db'}") as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            res.status = res.status if not res.status.startswith("graded") else "not graded"
            res.max_score = gb.find_assignment(assignment).max_score if _has_assignment(gb, assignment) else 0
            return
        res.score, res.max_score = float(sub.score), float(sub.max_score)
        for nb in sub.notebooks:
            for grade in nb.grades:
                if grade.auto_score is None:      # a written answer: graded by hand
                    if grade.manual_score is None:
                        res.manual_pending += float(grade.max_score)
                    continue
                res.auto_max_score += float(grade.max_score)
                if grade.max_score and grade.auto_score < grade.max_score:
                    res.failed.append(grade.name)
    for path in (workspace / "autograded" / student / assignment).glob("*.ipynb"):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in res.failed:
                for out in cell.get("outputs", []):
                    if out.get("output_type") == "error":
                        res.messages[gid] = f"{out.get('ename')}: {out.get('evalue', '')}"


def _has_assignment(gb, assignment) -> bool:
    from nbgrader.api import MissingEntry
    try:
        gb.find_assignment(assignment)
        return True
    except MissingEntry:
        return False


def autograde(submissions: Path, workspace: Path, selected: list[str] | None = None,
              timeout: float = 1800, quiet: bool = False) -> list[Result]:
    """Grade every <student>/<assignment> under ``submissions``; returns one Result each."""
    from tqdm import tqdm

    submissions = submissions.resolve()
    pairs = _discover(submissions, selected)
    # The gradebook must know each assignment's graded cells: generate into the workspace.
    release(sorted({a for _, a in pairs}), workspace, release_dir=workspace / "release", quiet=True)
    results = []
    bar = tqdm(pairs, desc="autograding", unit="submission", disable=quiet, file=sys.stderr)
    for student, a in bar:
        bar.set_postfix_str(f"{student}/{a}")
        res = Result(student, a)
        t0 = time.perf_counter()
        staged = workspace / "submitted" / student / a
        _stage(submissions / student / a, staged)
        problem = _precheck(staged, a)
        if problem:
            res.status = f"not graded: {problem}"
        else:
            restored = [g for nb in notebooks_of(a) if (staged / f"{nb}.ipynb").exists()
                        for g in _restore_deleted_cells(staged / f"{nb}.ipynb", a)]
            if restored:
                res.status = f"graded (deleted cells restored: {', '.join(restored)})"
            try:
                r = run_nbgrader(["autograde", a, "--student", student, "--force"], workspace,
                                 timeout=timeout)
                if r.returncode != 0:
                    res.status = f"autograde failed: {_last_error(r.stdout + r.stderr)}"
            except subprocess.TimeoutExpired:
                res.status = f"timed out after {timeout:.0f} s"
        _collect(workspace, student, a, res)
        res.seconds = time.perf_counter() - t0
        results.append(res)
    return results


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


def export(workspace: Path) -> list[Result]:
    """Every submission in the gradebook, as Results."""
    from nbgrader.api import Gradebook

    db = workspace / "gradebook.db"
    if not db.exists():
        raise GradingError(f"no gradebook at {db}: run `python -m autograder autograde` first")
    out = []
    with Gradebook(f"sqlite:///{db}") as gb:
        pairs = [(s.student.id, a.name) for a in gb.assignments for s in a.submissions]
    for student, a in pairs:
        res = Result(student, a)
        _collect(workspace, student, a, res)
        out.append(res)
    return out


def _headline(msg: str) -> str:
    """One line of a failure: the check's 'likely cause' when it gave one, else the first line."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    cause = [ln for ln in lines if ln.startswith("likely cause:")]
    line = cause[-1] if cause else (lines[0] if lines else "")
    return line if len(line) <= 200 else line[:197] + "..."


def _report(results: list[Result], csv_path: Path, show_messages: bool = True) -> None:
    write_csv(results, csv_path)
    print()
    print(table(results))
    if show_messages:
        for r in results:
            for gid, msg in r.messages.items():
                print(f"  {r.student}/{r.assignment} {gid}: {_headline(msg)}")
    print(f"\ngrades written to {csv_path}")


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE,
                   help="where submissions, graded notebooks and the gradebook go (default: grading/)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("release", help="regenerate exercises/ from solutions/")
    r.add_argument("assignments", nargs="*")
    g = sub.add_parser("autograde", help="grade a folder of submissions")
    g.add_argument("submissions", type=Path, help="folder laid out as <student>/<assignment>/<notebook>.ipynb")
    g.add_argument("--assignment", action="append", help="grade only this assignment (repeatable)")
    g.add_argument("--timeout", type=float, default=1800, help="seconds per submission (default 1800)")
    g.add_argument("--csv", type=Path, help="grades CSV (default: <workspace>/grades.csv)")
    e = sub.add_parser("export", help="write the grades CSV from the gradebook")
    e.add_argument("--csv", type=Path)
    d = sub.add_parser("demo", help="release, autograde the bundled samples, print the grade table")
    d.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    ws = args.workspace.resolve()
    try:
        if args.cmd == "release":
            release(args.assignments, ws)
        elif args.cmd == "autograde":
            results = autograde(args.submissions, ws, args.assignment, args.timeout)
            _report(results, args.csv or ws / "grades.csv")
        elif args.cmd == "export":
            _report(export(ws), args.csv or ws / "grades.csv", show_messages=False)
        elif args.cmd == "demo":
            release(None, ws)
            results = autograde(SAMPLES, ws, None, args.timeout)
            _report(results, ws / "grades.csv")
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
