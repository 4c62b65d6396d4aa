"""Step 06 on a GPU: build every ladder rung and the solution, check them, time them, write JSON.

    python solutions/06_cuda_flash_attention/ladder/gpu_check.py [--quick] [--only v6_fa2_tiles_lazy,solution]

Builds each kernel with facourse.load_cuda_extension (kernel .cu + fa_binding.cpp), checks it with
facourse.check_entry_point on the five configurations and the edge cases in fp16 and bf16 (with
lse), times it with facourse.bench_attention (the shared bench: interleaved rounds, L2 flushed,
CUDA events) against SDPA's FLASH_ATTENTION backend on `large` and on a 4k-16k sweep (causal and
not), writes $OUT/step06_gpu_check.json (OUT defaults to ./out) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

LADDER = Path(__file__).resolve().parent       # solutions/06_cuda_flash_attention/ladder (not released)
HERE = LADDER.parent                            # the exercise folder: fa_binding.cpp, fa_*.cuh

from facourse import (CONFIGS, EDGE_CASES, AttnConfig, bench_attention, check_entry_point,  # noqa: E402
                      validate_inputs)
from facourse.cuda_build import load_cuda_extension  # noqa: E402

SWEEP = [AttnConfig(f"{'causal' if c else 'full'}_{s // 1024}k", B=max(1, 16384 // s), Hq=16, Hkv=16, Sq=s, Skv=s,
                    D=128, causal=c) for s in (4096, 8192, 16384) for c in (False, True)]


def versions() -> list[str]:
    return sorted(p.stem for p in LADDER.glob("v*.cu")) + ["solution"]


def _source(version: str) -> Path:
    # "solution": the exercise's files exactly as a student's would be built (harness + their .cu)
    return LADDER / "student_kernel_solution.cu" if version == "solution" else LADDER / f"{version}.cu"


_EXT: dict[str, object] = {}


def build(version: str):
    if version not in _EXT:
        _EXT[version] = load_cuda_extension(f"fa06_{version}", [_source(version), HERE / "fa_binding.cpp"],
                                            include_dirs=[LADDER, HERE],
                                            build_directory=str(Path(os.environ.get("OUT", "out")) / "build" / version))
    return _EXT[version]


def entry_point(version: str):
    ext = build(version)

    def flash_attention_cuda(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        o, lse = ext.forward(q, k, v, bool(causal), float(scale))
        return o, lse

    flash_attention_cuda.__name__ = f"flash_attention_cuda_{version}"
    return flash_attention_cuda


def check(version: str, dtypes) -> dict:
    out = {}
    fn = entry_point(version)
    for dt in dtypes:
        for name in list(CONFIGS) + list(EDGE_CASES):
            key = f"{name}/{dt}"
            try:
                check_entry_point(fn, name, device="cuda", dtype=getattr(torch, dt), expect_lse=True, verbose=False)
                out[key] = "ok"
            except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                out[key] = f"FAIL {type(e).__name__}: {str(e)[:400]}"
    return out


def bench(version: str, configs) -> dict:
    fn = entry_point(version)
    out = {}
    for cfg in configs:
        name = cfg if isinstance(cfg, str) else cfg.name
        try:
            r = bench_attention(fn, cfg, backend="FLASH_ATTENTION")
            out[name] = {**r.as_dict(), "summary": r.summary()}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated versions (default: all)")
    ap.add_argument("--quick", action="store_true", help="fp16 only, `large` only")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA GPU")
        return 2
    outdir = Path(os.environ.get("OUT", "out"))
    outdir.mkdir(parents=True, exist_ok=True)
    todo = [v for v in versions() if not a.only or v in a.only.split(",")]
    dtypes = ["float16"] if a.quick else ["float16", "bfloat16"]
    configs = ["large"] if a.quick else ["large", *SWEEP]
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "versions": {}}
    for v in todo:
        t0 = time.time()
        entry = report["versions"][v] = {}
        try:
            build(v)
            entry["build_s"] = round(time.time() - t0, 1)
            entry["check"] = check(v, dtypes)
            ok = all(x == "ok" for x in entry["check"].values())
            # the scalar rung is far too slow for the long sweep: time it on `large` only
            entry["bench"] = bench(v, configs if (ok and not v.startswith("v1")) else ["large"] if ok else [])
        except Exception:  # noqa: BLE001
            entry["error"] = traceback.format_exc()[-2000:]
        (outdir / "step06_gpu_check.json").write_text(json.dumps(report, indent=1))
    # ---- the table, last
    names = ["large"] + ([c.name for c in SWEEP] if not a.quick else [])
    print(f"\nstep 06 on {report['gpu']}: ratio = t(SDPA FLASH_ATTENTION) / t(kernel)  (>1 is faster than FA2)")
    print(f"{'version':18s} {'checks':>9s} " + " ".join(f"{n:>10s}" for n in names))
    for v, e in report["versions"].items():
        if "error" in e:
            print(f"{v:18s} ERROR: {e['error'].strip().splitlines()[-1][:100]}")
            continue
        c = e.get("check", {})
        nok = sum(x == "ok" for x in c.values())
        cells = []
        for n in names:
            b = e.get("bench", {}).get(n)
            cells.append(f"{b['ratio']:10.2f}" if b and "ratio" in b else f"{'-':>10s}")
        print(f"{v:18s} {nok:4d}/{len(c):<4d} " + " ".join(cells))
        for k, x in c.items():
            if x != "ok":
                print(f"    {k}: {x[:160]}")
    print(f"JSON: {outdir / 'step06_gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
