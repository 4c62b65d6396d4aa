"""Step 13's measurements: the course's own kernels under Nsight Compute, one process per target.

    PYTHONPATH=src:. python -m benchmarks.counters --out DIR [--targets NAME,...]
    PYTHONPATH=src:. python -m benchmarks.counters --out DIR --from-raw RUN/ncu_raw.json   # KEEP changed, no GPU

Each target (``TARGETS``: a ladder rung on a configuration, an SDPA backend, or a calibration kernel for the
roofs) runs in its own process under ``ncu``: warm-up calls first (compilation, autotuning), then one call
inside the NVTX range ``profile``, the only range ncu collects. Every kernel launched in it is one record: the
raw metrics of the sections below (the launch, occupancy, speed of light, memory and compute workload, warp
states, the rooflines), at ncu's default locked base clocks. Writes DIR/ncu_profile.json
(``facourse.schema.ProfileRun``: the metrics in ``KEEP``), every raw metric in DIR/ncu_raw.json, and prints a
table last.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT / "src"), str(ROOT)) if p not in sys.path]

SECTIONS = ("LaunchStats", "Occupancy", "SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis",
            "WarpStateStats", "SchedulerStats", "SpeedOfLight_RooflineChart",
            "SpeedOfLight_HierarchicalTensorRooflineChart")
#: name -> (step, rung or backend, configuration); step "cal": the roofs' calibration kernels
TARGETS = {
    "copy": ("cal", "copy", "1 GiB fp16 device-to-device copy"),
    "gemm": ("cal", "gemm", "fp16 GEMM 8192^3"),
    "vanilla": ("01", "vanilla_attention", "large"),
    "05_v2": ("05", "v2_online_softmax", "large"),
    "05_v3": ("05", "v3_causal_split", "large"),
    "05_v4": ("05", "v4_autotuned", "large"),
    "05_v6": ("05", "v6_host_tma", "large"),
    "06_v1": ("06", "v1_scalar", "large"),
    "06_v2": ("06", "v2_mma", "large"),
    "06_v4": ("06", "v4_swizzle", "large"),
    "06_v6": ("06", "v6_fa2_tiles_lazy", "large"),
    "07_v4": ("07", "v4_persistent", "large"),
    "07_v14": ("07", "v14_desc_add", "large"),
    "09_v1": ("09", "v1_one_program_per_head", "b64_8k_p16"),
    "09_v3": ("09", "v3_gqa_packed", "b64_8k_p16"),
    "09_v4": ("09", "v4_tuned", "b64_8k_p16"),
    "08_v3": ("08", "v3_tma_causal_split", "large"),
    "08_v4": ("08", "v4_hopper", "large"),
    "13_v0": ("13", "v0_slow", "large"),
    "13_v1": ("13", "v1_fp16_dots", "large"),
    "13_v2": ("13", "v2_eight_warps", "large"),
    "13_v3": ("13", "v3_pipelined", "large"),
    "13_v4": ("13", "v4_causal_split", "large"),
    "13_v5": ("13", "v5_two_programs", "large"),
    "sdpa_flash": ("sdpa", "FLASH_ATTENTION", "large"),
    "sdpa_cudnn": ("sdpa", "CUDNN_ATTENTION", "large"),
}
#: the metrics a committed record keeps (the raw page holds about 1500 a kernel)
KEEP = re.compile(r"^(Kernel Name|Block Size|Grid Size|launch__(registers_per_thread|block_size|grid_size|shared_mem_|"
                  r"occupancy_limit_|waves_per|cluster_size|sm_count)|sm__maximum_warps_per_active_cycle_pct|"
                  r"sm__warps_active\.avg\.pct_of_peak_sustained_active|gpu__time_duration\.sum|"
                  r"(sm|dram)__cycles_elapsed\.avg\.per_second|sm__cycles_active\.avg$|dram__bytes\.sum\.(per_second|peak_sustained)|"
                  r"sm__ops_path_tensor_src_(fp16|bf16_dst_fp32|fp8_sparsity_off|tf32_dst_fp32)\.sum(\.peak_sustained)?$|"
                  r"(sm__throughput|gpu__compute_memory_throughput|gpu__dram_throughput)\.avg\.pct_of_peak_sustained_elapsed|"
                  r"sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_active|"
                  r"smsp__average_warps_issue_stalled_.*_per_issue_active|smsp__issue_active\.avg\.pct_of_peak_sustained_active|"
                  r"smsp__warps_(eligible|active)\.avg\.per_cycle_active|lts__t_sector_hit_rate\.pct|"
                  r"sass__inst_executed_register_spilling$|derived__local_spilling_requests$|l1tex__data_bank_conflicts.*sum$|"
                  r"inst_executed$)")
DEVICE = re.compile(r"^device__attribute_(display_name|multiprocessor_count|max_registers_per_multiprocessor|"
                    r"max_warps_per_multiprocessor|max_blocks_per_multiprocessor|max_shared_memory_per_multiprocessor|"
                    r"max_shared_memory_per_block_optin|reserved_shared_memory_per_block|num_schedulers_per_multiprocessor|"
                    r"max_registers_per_thread|l2_cache_size|max_gpu_frequency_khz|max_mem_frequency_khz)$")
COPY_BYTES = 1 << 30
GEMM_N = 8192


def target_kind(step: str, what: str):
    from facourse import kinds
    if step in ("01", "sdpa"):
        return kinds.get("forward")
    from facourse.steps import load_step, rung
    m = load_step(step)
    return kinds.of_rung(m, rung(m, what))


def target_call(name: str):
    """A no-argument call doing the target's work."""
    import torch
    step, what, config = TARGETS[name]
    if step == "cal":
        if what == "copy":          # a kernel (copy_ would be a DMA memcpy, which ncu does not profile)
            src = torch.empty(COPY_BYTES // 2, dtype=torch.float16, device="cuda").normal_()
            dst = torch.empty_like(src)
            return lambda: torch.neg(src, out=dst)
        a, b = (torch.randn(GEMM_N, GEMM_N, dtype=torch.float16, device="cuda") for _ in range(2))
        return lambda: a @ b
    if step in ("01", "sdpa"):
        from facourse.bench import reference
        fn = vanilla if step == "01" else reference(what)[0]
    else:
        from benchmarks.rungs import entry_point
        fn = entry_point(step, what)
    return target_kind(step, what).timed_call(fn, config)


def target_work(name: str) -> dict:
    """The target's work as its kind counts it (FLOPs, or bytes), the unit of its rate, and its useful FLOPs."""
    step, what, config = TARGETS[name]
    if step == "cal":
        work = 2.0 * COPY_BYTES if what == "copy" else 2.0 * GEMM_N ** 3
        return {"work": work, "unit": "GB/s" if what == "copy" else "TFLOP/s", "flops": 0.0 if what == "copy" else work}
    kind = target_kind(step, what)
    work = float(kind.perf_work(config, "cuda"))
    if kind.work_unit == "TFLOP/s":
        return {"work": work, "unit": kind.work_unit, "flops": work}
    from facourse.decode import get_decode_case
    return {"work": work, "unit": kind.work_unit, "flops": float(get_decode_case(config, "cuda").flops())}


def vanilla(q, k, v, causal=False, scale=None):
    """Step 01's attention in the inputs' dtype, S and P materialised: one kernel per line."""
    import torch
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)              # S = scale Q K^T
    if causal:
        i, j = torch.arange(q.shape[2], device=q.device), torch.arange(k.shape[2], device=q.device)
        s = s.masked_fill(j[None, :] > i[:, None] + (k.shape[2] - q.shape[2]), float("-inf"))
    p = torch.softmax(s, dim=-1)                                                 # P = softmax(S)
    return p @ v, None                                                           # O = P V


def run_one(name: str) -> None:
    """The target's process under ncu: warm up, then one call in the range ncu collects."""
    import torch
    call = target_call(name)
    # an NVTX range is the thread's own: the backward's kernels must launch from this thread, not autograd's
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profile")
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def prebuild(names: list[str]) -> dict:
    """The CUDA rungs among the targets, built in parallel before any is profiled: seconds per rung."""
    import torch

    from benchmarks import rungs
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    todo = [(TARGETS[n][0], TARGETS[n][1]) for n in names if TARGETS[n][0] in ("06", "07")]
    with ProcessPoolExecutor(max_workers=max(1, min(8, len(todo)))) as pool:
        secs = list(pool.map(rungs.prebuild, *zip(*todo), [arch] * len(todo))) if todo else []
    return {f"{s}/{r}": t for (s, r), t in zip(todo, secs)}


def parse_raw(text: str) -> list[dict]:
    """ncu's raw page (CSV: a header row, a units row, one row per kernel) -> {metric: value} per kernel."""
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
    head, units = rows[0], rows[1]
    out = []
    for row in rows[2:]:
        rec = {}
        for h, u, v in zip(head, units, row):
            v = v.replace(",", "")
            try:
                rec[h] = float(v) if ("." in v or "e" in v.lower()) else int(v)
            except ValueError:
                rec[h] = v
            if u:
                rec.setdefault("_units", {})[h] = u
        out.append(rec)
    return out


def profile(name: str, reports: Path) -> dict:
    """One target under ncu: its kernels' raw metrics, in launch order."""
    rep = reports / name
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    cmd = ["ncu", "--nvtx", "--nvtx-include", "profile/", "-f", "-o", str(rep)]
    for s in SECTIONS:
        cmd += ["--section", s]
    t0 = time.time()
    p = subprocess.run(cmd + [sys.executable, "-m", "benchmarks.counters", "--one", name], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0 or not Path(f"{rep}.ncu-rep").exists():
        return {"target": name, "error": (p.stdout + p.stderr)[-800:], "seconds": round(time.time() - t0, 1)}
    raw = subprocess.run(["ncu", "-i", f"{rep}.ncu-rep", "--page", "raw", "--csv", "--print-units", "base"],
                         capture_output=True, text=True).stdout
    return {"target": name, "kernels": parse_raw(raw), "seconds": round(time.time() - t0, 1)}


PROTON_TARGETS = ("05_v2", "05_v3", "05_v4", "05_v6", "09_v1", "09_v3", "09_v4", "08_v3", "sdpa_flash", "sdpa_cudnn")
PC_SAMPLED = ("05_v6", "09_v4")


def hatchet_nodes(tree, depth=0):
    """(depth, frame name, metrics) of every node of a Proton hatchet tree, depth first."""
    for node in tree if isinstance(tree, list) else [tree]:
        if "frame" in node:
            yield depth, node["frame"].get("name", "?"), node.get("metrics", {})
        yield from hatchet_nodes(node.get("children", []), depth + 1)


def proton_run(names: list[str], out: Path, calls: int = 10) -> dict:
    """Triton's own profiler on the same targets, in one process: each target ``calls`` times in a scope that
    carries its FLOPs (Proton's CUPTI backend times every kernel, clocks free, L2 warm after the first call),
    then CUPTI's PC sampling of ``PC_SAMPLED`` (each kernel's samples by stall reason). Writes the hatchet trees
    under ``out`` and returns the run (``facourse.schema.ProtonRun``)."""
    import torch
    import triton.profiler as proton

    from benchmarks.rungs import env_info
    calls_of = {n: target_call(n) for n in names}
    with torch.autograd.set_multithreading_enabled(False):
        for call in calls_of.values():               # compile and autotune before anything is recorded
            call()
        torch.cuda.synchronize()
        proton.start(str(out / "proton_ladder"), hook="triton")
        for n, call in calls_of.items():
            with proton.scope(n, {"flops": target_work(n)["flops"] * calls}):
                for _ in range(calls):
                    call()
            torch.cuda.synchronize()
        proton.finalize()
        for n in [n for n in PC_SAMPLED if n in calls_of]:
            proton.start(str(out / f"proton_pcsampling_{n}"), backend="cupti", mode="pcsampling")
            with proton.scope(n):
                calls_of[n]()
            torch.cuda.synchronize()
            proton.finalize()
    return {**proton_summary(out, calls), "env": env_info()}


def proton_summary(out: Path, calls: int) -> dict:
    """The run of ``proton_run`` read back from the hatchet trees it wrote under ``out`` (all but its env)."""
    targets = []
    for depth, name, m in hatchet_nodes(json.loads((out / "proton_ladder.hatchet").read_text())):
        if depth == 1:
            targets.append({"target": name, "flops": m.get("flops", 0), "kernels": []})
        elif depth == 2:
            targets[-1]["kernels"].append({"name": name, "count": m.get("count"), "time_ns": m.get("time (ns)")})
    sampled = {}
    for n in PC_SAMPLED:
        f = out / f"proton_pcsampling_{n}.hatchet"
        for _, name, m in hatchet_nodes(json.loads(f.read_text())) if f.exists() else []:
            if m.get("num_samples"):
                sampled[n] = {"kernel": name, "samples": m["num_samples"], "stalled": m.get("num_stalled_samples"),
                              "by_reason": {k.removeprefix("stalled_"): v for k, v in m.items()
                                            if k.startswith("stalled_") and v}}
    return {"proton": {"backend": "cupti", "calls": calls, "scopes": "one a target, its FLOPs x calls",
                       "pc_sampling": "cupti pcsampling, one call"},
            "targets": targets, "pc_sampling": sampled}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--one")
    ap.add_argument("--proton", action="store_true", help="Triton's profiler instead of ncu (PROTON_TARGETS)")
    ap.add_argument("--from-raw", type=Path, help="rebuild DIR/ncu_profile.json from a run's ncu_raw.json (KEEP changed)")
    a = ap.parse_args(argv)
    if a.one:
        return run_one(a.one)
    if a.from_raw:
        a.out.mkdir(parents=True, exist_ok=True)
        return write_profile(json.loads(a.from_raw.read_text()), a.out)
    if a.proton:
        a.out.mkdir(parents=True, exist_ok=True)
        d = proton_run([n for n in PROTON_TARGETS if n in a.targets.split(",")], a.out)
        (a.out / "proton.json").write_text(json.dumps(d, indent=1))
        for t in d["targets"]:
            ns = sum(k["time_ns"] for k in t["kernels"])
            print(f"{t['target']:11} {ns / d['proton']['calls'] / 1e3:9.1f} us a call  "
                  f"{t['flops'] / ns / 1e3:7.1f} TFLOP/s  ({len(t['kernels'])} kernels)")
        return print(json.dumps(d["pc_sampling"], indent=1))
    from benchmarks.rungs import env_info
    names = [n for n in a.targets.split(",") if n]
    a.out.mkdir(parents=True, exist_ok=True)
    reports = Path(tempfile.mkdtemp(prefix="facourse_ncu_"))
    t0 = time.time()
    builds = prebuild(names)
    ncu = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    targets = []
    for n in names:
        t = profile(n, reports)
        step, what, config = TARGETS[n]
        t.update(step=step, rung=what, config=config)
        if "error" not in t:
            t.update(target_work(n))
        targets.append(t)
        print(f"{n}: {len(t.get('kernels', []))} kernels, {t['seconds']} s" + (" ERROR" if "error" in t else ""),
              flush=True)
    d = {"profile": {"tool": ncu, "sections": list(SECTIONS), "clock_control": "base", "nvtx_range": "profile",
                     "builds_s": builds, "wall_s": round(time.time() - t0, 1)},
         "env": env_info(), "targets": targets}
    (a.out / "ncu_raw.json").write_text(json.dumps(d))
    write_profile(d, a.out)


def write_profile(d: dict, out: Path) -> None:
    """DIR/ncu_profile.json from a raw run (``d``, changed in place): the device, the units and the metrics in
    ``KEEP``; then the table."""
    targets = d["targets"]
    first = next((t["kernels"][0] for t in targets if t.get("kernels")), {})
    d["device"] = {k[len("device__attribute_"):]: v for k, v in first.items() if DEVICE.match(k)}
    d["units"] = {k: u for t in targets for kk in t.get("kernels", []) for k, u in kk.get("_units", {}).items()
                  if KEEP.match(k)}
    for t in targets:
        t["kernels"] = [{k: v for k, v in kk.items() if KEEP.match(k)} for kk in t.get("kernels", [])]
    (out / "ncu_profile.json").write_text(json.dumps(d, indent=1))
    print(f"\n{'target':12} {'kernel':44} {'us':>9} {'regs':>5} {'smem':>7} {'occ.lim r/s/w/b':>16} "
          f"{'DRAM GB/s':>9} {'SM%':>5}")
    for t in targets:
        for k in t.get("kernels", []):
            lim = "/".join(str(k.get(f"launch__occupancy_limit_{x}", "?"))
                           for x in ("registers", "shared_mem", "warps", "blocks"))
            us = k.get("gpu__time_duration.sum", 0)
            gbs = round(k.get("dram__bytes.sum.per_second", 0) / 1e9)
            print(f"{t['target']:12} {str(k.get('Kernel Name'))[:44]:44} {us:>9} {k.get('launch__registers_per_thread', '?'):>5} "
                  f"{k.get('launch__shared_mem_per_block_dynamic', '?'):>7} {lim:>16} {gbs!s:>9} "
                  f"{k.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', '?')!s:>5}")


if __name__ == "__main__":
    main()
