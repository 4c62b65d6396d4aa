"""Write the measured tables of benchmarks/README.md, and course/results/measured.json, from the
committed results (no number is typed by hand).

    python benchmarks/tables.py            # rewrite the marked blocks of README.md and measured.json
    python benchmarks/tables.py --check    # exit 1 if either differs from what the results give

A block sits between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; NAME picks a function in
TABLES. Each step's results are the newest `results/*_stepNN*.json` in the one schema of
benchmarks/ladder.py ("schema": 1); the rendering is facourse.results', which the lectures use on
course/results/measured.json (what ships with the student archive: bench rows and check counts).
"""
from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from facourse import results as R  # noqa: E402
from facourse.profiling import compact_run, rung_table, summary_table  # noqa: E402

RESULTS = HERE / "results"
README = HERE / "README.md"
MEASURED = R.MEASURED
PROBE = "2026-11-22_h100_timing_probe.json"
# v5_variants.py (step 06) and tile_sweep.py (step 05) measure tile configurations, not the ladder:
# their own schema, one file each.
VARIANTS = ("2026-11-22_h100_step06_v5_variants.json", "2026-11-22_h100_step06_v5_variants_run2.json")
TILES = "2026-11-22_h100_step05_tiles.json"
TILELANG = "2026-11-23_h100_step11_tilelang.json"   # gpu_try.py: the TileLang rung's checks, timings, tile sweep
FLASHINFER = "2026-11-23_h100_step11_flashinfer.json"   # gpu_try.py --quick with FlashInfer carried: its prefill too


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _x(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}x"


def latest(step: str) -> tuple[str, dict]:
    """The newest results file of ``step`` in the ladder runner's schema: (file name, content). A file named
    ``*_before_*`` records a build the tree has moved past, and is never the newest."""
    found = []
    for f in sorted(RESULTS.glob(f"*_step{step}*.json")):
        if "_before_" in f.name:
            continue
        d = json.loads(f.read_text())
        if d.get("schema") == 1 and d.get("step") == step:
            found.append((f.name, d))
    if not found:
        raise FileNotFoundError(f"no results/*_step{step}*.json in the schema of benchmarks/ladder.py")
    return found[-1]


def newest_with_methods(step: str) -> tuple[str, dict] | None:
    """The newest results file of ``step`` whose solution rows were timed by more than one method (the
    runner's --methods), or None: a later run without them does not take them from the lectures."""
    found = None
    for f in sorted(RESULTS.glob(f"*_step{step}*.json")):
        d = json.loads(f.read_text())
        if "_before_" not in f.name and d.get("schema") == 1 and d.get("step") == step and any(
                r.get("ratio_methods") and r["rung"] == d["solution"] for r in d["rows"]):
            found = (f.name, d)
    return found


@functools.lru_cache(maxsize=None)
def measured() -> dict:
    """course/results/measured.json: what the lectures show, from the committed results."""
    out = {}
    for step in ("05", "06", "07", "08", "09", "10", "12", "13", "15"):
        try:
            name, d = latest(step)
        except FileNotFoundError:
            continue
        out[step] = R.compact(d, f"benchmarks/results/{name}")
        from facourse.steps import load_step          # the verdicts as the manifest states them now
        for r in load_step(step)["rungs"]:
            if r["name"] in out[step]["rungs"]:
                out[step]["rungs"][r["name"]]["verdict"] = r["verdict"]
    if profiles := sorted(RESULTS.glob("*_step13_ncu.json")):     # benchmarks/counters.py: Nsight Compute's records
        out["13_ncu"] = compact_run(json.loads(profiles[-1].read_text()), f"benchmarks/results/{profiles[-1].name}")
    if ladder := sorted(RESULTS.glob("*_step13_ladder_ncu.json")):  # counters.py on step 13's slow ladder
        out["13_ladder_ncu"] = compact_run(json.loads(ladder[-1].read_text()), f"benchmarks/results/{ladder[-1].name}")
    if protons := sorted(RESULTS.glob("*_step13_proton.json")):   # benchmarks/counters.py --proton
        out["13_proton"] = {"source": f"benchmarks/results/{protons[-1].name}", **json.loads(protons[-1].read_text())}
    if m := newest_with_methods("10"):
        out["10_methods"] = R.compact(m[1], f"benchmarks/results/{m[0]}")
    probe = _load(PROBE)       # its sweep point under today's name (the probe ran before the rename)
    probe["rows"] = [{**r, "config": _new_name(r["config"])} for r in probe["rows"]]
    out["timing_probe"] = {**probe, "source": f"benchmarks/results/{PROBE}"}
    out["06_v5_variants"] = step06_v5_variants()
    tl = _load(TILELANG)       # gpu_try.py (step 11's TileLang rung): its own schema; the table tiles' bench rows
    out["11_tilelang"] = {"source": f"benchmarks/results/{TILELANG}", "env": tl["env"], "timing": tl["timing"],
                          "reference": tl["reference"], "solution": "tilelang_fa",
                          "rows": [{"rung": "tilelang_fa", **{k: r[k] for k in ("config", "dtype", "ref_backend", "tflops",
                                                                                  "tflops_ref", "ratio")}}
                                   for r in tl["rows"] if r["kind"] == "bench" and r.get("tiles") == "table"
                                   and r.get("layout", "bhsd") == "bhsd" and "ratio" in r]}
    fi = _load(FLASHINFER)     # the same runner, the TileLang solution against FA2 and FlashInfer's prefill
    out["11_flashinfer"] = {"source": f"benchmarks/results/{FLASHINFER}", "env": fi["env"], "timing": fi["timing"],
                            "rows": [{k: r[k] for k in ("config", "dtype", "layout", "ref_backend", "tflops",
                                                        "tflops_ref", "ratio")}
                                     for r in fi["rows"] if r["kind"] == "bench" and "ratio" in r]}
    traces = sorted(RESULTS.glob("*_step11_traces.json"))
    if traces:                 # benchmarks/traces.py: its own schema (traces and apply()'s choices)
        d = json.loads(traces[-1].read_text())
        out["11_traces"] = {"source": f"benchmarks/results/{traces[-1].name}", "env": d["env"], "timing": d["timing"],
                            "reference": d["reference"],
                            "traces": [{k: r[k] for k in ("workload", "solution", "status", "ms", "ref_ms", "speedup")
                                        if k in r} for r in d["traces"]],
                            "dispatch": d["dispatch"]}
    return out


def step11_flashinfer() -> str:
    """The TileLang solution against SDPA's FA2 and FlashInfer's prefill, in one run (contiguous
    [B, H, S, D]: the layout FlashInfer's reference takes without a copy)."""
    d = _m("11_flashinfer")
    env = d["env"]
    out = [f"Source: `{d['source'].removeprefix('benchmarks/')}`. {env['gpu']}, {env['date']}, torch {env['torch']}, "
           f"CUDA {env['cuda']}, TileLang {env['tilelang']}, FlashInfer {env.get('flashinfer', '?')}; timing: "
           f"{d['timing']}.", "",
           "| config | dtype | TileLang TFLOP/s | reference | reference TFLOP/s | TileLang / reference |",
           "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if r["layout"] == "bhsd":
            out.append(f"| {r['config']} | {r['dtype']} | {r['tflops']:.0f} | {r['ref_backend']} | "
                       f"{r['tflops_ref']:.0f} | {_x(r['ratio'])} |")
    return "\n".join(out)


def _m(step: str) -> dict:
    return measured()[step]


def source(step: str) -> str:
    d = _m(step)
    return f"Source: `{d['source'].removeprefix('benchmarks/')}`. {R.header(d)}."


def step05_tiles() -> str:
    """tile_sweep.py: t_FA2 / t_candidate for each tile candidate (columns) on each shape (rows)."""
    d = _load(TILES)
    labels = [c["label"] for c in d["candidates"]]
    keys = list(dict.fromkeys((r["config"], r["dtype"]) for r in d["rows"]))
    out = ["| shape | dtype | FA2 TFLOP/s | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    for name, dt in keys:
        rows = {r["label"]: r for r in d["rows"] if r["config"] == name and r["dtype"] == dt}
        fa = next((r["tflops_fa2"] for r in rows.values() if "tflops_fa2" in r), None)
        cells = ["—" if lab not in rows else "error" if "error" in rows[lab] else _x(rows[lab]["ratio"])
                 for lab in labels]
        out.append(f"| {_new_name(name)} | {dt} | {fa:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(out)



def _new_name(name: str) -> str:
    """Earlier runs named the sweep points sweep_<S>_<causal|noncausal> or full_<n>k / causal_<n>k."""
    m = re.fullmatch(r"sweep_(\d+)_(causal|noncausal)", name)
    return f"{m[2]}_{int(m[1]) // 1024}k" if m else re.sub(r"^full_", "noncausal_", name)


V5_SRC = HERE.parent / "solutions/06_cuda_flash_attention/ladder/v5_warp_specialized.cu"
V5_FIELDS = ("consumer_warps", "rows_per_warp", "block_n", "stages", "producer", "overlap", "q_in_regs", "lazy",
             "min_ctas_per_sm")
# The variants that are not v5's template but the exercise's four functions in a harness
# (ladder/v5_variants.py's docstring).
V5_HARNESSES = {"solution_v4": "the exercise's solution in its harness (v4: 8 warps x 16 rows)",
                "solution_h64": "the exercise's harness with 4 warps and 2 CTAs per SM",
                "solution_ws": "a candidate harness with a producer warp and the overlap (not adopted)"}
V5_TIMING = ("facourse.bench_attention as it was before the spin: CUDA events around each call with "
             "Python's enqueue inside the timed window (see the timing probe), the L2 flushed, "
             "interleaved rounds against FA2, median; the variants compare with one another more "
             "reliably than with FA2")


def step06_v5_variants() -> dict:
    """v5's configurations (ladder/v5_variants.py, its own schema): what the lecture shows of them.

    The configuration fields come from V5_VARIANT_LIST in v5_warp_specialized.cu; "v5_default"
    (a copy of one listed configuration) is left out; sweep points under today's names."""
    def field(name, x):
        return x == "true" if name in ("producer", "overlap", "q_in_regs", "lazy") else (
            16 * int(x) if name == "rows_per_warp" else int(x))
    cfg = {m[1]: dict(zip(V5_FIELDS, (field(n, x.strip()) for n, x in zip(V5_FIELDS, m[2].split(",")))))
           for m in re.finditer(r"X\((\w+),\s*v5::Cfg<([^>]*)>\)", V5_SRC.read_text())}
    first = _load(VARIANTS[0])
    out = {"source": [f"benchmarks/results/{f}" for f in VARIANTS], "gpu": first["gpu"], "torch": first["torch"],
           "date": VARIANTS[0][:10], "dtype": "float16", "reference": "FLASH_ATTENTION", "timing": V5_TIMING,
           "configs": [], "variants": []}
    for run, f in enumerate(VARIANTS, 1):
        for v, r in _load(f)["variants"].items():
            if v == "v5_default":
                continue
            bench = {_new_name(n): b for n, b in r["bench"].items() if "ratio" in b}
            for n in bench:
                if n not in out["configs"]:
                    out["configs"].append(n)
            out["variants"].append({
                "name": v, "run": run, "config": cfg.get(v), "harness": V5_HARNESSES.get(v),
                "checks": [sum(x == "ok" for x in r["check"].values()), len(r["check"])],
                "tflops": {n: b["tflops_student"] for n, b in bench.items()},
                "tflops_ref": {n: b["tflops_ref"] for n, b in bench.items()},
                "ratio": {n: b["ratio"] for n, b in bench.items()}})
    return out


TABLES = {
    "step05": lambda: R.table(_m("05")),
    "step05_source": lambda: source("05"),
    "step05_ladder": lambda: R.ladder_table(_m("05")),
    "step05_bar": lambda: R.bar_table(_m("05")),
    "step05_tiles": step05_tiles,
    "timing_probe": lambda: R.timing_probe_table(_m("timing_probe")),
    "step06": lambda: R.table(_m("06")),
    "step06_source": lambda: source("06"),
    "step06_ladder": lambda: R.ladder_table(_m("06")),
    "step06_bar": lambda: R.bar_table(_m("06")),
    "step06_variants": lambda: R.variants_table(_m("06_v5_variants")),
    "step07": lambda: R.table(_m("07")),
    "step07_source": lambda: source("07"),
    "step07_ladder": lambda: R.ladder_table(_m("07")),
    "step07_bar": lambda: R.bar_table(_m("07")),
    "step08": lambda: R.table(_m("08")),
    "step08_source": lambda: source("08"),
    "step08_ladder": lambda: R.ladder_table(_m("08")),
    "step08_bar": lambda: R.bar_table(_m("08")),
    "step08_train": lambda: R.solution_table(_m("08"), train=True),
    "step09": lambda: R.table(_m("09")),
    "step09_source": lambda: source("09"),
    "step10": lambda: R.table(_m("10")),
    "step10_source": lambda: source("10"),
    "step10_fp8": lambda: R.fp8_table(_m("10")),
    "step11_traces_source": lambda: (f"Source: `{_m('11_traces')['source'].removeprefix('benchmarks/')}`. "
                                     f"{R.traces_header(_m('11_traces'))}."),
    "step11_traces": lambda: R.traces_table(_m("11_traces")),
    "step11_flashinfer": step11_flashinfer,
    "step12": lambda: R.table(_m("12")),
    "step12_source": lambda: source("12"),
    "step13": lambda: summary_table(_m("13_ncu")),
    "step13_source": lambda: (f"Source: `{_m('13_ncu')['source'].removeprefix('benchmarks/')}`. {_m('13_ncu')['env']['gpu']}, "
                              f"{_m('13_ncu')['env']['date']}, {_m('13_ncu')['profile']['tool']}, clocks locked to base; "
                              f"roofs measured in the same run: GEMM {_m('13_ncu')['roofs']['tflops']} TFLOP/s, copy "
                              f"{_m('13_ncu')['roofs']['gbps']} GB/s."),
    "step13_ladder": lambda: R.ladder_table(_m("13")),
    "step13_ladder_source": lambda: source("13"),
    "step13_ladder_ncu": lambda: rung_table(_m("13_ladder_ncu")),
    "step13_ladder_ncu_source": lambda: (f"Source: `{_m('13_ladder_ncu')['source'].removeprefix('benchmarks/')}`. "
                                         f"{_m('13_ladder_ncu')['env']['gpu']}, {_m('13_ladder_ncu')['env']['date']}, "
                                         f"{_m('13_ladder_ncu')['profile']['tool']}, clocks locked to base."),
    "step15": lambda: R.table(_m("15")),
    "step15_source": lambda: source("15"),
}


def render(text: str) -> str:
    def sub(m):
        try:
            body = TABLES[m[1]]()
        except KeyError:                       # a step with no results in the schema yet
            body = "_No results in the ladder runner's schema are committed for this step._"
        return f"<!-- table:{m[1]} -->\n{body}\n<!-- /table:{m[1]} -->"
    return re.sub(r"<!-- table:(\w+) -->.*?<!-- /table:\1 -->", sub, text, flags=re.S)


def measured_text() -> str:
    return json.dumps(measured(), indent=1, sort_keys=False) + "\n"


if __name__ == "__main__":
    old, new = README.read_text(), render(README.read_text())
    old_m = MEASURED.read_text() if MEASURED.exists() else ""
    new_m = measured_text()
    if "--check" in sys.argv:
        sys.exit(0 if (new, new_m) == (old, old_m) else 1)
    README.write_text(new)
    MEASURED.parent.mkdir(parents=True, exist_ok=True)
    MEASURED.write_text(new_m)
