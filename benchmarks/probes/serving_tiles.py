"""Step 15: v2_split_tiles' tiles swept on the two perf cases against FlashAttention-2's varlen kernel
(facourse.serving.bench_serving), one process per tile set (the kernel reads SERVING_TILES at import).

    python benchmarks/probes/serving_tiles.py "128,64,8,3" "128,128,8,2" ...     (GPU)
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONE = r'''
import runpy, sys
sys.path[:0] = ["src", "."]
from facourse.serving import bench_serving
m = runpy.run_path("solutions/15_serving/ladder/v2_split_tiles.py", run_name="v2")
for case, fn in (("prefill_mix", m["varlen_attention"]), ("chunked_p16", m["paged_prefill"])):
    r = bench_serving(fn, case)
    print(f"{sys.argv[1]:>14} {case:>12} {r.tflops_student:6.0f} TFLOP/s vs {r.tflops_ref:6.0f}  x{r.ratio:.2f}", flush=True)
'''

if __name__ == "__main__":
    for tiles in sys.argv[1:]:
        env = {**os.environ, "SERVING_TILES": tiles}
        subprocess.run([sys.executable, "-c", ONE, tiles], cwd=ROOT, env=env, check=False)
