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


def step05_ladder() -> str:
    d = _load("2026-11-22_h100_step05.json")
    out = ["| version | config | TFLOP/s | vs SDPA FLASH_ATTENTION |", "|---|---|---|---|"]
    for r in d["ladder"]:
        if "error" not in r:
            out.append(f"| {r['kernel']} | {r['name']} | {r['tflops_student']:.0f} | {_x(r['ratio'])} |")
    return "\n".join(out)


def step06() -> str:
    d = _load("2026-11-22_h100_step06.json")
    names = ["large", "full_4k", "causal_4k", "full_8k", "causal_8k", "full_16k", "causal_16k"]
    out = ["| version | checks passed | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for v, r in d["versions"].items():
        ok = sum(x == "ok" for x in r["check"].values())
        cells = []
        for n in names:
            b = r["bench"].get(n)
            cells.append("—" if not b or "ratio" not in b else f"{b['tflops_student']:.0f} ({_x(b['ratio'])})")
        out.append(f"| {v} | {ok}/{len(r['check'])} | " + " | ".join(cells) + " |")
    ref = d["versions"]["solution"]["bench"]
    out.append("| SDPA FLASH_ATTENTION | | " + " | ".join(
        f"{ref[n]['tflops_ref']:.0f}" if n in ref else "—" for n in names) + " |")
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


TABLES = {"step05": step05, "step05_ladder": step05_ladder, "step06": step06, "step07": step07}


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
