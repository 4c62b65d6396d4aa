"""Step 08's v4_hopper on the GPU, outside the ladder runner: its build against builds with -D flags and against
schedules (S=section,order: v4_hopper.SCHEDULE), each checked on a few cases in both modes, then timed against
cuDNN's backward, alternating, two rounds; or with --full its gradient checks on every configuration, the
deterministic mode's bits over three runs, and v4, its deterministic mode and v3 timed against cuDNN.

    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_variants.py V4_PROBE_NO_REDUCE=1   # the dQ add's cost
    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_variants.py S=4,1 V4_ROTATE=0:S=4,0 FILE=old.cu  # schedules, flags, sources
    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_variants.py --full
    CFGS=large,causal_8k DET=1 ...       # the configurations timed; DET=1: each variant's deterministic mode too, DET=only: that alone
    CLOCKS=1 ...                         # nvidia-smi samples the SM clock and the power every 50 ms: each timing's means
"""
import os
import sys
from pathlib import Path

sys.path[:0] = ["src", ".", "solutions/08_backward/ladder"]
import torch  # noqa: E402

import v3_tma_causal_split as v3  # noqa: E402
import v4_hopper as v4  # noqa: E402
from facourse.backward import check_gradients  # noqa: E402
from facourse.bench import bench_attention  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, SWEEP_4K_16K, get_config, make_inputs  # noqa: E402
from facourse.cuda_build import load_hopper_rung  # noqa: E402
from probe_common import summary, timed_rounds  # noqa: E402

LINES: list[str] = []
CFGS = os.environ.get("CFGS", ",".join(["large", *SWEEP_4K_16K])).split(",")


DEFAULT_SCHEDULE = v4.SCHEDULE


def use(ext, sched) -> None:
    if ext is not None:
        v4._extension = ext
    v4.SCHEDULE = sched or DEFAULT_SCHEDULE


def bench(fns: dict, rounds: int) -> None:
    def run(fn, ext, sched=None):
        def go(cfg):
            use(ext, sched)
            return bench_attention(fn, cfg, backend="CUDNN_ATTENTION", mode="backward")
        return go
    timed_rounds({name: run(*spec) for name, spec in fns.items()}, CFGS, rounds, LINES)


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
    base = v4.extension()
    fns = {"v4": (v4.flash_attention_train, base, None)}
    for variant in flags:  # -D flags, a schedule and another kernel source, joined by ":"
        parts = variant.split(":")
        defs = [x for x in parts if "=" in x and not x.startswith(("S=", "FILE="))]
        sched = [tuple(int(y) for y in x[2:].split(",")) for x in parts if x.startswith("S=")]
        src = [Path(x[5:]).resolve() for x in parts if x.startswith("FILE=")] or [v4.KERNEL]
        tag = "_".join(defs + [p.stem for p in src if p != v4.KERNEL]).replace("=", "_").lower()
        ext = base if not tag else load_hopper_rung("fa08_v4_" + tag, [src[0], v4.BINDING], [v4.KERNEL.parent],
                                                    extra_cuda_cflags=[f"-D{d}" for d in defs])
        fns[variant] = (v4.flash_attention_train, ext, sched[0] if sched else None)
    det = {k + "/det": (v4.flash_attention_train_deterministic, *rest) for k, (_, *rest) in fns.items()}
    fns = {"1": fns | det, "only": det}.get(os.environ.get("DET"), fns)
    for name, (fn, ext, sched) in fns.items():  # a schedule that drops or repeats work fails here, not in a timing
        use(ext, sched)
        for case in ("medium", "mqa", "ragged", "ragged_noncausal", "asymmetric", "noncausal", "d64"):
            try:
                check_gradients(fn, case, device="cuda", dtype=torch.float16, verbose=False)
                print(f"CHECK ok   {name} {case}", flush=True)
            except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                print(f"CHECK FAIL {name} {case}: {str(e)[:300]}", flush=True)
    bench(fns, int(os.environ.get("ROUNDS", "2")))


if __name__ == "__main__":
    full() if sys.argv[1:] == ["--full"] else variants(sys.argv[1:])
    summary(LINES)
    print(torch.cuda.get_device_name())
