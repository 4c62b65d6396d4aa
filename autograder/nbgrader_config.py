"""nbgrader configuration of the course. `python -m autograder` runs nbgrader with this file.

The course root is the repository: `solutions/` is nbgrader's source directory and `exercises/`
its release directory. Everything grading writes (submissions copied in, autograded notebooks,
feedback, the gradebook) lives in a workspace, `grading/` unless FACOURSE_WORKSPACE says otherwise.
A JupyterHub course directory that has its own nbgrader_config.py loads this one first
(autograder/README.md, "Plain nbgrader and JupyterHub").
"""
import os
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = Path(os.environ.get("FACOURSE_WORKSPACE", ROOT / "grading")).resolve()

c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "flashattention"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = os.environ.get("FACOURSE_RELEASE", "exercises")
c.CourseDirectory.submitted_directory = str(WORKSPACE / "submitted")  # copies, staged by the CLI
c.CourseDirectory.autograded_directory = str(WORKSPACE / "autograded")
c.CourseDirectory.feedback_directory = str(WORKSPACE / "feedback")
c.CourseDirectory.db_url = f"sqlite:///{WORKSPACE / 'gradebook.db'}"
# Files of an assignment folder that never go to students (build outputs, solution ladders).
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.so", "build",
                            "ladder", "*.egg-info", "step.toml", "*.pct.py"]

# One cell may run the Triton interpreter over the CPU profile: allow minutes, not nbgrader's 30 s.
c.Execute.timeout = int(os.environ.get("FACOURSE_CELL_TIMEOUT", "600"))
c.Execute.interrupt_on_timeout = True
# A student who deletes a graded cell gets it back (and its test runs) instead of a crash.
c.OverwriteCells.add_missing_cells = True
c.ClearSolutions.code_stub = {"python": "raise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# The CUDA exercises (06, 07) are graded from the student's own student_kernel.cu: autograde copies
# every other file of the source folder over the submission (the given headers and binding), but
# must not overwrite that one with the stub of solutions/.
c.Autograde.exclude_overwriting = {p.parent.name: [p.name] for p in (ROOT / "solutions").glob("*/student_kernel.cu")}

# Plain `nbgrader autograde` refuses (the grade is the judge's, never the kernel's), and plain
# `nbgrader generate_feedback` shows no hidden test and no seed: autograder/nbgrader_hooks.py.
import sys  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import GetGrades  # noqa: E402

from autograder.nbgrader_hooks import (HideHiddenTests, judge_only, refuse_before_clearing,  # noqa: E402
                                       refuse_plain_command)

refuse_plain_command(sys.argv)
refuse_before_clearing()
c.Autograde.pre_convert_hook = judge_only
c.GenerateFeedback.preprocessors = [HideHiddenTests, GetGrades, CSSHTMLHeaderPreprocessor]
