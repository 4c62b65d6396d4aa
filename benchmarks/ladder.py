"""One runner for every step's solution ladder: build, check, time, write one JSON, print a table.

    PYTHONPATH=src:. python -m benchmarks.ladder STEP [--only RUNGS] [--quick] [--out DIR]
    PYTHONPATH=src:. python -m benchmarks.ladder 06 --sanitize [--only v6_fa2_tiles_lazy] [--checks small,ragged]
    PYTHONPATH=src:. python -m benchmarks.ladder 12 [--only RUNGS] [--quick] [--cpu-smoke]

STEP is 05 to 12; what it runs comes from solutions/NN_*/step.toml (facourse.steps):
- the solution rung: checked (facourse.check_entry_point, with lse) on the five configurations
  and every edge case in fp16 and bf16, then timed with facourse.bench_attention against SDPA's
  FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends on the five, `long` and the manifest's sweep
  (facourse.configs.SWEEP: 512-16k or 4k-16k, causal and not), fp16 and bf16;
- every other rung: its one `check` (default `large`) and its `bench` list (default `large`,
  `long`) in fp16, against the step's reference backend and FA2.
Step 08's manifest says `mode = "backward"`: its rungs are training entry points, checked by their
gradients (facourse.backward.check_gradients) and timed by their backward alone
(facourse.bench_attention mode="backward", FLOPs 2.5x the forward's); the solution is also timed
forward + backward (mode="train": rows marked "mode": "train") on `large`, `long` and the sweep.
Step 09's manifest says `mode = "decode"`: its rungs are paged decodes, checked on the cases of
facourse.decode (check_paged_decode; the solution on every case in fp16 and bf16) and timed with
facourse.decode.bench_decode on its perf cases (B x seq_len of 64 x 8k, 16 x 32k, 1 x 128k, pages of
16 and 64) against SDPA on the same K/V stored contiguously; rows report GB/s of K/V read and the
fraction of a device-to-device copy's rate (env "copy_gbps", measured once per run).
Step 10's manifest says `mode = "variant"`: its rungs are flex_attention_triton(q, k, v, mask=,
score_mod=, block_mask=), checked on facourse.variants.VARIANT_CASES (the solution on every case in
fp16 and bf16) and timed on its perf cases (a 1024 window at 8k and 16k against compiled
FlexAttention, causal 8k against SDPA; both sides given their block mask built once) and `long`; its
FP8 rung (`entry_point = "flash_attention_fp8"`) is checked by its error bound (check_fp8) and timed
on inputs already in FP8 (bench_fp8) against SDPA in fp16.
Step 12's manifest says `mode = "ring"`: its rungs are ring_attention(q, k, v, causal=, scale=, group=),
one rank's part of attention over a sequence split across ranks (facourse.ring). Each rung runs in a
world of 2 spawned ranks, one GPU each, NCCL (NVLink multicast off in every rank), loaded by path in
each: checked on the shapes of every case of facourse.ring.RING_CASES in fp16 and bf16 (rank 0 checks
the gathered rows against the reference with facourse.check_attention), then timed on causal 64k and
128k (B 1, H 16, D 128, fp16): each call after a barrier, CUDA events on both ranks, the slower rank's
time. The reference is the same block kernel (step 05's solution) over the whole sequence on one GPU,
timed once in the first world; rows add the speedup over it, the efficiency (speedup / 2), per rank
the compute time and the wait for the next shard after it at every ring step (ring_common.mark; ≈ 0
when the transfer is hidden), and one shard's transfer timed alone. Fewer than 2 GPUs: it says so and
exits 2. --cpu-smoke runs the same path on 2 CPU ranks (gloo, tiny shapes): the runner's own test.
Triton rungs are loaded from their file; CUDA rungs are built with facourse.cuda_build's
load_cuda_extension (rung .cu + the step's fa_binding.cpp; sm_90a for step 07), all at once in a
process pool (a Python rung that calls CUDA builds it itself on its first call: step 10's
v6_hopper_window, step 07's kernel with a sliding window, on an H100/H200). Each rung then runs in its own process under --timeout (a hung kernel costs that
rung, not the run). --quick: fp16 only, the 4k-16k points only. --sanitize runs compute-sanitizer
(memcheck, racecheck, synccheck) over the checks of one CUDA rung (default: the solution) and
writes the tools' reports instead.

Writes DIR/<date>_<gpu>_stepNN.json in the one results schema (SCHEMA below; read by
benchmarks/tables.py and facourse.results) after every rung, and prints a short table last.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import importlib.util
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from facourse.configs import CONFIGS, EDGE_CASES, SWEEP, AttnConfig, get_config  # noqa: E402
from facourse.steps import load_step, rung  # noqa: E402

SCHEMA = 1
# {"schema": 1, "step": "05", "env": {gpu, date, torch, triton, cuda, cudnn, capability, sm_count},
#  "timing": facourse.bench.TIMING, "reference": the step's backend, "solution": rung name,
#  "rungs": {name: {file, verdict, build_s?, error?, autotune?}},
#  "mode"?: "backward" (step 08: what a bench row times; absent = the forward),
#  "rows": [{rung, config, dtype, kind: "check", check: "ok"|"error", error?}
#           {rung, config, dtype, kind: "bench", ref_backend, tflops, tflops_ref, ratio, ms, ms_ref,
#            host_us, host_ref_us, mode?: "train"} or {..., kind: "bench", ref_backend, error}]}
# A ring step ("mode": "ring") has "world", "ring_env" and "one_gpu" {config: {ms}} at the top; its check rows
# have "world" and "seed", its bench rows
#           {rung, config, dtype, kind: "bench", world, ms (step), rank_ms, compute_ms, wait_ms (per rank, summed
#            over the ring steps), step_compute_ms, step_wait_ms (per rank per step), transfer_ms (one shard
#            alone), shard_mb, ref_backend, ms_ref, tflops, tflops_ref, ratio (speedup), efficiency}
# A decode step ("mode": "decode") has "copy_gbps" in env and bench rows
#           {rung, config, dtype, kind: "bench", ref_backend, gbps, gbps_ref, copy_fraction, ratio, ms, ms_ref,
#            host_us, host_ref_us}
DTYPES = ("float16", "bfloat16")
#: Configurations a rung may name besides facourse.configs': v1 of step 05 holds one tile (Skv <= 256).
EXTRA_CONFIGS = {"one_tile": AttnConfig("one_tile", 8, 32, 8, 128, 128, 128, True)}
BUILD = Path(os.environ.get("LADDER_BUILD", Path(tempfile.gettempdir()) / "facourse_ladder_build"))


def config(name: str) -> AttnConfig:
    return EXTRA_CONFIGS[name] if name in EXTRA_CONFIGS else get_config(name, "cuda")


def sweep_names(m: dict, quick: bool = False, causal: bool | None = None) -> list[str]:
    lo = 4096 if quick or m["ladder"].get("sweep", "4k-16k") == "4k-16k" else 512
    return [n for n, c in SWEEP.items() if c.Sq >= lo and (causal is None or c.causal == causal)]


def bench_configs(m: dict, r: dict, quick: bool = False) -> list[AttnConfig]:
    """What the runner times a rung on (the solution: the five, `long`, the sweep)."""
    if r["name"] == m["ladder"]["solution"]:
        names = [*CONFIGS, "long", *sweep_names(m, quick)]
    else:
        names = []
        for n in r.get("bench", ["large", "long"]):
            names += {"sweep_4k_16k": sweep_names(m, True), "sweep_4k_16k_causal": sweep_names(m, True, True)
                      }.get(n, [n])
    return [config(n) for n in names]


def backends(m: dict, solution: bool, dtype: str = "float16") -> list[str]:
    """The references a forward rung is timed against: the step's and FA2; a solution FA2 and cuDNN, and
    FlashInfer's prefill kernel where flashinfer is installed (its carried modules are fp16's: a forward
    step's solution in fp16; tools/carry_tilelang.py --flashinfer)."""
    from facourse.bench import FLASHINFER, flashinfer_available
    ref = m["reference"]["backend"]
    if not solution:
        return list(dict.fromkeys([ref, "FLASH_ATTENTION"]))
    forward = m["exercise"].get("mode", "forward") == "forward"
    return ["FLASH_ATTENTION", "CUDNN_ATTENTION"] + (
        [FLASHINFER] if forward and dtype == "float16" and flashinfer_available() else [])


# ---------------------------------------------------------------------------- building a rung
def _load_py(path: Path):
    spec = importlib.util.spec_from_file_location(f"ladder_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_cuda(m: dict, name: str, arch: str | None = None):
    """The torch extension of one CUDA rung (kernel .cu + the step's binding), built once. ``arch``:
    the manifest's, else the given one, else this machine's GPU."""
    from facourse.cuda_build import load_cuda_extension
    r = rung(m, name)
    sid = m["step"]["id"]
    return load_cuda_extension(f"fa{sid}_{name}", [m["ladder_dir"] / r["file"], m["dir"] / m["build"]["binding"]],
                               arch=m["build"].get("arch") or arch, include_dirs=[m["ladder_dir"], m["dir"]],
                               build_directory=str(_build_dir(sid, name)))


def _build_dir(sid: str, name: str) -> Path:
    d = BUILD / f"step{sid}" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def entry_point(step, name: str):
    """The rung's entry point, with the exercise's name and signature: fn(q, k, v, causal, scale) -> (o, lse)."""
    m = step if isinstance(step, dict) else load_step(step)
    r = rung(m, name)
    path = m["ladder_dir"] / r["file"]
    ep = r.get("entry_point", m["entry_points"][0])
    if path.suffix == ".py":
        from facourse.triton_setup import interpret_without_gpu
        interpret_without_gpu()
        return getattr(_load_py(path), ep)
    from facourse import validate_inputs
    ext = build_cuda(m, name)

    def fn(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return tuple(ext.forward(q, k, v, bool(causal), float(scale)))

    fn.__name__ = f"{ep}_{name}"
    return fn


def _prebuild(sid: str, name: str, arch: str) -> float:
    t0 = time.time()
    build_cuda(load_step(sid), name, arch)    # in a pool worker: only the time travels back
    return round(time.time() - t0, 1)


# ---------------------------------------------------------------------------- one rung's work
def env_info() -> dict:
    import torch
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    gpu = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if gpu else "cpu", "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "triton": tv, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "capability": list(torch.cuda.get_device_capability()) if gpu else None,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if gpu else None}


def plan(m: dict, name: str, quick: bool, checks: list[str] | None = None) -> tuple[list, list]:
    """(checks, benches) of one rung: [(config, dtype)], [(AttnConfig, dtype, backend)]."""
    import torch
    gpu = torch.cuda.is_available()
    sol = name == m["ladder"]["solution"]
    dtypes = DTYPES[:1] if quick or not gpu else DTYPES
    r = rung(m, name)
    explicit = checks is not None
    decode = m["exercise"].get("mode") == "decode"
    variant = m["exercise"].get("mode") == "variant"
    if checks is None and variant:
        from facourse.variants import VARIANT_CASES
        from facourse.variants import FP8_UNFIT
        checks = ([c for c in [*CONFIGS, *EDGE_CASES] if c not in FP8_UNFIT] if r.get("entry_point") == "flash_attention_fp8" else
                  list(VARIANT_CASES) if sol else [r.get("check", "window")])
    if checks is None and decode:
        from facourse.decode import DECODE_CASES
        checks = list(DECODE_CASES) if sol else [r.get("check", "mixed")]
    if checks is None:
        checks = [*CONFIGS, *EDGE_CASES] if sol else [r.get("check", "large")]
    cks = [(c, dt) for dt in (dtypes if sol or explicit else DTYPES[:1]) for c in checks]
    if not gpu:
        return cks, []
    if variant:
        from facourse.variants import PERF_CASES
        fp8 = r.get("entry_point") == "flash_attention_fp8"
        cases = (["long", "large"] if fp8 else list(PERF_CASES) + ["long"]) if sol or fp8 else r.get("bench", [])
        return cks, [(c, "float8_e4m3fn" if fp8 else "float16", be) for c in cases
                     for be in (["FLEX"] if c.startswith("window") else
                                ["FLASH_ATTENTION", "CUDNN_ATTENTION"] if sol or fp8 else ["FLASH_ATTENTION"])]
    if decode:
        from facourse.decode import PERF_DECODE_CASES
        cases = list(PERF_DECODE_CASES) if sol else r.get("bench", [])
        from facourse.decode import DECODE_BACKENDS
        bes = list(DECODE_BACKENDS) if sol else [m["reference"]["backend"]]
        return cks, [(PERF_DECODE_CASES[c], "float16", be) for c in cases for be in bes]
    bds = [(cfg, dt, be) for dt in (dtypes if sol else DTYPES[:1]) for cfg in bench_configs(m, r, quick)
           for be in backends(m, sol, dt)]
    return cks, bds


def run_rung(m: dict, name: str, quick: bool, out: Path, checks: list[str] | None = None,
             bench: bool = True) -> None:
    """Check, then time, one rung; rows go to ``out`` (JSON) after every step."""
    import torch

    from facourse import bench_attention, check_entry_point
    from facourse.backward import check_gradients
    from facourse.decode import bench_decode, check_paged_decode
    res: dict = {"rows": []}
    mode = m["exercise"].get("mode", "forward")
    save = lambda: out.write_text(json.dumps(res))  # noqa: E731
    fn = entry_point(m, name)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if mode == "variant":
        return _run_variant(m, name, fn, dev, res, save, *plan(m, name, quick, checks), bench)
    cks, bds = plan(m, name, quick, checks)
    for cname, dt in cks:
        row = {"rung": name, "config": cname, "dtype": dt, "kind": "check"}
        t0 = time.time()
        try:
            cfg = config(cname) if cname in EXTRA_CONFIGS else cname
            if mode == "backward":
                check_gradients(fn, cfg, device=dev, dtype=getattr(torch, dt), verbose=False)
            elif mode == "decode":
                check_paged_decode(fn, cname, device=dev, dtype=getattr(torch, dt), verbose=False)
            else:
                check_entry_point(fn, cfg, device=dev, dtype=getattr(torch, dt), expect_lse=True, verbose=False)
            row["check"] = "ok"
        except Exception as e:  # noqa: BLE001 (record every failure, keep going)
            row.update(check="error", error=f"{type(e).__name__}: {e}"[:1500])
            print(f"  FAIL {name} {cname} {dt}: {row['error'][:300]}", flush=True)
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()
    if not bench or not bds:
        return
    if not all(r["check"] == "ok" for r in res["rows"]):
        print(f"  {name}: a check failed, not timed", flush=True)
        return
    if mode == "decode":
        return _bench_decode(fn, name, bds, res, save, bench_decode)
    for _ in range(2):   # discarded: the first timings of a fresh GPU read slow while its clocks rise
        bench_attention(fn, bds[0][0], backend=bds[0][2], mode=mode)
    if mode == "backward" and name == m["ladder"]["solution"]:   # forward + backward too, against FA2
        bds += [(cfg, dt, "FLASH_ATTENTION", "train") for cfg, dt, be in bds if be == "FLASH_ATTENTION"
                and cfg.name in ("large", "long", *sweep_names(m, True))]
    for cfg, dt, be, *train in bds:
        row = {"rung": name, "config": cfg.name, "dtype": dt, "kind": "bench", **({"mode": "train"} if train else {})}
        t0 = time.time()
        try:
            b = bench_attention(fn, cfg, backend=be, dtype=getattr(torch, dt), mode="train" if train else mode)
            row.update(ref_backend=b.backend, tflops=b.tflops_student, tflops_ref=b.tflops_ref, ratio=b.ratio,
                       ms=b.t_student_ms, ms_ref=b.t_ref_ms, host_us=b.host_student_us, host_ref_us=b.host_ref_us)
            print(f"  {name:>20} {cfg.name + (' f+b' if train else ''):>14} {dt:>8} {b.tflops_student:6.0f} vs {b.backend[:15]:<15} "
                  f"{b.tflops_ref:6.0f} TFLOP/s  x{b.ratio:.2f}", flush=True)
        except Exception as e:  # noqa: BLE001
            row.update(ref_backend=be, error=f"{type(e).__name__}: {e}"[:500])
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()
    tuned = getattr(fn, "__globals__", {}).get("attn_fwd_tuned")   # a Triton rung's module
    if tuned is not None and hasattr(tuned, "cache"):   # which tiles the autotuner picked, per key
        res["autotune"] = {str(k): str(v) for k, v in tuned.cache.items()}
        save()


def _run_variant(m, name, fn, dev, res, save, cks, bds, bench) -> None:
    """Step 10's rungs: ``flex_attention_triton`` checked on facourse.variants' cases and timed on its perf
    cases against compiled FlexAttention (windows) or SDPA (causal, and `long` without a mask: a
    block-mask kernel keeps step 05's speed); the FP8 rung checked by its error bound on the course's
    configurations and timed on `long` and `large` against SDPA (its inputs already in FP8: a model hands
    them over quantised; the rung's flash_attention_fp8 that quantises too is what the checks call)."""
    import torch

    from facourse import bench_attention
    from facourse.variants import PERF_CASES, bench_fp8, bench_variant, causal, check_fp8, check_variant

    fp8 = rung(m, name).get("entry_point") == "flash_attention_fp8"
    for cname, dt in cks:
        row = {"rung": name, "config": cname, "dtype": dt, "kind": "check"}
        t0 = time.time()
        try:
            if fp8:
                row.update(check_fp8(fn, cname, device=dev, dtype=getattr(torch, dt), verbose=False))
            else:
                check_variant(fn, cname, device=dev, dtype=getattr(torch, dt), verbose=False)
            row["check"] = "ok"
        except Exception as e:  # noqa: BLE001 (record every failure, keep going)
            row.update(check="error", error=f"{type(e).__name__}: {e}"[:1500])
            print(f"  FAIL {name} {cname} {dt}: {row['error'][:300]}", flush=True)
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()
    if not bench or not bds or not all(r["check"] == "ok" for r in res["rows"]):
        return
    # the course's signature, fn(q, k, v, causal, scale), for bench_attention's configurations
    plain = fn if fp8 else (lambda q, k, v, causal=False, scale=None:
                            fn(q, k, v, mask=causal(q.shape[2], k.shape[2]) if causal else None, scale=scale))
    for run, (cname, dt, be) in enumerate([bds[0]] + bds):   # the first twice: clocks rising, autotuning
        row = {"rung": name, "config": cname, "dtype": dt, "kind": "bench"}
        t0 = time.time()
        try:
            if fp8:             # inputs already in FP8 (quantised once, outside the timing)
                mod = _load_py(m["ladder_dir"] / rung(m, name)["file"])
                b = bench_fp8(mod.flash_attention_fp8_prequantized, mod.quantize_fp8, cname, backend=be)
            elif cname in PERF_CASES:
                b = bench_variant(fn, cname, backend=be)
            else:
                b = bench_attention(plain, cname, backend=be)
            row.update(ref_backend=b.backend, tflops=b.tflops_student, tflops_ref=b.tflops_ref, ratio=b.ratio,
                       ms=b.t_student_ms, ms_ref=b.t_ref_ms, host_us=b.host_student_us, host_ref_us=b.host_ref_us)
            print(f"  {name:>20} {cname:>16} {b.tflops_student:6.0f} vs {b.backend[:15]:<15} {b.tflops_ref:6.0f} "
                  f"TFLOP/s  x{b.ratio:.2f}", flush=True)
        except Exception as e:  # noqa: BLE001
            row.update(ref_backend=be, error=f"{type(e).__name__}: {e}"[:500])
        if run == 0:                              # the discarded first timing: not recorded
            continue
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()


def _bench_decode(fn, name, bds, res, save, bench_decode) -> None:
    """Step 09's timing: GB/s of K and V read, against SDPA on contiguous K/V, and the copy rate."""
    from facourse.decode import copy_rate_gbps
    copy = res["copy_gbps"] = copy_rate_gbps()
    bench_decode(fn, bds[0][0], backend=bds[0][2])     # discarded: clocks rising, autotuning
    for case, dt, be in bds:
        row = {"rung": name, "config": case.name, "dtype": dt, "kind": "bench"}
        t0 = time.time()
        try:
            b = bench_decode(fn, case, backend=be)
            row.update(ref_backend=b.backend, gbps=b.gbps_student, gbps_ref=b.gbps_ref, ratio=b.ratio,
                       copy_fraction=b.gbps_student / copy, ms=b.t_student_ms, ms_ref=b.t_ref_ms,
                       host_us=b.host_student_us, host_ref_us=b.host_ref_us)
            print(f"  {name:>24} {case.name:>12} {b.gbps_student:6.0f} GB/s ({b.gbps_student / copy:.0%} of a copy) vs "
                  f"{b.backend[:15]:<15} {b.gbps_ref:6.0f} GB/s  x{b.ratio:.2f}", flush=True)
        except Exception as e:  # noqa: BLE001
            row.update(ref_backend=be, error=f"{type(e).__name__}: {e}"[:500])
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()
    tuned = [v for v in getattr(fn, "__globals__", {}).values() if hasattr(v, "cache") and hasattr(v, "configs")]
    if tuned:
        res["autotune"] = {str(k): str(v) for t in tuned for k, v in t.cache.items()}
        save()


# ---------------------------------------------------------------------------- step 12: the ring
RING_WORLD = 2
#: What a ring rung is timed on: causal fp16, B 1, Hq = Hkv = 16, D 128, the sequence over 2 GPUs.
RING_CONFIGS = {c.name: c for c in (AttnConfig("ring_causal_64k", 1, 16, 16, 65536, 65536, 128, True),
                                    AttnConfig("ring_causal_128k", 1, 16, 16, 131072, 131072, 128, True))}
#: --cpu-smoke: the same path on CPU ranks (gloo, facourse.ring.block_attention), at sizes a test affords.
RING_SMOKE_CONFIGS = {c.name: c for c in (AttnConfig("smoke_causal_256", 1, 2, 2, 256, 256, 64, True),
                                          AttnConfig("smoke_causal_512", 1, 2, 2, 512, 512, 64, True))}
#: NVLink multicast (NVLS) off in every rank: set before the ranks are spawned, which inherit it.
RING_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RING_ITERS = {"gpu": (3, 20, 3), "cpu": (1, 3, 1)}       # (warm-up calls, timed calls, probed calls)
RING_TIMING = ("benchmarks.ladder ring: every rank passes a barrier, then CUDA events around its call (the host "
               "clock on CPU ranks); a call's step time is the slower rank's; median of {timed} calls after {warmup} "
               "discarded; the L2 not flushed (a shard is larger than it). The one-GPU reference: the same block "
               "kernel over the whole sequence on rank 0's GPU, median of {timed}. Phases (compute, then the wait for "
               "the next shard) from events at the rung's marks over {probed} further calls, median per step")


def ring_plan(quick: bool, smoke: bool, checks: list[str] | None = None) -> tuple[list, list]:
    """(checks [(case, dtype)], timed configuration names) of a ring rung. On the GPUs: the shapes of
    every case of facourse.ring.RING_CASES, run on the 2 ranks (ragged lengths, GQA, MQA, 7 rows over
    4 zigzag chunks), fp16 and bf16, then RING_CONFIGS. --quick: the 2-rank cases in fp16, the 64k
    configuration; --cpu-smoke: the 2-rank cases in fp16, RING_SMOKE_CONFIGS."""
    from facourse.ring import RING_CASES
    if checks is None:
        checks = [c for c, rc in RING_CASES.items() if rc.world == RING_WORLD] if quick or smoke else list(RING_CASES)
    dtypes = DTYPES[:1] if quick or smoke else DTYPES
    configs = list(RING_SMOKE_CONFIGS if smoke else RING_CONFIGS)
    return [(c, dt) for dt in dtypes for c in checks], configs[:1] if quick and not smoke else configs


class _Clock:
    """Time stamps on the device's stream (CUDA events) or the host's clock (CPU ranks)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def stamp(self):
        import torch
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def sync(self) -> None:
        import torch
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


class _Probe:
    """ring_common.PROBE: a stamp at each of the rung's marks; ``phases`` pairs each label with the
    time since the stamp before it."""

    def __init__(self, clock: _Clock):
        self.clock, self.marks = clock, []

    def __call__(self, label: str) -> None:
        self.marks.append((label, self.clock.stamp()))

    def phases(self) -> list[tuple[str, float]]:
        return [(b[0], self.clock.ms(a[1], b[1])) for a, b in zip(self.marks, self.marks[1:])]


def _median(xs):
    import statistics
    return statistics.median(xs)


def _timed(call, clock: _Clock, n: int, ranks: bool = True) -> list[float]:
    """Milliseconds of ``n`` calls, each started together on every rank (``ranks``: a barrier first)."""
    import torch.distributed as dist
    out = []
    for _ in range(n):
        if ranks:
            dist.barrier()
        clock.sync()
        a = clock.stamp()
        call()
        b = clock.stamp()
        clock.sync()
        out.append(clock.ms(a, b))
    return out


def _probed(call, clock: _Clock, common, n: int) -> dict:
    """Per ring step, the median over ``n`` calls of the time it computed and the time it then waited
    for the next shard (ring_common's marks; ≈ 0 when the transfer hid behind the compute)."""
    import torch.distributed as dist
    probe = common.PROBE = _Probe(clock)
    runs = []
    try:
        for _ in range(n):
            probe.marks = []
            dist.barrier()
            clock.sync()
            probe("start")
            call()
            clock.sync()
            runs.append(probe.phases())
    finally:
        common.PROBE = None
    per = {what: [[ms for label, ms in run if label == what] for run in runs] for what in ("compute", "wait")}
    return {what: [_median(step) for step in zip(*lists)] for what, lists in per.items()}


def _transfer_alone(k, v, clock: _Clock, warmup: int, n: int) -> list[float]:
    """Milliseconds of one ring step's exchange with nothing else running: this rank's (k, v) to the
    next rank, the previous rank's received (the timed configurations' shards are of equal size)."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()

    def exchange():
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        ops = [dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
               dist.P2POp(dist.irecv, k_in, (rank - 1) % world), dist.P2POp(dist.irecv, v_in, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    _timed(exchange, clock, warmup)
    return _timed(exchange, clock, n)


def _ring_worker(rank: int, job: dict) -> None:
    """One rank of a ring rung's world (spawned; module-level so that spawn can find it): join the
    group (NCCL, one GPU per rank; gloo on CPU ranks), check the rung, time it, and, on rank 0, write
    the rows to job["out"] after each one. A rank whose ring_attention raises ends the world."""
    import torch
    import torch.distributed as dist

    from facourse import AttentionCheckError, check_attention, make_inputs
    from facourse.ring import RING_CASES, shard, shard_index, unshard

    cuda, world = not job["smoke"], job["world"]
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(job["store"], world), rank=rank,
                            world_size=world, **({"device_id": dev} if cuda else {}))
    fn = _load_py(Path(job["path"])).ring_attention
    common = sys.modules["ring_common"]        # the rung's support module, as the rung imported it
    layout, clock = job["layout"], _Clock(cuda)
    warmup, timed, probed = RING_ITERS["gpu" if cuda else "cpu"]
    res: dict = {"rows": [], "one_gpu": {}}

    def save():
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(res))

    for i, (cname, dt) in enumerate(job["checks"]):
        c, seed = RING_CASES[cname].cfg, job["seed"] + i
        row = {"rung": job["rung"], "config": cname, "dtype": dt, "kind": "check", "world": world, "seed": seed}
        t0 = time.time()
        q, k, v = make_inputs(c, seed, dev, getattr(torch, dt))
        o, lse = fn(*(shard(t, world, c.causal, layout=layout)[rank] for t in (q, k, v)), causal=c.causal)
        parts = [None] * world if rank == 0 else None
        dist.gather_object((o.cpu(), lse.cpu()), parts, dst=0)
        if rank == 0:                          # the check on rank 0, of the rows in global order
            try:
                check_attention(unshard([p[0] for p in parts], c.causal, layout=layout).to(dev), q, k, v,
                                c.causal, lse=unshard([p[1] for p in parts], c.causal, layout=layout).to(dev),
                                config=f"{c.describe()} on {world} ranks", seed=seed)
                row["check"] = "ok"
            except AttentionCheckError as e:
                row.update(check="error", error=str(e)[:1500])
                print(f"  FAIL {job['rung']} {cname} {dt}: {row['error'][:300]}", flush=True)
            row["seconds"] = round(time.time() - t0, 2)
            res["rows"].append(row)
            save()
    go = [job["bench"] and all(r["check"] == "ok" for r in res["rows"])]
    dist.broadcast_object_list(go, src=0)
    if not go[0]:
        dist.destroy_process_group()
        return

    configs = RING_SMOKE_CONFIGS if job["smoke"] else RING_CONFIGS
    for name in job["configs"]:
        cfg = configs[name]
        t0 = time.time()
        rows = len(shard_index(cfg.Sq, world, rank, cfg.causal, layout))
        q = torch.randn(cfg.B, cfg.Hq, rows, cfg.D, device=dev, dtype=torch.float16)
        k, v = (torch.randn(cfg.B, cfg.Hkv, rows, cfg.D, device=dev, dtype=torch.float16) for _ in range(2))
        call = lambda: fn(q, k, v, causal=cfg.causal)  # noqa: E731
        _timed(call, clock, warmup)
        mine = {"ms": _timed(call, clock, timed), **_probed(call, clock, common, probed),
                "transfer": _transfer_alone(k, v, clock, warmup, timed)}
        every = [None] * world
        dist.all_gather_object(every, mine)
        if rank == 0:
            r3 = lambda x: round(x, 4)  # noqa: E731
            res["rows"].append({
                "rung": job["rung"], "config": name, "dtype": "float16", "kind": "bench", "world": world,
                "ms": r3(_median([max(ts) for ts in zip(*(e["ms"] for e in every))])),
                "rank_ms": [r3(_median(e["ms"])) for e in every],
                "compute_ms": [r3(sum(e["compute"])) for e in every],
                "wait_ms": [r3(sum(e["wait"])) for e in every],
                "step_compute_ms": [[r3(x) for x in e["compute"]] for e in every],
                "step_wait_ms": [[r3(x) for x in e["wait"]] for e in every],
                "transfer_ms": r3(_median([max(ts) for ts in zip(*(e["transfer"] for e in every))])),
                "shard_mb": r3((k.numel() + v.numel()) * k.element_size() / 1e6),
                "seconds": round(time.time() - t0, 2)})
        del q, k, v, call
        if job["baseline"]:
            if rank == 0:                      # the same block kernel, one device, the whole sequence
                Q = torch.randn(cfg.B, cfg.Hq, cfg.Sq, cfg.D, device=dev, dtype=torch.float16)
                K, V = (torch.randn(cfg.B, cfg.Hkv, cfg.Skv, cfg.D, device=dev, dtype=torch.float16)
                        for _ in range(2))
                kernel = common.block_kernel(dev)
                one = lambda: kernel(Q, K, V, causal=cfg.causal)  # noqa: E731
                _timed(one, clock, warmup, ranks=False)
                res["one_gpu"][name] = {"ms": round(_median(_timed(one, clock, timed, ranks=False)), 4)}
                del Q, K, V, one
            dist.barrier()
        save()
    dist.destroy_process_group()


def _spawn_world(job: dict, timeout: float) -> str | None:
    """Run ``_ring_worker`` on job["world"] spawned ranks; None when all finished, else what went wrong
    (a rank's traceback, or the time limit: the ranks are then killed)."""
    import torch.multiprocessing as tmp
    ctx = tmp.start_processes(_ring_worker, args=(job,), nprocs=job["world"], join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                return f"timed out after {timeout:g} s (ranks waiting on each other?)"
    except Exception as e:  # noqa: BLE001 (ProcessRaisedException, ProcessExitedException: a rank failed)
        return f"{type(e).__name__}: {e}"[-3000:]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return None


def run_ring(m: dict, names: list[str], out: Path, quick: bool = False, smoke: bool = False,
             checks: list[str] | None = None, bench: bool = True, timeout: float = 300) -> int:
    """Step 12: each rung in a world of RING_WORLD spawned ranks (one GPU each, NCCL; gloo CPU ranks
    with ``smoke``), checked and timed there; the first world also times the one-GPU reference.
    Writes the results file after every rung and prints the table; 2 when the GPUs are missing."""
    import secrets

    import torch
    if not smoke and torch.cuda.device_count() < RING_WORLD:
        print(f"step {m['step']['id']} runs on {RING_WORLD} GPUs; this machine has {torch.cuda.device_count()} "
              "(--cpu-smoke runs the same path on CPU ranks)")
        return 2
    os.environ.update(RING_ENV)
    env = env_info()
    if smoke:
        env.update(gpu="cpu", capability=None, sm_count=None)
    warmup, timed, probed = RING_ITERS["cpu" if smoke else "gpu"]
    cks, configs = ring_plan(quick, smoke, checks)
    sid = m["step"]["id"]
    d = {"schema": SCHEMA, "step": sid, "env": env,
         "timing": RING_TIMING.format(warmup=warmup, timed=timed, probed=probed),
         "reference": m["reference"]["backend"], "mode": "ring", "world": RING_WORLD, "ring_env": RING_ENV,
         "solution": m["ladder"]["solution"], "one_gpu": {},
         "rungs": {n: {"file": rung(m, n)["file"], "verdict": rung(m, n)["verdict"],
                       "layout": rung(m, n).get("layout", "the rule's")} for n in names}, "rows": []}
    path = out / f"{env['date']}_{gpu_tag(env['gpu'])}_step{sid}.json"
    save = lambda: path.write_text(json.dumps(d, indent=1))  # noqa: E731
    print(json.dumps(env), flush=True)
    seed = secrets.randbits(30)
    with tempfile.TemporaryDirectory(prefix="ring_world_") as tmp:
        for i, n in enumerate(names):
            job = {"rung": n, "path": str(m["ladder_dir"] / rung(m, n)["file"]), "layout": rung(m, n).get("layout"),
                   "checks": cks, "configs": configs, "bench": bench, "baseline": bench and not d["one_gpu"],
                   "smoke": smoke, "world": RING_WORLD, "seed": seed, "store": str(Path(tmp) / f"store_{i}"),
                   "out": str(Path(tmp) / f"{n}.json")}
            print(f"== {n}", flush=True)
            t0 = time.time()
            err = _spawn_world(job, timeout)
            if err:
                d["rungs"][n]["error"] = err
                print(f"  {n}: {err[-500:]}", flush=True)
            d["rungs"][n]["seconds"] = round(time.time() - t0, 1)
            if Path(job["out"]).exists():
                w = json.loads(Path(job["out"]).read_text())
                d["one_gpu"].update(w["one_gpu"])
                d["rows"] += w["rows"]
            _ring_ratios(d)
            save()
    print("\n" + table(d))
    print(f"JSON: {path}")
    return 0


def _ring_ratios(d: dict) -> None:
    """Each ring bench row against the one-GPU time of its configuration: TFLOP/s of the causal
    visible pairs, ratio = speedup = t_one_GPU / t_step, efficiency = speedup / world."""
    configs = {**RING_CONFIGS, **RING_SMOKE_CONFIGS}
    for r in d["rows"]:
        one = d["one_gpu"].get(r["config"])
        if r["kind"] != "bench" or one is None or "ratio" in r:
            continue
        flops = configs[r["config"]].flops()
        r.update(ref_backend=d["reference"], ms_ref=one["ms"], tflops=round(flops / r["ms"] / 1e9, 2),
                 tflops_ref=round(flops / one["ms"] / 1e9, 2), ratio=round(one["ms"] / r["ms"], 4),
                 efficiency=round(one["ms"] / r["ms"] / r["world"], 4))


# ---------------------------------------------------------------------------- the run
def gpu_tag(gpu: str) -> str:
    found = re.search(r"\b([A-Z]\d{2,3})\b", gpu)
    return found[1].lower() if found else re.sub(r"\W+", "", gpu.lower())[:12] or "cpu"


def table(d: dict) -> str:
    """The short summary printed last."""
    rows = d["rows"]
    lines = [f"step {d['step']} on {d['env']['gpu']} ({d['env']['date']}); ratio = t_ref / t_rung (> 1: faster)"]
    for name, info in d["rungs"].items():
        c = [r for r in rows if r["rung"] == name and r["kind"] == "check"]
        ok = sum(r["check"] == "ok" for r in c)
        err = f"  ERROR {info['error'][-200:]}" if "error" in info else ""
        lines.append(f"{name:>22}: checks {ok}/{len(c)}{err}")
        lines += [f"      FAIL {r['config']} {r['dtype']}: {r['error'][:160]}" for r in c if r["check"] != "ok"]
    by: dict = {}
    for r in rows:
        if r["kind"] == "bench" and "ratio" in r:
            cname = r["config"] + (" f+b" if r.get("mode") == "train" else "")
            by.setdefault((r["rung"], cname, r["dtype"]), {})[r["ref_backend"][:15]] = r
    if d.get("mode") == "ring":
        return "\n".join(lines + ring_lines(d))
    unit, key = ("GB/s", "gbps") if d.get("mode") == "decode" else ("TFLOP/s", "tflops")
    if by:
        lines.append(f"{'rung':>22} {'config':>14} {'dtype':>8} {unit:>7}  vs reference: ratio (ref {unit})")
    for (name, cname, dt), d2 in by.items():
        first = next(iter(d2.values()))
        refs = "  ".join(f"{be}: {r['ratio']:.2f}x ({r[key + '_ref']:.0f})" for be, r in d2.items())
        copy = f" ({first['copy_fraction']:.0%} of a copy)" if "copy_fraction" in first else ""
        lines.append(f"{name:>22} {cname:>14} {dt:>8} {first[key]:7.0f}{copy}  {refs}")
    return "\n".join(lines)


def ring_lines(d: dict) -> list[str]:
    """Step 12's timings: the step against one GPU, and per rank the compute and the wait after it."""
    rows = [r for r in d["rows"] if r["kind"] == "bench"]
    if not rows:
        return []
    out = [f"{'rung':>22} {'config':>17} {'step ms':>8} {'1 GPU ms':>8} {'speedup':>7} {'eff.':>5} {'TFLOP/s':>7}  "
           "per rank: compute ms / wait ms after it; one shard's transfer alone"]
    for r in rows:
        one = d["one_gpu"].get(r["config"], {}).get("ms")
        ranks = ", ".join(f"{c:.2f} / {w:.2f}" for c, w in zip(r["compute_ms"], r["wait_ms"]))
        out.append(f"{r['rung']:>22} {r['config']:>17} {r['ms']:8.2f} {one or float('nan'):8.2f} "
                   f"{r.get('ratio', float('nan')):6.2f}x {r.get('efficiency', float('nan')):5.0%} "
                   f"{r.get('tflops', float('nan')):7.0f}  {ranks}; {r['transfer_ms']:.2f} ms ({r['shard_mb']:.0f} MB)")
    return out


def sanitize(m: dict, names: list[str], checks: list[str], out: Path) -> int:
    """compute-sanitizer's memcheck, racecheck and synccheck over the checks of each CUDA rung."""
    import shutil
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    report, rc = [], 0
    for name in names:
        entry_point(m, name)             # build once without the sanitizer: the build is slow under it
        for t in ("memcheck", "racecheck", "synccheck"):
            # the check's own reference (SDPA's cuDNN kernels) is not ours to sanitize
            cmd = [tool, "--tool", t, "--kernel-name-exclude", "kns=cudnn", "--error-exitcode", "3",
                   sys.executable, "-m", "benchmarks.ladder",
                   m["step"]["id"], "--worker", name, "--worker-out", str(out / f"sanitize_{name}.json"),
                   "--checks", ",".join(checks), "--no-bench"]
            t0 = time.time()
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            tail = [ln for ln in (p.stdout + p.stderr).splitlines() if "=========" in ln or "FAIL" in ln]
            wout = out / f"sanitize_{name}.json"
            rows = json.loads(wout.read_text())["rows"] if wout.exists() else []
            report.append(f"== {name} {t} ({', '.join(checks)}; fp16, bf16): exit {p.returncode}, "
                          f"{time.time() - t0:.0f} s, checks passed {sum(r['check'] == 'ok' for r in rows)}/"
                          f"{len(rows)}\n" + "\n".join(tail[-20:]))
            wout.unlink(missing_ok=True)
            rc = rc or p.returncode
            print(report[-1], flush=True)
    path = out / f"step{m['step']['id']}_sanitize.txt"
    path.write_text("\n\n".join(report) + "\n")
    print(f"report: {path}")
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step")
    ap.add_argument("--only", default="", help="comma-separated rung names (default: every rung)")
    ap.add_argument("--quick", action="store_true", help="fp16 only, the 4k-16k sweep points only")
    ap.add_argument("--out", default=os.environ.get("OUT", str(Path(tempfile.gettempdir()) / "facourse_ladder")))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per rung (checks + timing)")
    ap.add_argument("--sanitize", action="store_true", help="compute-sanitizer over a CUDA rung's checks")
    ap.add_argument("--checks", default="", help="configurations to check (default: the plan's)")
    ap.add_argument("--no-bench", action="store_true", help="checks only")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="step 12: the ring path on 2 CPU ranks (gloo), tiny shapes: a test of the runner")
    ap.add_argument("--traces", action="store_true",
                    help="step 11: the solution kernels of 05, 06, 07 and 11 as FlashInfer-Bench solutions, "
                         "traced over the seed's workloads, then apply()'s choices re-timed (benchmarks/traces.py)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    m = load_step(a.step)
    if a.traces:
        if m["step"]["id"] != "11":
            print("--traces is step 11's")
            return 2
        from benchmarks.traces import run as run_traces
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        return run_traces(out, a.quick)
    if not m["rungs"]:
        print(f"step {a.step} has no solution ladder")
        return 2
    checks = a.checks.split(",") if a.checks else None
    if a.worker:
        run_rung(m, a.worker, a.quick, Path(a.worker_out), checks, bench=not a.no_bench)
        return 0
    names = [r["name"] for r in m["rungs"] if not a.only or r["name"] in a.only.split(",")]
    sol = m["ladder"]["solution"]
    names.sort(key=lambda n: n != sol)       # the solution first: a run cut short still has it
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if m["exercise"].get("mode") == "ring":
        return run_ring(m, names, out, a.quick, a.cpu_smoke, checks, not a.no_bench, a.timeout)
    if a.sanitize:
        return sanitize(m, names if a.only else [m["ladder"]["solution"]],
                        checks or ["small", "ragged", "empty_rows", "decode"], out)
    import torch
    sid = m["step"]["id"]
    if m.get("build", {}).get("arch") == "sm_90a" and (not torch.cuda.is_available()
                                                       or torch.cuda.get_device_capability() != (9, 0)):
        print(f"step {sid} runs on a Hopper GPU (sm_90a: H100 or H200) only")
        return 2
    env = env_info()
    from facourse.bench import TIMING
    d = {"schema": SCHEMA, "step": sid, "env": env, "timing": TIMING, "reference": m["reference"]["backend"],
         **({"mode": m["exercise"]["mode"]} if "mode" in m["exercise"] else {}), "solution": m["ladder"]["solution"],
         "rungs": {n: {"file": rung(m, n)["file"], "verdict": rung(m, n)["verdict"]} for n in names}, "rows": []}
    path = out / f"{env['date']}_{gpu_tag(env['gpu'])}_step{sid}.json"
    save = lambda: path.write_text(json.dumps(d, indent=1))  # noqa: E731
    print(json.dumps(env), flush=True)
    cuda = [n for n in names if rung(m, n)["file"].endswith(".cu")]
    if cuda:                                   # nvcc for every CUDA rung at once
        major, minor = torch.cuda.get_device_capability()   # the parent's CUDA: spawn, never fork
        with cf.ProcessPoolExecutor(max_workers=min(len(cuda), os.cpu_count() or 1),
                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            futs = {n: pool.submit(_prebuild, sid, n, f"sm_{major}{minor}") for n in cuda}
            for n, f in futs.items():
                try:
                    d["rungs"][n]["build_s"] = f.result()
                except Exception:  # noqa: BLE001
                    d["rungs"][n]["error"] = "build failed:\n" + traceback.format_exc()[-3000:]
        save()
    for n in names:
        if "error" in d["rungs"][n]:
            continue
        tmp = out / f".rung_{sid}_{n}.json"
        tmp.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "benchmarks.ladder", sid, "--worker", n, "--worker-out", str(tmp)]
        cmd += (["--quick"] if a.quick else []) + (["--checks", a.checks] if a.checks else [])
        cmd += ["--no-bench"] if a.no_bench else []
        print(f"== {n}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, timeout=a.timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            if p.returncode:
                d["rungs"][n]["error"] = f"worker exit {p.returncode}"
        except subprocess.TimeoutExpired:
            d["rungs"][n]["error"] = f"timed out after {a.timeout} s (hung kernel?)"
        d["rungs"][n]["seconds"] = round(time.time() - t0, 1)
        if tmp.exists():
            w = json.loads(tmp.read_text())
            d["rows"] += w["rows"]
            if "autotune" in w:
                d["rungs"][n]["autotune"] = w["autotune"]
            if "copy_gbps" in w:
                d["env"]["copy_gbps"] = w["copy_gbps"]
            tmp.unlink()
        save()
    print("\n" + table(d))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
