"""The results schema is code (facourse.schema): every committed results file validates against it,
and a file that departs from it (a key missing, unknown or of the wrong type; a timed row without its
kind's figures) does not. Also the step kinds' registry (facourse.kinds)."""
import copy
import json

import pytest

from conftest import ROOT
from facourse import kinds, schema

RESULTS = ROOT / "benchmarks" / "results"
FILES = sorted(RESULTS.rglob("*.json"))


def test_results_are_committed():
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_committed_results_validate(path):
    schema.validate(json.loads(path.read_text()))


def _run(step="09"):
    (f,) = sorted(RESULTS.glob(f"*_step{step}.json"))[-1:]
    return json.loads(f.read_text())


@pytest.mark.parametrize("spoil, says", [
    (lambda d: d["env"].pop("gpu"), "missing key 'gpu'"),
    (lambda d: d["rows"][0].update(colour="red"), "unknown key"),
    (lambda d: d["rows"][-1].update(ms="fast"), "expected float, got str"),
    (lambda d: d["rows"][-1].pop("gbps"), "a timed decode row without gbps"),
    (lambda d: d["rows"][0].update(check="maybe"), "not 'ok' or 'error'"),
    (lambda d: d["rows"][0].update(rung="v9_absent"), "not among the run's rungs"),
    (lambda d: d.update(schema=2), "schema 2"),
])
def test_a_file_off_the_schema_is_refused(spoil, says):
    d = copy.deepcopy(_run())
    assert d["rows"][-1]["kind"] == "bench" and "error" not in d["rows"][-1]
    spoil(d)
    with pytest.raises(schema.SchemaError, match=says.replace("(", r"\(").replace("[", r"\[")):
        schema.validate(d)


def test_every_manifest_names_a_registered_kind():
    from facourse.steps import load_step, step_ids
    for sid in step_ids():
        m = load_step(sid)
        k = kinds.of_step(m)
        assert k.name == m["exercise"].get("mode", "forward"), sid
        for r in m["rungs"]:
            assert kinds.of_rung(m, r).name in kinds.REGISTRY


def test_a_kind_module_is_one_registry_line():
    for name, module in kinds.REGISTRY.items():
        assert kinds.get(name).name == name and module.endswith("." + name)
    assert kinds.get(None) is kinds.get("forward")
    with pytest.raises(KeyError, match="no step kind"):
        kinds.get("no_such_kind")


def test_kinds_count_the_work_the_judge_always_counted():
    from facourse import get_config
    from facourse.decode import get_decode_case
    from facourse.variants import perf_flops
    import torch
    assert kinds.get("forward").perf_work("large", "cpu") == get_config("large", "cpu").flops()
    assert kinds.get("backward").perf_work("long", "cpu") == get_config("long", "cpu").flops() * 2.5
    assert kinds.get("decode").perf_work("b64_8k_p16", "cpu") == get_decode_case("b64_8k_p16", "cuda").kv_bytes(
        torch.float16)
    assert kinds.get("variant").perf_work("window1024_8k", "cpu") == perf_flops("window1024_8k")
    assert [kinds.get(n).label for n in ("forward", "backward", "decode", "variant")] == [
        "", " (backward)", " (decode)", " (variant)"]
