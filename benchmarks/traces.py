"""Step 11 on a GPU: the course's solution kernels as FlashInfer-Bench solutions of one definition,
traced over the seed's workloads, then deployed with apply() and its choices re-timed.

    python -m benchmarks.ladder 11 --traces [--quick] [--out DIR]

(the ladder runner's step-11 mode; on the GPU machine FlashInfer-Bench and TileLang come from the
carried archives: tools/carry_tilelang.py and its --fib). What it does:

1. The solutions: the solution rung of step 05 (Triton), 06 (CUDA, mma.sync), 07 (Hopper, sm_90a) and
   11 (TileLang), each a ``python`` Solution whose source imports the course's kernel
   (``benchmarks.rungs.entry_point``) and adapts it to the definition's layout
   (``facourse.interchange.definition_run``); the definition is the spec's
   (``facourse.interchange.spec_definition``). CUDA rungs are built first, in parallel.
2. Traces: every solution on every workload of ``facourse.interchange.WORKLOADS`` (the five and
   long; ``--quick``: large and long) with ``facourse.interchange.trace``: the course's check, then
   ``bench_attention`` against SDPA's FLASH_ATTENTION (FA2) on the same shape and seed. Written as a
   trace set under ``OUT/step11_traces/`` (``enable_apply`` reads it).
   Before the set is written, each workload's traces get one reference time (the median of theirs,
   ``one_reference``): apply() then ranks a shape's solutions by their own times.
3. Dispatch: ``enable_apply(set, apply_config())``; for each workload, the solution apply() routes
   the call to (read from its table, as dispatch does) and the output of the routed call checked;
   then every PASSED solution timed again, all in the same interleaved rounds
   (``facourse.bench.time_calls``: L2 flushed, 30 rounds, median): apply's choice is right when no
   solution is faster than it there by more than 3 % and more than 1 µs (the timer's resolution).
   Workloads whose var axes coincide (medium and noncausal: apply's key holds batch, seq_q and
   seq_kv only, not causal) share one choice, and the report says so.

Results: ``OUT/<date>_<gpu>_step11_traces.json`` (the ladder schema's env and timing, plus ``traces``
and ``dispatch`` rows), and a table printed last.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import statistics
import time
import traceback
from pathlib import Path

import torch

#: The solutions traced: name -> (step, language of the kernel inside).
SOLUTIONS = {"triton": ("05", "triton"), "cuda": ("06", "cuda"), "hopper": ("07", "cuda"), "tilelang": ("11", "tilelang")}

#: apply's choice is right when no PASSED solution re-times faster than it by more than 3 % and more
#: than 1 µs (CUDA events resolve about 0.5 µs: the small workload's kernels take 11-12 µs, and their
#: order there changes from one timing to the next).
TOLERANCE, RESOLUTION_MS = 0.03, 0.001

_SOURCE = '''"""The course's {name} kernel (solutions/{folder}/ladder/{file}, the step's solution rung), in
the definition's convention: q, k, v [batch, seq, heads, dim] float16, causal -> out."""
from benchmarks.rungs import entry_point
from facourse.interchange import definition_run

run = definition_run(entry_point("{step}", "{rung}"))
'''


def solution(name: str, gpu: str):
    """The course's solution kernel of ``name``'s step as a flashinfer_bench Solution (python)."""
    import flashinfer_bench as fib

    from facourse.interchange import DEFINITION_NAME
    from facourse.steps import load_step
    step, inner = SOLUTIONS[name]
    m = load_step(step)
    rung = m["ladder"]["solution"]
    r = next(x for x in m["rungs"] if x["name"] == rung)
    src = _SOURCE.format(name=name, folder=m["dir"].name, file=r["file"], step=step, rung=rung)
    return fib.Solution(name=name, definition=DEFINITION_NAME, author="facourse",
                        spec=fib.BuildSpec(language="python", target_hardware=[gpu], entry_point="main.py::run",
                                           destination_passing_style=False),
                        sources=[fib.SourceFile(path="main.py", content=src)],
                        description=f"step {step}'s {rung} ({inner}) through facourse.interchange.definition_run")


def _prebuild_cuda(arch: str) -> dict:
    """nvcc for the CUDA solution rungs (06, 07) at once, in spawned processes: {name: seconds or error}."""
    from benchmarks.rungs import prebuild
    from facourse.steps import load_step
    out = {}
    with cf.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futs = {n: pool.submit(prebuild, SOLUTIONS[n][0], load_step(SOLUTIONS[n][0])["ladder"]["solution"],
                               "sm_90a" if n == "hopper" else arch) for n in ("cuda", "hopper")}
        for n, f in futs.items():
            try:
                out[n] = f.result()
            except Exception:  # noqa: BLE001
                out[n] = "build failed:\n" + traceback.format_exc()[-2000:]
    return out


def _routed(table_key, runtime, definition):
    """The solution apply() sends a call with these var axes to (dispatch's own lookup), or None."""
    return runtime._table.match_solution(definition.name, table_key)


def run(out: Path, quick: bool = False) -> int:
    import flashinfer_bench as fib
    from flashinfer_bench.apply.key import ApplyKeyFactory
    from flashinfer_bench.apply.runtime import ApplyRuntime
    from flashinfer_bench.compile import BuilderRegistry

    from benchmarks.rungs import env_info, gpu_tag
    from facourse import interchange as fx
    from facourse.bench import TIMING, new_flush_buffer, time_calls
    from facourse.check import check_attention

    if not torch.cuda.is_available():
        print("step 11's traces need a GPU (the CPU tier is tests/test_interchange.py)")
        return 2
    os.environ.setdefault("FIB_CACHE_PATH", str(out / "fib_cache"))
    env = env_info()
    gpu = env["gpu"]
    major, minor = torch.cuda.get_device_capability()
    t0 = time.time()
    builds = _prebuild_cuda(f"sm_{major}{minor}")
    print(f"CUDA builds: {builds} ({time.time() - t0:.0f} s)", flush=True)
    d = {"schema": "facourse-traces-1", "step": "11", "env": env, "timing": TIMING, "reference": "FLASH_ATTENTION",
         "builds": builds, "traces": [], "dispatch": []}
    path = out / f"{env['date']}_{gpu_tag(gpu)}_step11_traces.json"
    save = lambda: path.write_text(json.dumps(d, indent=1))  # noqa: E731

    definition = fx.spec_definition()
    ws = [w for w in fx.workloads("gpu") if not quick or fx.workload_names()[w.uuid] in ("large", "long")]
    registry = BuilderRegistry.get_instance()
    sols, runs, traces = [], {}, []
    for name in SOLUTIONS:
        s = solution(name, gpu)
        sols.append(s)
        try:
            runs[name] = registry.build(definition, s)
        except Exception as err:  # noqa: BLE001
            runs[name] = err
    for w in ws:
        wname = fx.workload_names()[w.uuid]
        for s in sols:
            t = fx.trace(definition, s, runs[s.name], w, seed=11)
            traces.append(t)
            ev = t.evaluation
            row = {"workload": wname, "solution": s.name, "status": ev.status.value,
                   "log": ev.log[-1500:] if ev.status.value != "PASSED" else ev.log.splitlines()[-1]}
            if ev.performance is not None:
                row.update(ms=ev.performance.latency_ms, ref_ms=ev.performance.reference_latency_ms,
                           speedup=ev.performance.speedup_factor)
            d["traces"].append(row)
            print(f"{wname:11s} {s.name:9s} {row['status']:20s} {row.get('speedup', float('nan')):.2f}x", flush=True)
            save()
    traces = one_reference(traces)
    for r in d["traces"]:                     # the speedups apply() ranks by, after one_reference
        t = next(t for t in traces
                 if t.solution == r["solution"] and fx.workload_names()[t.workload.uuid] == r["workload"])
        if t.evaluation.performance is not None:
            r["speedup_ranked"] = t.evaluation.performance.speedup_factor
    root = fx.save_trace_set(out / "step11_traces", definition, sols, ws, traces)

    # dispatch: apply()'s choice per workload, its output checked, then re-timed against every PASSED solution
    fib.enable_apply(str(root), fx.apply_config())
    runtime = ApplyRuntime.get_instance()
    keyer = ApplyKeyFactory.specialize(definition)
    for w in ws:
        wname = fx.workload_names()[w.uuid]
        q, k, v, causal = fx.make_workload_inputs(w, seed=12, device="cuda")
        chosen = _routed(keyer.build_from_args((q, k, v, causal)), runtime, definition)
        row = {"workload": wname, "chosen": chosen}
        try:
            o = fib.apply(fx.DEFINITION_NAME, args=(q, k, v, causal), fallback=None)
            check_attention(fx.from_course(o), *fx.to_course(q, k, v), causal, config=wname, seed=12)
            row["output"] = "passed"
        except Exception as err:  # noqa: BLE001
            row["output"] = f"{type(err).__name__}: {str(err)[:500]}"
        passed = [t.solution for t in traces if t.workload.uuid == w.uuid and t.evaluation.status.value == "PASSED"]
        gpu_ms, _ = time_calls({n: (lambda n=n: runs[n](q, k, v, causal)) for n in passed}, rounds=30,
                               flush=new_flush_buffer())
        retimed = {n: statistics.median(ms) for n, ms in gpu_ms.items()}
        row["retimed_ms"] = retimed
        if chosen in retimed:
            best = min(retimed, key=retimed.get)
            row["fastest"] = best
            gap = retimed[chosen] - retimed[best]
            row["right"] = gap <= max(TOLERANCE * retimed[best], RESOLUTION_MS)
        else:
            row["right"] = False
        d["dispatch"].append(row)
        save()
    print(table(d))
    print(f"wrote {path}")
    return 0 if all(r["right"] and r["output"] == "passed" for r in d["dispatch"]) else 1


def one_reference(traces: list) -> list:
    """The traces with one reference time per workload: the median of the reference times their
    timings measured, and speedup_factor = that / the solution's time. apply() ranks a shape's
    solutions by speedup_factor; measured each against its own timing of the reference, the ranking
    also carries the reference's run-to-run spread (here up to 5 % on one shape), more than the gap
    between two close solutions."""
    import flashinfer_bench as fib
    by_w: dict = {}
    for t in traces:
        if t.evaluation.performance is not None:
            by_w.setdefault(t.workload.uuid, []).append(t.evaluation.performance.reference_latency_ms)
    out = []
    for t in traces:
        p = t.evaluation.performance
        if p is not None and p.latency_ms > 0:
            ref = statistics.median(by_w[t.workload.uuid])
            perf = fib.Performance(latency_ms=p.latency_ms, reference_latency_ms=ref, speedup_factor=ref / p.latency_ms)
            t = t.model_copy(update={"evaluation": t.evaluation.model_copy(update={"performance": perf})})
        out.append(t)
    return out


def table(d: dict) -> str:
    """The traces and apply()'s choices, as benchmarks/README.md shows them (facourse.results)."""
    from facourse.results import traces_header, traces_table
    return traces_header(d) + "\n" + traces_table(d)
