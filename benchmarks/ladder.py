"""One runner for every step's solution ladder: build, check, time, write one JSON, print a table.

    PYTHONPATH=src:. python -m benchmarks.ladder STEP [--only RUNGS] [--quick] [--out DIR]
    PYTHONPATH=src:. python -m benchmarks.ladder 06 --sanitize [--only v6_fa2_tiles_lazy] [--checks small,ragged]

STEP is 05 to 10; what it runs comes from solutions/NN_*/step.toml (facourse.steps):
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
Triton rungs are loaded from their file; CUDA rungs are built with facourse.cuda_build's
load_cuda_extension (rung .cu + the step's fa_binding.cpp; sm_90a for step 07), all at once in a
process pool. Each rung then runs in its own process under --timeout (a hung kernel costs that
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


def backends(m: dict, solution: bool) -> list[str]:
    ref = m["reference"]["backend"]
    return ["FLASH_ATTENTION", "CUDNN_ATTENTION"] if solution else list(dict.fromkeys([ref, "FLASH_ATTENTION"]))


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
           for be in backends(m, sol)]
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
    for cname, dt, be in [bds[0]] + bds:          # the first, twice: clocks rising, autotuning
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
        row["seconds"] = round(time.time() - t0, 2)
        res["rows"].append(row)
        save()
    res["rows"].pop(len(cks))                     # the discarded first timing


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
    unit, key = ("GB/s", "gbps") if d.get("mode") == "decode" else ("TFLOP/s", "tflops")
    if by:
        lines.append(f"{'rung':>22} {'config':>14} {'dtype':>8} {unit:>7}  vs reference: ratio (ref {unit})")
    for (name, cname, dt), d2 in by.items():
        first = next(iter(d2.values()))
        refs = "  ".join(f"{be}: {r['ratio']:.2f}x ({r[key + '_ref']:.0f})" for be, r in d2.items())
        copy = f" ({first['copy_fraction']:.0%} of a copy)" if "copy_fraction" in first else ""
        lines.append(f"{name:>22} {cname:>14} {dt:>8} {first[key]:7.0f}{copy}  {refs}")
    return "\n".join(lines)


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
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    m = load_step(a.step)
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
