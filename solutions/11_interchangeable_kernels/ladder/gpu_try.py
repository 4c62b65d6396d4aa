"""On a GPU: check the TileLang FlashAttention forward (tilelang_fa.py) and time it against SDPA's FA2.

    PYTHONUNBUFFERED=1 python solutions/11_interchangeable_kernels/ladder/gpu_try.py [--quick] [--no-sweep] [--out DIR]

With tilelang on PYTHONPATH (tools/carry_tilelang.py prints the line that unpacks its archive and
sets PYTHONPATH and TILELANG_CACHE_DIR: the archive's kernels are already built, so nothing compiles).

1. Builds (or loads from TileLang's disk cache) every kernel the run needs, in parallel threads.
2. Checks ``flash_attention_tilelang`` with ``facourse.check_entry_point`` (the lse too) on the five
   configurations, ``long`` and every edge case (facourse.configs.EDGE_CASES), in fp16 and bf16, on
   the strided [B, S, H, D] views the hidden tests pass; then ``large`` and ``long`` on contiguous
   [B, H, S, D] inputs (the path the benchmark times: no copy) and two calls with a given scale.
3. Times it with ``facourse.bench_attention`` (GPU time, L2 flushed, median of 25 interleaved with the
   reference) against SDPA's FLASH_ATTENTION backend (FA2) on ``large`` and ``long``, fp16 and bf16, on
   contiguous [B, H, S, D]; then fp16 on [B, S, H, D] storage (the kernel's other layout, read in place);
   then, where flashinfer is installed (tools/carry_tilelang.py --flashinfer), fp16 against FlashInfer's
   prefill kernel (the bench's FLASHINFER reference: its FA3 kernel on Hopper), the seed's reference.
4. The tile sweep (unless --no-sweep): each of tilelang_fa.SWEEP_TILES on ``large`` and ``long``,
   fp16, after a check of each on ``ragged``, ``large`` and ``long``.

Every case is caught and recorded: a failure is a row with its error, and the run goes on. A case
that hangs is stopped by a watchdog (faulthandler: the traceback, then exit 3) after the JSON of the
rows so far was written. --quick: fp16 only, no sweep. Prints a table last; writes
``tilelang_gpu_try.json`` to --out, else to $OUT when it is set. Exit status 0 when every check passed.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import faulthandler
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT / "src"), str(HERE)]

import torch  # noqa: E402

import tilelang_fa as fa  # noqa: E402
from facourse.bench import FLASHINFER, TIMING, bench_attention, flashinfer_available  # noqa: E402
from facourse.check import check_entry_point  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, LONG_CONFIG  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
CASE_TIMEOUT_S = 300          # one check or one benchmark; the watchdog ends the run past it
BUILD_TIMEOUT_S = 600


def env_info() -> dict:
    info = {"date": datetime.date.today().isoformat(), "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "capability": list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None,
            "tilelang_cache_dir": os.environ.get("TILELANG_CACHE_DIR", "~/.tilelang/cache (default)")}
    for mod in ("tilelang", "triton", "tvm_ffi", "flashinfer"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            info[mod] = f"not importable: {type(e).__name__}: {e}"[:200]
    try:
        info["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except Exception:  # noqa: BLE001
        info["nvcc"] = None
    return info


class Run:
    def __init__(self, out: Path | None):
        self.path = (out / "tilelang_gpu_try.json") if out else None
        self.d = {"script": "solutions/11_interchangeable_kernels/ladder/gpu_try.py", "env": env_info(),
                  "timing": TIMING, "reference": "FLASH_ATTENTION",
                  "tiles": {str(D): t.label() for D, t in fa.TILES.items()}, "builds": [], "rows": []}

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.d, indent=1))

    def row(self, **kw) -> dict:
        self.d["rows"].append(kw)
        self.save()
        return kw


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:1500]


def build_all(run: Run, sweep: bool) -> None:
    """Every kernel the run uses, compiled in threads (lowering releases the GIL; nvcc is a subprocess)."""
    kernels = fa.planned_kernels(sweep)
    t_all = time.time()

    def one(k):
        t0 = time.time()
        fa.compile_kernel(*k)
        return time.time() - t0

    faulthandler.dump_traceback_later(BUILD_TIMEOUT_S, exit=True)
    with cf.ThreadPoolExecutor(max(1, min(len(kernels), os.cpu_count() or 4))) as ex:
        futs = {ex.submit(one, k): k for k in kernels}
        for f in cf.as_completed(futs):
            dt, D, causal, tiles, *layout = futs[f]
            rec = {"dtype": dt, "D": D, "causal": causal, "tiles": tiles.label(), "layout": (layout or ["bhsd"])[0]}
            try:
                rec["seconds"] = round(f.result(), 2)
            except Exception as e:  # noqa: BLE001
                rec["error"] = error_text(e)
                print(f"  BUILD FAILED {dt} D={D} causal={causal} {tiles.label()}: {rec['error'][:400]}", flush=True)
            run.d["builds"].append(rec)
    faulthandler.cancel_dump_traceback_later()
    secs = [b["seconds"] for b in run.d["builds"] if "seconds" in b]
    run.d["build_wall_s"] = round(time.time() - t_all, 1)
    run.save()
    print(f"built {len(secs)}/{len(kernels)} kernels in {run.d['build_wall_s']} s "
          f"({sum(s < 2 for s in secs)} from the disk cache; slowest {max(secs, default=0):.1f} s)", flush=True)


def check(run: Run, name: str, dtype: str, *, layout: str = "bshd", scale=None, tiles: str | None = None) -> bool:
    cfg = LONG_CONFIG if name == "long" else name
    row = {"kind": "check", "config": name, "dtype": dtype, "layout": layout, "tiles": tiles or "table"}
    if scale is not None:
        row["scale"] = scale
    t0 = time.time()
    faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
    try:
        check_entry_point(fa.flash_attention_tilelang, cfg, device="cuda", dtype=DTYPES[dtype], layout=layout,
                          expect_lse=True, scale=scale, verbose=False, seed=1000 + len(run.d["rows"]))
        row["check"] = "ok"
    except Exception as e:  # noqa: BLE001
        row.update(check="error", error=error_text(e))
        print(f"  FAIL {name} {dtype} {layout}{'' if scale is None else f' scale={scale}'}"
              f"{'' if tiles is None else ' ' + tiles}: {row['error'][:600]}", flush=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
    row["seconds"] = round(time.time() - t0, 2)
    run.row(**row)
    return row["check"] == "ok"


def bench(run: Run, name: str, dtype: str, tiles: str | None = None, layout: str = "bhsd",
          backend: str = "FLASH_ATTENTION") -> None:
    cfg = LONG_CONFIG if name == "long" else name
    row = {"kind": "bench", "config": name, "dtype": dtype, "tiles": tiles or "table", "ref_backend": backend,
           "layout": layout}
    t0 = time.time()
    faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
    try:
        b = bench_attention(fa.flash_attention_tilelang, cfg, backend=backend, dtype=DTYPES[dtype],
                            layout=layout)
        row.update(ref_backend=b.backend, tflops=round(b.tflops_student, 1), tflops_ref=round(b.tflops_ref, 1),
                   ratio=round(b.ratio, 3), ms=round(b.t_student_ms, 4), ms_ref=round(b.t_ref_ms, 4),
                   host_us=round(b.host_student_us, 1), host_ref_us=round(b.host_ref_us, 1))
        print(f"  {name:>6} {dtype:>8} {layout} {row['tiles']:<50} {b.tflops_student:6.0f} TFLOP/s vs {b.backend} "
              f"{b.tflops_ref:6.0f}"
              f"  x{b.ratio:.2f}", flush=True)
    except Exception as e:  # noqa: BLE001
        row["error"] = error_text(e)
        print(f"  BENCH FAILED {name} {dtype} {row['tiles']}: {row['error'][:600]}", flush=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
    row["seconds"] = round(time.time() - t0, 2)
    run.row(**row)


def table(run: Run) -> str:
    rows = run.d["rows"]
    checks = [r for r in rows if r["kind"] == "check"]
    ok = sum(r["check"] == "ok" for r in checks)
    lines = [f"checks: {ok}/{len(checks)} passed; 'table' = tilelang_fa.TILES: "
             + "; ".join(f"D={D}: {t}" for D, t in run.d["tiles"].items())]
    lines += [f"  FAILED {r['config']} {r['dtype']} {r['layout']} {r['tiles']}: {r['error'][:200]}"
              for r in checks if r["check"] != "ok"]
    lines.append(f"{'config':>8} {'dtype':>9} {'layout':>6} {'tiles':<50} {'TileLang':>9} {'ref':>7} {'ratio':>6}"
                 "  reference   (TFLOP/s, forward)")
    for r in rows:
        if r["kind"] == "bench":
            lay = r.get("layout", "bhsd")
            if "error" in r:
                lines.append(f"{r['config']:>8} {r['dtype']:>9} {lay:>6} {r['tiles']:<50} error: {r['error'][:80]}")
            else:
                lines.append(f"{r['config']:>8} {r['dtype']:>9} {lay:>6} {r['tiles']:<50} {r['tflops']:>9.0f} "
                             f"{r['tflops_ref']:>7.0f} {r['ratio']:>5.2f}x  {r['ref_backend']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fp16 only, no tile sweep")
    ap.add_argument("--no-sweep", action="store_true", help="skip the tile sweep")
    ap.add_argument("--out", type=Path, default=None, help="folder for tilelang_gpu_try.json (default: $OUT)")
    args = ap.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    run = Run(out)
    print(json.dumps(run.d["env"]), flush=True)
    run.save()
    if not torch.cuda.is_available():
        print("no GPU here: nothing to check or time (tilelang_fa.hopper_source shows the code on a CPU)")
        return 2
    sweep = not (args.quick or args.no_sweep)
    dtypes = ["float16"] if args.quick else ["float16", "bfloat16"]
    try:
        build_all(run, sweep)
    except Exception as e:  # noqa: BLE001 (checks below report per case what is missing)
        print(f"building failed: {error_text(e)}\n{traceback.format_exc()}", flush=True)
        run.d["build_error"] = error_text(e)
        run.save()

    print("checks (facourse.check_entry_point, with lse):", flush=True)
    for dt in dtypes:
        for name in [*CONFIGS, "long", *EDGE_CASES]:
            check(run, name, dt)
        for name in ("large", "long"):
            check(run, name, dt, layout="bhsd")
    check(run, "ragged", "float16", scale=0.3)
    check(run, "noncausal", dtypes[-1], scale=0.05)

    print("timing against SDPA FLASH_ATTENTION (facourse.bench_attention):", flush=True)
    for _ in range(2):   # discarded: a fresh GPU's first timings read slow while its clocks rise
        try:
            bench_attention(fa.flash_attention_tilelang, "large", backend="FLASH_ATTENTION", rounds=20)
        except Exception:  # noqa: BLE001 (the rows below record it)
            break
    for dt in dtypes:
        for name in ("large", "long"):
            bench(run, name, dt)
    for name in ("large", "long"):      # [B, S, H, D] storage, read in place (tilelang_fa.BSHD_DIMS)
        bench(run, name, "float16", layout="bshd")
    if flashinfer_available():           # the seed's reference (its carried modules: fp16, D 128)
        for name in ("large", "long"):
            bench(run, name, "float16", backend=FLASHINFER)

    if sweep:
        print("tile sweep (fp16, D = 128):", flush=True)
        for t in fa.SWEEP_TILES:
            if t == fa.TILES[128]:
                continue
            fa.FORCE_TILES = t
            try:
                good = all([check(run, n, "float16", tiles=t.label(), layout=lay)
                            for n, lay in (("ragged", "bshd"), ("large", "bhsd"), ("long", "bhsd"))])
                if good:
                    for name in ("large", "long"):
                        bench(run, name, "float16", tiles=t.label())
            finally:
                fa.FORCE_TILES = None

    print(table(run), flush=True)
    if run.path:
        print(f"wrote {run.path}")
    checks = [r for r in run.d["rows"] if r["kind"] == "check" and r["tiles"] == "table"]
    return 0 if checks and all(r["check"] == "ok" for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
