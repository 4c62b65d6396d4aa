"""Step 08's v4_hopper on the GPU, outside the ladder runner: its build against builds with -D flags (each timed
against cuDNN's backward, alternating, two rounds), or with --full its gradient checks on every configuration,
the deterministic mode's bits over three runs, and v4, its deterministic mode and v3 timed against cuDNN.

    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_variants.py V4_PROBE_NO_REDUCE=1   # the dQ add's cost
    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_variants.py --full
    CFGS=large,causal_8k ...                                                          # the configurations timed
"""
import os
import sys

sys.path[:0] = ["src", ".", "solutions/08_backward/ladder"]
import torch  # noqa: E402

import v3_tma_causal_split as v3  # noqa: E402
import v4_hopper as v4  # noqa: E402
from facourse.backward import check_gradients  # noqa: E402
from facourse.bench import bench_attention  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, SWEEP_4K_16K, get_config, make_inputs  # noqa: E402
from facourse.cuda_build import load_hopper_rung  # noqa: E402

CFGS = os.environ.get("CFGS", ",".join(["large", *SWEEP_4K_16K])).split(",")


def bench(fns: dict, rounds: int) -> None:
    for r in range(rounds):
        for cfg in CFGS:
            for name, (fn, ext) in fns.items():
                if ext is not None:
                    v4._extension = ext
                res = bench_attention(fn, cfg, backend="CUDNN_ATTENTION", mode="backward")
                print(f"BENCH r{r} {name:8} {cfg:14} {res.tflops_student:6.0f} TFLOP/s vs cuDNN {res.tflops_ref:6.0f}: "
                      f"x{res.ratio:.3f}", flush=True)


def full() -> None:
    base = v4.extension()
    for dt in (torch.float16, torch.bfloat16):
        for name in [*CONFIGS, *EDGE_CASES]:
            for fn in (v4.flash_attention_train, v4.flash_attention_train_deterministic):
                try:
                    check_gradients(fn, name, device="cuda", dtype=dt, verbose=False)
                    print(f"CHECK ok   {fn.__name__} {name} {dt}", flush=True)
                except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                    print(f"CHECK FAIL {fn.__name__} {name} {dt}: {str(e)[:600]}", flush=True)
    cfg = get_config("large", "cuda")
    q, k, v = make_inputs(cfg, 0, "cuda", torch.float16)
    do = torch.randn_like(q)
    for det in (True, False):
        outs = []
        for _ in range(3):
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o = v4.flash_attention_train(qq, kk, vv, cfg.causal, None, det)
            outs.append(torch.autograd.grad(o, (qq, kk, vv), do))
        same = all(torch.equal(a, b) for r in outs[1:] for a, b in zip(outs[0], r))
        print(f"DETERMINISM deterministic={det}: 3 runs bitwise equal: {same}", flush=True)
    bench({"v4": (v4.flash_attention_train, base), "v4det": (v4.flash_attention_train_deterministic, base),
           "v3": (v3.flash_attention_train, None)}, 1)


def variants(flags: list[str]) -> None:
    fns = {"v4": (v4.flash_attention_train, v4.extension())}
    for flag in flags:
        ext = load_hopper_rung("fa08_v4_" + flag.replace("=", "_").lower(), [v4.KERNEL, v4.BINDING], [v4.KERNEL.parent],
                               extra_cuda_cflags=[f"-D{flag}"])
        fns[flag] = (v4.flash_attention_train, ext)
    bench(fns, int(os.environ.get("ROUNDS", "2")))


if __name__ == "__main__":
    full() if sys.argv[1:] == ["--full"] else variants(sys.argv[1:])
    print(torch.cuda.get_device_name())
