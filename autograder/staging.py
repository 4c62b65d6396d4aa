"""Staging: the release a submission is graded against, and the submission's own copy.

nbgrader runs with the course's configuration (``nbgrader_config.py``) in a private workspace;
the original submission files are never modified.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from .model import EXERCISES, HERE, ROOT, SOLUTIONS, GradingError, assignments, hash_tree, notebooks_of


def nbgrader_env(workspace: Path, **extra) -> dict:
    env = dict(os.environ)
    # nbgrader shells out to `alembic`: the interpreter's bin/ must be on PATH.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["FACOURSE_WORKSPACE"] = str(workspace)
    # Hidden tests import grading helpers (autograder.perf, autograder.guards) from the repository.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Step 11's flashinfer_bench builds solutions and caches apply tables under FIB_CACHE_PATH: one per
    # submission's workspace, so that no grading run reads what another one built.
    env["FIB_CACHE_PATH"] = str(workspace / "fib_cache")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_nbgrader(args: list[str], workspace: Path, timeout: float | None = None, **extra):
    """Run one nbgrader command in its own process, with the course's nbgrader_config.py."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    return subprocess.run(cmd, cwd=HERE, env=nbgrader_env(workspace, **extra), capture_output=True,
                          text=True, timeout=timeout)


# ----------------------------------------------------------------------------- release
def release(selected: list[str] | None, workspace: Path, release_dir: Path | None = None,
            quiet: bool = False) -> None:
    """Regenerate the student version of each assignment (and record it in the gradebook)."""
    todo = selected or assignments()
    unknown = sorted(set(todo) - set(assignments()))
    if unknown:
        raise GradingError(f"no assignment {', '.join(unknown)} in solutions/; known: {', '.join(assignments())}")
    workspace.mkdir(parents=True, exist_ok=True)
    extra = {"FACOURSE_RELEASE": str(release_dir)} if release_dir else {}
    # One process for every assignment (nbgrader's API, the course's nbgrader_config.py): each
    # `nbgrader generate_assignment` process spends seconds importing before it writes anything.
    r = subprocess.run([sys.executable, "-c", _RELEASE, *todo], cwd=HERE, env=nbgrader_env(workspace, **extra),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise GradingError(f"nbgrader generate_assignment failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    if not quiet:
        for a in todo:
            print(f"released {a} -> {(release_dir or EXERCISES) / a}")


_RELEASE = """
import sys
from nbgrader.apps import NbGraderAPI
from nbgrader.apps.nbgraderapp import NbGraderApp

app = NbGraderApp()
app.load_config_file()                       # nbgrader_config.py of the working directory
api = NbGraderAPI(config=app.config)
for a in sys.argv[1:]:
    res = api.generate_assignment(a, force=True)
    if not res["success"]:
        print(f"{a}:", res.get("error"), res.get("log"), file=sys.stderr)
        sys.exit(1)
"""


# ----------------------------------------------------------------------------- staging
def discover(submissions: Path, selected: list[str] | None) -> list[tuple[str, str]]:
    if not submissions.exists():
        raise GradingError(f"submission folder {submissions} does not exist")
    if not submissions.is_dir():
        raise GradingError(f"{submissions} is a file; expected a folder laid out as "
                           "<student>/<assignment>/<notebook>.ipynb")
    known = set(assignments())
    pairs = []
    for student in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for a in sorted(p.name for p in student.iterdir() if p.is_dir()):
            if a in known and (not selected or a in selected):
                pairs.append((student.name, a))
    if not pairs:
        raise GradingError(f"no submissions found under {submissions}: expected "
                           f"<student>/<assignment>/<notebook>.ipynb with an assignment among "
                           f"{', '.join(sorted(known))}")
    return pairs


def precheck(folder: Path, assignment: str) -> str | None:
    """Problems nbgrader would crash on, stated plainly; None when the folder is gradable."""
    expected = notebooks_of(assignment)
    present = sorted(p.name for p in folder.glob("*.ipynb"))
    if not any(f"{nb}.ipynb" in present for nb in expected):
        return (f"missing notebook {', '.join(n + '.ipynb' for n in expected)} "
                f"(found: {', '.join(present) or 'no notebook'})")
    for nb in expected:
        path = folder / f"{nb}.ipynb"
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{nb}.ipynb is not a notebook (not valid JSON: {e})"
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            return f"{nb}.ipynb is not a notebook (JSON without a list of cells)"
    return None


def grade_id(cell) -> str | None:
    return (cell.get("metadata") or {}).get("nbgrader", {}).get("grade_id")


def restore_deleted_cells(path: Path, assignment: str, release_dir: Path = EXERCISES) -> list[str]:
    """Put back graded and locked cells a student deleted, from the release, at their place.

    nbgrader's own ``add_missing_cells`` fails when the cell before a deleted one is a plain
    locked cell; doing it here keeps every test running. Returns the restored grade_ids.
    """
    release_nb = json.loads((release_dir / assignment / path.name).read_text(encoding="utf-8"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    present = {grade_id(c) for c in nb["cells"]} - {None}
    restored = []
    for i, cell in enumerate(release_nb["cells"]):
        g = grade_id(cell)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if g is None or g in present or not (meta.get("grade") or meta.get("locked") or meta.get("solution")):
            continue
        at = 0      # after the nearest earlier release cell that the submission still has
        for prev in reversed(release_nb["cells"][:i]):
            if grade_id(prev) in present:
                at = next(j for j, c in enumerate(nb["cells"]) if grade_id(c) == grade_id(prev)) + 1
                break
        nb["cells"].insert(at, cell)
        present.add(g)
        restored.append(g)
    if restored:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    return restored


def stage(src: Path, dst: Path) -> None:
    """Copy one submission folder; grading never touches the original."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=False,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))


#: Releases already generated, by the hash of their sources (nbgrader takes ~13 s per assignment).
RELEASE_CACHE = ROOT / "grading" / ".release-cache"


def prepare(workspace: Path, todo: list[str]) -> None:
    """Release into the workspace (the gradebook must know each graded cell) and make the
    template gradebook that every worker copies.

    A fresh workspace takes the release and its gradebook from :data:`RELEASE_CACHE` when the same
    sources were released before; a workspace that already has a gradebook (grades in it) is
    always released into afresh.
    """
    import nbgrader

    fresh = not (workspace / "gradebook.db").exists()
    key = hash_tree(*(SOLUTIONS / a for a in sorted(todo)), HERE / "nbgrader_config.py") + nbgrader.__version__
    cached = RELEASE_CACHE / key
    if fresh and (cached / "gradebook.db").is_file():
        workspace.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cached / "release", workspace / "release", dirs_exist_ok=True)
        shutil.copyfile(cached / "gradebook.db", workspace / "gradebook.db")
    else:
        release(todo, workspace, release_dir=workspace / "release", quiet=True)
        if fresh:
            tmp = RELEASE_CACHE / f".{key}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(workspace / "release", tmp / "release")
            shutil.copyfile(workspace / "gradebook.db", tmp / "gradebook.db")
            try:
                os.replace(tmp, cached)      # another process may have stored the same key first
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
    (workspace / "work").mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(workspace / "gradebook.db")
    dst = sqlite3.connect(workspace / "work" / "template.db")
    with dst:
        src.backup(dst)          # a consistent copy even if the gradebook is being read
    src.close()
    dst.close()


