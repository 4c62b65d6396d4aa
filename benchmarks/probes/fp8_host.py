"""Step 10's FP8 end-to-end call (v7_fp8_fa3, fp16 in) on `long`, timed with the fp16 solution (v6_hopper_window)
by the three methods of facourse.bench (the course's bench, do_bench, synced events):

* host: where its host time goes, and its quantisation in one launch (v7.ONE_LAUNCH) against three;
* quant: each quantiser kernel alone (do_bench) and its bandwidth against a copy of its bytes, for row tiles a
  program (v7.QUANT_TILES) times warps (v7.QUANT_WARPS); then the end-to-end call as committed against the fastest.

    PYTHONPATH=src:.:solutions/10_attention_variants/ladder python benchmarks/probes/fp8_host.py host|quant [ROUNDS]
"""
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from facourse import bench
from facourse.configs import get_config, make_inputs
from facourse.triton_setup import validate_triton_inputs
import v6_hopper_window as v6
import v7_fp8_fa3 as v7

MODE = sys.argv[1] if sys.argv[1:] else "host"
ROUNDS = int(sys.argv[2]) if sys.argv[2:] else 3
q, k, v = make_inputs(get_config("long", "cuda"), 0, "cuda", torch.float16)
BLOCK_M, BLOCK_N = v7.tiles()[:2]
DEFAULTS = {"ONE_LAUNCH": v7.ONE_LAUNCH, "QUANT_TILES": v7.QUANT_TILES, "QUANT_WARPS": v7.QUANT_WARPS}


def switched(fn, **switches):
    """fn with v7's module switches set for the call, then put back."""
    def call(*a):
        for name, value in switches.items():
            setattr(v7, name, value)
        try:
            return fn(*a)
        finally:
            for name, value in DEFAULTS.items():
                setattr(v7, name, value)
    return call


def e2e(**switches):
    return switched(lambda q, k, v: v7.flash_attention_fp8(q, k, v, causal=False), **switches)


def fp16(q, k, v):
    return v6.flex_attention_triton(q, k, v)


def timing(calls: dict, rounds: int) -> list:
    """Lines: ms per call of each of ``calls`` (the first the fp16 solution) by method, and fp16 / each."""
    print("\n## timing on long (B 2, H 16, S 8192, D 128, non-causal, fp16 in): ms per call by method, fp16 / fp8")
    flush, rows, first = bench.new_flush_buffer(), [], next(iter(calls))
    for r in range(rounds):
        gpu, host = bench.time_calls(calls, 30, flush, 5)
        med = {"bench": {n: statistics.median(t) for n, t in gpu.items()}, **bench.cross_times(calls, flush)}
        for method, ms in med.items():
            line = f"r{r} {method:8} " + "  ".join(f"{n} {ms[n]:.3f} ms" for n in calls) + "   " + \
                   "  ".join(f"{ms[first] / ms[n]:.3f}x ({n})" for n in list(calls)[1:])
            rows.append(line)
            print(line, flush=True)
        print(f"r{r} host us " + "  ".join(f"{n} {statistics.median(h):.0f}" for n, h in host.items()), flush=True)
    return rows


if MODE == "quant":
    from triton.testing import do_bench
    nbytes = {"q": 3 * q.numel(), "k": 3 * k.numel(), "v": 3 * v.numel()}   # fp16 read, e4m3 written
    kernels = {"q": lambda: v7.quantize_rows(q, BLOCK_M, True), "k": lambda: v7.quantize_rows(k, BLOCK_N, True),
               "v": lambda: v7.quantize_v_transposed(v, BLOCK_N)}
    copy_us = do_bench(lambda: q.clone(), warmup=25, rep=200, return_mode="median") * 1e3
    print(f"## quantisers alone (do_bench, median): a copy of q (fp16, {2 * 2 * q.numel() / 1e6:.0f} MB moved) "
          f"{copy_us:.1f} us, {4 * q.numel() / copy_us / 1e3:.0f} GB/s")
    best, best_us = None, float("inf")
    for tiles in (1, 2, 4):
        for warps in (4, 8):
            us = {}
            for name, fn in kernels.items():
                call = switched(fn, QUANT_TILES=tiles, QUANT_WARPS=warps)
                call()
                us[name] = do_bench(call, warmup=25, rep=200, return_mode="median") * 1e3
            total = sum(us.values())
            print(f"v7_fp8_fa3 QUANT_TILES={tiles} QUANT_WARPS={warps}: " + "  ".join(
                f"{n} {t:6.1f} us ({nbytes[n] / t / 1e3:4.0f} GB/s)" for n, t in us.items()) + f"  all {total:6.1f} us",
                flush=True)
            if total < best_us:
                best, best_us = (tiles, warps), total
    print(f"fastest: QUANT_TILES={best[0]} QUANT_WARPS={best[1]}")
    a, b = e2e()(q, k, v), e2e(QUANT_TILES=best[0], QUANT_WARPS=best[1])(q, k, v)
    torch.cuda.synchronize()
    print("outputs equal:", torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), flush=True)
    rows = timing({"fp16 v6": lambda: fp16(q, k, v), "v7_fp8_fa3": lambda: e2e()(q, k, v),
                   f"v7_fp8_fa3 tiles {best[0]} warps {best[1]}":
                   lambda: e2e(QUANT_TILES=best[0], QUANT_WARPS=best[1])(q, k, v)}, ROUNDS)
    print("\nSUMMARY\n" + "\n".join(rows))
    sys.exit(0)

three, one = e2e(), e2e(ONE_LAUNCH=True)
a, b = one(q, k, v), three(q, k, v)
torch.cuda.synchronize()
print("outputs: one launch and three equal:", torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), flush=True)
q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v)
one_launch_quantiser = switched(v7.quantize_qkv, ONE_LAUNCH=True)
stages = {
    "validate_triton_inputs": lambda: validate_triton_inputs(q, k, v, None),
    "require_fp8_gpu": lambda: v7.v5.require_fp8_gpu(q, "v7_fp8_fa3"),
    "quantize_qkv (one launch)": lambda: one_launch_quantiser(q, k, v),
    "quantize_rows q": lambda: v7.quantize_rows(q, BLOCK_M, True),
    "quantize_rows k": lambda: v7.quantize_rows(k, BLOCK_N, True),
    "quantize_v_transposed": lambda: v7.quantize_v_transposed(v, BLOCK_N),
    "run_kernel": lambda: v7.run_kernel(q8, k8, v8t, dq, dk, dv, False, None, q.dtype),
    "v5.outputs": lambda: v7.v5.outputs(q8, k8, v8t, None, q.dtype),
    "v5.descriptors": lambda: v7.v5.descriptors(q8, k8, v8t, a[0], BLOCK_M, BLOCK_N),
    "v7_fp8_fa3 end to end, one launch": lambda: one(q, k, v),
    "v7_fp8_fa3 end to end, three": lambda: three(q, k, v),
    "fp16 solution (v6)": lambda: fp16(q, k, v),
}
spin = int(20_000 * bench.spin_cycles_per_us(torch.cuda.current_device()))   # 20 ms of GPU work ahead
print("\n## host time per call (us, median of 60; the GPU kept busy so that no launch waits)")
for name, fn in stages.items():
    ts = []
    for rep in range(6):
        torch.cuda.synchronize()
        torch.cuda._sleep(spin)
        for _ in range(10):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
    print(f"{name:42} {statistics.median(ts):8.1f} us  (min {min(ts):.1f})", flush=True)

print("\n## cProfile: 40 end-to-end calls (one launch), by own time")
torch.cuda.synchronize()
torch.cuda._sleep(spin * 3)
prof = cProfile.Profile()
prof.enable()
for _ in range(40):
    one(q, k, v)
prof.disable()
torch.cuda.synchronize()
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
print("\n".join(out.getvalue().splitlines()[:45]))

rows = timing({"fp16 v6": lambda: fp16(q, k, v), "v7_fp8_fa3 three": lambda: three(q, k, v),
               "v7_fp8_fa3 one": lambda: one(q, k, v)}, ROUNDS)
print("\nSUMMARY\n" + "\n".join(rows))
