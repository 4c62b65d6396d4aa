"""A/B on the GPU: v7_fp8_fa3 as committed and with one of its module switches on (the argument: EXP2_FMA, P's exp2
on the FMA pipes instead of the MUFU unit, by default; LAZY_RESCALE, the conditional rescale), checked on the FP8
kind's cases, then timed alternating in one process (course bench, do_bench, events)."""
import json, os, sys
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch
from facourse import bench
from facourse.bench import bench_attention
from facourse.fp8 import bench_fp8, check_fp8
from facourse.kinds.fp8 import KIND
import v7_fp8_fa3 as v7

SWITCH = sys.argv[1] if sys.argv[1:] else "EXP2_FMA"
assert isinstance(getattr(v7, SWITCH), bool), SWITCH
out = {"gpu": torch.cuda.get_device_name(), "switch": SWITCH, "checks": {}, "rows": []}
for fma in (False, True):
    setattr(v7, SWITCH, fma)
    for dt in (torch.float16, torch.bfloat16):
        for case in KIND.check_cases(None, None, None):
            r = check_fp8(v7.flash_attention_fp8, case, device="cuda", dtype=dt, verbose=False)
            out["checks"][f"{fma} {case} {dt}"] = r
print("checks passed:", len(out["checks"]), {k: round(v.get("rmse", 0), 6) for k, v in out["checks"].items() if "outliers" in k and "float16" in k})
bench.CROSS_CHECK = True
for rnd in range(2):
    for fma in (False, True):
        setattr(v7, SWITCH, fma)
        for case in ("noncausal_16k", "long", "large"):
            r = bench_fp8(v7.flash_attention_fp8_prequantized, v7.quantize_fp8, case, backend="CUDNN_ATTENTION")
            x = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
            out["rows"].append({"round": rnd, "fma": fma, "case": case, "mode": "e4m3", "tflops": r.tflops_student, "ratio": r.ratio, **x})
            print(f"{rnd} {SWITCH}={fma!s:5} {case:>14} e4m3 {r.tflops_student:5.0f} TFLOP/s  cuDNN {r.ratio:.3f}x  do_bench {x['do_bench']:.3f}x  events {x['events']:.3f}x", flush=True)
        r = bench_attention(v7.flash_attention_fp8, "long", backend="CUDNN_ATTENTION")
        x = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
        out["rows"].append({"round": rnd, "fma": fma, "case": "long", "mode": "e2e", "tflops": r.tflops_student, "ratio": r.ratio, **x})
        print(f"{rnd} {SWITCH}={fma!s:5} {'long':>14} e2e  {r.tflops_student:5.0f} TFLOP/s  cuDNN {r.ratio:.3f}x  do_bench {x['do_bench']:.3f}x  events {x['events']:.3f}x", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"probe_{SWITCH.lower()}.json"), "w"), indent=1)
