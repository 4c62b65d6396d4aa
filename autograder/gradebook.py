"""The gradebook: nbgrader's SQLite database, written by the parent process only, and the result records."""
from __future__ import annotations

import json
from pathlib import Path

from .model import GradingError, Result, result_path


def graded_cells(db: Path, assignment: str) -> list[dict]:
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


def read_gradebook(db: Path, student: str, assignment: str, res: Result) -> bool:
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


def zero(res: Result, template_db: Path, why: str) -> None:
    """A submission that could not be graded: every test scores 0, and the status says why."""
    res.status = why
    res.tests = graded_cells(template_db, res.assignment)
    res.score = 0.0
    res.max_score = sum(t["max_score"] for t in res.tests)
    res.auto_max_score = sum(t["max_score"] for t in res.tests if t["auto"])
    res.manual_pending = 0.0
    res.failed = [t["name"] for t in res.tests if t["auto"] and t["max_score"]]
    res.messages = {}


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
        read_gradebook(db, student, a, res)        # the gradebook has the last word (manual grades)
        out.append(res)
    return out


