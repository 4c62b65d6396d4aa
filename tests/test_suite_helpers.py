"""The suite's own helpers (tests/conftest.py): ``computed_once`` shares one computation between the
pytest-xdist workers of a run."""
from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path

import pytest

from conftest import computed_once


def _ask(key: str, log: str) -> list:
    def compute():
        with open(log, "a") as f:
            f.write("computed\n")
        return [1, 2.5, "three", None]
    return computed_once(key, compute)


def test_computed_once_runs_once_for_processes_asking_together(tmp_path):
    key, log = f"test {uuid.uuid4()}", str(tmp_path / "log")
    with multiprocessing.get_context("fork").Pool(3) as pool:
        got = pool.starmap(_ask, [(key, log)] * 6)
    assert got == [[1, 2.5, "three", None]] * 6
    assert Path(log).read_text().splitlines() == ["computed"]


def test_a_failed_computation_is_not_kept(tmp_path):
    key = f"test {uuid.uuid4()}"

    def fails():
        raise RuntimeError("no result")
    with pytest.raises(RuntimeError, match="no result"):
        computed_once(key, fails)
    assert computed_once(key, lambda: {"then": "computed"}) == {"then": "computed"}
