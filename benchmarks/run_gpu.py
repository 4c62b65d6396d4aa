"""Step 05 on a GPU, in one call: check, then time, everything the Triton kernels claim.

    PYTHONPATH=src:. python benchmarks/run_gpu.py [--out DIR] [--quick] [--no-pytest]

1. correctness of the ladder's solution (the highest-numbered file in
   solutions/05_triton_flash_attention/ladder/) on the five configurations at full size and on
   every edge case, fp16 and bf16, through facourse.check_entry_point (expect_lse=True);
2. the solution against SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends with
   facourse.bench_attention (the one shared bench) on the five configurations, "long", and a sweep
   of S = 512 ... 16k (D = 128, B*H*S = 16 * 16k, causal and not, fp16 and bf16);
3. every ladder version on `large` and `long` (v1, which holds one tile, on 8x32/8 heads, 128^2),
   the last two also on the causal 4k-16k sweep points (fp16);
4. `pytest -m gpu tests/`.
Writes DIR/step05.json (full numbers), DIR/pytest_gpu.log, and prints a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "05_triton_flash_attention" / "ladder"
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import triton  # noqa: E402

from facourse import AttnConfig, bench_attention, check_entry_point  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, LONG_CONFIG  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SWEEP = [512, 1024, 2048, 4096, 8192, 16384]


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ladder_files():
    return sorted(LADDER.glob("v[0-9]*_*.py"), key=lambda p: int(p.stem[1:].split("_")[0]))


def env_info() -> dict:
    return {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "capability": list(torch.cuda.get_device_capability()),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}


def sweep_config(S: int, causal: bool) -> AttnConfig:
    H = 16
    B = max(1, 16 * 16384 // (S * H))           # B*H*S = 16 * 16k: every point fills the GPU
    return AttnConfig(f"sweep_{S}_{'causal' if causal else 'noncausal'}", B, H, H, S, S, 128, causal)


def bench_row(fn, cfg, dtype_name, backend, label) -> dict:
    t0 = time.time()
    r = bench_attention(fn, cfg, backend=backend, dtype=DTYPES[dtype_name]).as_dict()
    r.update(kernel=label, name=cfg.name if isinstance(cfg, AttnConfig) else cfg, seconds=round(time.time() - t0, 2))
    print(f"  {label:>10} {r['name']:>24} {dtype_name} vs {r['backend']:<15} "
          f"{r['tflops_student']:6.1f} vs {r['tflops_ref']:6.1f} TFLOP/s  x{r['ratio']:.2f}", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    ap.add_argument("--quick", action="store_true", help="fp16 only, fewer sweep points")
    ap.add_argument("--no-pytest", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"env": env_info(), "timing": "facourse.bench.time_calls: GPU time, the host's enqueue hidden by a spin",
              "correctness": [], "bench": [], "ladder": [], "sweep": [],
              "autotune": {}, "pytest": None}
    print(json.dumps(result["env"]), flush=True)
    files = ladder_files()
    mods = {p.stem: load(p) for p in files}
    sol_name = files[-1].stem
    sol = mods[sol_name].flash_attention_triton
    result["solution"] = sol_name
    dtypes = ["fp16"] if args.quick else ["fp16", "bf16"]

    def save():
        (out / "step05.json").write_text(json.dumps(result, indent=1))

    # 1. correctness of the solution
    print(f"== correctness of {sol_name}", flush=True)
    for dt in dtypes:
        for name in [*CONFIGS, *EDGE_CASES]:
            row = {"kernel": sol_name, "config": name, "dtype": dt}
            try:
                check_entry_point(sol, name, dtype=DTYPES[dt], expect_lse=True, verbose=False)
                row["ok"] = True
            except Exception as e:  # record and go on: one failure must not hide the others
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
                print(row["error"], flush=True)
            result["correctness"].append(row)
    for stem, mod in mods.items():           # every earlier version on one config it supports
        if stem == sol_name:
            continue
        name = "small" if stem.startswith("v1") else "large"
        try:
            check_entry_point(mod.flash_attention_triton, name, expect_lse=True, verbose=False)
            result["correctness"].append({"kernel": stem, "config": name, "dtype": "fp16", "ok": True})
        except Exception as e:
            result["correctness"].append({"kernel": stem, "config": name, "dtype": "fp16", "ok": False,
                                          "error": f"{type(e).__name__}: {e}"[:2000]})
    save()

    # 2. the solution against FA2 and cuDNN (after a discarded warm-up: the first timings of a
    #    fresh machine read 10-20 % slow while its clocks come up)
    print("== bench: five configs and long", flush=True)
    for _ in range(3):
        bench_row(sol, CONFIGS["large"], "fp16", "FLASH_ATTENTION", sol_name)
    for dt in dtypes:
        for cfg in [*CONFIGS.values(), LONG_CONFIG]:
            for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                try:
                    result["bench"].append(bench_row(sol, cfg, dt, backend, sol_name))
                except Exception as e:
                    result["bench"].append({"name": cfg.name, "dtype": dt, "backend": backend,
                                            "error": f"{type(e).__name__}: {e}"[:500]})
        save()
    print("== sweep", flush=True)
    for dt in dtypes:
        for causal in (False, True):
            for S in (SWEEP[1::2] if args.quick else SWEEP):
                for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                    cfg = sweep_config(S, causal)
                    try:
                        row = bench_row(sol, cfg, dt, backend, sol_name)
                        row.update(S=S, causal=causal)
                        result["sweep"].append(row)
                    except Exception as e:
                        result["sweep"].append({"name": cfg.name, "S": S, "causal": causal, "dtype": dt,
                                                "backend": backend, "error": f"{type(e).__name__}: {e}"[:500]})
            save()

    # 3. the ladder
    print("== ladder", flush=True)
    short = AttnConfig("short", 8, 32, 8, 128, 128, 128, True)
    causal_points = [sweep_config(S, True) for S in SWEEP[3:]]   # where v7's schedule acts
    for stem, mod in mods.items():
        cfgs = [short] if stem.startswith("v1") else [CONFIGS["large"], LONG_CONFIG]
        if stem in list(mods)[-2:]:                              # the solution and the rung before
            cfgs += causal_points
        for cfg in cfgs:
            try:
                result["ladder"].append(bench_row(mod.flash_attention_triton, cfg, "fp16",
                                                  "FLASH_ATTENTION", stem))
            except Exception as e:
                result["ladder"].append({"kernel": stem, "name": cfg.name, "error": f"{type(e).__name__}: {e}"[:500]})
    for stem, mod in mods.items():           # which configs the autotuner picked, per key
        tuned = getattr(mod, "attn_fwd_tuned", None)
        if tuned is not None and hasattr(tuned, "cache"):
            result["autotune"][stem] = {str(k): str(v) for k, v in tuned.cache.items()}
    save()

    # 4. the GPU tier of the tests
    if not args.no_pytest:
        print("== pytest -m gpu tests/", flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                                "tests/"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            log, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            log, rc = f"TIMEOUT after 300 s\n{e.stdout or ''}", -1
        (out / "pytest_gpu.log").write_text(log)
        tail = [ln for ln in log.splitlines() if ln.strip()][-1:] or [""]
        result["pytest"] = {"rc": rc, "summary": tail[0], "seconds": round(time.time() - t0, 1)}
        save()

    # short table, last
    print("\n== summary (TFLOP/s; ratio = t_ref / t_solution)")
    bad = [r for r in result["correctness"] if not r["ok"]]
    print(f"correctness: {len(result['correctness']) - len(bad)}/{len(result['correctness'])} passed"
          + "".join(f"\n  FAIL {r['kernel']} {r['config']} {r['dtype']}" for r in bad))
    print(f"{'config':>24} {'dt':>4} {'ours':>6} {'FA2':>6} {'x':>5} {'cuDNN':>6} {'x':>5}")
    rows = {}
    for r in result["bench"] + result["sweep"]:
        if "error" not in r:
            rows.setdefault((r["name"], r["dtype"]), {})[r["backend"]] = r
    for (name, dt), d in rows.items():
        fa, cu = d.get("FLASH_ATTENTION"), d.get("CUDNN_ATTENTION")
        ours = (fa or cu or next(iter(d.values())))["tflops_student"]  # Sq != Skv: another backend
        print(f"{name:>24} {dt:>4} {ours:6.0f} "
              + (f"{fa['tflops_ref']:6.0f} {fa['ratio']:5.2f} " if fa else " " * 13)
              + (f"{cu['tflops_ref']:6.0f} {cu['ratio']:5.2f}" if cu else ""))
    for r in result["ladder"]:
        if "error" in r:
            print(f"ladder {r['kernel']} {r['name']}: {r['error'][:100]}")
        else:
            print(f"ladder {r['kernel']:>20} {r['name']:>8} {r['tflops_student']:6.0f} TFLOP/s  x{r['ratio']:.2f} FA2")
    if result["pytest"]:
        print(f"pytest -m gpu: rc {result['pytest']['rc']}: {result['pytest']['summary']}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
