"""A/B on the GPU: step 10's v6 window kernel as built against its builds with -D flags (the arguments, several
joined by ":"; default HFA_STAGES=3, a K/V ring 3 deep), checked (a build that fails a check is reported and not
timed), then timed in the same process, alternating, with the course's bench, do_bench and plain events
(facourse.bench)."""
import json, os, sys, statistics
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch
from facourse import bench
from facourse.cuda_build import load_hopper_rung
from facourse.steps import step_dir
from facourse.variants import bench_variant, check_variant
import v6_hopper_window as v6

s07 = step_dir("07")
exts = {"as built": v6.extension()}
for flags in sys.argv[1:] or ["HFA_STAGES=3"]:
    exts[flags] = load_hopper_rung("fa10_v6_" + flags.replace("=", "_").replace(":", "_").lower(),
                                   [v6.KERNEL, s07 / "fa_binding.cpp"],
                                   extra_cuda_cflags=["-D" + f for f in flags.split(":")])
out = {"gpu": torch.cuda.get_device_name(), "checks": {}, "rows": []}
for name, ext in list(exts.items()):
    v6._extension = ext
    try:
        for case in ("window", "window_ragged", "window_1", "window_beyond", "window_empty_rows", "mqa_window", "causal"):
            for dt in (torch.float16, torch.bfloat16):
                check_variant(v6.flex_attention_triton, case, device="cuda", dtype=dt, verbose=False)
        out["checks"][name] = "ok"
    except Exception as err:          # a build that computes something else is reported, not timed
        out["checks"][name] = f"{type(err).__name__}: {str(err)[:300]}"
        print(f"{name}: check failed: {out['checks'][name]}", flush=True)
        del exts[name]
bench.CROSS_CHECK = True
for rnd in range(3):
    for name, ext in exts.items():
        v6._extension = ext
        for case in ("window1024_8k", "window1024_16k"):
            r = bench_variant(v6.flex_attention_triton, case)
            x = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
            out["rows"].append({"round": rnd, "kernel": name, "case": case, "tflops": r.tflops_student,
                                "ratio": r.ratio, **x})
            print(f"{rnd} {name:>24} {case:>15} {r.tflops_student:5.0f} TFLOP/s  bench {r.ratio:.3f}  "
                  f"do_bench {x['do_bench']:.3f}  events {x['events']:.3f}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_window.json"), "w"), indent=1)
