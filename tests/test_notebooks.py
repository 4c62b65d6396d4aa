"""Committed notebooks are clean: no outputs, no embedded images, the python3 kernel.

Lectures are executed once, inside the unpacked student archive, with the library the archive
ships (tests/test_archive.py, test_lecture_runs_in_the_archive): executing them here as well
would double the suite's most expensive tests.
"""
import json

import pytest

from conftest import ROOT

LECTURES = sorted((ROOT / "course").glob("*.ipynb"))
ALL_NOTEBOOKS = sorted(p for d in ("course", "solutions", "exercises") for p in (ROOT / d).rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts)


def test_every_lecture_is_executed_by_the_archive_test():
    """The archive test parametrizes over the same lectures (course/*.ipynb): none escapes execution."""
    from test_archive import LECTURES as EXECUTED

    assert LECTURES and sorted(p.name for p in LECTURES) == EXECUTED


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in ALL_NOTEBOOKS])
def test_committed_notebooks_are_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: committed with outputs"
        src = "".join(cell["source"])
        assert "data:image/png;base64" not in src, f"{path.name}: embedded image; use a file in diagrams/"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
