"""Write the measured tables of benchmarks/README.md from the committed JSON (no number is typed).

    python benchmarks/tables.py            # rewrite the marked blocks of benchmarks/README.md
    python benchmarks/tables.py --check    # exit 1 if README.md differs from what the JSON gives

A block sits between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; NAME picks a function below.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _x(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}x"


def step05() -> str:
    d = _load("2026-11-22_h100_step05.json")
    rows: dict = {}
    for r in d["bench"] + d["sweep"]:
        if "error" not in r:
            rows.setdefault((r["name"], r["dtype"]), {})[r["backend"]] = r
    out = ["| config | dtype | ours (%s) TFLOP/s | reference | ref TFLOP/s | ours / ref | SDPA cuDNN | ours / cuDNN |" % d["solution"],
           "|---|---|---|---|---|---|---|---|"]
    for (name, dt), by in rows.items():
        cu = by.get("CUDNN_ATTENTION")
        ref = by.get("FLASH_ATTENTION") or next((r for b, r in by.items() if b != "CUDNN_ATTENTION"), None)
        first = ref or cu
        out.append(f"| {name} | {dt} | {first['tflops_student']:.0f} | "
                   + (f"{ref['backend']} | {ref['tflops_ref']:.0f} | {_x(ref['ratio'])} | " if ref else "— | — | — | ")
                   + (f"{cu['tflops_ref']:.0f} | {_x(cu['ratio'])} |" if cu else "— | — |"))
    return "\n".join(out)


def step05_ladder(name: str = "2026-11-22_h100_step05.json", kernels=None) -> str:
    d = _load(name)
    out = ["| version | config | TFLOP/s | vs SDPA FLASH_ATTENTION |", "|---|---|---|---|"]
    for r in d["ladder"]:
        if "error" not in r and (kernels is None or r["kernel"] in kernels):
            out.append(f"| {r['kernel']} | {r['name']} | {r['tflops_student']:.0f} | {_x(r['ratio'])} |")
    return "\n".join(out)


def step05_v7() -> str:
    """Run 6: the removed v7 (longest first across heads) and v6, timed in the same run."""
    return step05_ladder("2026-11-22_h100_step05_run6.json", ("v6_host_tma", "v7_longest_first"))


def step05_bar() -> str:
    """The issue's bar: the solution against FA2 (and cuDNN) on `large` and at the 4k-16k points."""
    d = _load("2026-11-22_h100_step05.json")
    out = ["| dtype | points | vs FA2 (min-max) | vs cuDNN (min-max) | >= 1.3x FA2 at every point |",
           "|---|---|---|---|---|"]
    for dt in dict.fromkeys(r["dtype"] for r in d["bench"]):
        for label, pick in (("large", lambda r: r["name"] == "large"),
                            ("4k-16k, causal", lambda r: r.get("S", 0) >= 4096 and r["causal"]),
                            ("4k-16k, non-causal", lambda r: r.get("S", 0) >= 4096 and not r["causal"])):
            rows = [r for r in d["bench"] + d["sweep"] if r["dtype"] == dt and "error" not in r and pick(r)]
            fa = [r["ratio"] for r in rows if r["backend"] == "FLASH_ATTENTION"]
            cu = [r["ratio"] for r in rows if r["backend"] == "CUDNN_ATTENTION"]
            out.append(f"| {dt} | {label} ({len(fa)}) | {_x(min(fa))}-{_x(max(fa))} | {_x(min(cu))}-{_x(max(cu))} | "
                       f"{'yes' if min(fa) >= 1.3 else 'no'} |")
    return "\n".join(out)


def timing_probe() -> str:
    """benchmarks/timing_probe.py: the step-05 solution and FA2 timed without and with the spin."""
    d = _load("2026-11-22_h100_timing_probe.json")
    out = [f"| shape | dtype | enqueue ours ({d['solution']}, us) | enqueue FA2 (us) | L2 flush (us) | "
           "t_FA2 / t_ours without the spin | with the spin |",
           "|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["config"], r["dtype"]) for r in d["rows"]))
    for name, dt in keys:
        rs = [r for r in d["rows"] if (r["config"], r["dtype"]) == (name, dt)]
        h = rs[0]["host_enqueue_us"]
        without = ", ".join(_x(r["ratio"]) for r in rs if not r["hide_host"])
        with_ = ", ".join(_x(r["ratio"]) for r in rs if r["hide_host"])
        out.append(f"| {name} | {dt} | {h['ours']:.0f} | {h['FA2']:.0f} | {rs[0]['flush_us']:.0f} | {without} | {with_} |")
    return "\n".join(out)


def step05_tiles() -> str:
    """tile_sweep.py: t_FA2 / t_candidate for each tile candidate (columns) on each shape (rows)."""
    d = _load("2026-11-22_h100_step05_tiles.json")
    labels = [c["label"] for c in d["candidates"]]
    keys = list(dict.fromkeys((r["config"], r["dtype"]) for r in d["rows"]))
    out = ["| shape | dtype | FA2 TFLOP/s | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    for name, dt in keys:
        rows = {r["label"]: r for r in d["rows"] if r["config"] == name and r["dtype"] == dt}
        fa = next((r["tflops_fa2"] for r in rows.values() if "tflops_fa2" in r), None)
        cells = ["—" if lab not in rows else "error" if "error" in rows[lab] else _x(rows[lab]["ratio"])
                 for lab in labels]
        out.append(f"| {name} | {dt} | {fa:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


STEP06 = ["2026-11-22_h100_step06.json",        # v1-v4 and the exercise's solution
          "2026-11-22_h100_step06_run2.json",   # v5 (its v6 failed mqa/bf16: superseded by run 3)
          "2026-11-22_h100_step06_run3.json",   # v6 (24 B of spills at D = 128: superseded by run 4)
          "2026-11-22_h100_step06_run4.json"]   # v6, spill-free


def step06() -> str:
    versions = {}
    for f in STEP06:                                   # a later run replaces a version of an earlier one
        versions.update(_load(f)["versions"])
    names = ["large", "full_4k", "causal_4k", "full_8k", "causal_8k", "full_16k", "causal_16k"]
    out = ["| version | checks passed | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for v, r in versions.items():
        ok = sum(x == "ok" for x in r["check"].values())
        cells = []
        for n in names:
            b = r["bench"].get(n)
            cells.append("—" if not b or "ratio" not in b else f"{b['tflops_student']:.0f} ({_x(b['ratio'])})")
        out.append(f"| {v} | {ok}/{len(r['check'])} | " + " | ".join(cells) + " |")
    ref = versions["solution"]["bench"]
    out.append("| SDPA FLASH_ATTENTION | | " + " | ".join(
        f"{ref[n]['tflops_ref']:.0f}" if n in ref else "—" for n in names) + " |")
    return "\n".join(out)


def step06_variants() -> str:
    """v5's configurations (ladder/v5_variants.py), fp16; the columns from V5_VARIANT_LIST."""
    src = (HERE.parent / "solutions/06_cuda_flash_attention/ladder/v5_warp_specialized.cu").read_text()
    cfg = {m[1]: [x.strip() for x in m[2].split(",")] for m in re.finditer(r"X\((\w+),\s*v5::Cfg<([^>]*)>\)", src)}
    names = ["large", "full_4k", "causal_4k", "full_8k", "causal_8k", "full_16k", "causal_16k"]
    out = ["| variant | warps | rows/warp | BLOCK_N | stages | producer | overlap | Q in regs | lazy | "
           + " | ".join(names) + " |", "|---|" + "---|" * (8 + len(names))]
    for run, f in ((1, "2026-11-22_h100_step06_v5_variants.json"), (2, "2026-11-22_h100_step06_v5_variants_run2.json")):
        for v, r in _load(f)["variants"].items():
            if v == "v5_default":                      # a copy of one of the listed configurations
                continue
            c = cfg.get(v)
            desc = ([f"{c[0]}+1" if c[4] == "true" else c[0], str(16 * int(c[1])), c[2], c[3]]
                    + ["yes" if c[i] == "true" else "no" for i in (4, 5, 6, 7)]) if c else ["—"] * 8
            cells = [f"{b['tflops_student']:.0f} ({_x(b['ratio'])})" if (b := r["bench"].get(n)) and "ratio" in b
                     else "—" for n in names]
            out.append(f"| {v} (run {run}) | " + " | ".join(desc + cells) + " |")
    return "\n".join(out)


def step07() -> str:
    d = _load("2026-11-22_h100_step07.json")
    names = ["large", "full_4k", "causal_4k", "full_8k", "causal_8k", "full_16k", "causal_16k"]
    out = ["| version | checks passed | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for v, r in d["versions"].items():
        ok = sum(x == "ok" for x in r["check"].values())
        cells = []
        for n in names:
            b = r["bench"].get(n, {})
            cu, fa = b.get("CUDNN_ATTENTION", {}), b.get("FLASH_ATTENTION", {})
            cells.append("—" if "ratio" not in cu else
                         f"{cu['tflops_student']:.0f} ({_x(cu['ratio'])} cuDNN, {_x(fa.get('ratio'))} FA2)")
        out.append(f"| {v} | {ok}/{len(r['check'])} | " + " | ".join(cells) + " |")
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):  # the reference's own figure, per rung's pairing
        lo_hi = []
        for n in names:
            xs = [r["bench"][n][backend]["tflops_ref"] for r in d["versions"].values()
                  if backend in r["bench"].get(n, {}) and "tflops_ref" in r["bench"][n][backend]]
            lo_hi.append(f"{min(xs):.0f}-{max(xs):.0f}" if xs else "—")
        out.append(f"| SDPA {backend} | | " + " | ".join(lo_hi) + " |")
    return "\n".join(out)


TABLES = {"step05": step05, "step05_ladder": step05_ladder, "step05_tiles": step05_tiles, "step05_v7": step05_v7,
          "step05_bar": step05_bar, "timing_probe": timing_probe, "step06": step06, "step06_variants": step06_variants,
          "step07": step07}


def render(text: str) -> str:
    def sub(m):
        return f"<!-- table:{m[1]} -->\n{TABLES[m[1]]()}\n<!-- /table:{m[1]} -->"
    return re.sub(r"<!-- table:(\w+) -->.*?<!-- /table:\1 -->", sub, text, flags=re.S)


if __name__ == "__main__":
    old = README.read_text()
    new = render(old)
    if "--check" in sys.argv:
        sys.exit(0 if new == old else 1)
    README.write_text(new)
