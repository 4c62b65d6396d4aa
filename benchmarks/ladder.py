"""One runner for every step's solution ladder: build, check, time, write one JSON, print a table.

    PYTHONPATH=src:. python -m benchmarks.ladder STEP [--only RUNGS] [--quick] [--out DIR]
    PYTHONPATH=src:. python -m benchmarks.ladder STEP --check-only          # every rung's checks, fp16, no timing
    PYTHONPATH=src:. python -m benchmarks.ladder 10 --only v6_hopper_window --methods   # + do_bench and events
    PYTHONPATH=src:. python -m benchmarks.ladder 06 --sanitize [--only v6_fa2_tiles_lazy] [--checks small,ragged]
    PYTHONPATH=src:. python -m benchmarks.ladder 12 [--only RUNGS] [--quick] [--cpu-smoke]
    PYTHONPATH=src:. python -m benchmarks.ladder 11 --traces [--quick]

STEP is a step with a ladder (05-13, 15); what it runs comes from solutions/NN_*/step.toml (facourse.steps) and the step's kind
(facourse.kinds: ``[exercise] mode``, the forward when absent; a rung whose entry point is a kind of its
own, step 10's FP8 forward, is that kind). For each rung, as llm.c's dev/cuda does, the checks first
(``Kind.check_cases``, each through ``Kind.check``; the solution on every case in fp16 and bf16, another
rung on its manifest's one ``check``), then, on a GPU and only when every check passed, the timings
(``Kind.bench_cases``: the solution on the kind's full sweep, another rung on its manifest's ``bench``
list), the first timing run ``Kind.warmups`` times more and discarded (clocks rising, autotuning), and
which tiles the rung's Triton autotuners picked. What each kind checks and times is in its module's
docstring; step 12's rungs run in a world of spawned ranks (benchmarks/ring_world.py).

Triton rungs are loaded from their file; CUDA rungs are built (benchmarks/rungs.py) all at once in a
process pool (a Python rung that calls CUDA builds it itself on its first call: step 10's
v6_hopper_window, step 07's kernel with a sliding window, on an H100/H200). Each rung then runs in its
own process under --timeout (a hung kernel costs that rung, not the run). --quick: fp16 only, the 4k-16k
points only. --sanitize runs compute-sanitizer (memcheck, racecheck, synccheck) over the checks of one
CUDA rung (default: the solution) and writes the tools' reports instead.

Writes DIR/<date>_<gpu>_stepNN.json in the one results schema (facourse.schema.Run; read by
benchmarks/tables.py and facourse.results) after every rung, and prints a short table last.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.rungs import ROOT, entry_point, env_info, gpu_tag, prebuild  # noqa: I001 (puts src/ on the path)

from facourse import kinds
from facourse.kinds.base import DTYPES
from facourse.schema import SCHEMA, validate
from facourse.steps import load_step, rung


def plan(m: dict, name: str, quick: bool, checks: list[str] | None = None) -> tuple[list, list]:
    """(checks [(case, dtype)], timings [kinds.base.Bench]) of one rung, as its kind plans them."""
    import torch
    gpu = torch.cuda.is_available()
    sol = name == m["ladder"]["solution"]
    dtypes = DTYPES[:1] if quick or not gpu else DTYPES
    r = rung(m, name)
    kind = kinds.of_rung(m, r)
    explicit = checks is not None
    cases = checks if explicit else kind.check_cases(m, r, sol)
    cks = [(c, dt) for dt in (dtypes if sol or explicit else DTYPES[:1]) for c in cases]
    return cks, kind.bench_cases(m, r, sol, quick, dtypes) if gpu else []


def _record(rows: list, row: dict, work, save, fail: dict, limit: int) -> dict:
    """Run ``work()``: its fields go into the row, or ``fail`` and its error (cut at ``limit``); time it;
    append the row and save."""
    t0 = time.time()
    try:
        row.update(work() or {})
    except Exception as e:  # noqa: BLE001 (record every failure, keep going)
        row.update(fail, error=f"{type(e).__name__}: {e}"[:limit])
    row["seconds"] = round(time.time() - t0, 2)
    rows.append(row)
    save()
    return row


def _check(kind, fn, case, dev, dtype) -> dict:
    return {**(kind.check(fn, case, dev, dtype) or {}), "check": "ok"}


def run_rung(m: dict, name: str, quick: bool, out: Path, checks: list[str] | None = None,
             bench: bool = True) -> None:
    """Check, then time, one rung (a worker process); rows go to ``out`` (JSON) after every one."""
    import torch

    res: dict = {"rows": []}
    save = lambda: out.write_text(json.dumps(res))  # noqa: E731
    kind = kinds.of_rung(m, rung(m, name))
    fn = entry_point(m, name)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cks, bds = plan(m, name, quick, checks)
    for case, dt in cks:
        row = _record(res["rows"], {"rung": name, "config": case, "dtype": dt, "kind": "check"},
                      lambda: _check(kind, fn, case, dev, getattr(torch, dt)), save, {"check": "error"}, 1500)
        if row["check"] != "ok":
            print(f"  FAIL {name} {case} {dt}: {row['error'][:300]}", flush=True)
    if not bench or not bds:
        return
    if not all(r["check"] == "ok" for r in res["rows"]):
        print(f"  {name}: a check failed, not timed", flush=True)
        return
    ctx = kind.prepare()
    res.update(ctx)
    for i, b in enumerate([bds[0]] * kind.warmups + bds):
        row = {"rung": name, "config": b.config, "dtype": b.dtype, "kind": "bench", **b.extra}
        work, fail = (lambda: kind.bench(fn, b, ctx)), {"ref_backend": b.backend}
        if i < kind.warmups:                    # discarded: a fresh GPU's clocks rise, autotuners tune
            _record([], row, work, lambda: None, fail, 500)
            continue
        row = _record(res["rows"], row, work, save, fail, 500)
        if "ratio" in row:
            print(kind.bench_line(name, row), flush=True)
    tuned = [v for v in getattr(fn, "__globals__", {}).values() if hasattr(v, "cache") and hasattr(v, "configs")]
    if tuned:                                   # which tiles the autotuners picked, per key
        res["autotune"] = {str(k): str(v) for t in tuned for k, v in t.cache.items()}
        save()


def table(d: dict) -> str:
    """The short summary printed last: check counts per rung, then the kind's bench rows."""
    lines = [f"step {d['step']} on {d['env']['gpu']} ({d['env']['date']}); ratio = t_ref / t_rung (> 1: faster)"]
    for name, info in d["rungs"].items():
        c = [r for r in d["rows"] if r["rung"] == name and r["kind"] == "check"]
        ok = sum(r["check"] == "ok" for r in c)
        err = f"  ERROR {info['error'][-200:]}" if "error" in info else ""
        lines.append(f"{name:>22}: checks {ok}/{len(c)}{err}")
        lines += [f"      FAIL {r['config']} {r['dtype']}: {r['error'][:160]}" for r in c if r["check"] != "ok"]
    return "\n".join(lines + kinds.of_results(d).summary_lines(d))


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


def _prebuild_all(m: dict, names: list[str], d: dict) -> None:
    """nvcc for every CUDA rung at once (the parent's CUDA: spawned workers, never forked)."""
    import torch
    cuda = [n for n in names if rung(m, n)["file"].endswith(".cu")]
    if not cuda:
        return
    major, minor = torch.cuda.get_device_capability()
    with cf.ProcessPoolExecutor(max_workers=min(len(cuda), os.cpu_count() or 1),
                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futs = {n: pool.submit(prebuild, m["step"]["id"], n, f"sm_{major}{minor}") for n in cuda}
        for n, f in futs.items():
            try:
                d["rungs"][n]["build_s"] = f.result()
            except Exception:  # noqa: BLE001
                d["rungs"][n]["error"] = "build failed:\n" + traceback.format_exc()[-3000:]


def run(m: dict, names: list[str], a: argparse.Namespace, out: Path) -> tuple[dict, Path]:
    """Every rung in its own worker process, one after the other; the results file after each."""
    from facourse.bench import TIMING
    sid, env = m["step"]["id"], env_info()
    d = {"schema": SCHEMA, "step": sid, "env": env, "timing": TIMING, "reference": m["reference"]["backend"],
         **({"mode": m["exercise"]["mode"]} if "mode" in m["exercise"] else {}), "solution": m["ladder"]["solution"],
         "rungs": {n: {"file": rung(m, n)["file"], "verdict": rung(m, n)["verdict"]} for n in names}, "rows": []}
    path = out / f"{env['date']}_{gpu_tag(env['gpu'])}_step{sid}.json"

    def save():
        validate(d)
        path.write_text(json.dumps(d, indent=1))

    print(json.dumps(env), flush=True)
    if any(rung(m, n)["file"].endswith(".cu") for n in names):
        _prebuild_all(m, names, d)
        save()
    flags = (["--quick"] if a.quick else []) + (["--checks", a.checks] if a.checks else [])
    flags += ["--no-bench"] if a.no_bench else []
    flags += ["--methods"] if a.methods else []
    for n in names:
        if "error" in d["rungs"][n]:
            continue
        tmp = out / f".rung_{sid}_{n}.json"
        tmp.unlink(missing_ok=True)
        print(f"== {n}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "benchmarks.ladder", sid, "--worker", n, "--worker-out", str(tmp),
                                *flags], cwd=ROOT, timeout=a.timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            if p.returncode:
                d["rungs"][n]["error"] = f"worker exit {p.returncode}"
        except subprocess.TimeoutExpired:
            d["rungs"][n]["error"] = f"timed out after {a.timeout} s (hung kernel?)"
        d["rungs"][n]["seconds"] = round(time.time() - t0, 1)
        if tmp.exists():
            w = json.loads(tmp.read_text())
            d["rows"] += w.pop("rows")
            if "autotune" in w:
                d["rungs"][n]["autotune"] = w.pop("autotune")
            d["env"].update(w)                 # what the kind measured once (a decode: the copy rate)
            tmp.unlink()
        save()
        # each rung's checks as it ends: a run cut short still shows what passed
        checks = [r["check"] for r in d["rows"] if r.get("rung") == n and r.get("kind") == "check"]
        print(f"-- {n}: checks {checks.count('ok')}/{len(checks)}, {d['rungs'][n]['seconds']:.0f} s"
              + (f"; {d['rungs'][n]['error']}" if "error" in d["rungs"][n] else ""), flush=True)
    return d, path


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
    ap.add_argument("--methods", action="store_true",
                    help="also time every bench row with do_bench back to back and with events without the spin "
                         "(the row's ratio_methods): for a ratio near its bar")
    ap.add_argument("--check-only", action="store_true",
                    help="a quick correctness pass: every rung's checks in fp16, no timing (--quick --no-bench)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="step 12: the ring path on 2 CPU ranks (gloo), tiny shapes: a test of the runner")
    ap.add_argument("--traces", action="store_true",
                    help="step 11: the solution kernels of 05, 06, 07 and 11 as FlashInfer-Bench solutions, "
                         "traced over the seed's workloads, then apply()'s choices re-timed (benchmarks/traces.py)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.check_only:
        a.quick = a.no_bench = True
    m = load_step(a.step)
    out = Path(a.out)
    if a.traces:
        if m["step"]["id"] != "11":
            print("--traces is step 11's")
            return 2
        from benchmarks.traces import run as run_traces
        out.mkdir(parents=True, exist_ok=True)
        return run_traces(out, a.quick)
    if not m["rungs"]:
        print(f"step {a.step} has no solution ladder")
        return 2
    checks = a.checks.split(",") if a.checks else None
    if a.worker:
        if a.methods:
            from facourse import bench
            bench.CROSS_CHECK = True
        run_rung(m, a.worker, a.quick, Path(a.worker_out), checks, bench=not a.no_bench)
        return 0
    names = [r["name"] for r in m["rungs"] if not a.only or r["name"] in a.only.split(",")]
    names.sort(key=lambda n: n != m["ladder"]["solution"])   # the solution first: a run cut short still has it
    out.mkdir(parents=True, exist_ok=True)
    if kinds.of_step(m).world:
        from benchmarks import ring_world
        done = ring_world.run(m, names, out, a.quick, a.cpu_smoke, checks, not a.no_bench, a.timeout)
        if done is None:
            return 2
        d, path = done
    elif a.sanitize:
        return sanitize(m, names if a.only else [m["ladder"]["solution"]],
                        checks or ["small", "ragged", "empty_rows", "decode"], out)
    else:
        import torch
        if m.get("build", {}).get("arch") == "sm_90a" and (not torch.cuda.is_available()
                                                           or torch.cuda.get_device_capability() != (9, 0)):
            print(f"step {m['step']['id']} runs on a Hopper GPU (sm_90a: H100 or H200) only")
            return 2
        d, path = run(m, names, a, out)
    print("\n" + table(d))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
