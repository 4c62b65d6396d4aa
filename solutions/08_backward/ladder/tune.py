"""Step 08's measurements (a support file, no rung): full-size correctness, the v3 tile sweep, and
the backward timed against PyTorch SDPA's FLASH_ATTENTION backend (FlashAttention-2) in one process.

    PYTHONPATH=src:. python solutions/08_backward/ladder/tune.py [--no-sweep] [--out DIR]

1. Correctness at full size, fp16 and bf16: every Triton rung's gradients against an fp32
   autograd reference, within twice SDPA FLASH's own error + 1e-3 (docs/DESIGN.md's rule, applied
   to dq, dk, dv), on `large` with B = 1 and on one sweep point per shape class.
2. (unless --no-sweep) v3's candidates, one kernel at a time (dK/dV, dQ, and dK/dV with the fused
   atomic dQ), on one configuration per shape class of v3.TILES, fp16: the winners are printed
   as a table to paste into v3.TILES and are used for step 3 (both kernels in one launch).
4. (--one-launch, alone) v3's two kernels launched one after the other against one grid.
3. The backward alone: forward once with requires_grad inputs, then
   torch.autograd.grad(o, (q, k, v), do, retain_graph=True) timed with facourse.bench.time_calls
   (L2 flushed, interleaved rounds, median of 25), for SDPA FLASH (enable_gqa) and each rung, on
   `large` and the 4k-16k sweep points, fp16 and bf16; forward + backward too. TFLOP/s count
   the backward as 2.5x the forward's FLOPs (2.5 * cfg.flops()).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import v2_two_kernel as v2  # noqa: E402
import v3_tma_causal_split as v3  # noqa: E402

from facourse.backward import check_gradients_of  # noqa: E402
from facourse.bench import new_flush_buffer, time_calls  # noqa: E402
from facourse.configs import CONFIGS, SWEEP, make_inputs, scaled  # noqa: E402

RUNGS = {"v2": v2, "v3": v3}
# The second run's candidates. The first run also had dK/dV (32, 128, 4, 3), (64, 128, 4, 2),
# (128, 128, 8, 2), dQ (64, 128, 4, 2), (128, 64, 4, 3) and fused (64, 128, 8, 2), (32, 128, 4, 3),
# (64, 64, 4, 3): each slower than a kept candidate of its kind (by 2% to 4x), so they were dropped.
DKDV = [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 1),
        (64, 128, 8, 4), (128, 64, 8, 3), (64, 64, 4, 4), (128, 128, 8, 3)]
DQ = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (128, 32, 4, 3),
      (128, 64, 8, 4), (64, 64, 4, 4), (128, 32, 4, 4), (128, 128, 8, 3)]
FUSED = [(64, 128, 8, 3)]
CLASSES = {"causal_short": CONFIGS["large"], "causal_long": SWEEP["causal_8k"], "full": SWEEP["noncausal_8k"]}
TIMED = ["large", "causal_4k", "causal_8k", "causal_16k", "noncausal_4k", "noncausal_8k", "noncausal_16k"]


def log(*a):
    print(*a, flush=True)


def cfg_of(name):
    return CONFIGS[name] if name in CONFIGS else SWEEP[name]


def sdpa(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def inputs(cfg, dtype, seed=0):
    q, k, v = make_inputs(cfg, seed, "cuda", dtype)
    do = torch.randn_like(q)
    return [t.requires_grad_() for t in (q, k, v)], do


# ----------------------------------------------------------------------------- 1. correctness
def check(dtype):
    cases = [scaled(CONFIGS["large"], B=1), scaled(SWEEP["causal_4k"], B=1, Hq=4, Hkv=4),
             scaled(SWEEP["noncausal_4k"], B=1, Hq=4, Hkv=4)]
    for cfg in cases:
        q, k, v = make_inputs(cfg, 1, "cuda", dtype, "bshd")          # non-contiguous views
        do = torch.randn(cfg.B, cfg.Sq, cfg.Hq, cfg.D, device="cuda", dtype=dtype).transpose(1, 2)
        for name, mod in RUNGS.items():
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o = mod.flash_attention_train(qg, kg, vg, causal=cfg.causal)
            got = torch.autograd.grad(o, (qg, kg, vg), do)
            lines = check_gradients_of(o, *got, q, k, v, do, cfg.causal, config=cfg.name)
            log(f"check ok {name} {cfg.name} B={cfg.B} Hq={cfg.Hq} {str(dtype)[6:]}: " + "; ".join(lines[1:]))


# ----------------------------------------------------------------------------- 2. tile sweep
def sweep(rounds=10):
    flush = new_flush_buffer()
    table = {}
    for cls, cfg in CLASSES.items():
        (q, k, v), do = inputs(cfg, torch.float16)
        o, lse = common.attention_forward(q.detach(), k.detach(), v.detach(), cfg.causal)
        flops = 2.5 * cfg.flops()
        res = {}
        for part, cands, fused in (("dkdv", DKDV, False), ("dq", DQ, False), ("fused", FUSED, True)):
            for c in cands:
                tiles = {"dkdv": c, "dq": c, "fused_dq": fused}
                v3.FORCE_TILES, v3.PARTS = tiles, (("dkdv",) if part != "dq" else ("dq",))
                try:
                    fn = (lambda: v3.attention_backward(q, k, v, o, lse, do, cfg.causal))
                    fn()
                    torch.cuda.synchronize()
                    gpu, _ = time_calls({"x": fn}, rounds, flush, warmup=2)
                    ms = statistics.median(gpu["x"])
                except Exception as e:  # out of shared memory, etc.
                    ms = float("inf")
                    log(f"  {cls} {part} {c}: failed: {str(e).splitlines()[0][:100]}")
                res[(part, c)] = ms
                log(f"  {cls} {part:5s} {c}: {ms:.3f} ms")
        best_dkdv = min(DKDV, key=lambda c: res[("dkdv", c)])
        best_dq = min(DQ, key=lambda c: res[("dq", c)])
        best_fused = min(FUSED, key=lambda c: res[("fused", c)])
        two = res[("dkdv", best_dkdv)] + res[("dq", best_dq)]
        one = res[("fused", best_fused)]
        log(f"{cls}: two-kernel {two:.3f} ms ({best_dkdv} + {best_dq}, {flops / two / 1e9:.0f} TFLOP/s), "
            f"fused atomic dQ {one:.3f} ms ({best_fused}, {flops / one / 1e9:.0f} TFLOP/s), kernels only")
        table[cls] = ({"dkdv": best_fused, "dq": best_dq, "fused_dq": True} if one < two else
                      {"dkdv": best_dkdv, "dq": best_dq, "fused_dq": False, "one_launch": True})
    v3.FORCE_TILES, v3.PARTS = None, ("dkdv", "dq")
    v3.TILES.update(table)
    log("TILES = " + json.dumps(table))
    return table


# ----------------------------------------------------------------------------- 3. timing
def timing(names, dtypes, rounds=25):
    flush = new_flush_buffer()
    rows = []
    for name in names:
        cfg = cfg_of(name)
        for dtype in dtypes:
            (q, k, v), do = inputs(cfg, dtype)
            outs = {"sdpa": sdpa(q, k, v, cfg.causal)}
            for rn, mod in RUNGS.items():
                outs[rn] = mod.flash_attention_train(q, k, v, causal=cfg.causal)
            bwd = {n: (lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)) for n, o in outs.items()}
            gpu, _ = time_calls(bwd, rounds, flush)
            fwd_fns = {"sdpa": lambda: sdpa(q, k, v, cfg.causal)}
            for rn, mod in RUNGS.items():
                fwd_fns[rn] = (lambda mod=mod: mod.flash_attention_train(q, k, v, causal=cfg.causal))
            both = {n: (lambda f=f: torch.autograd.grad(f(), (q, k, v), do)) for n, f in fwd_fns.items()}
            gpu2, _ = time_calls(both, rounds, flush)
            del outs, bwd
            t = {n: statistics.median(x) for n, x in gpu.items()}
            t2 = {n: statistics.median(x) for n, x in gpu2.items()}
            fb, ff = 2.5 * cfg.flops(), 3.5 * cfg.flops()
            for n in t:
                rows.append(dict(config=name, dtype=str(dtype)[6:], impl=n, bwd_ms=t[n], bwd_tflops=fb / t[n] / 1e9,
                                 bwd_ratio=t["sdpa"] / t[n], fb_ms=t2[n], fb_tflops=ff / t2[n] / 1e9,
                                 fb_ratio=t2["sdpa"] / t2[n]))
            log(" ".join(f"{name} {str(dtype)[6:]} {r['impl']}: bwd {r['bwd_tflops']:.0f} ({r['bwd_ratio']:.2f}x)"
                         for r in rows[-len(t):]))
    return rows


# ----------------------------------------------------------------------------- 4. one launch
def one_launch(names, rounds=25):
    """v3's two kernels (dK/dV, then dQ) against both in one grid (v3.bwd_one_launch), fp16."""
    flush = new_flush_buffer()
    cfg = scaled(CONFIGS["large"], B=1)
    q, k, v = make_inputs(cfg, 1, "cuda", torch.float16, "bshd")
    do = torch.randn_like(q)
    o, lse = common.attention_forward(q, k, v, True)
    v3.FORCE_TILES = dict(v3.pick_tiles(cfg.Sq, cfg.Skv, cfg.D, True), one_launch=True)
    log("one launch check (large, B=1)",
        check_gradients_of(o, *v3.attention_backward(q, k, v, o, lse, do, True), q, k, v, do, True)[1:])
    for name in names:
        cfg = cfg_of(name)
        (q, k, v), do = inputs(cfg, torch.float16)
        q, k, v = (t.detach() for t in (q, k, v))
        o, lse = common.attention_forward(q, k, v, cfg.causal)
        v3.FORCE_TILES = None
        base = dict(v3.pick_tiles(cfg.Sq, cfg.Skv, cfg.D, cfg.causal))
        calls = {}
        for key, tiles in (("two", base), ("one", dict(base, one_launch=True))):
            def call(tiles=tiles):
                v3.FORCE_TILES = tiles
                return v3.attention_backward(q, k, v, o, lse, do, cfg.causal)
            calls[key] = call
        gpu, _ = time_calls(calls, rounds, flush)
        t = {n: statistics.median(x) for n, x in gpu.items()}
        log(f"{name}: two launches {t['two']:.3f} ms, one launch {t['one']:.3f} ms ({t['two'] / t['one']:.3f}x)")
    v3.FORCE_TILES = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--configs", default=",".join(TIMED))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--one-launch", action="store_true", help="only the one-launch experiment")
    a = ap.parse_args()
    if a.one_launch:
        return one_launch(a.configs.split(","))
    t0 = time.time()
    log(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    table = None if a.no_sweep else sweep()
    log(f"[{time.time() - t0:.0f}s] sweep done")
    if not a.no_check:
        for dt in (torch.float16, torch.bfloat16):
            check(dt)
    log(f"[{time.time() - t0:.0f}s] checks done")
    rows = timing(a.configs.split(","), (torch.float16, torch.bfloat16))
    log(f"[{time.time() - t0:.0f}s] timing done")
    with open(os.path.join(a.out, "step08_tune.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "table": table,
                   "rows": rows}, f, indent=1)
    log(f"\n{'config':14s} {'dtype':8s} {'impl':5s} {'bwd ms':>8s} {'TFLOP/s':>8s} {'vs FA2':>7s} "
        f"{'f+b ms':>8s} {'TFLOP/s':>8s} {'vs FA2':>7s}")
    for r in rows:
        log(f"{r['config']:14s} {r['dtype']:8s} {r['impl']:5s} {r['bwd_ms']:8.3f} {r['bwd_tflops']:8.0f} "
            f"{r['bwd_ratio']:6.2f}x {r['fb_ms']:8.3f} {r['fb_tflops']:8.0f} {r['fb_ratio']:6.2f}x")


if __name__ == "__main__":
    main()
