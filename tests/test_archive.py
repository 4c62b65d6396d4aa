"""The student archive works as a student's own checkout.

`python -m autograder bundle` is built once per test process (conftest's ``student_archive``)
and unpacked as `unzip` would. Inside it: its README names only what the archive contains, the
README's commands run (set-up reuses this test run's environment: `VENV` points at it and
`OFFLINE=1`, so nothing is installed; `PYTHONPATH` puts the archive's own `src/` first, as
`pip install -e .` inside it would), and the figures draw. Every lecture executes top to bottom
on the CPU inside the archive in tests/test_book.py (the book's build, `--course-root` the archive,
with `_env` below): the one place lectures execute in the test suite (tests/test_notebooks.py
keeps the checks on the committed files).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, fill, solution_code

nbformat = pytest.importorskip("nbformat")  # the GPU machines have no Jupyter stack

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="course.sh is a bash script")

LECTURES = sorted(p.name for p in (ROOT / "course").glob("*.ipynb"))
VENV = Path(sys.prefix)            # the environment running these tests stands in for the student's
# What the README may name without the archive containing it: what its set-up creates.
CREATED_BY_SETUP = (".venv",)
PATH_RE = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)?[A-Za-z0-9_*.-]+(?:/[A-Za-z0-9_*.-]*)+"
                     r"|[A-Za-z0-9_*-]+\.(?:ipynb|py|md|toml|yml|yaml|sh|cu|cuh|h|cpp|png|json|txt))")


def _env(archive: Path, **extra) -> dict:
    env = dict(os.environ, VENV=str(VENV), OFFLINE="1", PYTHONPATH=str(archive / "src"), **extra)
    env.pop("TRITON_INTERPRET", None)
    return env


def course_sh(archive: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["./course.sh", *args], cwd=archive, env=_env(archive), capture_output=True,
                          text=True, timeout=timeout)


def readme_paths(text: str) -> set[str]:
    """Every file or folder name the README mentions (code spans, tables and prose alike)."""
    found = set()
    for m in PATH_RE.finditer(text):
        p = m.group(1).rstrip(".,;:")
        if "://" in text[m.start():m.end() + 3] or p.startswith(("http", "www.")) or p.strip("./") == "":
            continue
        found.add(p)
    return found


def readme_commands(text: str) -> list[list[str]]:
    """The `./course.sh ...` and `python ...` commands the README tells a student to run."""
    cmds = []
    for line in re.findall(r"(?:^|`)((?:\./course\.sh|python) [^`#\n]*?)\s*(?:#|`|$)", text, re.M):
        cmd = line.split()
        if cmd not in cmds:
            cmds.append(cmd)
    return cmds


def test_archive_holds_every_lecture_and_exercise(student_archive):
    assert sorted(p.name for p in (student_archive / "course").glob("*.ipynb")) == LECTURES
    ours = sorted(str(p.relative_to(ROOT / "exercises")) for p in (ROOT / "exercises").rglob("*") if p.is_file())
    theirs = sorted(str(p.relative_to(student_archive / "exercises"))
                    for p in (student_archive / "exercises").rglob("*") if p.is_file())
    assert theirs == ours
    for gone in ("autograder", "solutions", "tests", "benchmarks", "docs", ".ci", "tools"):
        assert not (student_archive / gone).exists(), f"the archive has {gone}/"
    assert os.access(student_archive / "course.sh", os.X_OK), "course.sh lost its executable bit"


def test_readme_names_only_what_the_archive_contains(student_archive):
    text = (student_archive / "README.md").read_text(encoding="utf-8")
    assert text == (ROOT / "docs" / "STUDENT_README.md").read_text(encoding="utf-8")
    paths = readme_paths(text)
    assert {"course/00_gpu_fundamentals.ipynb", "exercises/01_vanilla_attention/01_vanilla_attention.ipynb",
            "./course.sh"} <= paths, paths   # the finder itself works
    def present(p: str) -> bool:   # a path from the archive's top; a bare file name anywhere in it
        p = p.removeprefix("./").rstrip("/")
        return (p.startswith(CREATED_BY_SETUP) or bool(list(student_archive.glob(p)))
                or ("/" not in p and bool(list(student_archive.rglob(p)))))

    missing = sorted(p for p in paths if not present(p))
    assert not missing, f"the archive's README names what the archive lacks: {missing}"
    # it starts with what a student runs: set-up, then JupyterLab
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert first_block.split()[:2] == ["./course.sh", "setup"], first_block
    assert "./course.sh lab" in first_block


def test_readme_commands_run_in_the_archive(student_archive, tmp_path):
    text = (student_archive / "README.md").read_text(encoding="utf-8")
    cmds = readme_commands(text)
    names = [" ".join(c) for c in cmds]
    assert {"./course.sh setup", "./course.sh check", "./course.sh lab", "./course.sh check 01",
            "python diagrams/draw.py"} <= set(names), names
    for cmd in cmds:
        if cmd[0] == "python":    # the drawing script: test_figures_draw_in_the_archive
            continue
        args = cmd[1:] + (["--version"] if cmd[1:] == ["lab"] else [])   # JupyterLab would wait for a browser
        r = course_sh(student_archive, *args)
        out = r.stdout + r.stderr
        if cmd[1:2] == ["check"] and len(cmd) > 2:   # an exercise: its stub fails its visible test, plainly
            assert r.returncode == 1, out
            assert "FAIL" in out and "a stub you have not filled in yet" in out, out
            assert "Traceback" not in out, out
            continue
        assert r.returncode == 0, f"{' '.join(cmd)} failed in the archive:\n{out[-3000:]}"
        assert "installing" not in out, out        # OFFLINE=1: nothing was installed
        if cmd[1:] == ["check"]:
            assert f"facourse from {student_archive / 'src' / 'facourse'}" in out, out
            assert "ok: the notebooks can run here" in out, out
        if cmd[1:] == ["lab"]:
            assert re.search(r"^\d+\.\d+", r.stdout.strip()), out


def test_check_keeps_the_kernels_own_stderr_out(student_archive):
    """What the Jupyter kernel writes to its stderr (ipykernel's shutdown can log a ZMQ traceback) is not the
    exercise's: `course.sh check NN` reports the cells only."""
    import nbformat
    folder = student_archive / "exercises" / "99_kernel_noise"
    folder.mkdir()
    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("import os\nos.write(2, b'Traceback (the kernel, not a cell)\\n')")]
        nbformat.write(nb, folder / "noise.ipynb")
        r = course_sh(student_archive, "check", "99")
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "99_kernel_noise/noise.ipynb: visible tests pass" in out, out
        assert "Traceback" not in out, out
    finally:
        shutil.rmtree(folder)


def test_course_sh_offers_only_what_works_in_the_archive(student_archive):
    for cmd in ("demo", "test"):
        r = course_sh(student_archive, cmd)
        assert r.returncode == 2 and "usage: ./course.sh [setup|lab|check [NN]]" in r.stderr, r.stderr
    r = course_sh(student_archive)
    assert r.returncode == 2 and "demo" not in r.stderr and "test" not in r.stderr


def test_a_filled_in_exercise_passes_its_visible_tests(student_archive, tmp_path):
    """`./course.sh check 01` on the solution put into the student's notebook: every visible test passes."""
    mine = tmp_path / "flashattention-course"          # a copy: other tests see the untouched stub
    shutil.copytree(student_archive, mine, symlinks=True)
    path = mine / "exercises" / "01_vanilla_attention" / "01_vanilla_attention.ipynb"
    nb = fill(nbformat.read(path, as_version=4), solution_code("01_vanilla_attention"))
    nbformat.write(nbformat.from_dict(nb), path)
    r = course_sh(mine, "check", "01")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "pass  test_small" in out and "visible tests pass" in out, out


def test_figures_draw_in_the_archive(student_archive):
    r = subprocess.run([sys.executable, "diagrams/draw.py"], cwd=student_archive, env=_env(student_archive),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
