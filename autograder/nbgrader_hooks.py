"""What the course's nbgrader configuration adds to plain nbgrader: it refuses, or it hides.

* :func:`judge_only`: ``nbgrader autograde`` (on the command line, as the configuration loads:
  :func:`refuse_plain_command`; from the formgrader's "autograde" button, as
  ``Autograde.pre_convert_hook``) refuses to grade unless the grading process runs it beside a judge
  (``python -m autograder autograde``): every hidden test is decided by the judge, outside the
  student's kernel, and a kernel can make any cell "pass". The refusal comes before nbgrader touches
  the gradebook; the command fails (exit status 1) with an error that names the one to use.
* :class:`HideHiddenTests`, first of ``GenerateFeedback.preprocessors``: ``nbgrader
  generate_feedback`` shows no hidden test's source, no traceback through one, and no seed.

Loaded by ``nbgrader_config.py`` in nbgrader's own process: imports nothing heavy.
"""
from __future__ import annotations

import os
import stat
import sys

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from .model import JUDGE_ENV
from .report import hide_seeds

COMMAND = "python -m autograder autograde SUBMITTED"
REFUSAL = (
    "this course is not graded by plain `nbgrader autograde`: its hidden tests are decided by the "
    "judge, outside the student's kernel, and no judge runs here. Grade with `{command}` "
    "(SUBMITTED/<student>/<assignment>/<notebook>.ipynb; after `nbgrader collect`, the folder it "
    "collected into), from the course's repository; see autograder/README.md, 'Plain nbgrader and "
    "JupyterHub'. Nothing was recorded for {who}.")


class JudgeMissing(BaseException):
    """Plain nbgrader tried to autograde this course. Not an ``Exception``: nbgrader logs and ignores a
    pre-convert hook's exceptions, while this one stops the command (the formgrader's button reports it)."""


def _judge_listening() -> bool:
    path = os.environ.get(JUDGE_ENV, "")
    try:
        return bool(path) and stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def judge_only(assignment=None, student=None, notebooks=None, **_) -> None:
    """nbgrader's pre-convert hook of Autograde: refuse unless a judge serves this run."""
    if not _judge_listening():
        who = f"{student}/{assignment}" if student and assignment else "any submission"
        message = REFUSAL.format(command=COMMAND, who=who)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise JudgeMissing(message)


def refuse_before_clearing() -> None:
    """nbgrader's Autograde clears the graded copy (``init_destination``) before its pre-convert hook runs: the
    formgrader's "autograde" button, which calls it in the formgrader's own process, must refuse first."""
    from nbgrader.converters import Autograde
    if getattr(Autograde.init_destination, "judged", False):
        return
    clear = Autograde.init_destination

    def init_destination(self, assignment_id, student_id):
        judge_only(assignment_id, student_id)
        return clear(self, assignment_id, student_id)

    init_destination.judged = True
    Autograde.init_destination = init_destination


def refuse_plain_command(argv: list[str]) -> None:
    """Called as the configuration loads: ``nbgrader autograde`` without a judge stops here, before
    nbgrader clears an earlier graded copy (``--force``) or opens the gradebook."""
    prog = os.path.basename(argv[0]) if argv else ""
    if (prog == "nbgrader" or argv[0].endswith(os.path.join("nbgrader", "__main__.py"))) and "autograde" in argv[1:]:
        judge_only()


BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
def visible_source(source: str) -> tuple[str, bool]:
    """The cell's source without its hidden tests; True when there were some."""
    out, hidden, found = [], False, False
    for line in source.splitlines():
        if BEGIN in line:
            hidden = found = True
            out.append("# (hidden tests: run by the grader, not shown)")
            continue
        if END in line:
            hidden = False
            continue
        if not hidden:
            out.append(line)
    return "\n".join(out), found


class HideHiddenTests(Preprocessor):
    """Feedback notebooks: hidden tests' source and tracebacks removed, seeds masked in every output."""

    enabled = Bool(True)        # nbconvert's preprocessors are off unless enabled


    def preprocess_cell(self, cell, resources, index):
        hidden = False
        if cell.cell_type == "code":
            src, hidden = visible_source(cell.source)
            if hidden:
                cell.source = src
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                out["text"] = hide_seeds("".join(out.get("text", "")))
            elif out.get("output_type") == "error":
                out["evalue"] = hide_seeds(str(out.get("evalue", "")))
                if hidden:      # its frames would quote the hidden lines
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}"]
                else:
                    out["traceback"] = [hide_seeds(t) for t in out.get("traceback", [])]
            elif out.get("output_type") in ("execute_result", "display_data"):
                data = out.get("data", {})
                for mime in ("text/plain", "text/html", "text/markdown"):
                    if mime in data:
                        data[mime] = hide_seeds("".join(data[mime]))
        return cell, resources
