"""Every stub tells the student how much to write: in each released exercise, the line before each
region nbgrader replaced (``raise NotImplementedError()``) is ``# YOUR CODE HERE (about N lines)``."""
from __future__ import annotations

import json
import re

from conftest import ROOT

BUDGET = re.compile(r"^\s*(#|//) YOUR CODE HERE \((about )?\d+ lines?\)")
# steps whose stubs name what to write without a line count
WITHOUT_COUNT = {"09_decode_paged_kv", "10_attention_variants"}


def test_every_stub_region_has_a_budget():
    missing, seen = [], 0
    for path in sorted((ROOT / "exercises").glob("*/*.ipynb")):
        if path.parent.name in WITHOUT_COUNT:
            continue
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            lines = "".join(cell["source"]).splitlines()
            for i, line in enumerate(lines):
                if line.strip() == "raise NotImplementedError()":
                    seen += 1
                    if i == 0 or not BUDGET.match(lines[i - 1]):
                        missing.append(f"{path.parent.name}/{cell.get('id')}: {lines[i - 1] if i else '(first line)'}")
    assert seen > 20
    assert not missing, "\n".join(missing)
