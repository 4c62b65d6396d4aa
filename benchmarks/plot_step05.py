"""Draw the step-05 figure from a measured JSON of run_gpu.py (no numbers are typed in here).

    python benchmarks/plot_step05.py benchmarks/results/2026-11-22_h100_step05.json
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

path = Path(sys.argv[1])
d = json.loads(path.read_text())
fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, causal in zip(axes, (False, True)):
    rows = [r for r in d["sweep"] if "error" not in r and r["causal"] == causal and r["dtype"] == "float16"]
    S = sorted({r["S"] for r in rows})
    get = lambda be, key: [next(r[key] for r in rows if r["S"] == s and r["backend"] == be) for s in S]
    ax.plot(S, get("FLASH_ATTENTION", "tflops_student"), "o-", label=f"course Triton kernel ({d['solution']})")
    ax.plot(S, get("FLASH_ATTENTION", "tflops_ref"), "s-", label="SDPA FLASH_ATTENTION (FA2)")
    ax.plot(S, get("CUDNN_ATTENTION", "tflops_ref"), "^-", label="SDPA CUDNN_ATTENTION")
    ax.set_xscale("log", base=2)
    ax.set_xticks(S, [f"{s // 1024}k" if s >= 1024 else str(s) for s in S])
    ax.set_xlabel("sequence length (D=128, B*H*S = 16*16k, fp16)")
    ax.set_title(f"{'causal' if causal else 'non-causal'}")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("TFLOP/s")
axes[0].legend(fontsize=8)
e = d["env"]
fig.suptitle(f"{e['gpu']}, torch {e['torch']}, triton {e['triton']}, {e['date']}", fontsize=9)
fig.tight_layout()
out = path.with_suffix(".png")
fig.savefig(out, dpi=110)
print(out)
