"""Step 08's v4_hopper backward kernel by kernel (torch.profiler, CUDA activity): GPU time per backward of the
zeroing, v3's preprocess, the main kernel and dQ's conversion, on large and at non-causal 4k and 16k, both modes.
With --one CONFIG [FLAG=VALUE...]: one backward after a warm-up (of a build with those -D flags), for Nsight
Compute to read the main kernel's counters.

    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_profile.py      # on an H100/H200
    PYTHONPATH=src:. ncu --clock-control none -k regex:bwd_kernel -s 3 -c 1 --section SpeedOfLight \\
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \\
        python benchmarks/probes/v4_bwd_profile.py --one noncausal_16k
"""
import sys

import torch

sys.path[:0] = ["src", ".", "solutions/08_backward/ladder"]
import v4_hopper as v4  # noqa: E402

from facourse.configs import get_config, make_inputs  # noqa: E402
from probe_common import kernel_table  # noqa: E402


def backward_of(name: str, deterministic: bool):
    """A function running one backward of `name` through v4's autograd entry point, warmed up."""
    cfg = get_config(name, "cuda")
    q, k, v = (t.requires_grad_() for t in make_inputs(cfg, 0, "cuda", torch.float16))
    o = v4.flash_attention_train(q, k, v, cfg.causal, None, deterministic)
    do = torch.randn_like(o)
    run = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    return run


def by_kernel(name: str, deterministic: bool, reps: int = 5) -> None:
    kernel_table(backward_of(name, deterministic), f"{name} deterministic={deterministic}", reps)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        if sys.argv[3:]:
            from facourse.cuda_build import load_hopper_rung
            v4._extension = load_hopper_rung("fa08_v4_" + "_".join(sys.argv[3:]).replace("=", "_").lower(),
                                             [v4.KERNEL, v4.BINDING], [v4.KERNEL.parent],
                                             extra_cuda_cflags=[f"-D{d}" for d in sys.argv[3:]])
        backward_of(sys.argv[2], False)()
        torch.cuda.synchronize()
    else:
        for cfg in ("large", "noncausal_4k", "noncausal_16k"):
            for det in (False, True):
                by_kernel(cfg, det)
    print(torch.cuda.get_device_name())
