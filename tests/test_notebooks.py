"""Every lecture notebook executes top to bottom on the CPU; committed notebooks carry no outputs."""
import json
import time

import pytest

nbformat = pytest.importorskip("nbformat")  # the GPU machines have no Jupyter stack
NotebookClient = pytest.importorskip("nbclient").NotebookClient

from conftest import ROOT

LECTURES = sorted((ROOT / "course").glob("*.ipynb"))
ALL_NOTEBOOKS = sorted(p for d in ("course", "solutions", "exercises") for p in (ROOT / d).rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.slow
@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_runs_on_cpu(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    elapsed = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert elapsed < 240, f"{path.name} took {elapsed:.0f} s on this CPU; lectures must stay quick"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in ALL_NOTEBOOKS])
def test_committed_notebooks_are_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: committed with outputs"
        src = "".join(cell["source"])
        assert "data:image/png;base64" not in src, f"{path.name}: embedded image; use a file in diagrams/"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
