"""Every kernel step's exercise as it is graded, in ONE autograde run (CPU tier).

Each step's test module says what it submits and what the grades must be, in ``GRADING =
{assignment: (submissions, check)}``: ``submissions()`` gives ``{student: notebook}`` (a notebook,
or a ``conftest.Files`` of several files), ``check(results, workspace)`` asserts on that
assignment's ``{student: Result}`` and may read the graded notebooks under
``workspace/autograded/<student>/<assignment>/``. This test grades all of them in one
``workers.autograde`` run (two nbgrader processes at a time), then runs every check; a failing
step does not hide the others' failures.

One run instead of one per step: the pool of two stays busy until the last submission (a step of
two notebooks, one slow, left a worker idle), and it is one test, so pytest-xdist runs it once, on
one worker, while the other worker runs the rest of the suite.
"""
from __future__ import annotations

import importlib

import pytest

from conftest import grade_assignments

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
)


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
    results = grade_assignments(tmp_path, {a: submissions() for a, (submissions, _) in plans.items()})
    failed = {}
    for a, (_, check) in plans.items():
        try:
            check(results[a], tmp_path / "ws")
        except AssertionError as err:
            failed[a] = str(err) or repr(err)
    assert not failed, "\n\n".join(f"{a}: {why}" for a, why in failed.items())
