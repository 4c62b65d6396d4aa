"""Step 15: where the paged batch's time goes. chunked_p16 timed four ways against FlashAttention-2's varlen
kernel in one process each (the kernels read their tiles and switches at import): v2 paged; the probe's v3
paged (the page size a compile-time constant, with and without the next tile's pages looked up one iteration
ahead); and v2's varlen path on the same batch with its keys gathered into packed rows (no block table: the
ceiling the paging is measured against).

    python benchmarks/probes/serving_paged.py      (GPU)
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONE = r'''
import runpy, statistics, sys
sys.path[:0] = ["src", "."]
import torch
from facourse import serving
from facourse.bench import new_flush_buffer, time_calls
label, path, packed = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
m = runpy.run_path(path, run_name="rung")
c = serving.get_serving_case("chunked_p16", "cuda")
inp = serving.make_serving_inputs(c, 0, "cuda", torch.float16)
k, v, cu_k, max_k = serving.packed_kv(inp)
ref = serving.varlen_reference(True)
q = inp.q.contiguous()
rk, rv = ref.prepare(k, v, q.shape[1])
if packed:
    student = lambda: m["varlen_attention"](inp.q, k, v, inp.cu_seqlens_q, cu_k, inp.max_seqlen_q, max_k, causal=True)
else:
    student = lambda: m["paged_prefill"](*inp)
o_s = student()[0].float()
o_r = ref(q, rk, rv, inp.cu_seqlens_q, cu_k, inp.max_seqlen_q, max_k).float()
gpu, _ = time_calls({"s": student, "r": lambda: ref(q, rk, rv, inp.cu_seqlens_q, cu_k, inp.max_seqlen_q, max_k)},
                    25, new_flush_buffer(), 5)
ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
print(f"{label:>36} {c.flops() / ts / 1e9:6.0f} TFLOP/s vs {c.flops() / tr / 1e9:6.0f}  x{tr / ts:.2f}  "
      f"max|o - ref| {(o_s - o_r).abs().max():.1e}", flush=True)
'''
V2 = "solutions/15_serving/ladder/v2_split_tiles.py"
V3 = "benchmarks/probes/serving_v3_probe.py"
RUNS = [("v2 paged 128,128,8,2", V2, "0", {}),
        ("v3 paged 128,128,8,2 prefetch", V3, "0", {"SERVING_PREFETCH": "1"}),
        ("v3 paged 128,128,8,2 no prefetch", V3, "0", {"SERVING_PREFETCH": "0"}),
        ("v3 paged 128,64,8,3 prefetch", V3, "0", {"SERVING_PREFETCH": "1", "SERVING_TILES": "128,64,8,3"}),
        ("v3 paged 128,32,4,3 prefetch", V3, "0", {"SERVING_PREFETCH": "1", "SERVING_TILES": "128,32,4,3"}),
        ("v2 varlen, keys packed, 128,32,4,3", V2, "1", {}),
        ("v2 varlen, keys packed, 128,128,8,2", V2, "1", {"SERVING_TILES": "128,128,8,2"}),
        ("v3 paged 128,64,8,3 no prefetch", V3, "0", {"SERVING_PREFETCH": "0", "SERVING_TILES": "128,64,8,3"})]

if __name__ == "__main__":
    # ORDER=a,b,...: the rows of RUNS to run, by index, in that order (a row may repeat)
    order = [int(i) for i in os.environ["ORDER"].split(",")] if os.environ.get("ORDER") else range(len(RUNS))
    for label, path, packed, env in (RUNS[i] for i in order):
        subprocess.run([sys.executable, "-c", ONE, label, path, packed], cwd=ROOT, env={**os.environ, **env}, check=False)
