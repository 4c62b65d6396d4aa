"""Committed notebooks are clean: no outputs, no embedded images, the python3 kernel.

Lectures are executed once, inside the unpacked student archive, with the library the archive
ships (tests/test_book.py, test_book_builds_from_the_archive): executing them here as well
would double the suite's most expensive tests.
"""
import json
from pathlib import Path

import pytest

from conftest import ROOT

LECTURES = sorted((ROOT / "course").glob("*.ipynb"))
ALL_NOTEBOOKS = sorted(p for d in ("course", "solutions", "exercises") for p in (ROOT / d).rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts)


def test_every_lecture_is_executed_by_the_book_test():
    """The book's build (tests/test_book.py, from the archive) executes every lecture (course/*.ipynb):
    the book's ladder holds each of them, and the test requires a timing for each."""
    import sys

    from test_book import LECTURES as CHECKED
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import book
    finally:
        sys.path.remove(str(ROOT / "tools"))
    executed = sorted(Path(s["lecture"]).name for s in book.ladder(ROOT) if s["lecture"])
    assert LECTURES and sorted(p.name for p in LECTURES) == executed == CHECKED


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in ALL_NOTEBOOKS])
def test_committed_notebooks_are_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: committed with outputs"
        src = "".join(cell["source"])
        assert "data:image/png;base64" not in src, f"{path.name}: embedded image; use a file in diagrams/"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
