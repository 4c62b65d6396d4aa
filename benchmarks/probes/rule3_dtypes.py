"""Rule 3 (max|out - ref| / max|ref|) of PyTorch's own results, the rule's yardstick, on a CPU: the forward's o and
the backward's dq, dk, dv in each 16-bit dtype, on every configuration and edge case at the CPU sizes, over
fresh seeds. A limit below what the framework itself reaches fails correct kernels at random.

    PYTHONPATH=src python benchmarks/probes/rule3_dtypes.py [SEEDS]     # default 20 seeds a case
"""
import sys

import torch

from facourse.backward import attention_grads, draw_dout, torch_grads
from facourse.configs import CONFIGS, EDGE_CASES, get_config, make_inputs
from facourse.reference import reference_attention, torch_attention
from facourse.rule import max_abs

SEEDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def rel(mine, ref) -> float:
    ref = ref.double()
    return max_abs(mine.double() - ref) / max(max_abs(ref), 1e-30)


print(f"# rule 3 of PyTorch's own results against float64, {SEEDS} seeds a case (CPU sizes); torch {torch.__version__}")
print(f"{'case':<12s} {'dtype':<9s} {'o':>9s} {'dq':>9s} {'dk':>9s} {'dv':>9s}   (the worst over the seeds)")
for dtype in (torch.float16, torch.bfloat16):
    top = [0.0] * 4
    for name in [*CONFIGS, *EDGE_CASES]:
        cfg = get_config(name, "cpu")
        worst = [0.0] * 4
        for seed in range(SEEDS):
            q, k, v = make_inputs(cfg, seed, "cpu", dtype)
            do = draw_dout(cfg, seed, "cpu", dtype)
            o_ref = reference_attention(q, k, v, cfg.causal)[0]
            errs = [rel(torch_attention(q, k, v, cfg.causal), o_ref)]
            errs += [rel(m, r) for m, r in zip(torch_grads(q, k, v, do, cfg.causal), attention_grads(q, k, v, do, cfg.causal))]
            worst = [max(a, b) for a, b in zip(worst, errs)]
        top = [max(a, b) for a, b in zip(top, worst)]
        print(f"{name:<12s} {str(dtype)[6:]:<9s} " + " ".join(f"{x:9.2e}" for x in worst), flush=True)
    print(f"{'all':<12s} {str(dtype)[6:]:<9s} " + " ".join(f"{x:9.2e}" for x in top), flush=True)
