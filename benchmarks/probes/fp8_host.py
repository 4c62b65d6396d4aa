"""Step 10's FP8 end-to-end call (v7_fp8_fa3, fp16 in): where its host time goes, and its quantisation in one
launch (v7.ONE_LAUNCH) against three (quantize_rows twice, quantize_v_transposed), timed with the fp16 solution
(v6_hopper_window) on `long` by the three methods of facourse.bench (the course's bench, do_bench, synced events).

    PYTHONPATH=src:.:solutions/10_attention_variants/ladder python benchmarks/probes/fp8_host.py [ROUNDS]
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

ROUNDS = int(sys.argv[1]) if sys.argv[1:] else 3
q, k, v = make_inputs(get_config("long", "cuda"), 0, "cuda", torch.float16)
BLOCK_M, BLOCK_N = v7.tiles()[:2]


def e2e(one_launch):
    def call(q, k, v):
        v7.ONE_LAUNCH = one_launch
        try:
            return v7.flash_attention_fp8(q, k, v, causal=False)
        finally:
            v7.ONE_LAUNCH = False
    return call


three, one = e2e(False), e2e(True)


def fp16(q, k, v):
    return v6.flex_attention_triton(q, k, v)


a, b = one(q, k, v), three(q, k, v)
torch.cuda.synchronize()
print("outputs: one launch and three equal:", torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), flush=True)
q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v)


def one_launch_quantiser(q, k, v):
    v7.ONE_LAUNCH = True
    try:
        return v7.quantize_qkv(q, k, v)
    finally:
        v7.ONE_LAUNCH = False


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

print("\n## timing on long (B 2, H 16, S 8192, D 128, non-causal, fp16 in): ms per call by method, and fp16 / fp8")
flush = bench.new_flush_buffer()
calls = {"fp16 v6": lambda: fp16(q, k, v), "v7_fp8_fa3 three": lambda: three(q, k, v),
         "v7_fp8_fa3 one": lambda: one(q, k, v)}
rows = []
for r in range(ROUNDS):
    gpu, host = bench.time_calls(calls, 30, flush, 5)
    med = {"bench": {n: statistics.median(t) for n, t in gpu.items()}, **bench.cross_times(calls, flush)}
    for method, ms in med.items():
        line = f"r{r} {method:8} " + "  ".join(f"{n} {ms[n]:.3f} ms" for n in calls) + "   " + \
               "  ".join(f"{ms['fp16 v6'] / ms[n]:.3f}x ({n})" for n in list(calls)[1:])
        rows.append(line)
        print(line, flush=True)
    print(f"r{r} host us " + "  ".join(f"{n} {statistics.median(h):.0f}" for n, h in host.items()), flush=True)
print("\nSUMMARY\n" + "\n".join(rows))
