"""`./course.sh check NN`, the command students are told to use: each failure's cause on its first line,
no kernel warnings or grading jargon, and a test skipped for want of a GPU reported as skipped.

Two exercises run through the real command (a planted mistake in 02, the stub of 06 whose GPU test
skips on a CPU); the planted mistakes of steps 03, 04 and 08 are checked at the level of the message
format, through the function course.sh prints failures with (CPU time is scarce).
"""
from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT, computed_once, fill, solution_code, this_run
from test_diagnoses import A3, A4, GE, _check_grads, _step08_inputs, functions, mutate

nbformat = pytest.importorskip("nbformat")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="course.sh is a bash script")


def course_sh_python() -> str:
    """The Python program course.sh's `check` runs (its here-document)."""
    text = (ROOT / "course.sh").read_text(encoding="utf-8")
    body = text[text.index("\ncheck() {"):]
    return body[body.index("<<'EOF'\n") + len("<<'EOF'\n"):body.index("\nEOF\n")]


def printer():
    """course.sh's ``failure(ename, evalue)``: the lines a failed cell is printed as."""
    src = course_sh_python()
    ns = {"itertools": itertools}
    exec(src[src.index("def failure("):src.index("\ndef skipped(")], ns)
    return ns["failure"]


# ----------------------------------------------------------------------------- the message format
def first_lines(err) -> list[str]:
    return printer()(type(err).__name__, str(err))


def test_the_cause_comes_first_and_the_figures_after():
    failure = printer()
    msg = ("[small] wrong values in o: max|o - ref| = 0.3, allowed 0.001.\n  wrong at every row\n"
           "  likely cause: the 1/sqrt(d) scale is missing\n    (or applied twice)\n  seed 3")
    assert failure("AttentionCheckError", msg) == [
        "likely cause: the 1/sqrt(d) scale is missing (or applied twice)",
        "AttentionCheckError: [small] wrong values in o: max|o - ref| = 0.3, allowed 0.001."]
    assert failure("ValueError", "q must be 4-D") == ["ValueError: q must be 4-D"]
    assert failure("NotImplementedError", "") == ["a stub you have not filled in yet"]
    assert failure("HostCheckError", "the CPU check failed:\n  load_tile: wrong") == [
        "HostCheckError: the CPU check failed: load_tile: wrong"]


def test_03_and_04_planted_mistakes_print_their_cause_first():
    from facourse import AttentionCheckError, SoftmaxCheckError, check_entry_point, check_softmax_fn
    planted = [
        (functions(A3, merge_softmax_states=[("l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)",
                                              "l = l_a + l_b")])["online_softmax"],
         lambda fn: check_softmax_fn(fn, "small", block_size=32, seed=0, verbose=False), "alpha rescale missing"),
        (functions("02_safe_softmax", safe_softmax=[("torch.exp(xf - m)", "torch.exp(xf)")])["safe_softmax"],
         lambda fn: check_softmax_fn(fn, "overflow", seed=0, verbose=False), "no max subtraction"),
        (functions(A4, tiled_attention=[GE])["tiled_attention"],
         lambda fn: check_entry_point(fn, "small", seed=0, expect_lse=True, verbose=False), "diagonal"),
    ]
    for fn, run, words in planted:
        with pytest.raises((AttentionCheckError, SoftmaxCheckError)) as err:
            run(fn)
        first, second = first_lines(err.value)
        assert first.startswith("likely cause:") and words in first, (first, str(err.value))
        assert second.startswith(type(err.value).__name__ + ": ["), second


def test_08_every_diagnosis_prints_its_cause_first():
    from facourse import AttentionCheckError
    from facourse.backward import backward_mistakes
    _, q, k, v, do = _step08_inputs()
    mistakes = backward_mistakes(q, k, v, do, True, None)
    assert len(mistakes) > 20
    for m in mistakes:
        with pytest.raises(AttentionCheckError) as err:
            _check_grads(m.produce(), q, k, v, do, True)
        first = first_lines(err.value)[0]
        assert first == "likely cause: " + " ".join(m.cause.split()), (first, str(err.value))


# ----------------------------------------------------------------------------- the command itself
@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> SimpleNamespace:
    """`./course.sh check 02 06` in a copy of the student's layout: exercise 02 with the classic
    mistake of no max subtraction, exercise 06 as released (its GPU test skips on a CPU); its
    returncode, stdout and stderr, once per test run (conftest.computed_once)."""
    return SimpleNamespace(**computed_once(this_run() + "\0course.sh check 02 06",
                                           lambda: _check(tmp_path_factory.mktemp("checkout"))))


def _check(root: Path) -> dict:
    shutil.copy(ROOT / "course.sh", root / "course.sh")
    for a in ("02_safe_softmax", "06_cuda_flash_attention"):
        shutil.copytree(ROOT / "exercises" / a, root / "exercises" / a)
    path = root / "exercises" / "02_safe_softmax" / "02_safe_softmax.ipynb"
    code = solution_code("02_safe_softmax")
    code["safe_softmax"] = mutate(code["safe_softmax"], ("torch.exp(xf - m)", "torch.exp(xf)"))
    nbformat.write(nbformat.from_dict(fill(nbformat.read(path, as_version=4), code)), path)
    env = dict(os.environ, VENV=str(Path(sys.prefix)), OFFLINE="1", PYTHONPATH=str(ROOT / "src"),
               OMP_NUM_THREADS="1")
    for var in ("TRITON_INTERPRET", "FACOURSE_JUDGE"):
        env.pop(var, None)
    r = subprocess.run(["./course.sh", "check", "02", "06"], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    return {"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


def test_check_prints_the_cause_on_the_failures_first_line(checked):
    out = checked.stdout + checked.stderr
    assert checked.returncode == 1, out
    fails = [ln for ln in checked.stdout.splitlines() if ln.lstrip().startswith("FAIL")]
    assert fails, out
    first = fails[0]
    assert re.match(r"\s+FAIL\s+\w+: likely cause: .*no max subtraction", first), out
    for noise in ("IPKernelApp", "WARNING", "Traceback", "judge"):
        assert noise not in out, (noise, out)


def test_a_skipped_gpu_test_is_reported_as_skipped_not_passed(checked):
    out = checked.stdout[checked.stdout.index("running exercises/06"):]
    assert re.search(r"^\s+skip\s+test_small: .*NVIDIA GPU", out, re.M), out
    assert not re.search(r"^\s+pass\s+test_small", out, re.M), out
    assert "1 skipped here" in out, out
