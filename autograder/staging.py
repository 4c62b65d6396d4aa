"""Staging: the release a submission is graded against, and the submission's own copy.

nbgrader runs with the course's configuration (``nbgrader_config.py``) in a private workspace;
the original submission files are never modified.
"""
from __future__ import annotations

import difflib
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
    # Workers run side by side: one BLAS/OpenMP thread each, so --jobs kernels do not fight over cores.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
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
sys.modules.setdefault("rfc3987_syntax", None)     # as in every grading process: autograder/__init__.py
import nbgrader.api
from nbgrader.apps import NbGraderAPI
from nbgrader.apps.nbgraderapp import NbGraderApp


def alembic_head(nbgrader_s=nbgrader.api.get_alembic_version):
    # A new gradebook records the head of nbgrader's migrations: nbgrader asks `alembic heads` in a process
    # of its own (about 4 CPU-seconds); the same head is read here from the same scripts, in this process.
    try:
        from alembic.script import ScriptDirectory
        from nbgrader.dbutil import ALEMBIC_DIR
        return ScriptDirectory(ALEMBIC_DIR).get_current_head() or nbgrader_s()
    except Exception:
        return nbgrader_s()


nbgrader.api.get_alembic_version = alembic_head

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
def discover(submissions: Path, selected: list[str] | None, students: list[str] | None = None,
             skipped: list[str] | None = None) -> list[tuple[str, str]]:
    """Every (student, assignment) under ``submissions``, of the ``selected`` assignments and
    ``students`` when given; what is neither (unknown folders, loose files) goes to ``skipped``,
    one line each, and a name in ``selected`` or ``students`` with nothing under it is an error."""
    if not submissions.exists():
        raise GradingError(f"submission folder {submissions} does not exist")
    if not submissions.is_dir():
        raise GradingError(f"{submissions} is a file; expected a folder laid out as "
                           "<student>/<assignment>/<notebook>.ipynb")
    known = set(assignments())
    unknown = sorted(set(selected or ()) - known)
    if unknown:
        raise GradingError(f"no assignment {', '.join(unknown)} in solutions/; known: {', '.join(sorted(known))}")
    skipped = [] if skipped is None else skipped
    pairs = []
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    skipped += [f"{p.name}: a file, not a student's folder" for p in sorted(submissions.iterdir())
                if p.is_file() and not p.name.startswith(".")]
    missing = sorted(set(students or ()) - {p.name for p in folders})
    if missing:
        raise GradingError(f"no submission folder for student {', '.join(missing)} under {submissions}")
    for student in folders:
        if students and student.name not in students:
            continue
        for p in sorted(student.iterdir()):
            if p.name.startswith(".") or p.name in ("__pycache__", ".ipynb_checkpoints"):
                continue
            if p.is_dir() and p.name in known:
                if not selected or p.name in selected:
                    pairs.append((student.name, p.name))
                continue
            near = difflib.get_close_matches(p.stem if p.is_file() else p.name, sorted(known), n=1)
            what = "a file, not an assignment folder" if p.is_file() else "not an assignment of this course"
            skipped.append(f"{student.name}/{p.name}: {what}"
                           + (f" (did you mean {near[0]}/?)" if near else ""))
    if not pairs:
        raise GradingError(f"no submissions found under {submissions}: expected "
                           f"<student>/<assignment>/<notebook>.ipynb with an assignment among "
                           f"{', '.join(sorted(known))}"
                           + (f"; skipped: {'; '.join(skipped[:5])}" if skipped else ""))
    return pairs


def precheck(folder: Path, assignment: str) -> str | None:
    """Problems nbgrader would crash on, stated plainly; None when the folder is gradable."""
    expected = notebooks_of(assignment)
    present = sorted(p.name for p in folder.glob("*.ipynb"))
    if not any(f"{nb}.ipynb" in present for nb in expected):
        return (f"missing notebook {', '.join(n + '.ipynb' for n in expected)} "
                f"(found: {', '.join(present) or 'no notebook'})"
                + ("; rename the one to grade" if len(present) > 1 else ""))
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


def repair(folder: Path, assignment: str, release_dir: Path = EXERCISES) -> list[str]:
    """Fix, in the staged copy, what would make nbgrader crash or grade the wrong cells; returns
    each repair in plain words for the status.

    A single notebook under another name is graded as the assignment's notebook. A cell whose
    ``grade_id`` is missing, unknown or a duplicate takes back the release's id it lost when one
    of the same kind is missing; otherwise a solution cell stays as the student's own code (its
    nbgrader metadata dropped) and a copy of a locked cell goes (it would run a test twice).
    """
    notes = []
    expected = notebooks_of(assignment)
    present = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    if len(expected) == 1 and len(present) == 1 and present[0].name != f"{expected[0]}.ipynb":
        present[0].rename(folder / f"{expected[0]}.ipynb")
        notes.append(f"{present[0].name} taken as {expected[0]}.ipynb, the notebook of {assignment}")
    for nb in expected:
        path, ref = folder / f"{nb}.ipynb", release_dir / assignment / f"{nb}.ipynb"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            cells = data["cells"]
            release_nb = json.loads(ref.read_text(encoding="utf-8"))
            release_cells, release_meta = release_nb["cells"], release_nb.get("metadata")
        except (OSError, ValueError, KeyError, TypeError):
            continue            # precheck says what is wrong with it
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            continue
        # the kernel is the release's: another one named in the submission may not exist here
        spec = release_meta.get("kernelspec") if isinstance(release_meta, dict) else None
        nb_meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        theirs = nb_meta.get("kernelspec")
        respec = isinstance(spec, dict) and isinstance(theirs, dict) and theirs.get("name") != spec.get("name")
        if respec:
            data["metadata"] = {**nb_meta, "kernelspec": spec}
            notes.append(f"kernel {theirs.get('name')!r} replaced by the release's {spec.get('name')!r}")

        def kind(cell):
            m = (cell.get("metadata") or {}).get("nbgrader") or {}
            return cell.get("cell_type"), bool(m.get("grade")), bool(m.get("solution")), bool(m.get("locked"))

        released = {grade_id(c): kind(c) for c in release_cells if grade_id(c)}
        ids = [grade_id(c) if isinstance((c.get("metadata") or {}).get("nbgrader"), dict) else None
               for c in cells]
        missing = [g for g in released if g not in ids]
        seen, keep, changed = set(), [], False
        for i, cell in enumerate(cells):
            meta = (cell.get("metadata") or {}).get("nbgrader")
            if not isinstance(meta, dict):
                keep.append(cell)
                continue
            g = meta.get("grade_id")
            if g in released and g not in seen:
                seen.add(g)
                keep.append(cell)
                continue
            changed = True
            what = f"cell {i + 1}" + (f" (grade_id {g!r})" if g else " (no grade_id)")
            match = next((m for m in missing if released[m] == kind(cell)), None)
            if match is not None:
                missing.remove(match)
                seen.add(match)
                meta["grade_id"] = match
                keep.append(cell)
                notes.append(f"{what} graded as the release's {match!r}")
            elif meta.get("locked") or (meta.get("grade") and not meta.get("solution")):
                notes.append(f"{what}: a copy of a locked cell, left out")
            else:
                del cell["metadata"]["nbgrader"]
                keep.append(cell)
                notes.append(f"{what}: not a cell of the release, run as the student's own code")
        if changed or respec:
            data["cells"] = keep
            path.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return notes


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


