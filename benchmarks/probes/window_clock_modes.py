"""Why step 10's window kernel reads a lower ratio to compiled FlexAttention under do_bench than under the course's
bench: each kernel timed back to back (do_bench's pattern: L2 cleared, then the call, no sync) with and without a
spin kernel between the clear and the call, and interleaved with the other as the course's bench does; NVML samples
the SM clock every ~2 ms in a thread, averaged over each timing. Prints one line per (case, pattern, kernel)."""
import os, statistics, sys, threading, time
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch
from facourse.bench import spin_cycles_per_us, new_flush_buffer
from facourse.configs import make_inputs
from facourse.variants import flex_reference, perf_case, reference_block_mask, PERF_TILES
import v6_hopper_window as v6

clock = []
def sample(stop):
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    while not stop.is_set():
        clock.append((time.perf_counter(), pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)))
        time.sleep(0.002)

def run(calls, order, n, spin_us):
    flush = new_flush_buffer()
    spin = int(spin_us * spin_cycles_per_us(torch.cuda.current_device()))
    times = {k: [] for k in order}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ev = []
    for i in range(n):
        for name in order:
            flush.zero_()
            if spin:
                torch.cuda._sleep(spin)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); calls[name](); b.record()
            ev.append((name, a, b))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for name, a, b in ev:
        times[name].append(a.elapsed_time(b))
    mhz = [c for t, c in clock if t0 <= t <= t1]
    return {k: statistics.median(v) for k, v in times.items()}, (statistics.mean(mhz) if mhz else 0.0)

stop = threading.Event()
threading.Thread(target=sample, args=(stop,), daemon=True).start()
for case in ("window1024_8k", "window1024_16k"):
    cfg, mask = perf_case(case)
    q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout="bhsd")
    ref = flex_reference(mask, cfg.B, cfg.Hq, cfg.Sq, cfg.Skv)
    bm = reference_block_mask(mask, 1, 1, cfg.Sq, cfg.Skv, *PERF_TILES, device="cuda")
    calls = {"v6": lambda: v6.flex_attention_triton(q, k, v, mask=mask, block_mask=bm), "flex": lambda: ref(q, k, v)}
    for f in calls.values():
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    for rnd in range(2):
        for pattern, interleaved, spin in (("back to back", False, 0), ("back to back + spin 300 us", False, 300),
                                           ("interleaved", True, 0), ("interleaved + spin 300 us", True, 300)):
            if interleaved:
                t, mhz = run(calls, list(calls), 150, spin)
                res = {n: (t[n], mhz) for n in calls}
            else:
                res = {}
                for n in calls:
                    t, mhz = run(calls, [n], 300, spin)
                    res[n] = (t[n], mhz)
            print(f"{rnd} {case:>15} {pattern:>27}  v6 {res['v6'][0]:.4f} ms ({res['v6'][1]:.0f} MHz)  "
                  f"flex {res['flex'][0]:.4f} ms ({res['flex'][1]:.0f} MHz)  ratio {res['flex'][0] / res['v6'][0]:.3f}x",
                  flush=True)
stop.set()
