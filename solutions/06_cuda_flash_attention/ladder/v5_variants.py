"""Step 06, rung v5: check and time the kernel variants of v5_warp_specialized.cu on a GPU.

    python solutions/06_cuda_flash_attention/ladder/v5_variants.py [--lib DIR] [--only a,b] [--quick]

v5_warp_specialized.cu built with -DV5_VARIANTS exports fa_launch_variant(params, stream, i) and
fa_variant_name(i): one configuration each (consumer warps, rows per warp, BLOCK_N, stages,
producer warp or not, softmax overlap or not, ...). This script builds that file with nvcc alone
into a shared library (no torch headers: seconds, not minutes; or takes the one in --lib), calls
it through ctypes with the same FaParams the torch binding fills, checks each variant with
facourse.check_entry_point and times it with facourse.bench_attention against SDPA's
FLASH_ATTENTION backend. Any other `NAME.so` in --lib that exports fa_launch is measured too; the
committed results hold three such: solution_v4 (the exercise's harness), solution_h64 (the
exercise's harness with -DFA_HARNESS_WARPS=4 -DFA_HARNESS_MIN_BLOCKS=2) and solution_ws (a
candidate harness with a producer warp and the softmax overlap, 0.62-0.73x FA2: not adopted, and
removed from the tree after that run; `git show f1fcc0c:solutions/06_cuda_flash_attention/ladder/
harness_candidates/ws/fa_harness.cuh` has it, built with -I to its folder), each the solution's
four functions built with

    nvcc -shared -Xcompiler -fPIC -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 \
         [-DFA_HARNESS_WARPS=4 -DFA_HARNESS_MIN_BLOCKS=2] \
         -I ladder -I . ladder/student_kernel_solution.cu -o LIB/solution_h64.so

(run in solutions/06_cuda_flash_attention/; v5_variants.so the same way from v5_warp_specialized.cu
with -DV5_VARIANTS). Writes $OUT/step06_v5_variants.json and prints a table last.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

LADDER = Path(__file__).resolve().parent
HERE = LADDER.parent

from facourse import CONFIGS, EDGE_CASES, bench_attention, check_entry_point, validate_inputs  # noqa: E402
from facourse.cuda_build import gencode_flag  # noqa: E402

from facourse.configs import SWEEP as _ALL, SWEEP_4K_16K  # noqa: E402

SWEEP = [_ALL[n] for n in SWEEP_4K_16K]   # the 4k-16k points: noncausal_4k ... causal_16k


class FaParams(ctypes.Structure):  # fa_params.h
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p)] + [
        (f"{t}_{s}", ctypes.c_int64) for t in "qkvo" for s in ("sb", "sh", "ss")] + [
        (n, ctypes.c_int) for n in ("B", "Hq", "Hkv", "Sq", "Skv", "D")] + [
        ("scale", ctypes.c_float), ("causal", ctypes.c_int), ("is_bf16", ctypes.c_int), ("window", ctypes.c_int)]


def build(out_dir: Path, arch: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / "v5_variants.so"
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", gencode_flag(arch), "-DV5_VARIANTS",
           f"-I{LADDER}", f"-I{HERE}", str(LADDER / "v5_warp_specialized.cu"), "-o", str(so)]
    subprocess.run(cmd, check=True)
    return so


def _launcher(lib, variant: int | None):
    if variant is None:
        f = lib.fa_launch
        f.argtypes = [ctypes.POINTER(FaParams), ctypes.c_void_p]
        return lambda p, s: f(ctypes.byref(p), s)
    f = lib.fa_launch_variant
    f.argtypes = [ctypes.POINTER(FaParams), ctypes.c_void_p, ctypes.c_int]
    return lambda p, s: f(ctypes.byref(p), s, variant)


def entry_point(lib, variant: int | None, name: str):
    """flash_attention_cuda(q, k, v, causal, scale) -> (o, lse), as fa_binding.cpp does it."""
    launch = _launcher(lib, variant)

    def fn(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale

        def aligned(t):
            return t.data_ptr() % 16 == 0 and all(t.stride(i) % 8 == 0 for i in range(3))
        q, k, v = (t if aligned(t) else t.contiguous() for t in (q, k, v))
        B, Hq, Sq, D = q.shape
        o = torch.empty(B, Hq, Sq, D, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)
        if k.shape[2] == 0:
            o.zero_()
            lse.fill_(-float("inf"))
            return o, lse
        p = FaParams(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                     *[t.stride(i) for t in (q, k, v, o) for i in range(3)],
                     B, Hq, k.shape[1], Sq, k.shape[2], D, float(scale), int(bool(causal)),
                     int(q.dtype == torch.bfloat16))
        err = launch(p, torch.cuda.current_stream().cuda_stream)
        if err != 0:
            raise RuntimeError(f"{name}: launch failed with cudaError {err}")
        return o, lse

    fn.__name__ = name
    return fn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="", help="folder with a prebuilt v5_variants.so (and other NAME.so)")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--quick", action="store_true", help="check fp16 only (not bf16)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the variants already in $OUT's JSON; one that started and never finished is marked hung")
    ap.add_argument("--watchdog", type=float, default=90.0, help="seconds a variant may take before the process exits")
    ap.add_argument("--bench", default="", help="comma-separated config names to time (default: large + sweep)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("v5_variants.py needs a CUDA GPU")
        return 2
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    major, minor = torch.cuda.get_device_capability()
    libdir = Path(a.lib) if a.lib else out / "build_v5"
    so = libdir / "v5_variants.so"
    try:
        libs = {"v5_variants": ctypes.CDLL(str(so))}
    except OSError:
        libs = {"v5_variants": ctypes.CDLL(str(build(out / "build_v5", f"sm_{major}{minor}")))}
    for extra in sorted(libdir.glob("*.so")):
        if extra.stem != "v5_variants":
            libs[extra.stem] = ctypes.CDLL(str(extra))
    todo = []
    names = libs["v5_variants"].fa_variant_name
    names.restype = ctypes.c_char_p
    i = 0
    while (n := names(i)) is not None:
        todo.append((n.decode(), libs["v5_variants"], i))
        i += 1
    todo.append(("v5_default", libs["v5_variants"], None))
    todo += [(n, lib, None) for n, lib in libs.items() if n != "v5_variants"]
    if a.only:
        keep = a.only.split(",")
        todo = [t for t in todo if t[0] in keep]
    dtypes = ["float16"] if a.quick else ["float16", "bfloat16"]
    if a.bench:
        bench_cfgs = [c for c in ["large", *SWEEP] if (c if isinstance(c, str) else c.name) in a.bench.split(",")]
    else:
        bench_cfgs = ["large", *SWEEP]
    path = out / "step06_v5_variants.json"
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": {}}
    if a.resume and path.exists():
        report = json.loads(path.read_text())
    for name, lib, idx in todo:
        old = report["variants"].get(name)
        if old is not None:
            if not old.get("done"):
                old.update(done=True, error="did not finish: hung or crashed the process (see the log)")
                path.write_text(json.dumps(report, indent=1))
            continue
        t0 = time.time()
        e = report["variants"][name] = {"check": {}, "bench": {}, "done": False}
        path.write_text(json.dumps(report, indent=1))
        # a deadlocked kernel never returns: leave the process (a --resume run skips this variant)
        dog = threading.Timer(a.watchdog, lambda: (print(f"{name}: watchdog fired", flush=True), os._exit(3)))
        dog.start()
        fn = entry_point(lib, idx, name)
        try:
            for dt in dtypes:
                for c in list(CONFIGS) + list(EDGE_CASES):
                    try:
                        check_entry_point(fn, c, device="cuda", dtype=getattr(torch, dt), expect_lse=True, verbose=False)
                        e["check"][f"{c}/{dt}"] = "ok"
                    except Exception as ex:  # noqa: BLE001
                        e["check"][f"{c}/{dt}"] = f"FAIL {type(ex).__name__}: {str(ex)[:300]}"
                        if "CUDA" in str(ex) or "cudaError" in str(ex):   # the context is gone: restart
                            e.update(done=True, error=f"CUDA error: {str(ex)[:300]}")
                            path.write_text(json.dumps(report, indent=1))
                            os._exit(4)
            if e["check"].get("large/float16") == "ok":   # time it (a failure elsewhere is still reported)
                for cfg in bench_cfgs:
                    cname = cfg if isinstance(cfg, str) else cfg.name
                    try:
                        r = bench_attention(fn, cfg, backend="FLASH_ATTENTION")
                        e["bench"][cname] = {**r.as_dict(), "summary": r.summary()}
                    except Exception as ex:  # noqa: BLE001
                        e["bench"][cname] = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
        except Exception:  # noqa: BLE001
            e["error"] = traceback.format_exc()[-1500:]
        dog.cancel()
        e["seconds"] = round(time.time() - t0, 1)
        e["done"] = True
        path.write_text(json.dumps(report, indent=1))
        print(f"{name}: {sum(x == 'ok' for x in e['check'].values())}/{len(e['check'])} checks, {e['seconds']} s",
              flush=True)
    cols = [c if isinstance(c, str) else c.name for c in bench_cfgs]
    print(f"\nv5 variants on {report['gpu']}: TFLOP/s (ratio to SDPA FLASH_ATTENTION)")
    print(f"{'variant':20s} {'checks':>7s} " + " ".join(f"{c:>13s}" for c in cols))
    for name, e in report["variants"].items():
        nok = sum(x == "ok" for x in e["check"].values())
        cells = [f"{b['tflops_student']:5.0f} ({b['ratio']:.2f}x)" if (b := e["bench"].get(c)) and "ratio" in b
                 else f"{'-':>13s}" for c in cols]
        print(f"{name:20s} {nok:3d}/{len(e['check']):<3d} " + " ".join(f"{x:>13s}" for x in cells))
        for k, x in e["check"].items():
            if x != "ok":
                print(f"    {k}: {x[:200]}")
        if e.get("error"):
            print("    " + e["error"].strip().splitlines()[-1][:200])
    print("FA2 TFLOP/s: " + " ".join(
        f"{c}={b['tflops_ref']:.0f}" for c in cols
        if (b := next((e['bench'].get(c) for e in report['variants'].values() if 'ratio' in e['bench'].get(c, {})), None))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
