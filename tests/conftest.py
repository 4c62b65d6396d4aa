"""Shared fixtures: grading notebooks built from the release with code put into solution cells."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `autograder` is a folder of the repo, not an installed package

from autograder import model, workers  # noqa: E402


def load_module(path: Path, name: str | None = None):
    """The Python file at ``path`` as a fresh module (ladder files and scripts are not packages)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def release_notebook(assignment: str) -> dict:
    """The student version of an assignment's notebook, as committed in exercises/."""
    (path,) = (ROOT / "exercises" / assignment).glob("*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))


def fill(nb: dict, code: dict[str, str]) -> dict:
    """A copy of ``nb`` whose cells named by grade_id get new source (a student's answer)."""
    nb = copy.deepcopy(nb)
    seen = set()
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in code:
            cell["source"] = code[gid].strip("\n").splitlines(True)
            seen.add(gid)
    missing = set(code) - seen
    assert not missing, f"no cell with grade_id {missing} in the release"
    return nb


def solution_code(assignment: str) -> dict[str, str]:
    """The solution source of every solution cell, with the solution markers removed."""
    (path,) = (ROOT / "solutions" / assignment).glob("*.ipynb")
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution") and cell["cell_type"] == "code":
            src = "".join(cell["source"])
            out[meta["grade_id"]] = "\n".join(
                ln for ln in src.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    return out


def grade_submissions(tmp_path: Path, assignment: str, notebooks: dict[str, dict | str | bytes],
                      timeout: float = 900) -> dict[str, model.Result]:
    """Autograde one notebook per student (a dict, or raw text/bytes for broken files)."""
    subs = tmp_path / "submitted"
    (nb_name,) = model.notebooks_of(assignment)
    for student, nb in notebooks.items():
        d = subs / student / assignment
        d.mkdir(parents=True)
        path = d / f"{nb_name}.ipynb"
        if isinstance(nb, dict):
            path.write_text(json.dumps(nb), encoding="utf-8")
        elif isinstance(nb, bytes):
            path.write_bytes(nb)
        else:
            path.write_text(nb, encoding="utf-8")
    results = workers.autograde(subs, tmp_path / "ws", [assignment], timeout=timeout, quiet=True, jobs=2)
    return {r.student: r for r in results}


def unpack(zip_path: Path, dest: Path) -> Path:
    """Extract ``zip_path`` into ``dest`` as `unzip` does (file modes kept: course.sh stays executable)."""
    import zipfile

    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            target = Path(z.extract(info, dest))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                target.chmod(mode)
    return dest


@pytest.fixture(scope="session")
def student_archive(tmp_path_factory) -> Path:
    """The student archive (`python -m autograder bundle`), built once per test process and
    unpacked: the path of its ``flashattention-course/`` folder. Tests may write inside it."""
    from autograder import bundle

    tmp = tmp_path_factory.mktemp("archive")
    path, _ = bundle.build(tmp / "student.zip")
    return unpack(path, tmp / "unpacked") / "flashattention-course"


@pytest.fixture(autouse=True, scope="session")
def _cpu_threads():
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    yield


def pytest_collection_modifyitems(config, items):
    """GPU-tier tests skip with a reason on a machine without a GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU tier: this machine has no CUDA GPU (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
