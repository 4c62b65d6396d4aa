"""Step 10's v9_gluon_fp8 (Gluon, FA3's intra-warpgroup overlap) against v7_fp8_fa3 on one GPU: the same quantised
inputs through both kernels (shapes from one tile to 4k, causal and not, ragged, GQA, D 64 and 128), then the
course's bench (bench_fp8: inputs already in e4m3, against cuDNN) and do_bench back to back, kernels alternating.

    PYTHONPATH=src:. python benchmarks/probes/fp8_gluon.py [ROUNDS [NAME=VALUE[:NAME=VALUE] ...]]

Each NAME=VALUE group is one more build of v9 with its module switches set (EARLY_RESCALE, AHEAD_RECORDS, BLOCK_M,
STAGES). Writes $OUT/fp8_gluon.json (the checks and the timings) and prints them.
"""
import json
import os
import sys

sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder"]
import torch  # noqa: E402
import triton  # noqa: E402

import v7_fp8_fa3 as v7  # noqa: E402
import v9_gluon_fp8 as v9  # noqa: E402
from facourse.fp8 import bench_fp8  # noqa: E402
from facourse.configs import get_config, make_inputs  # noqa: E402

SHAPES = [(1, 1, 1, 64, 128, False, 128), (1, 2, 2, 200, 333, False, 128), (2, 4, 4, 1024, 1024, True, 128),
          (1, 2, 2, 300, 1000, True, 128), (1, 2, 2, 1000, 300, True, 128), (2, 8, 2, 4096, 4096, False, 128),
          (1, 4, 4, 2048, 2048, True, 64), (1, 2, 2, 129, 257, False, 64), (1, 2, 2, 5, 1, True, 128)]


class Variant:
    """v9 with module switches set around each call (they reach the kernel as constexprs)."""

    def __init__(self, arg):
        self.name = "v9" + (f"+{arg}" if arg else "")
        self.switches = {n: int(v) for n, v in (a.split("=") for a in arg.split(":") if a)}
        self.quantize_fp8, self.transpose_v = v9.quantize_fp8, v9.transpose_v

    def _set(self):
        saved = {n: getattr(v9, n) for n in self.switches}
        for n, v in self.switches.items():
            setattr(v9, n, type(saved[n])(v))
        return saved

    def run_kernel(self, *a, **kw):
        saved = self._set()
        try:
            return v9.run_kernel(*a, **kw)
        finally:
            for n, v in saved.items():
                setattr(v9, n, v)

    def flash_attention_fp8_prequantized(self, q8, k8, v8t, dq, dk, dv, causal=True):
        return self.run_kernel(q8, k8, v8t, dq, dk, dv, causal, None, torch.float16)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    variants = [Variant(a) for a in ["", *sys.argv[2:]]]
    out = {"gpu": torch.cuda.get_device_name(), "checks": [], "timings": []}
    torch.manual_seed(0)
    ok = True
    for B, Hq, Hkv, Sq, Skv, causal, D in SHAPES:
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, Hkv, Skv, D, device="cuda", dtype=torch.float16) for _ in range(2))
        q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v)
        o7, l7 = v7.run_kernel(q8, k8, v8t, dq, dk, dv, causal, None, torch.float16)
        for var in variants:
            o9, l9 = var.run_kernel(q8, k8, v8t, dq, dk, dv, causal, None, torch.float16)
            torch.cuda.synchronize()
            ok &= report(out, var.name, q, k, v, o7, l7, o9, l9, B, Hq, Hkv, Sq, Skv, causal, D)
    if not ok:
        print("checks failed: no timing")
    else:
        for r in range(rounds):
            for case in ("noncausal_16k", "long", "large", "noncausal_4k"):
                for name, mod in (("v7", v7), *((var.name, var) for var in variants)):
                    time_one(out, r, case, name, mod)
    dest = os.environ.get("OUT", "/tmp")
    with open(os.path.join(dest, "fp8_gluon.json"), "w") as f:
        json.dump(out, f, indent=1)


def report(out, name, q, k, v, o7, l7, o9, l9, B, Hq, Hkv, Sq, Skv, causal, D):
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(Hq // Hkv, 1), v.float().repeat_interleave(Hq // Hkv, 1),
        is_causal=causal) if not (causal and Sq != Skv) else None
    d_o = (o9.float() - o7.float()).abs().max().item()
    fin = torch.isfinite(l7)
    d_l = (l9[fin] - l7[fin]).abs().max().item() if fin.any() else 0.0
    same_inf = bool(torch.equal(torch.isfinite(l9), fin))
    rel = ((o9.float() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
    good = d_o < 2e-2 and d_l < 1e-3 and same_inf and bool(torch.isfinite(o9).all())
    row = dict(kernel=name, shape=[B, Hq, Hkv, Sq, Skv, causal, D], max_abs_o_vs_v7=d_o, max_abs_lse_vs_v7=d_l,
               rel_vs_fp32=rel, ok=good)
    out["checks"].append(row)
    print(f"CHECK {'ok ' if good else 'BAD'} {name} {row['shape']}: |o9-o7| {d_o:.2e} |lse| {d_l:.2e} "
          f"rel {rel:.3e}", flush=True)
    return good


def time_one(out, r, case, name, mod):
    b = bench_fp8(mod.flash_attention_fp8_prequantized, mod.quantize_fp8, case, backend="CUDNN_ATTENTION",
                  transpose_v=mod.transpose_v)
    cfg = get_config(case, "cuda")
    q, k, vv = make_inputs(cfg, 0, "cuda", torch.float16)
    (q8, dq), (k8, dk), (v8, dv) = (mod.quantize_fp8(t) for t in (q, k, vv))
    v8t = mod.transpose_v(v8)
    ms = triton.testing.do_bench(lambda: mod.flash_attention_fp8_prequantized(q8, k8, v8t, dq, dk, dv,
                                                                             causal=cfg.causal))
    tf_db = cfg.flops() / (ms * 1e-3) / 1e12
    out["timings"].append(dict(round=r, case=case, kernel=name, bench_tflops=b.tflops_student, ratio_cudnn=b.ratio,
                               do_bench_tflops=tf_db))
    print(f"BENCH r{r} {case:14s} {name:28s}: {b.tflops_student:6.0f} TFLOP/s (x{b.ratio:.3f} cuDNN), "
          f"do_bench {tf_db:6.0f}", flush=True)


if __name__ == "__main__":
    main()
