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
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path[:0] = ["src", ".", "solutions/08_backward/ladder"]
import torch  # noqa: E402

import v3_tma_causal_split as v3  # noqa: E402
import v4_hopper as v4  # noqa: E402
from facourse.backward import check_gradients  # noqa: E402
from facourse.bench import bench_attention  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, SWEEP_4K_16K, get_config, make_inputs  # noqa: E402
from facourse.cuda_build import load_hopper_rung  # noqa: E402

LINES: list[str] = []
CFGS = os.environ.get("CFGS", ",".join(["large", *SWEEP_4K_16K])).split(",")


DEFAULT_SCHEDULE = v4.SCHEDULE


def use(ext, sched) -> None:
    if ext is not None:
        v4._extension = ext
    v4.SCHEDULE = sched or DEFAULT_SCHEDULE


def clock_samples():
    """(stop, read): nvidia-smi sampling the SM clock and the power every 50 ms; read(t0, t1): their means over
    [t0, t1] (a timing's window: the reference's calls, interleaved with the variant's, are in it too)."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    rows: list = []

    def pump():  # a thread: the timings go on while it reads
        for line in smi.stdout:
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]" where a card does not report one: skip the sample, keep sampling
                continue
            rows.append((time.time(), mhz, watts))
    threading.Thread(target=pump, daemon=True).start()

    def read(t0: float, t1: float):
        got = [r for r in rows if t0 <= r[0] <= t1]
        return (sum(r[1] for r in got) / len(got), sum(r[2] for r in got) / len(got)) if got else (0.0, 0.0)
    return smi.terminate, read


def bench(fns: dict, rounds: int) -> None:
    stop, read = clock_samples() if os.environ.get("CLOCKS") else (None, None)
    for r in range(rounds):
        for cfg in CFGS:
            for name, (fn, ext, *sched) in fns.items():
                use(ext, sched[0] if sched else None)
                t0 = time.time()
                res = bench_attention(fn, cfg, backend="CUDNN_ATTENTION", mode="backward")
                clk = " SM %.0f MHz %.0f W" % read(t0, time.time()) if read else ""
                LINES.append(f"BENCH r{r} {name} {cfg} {res.tflops_student:.1f} vs {res.ratio:.3f}")
                print(f"BENCH r{r} {name:8} {cfg:14} {res.tflops_student:6.0f} TFLOP/s vs cuDNN {res.tflops_ref:6.0f}: "
                      f"x{res.ratio:.3f}{clk}", flush=True)
    if stop:
        stop()


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
        for case in ("medium", "mqa", "ragged", "asymmetric", "noncausal", "d64"):
            try:
                check_gradients(fn, case, device="cuda", dtype=torch.float16, verbose=False)
                print(f"CHECK ok   {name} {case}", flush=True)
            except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                print(f"CHECK FAIL {name} {case}: {str(e)[:300]}", flush=True)
    bench(fns, int(os.environ.get("ROUNDS", "2")))


def summary(lines: list[str]) -> None:
    """The BENCH lines as one row per configuration and variant: TFLOP/s and the ratio to cuDNN, round by round."""
    rows: dict = {}
    for line in lines:
        _, _, name, cfg, tflops, *_, ratio = line.split()
        rows.setdefault((cfg, name), []).append(f"{float(tflops):4.0f} TFLOP/s x{ratio}")
    for (cfg, name), cells in sorted(rows.items()):
        print(f"{cfg:14} {name:30} " + "  ".join(cells))


if __name__ == "__main__":
    full() if sys.argv[1:] == ["--full"] else variants(sys.argv[1:])
    summary(LINES)
    print(torch.cuda.get_device_name())
