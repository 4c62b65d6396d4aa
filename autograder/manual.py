"""Grades given by hand: the formgrader's points and comments in every output, stale ones flagged.

The formgrader (``python -m autograder formgrader``) writes manual scores and comments into the
workspace's gradebook, and ``autograde`` never overwrites them. Every output (the grade table,
``grades.csv``, the HTML report and student pages, the LMS export) reads them from there through
:func:`with_manual_grades`, so ``autograde``, ``report`` and ``export`` agree.

A written answer that carries a manual grade and whose text differs from the text seen when the
outputs were last written (a resubmission) is marked for review: nbgrader's ``needs_manual_grade``
is set again, so the formgrader lists it, and every output says "changed since graded by hand"
(its old points still count) until an instructor saves a grade for it again. The texts seen are
kept as hashes in ``<workspace>/manual/<student>/<assignment>.json``.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from .model import Result, atomic_write

#: t["manual"] of a test: how a person's grade stands (absent: decided by the judge alone).
PENDING, GRADED, STALE, ADJUSTED, UNANSWERED = "pending", "graded", "stale", "adjusted", "unanswered"


def answer_hashes(workspace: Path, student: str | None, assignment: str) -> dict[str, str]:
    """{"<notebook>/<grade_id>": hash of the text} of every written answer of the graded submission
    (``student`` None: of the workspace's release, the answers as given to students)."""
    out: dict[str, str] = {}
    folders = ([workspace / "release" / assignment] if student is None else
               [workspace / base / student / assignment for base in ("autograded", "submitted")])
    for folder in folders:
        for nb in sorted(folder.glob("*.ipynb")):
            try:
                cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for cell in cells:
                meta = (cell.get("metadata") or {}).get("nbgrader") or {}
                if meta.get("grade") and cell.get("cell_type") != "code" and meta.get("grade_id"):
                    src = cell.get("source", "")
                    text = "".join(src) if isinstance(src, list) else str(src)
                    out[f"{nb.stem}/{meta['grade_id']}"] = hashlib.sha256(text.strip().encode()).hexdigest()[:16]
        if out:
            return out
    return out


def _seen_path(workspace: Path, student: str, assignment: str) -> Path:
    return workspace / "manual" / student / f"{assignment}.json"


def _mark_stale(workspace: Path, res: Result, sub, now: dict[str, str]) -> None:
    """Set needs_manual_grade on manual grades whose answer changed since the texts were last seen."""
    if not now:
        return                          # nothing graded to compare (not graded, or no written answer)
    path = _seen_path(workspace, res.student, res.assignment)
    try:
        seen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        seen = {}
    for nb in sub.notebooks:
        for grade in nb.grades:
            key = f"{nb.name}/{grade.name}"
            if (grade.cell.cell_type != "code" and grade.manual_score is not None and key in seen
                    and key in now and seen[key] != now[key]):
                grade.needs_manual_grade = True
    if now != seen:
        atomic_write(path, json.dumps(now, indent=1, sort_keys=True))


def _overlay(res: Result, sub, unanswered: set[str]) -> None:
    """Fill ``res`` from the gradebook's submission ``sub``: hand-given points, their state, comments;
    ``unanswered``: "<notebook>/<grade_id>" of the written answers left as released."""
    tests = {(t.get("notebook"), t["name"]): t for t in res.tests}
    by_name = {t["name"]: t for t in res.tests}
    stale = []
    res.cell_comments = {}
    for nb in sub.notebooks:
        comments = {c.name: c.manual_comment.strip() for c in nb.comments if (c.manual_comment or "").strip()}
        grades = {g.name for g in nb.grades}
        # a comment on a solution cell (the formgrader's box beside the student's code): no test carries it
        res.cell_comments.update({name: text for name, text in comments.items() if name not in grades})
        for grade in nb.grades:
            t = tests.get((nb.name, grade.name)) or by_name.get(grade.name)
            written = grade.cell.cell_type != "code"
            if t is None:
                t = {"name": grade.name, "notebook": nb.name, "max_score": float(grade.max_score),
                     "auto": not written, "score": float(grade.auto_score or 0)}
                res.tests.append(t)
            t["auto"] = not written
            t.pop("manual", None)
            t.pop("comment", None)
            if grade.manual_score is not None:
                t["score"] = float(grade.manual_score) + float(grade.extra_credit or 0)
                t["manual"] = STALE if grade.needs_manual_grade else GRADED if written else ADJUSTED
            elif written:
                t["score"] = 0.0
                # a notebook that could not be read (not graded) holds no answer to grade
                t["manual"] = (UNANSWERED if f"{nb.name}/{grade.name}" in unanswered
                               or res.status.startswith("not graded") else PENDING)
            if t.get("manual") == STALE:
                stale.append(grade.name)
            if grade.name in comments:
                t["comment"] = comments[grade.name]
    written_names = {t["name"] for t in res.tests if not t["auto"]}
    res.failed = [n for n in res.failed if n not in written_names
                  and not (by_name.get(n, {}).get("manual") == ADJUSTED
                           and by_name[n]["score"] >= by_name[n]["max_score"])]
    res.messages = {k: v for k, v in res.messages.items() if k in res.failed}
    res.score = sum(float(t["score"]) for t in res.tests)
    res.manual_pending = sum(float(t["max_score"]) for t in res.tests if t.get("manual") == PENDING)
    if stale:
        res.status += (f"; review: {', '.join(stale)} changed since graded by hand "
                       "(the old points count until it is graded again)")


def with_manual_grades(workspace: Path, results: list[Result]) -> list[Result]:
    """Copies of ``results`` carrying the workspace gradebook's manual points, states and comments
    (``t["manual"]``, ``t["comment"]`` of each test); stale manual grades are marked in the gradebook.
    Results without a gradebook entry are returned as they are."""
    out = []
    for r in results:
        c = Result.from_json(copy.deepcopy(r.to_json()))
        c.reused = r.reused
        out.append(c)
    db = workspace / "gradebook.db"
    if not db.exists() or not out:
        return out
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    released: dict[str, dict[str, str]] = {}
    with Gradebook(f"sqlite:///{db}") as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for res in out:
            try:
                sub = gb.find_submission(res.assignment, res.student)
            except MissingEntry:
                continue
            if res.assignment not in released:
                released[res.assignment] = answer_hashes(workspace, None, res.assignment)
            # a step without written answers has nothing to hash (its notebooks can be large)
            now = answer_hashes(workspace, res.student, res.assignment) if released[res.assignment] else {}
            _mark_stale(workspace, res, sub, now)
            _overlay(res, sub, {k for k, h in now.items() if released[res.assignment].get(k) == h})
        gb.db.commit()
    return out


def manual_points(res: Result) -> float:
    """Points given by a person (written answers and hand adjustments), stale ones included."""
    return sum(float(t["score"]) for t in res.tests if t.get("manual") in (GRADED, STALE, ADJUSTED))


def stale_tests(res: Result) -> list[str]:
    return [t["name"] for t in res.tests if t.get("manual") == STALE]


def comments(res: Result) -> dict[str, str]:
    """Every comment given by hand: on a test or written answer, and on a cell of the student's code."""
    return {**{t["name"]: t["comment"] for t in res.tests if t.get("comment")}, **res.cell_comments}
