"""`python -m autograder`: regenerate the release, autograde submissions, report, export, bundle.

    python -m autograder release                  # solutions/ -> exercises/ (nbgrader generate_assignment)
    python -m autograder autograde SUBMISSIONS    # SUBMISSIONS/<student>/<assignment>/<notebook>.ipynb
           [--jobs N] [--timeout S] [--cell-timeout S] [--force] [--trust STUDENT]
           [--student NAME] [--wait]                # re-grade only NAME (repeatable); queue behind a run
           [--cluster auto|HOST:PORT|ray://HOST:PORT [--retries N]]   # grade on a Ray cluster
    python -m autograder report                   # grades CSV + HTML report from the workspace
    python -m autograder export                   # grades CSV + table from the gradebook, and for an LMS:
           [--roster ROSTER.csv] [--out DIR]      # one row per student, one feedback page per assignment
    python -m autograder formgrader [--port P]    # nbgrader's formgrader on the workspace (manual grading)
    python -m autograder demo                     # grade autograder/samples (every CPU-gradable step: the
           [--jobs N] ...                         # solution, the stub, a planted bug), table + HTML report
    python -m autograder bundle OUT.zip           # the student archive: no solutions, no autograder
    python -m autograder retime SUBMISSIONS STUDENT ASSIGNMENT   # re-time one submission (GPU)

The command line only: the data model is ``model.py``, the release and the submission's copy
``staging.py``, isolation and the worker pool ``workers.py``, the verdicts ``judge.py`` (with
``plans.py``, ``checks.py``, ``scan.py``), the gradebook ``gradebook.py``, the reports ``report.py``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .gradebook import export, load_results
from .model import DEFAULT_WORKSPACE, SAMPLES, GradingError
from .report import print_report
from .staging import release
from .grader import Interrupted
from .workers import UNGRADED, autograde


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
        g.add_argument("--timeout", type=float, default=None,
                       help="seconds per submission, the whole notebook (default: per step, from measured "
                            "grading times: autograder/README.md, 'Grading times and timeouts')")
        g.add_argument("--cell-timeout", type=float, default=None,
                       help="seconds per cell (default: FACOURSE_CELL_TIMEOUT, else half the notebook's)")
        g.add_argument("--student", action="append", default=[], metavar="NAME",
                       help="grade only this student's submissions, afresh (repeatable); the CSV and the "
                            "report still cover the whole workspace")
        g.add_argument("--wait", action="store_true",
                       help="when another run holds the workspace, wait for it instead of refusing")
        g.add_argument("--jobs", "-j", type=int, default=jobs,
                       help=f"submissions graded at once (default {jobs}; with GPUs, at most one per GPU)")
        g.add_argument("--force", action="store_true",
                       help="re-grade submissions whose recorded result is up to date")
        g.add_argument("--trust", action="append", default=[], metavar="STUDENT",
                       help="an instructor reviewed this student's tamper flags: they cost no points "
                            "(still reported); repeatable; use with --force")
        g.add_argument("--cluster", metavar="ADDRESS",
                       help="grade each submission as a task on a Ray cluster: auto (the cluster this "
                            "machine belongs to), HOST:PORT, or ray://HOST:PORT (Ray Client)")
        g.add_argument("--retries", type=int, default=2,
                       help="with --cluster: times a task whose worker or node died is run again (default 2)")

    g = sub.add_parser("autograde", help="grade a folder of submissions")
    g.add_argument("submissions", type=Path, help="folder laid out as <student>/<assignment>/<notebook>.ipynb")
    g.add_argument("--assignment", action="append", help="grade only this assignment (repeatable)")
    g.add_argument("--csv", type=Path, help="grades CSV (default: <workspace>/grades.csv)")
    grading_options(g)
    rp = sub.add_parser("report", help="grades CSV and HTML report (class and per student) from the workspace")
    rp.add_argument("--csv", type=Path)
    e = sub.add_parser("export", help="the grades CSV from the gradebook, and for an LMS: one row per student "
                       "(<out>/lms.csv) and one feedback page per student and assignment (<out>/feedback/)")
    e.add_argument("--csv", type=Path)
    e.add_argument("--out", type=Path, help="folder for lms.csv and feedback/ (default: <workspace>/export)")
    e.add_argument("--roster", type=Path,
                   help="CSV with a 'student' column (the course's ids) and the LMS's own (ids, emails, ...)")
    fg = sub.add_parser("formgrader", help="nbgrader's formgrader on the workspace, to grade written answers "
                        "(JupyterLab on 127.0.0.1)")
    fg.add_argument("--port", type=int, default=8890)
    fg.add_argument("--no-browser", action="store_true", help="print the address only")
    d = sub.add_parser("demo", help="autograde the bundled samples (tools/make_samples.py: every CPU-gradable "
                       "step's solution, stub and planted bug), print the grade table, write the report")
    grading_options(d, jobs=max(1, min(3, os.cpu_count() or 1)))
    b = sub.add_parser("bundle", help="build the student archive (no solutions, no autograder)")
    b.add_argument("out", type=Path, help="the .zip to write")
    rt = sub.add_parser("retime", help="re-time one submission's perf configs on this GPU (instructor review)")
    rt.add_argument("submissions", type=Path)
    rt.add_argument("student")
    rt.add_argument("assignment")
    args = p.parse_args(argv)
    ws = args.workspace.resolve()
    try:
        if args.cmd == "release":
            release(args.assignments, ws)
        elif args.cmd in ("autograde", "demo"):
            t0 = time.perf_counter()
            # one BLAS thread per worker, the judge's included: --jobs of them share the cores
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            subs = args.submissions if args.cmd == "autograde" else SAMPLES
            try:
                results = autograde(subs, ws, getattr(args, "assignment", None), args.timeout,
                                    jobs=args.jobs, cell_timeout=args.cell_timeout, force=args.force,
                                    trusted=set(args.trust), cluster=args.cluster, retries=args.retries,
                                    students=args.student, wait_lock=args.wait)
            except Interrupted as err:      # one line; what finished stays recorded
                print("\n" + getattr(err, "summary", f"interrupted by {err.signame} before grading "
                                      "started: nothing recorded"), file=sys.stderr)
                return 143 if err.signame == "SIGTERM" else 130
            lost = [r for r in results if r.status.startswith(UNGRADED)]
            if args.student or getattr(args, "assignment", None):    # the CSV and report: every record
                # an ungraded one keeps its earlier record in the outputs
                fresh = {(r.student, r.assignment) for r in results if not r.status.startswith(UNGRADED)}
                for r in load_results(ws):
                    if (r.student, r.assignment) not in fresh:
                        r.reused = True
                        results.append(r)
                results.sort(key=lambda r: (r.student, r.assignment))
            print_report([r for r in results if not r.status.startswith(UNGRADED)],
                         getattr(args, "csv", None) or ws / "grades.csv", workspace=ws,
                         seconds=time.perf_counter() - t0)
            if lost:        # no grade, no record: the next run grades them
                print(f"\n{len(lost)} submission(s) NOT graded, nothing recorded for them; run the same "
                      "command again to grade them:", file=sys.stderr)
                for r in lost:
                    print(f"  {r.student}/{r.assignment}: {r.status}", file=sys.stderr)
                return 1
        elif args.cmd == "report":
            results = load_results(ws)
            if not results:
                raise GradingError(f"no graded submission under {ws / 'results'}: run "
                                   "`python -m autograder autograde` first")
            print_report(results, args.csv or ws / "grades.csv", show_messages=False, workspace=ws)
        elif args.cmd == "export":
            from .export import export_lms
            shown = print_report(export(ws), args.csv or ws / "grades.csv", show_messages=False, workspace=ws,
                                 html=False)
            lms, n, missing = export_lms(shown, args.out or ws / "export", args.roster)
            print(f"LMS table written to {lms}; {n} feedback page(s) under {lms.parent / 'feedback'}")
            if missing:
                print(f"note: not in the roster, exported anyway: {', '.join(missing)}", file=sys.stderr)
        elif args.cmd == "formgrader":
            from . import formgrader
            return formgrader.main(["--port", str(args.port)] + ["--no-browser"] * args.no_browser, workspace=ws)
        elif args.cmd == "retime":
            from .retime import retime
            return retime(args.submissions / args.student / args.assignment, args.assignment)
        elif args.cmd == "bundle":
            from . import bundle
            path, n = bundle.build(args.out)
            print(f"student bundle written to {path} ({n} files; no solutions/, no autograder/, "
                  "no hidden test)")
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
