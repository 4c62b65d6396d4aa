"""Every lecture and exercise source is authored as a jupytext text twin (tools/notebooks.py).

The committed .ipynb is exactly what its twin builds; cell ids come from names (grade_id, the
marker's title, a slug of the first heading or line), so inserting a cell renames no other cell; and
the twin of a solution notebook, which holds solutions and hidden tests, never reaches exercises/.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shutil

import pytest

from conftest import ROOT

jupytext = pytest.importorskip("jupytext")  # the GPU machines have no Jupyter stack

_spec = importlib.util.spec_from_file_location("notebooks_tool", ROOT / "tools" / "notebooks.py")
nbt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbt)

LECTURES = sorted((ROOT / "course").glob("*.ipynb"))
SOLUTIONS = sorted(p for p in (ROOT / "solutions").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
NOTEBOOKS = LECTURES + SOLUTIONS
IDS = [str(p.relative_to(ROOT)) for p in NOTEBOOKS]
ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")   # nbformat 4.5's rule for cell ids


def _ids(ipynb_text: str) -> list[str]:
    return [c["id"] for c in json.loads(ipynb_text)["cells"]]


def _twin_text(nb):
    return nbt.twin_of(nb).read_text(encoding="utf-8")


def test_every_notebook_has_a_twin():
    assert LECTURES and SOLUTIONS
    assert [p for p in NOTEBOOKS if not nbt.twin_of(p).is_file()] == []
    assert sorted(nb for nb, _ in nbt.pairs(ROOT)) == NOTEBOOKS, "a twin without its notebook, or the reverse"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_committed_notebook_is_the_build_of_its_twin(nb):
    built = nbt.render(_twin_text(nb))
    assert nb.read_bytes() == built.encode("utf-8"), (
        f"{nb.relative_to(ROOT)} differs from the build of its twin: run `python tools/notebooks.py build` "
        "(edited the twin) or `python tools/notebooks.py import` (edited the notebook)")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_import_of_the_notebook_gives_back_its_twin(nb):
    """The escape hatch is lossless: folding an unchanged notebook back rewrites nothing."""
    import nbformat

    twin = _twin_text(nb)
    again = nbt.to_text(nbformat.reads(nb.read_text(encoding="utf-8"), as_version=4), nbt.titles(twin))
    assert again == twin, (f"`python tools/notebooks.py import {nb.relative_to(ROOT)}` would rewrite its twin: "
                           "the twin is not in jupytext's own layout, or the pair is out of sync")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_ids_are_valid_unique_and_named(nb):
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    ids = [c["id"] for c in cells]
    assert all(ID_RE.match(i) for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    for c in cells:
        gid = c["metadata"].get("nbgrader", {}).get("grade_id")
        if gid:
            assert c["id"] == gid, "a graded cell's id is its grade_id"
    assert not any(re.match(r"^c\d\d-", i) for i in ids), "positional ids are gone"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_inserting_a_cell_changes_no_other_id(nb):
    """A new code or markdown cell, at every position of the notebook: every other id stays."""
    import nbformat

    cells = jupytext.reads(_twin_text(nb), fmt=nbt.FORMAT).cells
    before = nbt.cell_ids(cells)
    for new in (nbformat.v4.new_code_cell("# a cell nobody has written yet\nz = 0"),
                nbformat.v4.new_markdown_cell("## A brand-new section"),
                nbformat.v4.new_code_cell("")):
        for k in range(len(cells) + 1):
            after = nbt.cell_ids(cells[:k] + [new] + cells[k:])
            assert after[:k] + after[k + 1:] == before, f"inserting a cell at {k} renamed others"


def test_inserting_a_cell_in_the_text_changes_no_other_id():
    """The same through the whole pipeline: a cell typed into a twin, built to .ipynb."""
    text = _twin_text(LECTURES[1])
    before = _ids(nbt.render(text))
    at = [m.start() for m in re.finditer(r"^# %%", text, re.M)][len(before) // 2]
    after = _ids(nbt.render(text[:at] + "# %%\n# a cell nobody has written yet\nz = 0\n\n" + text[at:]))
    assert after[:len(before) // 2] + after[len(before) // 2 + 1:] == before


def test_ids_from_names_and_duplicates():
    text = ("# %% [markdown]\n# # Title\n\n# %%\n@deco\ndef f(x):\n    return x\n\n# %%\nx = 1\n\n"
            "# %%\nx = 1\n\n# %% explicit-name\nx = 1\n\n"
            '# %% nbgrader={"grade": false, "grade_id": "my_answer", "locked": false, "schema_version": 3, '
            '"solution": true, "task": false}\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n\n'
            "# %%\n\n")
    ids = _ids(nbt.render(text))
    assert ids == ["title", "def-f", "x-1", "x-1-2", "explicit-name", "my_answer", "cell"]
    built = json.loads(nbt.render(text))
    assert all("title" not in c["metadata"] for c in built["cells"]), "marker titles stay in the twin"
    # a new cell with the same first line renumbers only its later namesakes; the named cell keeps its id
    ids2 = _ids(nbt.render(text.replace("# %% explicit-name", "# %%\nx = 1\n\n# %% explicit-name")))
    assert ids2 == ["title", "def-f", "x-1", "x-1-2", "x-1-3", "explicit-name", "my_answer", "cell"]
    with pytest.raises(ValueError):
        nbt.render("# %% same\nx = 1\n\n# %% same\ny = 1\n")


def test_check_names_a_notebook_out_of_sync(tmp_path, capsys):
    """Edit a twin in a copy of the tree: `check` fails and names it; `build` brings it back."""
    lecture, solution = LECTURES[0], SOLUTIONS[0]
    for nb in (lecture, solution):
        dst = tmp_path / nb.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nb, dst)
        shutil.copy(nbt.twin_of(nb), nbt.twin_of(dst))
    assert nbt.main(["check", "--root", str(tmp_path)]) == 0
    twin = nbt.twin_of(tmp_path / lecture.relative_to(ROOT))
    twin.write_text(twin.read_text(encoding="utf-8") + "\n# %%\nprint('one more cell')\n", encoding="utf-8")
    capsys.readouterr()
    assert nbt.main(["check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert str(lecture.relative_to(ROOT)) in out and str(solution.relative_to(ROOT)) not in out
    assert nbt.main(["build", "--root", str(tmp_path)]) == 0
    assert nbt.main(["check", "--root", str(tmp_path)]) == 0


def _nbgrader_ignore() -> list[str]:
    """c.CourseDirectory.ignore of autograder/nbgrader_config.py, loaded as nbgrader loads it."""
    class Section(dict):
        def __getattr__(self, k):
            return self.setdefault(k, Section())

        def __setattr__(self, k, v):
            self[k] = v

    c = Section()
    path = ROOT / "autograder" / "nbgrader_config.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"),
         {"get_config": lambda: c, "__file__": str(path), "__name__": "nbgrader_config"})
    return list(c["CourseDirectory"]["ignore"])


def test_no_solution_twin_is_released():
    """nbgrader copies every file of solutions/NN_* except the ignore patterns (matched on the name)."""
    ignore = _nbgrader_ignore()
    for nb in SOLUTIONS:
        name = nbt.twin_of(nb).name
        assert any(fnmatch.fnmatch(name, pat) for pat in ignore), f"{name} would be copied into exercises/"
    assert not list((ROOT / "exercises").rglob("*" + nbt.TWIN_SUFFIX)), "a twin is in exercises/"


def test_twins_are_not_modules():
    """A twin's name is no importable module, and pytest (testpaths = tests) never collects one."""
    for nb in NOTEBOOKS:
        stem = nbt.twin_of(nb).name.removesuffix(".py")
        assert not stem.isidentifier(), stem
    assert not list((ROOT / "tests").rglob("*" + nbt.TWIN_SUFFIX))
