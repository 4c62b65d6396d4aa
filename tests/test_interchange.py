"""Step 11's interchange with FlashInfer-Bench (facourse.interchange), on the CPU.

The spec's definition passes its checks and each planted definition bug fails with its reason;
the layout adapters are views; traces carry the course's verdict and survive apply()'s filter
exactly when PASSED; the grader's routing check passes a correct enable_apply/apply deployment
(flashinfer_bench's own apply(), its python builder building the synthetic solutions) and fails
each planted deployment bug with its message.
"""
from __future__ import annotations

import copy
import gc
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

fib = pytest.importorskip("flashinfer_bench")

from flashinfer_bench.apply.config import ApplyConfigRegistry  # noqa: E402
from flashinfer_bench.apply.table import ApplyTable  # noqa: E402
from flashinfer_bench.compile import BuilderRegistry  # noqa: E402

from facourse import interchange as ic  # noqa: E402
from facourse.check import check_attention  # noqa: E402
from facourse.reference import reference_attention  # noqa: E402

# A definition's reference as a student writes it: PyTorch, the definition's layout, GQA by
# repeat_interleave, bottom-right causal, empty rows 0.
REFERENCE = '''
import math
import torch


def run(q, k, v, causal):
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2).float()
    kh = k.transpose(1, 2).float().repeat_interleave(H // Hkv, dim=1)
    vh = v.transpose(1, 2).float().repeat_interleave(H // Hkv, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(D)
    if causal:
        i = torch.arange(Sq)[:, None]
        j = torch.arange(Skv)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = p @ vh
    return o.transpose(1, 2).to(q.dtype)
'''

# The same with PyTorch's is_causal: top-left aligned.
REFERENCE_SDPA_IS_CAUSAL = '''
import torch


def run(q, k, v, causal):
    H, Hkv = q.shape[2], k.shape[2]
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    kh, vh = kh.repeat_interleave(H // Hkv, dim=1), vh.repeat_interleave(H // Hkv, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return o.transpose(1, 2).to(q.dtype)
'''


def definition(reference: str = REFERENCE, **changes) -> dict:
    """The spec as a definition dict (what a student writes), with ``changes`` applied."""
    d = copy.deepcopy({**ic.SPEC, "reference": reference})
    for path, value in changes.items():
        *keys, last = path.split("__")
        node = d
        for key in keys:
            node = node[key]
        node[last] = value
    return d


def kernel(q, k, v, causal=False):
    """A correct course kernel: (o, lse) in q's dtype."""
    o, lse = reference_attention(q, k, v, causal, dtype=torch.float32)
    return o.to(q.dtype), lse


@pytest.fixture(autouse=True)
def fib_cache(tmp_path, monkeypatch):
    """flashinfer_bench's cache (built solutions, apply tables) in a temp folder, never in ~/.cache."""
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib_cache"))
    return tmp_path / "fib_cache"


# ----------------------------------------------------------------------------- definitions
def test_the_spec_definition_passes_both_checks():
    d = fib.Definition(**definition())
    for form in (d, d.model_dump_json(), definition()):
        ic.check_definition(form)
    ic.check_definition_reference(ic.definition_reference_run(d), seed=1)


@pytest.mark.parametrize("changes, expected", [
    ({"axes__num_heads": {"type": "var"}},
     ["axis 'num_heads' is var; the spec pins it to const 32", "apply()'s lookup key",
      "not a check at call time"]),
    ({"axes__seq_q": {"type": "const", "value": 128}},
     ["axis 'seq_q' is const (128); the spec makes it var", "left out of apply()'s lookup key"]),
    ({"axes__head_dim": {"type": "const", "value": 64}}, ["axis 'head_dim' is const 64; the spec pins it to 128"]),
    ({"inputs__k__shape": ["batch", "seq_kv", "num_heads", "head_dim"]},
     ["input 'k' has shape ['batch', 'seq_kv', 'num_heads', 'head_dim']", "num_kv_heads = 8 heads", "GQA"]),
    ({"inputs__q__dtype": "bfloat16"},
     ["'q' has dtype bfloat16; the spec wants float16", "does not look at dtypes"]),
    ({"inputs__causal": {"shape": ["batch"], "dtype": "bool"}},
     ["input 'causal' has shape ['batch'] (a tensor); the spec makes it a scalar", "Python bool"]),
    ({"name": "my_attention"}, ["name is 'my_attention'", "falls back"]),
    ({"op_type": "attention"}, ["op_type is 'attention'; the spec wants 'gqa_ragged'"]),
], ids=["num_heads_var", "seq_q_const", "head_dim_64", "k_num_heads", "q_bfloat16", "causal_tensor", "name",
        "op_type"])
def test_each_planted_definition_bug_fails_with_its_reason(changes, expected):
    d = definition(**changes)
    with pytest.raises(ic.InterchangeCheckError) as e:
        ic.check_definition(d)
    for text in expected:
        assert text in str(e.value), str(e.value)
    assert str(e.value).count("\n  - ") == 1, "one planted bug, one problem reported"


def test_definition_input_order_and_reference_signature_are_checked():
    d = definition()
    d["inputs"] = {name: d["inputs"][name] for name in ("q", "k", "causal", "v")}
    d["reference"] = "def run(q, k, v):\n    return q\n"
    with pytest.raises(ic.InterchangeCheckError) as e:
        ic.check_definition(d)
    assert "the order is the calling convention" in str(e.value)
    assert "run takes ['q', 'k', 'v']" in str(e.value)


def test_a_definition_that_does_not_load_is_reported():
    d = definition(reference="def forward(q, k, v, causal):\n    return q\n")
    with pytest.raises(ic.InterchangeCheckError, match="does not load as a flashinfer_bench Definition"):
        ic.check_definition(d)


@pytest.mark.parametrize("old, new, expected", [
    (None, REFERENCE_SDPA_IS_CAUSAL, ["asymmetric", "top-left causal", "is_causal=True",
                                      "j <= i + seq_kv - seq_q"]),
    ("repeat_interleave(H // Hkv, dim=1)", "repeat(1, H // Hkv, 1, 1)",
     ["wrong on small", "h % Hkv", "repeat_interleave(4, dim=2)"]),
    (".float().repeat_interleave(H // Hkv, dim=1)", ".float()",
     ["raised on small", "RuntimeError", "repeat_interleave(4, dim=2)"]),
    ("o.transpose(1, 2).to(q.dtype)", "o.to(q.dtype)", ["that is the course layout", "return o.transpose(1, 2)"]),
    ("/ math.sqrt(D)", "", ["softmax scale is missing"]),
], ids=["top_left_is_causal", "repeat_not_interleave", "no_gqa", "course_layout", "no_scale"])
def test_each_planted_reference_bug_fails_with_its_cause(old, new, expected):
    source = new if old is None else REFERENCE.replace(old, new)
    assert source != REFERENCE
    run = ic.definition_reference_run(definition(source))
    ic.check_definition(definition(source))          # the structure is right: only the reference is wrong
    with pytest.raises(ic.InterchangeCheckError) as e:
        ic.check_definition_reference(run)
    for text in expected:
        assert text in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- layouts, workloads
def test_layout_adapters_are_views_and_definition_run_passes():
    w = ic.workloads("cpu")[1]
    q, k, v, causal = ic.make_workload_inputs(w, seed=2)
    qc, kc, vc = ic.to_course(q, k, v)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip((q, k, v), (qc, kc, vc)))
    assert qc.shape == (1, 32, 64, 128) and kc.shape == (1, 8, 256, 128)
    o = kernel(qc, kc, vc, causal)[0]
    out = ic.from_course(o)
    assert out.data_ptr() == o.data_ptr() and out.shape == q.shape
    run = ic.definition_run(kernel)
    assert torch.equal(run(q, k, v, causal), out)
    assert run(q, k, v, causal).data_ptr() != o.data_ptr()     # a fresh call, same values
    ic.check_definition_reference(ic.definition_run(reference_attention))   # float64 o comes back as fp16


def test_workloads_are_the_seeds_with_var_axes_only_and_stable_uuids():
    gpu = ic.workloads("gpu")
    assert [ic.workload_shape(w) for w in gpu] == list(ic.WORKLOADS.values())
    assert ic.WORKLOADS["long"] == (2, 8192, 8192, False) and ic.WORKLOADS["asymmetric"] == (4, 128, 2048, True)
    d = fib.Definition(**definition())
    for profile in ("gpu", "cpu"):
        ws = ic.workloads(profile)
        assert [w.uuid for w in ws] == [w.uuid for w in ic.workloads(profile)]
        assert len({w.uuid for w in ws}) == len(ws)
        for w in ws:
            assert set(w.axes) == set(d.var_axes)          # a const axis in axes would never match a call
            assert w.inputs["causal"].type == "scalar"
    assert not {w.uuid for w in gpu} & {w.uuid for w in ic.workloads("cpu")}
    cpu = [ic.workload_shape(w) for w in ic.workloads("cpu")]
    assert any(c and sq < skv for _, sq, skv, c in cpu) and any(c and sq > skv for _, sq, skv, c in cpu)
    assert any(sq == 1 for _, sq, _, _ in cpu) and (1, 200, 333, True) in cpu
    assert len({s[:3] for s in cpu}) == len(cpu), "CPU shapes must be distinct apply() keys"
    with pytest.raises(ValueError):
        ic.workloads("tpu")


def test_workload_inputs_are_the_course_inputs_transposed():
    from facourse.configs import make_inputs

    w = ic.workloads("cpu")[3]
    q, k, v, causal = ic.make_workload_inputs(w, seed=5)
    assert causal is True and q.dtype == torch.float16 and q.is_contiguous()
    assert q.shape == (1, 200, 32, 128) and k.shape == (1, 333, 8, 128)
    qc, kc, vc = make_inputs(ic.workload_config(w), 5, "cpu", torch.float16, layout="bshd")
    assert all(torch.equal(a, b) for a, b in zip(ic.to_course(q, k, v), (qc, kc, vc)))


# ----------------------------------------------------------------------------- traces
def _runs():
    good = ic.definition_run(kernel)

    def scaled(q, k, v, causal):
        return good(q, k, v, causal) * 1.05

    def raises(q, k, v, causal):
        raise RuntimeError("launch failed: too many resources requested")

    def course_layout(q, k, v, causal):
        return kernel(*ic.to_course(q, k, v), causal)[0]

    def fp32(q, k, v, causal):
        return good(q, k, v, causal).float()

    def in_place(q, k, v, causal):
        out = good(q, k, v, causal)
        q.mul_(0.5)
        return out

    return {"good": (good, "PASSED"), "scaled": (scaled, "INCORRECT_NUMERICAL"),
            "raises": (raises, "RUNTIME_ERROR"), "course_layout": (course_layout, "INCORRECT_SHAPE"),
            "fp32": (fp32, "INCORRECT_DTYPE"), "in_place": (in_place, "INCORRECT_NUMERICAL"),
            "unbuilt": (ImportError("No module named 'tvm_ffi'"), "COMPILE_ERROR")}


def test_trace_records_the_courses_verdict_and_survives_apply_filter_when_passed(tmp_path):
    d = fib.Definition(**definition())
    ws = ic.workloads("cpu")[:2]
    traces = {}
    for name, (run, status) in _runs().items():
        for w in ws:
            t = ic.trace(d, name, run, w, seed=3)
            assert t.evaluation.status.value == status, (name, t.evaluation.log)
            traces.setdefault(name, []).append(t)
    good = traces["good"][0].evaluation
    assert good.correctness.max_absolute_error <= good.correctness.extra["allowed_abs_err"]
    assert good.performance.speedup_factor == 0.0 and "not timed" in good.log
    assert good.environment.libs["flashinfer_bench"] == importlib.metadata.version("flashinfer-bench")
    assert good.environment.hardware.startswith("CPU")
    scaled = traces["scaled"][0].evaluation
    assert "wrong values" in scaled.log and "relative" in scaled.log and scaled.performance is None
    assert scaled.correctness.max_relative_error > 0.01
    assert "too many resources" in traces["raises"][0].evaluation.log
    assert "[batch, seq_q, num_heads, head_dim]" in traces["course_layout"][0].evaluation.log
    assert "q was modified by the call" in traces["in_place"][0].evaluation.log
    assert "the build failed" in traces["unbuilt"][0].evaluation.log and "tvm_ffi" in traces["unbuilt"][0].evaluation.log

    solutions = [ic.routing_solution(name, 600.0 + i) for i, name in enumerate(traces)]
    flat = [t for ts in traces.values() for t in ts]
    root = ic.save_trace_set(tmp_path / "set", d, solutions, ws, flat)
    loaded = fib.TraceSet.from_path(str(root))
    cfg = ic.apply_config()
    kept = loaded.filter_traces(ic.DEFINITION_NAME, cfg.max_atol, cfg.max_rtol)
    assert sorted(t.solution for t in kept) == ["good", "good"]
    assert len(loaded.traces[ic.DEFINITION_NAME]) == len(flat)
    assert [t.workload for t in loaded.workloads[ic.DEFINITION_NAME]] == ws
    assert loaded.definitions[ic.DEFINITION_NAME] == d


def test_apply_config_is_the_courses_rule_and_falls_back_on_a_miss():
    cfg = ic.apply_config()
    assert cfg.on_miss_policy == "fallback_only"
    from facourse.check import REL_LIMIT
    assert cfg.max_rtol == REL_LIMIT and cfg.max_atol >= REL_LIMIT * 10


def test_apply_prefers_a_timed_passed_trace_to_an_untimed_one(tmp_path):
    d = fib.Definition(**definition())
    w = ic.workloads("cpu")[0]
    untimed = ic.trace(d, "kernel_x", ic.definition_run(kernel), w)
    timed = untimed.model_copy(update={"solution": "kernel_y", "evaluation": untimed.evaluation.model_copy(
        update={"performance": fib.Performance(latency_ms=2.0, reference_latency_ms=1.0, speedup_factor=0.5)})})
    solutions = [ic.routing_solution(n, 700.0 + i) for i, n in enumerate(("kernel_x", "kernel_y"))]
    for order in ([untimed, timed], [timed, untimed]):
        root = ic.save_trace_set(tmp_path / f"set{order[0].solution}", d, solutions, [w], order)
        table = ApplyTable.load_or_build(fib.TraceSet.from_path(str(root)),
                                         ApplyConfigRegistry(default=ic.apply_config()))
        assert list(table.index[ic.DEFINITION_NAME].values()) == ["kernel_y"]


def test_save_trace_set_refuses_stale_folders_and_dangling_traces(tmp_path):
    d = fib.Definition(**definition())
    w = ic.workloads("cpu")[0]
    t = ic.trace(d, "ghost", ic.definition_run(kernel), w)
    with pytest.raises(ValueError, match="not in the set"):
        ic.save_trace_set(tmp_path / "a", d, [], [w], [t])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "old.json").write_text("{}")
    with pytest.raises(ValueError, match="not empty"):
        ic.save_trace_set(tmp_path / "b", d, [], [w], [])


# ----------------------------------------------------------------------------- routing
SEED = 11


@pytest.fixture
def routing_root(tmp_path):
    return str(ic.routing_trace_set(tmp_path / "routing", seed=SEED))


def fallback():
    return ic.definition_run(kernel)


def deployment(fallback_fn):
    """A student's deployment: apply() with a fallback (None: no fallback)."""
    def attn(q, k, v, causal):
        if fallback_fn is None:
            return fib.apply(ic.DEFINITION_NAME, args=(q, k, v, causal))
        return fib.apply(ic.DEFINITION_NAME, args=(q, k, v, causal), fallback=fallback_fn)
    return attn


def test_a_correct_apply_deployment_passes_the_routing_check(routing_root, fib_cache):
    with fib.enable_apply(routing_root, ic.apply_config()):
        ic.check_routing(deployment(fallback()), seed=SEED)
    assert list((fib_cache / "apply_table").glob("*.json")), "the apply table is cached under FIB_CACHE_PATH"
    assert list((fib_cache / "python").iterdir()), "the python builder built the synthetic solutions there"


def test_a_deployment_check_leaves_no_folder_behind():
    roots = []

    def deploy(root):
        roots.append(Path(root))
        fib.enable_apply(str(root), ic.apply_config())
        return deployment(fallback())

    try:
        ic.check_deployment(deploy, seed=SEED, workloads=("C",))
    finally:
        fib.disable_apply()
    gc.collect()
    assert len(roots) == 1 and roots[0].name.startswith("facourse_routing_")
    assert not roots[0].exists(), "the check's trace set stays in the temp folder after the check"


def test_the_python_builder_builds_the_synthetic_solutions_and_their_tags_show(routing_root):
    ts = fib.TraceSet.from_path(routing_root)
    d = ts.definitions[ic.DEFINITION_NAME]
    tags = ic.routing_tags(SEED)
    wA = ic.routing_workloads()["A"]
    q, k, v, causal = ic.make_workload_inputs(wA, seed=0)
    for name in ic.ROUTING_SOLUTIONS:
        out = BuilderRegistry.get_instance().build(d, ts.get_solution(name)).call_value_returning(q, k, v, causal)
        assert float(out[ic.TAG_INDEX]) == tags[name] and out.dtype == torch.float16
        assert ic.served_by(out, tags) == name
        o = ic.from_course(out).clone()                  # the tag's element back to what the solution computes
        align = "top_left" if name == "fast_wrong" else "bottom_right"
        o[0, 0, -1, 0] = reference_attention(*ic.to_course(q, k, v), causal, align=align)[0][0, 0, -1, 0]
        if name == "fast_wrong":      # top-left causal: wrong on A (seq_q < seq_kv), which its trace says
            with pytest.raises(AssertionError, match="top-left"):
                check_attention(o, *ic.to_course(q, k, v), causal)
        else:
            check_attention(o, *ic.to_course(q, k, v), causal)
    assert len(set(tags.values())) == len(tags) and all(512 <= t < 2048 for t in tags.values())


def naive_router(root, fallback_fn):
    """A hand-made router that takes the fastest trace of the call's shape, whatever its status."""
    ts = fib.TraceSet.from_path(root)
    d = ts.definitions[ic.DEFINITION_NAME]

    def speed(t):
        ev = t.evaluation
        return ev.performance.speedup_factor if ev.performance else ev.correctness.extra["speedup_factor"]

    def attn(q, k, v, causal):
        axes = d.get_axes_values_from_inputs((q, k, v, causal))
        here = [t for t in ts.traces[ic.DEFINITION_NAME] if t.workload.axes == axes]
        if not here:
            return fallback_fn(q, k, v, causal)
        best = max(here, key=speed)                     # the bug: the status is never looked at
        return BuilderRegistry.get_instance().build(d, ts.get_solution(best.solution))(q, k, v, causal)

    return attn


def test_routing_to_the_fastest_trace_regardless_of_status_fails(routing_root):
    with pytest.raises(ic.InterchangeCheckError) as e:
        ic.check_routing(naive_router(routing_root, fallback()), seed=SEED)
    assert "workload A (1, 64, 192) was served by `fast_wrong`, whose trace FAILED its check" in str(e.value)
    assert "route only to PASSED traces" in str(e.value)


def test_use_def_best_on_a_miss_fails(routing_root):
    with fib.enable_apply(routing_root, ic.apply_config(on_miss_policy="use_def_best")):
        with pytest.raises(ic.InterchangeCheckError) as e:
            ic.check_routing(deployment(fallback()), seed=SEED)
    assert "a shape with no trace at all, was served by `kernel_" in str(e.value)
    assert "use on_miss_policy='fallback_only'" in str(e.value)


def test_no_fallback_fails_on_the_unknown_shape(routing_root):
    with fib.enable_apply(routing_root, ic.apply_config()):
        with pytest.raises(ic.InterchangeCheckError) as e:
            ic.check_routing(deployment(None), seed=SEED)
    assert "workload C" in str(e.value) and "Apply miss" in str(e.value)
    assert "a shape with no trace must go to the fallback: pass fallback=" in str(e.value)


def test_a_wrong_fallback_fails(routing_root):
    def top_left(q, k, v, causal=False):
        return reference_attention(q, k, v, causal, dtype=torch.float32, align="top_left")[0].to(q.dtype)

    with fib.enable_apply(routing_root, ic.apply_config()):
        with pytest.raises(ic.InterchangeCheckError) as e:
            ic.check_routing(deployment(ic.definition_run(top_left)), seed=SEED)
    assert "workload C" in str(e.value) and "served by the fallback (as it should be), but" in str(e.value)
    assert "top-left causal" in str(e.value)


def test_flashinfer_benchs_default_tolerances_send_everything_to_the_fallback(routing_root):
    with fib.enable_apply(routing_root, fib.ApplyConfig()):        # max_rtol=1e-5
        with pytest.raises(ic.InterchangeCheckError) as e:
            ic.check_routing(deployment(fallback()), seed=SEED)
    assert "workload A (1, 64, 192) went to the fallback, though `kernel_x` PASSED" in str(e.value)


def test_a_slower_passed_solution_or_a_wrong_output_is_caught(routing_root):
    ts = fib.TraceSet.from_path(routing_root)
    d = ts.definitions[ic.DEFINITION_NAME]
    y = BuilderRegistry.get_instance().build(d, ts.get_solution("kernel_y"))
    with pytest.raises(ic.InterchangeCheckError, match="served by `kernel_y`, but `kernel_x` has the highest"):
        ic.check_routing(lambda q, k, v, causal: y(q, k, v, causal), seed=SEED)

    def off_by_a_bit(q, k, v, causal):               # right routing, then every row but the tagged one off
        with fib.enable_apply(routing_root, ic.apply_config()):
            out = deployment(fallback())(q, k, v, causal).clone()
        out[:, :-1] *= 1.05
        return out
    with pytest.raises(ic.InterchangeCheckError, match="served by `kernel_x` \\(as it should be\\), but"):
        ic.check_routing(off_by_a_bit, seed=SEED)


def test_two_routing_sets_never_share_an_apply_table(tmp_path):
    registry = ApplyConfigRegistry(default=ic.apply_config())
    roots = [str(ic.routing_trace_set(tmp_path / f"r{s}", seed=s)) for s in (1, 2)]
    digests = [ApplyTable._digest(fib.TraceSet.from_path(r), registry) for r in roots]
    assert digests[0] != digests[1]
    for seed, root in zip((1, 2), roots):          # one cache folder, both deployments route right
        with fib.enable_apply(root, ic.apply_config()):
            ic.check_routing(deployment(fallback()), seed=seed)
    with pytest.raises(ic.InterchangeCheckError):  # and a deployment is only right for its own seed
        with fib.enable_apply(roots[0], ic.apply_config()):
            ic.check_routing(deployment(fallback()), seed=2)
    assert json.loads(next((tmp_path / "r1" / "definitions").rglob("*.json")).read_text())["name"] == \
        ic.DEFINITION_NAME


def test_trace_verifies_inside_a_graders_collecting_block():
    """In the grading kernel the checks only collect (facourse.check.collecting); a student's tracing
    function runs there, and trace()'s status must still be the check's verdict, not PASSED by default."""
    from facourse.check import collecting

    d = fib.Definition(**definition())
    w = ic.workloads("cpu")[1]                       # asymmetric: top-left causal is wrong there
    runs = _runs()
    with collecting():
        assert ic.trace(d, "scaled", runs["scaled"][0], w).evaluation.status.value == "INCORRECT_NUMERICAL"
        assert ic.trace(d, "good", runs["good"][0], w).evaluation.status.value == "PASSED"


STUDENT_SCRIPT = r'''
import json, os, sys
from pathlib import Path
os.environ["TRITON_INTERPRET"] = "1"
import torch
from flashinfer_bench.compile import BuilderRegistry
from facourse import interchange as ic
root = Path(sys.argv[1])
found = ic.student_solutions(root)
out = {"kinds": {k: type(v).__name__ for k, v in found.items()}}
defn = ic.spec_definition()
for step in ("05", "06"):
    s = found[step]
    if isinstance(s, str):
        out[step] = s
        continue
    out[step + "_sources"] = [f.path for f in s.sources]
    out[step + "_hardware"] = s.spec.target_hardware
    if "cpu" in s.spec.target_hardware:
        run = BuilderRegistry.get_instance().build(defn, s)
        out[step + "_status"] = [ic.trace(defn, s, run, w).evaluation.status.value for w in ic.workloads("cpu")[:2]]
print("RESULT " + json.dumps(out))
'''


def _student_folders(tmp_path, kernel_subs=()):
    """The course's exercise 05 and 06 folders as a student's (their solution cells filled in), under
    tmp_path; ``kernel_subs`` change exercise 05's kernel cell."""
    import shutil

    from conftest import ROOT
    for name in ("05_triton_flash_attention", "06_cuda_flash_attention"):
        shutil.copytree(ROOT / "solutions" / name, tmp_path / name, ignore=shutil.ignore_patterns("ladder", "*.pct.py"))
    nb = tmp_path / "05_triton_flash_attention" / "05_triton_flash_attention.ipynb"
    text = nb.read_text()
    for old, new in kernel_subs:
        assert json.dumps(old)[1:-1] in text, old
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    nb.write_text(text)
    return tmp_path


def _run_student_script(root):
    import os
    import subprocess
    import sys

    from conftest import ROOT
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", STUDENT_SCRIPT, str(root)], capture_output=True, text=True, env=env,
                       timeout=600, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(next(ln[7:] for ln in r.stdout.splitlines() if ln.startswith("RESULT ")))


def test_the_students_own_kernels_register_as_solutions_and_trace_on_the_cpu(tmp_path):
    """Exercise 11 registers the student's exercise 05 (Triton) and 06 (CUDA) kernels from their
    notebooks: the Triton one builds and PASSES on CPU workloads in the interpreter; the CUDA one carries
    its .cu files and targets a GPU only; a kernel with top-left causal traces INCORRECT."""
    d = _run_student_script(_student_folders(tmp_path))
    assert d["kinds"] == {"05": "Solution", "06": "Solution"}
    assert d["05_sources"] == ["main.py"] and d["05_hardware"] == ["cpu", "cuda"]
    assert d["05_status"] == ["PASSED", "PASSED"], d
    assert d["06_sources"][0] == "main.py" and "student_kernel.cu" in d["06_sources"] and d["06_hardware"] == ["cuda"]
    bad = _run_student_script(_student_folders(tmp_path / "bad", [("    off = Skv - Sq", "    off = 0")]))
    assert bad["05_status"][1] == "INCORRECT_NUMERICAL", bad      # seq_q 64 < seq_kv 256, causal


def test_missing_exercise_folders_are_named_not_raised(tmp_path):
    found = ic.student_solutions(tmp_path)
    assert all(isinstance(v, str) and "No such file" in v for v in found.values()), found


def test_a_passed_trace_on_a_gpu_is_timed_by_the_course_bench(monkeypatch):
    """The GPU branch of trace() on a CPU: the device said to be CUDA, the bench stubbed, so that its
    import and its call run here as a GPU would run them."""
    import facourse.bench as bench
    from facourse.interchange import traces as tr

    calls = []

    class Timed:
        t_student_ms, t_ref_ms, ratio = 2.0, 1.0, 0.5

        def summary(self):
            return "timed: 0.50x"

    def fake_bench(fn, config, **kw):
        calls.append((config, kw["layout"]))
        return Timed()

    monkeypatch.setattr(bench, "bench_attention", fake_bench)
    real = tr._call_and_check
    monkeypatch.setattr(tr, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(tr, "_call_and_check",
                        lambda run, w, seed, device: real(run, w, seed, torch.device("cpu")))
    d = fib.Definition(**definition())
    t = ic.trace(d, "good", _runs()["good"][0], ic.workloads("cpu")[0])
    assert t.evaluation.status.value == "PASSED", t.evaluation.log
    assert t.evaluation.performance.speedup_factor == 0.5 and "timed: 0.50x" in t.evaluation.log
    assert len(calls) == 1 and calls[0][1] == "bshd"
