"""A/B on the GPU: step 10's v8_hopper_fp8 as committed against builds with one compile-time switch flipped
(-D flags: HFA_PINGPONG=0, HFA_STAGES=3, HFA_OVERLAP=0, V8_PROBE_NO_EXCHANGE), each pair timed back to back
on `long` (inputs already in e4m3, the course's bench against cuDNN). With --one: a single launch of the
committed build on `long` after a warm-up, for Nsight Compute:

    PYTHONPATH=src:. python benchmarks/probes/v8_variants.py HFA_PINGPONG=0 HFA_STAGES=3
    ncu --kernel-name regex:fp8_kernel --launch-skip 2 --launch-count 1 --metrics regex:sm__inst_executed_pipe_.* \\
        python benchmarks/probes/v8_variants.py --one
"""
import sys

sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch  # noqa: E402

import v8_hopper_fp8 as v8  # noqa: E402
from facourse.configs import get_config, make_inputs  # noqa: E402
from facourse.cuda_build import load_hopper_rung  # noqa: E402
from facourse.fp8 import bench_fp8  # noqa: E402

if sys.argv[1:] == ["--one"]:
    q, k, v = make_inputs(get_config("long", "cuda"), 0, "cuda", torch.float16)
    (q8, dq), (k8, dk), (x8, dv) = (v8.quantize_fp8(t) for t in (q, k, v))
    vt = x8.transpose(-1, -2).contiguous()
    for _ in range(3):
        v8.flash_attention_fp8_prequantized(q8, k8, vt, dq, dk, dv, causal=False)
    torch.cuda.synchronize()
    sys.exit(0)
base = v8.extension()
for flag in sys.argv[1:]:
    ext = load_hopper_rung("fa10_v8_" + flag.lower().replace("=", "_"), [v8.KERNEL, v8.BINDING], [v8.KERNEL.parent],
                           extra_cuda_cflags=["-D" + flag])
    for name, e in (("committed", base), (flag, ext)):
        v8._extension = e
        r = bench_fp8(v8.flash_attention_fp8_prequantized, v8.quantize_fp8, "long", backend="CUDNN_ATTENTION")
        print(f"{name:>24} long {r.tflops_student:6.0f} TFLOP/s", flush=True)
    v8._extension = base
