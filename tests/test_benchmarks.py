"""Committed GPU results: one schema, the README's tables and the lectures' copy come from the JSON,
and the ladder runner works on the CPU (Triton interpreter) as far as a CPU can take it."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))


def _schema1():
    out = []
    for f in sorted(RESULTS.glob("*.json")):
        d = json.loads(f.read_text())
        if d.get("schema") == 1:
            out.append((f, d))
    return out


def test_readme_tables_and_lecture_copy_match_the_committed_json():
    r = subprocess.run([sys.executable, "benchmarks/tables.py", "--check"], cwd=ROOT)
    assert r.returncode == 0, ("benchmarks/README.md or course/results/measured.json differs from the JSON: "
                               "run `python benchmarks/tables.py`")


def test_every_result_names_gpu_and_versions():
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for f in files:
        d = json.loads(f.read_text())
        env = d.get("env", d)
        assert "H100" in env["gpu"] or "H200" in env["gpu"], f.name
        assert env["torch"], f.name
        assert f.name[:10] == "2026-11-22" or f.name[:4].isdigit(), f.name


def test_ladder_results_follow_the_one_schema():
    from facourse import kinds
    from facourse.bench import TIMING
    from facourse.steps import load_step
    found = _schema1()
    assert {d["step"] for _, d in found} >= {"05", "07"}
    for f, d in found:
        m = load_step(d["step"])
        ring = d.get("mode") == "ring" and d["timing"].startswith("benchmarks.ladder ring")   # step 12: ranks' events
        assert d["timing"] == TIMING or d["timing"].startswith("facourse.bench.time_calls") or ring, f.name
        assert d["reference"] == m["reference"]["backend"], f.name
        assert set(d["env"]) >= {"gpu", "date", "torch", "triton", "cuda", "cudnn", "capability", "sm_count"}
        assert d["solution"] in d["rungs"], f.name
        for r in d["rows"]:
            assert r["rung"] in d["rungs"] and r["kind"] in ("check", "bench"), (f.name, r)
            if r["kind"] == "check":
                assert r["check"] in ("ok", "error"), (f.name, r)
            elif "error" not in r:
                rate = kinds.of_results(d).rate_key    # step 09: GB/s of K/V read
                assert r["ratio"] > 0 and r[rate] > 0 and r[rate + "_ref"] > 0 and r["ref_backend"], (f.name, r)
        checks = [r for r in d["rows"] if r["kind"] == "check" and r["rung"] == d["solution"]]
        if d.get("mode") == "decode":
            from facourse.decode import DECODE_CASES
            assert {r["config"] for r in checks} == set(DECODE_CASES), f"{f.name}: the solution on every decode case"
            assert 0 < d["env"]["copy_gbps"], f.name
        else:
            assert len(checks) >= 12, f"{f.name}: the solution must be checked on the five and the edge cases"


def test_lecture_copy_ships_what_the_lectures_read():
    from facourse import results
    for step in ("05", "07"):
        d = results.load(step)
        assert d is not None and d["timing"] and d["env"]["gpu"], step
        assert results.bench(d, d["solution"], "large", "float16", "FLASH_ATTENTION"), step
        assert "| large (1) |" in results.bar_table(d)
    probe = results.load("timing_probe")
    assert any(r["config"] == "large" and r["hide_host"] for r in probe["rows"])


def test_lectures_and_diagrams_read_nothing_outside_the_student_archive():
    for nb in ("course/05_triton_flash_attention.ipynb", "course/06_cuda_flash_attention.ipynb",
               "course/07_hopper_flash_attention.ipynb"):
        src = "\n".join("".join(c["source"]) for c in json.loads((ROOT / nb).read_text())["cells"]
                        if c["cell_type"] == "code")
        for bad in ('"benchmarks"', "../benchmarks", "import tables", "autograder"):
            assert bad not in src, f"{nb} reads {bad}, which the student archive leaves out"
    draw = (ROOT / "diagrams" / "draw.py").read_text()
    assert '"benchmarks"' not in draw


def test_ladder_runner_checks_a_rung_on_the_cpu(tmp_path):
    """The runner end to end on the CPU: one Triton rung, one check through the interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "benchmarks.ladder", "05", "--only", "v3_causal_split",
                        "--checks", "small", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*_step05.json")
    d = json.loads(f.read_text())
    assert d["schema"] == 1 and d["rows"] == [
        {"rung": "v3_causal_split", "config": "small", "dtype": "float16", "kind": "check", "check": "ok",
         "seconds": d["rows"][0]["seconds"]}]
    assert "checks 1/1" in r.stdout
    # the rung's line as it ends, before the table: what a run cut short still shows
    assert "-- v3_causal_split: checks 1/1" in r.stdout.split("step 05 on")[0]


@pytest.mark.parametrize("step", ["05", "06", "07"])
def test_runner_plans_what_the_old_drivers_measured(step):
    from facourse.kinds.forward import bench_configs, sweep_names
    from facourse.steps import load_step
    m = load_step(step)
    sol = next(r for r in m["rungs"] if r["name"] == m["ladder"]["solution"])
    names = [c.name for c in bench_configs(m, sol)]
    for must in ["small", "medium", "large", "noncausal", "asymmetric", "long",
                 "causal_4k", "causal_8k", "causal_16k", "noncausal_4k", "noncausal_8k", "noncausal_16k"]:
        assert must in names, (step, must)
    assert set(sweep_names(m, quick=True)) == {"causal_4k", "causal_8k", "causal_16k",
                                               "noncausal_4k", "noncausal_8k", "noncausal_16k"}


def test_methods_put_each_other_timings_ratio_in_the_row_and_the_table(monkeypatch):
    """--methods: the row carries the ratio under do_bench and plain events, the schema takes it, the
    table prints it beside the course's; without --methods nothing is added (a stale cross is ignored)."""
    from facourse import bench, schema
    from facourse.kinds import get
    from facourse.kinds.base import row_of
    res = bench.BenchResult("window1024_8k", "H100", "float16", "FLEX", 1.0, 1.25, 400.0, 320.0, 1.25)
    monkeypatch.setattr(bench, "last_cross", {"do_bench": {"s": 1.0, "r": 1.2}, "events": {"s": 2.0, "r": 2.6}})
    assert "ratio_methods" not in row_of(res)
    monkeypatch.setattr(bench, "CROSS_CHECK", True)
    row = row_of(res)
    assert row["ratio_methods"] == pytest.approx({"do_bench": 1.2, "events": 1.3})
    assert bench.last_cross == {}, "a cross timing belongs to one row"
    assert "ratio_methods" not in row_of(res)
    row.update(rung="v6", config="window1024_8k", dtype="float16", kind="bench")
    d = {"schema": 1, "step": "10", "env": {"gpu": "H100", "date": "2026-11-27", "torch": "2.11", "cuda": "13.0"},
         "timing": bench.TIMING, "reference": "FLEX", "solution": "v6", "mode": "variant",
         "rungs": {"v6": {"file": "v6.py", "verdict": "x"}}, "rows": [row]}
    schema.validate(d)
    (line,) = get("variant").summary_lines(d)[1:]
    assert "1.25x (320) [do_bench 1.20x, events 1.30x]" in line, line


def test_fp8_rungs_are_timed_prequantised_and_end_to_end():
    """Step 10's FP8 rungs: prequantised on long, large and 16k non-causal (the 1000 TFLOP/s bar), and
    end to end (fp16 in, quantisation timed) on long and large, each against FA2 and cuDNN."""
    from facourse.kinds import get
    from facourse.kinds.base import PASS_MARK
    from facourse.steps import load_step, rung
    m = load_step("10")
    kind = get("fp8")
    benches = kind.bench_cases(m, rung(m, "v7_fp8_fa3"), False, False, ("float16",))
    pre = {(b.case, b.backend) for b in benches if b.dtype == "float8_e4m3fn" and not b.extra}
    e2e = {(b.case, b.backend) for b in benches if b.extra == {"mode": "e2e"} and b.dtype == "float16"}
    backends = {"FLASH_ATTENTION", "CUDNN_ATTENTION"}
    assert pre == {(c, be) for c in ("long", "large", "noncausal_16k") for be in backends}
    assert e2e == {(c, be) for c in ("long", "large") for be in backends}
    assert PASS_MARK["e2e"] == " e2e"


def test_fp8_table_reads_errors_and_both_timings_from_a_run():
    """The FP8 table: one row per FP8 rung with its RMSE on FA3's inputs (from its checks), its rates on
    e4m3 inputs, its end-to-end rate and that rate against the fp16 solution's in the same run."""
    from facourse import results as R
    d = json.loads((RESULTS / "2026-11-27_h100_step10.json").read_text())
    c = R.compact(d, "x")
    assert c["errors"]["v7_fp8_fa3"]["fa3_outliers_2k"] < c["errors"]["v5_fp8"]["fa3_outliers_2k"]
    lines = R.fp8_table(c).splitlines()
    assert "RMSE, fa3_outliers_2k" in lines[0] and "RMSE, fa3_outliers_8k" in lines[0]
    (v7,) = [ln for ln in lines if ln.startswith("| v7_fp8_fa3 |")]
    sol = R.bench(c, "v6_hopper_window", "long", "float16", "FLASH_ATTENTION")[0]["tflops"]
    e2e = [r for r in R.bench(c, "v7_fp8_fa3", "long", "float16", "FLASH_ATTENTION") if r.get("mode") == "e2e"][0]
    assert f"| {e2e['tflops']:.0f} | {e2e['tflops'] / sol:.2f}x [do_bench" in v7, v7
    assert {ln.split(" | ")[0] for ln in lines[2:]} == {"| v5_fp8", "| v7_fp8_fa3"}


def test_step11_traces_committed_and_apply_right():
    """benchmarks/traces.py's committed run: every solution PASSED on every workload and was timed,
    and apply() routed each workload to a solution whose output passed and that re-timed fastest."""
    (f,) = sorted(RESULTS.glob("*_step11_traces.json"))[-1:]
    d = json.loads(f.read_text())
    assert {r["status"] for r in d["traces"]} == {"PASSED"} and all(r["speedup"] > 0 for r in d["traces"])
    assert len(d["traces"]) == 4 * 6 and len(d["dispatch"]) == 6
    assert all(r["right"] and r["output"] == "passed" for r in d["dispatch"]), d["dispatch"]


def test_step11_traces_runner_builds_and_routes_a_solution_on_the_cpu(tmp_path):
    """The runner's pieces on a CPU: the Triton solution (step 05's solution rung, Triton's interpreter)
    as a FlashInfer-Bench solution builds, traces PASSED, and apply()'s table routes to it."""
    code = """
import sys, tempfile
import flashinfer_bench as fib
from flashinfer_bench.apply.key import ApplyKeyFactory
from flashinfer_bench.apply.runtime import ApplyRuntime
from flashinfer_bench.compile import BuilderRegistry
from benchmarks import traces as T
from facourse import interchange as fx
d = fx.spec_definition()
s = T.solution("triton", "cpu")
w = fx.workloads("cpu")[0]
t = fx.trace(d, s, BuilderRegistry.get_instance().build(d, s), w)
root = fx.save_trace_set(sys.argv[1], d, [s], [w], [t])
fib.enable_apply(str(root), fx.apply_config())
q, k, v, c = fx.make_workload_inputs(w, seed=1)
print("RESULT", t.evaluation.status.value, T._routed(ApplyKeyFactory.specialize(d).build_from_args((q, k, v, c)),
                                                    ApplyRuntime.get_instance(), d))
"""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", FIB_CACHE_PATH=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "set")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "RESULT PASSED triton" in r.stdout, r.stdout[-2000:]


def test_step11_traces_rank_solutions_by_their_own_times():
    """one_reference: the traces of a workload share one reference time, so apply() ranks its solutions
    by their times and not by the spread of the reference's timings (here: a faster solution whose
    reference happened to read slower must still rank first)."""
    import flashinfer_bench as fib

    from benchmarks import traces as T
    from facourse import interchange as fx
    w = fx.workloads("gpu")[2]

    def traced(name, ms, ref_ms):
        t = fx.routing_trace(w, name, "PASSED", 1.0)
        perf = fib.Performance(latency_ms=ms, reference_latency_ms=ref_ms, speedup_factor=ref_ms / ms)
        return t.model_copy(update={"evaluation": t.evaluation.model_copy(update={"performance": perf})})

    raw = [traced("fast", 0.040, 0.344), traced("slow", 0.041, 0.362)]
    assert raw[1].evaluation.performance.speedup_factor > raw[0].evaluation.performance.speedup_factor
    ranked = T.one_reference(raw)
    assert ranked[0].evaluation.performance.speedup_factor > ranked[1].evaluation.performance.speedup_factor
    assert {t.evaluation.performance.reference_latency_ms for t in ranked} == {0.353}


def _fake_flashinfer():
    """FlashInfer's single_prefill_with_kv_cache as its documentation states it, in float64 on a CPU:
    q [qo_len, Hq, D]; K and V [kv_len, Hkv, D] (NHD) or [Hkv, kv_len, D] (HND); query head i reads KV head
    i // (Hq // Hkv); causal: row r sees keys up to r + kv_len - qo_len; the output [qo_len, Hq, D]."""
    import types

    import torch

    def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", sm_scale=None, backend="auto"):
        assert q.dim() == k.dim() == v.dim() == 3 and backend in ("fa2", "fa3")
        assert kv_layout == "NHD"           # FlashInfer 0.7.2's FA3 single prefill dies on HND (an H100, 2026-11-23)
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1        # FlashInfer's one demand on strides
        if kv_layout == "NHD":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        Sq, Hq, D = q.shape
        Hkv, Skv = k.shape[:2]
        assert Hq % Hkv == 0
        idx = torch.arange(Hq) // (Hq // Hkv)
        s = torch.einsum("qhd,hkd->hqk", q.double(), k.double()[idx]) * (sm_scale or D ** -0.5)
        if causal:
            keep = torch.arange(Skv)[None, :] <= torch.arange(Sq)[:, None] + (Skv - Sq)
            s = s.masked_fill(~keep, float("-inf"))
        return torch.einsum("hqk,hkd->qhd", s.softmax(-1), v.double()[idx]).to(q.dtype).contiguous()

    return types.SimpleNamespace(__version__="fake", single_prefill_with_kv_cache=single_prefill_with_kv_cache)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("B,Hq,Hkv,Sq,Skv,causal", [(2, 4, 2, 5, 9, True), (3, 4, 1, 7, 7, False),
                                                    (2, 2, 2, 6, 6, True)])
def test_flashinfer_reference_folds_the_batch_into_heads_correctly(monkeypatch, B, Hq, Hkv, Sq, Skv, causal,
                                                                    layout):
    """The FLASHINFER reference hands FlashInfer one call with the batch folded into the heads, by views
    (contiguous [B, H, S, D]), or one call per sequence ([B, S, H, D] memory): each sequence must still
    meet only its own keys, in its own KV head group, bottom-right causal."""
    import torch

    from facourse import bench
    from facourse.reference import reference_attention

    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    fn, name = bench.reference("FLASHINFER")
    assert name == "FLASHINFER"
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, Hq, Sq, 16, generator=g)
    k, v = torch.randn(B, Hkv, Skv, 16, generator=g), torch.randn(B, Hkv, Skv, 16, generator=g)
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    o = fn(q, k, v, causal=causal, scale=0.3)
    ref, _ = reference_attention(q, k, v, causal=causal, scale=0.3)
    assert o.shape == q.shape and fn.last_backend == "FLASHINFER fake single_prefill (fa2)"
    torch.testing.assert_close(o.double(), ref, atol=1e-6, rtol=1e-6)


def test_runner_adds_flashinfer_to_a_forward_solutions_fp16_references_where_installed(monkeypatch):
    import facourse.bench as fb
    from facourse import kinds
    from facourse.steps import load_step

    m05, m08 = load_step("05"), load_step("08")

    def backends(m, solution, dtype):
        return kinds.of_step(m).backends(m, solution, dtype)

    monkeypatch.setattr(fb, "flashinfer_available", lambda: True)
    assert backends(m05, True, "float16") == ["FLASH_ATTENTION", "CUDNN_ATTENTION", "FLASHINFER"]
    assert backends(m05, True, "bfloat16") == ["FLASH_ATTENTION", "CUDNN_ATTENTION"]   # fp16 modules carried
    assert "FLASHINFER" not in backends(m08, True, "float16")                             # a backward step
    assert "FLASHINFER" not in backends(m05, False, "float16")                            # rungs: the step's own
    monkeypatch.setattr(fb, "flashinfer_available", lambda: False)
    assert backends(m05, True, "float16") == ["FLASH_ATTENTION", "CUDNN_ATTENTION"]


def test_a_new_kind_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
    """The runner asks the kind for everything it checks and records: a kind it has never seen (one
    module, one registry line) runs through the same loop, its rows in the schema."""
    import types

    from benchmarks import ladder
    from facourse import kinds, schema
    from facourse.kinds.base import Kind

    class Toy(Kind):
        name = "toy"

        def check_cases(self, m, r, solution):
            return ["one", "two"] if solution else [r.get("check", "one")]

        def check(self, fn, case, device, dtype):
            if fn(case) != case.upper():
                raise AssertionError(f"{case}: wrong")
            return {"rel_err": 0.0}

    mod = types.ModuleType("toy_kind")
    mod.KIND = Toy()
    monkeypatch.setitem(sys.modules, "toy_kind", mod)
    monkeypatch.setitem(kinds.REGISTRY, "toy", "toy_kind")
    m = {"step": {"id": "99"}, "exercise": {"mode": "toy"}, "ladder": {"solution": "v2"}, "reference": {"backend": "X"},
         "rungs": [{"name": "v1", "file": "v1.py", "verdict": "a"}, {"name": "v2", "file": "v2.py", "verdict": "b"}]}
    monkeypatch.setattr(ladder, "entry_point", lambda m, name: (str.upper if name == "v2" else str.lower))
    rows = []
    for name in ("v2", "v1"):
        out = tmp_path / f"{name}.json"
        ladder.run_rung(m, name, False, out)
        rows += json.loads(out.read_text())["rows"]
    assert [(r["rung"], r["config"], r["check"]) for r in rows] == [
        ("v2", "one", "ok"), ("v2", "two", "ok"), ("v1", "one", "error")]
    assert rows[0]["rel_err"] == 0.0 and rows[2]["error"] == "AssertionError: one: wrong"
    d = {"schema": 1, "step": "99", "env": {"gpu": "cpu", "date": "2026-11-27", "torch": "x", "cuda": None},
         "timing": "t", "reference": "X", "mode": "toy", "solution": "v2",
         "rungs": {"v1": {"file": "v1.py", "verdict": "a"}, "v2": {"file": "v2.py", "verdict": "b"}}, "rows": rows}
    schema.validate(d)
    assert "v2: checks 2/2" in ladder.table(d) and "v1: checks 0/1" in ladder.table(d)


def test_a_superseded_run_is_never_the_newest(tmp_path, monkeypatch):
    """tables.latest: a `*_before_*` results file (a build the tree has moved past) is skipped, however it
    sorts."""
    import tables
    run = {"schema": 1, "step": "08"}
    for name in ("2026-11-27_h100_step08.json", "2026-11-27_h200_step08_before_rotation.json"):
        (tmp_path / name).write_text(json.dumps({**run, "tag": name}))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert tables.latest("08")[0] == "2026-11-27_h100_step08.json"
    (tmp_path / "2026-11-27_h100_step08.json").unlink()
    with pytest.raises(FileNotFoundError):
        tables.latest("08")
