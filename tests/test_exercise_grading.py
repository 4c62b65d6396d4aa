"""Every kernel step's exercise as it is graded, in ONE autograde run (CPU tier): the demo's.

Each step's test module says what it submits and what the grades must be, in ``GRADING =
{assignment: (submissions, check)}``: ``submissions()`` gives ``{student: notebook}`` (a notebook,
or a ``conftest.Files`` of several files), ``check(results, workspace)`` asserts on that
assignment's ``{student: Result}`` and may read the graded notebooks under
``workspace/autograded/<student>/<assignment>/``. This test grades all of them in one
``workers.autograde`` run (two nbgrader processes at a time), then runs every check; a failing
step does not hide the others' failures.

The submissions of students ``alice``, ``bob`` and ``carol`` (the solution, the untouched stub, one
planted bug: ``conftest.solution_and_stub``) are the demo's samples, committed under
autograder/samples by tools/make_samples.py (tests/test_autograder.py keeps them in sync), so this run
is ``python -m autograder demo``'s, steps 02-12 and 14 (step 01's samples: test_autograder.py's interrupted
run), and CI grades each sample once. It also writes the HTML report, as the demo does: a plot per step.

``carol`` costs as much to grade as ``alice`` (the same kernel in Triton's interpreter: the nine
carols add about 550 CPU-seconds, more than CI's budget has room for), and her planted bug is
already checked in process by the step's planted-bug test (the test it loses, what its message
names). So CI grades ``alice`` and ``bob`` here; ``FACOURSE_GRADE_PLANTED=1`` grades ``carol`` too,
which makes this run the demo's whole set and also checks that each planted bug keeps some points.

One run instead of one per step: the pool of two stays busy until the last submission (a step of
two notebooks, one slow, left a worker idle), and it is one test, so pytest-xdist runs it once, on
one worker, while the other worker runs the rest of the suite.
"""
from __future__ import annotations

import importlib
import os

import pytest

from conftest import grade_assignments
from autograder import report

#: The test modules whose ``GRADING`` is graded here. A new kernel step's grading test: give its
#: module a ``GRADING`` (as test_exercise_step08.py does) and add the module's name below (one line).
MODULES = (
    "test_exercises_steps_02_04",       # 02_safe_softmax, 03_online_softmax, 04_tiled_attention
    "test_triton_step05",               # 05_triton_flash_attention
    "test_hopper_step07",               # 07_hopper_flash_attention
    "test_exercise_step08",             # 08_backward
    "test_exercise_step09",             # 09_decode_paged_kv
    "test_exercise_step10",             # 10_attention_variants
    "test_exercise_step11",             # 11_interchangeable_kernels
    "test_exercise_step12",             # 12_ring_attention
    "test_exercise_step13",             # 13_profiling
    "test_exercise_step14",             # 14_after_hopper
    "test_exercise_step15",             # 15_serving
)


#: Grade the demo's planted-bug samples (``carol``) too (see above).
PLANTED_TOO = os.environ.get("FACOURSE_GRADE_PLANTED") == "1"


def grading() -> dict:
    out = {}
    for name in MODULES:
        for assignment, plan in importlib.import_module(name).GRADING.items():
            assert assignment not in out, f"{assignment} is graded by two modules"
            out[assignment] = plan
    return out


@pytest.mark.slow
def test_every_kernel_step_graded_in_one_run(tmp_path):
    plans = grading()
    subs = {a: {s: nb for s, nb in submissions().items() if PLANTED_TOO or s != "carol"}
            for a, (submissions, _) in plans.items()}
    results = grade_assignments(tmp_path, subs)
    failed = {}
    index = report.write_report([r for rs in results.values() for r in rs.values()], tmp_path / "ws" / "report",
                                machine={"machine": "test"})
    page = index.read_text()
    for a in results:
        plot = tmp_path / "ws" / "report" / f"{a}_students.png"
        if not (plot.is_file() and f"src='{plot.name}'" in page):
            failed[f"{a} report"] = f"no plot of each student's score on the class page ({plot.name})"
    if f"src='{report.OVERVIEW}'" not in page:
        failed["report"] = "no plot of every student's score per step on the class page"
    for a, (_, check) in plans.items():
        try:
            check(results[a], tmp_path / "ws")
        except AssertionError as err:
            failed[a] = str(err) or repr(err)
    assert not failed, "\n\n".join(f"{a}: {why}" for a, why in failed.items())
