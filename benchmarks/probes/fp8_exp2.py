"""A/B on the GPU: v7_fp8_fa3 as committed and with its module switches set as each argument says (NAME=VALUE,
a variant each; a bare NAME means NAME=1; FORCE_TILES=64,128,4,2 sets v7's tiles, MAXNREG=168 its register cap with
them; default EXP2_FMA, P's exp2 on the FMA pipes instead of the MUFU unit, and EXP2_FMA=8 puts only the last eighth
of each tile's columns there; LAZY_RESCALE, the conditional rescale; INT8_QK=1 or 2, Q and K in int8; ROWSUM_MMA at commit 7df4a72, P's row sums on
the tensor cores; PLAIN_DESCALES at commit 4e3c70f, dk by a plain global load; several switches joined by ":" make
one variant), checked on the FP8 kind's cases, then timed alternating in one process (course bench, do_bench,
events) on CASES (default noncausal_16k, long and large, inputs in e4m3) and, unless E2E=0, end to end on long.

    [CASES=large,causal_2k,...] [E2E=0] PYTHONPATH=src:. python benchmarks/probes/fp8_exp2.py [NAME[=VALUE] ...]"""
import itertools, json, os, sys
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch
from facourse import bench
from facourse.bench import bench_attention
from facourse.fp8 import bench_fp8, check_fp8
from facourse.kinds.fp8 import KIND
import v7_fp8_fa3 as v7

def value(text):
    """A switch's value: an int, or a tuple of ints written a,b,c (FORCE_TILES=64,128,4,2)."""
    return tuple(int(x) for x in text.split(",")) if "," in text else int(text)


VARIANTS = [[(a.split("=")[0], value(a.split("=")[1]) if "=" in a else 1) for a in arg.split(":")]
            for arg in sys.argv[1:] or ["EXP2_FMA"]]
NAMES = {name for variant in VARIANTS for name, _ in variant}
for name in NAMES:
    assert name == "FORCE_TILES" or isinstance(getattr(v7, name), (bool, int)), name
SWITCH = "_".join(f"{n}{'-'.join(map(str, v)) if isinstance(v, tuple) else v}" for variant in VARIANTS for n, v in variant)
out = {"gpu": torch.cuda.get_device_name(), "switch": SWITCH, "checks": {}, "rows": []}


def use(variant):
    """None: every switch as committed; else its (name, value) pairs set, the others as committed."""
    for name in NAMES:
        setattr(v7, name, DEFAULTS[name])
    for name, value in variant or ():
        setattr(v7, name, value if not isinstance(DEFAULTS[name], bool) else bool(value))
    return ":".join(f"{n}={v}" for n, v in variant) if variant else "committed"


def quantizer():
    """v7.quantize_fp8 for bench_fp8, which quantises q, k and v in that order: under INT8_QK q and k in int8."""
    calls = itertools.count()
    return lambda x: v7.quantize_rows(x, v7.tiles()[1], False, int8=next(calls) % 3 < 2 and bool(v7.INT8_QK))


CASES = os.environ.get("CASES", "noncausal_16k,long,large").split(",")   # the prequantised timings' configs
E2E = os.environ.get("E2E", "1") == "1"                                   # 0: no end-to-end timing on long
DEFAULTS = {name: getattr(v7, name) for name in NAMES}
for variant in [None, *VARIANTS]:
    label = use(variant)
    for dt in (torch.float16, torch.bfloat16):
        for case in KIND.check_cases(None, None, None):
            r = check_fp8(v7.flash_attention_fp8, case, device="cuda", dtype=dt, verbose=False)
            out["checks"][f"{label} {case} {dt}"] = r
print("checks passed:", len(out["checks"]), {k: round(v.get("rmse", 0), 6) for k, v in out["checks"].items() if "outliers" in k and "float16" in k})
use(None)
bench.CROSS_CHECK = True
for rnd in range(2):
    for variant in [None, *VARIANTS]:
        label = use(variant)
        for case in CASES:
            r = bench_fp8(v7.flash_attention_fp8_prequantized, quantizer(), case, backend="CUDNN_ATTENTION",
                          transpose_v=v7.transpose_v)
            x = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
            out["rows"].append({"round": rnd, "variant": label, "case": case, "mode": "e4m3", "tflops": r.tflops_student, "ratio": r.ratio, **x})
            print(f"{rnd} {label:>30} {case:>14} e4m3 {r.tflops_student:5.0f} TFLOP/s  cuDNN {r.ratio:.3f}x  do_bench {x['do_bench']:.3f}x  events {x['events']:.3f}x", flush=True)
        if not E2E:
            continue
        r = bench_attention(v7.flash_attention_fp8, "long", backend="CUDNN_ATTENTION")
        x = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
        out["rows"].append({"round": rnd, "variant": label, "case": "long", "mode": "e2e", "tflops": r.tflops_student, "ratio": r.ratio, **x})
        print(f"{rnd} {label:>30} {'long':>14} e2e  {r.tflops_student:5.0f} TFLOP/s  cuDNN {r.ratio:.3f}x  do_bench {x['do_bench']:.3f}x  events {x['events']:.3f}x", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"probe_{SWITCH.lower()}.json"), "w"), indent=1)
