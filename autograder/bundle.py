"""`python -m autograder bundle OUT.zip`: the student archive.

It holds what a student needs and nothing of the grading side: course/, exercises/, diagrams/,
src/ (the facourse library), pyproject.toml, environment.yml, course.sh, and a README.md written
for students: docs/STUDENT_README.md, not the repository's README (which is about the grading
side, the tests and the benchmarks, none of which the archive has). course.sh sees that it runs
in the archive (no autograder/, no tests/) and offers only setup, lab and check there. Files
come from git (tracked, or new and not ignored) so build outputs stay out. The archive is
refused, and nothing is written, when any file would be under solutions/ or autograder/ or
contains a solution, hidden-test or mark-scheme marker. tests/test_archive.py unpacks it and
uses it as a student would.
"""
from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from .model import ROOT, GradingError

INCLUDE_DIRS = ("course", "exercises", "diagrams", "src")
INCLUDE_FILES = ("pyproject.toml", "environment.yml", "course.sh", "LICENSE")
STUDENT_README = "docs/STUDENT_README.md"   # becomes the archive's README.md
FORBIDDEN_DIRS = ("solutions", "autograder", "grading", "tests", ".ci")
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
           "BEGIN MARK SCHEME", "END MARK SCHEME")
SKIP_PARTS = ("__pycache__", ".ipynb_checkpoints", "build", ".pytest_cache")
SKIP_SUFFIXES = (".pyc", ".so", ".o", ".egg-info")


def _git_files(root: Path) -> list[str] | None:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=root, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [p for p in out.split("\0") if p]


def student_files(root: Path = ROOT) -> list[str]:
    """Relative paths that go into the bundle."""
    listed = _git_files(root)
    if listed is None:      # not a git checkout: walk the folders
        listed = [str(p.relative_to(root)) for d in INCLUDE_DIRS if (root / d).is_dir()
                  for p in (root / d).rglob("*") if p.is_file()]
        listed += [f for f in INCLUDE_FILES if (root / f).is_file()]
    out = []
    for rel in sorted(set(listed)):
        parts = Path(rel).parts
        if not (parts[0] in INCLUDE_DIRS or rel in INCLUDE_FILES):
            continue
        if any(p in SKIP_PARTS or p.endswith(SKIP_SUFFIXES) for p in parts) or not (root / rel).is_file():
            continue
        out.append(rel)
    return out


def leaks(root: Path, files: list[str]) -> list[str]:
    """Every reason the bundle would give away grading material (empty when it is clean)."""
    bad = []
    for rel in files:
        if Path(rel).parts[0] in FORBIDDEN_DIRS:
            bad.append(f"{rel}: under {Path(rel).parts[0]}/")
            continue
        try:
            text = (root / rel).read_bytes().decode("utf-8", errors="ignore")
        except OSError:
            continue
        for m in MARKERS:
            if m in text:
                bad.append(f"{rel}: contains '{m}'")
    return bad


def build(out: Path, root: Path = ROOT) -> tuple[Path, int]:
    """Write the student zip (top folder ``flashattention-course/``); returns (path, file count)."""
    files = student_files(root)
    if not any(f.startswith("exercises/") for f in files):
        raise GradingError("no exercises/ to bundle: run `python -m autograder release` first")
    if not (root / STUDENT_README).is_file():
        raise GradingError(f"no {STUDENT_README}: the archive's README.md is made from it")
    bad = leaks(root, files + [STUDENT_README])
    if bad:
        raise GradingError("refusing to build the bundle, it would leak grading material:\n  "
                           + "\n  ".join(bad))
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            z.write(root / rel, f"flashattention-course/{rel}")
        info = zipfile.ZipInfo.from_file(root / STUDENT_README, "flashattention-course/README.md")
        z.writestr(info, (root / STUDENT_README).read_bytes(), zipfile.ZIP_DEFLATED)
    tmp.replace(out)
    return out, len(files) + 1
