"""Step 07 on an H100/H200: build every Hopper ladder rung, check it, time it, write JSON.

    python solutions/07_hopper_flash_attention/ladder/gpu_check.py [--quick] [--only v1_ws,v4_persistent]

Builds each rung (ladder/v*.cu = switches + hopper_fa.cuh) with facourse.load_cuda_extension for
sm_90a, in parallel. Then, one subprocess per rung (a deadlock costs that rung, not the run): checks
it with facourse.check_entry_point on the five configurations and every edge case in fp16 and bf16
(with lse), and times it with facourse.bench_attention against SDPA's CUDNN_ATTENTION backend (the
step's reference) and FLASH_ATTENTION on `large` and on a 4k-16k sweep, causal and not. Writes
$OUT/step07_gpu_check.json (OUT defaults to ./out) and prints a table last.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

LADDER = Path(__file__).resolve().parent
STEP = LADDER.parent
STEP06 = STEP.parent / "06_cuda_flash_attention"       # fa_params.h and fa_binding.cpp: the C ABI of step 06
BUILD = Path(os.environ.get("HFA_BUILD", Path(tempfile.gettempdir()) / "hfa_build"))
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION")


def versions() -> list[str]:
    return sorted(p.stem for p in LADDER.glob("v*.cu"))


def sweep():
    from facourse import AttnConfig
    return [AttnConfig(f"{'causal' if c else 'full'}_{s // 1024}k", B=max(1, 16384 // s), Hq=16, Hkv=16, Sq=s, Skv=s,
                       D=128, causal=c) for s in (4096, 8192, 16384) for c in (False, True)]


def build(version: str):
    from facourse.cuda_build import load_cuda_extension
    return load_cuda_extension(f"fa07_{version}", [LADDER / f"{version}.cu", STEP06 / "fa_binding.cpp"],
                               arch="sm_90a", include_dirs=[STEP, STEP06], build_directory=str(BUILD / version))


def prebuild(version: str) -> None:
    build(version)   # in a pool worker: the module itself cannot travel back


def entry_point(version: str):
    from facourse import validate_inputs
    ext = build(version)

    def flash_attention_hopper(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return tuple(ext.forward(q, k, v, bool(causal), float(scale)))

    flash_attention_hopper.__name__ = f"flash_attention_hopper_{version}"
    return flash_attention_hopper


def worker(version: str, quick: bool, out: Path) -> None:
    """Check and time one rung; the result goes to `out` as JSON (written after every step)."""
    import torch
    from facourse import CONFIGS, EDGE_CASES, bench_attention, check_entry_point
    res: dict = {"check": {}, "bench": {}}
    fn = entry_point(version)
    dtypes = ["float16"] if quick else ["float16", "bfloat16"]
    for dt in dtypes:
        for name in list(CONFIGS) + list(EDGE_CASES):
            try:
                check_entry_point(fn, name, device="cuda", dtype=getattr(torch, dt), expect_lse=True, verbose=False)
                res["check"][f"{name}/{dt}"] = "ok"
            except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                res["check"][f"{name}/{dt}"] = f"FAIL {type(e).__name__}: {str(e)[:400]}"
            torch.cuda.synchronize()
            out.write_text(json.dumps(res))
    if all(x == "ok" for x in res["check"].values()):
        for cfg in ["large"] + ([] if quick else sweep()):
            name = cfg if isinstance(cfg, str) else cfg.name
            res["bench"][name] = {}
            for backend in BACKENDS:
                try:
                    r = bench_attention(fn, cfg, backend=backend)
                    res["bench"][name][backend] = {**r.as_dict(), "summary": r.summary()}
                except Exception as e:  # noqa: BLE001
                    res["bench"][name][backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                out.write_text(json.dumps(res))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated rungs (default: all)")
    ap.add_argument("--quick", action="store_true", help="fp16 checks, `large` only")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per rung (checks + timing)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.quick, Path(a.worker_out))
        return 0
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("gpu_check.py needs a Hopper GPU (sm_90: H100 or H200)")
        return 2
    from facourse.hw import gpu_name
    outdir = Path(os.environ.get("OUT", "out"))
    outdir.mkdir(parents=True, exist_ok=True)
    todo = [v for v in versions() if not a.only or v in a.only.split(",")]
    report = {"gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "reference": list(BACKENDS),
              "versions": {}}
    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=len(todo)) as pool:   # nvcc runs for every rung at once
        builds = {v: pool.submit(prebuild, v) for v in todo}
        for v, f in builds.items():
            try:
                f.result()
                report["versions"][v] = {"build_s": round(time.time() - t0, 1)}
            except Exception:  # noqa: BLE001
                report["versions"][v] = {"error": "build failed:\n" + traceback.format_exc()[-3000:]}
    for v in todo:
        entry = report["versions"][v]
        if "error" in entry:
            continue
        tmp = BUILD / f"{v}.json"
        tmp.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--worker", v, "--worker-out", str(tmp)] + (["--quick"] if a.quick else [])
        try:
            proc = subprocess.run(cmd, timeout=a.timeout, capture_output=True, text=True)
            if proc.returncode != 0:
                entry["error"] = f"worker exit {proc.returncode}: {proc.stderr[-1500:]}"
        except subprocess.TimeoutExpired:
            entry["error"] = f"timed out after {a.timeout} s (deadlock?)"
        if tmp.exists():
            entry.update(json.loads(tmp.read_text()))
        (outdir / "step07_gpu_check.json").write_text(json.dumps(report, indent=1))
    # ---- the table, last
    names = ["large"] + ([] if a.quick else [c.name for c in sweep()])
    print(f"\nstep 07 on {report['gpu']}: ratio = t(SDPA backend) / t(kernel), cuDNN | FA2")
    print(f"{'version':16s} {'checks':>9s} " + " ".join(f"{n:>13s}" for n in names))
    for v, e in report["versions"].items():
        c = e.get("check", {})
        nok = sum(x == "ok" for x in c.values())
        cells = []
        for n in names:
            b = e.get("bench", {}).get(n, {})
            r = [b.get(k, {}).get("ratio") for k in BACKENDS]
            cells.append(f"{r[0]:5.2f} | {r[1]:5.2f}" if None not in r else f"{'-':>13s}")
        print(f"{v:16s} {nok:4d}/{len(c):<4d} " + " ".join(cells))
        if "error" in e:
            print(f"    ERROR: {e['error'].strip()[-600:]}")
        for k, x in c.items():
            if x != "ok":
                print(f"    {k}: {x[:200]}")
        for n in names:
            for k in BACKENDS:
                s = e.get("bench", {}).get(n, {}).get(k, {})
                if "summary" in s:
                    print(f"    {n} vs {k}: {s['summary']}")
    print(f"JSON: {outdir / 'step07_gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
