"""Every step's manifest (solutions/NN_*/step.toml) parses and matches the files on disk."""
import pytest

from conftest import ROOT
from facourse.configs import CONFIGS, EDGE_CASES, SWEEP, get_config
from facourse.steps import load_step, solution_path, step_ids

STEPS = ["01", "02", "03", "04", "05", "06", "07"]


def test_every_step_has_a_manifest():
    assert set(STEPS) <= set(step_ids())
    for d in sorted((ROOT / "solutions").glob("[0-9][0-9]_*")):
        assert (d / "step.toml").exists(), f"{d.name} has no step.toml"


@pytest.mark.parametrize("sid", STEPS)
def test_manifest_matches_the_files(sid):
    m = load_step(sid)
    assert m["step"]["id"] == sid and m["step"]["title"]
    assert (m["dir"] / m["step"]["notebook"]).exists()
    assert (ROOT / m["step"]["lecture"]).exists()
    assert m["entry_points"] and all(isinstance(e, str) for e in m["entry_points"])
    for f in m["exercise"]["harness"]:
        assert (m["dir"] / f).exists(), f"harness file {f} of step {sid} is missing"
        assert (ROOT / "exercises" / m["dir"].name / f).exists(), f"harness file {f} is not released"
    if not m["rungs"]:
        assert not m["ladder_dir"].exists(), f"step {sid} has a ladder/ but its manifest lists no rung"
        return
    assert m["reference"]["backend"] in ("FLASH_ATTENTION", "CUDNN_ATTENTION")
    assert m["reference"]["graded_configs"] == ["large", "long"]
    names = [r["name"] for r in m["rungs"]]
    assert len(set(names)) == len(names)
    assert m["ladder"]["solution"] in names
    assert solution_path(m).exists()
    for r in m["rungs"]:
        assert r["verdict"].strip() and "\n" not in r["verdict"], r["name"]
        assert (m["ladder_dir"] / r["file"]).exists(), f"{r['file']} of step {sid} is missing"
    # every file in ladder/ but headers is a rung or listed as support: a new rung cannot be forgotten
    listed = {r["file"] for r in m["rungs"]} | set(m["ladder"].get("support", []))
    on_disk = {p.name for p in m["ladder_dir"].iterdir()
               if p.is_file() and not p.name.startswith(".") and p.suffix not in (".cuh", ".h")}
    assert on_disk == listed, (f"step {sid}: not in step.toml: {sorted(on_disk - listed)}; "
                               f"listed but absent: {sorted(listed - on_disk)}")


@pytest.mark.parametrize("sid", ["05", "06", "07"])
def test_rungs_name_known_configurations(sid):
    from facourse.kinds.forward import EXTRA_CONFIGS, bench_configs
    m = load_step(sid)
    for r in m["rungs"]:
        get_config(r.get("check", "large"), "cuda") if r.get("check", "large") not in EXTRA_CONFIGS else None
        for cfg in bench_configs(m, r):
            assert cfg.name in CONFIGS or cfg.name in SWEEP or cfg.name in EXTRA_CONFIGS or cfg.name == "long"
    assert not set(SWEEP) & set(CONFIGS) and not set(SWEEP) & set(EDGE_CASES)
