"""Measured results, as the lectures and the benchmark README show them (no number typed by hand).

``benchmarks/ladder.py`` writes one JSON per step and GPU run in one schema (``"schema": 1``: step,
env, timing method, reference backend, solution, rungs, rows of kind "check" or "bench"; step 12's ring
rows add the step and one-GPU times and, per rank, the compute and the wait for the next shard).
``python benchmarks/tables.py`` copies what the lectures show into ``course/results/measured.json``
(which ships with the student archive: the bench rows and check counts of each step, and the
timing probe) and writes the README's tables with the functions below, so both read the same rows.

    >>> from facourse import results
    >>> d = results.load("05")                      # None when nothing is committed
    >>> print(results.bar_table(d))                 # the solution against FA2 and cuDNN
    >>> d = results.show("09")                      # a lecture's cell: header and table, or "none yet"

Besides the steps, measured.json holds "timing_probe" (benchmarks/timing_probe.py) and
"06_v5_variants" (step 06's v5 configurations, ladder/v5_variants.py: each variant's fields, checks,
TFLOP/s and ratio per configuration, its run; timed with the older method, Python's enqueue inside
the timed window, which its "timing" says): ``print(results.variants_table(results.load("06_v5_variants")))``.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import kinds

MEASURED = Path(__file__).resolve().parents[2] / "course" / "results" / "measured.json"
FA2, CUDNN = "FLASH_ATTENTION", "CUDNN_ATTENTION"
#: What every bench row keeps for the lectures; a kind adds its own (``Kind.extra_row_keys``: step 12's
#: step and one-GPU times, efficiency, per rank the compute and the wait, one shard's transfer alone).
ROW_KEYS = ("rung", "config", "dtype", "ref_backend", "tflops", "tflops_ref", "ratio", "ratio_methods", "mode", "gbps",
            "gbps_ref", "copy_fraction")


def load(step: str, path: Path | str | None = None) -> dict | None:
    """One step's results ("05", "06", "07", "timing_probe" or "06_v5_variants") from course/results/measured.json."""
    p = Path(path) if path else MEASURED
    if not p.exists():
        return None
    return json.loads(p.read_text(encoding="utf-8")).get(step)


def markdown(text: str) -> None:
    """A Markdown table: rendered in a notebook, printed as text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython and get_ipython() is not None:
        display(Markdown(text))
    else:
        print(text)


def show(name: str, render=None, head=None, missing: str | None = None) -> dict | None:
    """Print one committed result ("09", "10", "11_traces", ...): its header and ``render(d)`` (default:
    its kind's ``table``) as Markdown; or, when ``course/results/measured.json`` has none, one line that
    says so. Returns the result (None when missing) for the lines a lecture prints after the table."""
    d = load(name)
    if not d:
        what = f"step {name}" if name.isdigit() else name
        print(missing or f"No GPU measurement of {what} is committed yet "
              f"(course/results/measured.json has no \"{name}\").")
        return None
    print((head or header)(d))
    markdown((render or table)(d))
    return d


def compact(d: dict, source: str) -> dict:
    """What a lecture needs of a full results file: its header, check counts and bench rows."""
    keep = ROW_KEYS + kinds.of_results(d).extra_row_keys
    checks: dict = {}
    for r in d["rows"]:
        if r["kind"] == "check":
            c = checks.setdefault(r["rung"], [0, 0])
            c[0] += r["check"] == "ok"
            c[1] += 1
    def rounded(x):
        return round(x, 4) if isinstance(x, float) else {k: rounded(v) for k, v in x.items()} if isinstance(x, dict) else x
    rows = [{k: rounded(r[k]) for k in keep if k in r} for r in d["rows"] if r["kind"] == "bench" and "ratio" in r]
    errors: dict = {}                  # an FP8 check's error: {rung: {config: rmse or rel_err}}
    for r in d["rows"]:
        if r["kind"] == "check" and r["check"] == "ok" and (r.get("rmse") or r.get("rel_err")) is not None:
            errors.setdefault(r["rung"], {})[r["config"]] = round(r.get("rmse") or r["rel_err"], 6)
    return {"schema": d["schema"], "step": d["step"], "source": source, "env": d["env"], "timing": d["timing"],
            **({"mode": d["mode"]} if "mode" in d else {}),
            "reference": d["reference"], "solution": d["solution"],
            "rungs": {n: {"verdict": i["verdict"]} for n, i in d["rungs"].items()}, "checks": checks, "rows": rows,
            **({"errors": errors} if errors else {})}


def bench(d: dict, rung: str | None = None, config: str | None = None, dtype: str | None = None,
          backend: str | None = None, train: bool = False) -> list[dict]:
    """The bench rows that match (``None`` matches anything); ``backend`` matches the start of the name.
    Step 08's rows time the backward; ``train=True`` picks its forward + backward rows instead."""
    return [r for r in d["rows"] if r.get("kind", "bench") == "bench" and "ratio" in r
            and (r.get("mode") == "train") == train
            and (rung is None or r["rung"] == rung) and (config is None or r["config"] == config)
            and (dtype is None or r["dtype"] == dtype) and (backend is None or r["ref_backend"].startswith(backend))]


def _x(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}x"


def _span(xs: list[float]) -> str:
    return "—" if not xs else _x(min(xs)) if min(xs) == max(xs) else f"{_x(min(xs))}-{_x(max(xs))}"


def header(d: dict) -> str:
    e = d["env"]
    what = kinds.of_results(d).note
    return (f"{e['gpu']}, {e['date']}, torch {e['torch']}, CUDA {e['cuda']}, cuDNN {e['cudnn']}"
            + (f", Triton {e['triton']}" if d["step"] in ("05", "08", "09", "12") else "")
            + f"; timing: {d['timing']}{what}")


def table(d: dict) -> str:
    """A run's main table, as its kind renders it (the solution's timings; step 09's, 10's, 12's rungs)."""
    return globals()[kinds.of_results(d).table](d)


def solution_table(d: dict, train: bool = False) -> str:
    """The solution on every timed configuration: TFLOP/s, against FA2 and against cuDNN (step 08:
    the backward, or with ``train`` forward + backward)."""
    out = [f"| config | dtype | ours ({d['solution']}) TFLOP/s | reference | ref TFLOP/s | ours / ref | "
           "SDPA cuDNN TFLOP/s | ours / cuDNN |", "|---|---|---|---|---|---|---|---|"]
    sol = bench(d, d["solution"], train=train)
    for cfg, dt in dict.fromkeys((r["config"], r["dtype"]) for r in sol):
        rs = bench(d, d["solution"], cfg, dt, train=train)
        ref = next((r for r in rs if not r["ref_backend"].startswith(CUDNN)), None)
        cu = next((r for r in rs if r["ref_backend"].startswith(CUDNN)), None)
        first = ref or cu
        fa_cells = f"{ref['ref_backend']} | {ref['tflops_ref']:.0f} | {_x(ref['ratio'])} | " if ref else "— | — | — | "
        cu_cells = f"{cu['tflops_ref']:.0f} | {_x(cu['ratio'])} |" if cu else "— | — |"
        out.append(f"| {cfg} | {dt} | {first['tflops']:.0f} | {fa_cells}{cu_cells}")
    return "\n".join(out)


def ladder_table(d: dict) -> str:
    """Every rung but the solution on its own configurations (fp16), against the step's references."""
    backends = list(dict.fromkeys(r["ref_backend"] for r in d["rows"] if r["rung"] != d["solution"]))
    out = ["| rung | checks | config | TFLOP/s | " + " | ".join(f"vs {b}" for b in backends) + " |",
           "|---|---|---|---|" + "---|" * len(backends)]
    rungs = [n for n in d["rungs"] if n != d["solution"]] + [d["solution"]]
    for n in rungs:
        ok, total = d["checks"].get(n, (0, 0))
        cfgs = dict.fromkeys(r["config"] for r in bench(d, n, dtype="float16"))
        if n == d["solution"]:
            cfgs = dict.fromkeys(c for c in cfgs if c in _ladder_configs(d))
        for i, c in enumerate(cfgs):
            rs = bench(d, n, c, "float16")
            by = {r["ref_backend"]: r for r in rs}
            out.append(f"| {n if i == 0 else ''} | {f'{ok}/{total}' if i == 0 else ''} | {c} | {rs[0]['tflops']:.0f} | "
                       + " | ".join(_x(by[b]["ratio"]) if b in by else "—" for b in backends) + " |")
    return "\n".join(out)


def decode_table(d: dict) -> str:
    """Step 09: every rung on its perf cases (fp16): GB/s of K and V read, the fraction of a
    device-to-device copy's rate, and the ratio to each SDPA backend on the same K/V stored contiguously."""
    backends = list(dict.fromkeys(r["ref_backend"] for r in d["rows"]))
    copy = d["env"].get("copy_gbps")
    copy = f" ({copy:.0f} GB/s)" if copy else ""
    out = [f"| rung | checks | case | GB/s | of a copy{copy} | "
           + " | ".join(f"vs {b} (GB/s)" for b in backends) + " |", "|---|---|---|---|---|" + "---|" * len(backends)]
    rungs = [d["solution"]] + [n for n in d["rungs"] if n != d["solution"]]
    for n in rungs:
        ok, total = d["checks"].get(n, (0, 0))
        for i, c in enumerate(dict.fromkeys(r["config"] for r in bench(d, n))):
            by = {r["ref_backend"]: r for r in bench(d, n, c)}
            first = next(iter(by.values()))
            cells = " | ".join(f"{_x(by[b]['ratio'])} ({by[b]['gbps_ref']:.0f})" if b in by else "—" for b in backends)
            frac = f"{first['copy_fraction']:.0%}" if "copy_fraction" in first else "—"
            out.append(f"| {n if i == 0 else ''} | {f'{ok}/{total}' if i == 0 else ''} | {c} | {first['gbps']:.0f} | "
                       f"{frac} | {cells} |")
    return "\n".join(out)


def variant_table(d: dict) -> str:
    """Step 10: every rung on its timed cases (fp16), TFLOP/s of visible pairs, against each reference
    (compiled FlexAttention on the windows, SDPA on causal and on `long`)."""
    backends = list(dict.fromkeys(r["ref_backend"] for r in d["rows"]))
    out = ["| rung | checks | case | TFLOP/s | " + " | ".join(f"vs {b} (TFLOP/s)" for b in backends) + " |",
           "|---|---|---|---|" + "---|" * len(backends)]
    for n in [d["solution"]] + [n for n in d["rungs"] if n != d["solution"]]:
        ok, total = d["checks"].get(n, (0, 0))
        cases = dict.fromkeys((r["config"], r.get("mode")) for r in bench(d, n))
        for i, (c, mode) in enumerate(cases):
            by = {r["ref_backend"]: r for r in bench(d, n, c) if r.get("mode") == mode}
            first = next(iter(by.values()))
            cells = " | ".join(f"{_x(by[b]['ratio'])} ({by[b]['tflops_ref']:.0f})" if b in by else "—" for b in backends)
            case = c + {"e2e": ", fp16 in (end to end)"}.get(mode, ", e4m3 in" if first["dtype"].startswith("float8") else "")
            out.append(f"| {n if i == 0 else ''} | {f'{ok}/{total}' if i == 0 else ''} | {case} | {first['tflops']:.0f} | {cells} |")
    return "\n".join(out)


def fp8_table(d: dict) -> str:
    """Step 10's FP8 rungs side by side: the RMSE of O on FA3's outlier inputs (their checks), TFLOP/s on
    inputs already in e4m3 and end to end (fp16 in, the quantisation timed), and the end-to-end time
    against the fp16 solution's on `long` in the same run (the course's bench; do_bench and plain events
    in brackets where the run measured them)."""
    errs = d.get("errors", {})
    cases = sorted({c for e in errs.values() for c in e if c.startswith("fa3_outliers")})
    out = ["| rung | " + " | ".join(f"RMSE, {c}" for c in cases) + " | e4m3 in: long, 16k non-causal (TFLOP/s) | "
           "fp16 in, end to end: long | end to end / fp16 solution on long |", "|---|" + "---|" * (len(cases) + 3)]
    sol = bench(d, d["solution"], "long", "float16", "FLASH_ATTENTION")
    for n in [n for n in d["rungs"] if n in errs]:
        pre = [bench(d, n, c, "float8_e4m3fn", "FLASH_ATTENTION") for c in ("long", "noncausal_16k")]
        e2e = [r for r in bench(d, n, "long", "float16", "FLASH_ATTENTION") if r.get("mode") == "e2e"]
        vs = "—"
        if e2e and sol:
            a, b = e2e[0], sol[0]
            vs = _x(a["tflops"] / b["tflops"])
            if a.get("ratio_methods") and b.get("ratio_methods"):
                vs += " [" + ", ".join(f"{m} {_x(a['ratio_methods'][m] / b['ratio_methods'][m])}"
                                       for m in a["ratio_methods"] if m in b["ratio_methods"]) + "]"
        rmse = " | ".join(f"{errs[n][c]:.2e}" if c in errs[n] else "—" for c in cases)
        rates = ", ".join(f"{r[0]['tflops']:.0f}" if r else "—" for r in pre)
        out.append(f"| {n} | {rmse} | {rates} | {e2e[0]['tflops']:.0f} | {vs} |" if e2e else
                   f"| {n} | {rmse} | {rates} | — | — |")
    return "\n".join(out)


def ring_table(d: dict) -> str:
    """Step 12: every rung on the timed configurations (fp16, causal): the step time on the ranks against
    the same block kernel on one GPU, the speedup and efficiency, and per rank the compute time and the
    wait for the next shard after it (≈ 0 when the transfer hides behind the compute), beside one
    shard's transfer timed alone."""
    out = ["| rung | checks | config | step ms | one GPU ms | speedup | efficiency | TFLOP/s | "
           "compute ms per rank | wait ms per rank | one shard alone, ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ranks(xs):
        return ", ".join(f"{x:.2f}" for x in xs)

    for n in [d["solution"]] + [n for n in d["rungs"] if n != d["solution"]]:
        ok, total = d["checks"].get(n, (0, 0))
        for i, r in enumerate(bench(d, n)):
            out.append(f"| {n if i == 0 else ''} | {f'{ok}/{total}' if i == 0 else ''} | {r['config']} | {r['ms']:.2f} | "
                       f"{r['ms_ref']:.2f} | {_x(r['ratio'])} | {r['efficiency']:.0%} | {r['tflops']:.0f} | "
                       f"{ranks(r['compute_ms'])} | {ranks(r['wait_ms'])} | {r['transfer_ms']:.2f} |")
    return "\n".join(out)


def traces_header(d: dict) -> str:
    """Step 11's traces (benchmarks/traces.py): the machine, the timing and the reference."""
    e = d["env"]
    return (f"{e['gpu']}, {e['date']}, torch {e['torch']}, CUDA {e['cuda']}, Triton {e['triton']}; timing: "
            f"{d['timing']}; speedup = t_SDPA {d['reference']} / t_solution on the same shape and seed, fp16")


def traces_table(d: dict) -> str:
    """Step 11: each solution's trace on each workload (speedup vs the reference, or why it failed),
    then the solution apply() routed the workload to and the fastest when all were timed again."""
    names = list(dict.fromkeys(r["solution"] for r in d["traces"]))
    cell = {(r["workload"], r["solution"]): _x(r["speedup"]) if r["status"] == "PASSED" and r.get("speedup")
            else r["status"] for r in d["traces"]}
    chose = {r["workload"]: r for r in d["dispatch"]}
    out = ["| workload | " + " | ".join(names) + " | apply() chose | re-timed fastest |",
           "|---|" + "---|" * (len(names) + 2)]
    for w in dict.fromkeys(r["workload"] for r in d["traces"]):
        c = chose.get(w, {})
        verdict = "" if not c else (" (right)" if c.get("right") else " (WRONG)")
        out.append(f"| {w} | " + " | ".join(cell.get((w, n), "—") for n in names)
                   + f" | {c.get('chosen', '—')}{verdict} | {c.get('fastest', '—')} |")
    return "\n".join(out)


def _ladder_configs(d: dict) -> set:
    return {r["config"] for r in d["rows"] if r["rung"] != d["solution"]}


def bar_table(d: dict) -> str:
    """The solution against FA2 and cuDNN on `large` and over the 4k-16k sweep, per dtype (min-max)."""
    out = ["| dtype | configurations | vs FA2 | vs cuDNN |", "|---|---|---|---|"]
    groups = (("large", lambda c: c == "large"),
              ("4k-16k, causal", lambda c: c in ("causal_4k", "causal_8k", "causal_16k")),
              ("4k-16k, non-causal", lambda c: c in ("noncausal_4k", "noncausal_8k", "noncausal_16k")))
    for dt in dict.fromkeys(r["dtype"] for r in bench(d, d["solution"])):
        for label, pick in groups:
            rs = [r for r in bench(d, d["solution"], dtype=dt) if pick(r["config"])]
            fa = [r["ratio"] for r in rs if r["ref_backend"] == FA2]
            cu = [r["ratio"] for r in rs if r["ref_backend"] == CUDNN]
            if fa or cu:
                out.append(f"| {dt} | {label} ({len(fa)}) | {_span(fa)} | {_span(cu)} |")
    return "\n".join(out)


def timing_probe_table(d: dict) -> str:
    """benchmarks/timing_probe.py: the step-05 solution and FA2 timed without and with the spin."""
    out = [f"| shape | dtype | enqueue ours ({d['solution']}, us) | enqueue FA2 (us) | L2 flush (us) | "
           "t_FA2 / t_ours without the spin | with the spin |", "|---|---|---|---|---|---|---|"]
    for name, dt in dict.fromkeys((r["config"], r["dtype"]) for r in d["rows"]):
        rs = [r for r in d["rows"] if (r["config"], r["dtype"]) == (name, dt)]
        h = rs[0]["host_enqueue_us"]
        without = ", ".join(_x(r["ratio"]) for r in rs if not r["hide_host"])
        with_ = ", ".join(_x(r["ratio"]) for r in rs if r["hide_host"])
        out.append(f"| {name} | {dt} | {h['ours']:.0f} | {h['FA2']:.0f} | {rs[0]['flush_us']:.0f} | "
                   f"{without} | {with_} |")
    return "\n".join(out)


def variants_header(d: dict) -> str:
    """Where step 06's v5 variants were measured, and how (an older timing method than the ladder's)."""
    return (f"{d['gpu']}, {d['date']}, torch {d['torch']}, {d['dtype']}, against SDPA {d['reference']}; "
            f"timing: {d['timing']}")


def variants_table(d: dict) -> str:
    """Step 06's v5 configurations ("06_v5_variants"): their fields, then TFLOP/s (t_FA2 / t_variant)
    per configuration; a variant that is no configuration of v5's template says what it is instead."""
    cols = ("warps", "rows/warp", "BLOCK_N", "stages", "producer", "overlap", "Q in regs", "lazy", "min CTAs/SM")
    out = ["| variant | run | checks | " + " | ".join(cols) + " | " + " | ".join(d["configs"]) + " |",
           "|---|---|---|" + "---|" * (len(cols) + len(d["configs"]))]
    for v in d["variants"]:
        c = v["config"]
        if c:
            yn = ["yes" if c[k] else "no" for k in ("producer", "overlap", "q_in_regs", "lazy")]
            desc = [f"{c['consumer_warps']}+1" if c["producer"] else str(c["consumer_warps"]),
                    str(c["rows_per_warp"]), str(c["block_n"]), str(c["stages"]), *yn, str(c["min_ctas_per_sm"])]
        else:
            desc = [v["harness"] or "—"] + [""] * (len(cols) - 1)
        cells = [f"{v['tflops'][n]:.0f} ({_x(v['ratio'][n])})" if n in v["ratio"] else "—" for n in d["configs"]]
        out.append(f"| {v['name']} | {v['run']} | {v['checks'][0]}/{v['checks'][1]} | "
                   + " | ".join(desc + cells) + " |")
    return "\n".join(out)


def plot_sweep(d: dict, dtype: str = "float16", ax=None):
    """TFLOP/s against sequence length: the solution, SDPA FA2 and cuDNN, non-causal and causal."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    sol = bench(d, d["solution"], dtype=dtype)
    for a, kind in zip(ax, ("noncausal", "causal")):
        pts = [r for r in sol if r["config"].startswith(kind + "_")]
        lengths = sorted({_seq(r["config"]) for r in pts})
        def get(be, key, pts=pts, lengths=lengths):
            return [next((r[key] for r in pts if _seq(r["config"]) == s and r["ref_backend"] == be), float("nan"))
                    for s in lengths]
        a.plot(lengths, get(FA2, "tflops"), "o-", label=f"course kernel ({d['solution']})")
        a.plot(lengths, get(FA2, "tflops_ref"), "s-", label="SDPA FLASH_ATTENTION (FA2)")
        a.plot(lengths, get(CUDNN, "tflops_ref"), "^-", label="SDPA CUDNN_ATTENTION")
        a.set_xscale("log", base=2)
        a.set_xticks(lengths, [f"{s // 1024}k" if s >= 1024 else str(s) for s in lengths])
        a.set_xlabel(f"sequence length (D = 128, B·H·S = 16·16k, {dtype})")
        a.set_title("causal" if kind == "causal" else "non-causal")
        a.grid(alpha=0.3)
    ax[0].set_ylabel("TFLOP/s")
    ax[0].legend(fontsize=8)
    ax[0].figure.suptitle(f"{d['env']['gpu']}, {d['env']['date']}: GPU time, L2 flushed, median of 25", fontsize=9)
    return ax


def _seq(name: str) -> int:
    s = name.rsplit("_", 1)[1]
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)
