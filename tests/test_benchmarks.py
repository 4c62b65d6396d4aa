"""Committed GPU results: the README's tables come from the JSON, and each JSON names its machine."""
import json
import subprocess
import sys

from conftest import ROOT


def test_readme_tables_match_the_committed_json():
    r = subprocess.run([sys.executable, "benchmarks/tables.py", "--check"], cwd=ROOT)
    assert r.returncode == 0, "benchmarks/README.md differs from the JSON: run `python benchmarks/tables.py`"


def test_every_result_names_gpu_and_versions():
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    for f in files:
        d = json.loads(f.read_text())
        env = d.get("env", d)
        assert "H100" in env["gpu"] or "H200" in env["gpu"], f.name
        assert env["torch"], f.name
        assert f.name[:10] == "2026-11-22" or f.name[:4].isdigit(), f.name
