"""What an LMS takes: one row per student, and one feedback page per (student, assignment).

    <out>/lms.csv                                 student (+ the roster's columns), one column per
                                                  assignment (its score), total, max_total, review
    <out>/feedback/<student>/<assignment>.html    that assignment's feedback, manual comments included

``lms.csv``'s header names each assignment with its points (``02_safe_softmax (10)``); a student with
no submission for an assignment has an empty cell there (0 in the total). ``review`` lists the
assignments whose grade is not final yet: written answers waiting for a person, or changed since
graded by hand. A roster (CSV with a ``student`` column: the course's ids, the submission folders'
names, and any others, e.g. ``lms_id``, ``email``) adds its columns after ``student`` and orders the
rows as it does; every roster student gets a row, graded or not, and a graded student missing from
the roster is listed and still exported.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .model import GradingError, Result
from .report import slug, write_feedback_page


def read_roster(path: Path) -> tuple[list[str], list[dict]]:
    """(column names, rows) of a roster CSV whose ``student`` column holds the course's ids."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
            cols = [c.strip() for c in reader.fieldnames or [] if c]
    except OSError as err:
        raise GradingError(f"cannot read the roster {path}: {err.strerror}") from None
    if "student" not in cols:
        raise GradingError(f"the roster {path} has no 'student' column (the course's student ids, "
                           f"as the submission folders are named); its columns: {', '.join(cols) or 'none'}")
    ids = [r["student"] for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise GradingError(f"the roster {path} lists {', '.join(dup)} more than once")
    return cols, rows


def wide_rows(results: list[Result], roster: Path | None = None) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, graded students missing from the roster) of the one-row-per-student table."""
    assignments = sorted({r.assignment for r in results})
    top = {a: max(r.max_score for r in results if r.assignment == a) for a in assignments}
    by = {(r.student, r.assignment): r for r in results}
    graded = sorted({r.student for r in results})
    cols, people = ["student"], [{"student": s} for s in graded]
    if roster is not None:
        cols, people = read_roster(roster)
    listed = {p["student"] for p in people}
    missing = [s for s in graded if s not in listed]
    people += [{"student": s} for s in missing]
    header = cols + [f"{a} ({top[a]:g})" for a in assignments] + ["total", "max_total", "review"]
    rows = []
    for p in people:
        s = p["student"]
        cells, total, review = [], 0.0, []
        for a in assignments:
            r = by.get((s, a))
            cells.append("" if r is None else f"{r.score:g}")
            total += r.score if r is not None else 0.0
            if r is not None and (r.manual_pending or any(t.get("manual") == "stale" for t in r.tests)):
                review.append(a)
        rows.append([p.get(c, "") for c in cols] + cells + [f"{total:g}", f"{sum(top.values()):g}", " ".join(review)])
    return header, rows, missing


def export_lms(results: list[Result], out: Path, roster: Path | None = None) -> tuple[Path, int, list[str]]:
    """Write ``out/lms.csv`` and ``out/feedback/``; returns (the CSV, pages written, students not in
    the roster). ``results`` should carry the manual grades (``report.print_report`` returns them so)."""
    header, rows, missing = wide_rows(results, roster)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lms.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    for r in results:
        write_feedback_page(r, out / "feedback" / slug(r.student) / f"{slug(r.assignment)}.html")
    return path, len(results), missing
