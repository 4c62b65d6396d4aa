"""Why facourse.bench keeps the GPU busy before each timed call: the same kernels timed both ways.

    PYTHONPATH=src:. python -m benchmarks.timing_probe [--out DIR]

For step 05's solution and SDPA's FLASH_ATTENTION on `large` and causal 4k (fp16, bf16) it
measures how long Python takes to enqueue one call (GPU idle before it) and how long the L2 flush
runs on the GPU, then times the pair with facourse.bench.time_calls twice without the spin
(``hide_host=False``) and twice with it, 25 rounds each. When the enqueue outlasts the flush, the
GPU waits inside the timed window and the first two ratios read low and scatter; the spin removes
that wait and leaves the kernels' own times. Writes DIR/timing_probe.json; prints a table last.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from facourse.bench import new_flush_buffer, sdpa_reference, time_calls  # noqa: E402
from facourse.configs import CONFIGS, SWEEP, make_inputs  # noqa: E402
from facourse.steps import solution_path  # noqa: E402
from benchmarks.rungs import env_info  # noqa: E402

SHAPES = [CONFIGS["large"], SWEEP["causal_4k"]]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def host_enqueue_us(f, flush, n=20) -> float:
    """Median time Python takes to return from one call while the GPU has nothing queued."""
    ts = []
    for _ in range(n):
        flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    path = solution_path("05")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref, _ = sdpa_reference("FLASH_ATTENTION")
    flush = new_flush_buffer()
    result = {"env": env_info(), "solution": path.stem, "reference": "FLASH_ATTENTION", "rounds": 25, "rows": []}
    for cfg in SHAPES:
        for dt, dtype in DTYPES.items():
            q, k, v = make_inputs(cfg, 0, "cuda", dtype)
            calls = {"ours": lambda: mod.flash_attention_triton(q, k, v, causal=cfg.causal),
                     "FA2": lambda: ref(q, k, v, causal=cfg.causal)}
            for f in calls.values():          # compile and load before anything is timed
                f()
            host = {name: host_enqueue_us(f, flush) for name, f in calls.items()}
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            flush.zero_()
            b.record()
            b.synchronize()
            flush_us = a.elapsed_time(b) * 1000
            for hide in (False, True, False, True):
                gpu, _ = time_calls(calls, 25, flush, hide_host=hide)
                med = {n: statistics.median(t) for n, t in gpu.items()}
                dec = {n: [round(x, 4) for x in statistics.quantiles(t, n=10)[::8]] for n, t in gpu.items()}
                row = dict(config=cfg.name, dtype=dt, hide_host=hide, host_enqueue_us=host, flush_us=flush_us,
                           ms=med, p10_p90_ms=dec, ratio=med["FA2"] / med["ours"],
                           tflops_ours=cfg.flops() / med["ours"] / 1e9)
                result["rows"].append(row)
                print(f"{cfg.name:>18} {dt} spin={hide!s:>5}  ours {med['ours']:.4f} ms {dec['ours']}  "
                      f"FA2 {med['FA2']:.4f} ms  x{row['ratio']:.3f}", flush=True)
            del q, k, v
    (out / "timing_probe.json").write_text(json.dumps(result, indent=1))
    print("\n== enqueue (us), flush (us), ratio t_FA2 / t_ours without the spin (two runs), with it (two runs)")
    for i in range(0, len(result["rows"]), 4):
        rs = result["rows"][i:i + 4]
        h = rs[0]["host_enqueue_us"]
        print(f"{rs[0]['config']:>18} {rs[0]['dtype']}  enqueue ours {h['ours']:4.0f} FA2 {h['FA2']:4.0f}  "
              f"flush {rs[0]['flush_us']:4.0f}  without {rs[0]['ratio']:.2f} {rs[2]['ratio']:.2f}  "
              f"with {rs[1]['ratio']:.2f} {rs[3]['ratio']:.2f}")


if __name__ == "__main__":
    main()
