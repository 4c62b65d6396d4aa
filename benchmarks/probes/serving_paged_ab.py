"""Step 15: v2_paged and the probe's v3 (serving_v3_probe.py: the page size a compile-time constant) timed in
one process, interleaved (one time_calls rotation), on chunked_p16 against FlashAttention-2's varlen kernel:
does the constant page size gain what serving_paged.py's separate processes showed?

    SERVING_PREFETCH=0 python benchmarks/probes/serving_paged_ab.py      (GPU)
"""
import os
import runpy
import statistics
import sys

sys.path[:0] = ["src", "."]
import torch  # noqa: E402

from facourse import serving  # noqa: E402
from facourse.bench import new_flush_buffer, time_calls  # noqa: E402

os.environ.setdefault("SERVING_PREFETCH", "0")
# ONLY=probe: the probe's v3 alone beside the reference (v2 never loaded); PROBE_FIRST=1: the probe loaded first
only_probe = os.environ.get("ONLY") == "probe"
if os.environ.get("PROBE_FIRST") == "1" or only_probe:
    os.environ["SERVING_TILES"] = "128,64,8,3"
    probe = runpy.run_path("benchmarks/probes/serving_v3_probe.py", run_name="probe")
    del os.environ["SERVING_TILES"]
    v2 = None if only_probe else runpy.run_path("solutions/15_serving/ladder/v2_split_tiles.py", run_name="v2")
else:
    v2 = runpy.run_path("solutions/15_serving/ladder/v2_split_tiles.py", run_name="v2")
    os.environ["SERVING_TILES"] = "128,64,8,3"
    probe = runpy.run_path("benchmarks/probes/serving_v3_probe.py", run_name="probe")
c = serving.get_serving_case("chunked_p16", "cuda")
inp = serving.make_serving_inputs(c, 0, "cuda", torch.float16)
k, v, cu_k, max_k = serving.packed_kv(inp)
ref = serving.varlen_reference(True)
q = inp.q.contiguous()
rk, rv = ref.prepare(k, v, q.shape[1])
calls = {"probe_v3": lambda: probe["paged_prefill"](*inp),
         "reference": lambda: ref(q, rk, rv, inp.cu_seqlens_q, cu_k, inp.max_seqlen_q, max_k)}
if v2 is not None:
    calls["v2_paged"] = lambda: v2["paged_prefill"](*inp)
for f in calls.values():
    f()
gpu, _ = time_calls(calls, 25, new_flush_buffer(), 5)
tr = statistics.median(gpu["reference"])
for n, ts in gpu.items():
    t = statistics.median(ts)
    print(f"{n:>22} {t:7.3f} ms {c.flops() / t / 1e9:6.0f} TFLOP/s  x{tr / t:.2f}", flush=True)
