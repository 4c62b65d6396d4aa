"""What the variant probes share (run as scripts: this folder is on their path): rounds of timings against cuDNN,
nvidia-smi's clock and power samples over each timing, and the summary of their BENCH lines."""
import os
import subprocess
import threading
import time


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


def summary(lines: list[str]) -> None:
    """The BENCH lines as one row per configuration and variant: TFLOP/s and the ratio to cuDNN, round by round."""
    rows: dict = {}
    for line in lines:
        _, _, name, cfg, tflops, *_, ratio = line.split()
        rows.setdefault((cfg, name), []).append(f"{float(tflops):4.0f} TFLOP/s x{ratio}")
    for (cfg, name), cells in sorted(rows.items()):
        print(f"{cfg:14} {name:30} " + "  ".join(cells))


def timed_rounds(runs: dict, cfgs: list[str], rounds: int, lines: list[str], width: int = 8) -> None:
    """Each run (name -> fn(cfg) -> facourse.bench.BenchResult against cuDNN) on each configuration, round after round:
    a BENCH line per timing, kept in ``lines`` (for summary) and printed; CLOCKS=1 adds each timing's clock and power."""
    stop, read = clock_samples() if os.environ.get("CLOCKS") else (None, None)
    for r in range(rounds):
        for cfg in cfgs:
            for name, run in runs.items():
                t0 = time.time()
                res = run(cfg)
                clk = " SM %.0f MHz %.0f W" % read(t0, time.time()) if read else ""
                lines.append(f"BENCH r{r} {name} {cfg} {res.tflops_student:.1f} vs {res.ratio:.3f}")
                print(f"BENCH r{r} {name:{width}} {cfg:14} {res.tflops_student:6.0f} TFLOP/s vs cuDNN "
                      f"{res.tflops_ref:6.0f}: x{res.ratio:.3f}{clk}", flush=True)
    if stop:
        stop()


def kernel_table(run, label: str, reps: int = 5) -> None:
    """GPU time per call of ``run`` (warmed up) for each kernel it launches: torch.profiler, CUDA activity, no L2 flush."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / reps, e.count // reps) for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(r[1] for r in rows)
    print(f"== {label}: GPU time per backward {total:.0f} us", flush=True)
    for key, t, n in sorted(rows, key=lambda r: -r[1]):
        print(f"   {t:9.1f} us {100 * t / total:5.1f}%  x{n}  {key[:90]}", flush=True)
