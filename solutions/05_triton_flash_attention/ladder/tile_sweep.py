"""Measure v6's tile table on a GPU, in one call: every candidate tile shape on every graded shape.

    PYTHONPATH=src:. python solutions/05_triton_flash_attention/ladder/tile_sweep.py [--out DIR]

Candidates are v6 (host-side tensor descriptors) with tiles forced through ``FORCE_TILES``, and
for comparison v4 (pointers) and v5 (descriptors built in the kernel) with one fixed autotuner
config. Shapes: `large` and the 4k-16k sweep points of facourse.configs (D = 128, H = 16,
causal and not), fp16 and bf16. Each shape draws its inputs once; every round times SDPA's
FLASH_ATTENTION and each candidate once, in an order that rotates from round to round, with L2
flushed and the GPU kept busy before every call, CUDA events around it (facourse.bench.time_calls,
the method of facourse.bench_attention, with several candidates per round so the inputs are drawn
once). Each output is compared with FA2's.
Writes DIR/step05_tiles.json and prints a table last (ratio = t_FA2 / t_candidate).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from benchmarks.rungs import env_info, load_py as load  # noqa: E402
from facourse.bench import TIMING, new_flush_buffer, sdpa_reference, time_calls  # noqa: E402
from facourse.configs import CONFIGS, SWEEP, SWEEP_4K_16K, make_inputs  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# (label, ladder file, tiles (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg), shapes or None = all)
BASELINE_SHAPES = ["large", "causal_4k", "noncausal_8k"]
CANDIDATES = [
    ("v4 64x64/4w/3s", "v4_autotuned", (64, 64, 4, 3, None), BASELINE_SHAPES),
    ("v5 64x64/4w/3s", "v5_tma", (64, 64, 4, 3, None), BASELINE_SHAPES),
    ("v5 64x64/4w/2s", "v5_tma", (64, 64, 4, 2, None), BASELINE_SHAPES),
    ("v6 64x64/4w/2s", "v6_host_tma", (64, 64, 4, 2, None), None),
    ("v6 64x64/4w/1s/r128", "v6_host_tma", (64, 64, 4, 1, 128), None),
    ("v6 64x32/4w/2s", "v6_host_tma", (64, 32, 4, 2, None), None),
    ("v6 64x32/4w/3s", "v6_host_tma", (64, 32, 4, 3, None), None),
    ("v6 128x64/8w/2s/r128", "v6_host_tma", (128, 64, 8, 2, 128), None),
    ("v6 128x64/8w/3s", "v6_host_tma", (128, 64, 8, 3, None), None),
    ("v6 128x128/8w/2s", "v6_host_tma", (128, 128, 8, 2, None), None),
    ("v6 128x128/8w/3s", "v6_host_tma", (128, 128, 8, 3, None),
     ["noncausal_4k", "noncausal_8k", "noncausal_16k"]),
]


SHAPES = [CONFIGS["large"]] + [SWEEP[n] for n in SWEEP_4K_16K]


class _Fixed:
    """Stands in for an autotuned kernel: launches ``kernel`` with one fixed config."""

    def __init__(self, kernel, tiles):
        self.kernel, self.tiles = kernel, tiles

    def __getitem__(self, grid):
        bm, bn, w, s, r = self.tiles
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
        if r is not None:
            meta["maxnreg"] = r
        g = grid(meta) if callable(grid) else grid
        return lambda *a, **kw: self.kernel[g](*a, **kw, **meta)


def make_fn(stem: str, tiles):
    mod = load(HERE / f"{stem}.py")  # a fresh module per candidate: its own forced tiles
    if hasattr(mod, "FORCE_TILES"):
        mod.FORCE_TILES = tiles
    else:
        mod.attn_fwd_tuned = _Fixed(mod.attn_fwd, tiles)
    return mod.flash_attention_triton


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dtypes", default="fp16,bf16")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = env_info()
    print(json.dumps(env), flush=True)
    result = {"env": env, "timing": TIMING, "reference": "FLASH_ATTENTION", "rounds": args.rounds,
              "candidates": [{"label": c[0], "file": c[1], "tiles": c[2]} for c in CANDIDATES], "rows": []}
    ref, _ = sdpa_reference("FLASH_ATTENTION")
    fns = {label: make_fn(stem, tiles) for label, stem, tiles, _ in CANDIDATES}
    flush = new_flush_buffer()
    for dt in args.dtypes.split(","):
        for cfg in SHAPES:
            t0 = time.time()
            q, k, v = make_inputs(cfg, 0, "cuda", DTYPES[dt])
            o_ref = ref(q, k, v, causal=cfg.causal)
            group = {"FA2": ref}
            for label, _, _, shapes in CANDIDATES:
                if shapes is not None and cfg.name not in shapes:
                    continue
                row = {"label": label, "config": cfg.name, "dtype": dt}
                try:
                    tc = time.time()
                    o, _ = fns[label](q, k, v, causal=cfg.causal)      # compiles on first use
                    torch.cuda.synchronize()
                    row["first_call_s"] = round(time.time() - tc, 2)
                    err = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
                    row["rel_err_vs_fa2"] = err
                    if not err < 2e-2:
                        raise AssertionError(f"output differs from FA2's: relative error {err:.3g}")
                    group[label] = fns[label]
                except Exception as e:  # record and go on
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                    print(label, cfg.name, dt, row["error"], flush=True)
                result["rows"].append(row)
            calls = {label: (lambda f=f: f(q, k, v, causal=cfg.causal)) for label, f in group.items()}
            med = {label: statistics.median(t) for label, t in time_calls(calls, args.rounds, flush, warmup=3)[0].items()}
            flops = cfg.flops()
            for row in result["rows"]:
                if row["config"] == cfg.name and row["dtype"] == dt and "error" not in row and "ms" not in row:
                    row.update(ms=med[row["label"]], ms_fa2=med["FA2"], tflops=flops / med[row["label"]] / 1e9,
                               tflops_fa2=flops / med["FA2"] / 1e9, ratio=med["FA2"] / med[row["label"]])
            print(f"{cfg.name} {dt}: {time.time() - t0:.1f} s", flush=True)
            del q, k, v, o_ref
            (out / "step05_tiles.json").write_text(json.dumps(result, indent=1))

    # short table, last: one line per shape, the ratio of each candidate
    labels = [c[0] for c in CANDIDATES]
    print("\n== ratio t_FA2 / t_candidate (TFLOP/s of FA2 in the first column)")
    print(f"{'shape':>22} {'dt':>4} {'FA2':>4} " + " ".join(f"{i:>5}" for i in range(len(labels))))
    keys = []
    for r in result["rows"]:
        if (r["config"], r["dtype"]) not in keys:
            keys.append((r["config"], r["dtype"]))
    for name, dt in keys:
        rows = {r["label"]: r for r in result["rows"] if r["config"] == name and r["dtype"] == dt}
        fa = next((r["tflops_fa2"] for r in rows.values() if "tflops_fa2" in r), 0)
        cells = []
        for lab in labels:
            r = rows.get(lab)
            cells.append("    -" if r is None else "  err" if "error" in r else f"{r['ratio']:5.2f}")
        print(f"{name:>22} {dt:>4} {fa:4.0f} " + " ".join(cells))
    for i, lab in enumerate(labels):
        print(f"  {i}: {lab}")


if __name__ == "__main__":
    main()
