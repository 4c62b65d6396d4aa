"""GPU-tier self-test of grading through the judge: `python -m autograder.gpu_selftest` on the GPU box.

Hidden tests run exactly as ``autograde`` runs them — the kernel-side client, the wire, the plan,
the judge's replay and verdicts — with kernel and judge in one process (``judge.run_inprocess``:
the GPU machines have no Jupyter; ``autograde`` puts nbgrader around the same path):

1. step 05's perf tests on the exercise's solution (its notebook cells); its perf test with stand-ins
   for a submission: the ladder's tuned solution (honest: points), a function that caches its output
   by input address and one that launches its work on a side stream (both timed faster than the GPU
   can run: flagged, 0), and honest numbers whose reference time was multiplied by 3 on their way to
   the judge (the judge's own calibration disagrees: flagged, 0);
2. step 06: the exercise's solution (its harness + ladder/student_kernel_solution.cu) on every
   test of the plan: every correctness point, and the perf points its speed earns;
3. step 07 (H100/H200 only): the same, with the structural check compiled by the judge from the
   submitted source; the untouched stub must fail that check;
4. step 08: the exercise's solution (ladder/v2_two_kernel.py loads its cells) on every test of the
   plan; a backward that calls a PyTorch matrix product (the guard must see it on the autograd
   engine's GPU thread: 0) and a forward that keeps P for the backward (0, "kept");
5. step 09: the exercise's solution (ladder/v3_gqa_packed.py loads its cells) on every test of the
   plan, the tuned solution (the ladder's) on the perf tests, and a decode that caches its output
   between calls (timed faster than HBM can deliver K and V: flagged, 0).

6. step 10: the exercise's solution (ladder/v3_block_mask.py loads its cells) on every test of the
   plan, the tuned solution on the perf tests, and a kernel that ignores the block mask it is given
   (it loses the tile-lists test).
7. step 11 (H100/H200 only; needs tilelang and flashinfer-bench: tools/carry_tilelang.py): the
   exercise's definition, tracing and routing (its notebook cells) on their tests, and its TileLang
   program on the TileLang tests of the plan, on the CPU stand-in and compiled by TileLang on the GPU,
   perf included; the same program with top-left causal loses the GPU correctness test, whose message
   names it.
8. steps 13, 14 and 15: each exercise's solution (its notebook cells) on every test of the plan, each test
   given the entry point its hidden cell passes; step 14's exp2 through ``torch.exp2`` and step 15's
   varlen with a softmax over one sequence's keys beside its Triton launch each score 0 (the guards on
   CUDA tensors: a GPU is the only place they see those).

`python -m autograder.gpu_selftest 08` runs part 4 only (any of 05-15 but 12 may be named).

Every exercise solution must score full marks, perf included, and each perf ratio must hold its step's
target with a margin (``MARGIN``: target <= 0.85 x ratio), a verdict of its own ("margin perf_...").

Prints a table, writes ``$OUT/gpu_selftest.json`` (OUT defaults to ./out) and exits 1 when any
verdict is not the expected one.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parts = set(sys.argv[1:] if argv is None else argv) or {"05", "06", "07", "08", "09", "10", "11", "13", "14",
                                                             "15"}
    if not torch.cuda.is_available():
        print("No GPU here: this self-test runs on the GPU grading machine.")
        return 0
    sys.path.insert(0, str(ROOT))
    import facourse

    from . import judge as J

    rows: list[dict] = []

    def expect(label, verdicts, want):
        for test, v in verdicts.items():
            ok = want(test, v)
            rows.append({"case": label, "test": test, "points": v.points, "max": v.max_points,
                         "as_expected": bool(ok), "message": v.message[:400],
                         "perf": {k: v.perf.get(k) for k in ("tflops_student", "tflops_ref", "gbps_student", "gbps_ref", "ratio",
                                                             "calibration_ms", "status")} if v.perf else None})
            text = (v.message or (v.output[-1] if v.output else "")).splitlines()[0][:110] if (v.message or v.output) else ""
            print(line(ok, label, test, f"{v.points:g}/{v.max_points:g}  {text}"), flush=True)

    from benchmarks.rungs import entry_point
    from facourse.steps import load_step

    if "05" in parts:
        _step05(expect, J, facourse)
    if "08" in parts:
        _step08(expect, J)
    if "09" in parts:
        _step09(expect, J)
    if "10" in parts:
        _step10(expect, J)
    if "11" in parts:
        _step11(expect, J)
    if parts & {"06", "07"}:
        _steps06_07(expect, J, parts)
    if parts & {"13", "14", "15"}:
        _steps13_15(expect, J, parts)
    rows += _margins(rows)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    env = __import__("autograder.perf", fromlist=["environment"]).environment()
    (out / "gpu_selftest.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    bad = [r for r in rows if not r["as_expected"]]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} verdicts as expected on {env.get('gpu')}")
    return 1 if bad else 0


def line(ok: bool, case: str, test: str, text: str) -> str:
    """One row of the printed table (tests/test_thresholds.py reads committed ones back)."""
    return f"{'ok   ' if ok else 'WRONG'} {case:<28} {test:<22} {text}"


def _full_marks(t, v):
    return v.points == v.max_points


#: A perf target is at most this fraction of what the exercise's own solution measures (docs/DESIGN.md)
MARGIN = 0.85


def _margins(rows: list[dict]) -> list[dict]:
    """One verdict per exercise-solution perf row: its ratio holds its step's target with the margin."""
    import re

    from facourse.steps import load_step

    from .perf import thresholds
    out = []
    for r in rows:
        m = re.fullmatch(r"step (\d\d) (?:TileLang )?solution", r["case"])
        ratio = (r.get("perf") or {}).get("ratio")
        if not (m and r["test"].startswith("perf_") and ratio):
            continue
        target = thresholds(load_step(m.group(1))["step"]["notebook"].removesuffix(".ipynb"))["target"]
        ok = target <= MARGIN * ratio
        out.append({"case": r["case"], "test": "margin " + r["test"], "points": float(ok), "max": 1.0,
                    "as_expected": ok, "perf": None,
                    "message": f"{ratio:.2f}x; target {target:g} {'<=' if ok else '>'} {MARGIN} x {ratio:.2f} = "
                               f"{MARGIN * ratio:.2f}"})
        print(line(ok, r["case"], out[-1]["test"], out[-1]["message"]), flush=True)
    return out


def _step05(expect, J, facourse):
    """Step 05's perf test and its anti-cheat; the stand-ins wrap the ladder's solution."""
    from benchmarks.rungs import entry_point
    from facourse.steps import exercise_module, load_step

    step05 = "05_triton_flash_attention"
    fn = entry_point("05", load_step("05")["ladder"]["solution"])

    def honest(q, k, v, causal=False, scale=None):
        return fn(q, k, v, causal, scale)

    cache = {}

    def cached(q, k, v, causal=False, scale=None):
        if q.data_ptr() not in cache:
            cache[q.data_ptr()] = fn(q, k, v, causal, scale)
        return cache[q.data_ptr()]

    side = torch.cuda.Stream()

    def side_stream(q, k, v, causal=False, scale=None):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return fn(q, k, v, causal, scale)

    expect("honest (step 05 ladder)", J.run_inprocess(step05, honest, ["perf_large"]), lambda t, v: v.points > 0)
    exercise = exercise_module("05", ("setup", "kernel", "wrapper")).flash_attention_triton
    expect("step 05 solution", J.run_inprocess(step05, exercise, [t for t in J.plan_of(step05) if t.startswith("perf_")]),
           _full_marks)
    expect("address-keyed cache", J.run_inprocess(step05, cached, ["perf_large"]),
           lambda t, v: v.points == 0 and "Not trusted" in v.message)
    expect("side-stream launch", J.run_inprocess(step05, side_stream, ["perf_large"]),
           lambda t, v: v.points == 0 and "Not trusted" in v.message)
    J.calibration("cuda:0", "large", "FLASH_ATTENTION")          # the judge's own number, before the forgery
    real = facourse.bench_attention

    def forged(*args, **kwargs):
        r = real(*args, **kwargs)
        r.t_ref_ms *= 3
        r.ratio *= 3
        return r

    facourse.bench_attention = forged
    try:
        expect("forged reference time", J.run_inprocess(step05, honest, ["perf_large"]),
               lambda t, v: v.points == 0 and "apart" in v.message)
    finally:
        facourse.bench_attention = real



def _steps06_07(expect, J, parts):
    """The exercise solutions of steps 06 and 07, every test of their plans."""
    from benchmarks.rungs import entry_point
    from facourse import has_sm90a

    full_marks = _full_marks
    if "06" in parts:
        expect("step 06 solution", J.run_inprocess("06_cuda_flash_attention", entry_point("06", "exercise")),
               full_marks)
    if "07" not in parts:
        return
    if has_sm90a():
        step07 = ROOT / "solutions" / "07_hopper_flash_attention"
        files = {"student_kernel.cu": (step07 / "ladder" / "student_kernel_solution.cu").read_bytes()}
        expect("step 07 solution", J.run_inprocess("07_hopper_flash_attention", _hopper_solution(step07),
                                                   student_files=files, release_dir=step07), full_marks)
        stub = {"student_kernel.cu": (step07 / "student_kernel.cu").read_bytes()}
        expect("step 07 stub", J.run_inprocess("07_hopper_flash_attention", None, ["test_structure"],
                                               student_files=stub, release_dir=step07),
               lambda t, v: v.points == 0 and "HGMMA" in v.message)
    else:
        print(f"step 07 skipped: it needs an H100/H200 (sm_90a), this is {torch.cuda.get_device_name()}")


def _step08(expect, J):
    """The exercise's solution on every test; a matmul in the backward and a kept P each score 0."""
    from benchmarks.rungs import entry_point

    step08 = "08_backward"
    sol = entry_point("08", "v2_two_kernel")
    expect("step 08 solution", J.run_inprocess(step08, sol), _full_marks)
    Fn = sol.__globals__["FlashAttentionTrain"]

    class MatmulInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            return Fn.forward(ctx, q, k, v, causal, scale)

        @staticmethod
        def backward(ctx, do):
            grads = Fn.backward(ctx, do)
            torch.matmul(do[:1, :1], do[:1, :1].transpose(-1, -2))     # one PyTorch product, on the GPU
            return grads

    class KeepsP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o = Fn.forward(ctx, q, k, v, causal, scale)
            ctx.p = torch.empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=q.device)  # an S-sized tile
            return o

        @staticmethod
        def backward(ctx, do):
            return Fn.backward(ctx, do)

    for label, F, says in (("step 08 matmul in backward", MatmulInBackward, "matrix product"),
                           ("step 08 keeps P", KeepsP, "kept")):
        def train(q, k, v, causal=False, scale=None, F=F):
            return F.apply(q, k, v, bool(causal), scale)
        expect(label, J.run_inprocess(step08, train, ["test_medium"]),
               lambda t, v, says=says: v.points == 0 and says in v.message)


def _step09(expect, J):
    """The exercise's solution on every test; the tuned rung on the perf tests; a cached output flagged."""
    from benchmarks.rungs import entry_point
    from facourse.steps import load_step

    step09 = "09_decode_paged_kv"
    expect("step 09 solution", J.run_inprocess(step09, entry_point("09", "v3_gqa_packed")), _full_marks)
    perf = [t for t in J.plan_of(step09) if t.startswith("perf_")]
    expect("step 09 tuned", J.run_inprocess(step09, entry_point("09", load_step("09")["ladder"]["solution"]), perf),
           _full_marks)
    sol = entry_point("09", "v3_gqa_packed")
    cache = {}

    def cached(q, k_cache, v_cache, block_table, seq_lens, scale=None):
        key = (q.data_ptr(), k_cache.data_ptr(), block_table.data_ptr())
        if key not in cache:
            cache[key] = sol(q, k_cache, v_cache, block_table, seq_lens, scale)
        return cache[key]

    expect("step 09 cached output", J.run_inprocess(step09, cached, perf[:1]),
           lambda t, v: v.points == 0 and "faster than" in v.message)


def _step10(expect, J):
    """The exercise's solution on every test (the block-mask builder and the kernel, each where its
    hidden cell passes it); the tuned rung on the perf tests; a kernel that ignores a given block mask
    (it builds its own) loses the tile-lists test."""
    from benchmarks.rungs import load_py
    from facourse.steps import load_step

    step10 = "10_attention_variants"
    m = load_step("10")
    v3 = load_py(m["ladder_dir"] / "v3_block_mask.py")
    tests = [t for t in J.plan_of(step10) if t != "test_block_mask"]
    expect("step 10 solution", J.run_inprocess(step10, v3.flex_attention_triton, tests), _full_marks)
    expect("step 10 builder", J.run_inprocess(step10, v3.build_block_mask, ["test_block_mask"]), _full_marks)
    tuned = load_py(m["ladder_dir"] / f"{m['ladder']['solution']}.py").flex_attention_triton
    expect("step 10 tuned", J.run_inprocess(step10, tuned, [t for t in tests if t.startswith("perf_")]), _full_marks)

    def own_lists(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
        return v3.flex_attention_triton(q, k, v, mask, score_mod, scale)

    expect("step 10 ignores block_mask", J.run_inprocess(step10, own_lists, ["test_tile_lists"]),
           lambda t, v: v.points == 0 and "not of the block mask" in v.message)


def _step11(expect, J):
    """Exercise 11's solution on every test of the plan: its FlashInfer-Bench parts (on a GPU their traces
    are timed, a path no CPU test takes) and its TileLang program, whose kernels are compiled first, in
    parallel (TileLang builds each with nvcc)."""
    import concurrent.futures as cf
    import inspect
    import linecache

    from facourse import has_sm90a
    from facourse.steps import exercise_module
    from facourse.tilelang_kernels import TILES, compile_program

    if not has_sm90a():
        print(f"step 11 skipped: it needs an H100/H200 (sm_90a), this is {torch.cuda.get_device_name()}")
        return
    step11 = "11_interchangeable_kernels"
    parts = exercise_module("11", ("setup", "definition", "trace_solutions", "deploy"))
    for test, fn in (("test_definition", parts.make_definition), ("test_definition_reference", parts.make_definition),
                     ("test_traces", parts.trace_solutions), ("test_routing", parts.deploy),
                     ("test_fallback", parts.deploy)):
        expect("step 11 solution", J.run_inprocess(step11, fn, [test]), _full_marks)
    program = exercise_module("11", ("setup", "tilelang_program")).flash_attention_program
    builds = [(dt, D, c, TILES[D]) for dt in ("float16", "bfloat16") for D in (64, 128) for c in (True, False)]
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda b: compile_program(program, *b), builds))
    tests = [t for t in J.plan_of(step11) if t.startswith(("test_tilelang", "perf_"))]
    expect("step 11 TileLang solution", J.run_inprocess(step11, program, tests), _full_marks)
    src = inspect.getsource(program).replace("off = Skv - Sq ", "off = 0 ")
    name = "<step 11 top-left>"                 # TileLang reads the prim_func's source back: linecache has it
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    scope = dict(program.__globals__)
    exec(compile(src, name, "exec", dont_inherit=True), scope)  # noqa: S102
    expect("step 11 top-left causal", J.run_inprocess(step11, scope["flash_attention_program"], ["test_tilelang_gpu"]),
           lambda t, v: v.points == 0 and "top-left" in v.message)


#: Steps 13-15: the cells each exercise's solution module runs (given and solution cells, in order)
_CELLS = {"13": ("imports", "records", "occupancy", "roofline_point"),
          "14": ("imports", "exp2_coefficients", "exp2_fit", "exp2_poly", "lazy_rescale_update"),
          "15": ("setup", "kv_offsets", "kernel", "launch")}


def _steps13_15(expect, J, parts):
    """Each exercise's solution on every test, each test given the function its hidden cell passes; one cheat a
    guard refuses in steps 14 and 15."""
    from facourse.steps import exercise_module, hidden_entries, load_step

    for step in sorted(parts & set(_CELLS)):
        sol = exercise_module(step, _CELLS[step])
        assignment = load_step(step)["step"]["notebook"].removesuffix(".ipynb")
        by_entry: dict[str, list] = {}
        for test, fn in hidden_entries(step).items():
            by_entry.setdefault(fn, []).append(test)
        for fn, tests in by_entry.items():
            expect(f"step {step} solution", J.run_inprocess(assignment, getattr(sol, fn), tests), _full_marks)
        if step == "14":
            expect("step 14 torch.exp2", J.run_inprocess(assignment, torch.exp2, ["test_exp2_softmax"]),
                   lambda t, v: v.points == 0 and "exponential" in v.message)
        if step == "15":
            def row_softmax(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kw):
                out = sol.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kw)   # the Triton launch
                keys = int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max())
                torch.softmax(torch.zeros(q.shape[1], keys, device=q.device), dim=-1)      # one sequence's whole row
                return out
            expect("step 15 softmax of a row", J.run_inprocess(assignment, row_softmax, ["test_packed"]),
                   lambda t, v: v.points == 0 and "softmax over all" in v.message)


def _hopper_solution(step: Path):
    """Step 07's exercise solution built as a student's is: the harness + their .cu, for sm_90a."""
    from facourse import validate_inputs
    from facourse.cuda_build import load_cuda_extension

    ext = load_cuda_extension("fa07_selftest", [step / "ladder" / "student_kernel_solution.cu",
                                                step / "fa_binding.cpp"], arch="sm_90a", include_dirs=[step])

    def flash_attention_hopper(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return tuple(ext.forward(q, k, v, bool(causal), float(scale)))

    return flash_attention_hopper


if __name__ == "__main__":
    sys.exit(main())
