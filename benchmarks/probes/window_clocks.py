"""Why do_bench reads step 10's window kernel lower: each kernel timed back to back for 20, 100 and 500 ms
(do_bench's rep) and with the course's interleaved bench, the SM clock and power sampled every 50 ms."""
import json, os, subprocess, sys, time, statistics
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch
from triton.testing import do_bench
from facourse.bench import new_flush_buffer, time_calls
from facourse.configs import make_inputs
from facourse.variants import PERF_TILES, flex_reference, perf_case, reference_block_mask
import v6_hopper_window as v6

OUT = os.environ.get("OUT", "/tmp")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=open(f"{OUT}/clocks.csv", "w"))
cfg, mask = perf_case("window1024_8k")
q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout="bhsd")
bm = reference_block_mask(mask, 1, 1, cfg.Sq, cfg.Skv, *PERF_TILES, device="cuda")
flex = flex_reference(mask, cfg.B, cfg.Hq, cfg.Sq, cfg.Skv)
calls = {"v6": lambda: v6.flex_attention_triton(q, k, v, mask=mask, block_mask=bm), "flex": lambda: flex(q, k, v)}
for f in calls.values():
    f(); f()
torch.cuda.synchronize()
rows = []
time.sleep(1.0)
for rep in (20, 100, 500, 100, 20):
    for name, f in calls.items():
        t0 = time.time()
        ms = do_bench(f, warmup=25, rep=rep, return_mode="median")
        rows.append({"method": f"do_bench rep {rep}", "kernel": name, "ms": ms, "t0": t0, "t1": time.time()})
        time.sleep(0.5)
for rnd in range(2):
    t0 = time.time()
    gpu, _ = time_calls(calls, 20, new_flush_buffer())
    for name in calls:
        rows.append({"method": "course bench", "kernel": name, "ms": statistics.median(gpu[name]), "t0": t0, "t1": time.time()})
    time.sleep(0.5)
time.sleep(0.2)
smi.terminate(); smi.wait()
samples = []
for line in open(f"{OUT}/clocks.csv"):
    try:
        ts, clk, pw = [x.strip() for x in line.split(",")]
        samples.append((time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1]), float(clk), float(pw)))
    except Exception:
        pass
for r in rows:
    s = [(c, p) for t, c, p in samples if r["t0"] <= t <= r["t1"]]
    r["sm_mhz"] = statistics.mean(c for c, _ in s) if s else None
    r["watts"] = statistics.mean(p for _, p in s) if s else None
    r["samples"] = len(s)
    print(f"{r['method']:>18} {r['kernel']:>5} {r['ms']:.4f} ms  SM {r['sm_mhz'] or 0:.0f} MHz  {r['watts'] or 0:.0f} W  (n={r['samples']})")
by = {}
for r in rows:
    by.setdefault(r["method"], {})[r["kernel"]] = r["ms"]
for m, d in by.items():
    print(f"ratio flex/v6 {m}: {d['flex'] / d['v6']:.3f}")
json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(f"{OUT}/probe_clocks.json", "w"), indent=1)
