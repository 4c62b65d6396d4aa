"""The one check of step 13: reading Nsight Compute's numbers, each reading a function.

* ``occupancy(launch, gpu) -> (registers, shared_mem, warps, blocks)``: how many blocks of a kernel one SM can
  hold by each of its four limits, as ncu's Occupancy section reports them (``launch__occupancy_limit_*``),
  from the launch's registers per thread, block size and shared memory (ncu's ``launch__*`` names) and the GPU's
  limits (``OCCUPANCY_GPU``: ncu's ``device__attribute_*`` names and the two allocation units).
* ``roofline_point(kernel, roofs) -> (intensity, tflops, roof_tflops, bound, useful)``: a kernel on the measured
  roofline: its useful FLOPs (``work``, as the course counts them) per byte of DRAM traffic, its attained TFLOP/s,
  the roof above it, which roof that is ("memory" or "compute"), and the share of the tensor cores' executed
  FLOPs that were useful (``None`` without tensor-core work).

The cases: every kernel of the committed Nsight Compute run (``course/results/measured.json``, "13_ncu"; the
occupancy against ncu's own limits), launches (some on SMs other than the H200) and kernels drawn from a seed
(against ``occupancy_limits`` and ``roofline_reference``, which reproduce every committed record), and the edges,
partly drawn from the seed too. Why not ``rule.compare``: the answers are counts and a few floats, not attention;
the rest is the rule's: inputs handed over as copies and checked untouched, ``Mistake``s named by
``rule.diagnose`` only when they reproduce every wrong answer, nothing decided while collecting.
"""
from __future__ import annotations

import copy
import math
import numbers
import random

import torch

from .rule import CheckError, Mistake, diagnose, draw_seed, is_collecting, matches, say

LIMITS = ("registers", "shared_mem", "warps", "blocks")
LAUNCH_KEYS = ("launch__registers_per_thread", "launch__block_size", "launch__shared_mem_per_block_static",
               "launch__shared_mem_per_block_dynamic", "launch__shared_mem_config_size")
#: The GPU's side of occupancy: ncu's device attributes of an H100 or H200 (sm_90), and the allocation units of
#: the CUDA occupancy calculator (registers per warp in 256s, shared memory per block in 128-byte steps).
OCCUPANCY_GPU = {"max_registers_per_multiprocessor": 65536, "num_schedulers_per_multiprocessor": 4,
                 "max_warps_per_multiprocessor": 64, "max_blocks_per_multiprocessor": 32,
                 "reserved_shared_memory_per_block": 1024, "warp_size": 32,
                 "register_allocation_unit": 256, "shared_memory_allocation_unit": 128}
#: The shared-memory carve-outs an sm_90 SM can be configured with (bytes): ncu's launch__shared_mem_config_size.
CARVEOUTS_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
#: Other SMs as the CUDA occupancy calculator gives them, with their carve-outs (KB): the random case's launches on
#: them fail an answer that wrote the H200's numbers in place of reading ``gpu``.
OTHER_GPUS = {
    "sm_75": ({**OCCUPANCY_GPU, "max_warps_per_multiprocessor": 32, "max_blocks_per_multiprocessor": 16,
               "reserved_shared_memory_per_block": 0, "shared_memory_allocation_unit": 256}, (32, 64)),
    "sm_86": ({**OCCUPANCY_GPU, "max_warps_per_multiprocessor": 48, "max_blocks_per_multiprocessor": 16},
              (0, 8, 16, 32, 64, 100)),
    "sm_89": ({**OCCUPANCY_GPU, "max_warps_per_multiprocessor": 48, "max_blocks_per_multiprocessor": 24},
              (0, 8, 16, 32, 64, 100)),
}
ROOF_KEYS = ("gpu__time_duration.sum", "dram__bytes.sum.per_second", "sm__ops_path_tensor_src_fp16.sum", "work")
#: the tensor cores' executed operations by source type (ncu names bf16 and tf32 with their fp32 destination)
TENSOR_OPS = {"fp16": "sm__ops_path_tensor_src_fp16.sum", "bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
              "tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
              "fp8": "sm__ops_path_tensor_src_fp8_sparsity_off.sum"}
REL_TOL = 1e-6

OCCUPANCY_CASES = {
    "records": "every kernel of the committed Nsight Compute run on an H200: your limits against ncu's",
    "random": "68 launches drawn from the seed: 16-255 registers a thread, blocks of 1-1024 threads (some no "
              "multiple of 32), 0-227 KB of static and dynamic shared memory, each on a carve-out that fits it; and "
              "24 on other SMs, whose gpu dict differs (sm_75, sm_86, sm_89: 32 or 48 warps, 16 or 24 blocks, no "
              "reserved shared memory and 256-byte steps on sm_75)",
    "edges": "255 registers, blocks of 1, 33 and 1024 threads, shared memory exactly filling the carve-out or 1 "
             "byte over an allocation unit, no shared memory on small carve-outs; and more of each, drawn from "
             "the seed",
}
ROOFLINE_CASES = {
    "records": "every kernel of the committed Nsight Compute run with the course's FLOP count, on the roofs "
               "measured in the same run (a copy and a GEMM)",
    "random": "40 kernels drawn from the seed on both sides of the ridge, on random roofs",
    "edges": "no tensor-core work, no DRAM traffic (all in L2), a kernel past the ridge and one at it (either "
             "bound is right there), on roofs drawn from the seed",
}


class ProfilingCheckError(CheckError):
    """An answer of step 13's functions that disagrees with the rule. The message teaches what went wrong."""


# ----------------------------------------------------------------------------- the committed run
def compact_run(d: dict, source: str) -> dict:
    """What the lectures and the checks need of a benchmarks/counters.py run: the roofs its copy and GEMM
    measured, and every kernel with its target. A kernel gets the target's useful FLOPs as ``work`` when it is
    its target's only kernel, or the only one that used the tensor cores (a split-KV decode's merge has none)."""
    by = {t["target"]: t for t in d["targets"] if t.get("kernels")}

    def rate(name):
        t = by[name]
        return t["work"] / (sum(k["gpu__time_duration.sum"] for k in t["kernels"]) * 1e-9)

    kernels = []
    for t in d["targets"]:
        ks = t.get("kernels", [])
        main = ks if len(ks) == 1 else [k for k in ks if any(k.get(m) for m in TENSOR_OPS.values())]
        for k in ks:
            row = {"target": t["target"], "step": t["step"], "rung": t["rung"], "config": t["config"], **k}
            if t["flops"] and len(main) == 1 and k is main[0]:
                row["work"] = t["flops"]
            kernels.append(row)
    return {"source": source, "env": d["env"], "profile": d["profile"], "device": d["device"],
            "roofs": {"tflops": round(rate("gemm") / 1e12, 1), "gbps": round(rate("copy") / 1e9, 1)},
            "kernels": kernels}


def load_run(path=None) -> dict:
    """The committed Nsight Compute run as the lectures and the checks read it: env, device, roofs, kernels."""
    from .results import load
    d = load("13_ncu", path)
    if not d:
        raise FileNotFoundError("course/results/measured.json holds no \"13_ncu\" (python benchmarks/tables.py)")
    return d


def record_launches(d: dict | None = None) -> list[tuple[dict, tuple]]:
    """(launch, ncu's four limits) of every committed kernel."""
    d = d or load_run()
    return [({k: r[k] for k in LAUNCH_KEYS}, tuple(int(r[f"launch__occupancy_limit_{x}"]) for x in LIMITS))
            for r in d["kernels"]]


def record_kernels(d: dict | None = None) -> tuple[list[dict], dict]:
    """(the kernels as roofline_point reads them, the run's roofs)."""
    d = d or load_run()
    return ([{k: r.get(k, 0) for k in ROOF_KEYS} for r in d["kernels"] if r.get("work") and r["target"] != "gemm"],
            dict(d["roofs"]))


def records_table(d: dict | None = None) -> str:
    """The committed kernels as text: launch, ncu's four limits, theoretical occupancy, time, DRAM rate, SM busy."""
    d = d or load_run()
    lines = [f"{'target':11} {'kernel':30} {'regs':>4} {'threads':>7} {'smem KB':>7} {'carve KB':>8}  "
             f"{'limits r/s/w/b':>14} {'occ.':>5} {'us':>8} {'DRAM GB/s':>9} {'SM %':>5}"]
    for r in d["kernels"]:
        smem = (r["launch__shared_mem_per_block_static"] + r["launch__shared_mem_per_block_dynamic"]) / 1024
        lim = "/".join(str(r[f"launch__occupancy_limit_{x}"]) for x in LIMITS)
        lines.append(f"{r['target']:11} {r['Kernel Name'][:30]:30} {r['launch__registers_per_thread']:>4} "
                     f"{r['launch__block_size']:>7} {smem:>7.1f} {r['launch__shared_mem_config_size'] / 1024:>8.0f}  "
                     f"{lim:>14} {r['sm__maximum_warps_per_active_cycle_pct']:>4.0f}% "
                     f"{r['gpu__time_duration.sum'] / 1e3:>8.1f} {r['dram__bytes.sum.per_second'] / 1e9:>9.0f} "
                     f"{r['sm__throughput.avg.pct_of_peak_sustained_elapsed']:>5.1f}")
    return "\n".join(lines)


def summary_table(d: dict | None = None) -> str:
    """Markdown: every committed kernel that took 10 us or more, with its speed of light, occupancy and useful share."""
    d = d or load_run()
    rows = ["| target | kernel | us | SM % | DRAM GB/s | occupancy: theoretical / achieved | limits r/s/w/b | useful |",
            "|---|---|---|---|---|---|---|---|"]
    for r in d["kernels"]:
        if r["gpu__time_duration.sum"] < 1e4:
            continue
        ops = r.get("sm__ops_path_tensor_src_fp16.sum") or 0
        useful = f"{r['work'] / ops:.2f}" if r.get("work") and ops else "—"
        lim = "/".join(str(r[f"launch__occupancy_limit_{x}"]) for x in LIMITS)
        rows.append(f"| {r['target']} | `{r['Kernel Name'][:40]}` | {r['gpu__time_duration.sum'] / 1e3:.0f} | "
                    f"{r['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f} | "
                    f"{r['dram__bytes.sum.per_second'] / 1e9:.0f} | {r['sm__maximum_warps_per_active_cycle_pct']:.0f}% / "
                    f"{r['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}% | {lim} | {useful} |")
    return "\n".join(rows)


def rung_table(d: dict) -> str:
    """Markdown: step 13's slow ladder under ncu, a rung a row (the counter each rung's defect shows)."""
    rows = ["| target | rung | us | TFLOP/s | registers | spill requests | shared KB | programs an SM | tensor ops: "
            "type, useful | tensor pipe active % | issue active % | long-scoreboard stall / issue |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["kernels"]:
        if r["step"] not in ("13", "sdpa") or r["gpu__time_duration.sum"] < 1e4:
            continue
        ops = {t: r.get(m) or 0 for t, m in TENSOR_OPS.items()}
        kind = max(ops, key=ops.get)
        useful = f"{kind}, {r['work'] / ops[kind]:.2f}" if r.get("work") and ops[kind] else "—"
        programs = min(int(r[f"launch__occupancy_limit_{x}"]) for x in LIMITS)
        rows.append(f"| {r['target']} | {r['rung']} | {r['gpu__time_duration.sum'] / 1e3:.0f} | "
                    + (f"{r['work'] / r['gpu__time_duration.sum'] / 1e3:.0f}" if r.get("work") else "—")
                    + f" | {r['launch__registers_per_thread']} | {r.get('derived__local_spilling_requests', 0):,} | "
                    f"{r['launch__shared_mem_per_block_dynamic'] / 1024:.0f} | {programs} | {useful} | "
                    f"{r['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:.0f} | "
                    f"{r['smsp__issue_active.avg.pct_of_peak_sustained_active']:.0f} | "
                    f"{r['smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio']:.2f} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- occupancy
def occupancy_limits(launch: dict, gpu: dict = OCCUPANCY_GPU, bug: str | None = None) -> tuple[int, int, int, int]:
    """Blocks per SM by registers, shared memory, warps and blocks (ncu's rule), or with a classic ``bug``:
    "warps_floor" (block_size // 32), "no_register_rounding", "no_warp_granularity" (the register file as one
    pool), "no_reserve" (the 1 KB per block the driver keeps), "no_smem_rounding", "max_smem" (the SM's whole
    shared memory instead of the configured carve-out), "threads_registers" (registers per thread times threads),
    "warps_plus_one" (block_size // 32 + 1), "no_static" and "no_dynamic" (one part of the shared memory left out),
    "h200_numbers" (``OCCUPANCY_GPU`` whatever ``gpu`` says)."""
    gpu = OCCUPANCY_GPU if bug == "h200_numbers" else gpu
    ws = gpu["warp_size"]
    warps = (launch["launch__block_size"] // ws + (bug == "warps_plus_one") if bug in ("warps_floor", "warps_plus_one")
             else -(-launch["launch__block_size"] // ws))
    regs = launch["launch__registers_per_thread"]
    unit = gpu["register_allocation_unit"]
    per_warp = regs * ws if bug == "no_register_rounding" else -(-regs * ws // unit) * unit
    pool = gpu["max_registers_per_multiprocessor"]
    parts = gpu["num_schedulers_per_multiprocessor"]
    if bug == "threads_registers":
        by_regs = pool // max(regs * launch["launch__block_size"], 1)
    else:
        warps_by_regs = pool // per_warp if bug == "no_warp_granularity" else parts * ((pool // parts) // per_warp)
        by_regs = warps_by_regs // max(warps, 1)
    smem = ((bug != "no_static") * launch["launch__shared_mem_per_block_static"]
            + (bug != "no_dynamic") * launch["launch__shared_mem_per_block_dynamic"])
    smem += 0 if bug == "no_reserve" else gpu["reserved_shared_memory_per_block"]
    step = gpu["shared_memory_allocation_unit"]
    smem = smem if bug == "no_smem_rounding" else -(-smem // step) * step
    config = 233472 if bug == "max_smem" else launch["launch__shared_mem_config_size"]
    by_smem = config // smem if smem else gpu["max_blocks_per_multiprocessor"]
    return (int(by_regs), int(by_smem), int(gpu["max_warps_per_multiprocessor"] // max(warps, 1)),
            int(gpu["max_blocks_per_multiprocessor"]))


def _launch(regs: int, threads: int, static: int, dynamic: int, config_kb: int | None = None,
            gpu: dict = OCCUPANCY_GPU, carveouts: tuple = CARVEOUTS_KB) -> dict:
    need = static + dynamic + gpu["reserved_shared_memory_per_block"]
    kb = config_kb if config_kb is not None else next(c for c in carveouts if c * 1024 >= need)
    return dict(zip(LAUNCH_KEYS, (regs, threads, static, dynamic, kb * 1024)))


def _other_sm_launches(g: random.Random) -> list[tuple[dict, dict, None]]:
    out = []
    for gpu, kbs in OTHER_GPUS.values():
        for _ in range(8):
            # at least a byte: sm_75 reserves none, and a block without shared memory has no such limit to compare
            top = kbs[-1] * 1024 - gpu["reserved_shared_memory_per_block"]
            smem = g.choice((g.randint(1, 4096), g.randint(1, top)))
            static = g.choice((0, smem // 2))
            threads = 32 * g.choice((1, 2, 4, 6, 8, 16, 32)) - g.choice((0, 0, g.randint(1, 31)))
            out.append((_launch(g.randint(16, 255), threads, static, smem - static, None, gpu, kbs), gpu, None))
    return out


def _drawn_edges(g: random.Random) -> list[tuple]:
    """The edges again at sizes from the seed: less than a warp, the top register counts, exact fills, a byte over."""
    out = []
    for _ in range(4):
        out += [(g.randint(16, 255), g.randint(1, 31), 0, 0, 8), (g.randint(248, 255), 32 * g.randint(1, 32), 0, 0, 8)]
        kb = g.choice(CARVEOUTS_KB[2:])
        k = g.choice([k for k in range(1, 9) if kb * 8 % k == 0])           # k blocks of whole 128-byte steps
        per = kb * 1024 // k
        static = 128 * g.randint(0, (per - 1024) // 256)
        regs, threads = g.randint(16, 128), 32 * g.randint(1, 8)
        out += [(regs, threads, static, per - 1024 - static, kb), (regs, threads, static, per - 1023 - static, kb)]
    return out


def occupancy_inputs(case: str, seed: int) -> list[tuple[dict, dict, tuple | None]]:
    """(launch, the SM's limits it is handed, ncu's limits where the case has them) of a case."""
    if case not in OCCUPANCY_CASES:
        raise KeyError(f"unknown occupancy case {case!r}; known: {', '.join(OCCUPANCY_CASES)}")
    if case == "records":
        return [(launch, OCCUPANCY_GPU, ncu) for launch, ncu in record_launches()]
    g = random.Random(int(seed))
    if case == "random":
        out = []
        for i in range(60):
            regs = g.choice((g.randint(16, 64), g.randint(64, 255), 8 * g.randint(2, 32)))
            threads = 32 * g.choice((1, 2, 3, 4, 6, 8, 12, 16, 32)) - (g.randint(1, 31) if i % 5 == 0 else 0)
            static = g.choice((0, 0, 128 * g.randint(1, 64), g.randint(1, 20000)))
            dynamic = g.choice((0, 1024 * g.randint(1, 200), g.randint(1, 100000)))
            dynamic = min(dynamic, 232448 - static)
            out.append((_launch(regs, threads, static, dynamic), OCCUPANCY_GPU, None))
        while len(out) < 68:             # blocks that fit k times only unrounded: the 128-byte steps decide
            kb, k = g.choice(CARVEOUTS_KB[2:]), g.randint(3, 7)
            need = kb * 1024 // k
            if -(-need // 128) * 128 * k > kb * 1024:
                out.append((_launch(g.randint(16, 96), 128, 0, need - 1024, kb), OCCUPANCY_GPU, None))
        out += _other_sm_launches(g)
        g.shuffle(out)
        return out
    edges = [(255, 128, 0, 65536, None), (255, 1024, 0, 0, None), (64, 1024, 0, 0, None), (32, 1, 0, 0, 8),
             (40, 33, 0, 0, 8), (168, 384, 0, 232448, None), (128, 256, 0, 100 * 1024 - 1024, 100),
             (96, 256, 0, 100 * 1024 - 1023, 100), (24, 64, 0, 0, 16), (16, 32, 48 * 1024, 0, 228),
             (200, 96, 0, 16384 - 1024, 16), (72, 512, 0, 1, 8), (64, 128, 0, 33076, 100)]
    return [(_launch(*e), OCCUPANCY_GPU, None) for e in edges + _drawn_edges(g)]


OCCUPANCY_MISTAKES = {
    "warps_floor": "a block of {t} threads occupies {c} warps: round the warps up (ceil(block_size / 32)); a "
                   "partial warp takes a whole warp's slot and registers",
    "warps_plus_one": "a block of {t} threads is {c} warps: ceil(block_size / 32) = (block_size + 31) // 32, not "
                      "block_size // 32 + 1 (a warp too many when the block is whole warps)",
    "no_register_rounding": "registers are allocated per warp in units of 256 (8 a thread): round registers x 32 "
                            "up to a multiple of gpu['register_allocation_unit'] before dividing",
    "no_warp_granularity": "the register file is four files of 16384, one per scheduler, and a warp's registers "
                           "come from one of them: warps by registers = 4 x floor((65536 / 4) / registers per "
                           "warp), not floor(65536 / registers per warp)",
    "threads_registers": "registers are allocated per warp, rounded (256 a warp), and per scheduler's quarter "
                         "of the file, not as registers x threads of the whole block",
    "no_reserve": "the driver keeps 1 KB of shared memory per block (gpu['reserved_shared_memory_per_block'], "
                  "ncu's launch__shared_mem_per_block_driver): add it to the block's static and dynamic bytes",
    "no_smem_rounding": "shared memory is allocated per block in 128-byte steps (gpu['shared_memory_allocation_"
                        "unit']): round static + dynamic + the reserved bytes up to a multiple of it",
    "no_static": "a block's shared memory is its static and its dynamic bytes (and the reserved 1 KB): "
                 "launch__shared_mem_per_block_static was left out",
    "no_dynamic": "a block's shared memory is its static and its dynamic bytes (and the reserved 1 KB): "
                  "launch__shared_mem_per_block_dynamic was left out",
    "h200_numbers": "the SM's limits are gpu's values, not the H200's numbers written into the function: some "
                    "launches run on other SMs (fewer warps and blocks, other shared-memory rules)",
    "max_smem": "divide by the carve-out the SM is configured with (launch__shared_mem_config_size), not by the "
                "SM's whole 228 KB: the rest is L1 cache for this launch",
}


def _as_limits(out, tag: str) -> tuple:
    if not (isinstance(out, (tuple, list)) and len(out) == 4):
        raise ProfilingCheckError(f"{tag}: occupancy must return a tuple of four whole numbers "
                                  f"(registers, shared_mem, warps, blocks), got {type(out).__name__} {out!r:.80}")
    for x in out:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x != int(x):
            raise ProfilingCheckError(f"{tag}: occupancy returned {out!r}: each limit is a whole number of blocks "
                                      "(an int: floor the divisions)")
    return tuple(int(x) for x in out)


def _call(fn, args: tuple, tag: str, zero_hint):
    """``fn(*args)`` on copies, and the copies checked untouched afterwards. An error it raises is told with the
    input that raised it (in the judge too, where the recorded error is raised again)."""
    given = copy.deepcopy(args)
    try:
        out = fn(*given)
    except Exception as err:
        if is_collecting() or isinstance(err, CheckError):
            raise
        shown = ", ".join(f"{k}={v}" for k, v in args[0].items())
        text = (str(err).rstrip(": ") if type(err).__name__.startswith("_")   # a replay's own: "Type: message"
                else f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
        hint = (zero_hint(*args) if "ZeroDivision" in text or "division by zero" in text else
                "the function is not written yet: its body still raises the stub's NotImplementedError"
                if "NotImplementedError" in text else "")
        raise ProfilingCheckError(f"{tag}: the function raised {text}\n  on {shown}"
                                  + (f"\n  likely cause: {hint}" if hint else "")) from err
    if given != args:
        raise ProfilingCheckError(f"{tag}: the function changed the dicts it was given; read them, return the answer")
    return out


def _zero_divisor(launch: dict, gpu: dict) -> str:
    """Why a division by zero on this launch: what in it can make a divisor 0."""
    static, dynamic = launch["launch__shared_mem_per_block_static"], launch["launch__shared_mem_per_block_dynamic"]
    why = (["a block of fewer than 32 threads still takes a whole warp (round up)"]
           if launch["launch__block_size"] < gpu["warp_size"] else [])
    if not static + dynamic:
        why.append("a block without shared memory still takes the reserved 1 KB (gpu['reserved_shared_memory_per_"
                   "block'])")
    elif not static or not dynamic:
        why.append(f"this block's shared memory is {static} static + {dynamic} dynamic bytes: count both")
    return "no divisor may be 0: " + ("; ".join(why) or "warps, registers a warp and shared memory a block are "
                                       "each at least one unit")


def check_occupancy_fn(fn, case: str = "records", *, seed: int | None = None, device=None,
                       verbose: bool = True) -> None:
    """Check ``fn(launch, gpu) -> (registers, shared_mem, warps, blocks)`` on the launches of ``case``
    (OCCUPANCY_CASES); ``device`` is unused (the answers are numbers). Raises ProfilingCheckError."""
    seed = draw_seed(seed)
    tag = f"[occupancy {case}] (seed {seed})"
    items = occupancy_inputs(case, seed)
    outs = [_call(fn, (launch, dict(gpu)), tag, _zero_divisor) for launch, gpu, _ in items]
    if is_collecting():
        return
    got = [_as_limits(o, tag) for o in outs]
    want = [ncu or occupancy_limits(launch, gpu) for launch, gpu, ncu in items]
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    if not bad:
        if verbose:
            say(f"{tag} passed: {len(items)} launches" + (", every limit as ncu reported it" if case == "records" else ""))
        return
    i = bad[0]
    launch, gpu, ncu = items[i]
    which = sorted({LIMITS[j] for k in bad for j in range(4) if got[k][j] != want[k][j]}, key=LIMITS.index)
    t = launch["launch__block_size"]
    produce = {OCCUPANCY_MISTAKES[b].format(t=t, c=-(-t // 32)):
               lambda b=b: _columns([occupancy_limits(x, g, bug=b) for x, g, _ in items], torch.int64)
               for b in OCCUPANCY_MISTAKES}
    found = _named(dict(zip(LIMITS, _columns(got, torch.int64))), set(which),
                   dict(zip(LIMITS, _columns(want, torch.int64))), produce, LIMITS, lambda name, alt: 0.0)
    if found:
        cause = found
    elif all(items[k][1] != OCCUPANCY_GPU for k in bad):      # right on the H200, wrong on every other SM
        cause = ("every launch answered wrong runs on another SM: its limits are gpu's values, not the H200's "
                 "numbers written into the function")
    elif which == ["blocks"]:
        cause = "the blocks limit is the SM's own (gpu['max_blocks_per_multiprocessor']), whatever the kernel"
    elif which == ["warps"]:
        cause = ("warps limit = floor(max warps per SM (gpu['max_warps_per_multiprocessor']) / warps per block), "
                 "warps per block = ceil(block_size / 32)")
    elif which == ["shared_mem"]:
        cause = ("shared memory limit = floor(carve-out / per-block bytes), per-block bytes = static + dynamic + the "
                 "reserved 1 KB, rounded up to 128 bytes; a block with none still costs the reserved 1 KB")
    elif which == ["registers"]:
        cause = ("registers limit: round registers x 32 up to 256 for a warp, take floor(16384 / that) warps in "
                 "each of the 4 schedulers' files, times 4, then floor(that / warps per block)")
    else:
        cause = "more than one limit is off: check each against the Occupancy section's formula in the lecture"
    shown = ", ".join(f"{k.removeprefix('launch__')}={v}" for k, v in launch.items())
    other = ", ".join(f"{k}={v}" for k, v in gpu.items() if v != OCCUPANCY_GPU[k])
    raise ProfilingCheckError(
        f"{tag}: {len(bad)} of {len(items)} launches wrong ({', '.join(which)}).\n"
        f"  launch {i}: {shown}\n" + (f"  on another SM, whose gpu has {other}\n" if other else "")
        + f"  got {dict(zip(LIMITS, got[i]))}\n"
        f"  {'ncu reported' if ncu else 'the rule gives'} {dict(zip(LIMITS, want[i]))}\n"
        f"  likely cause: {cause}")


def _columns(rows: list, dtype) -> list:
    """The answers of a case as one tensor per output: "memory" as 1 and "compute" as 0, None as NaN."""
    def num(x):
        return {"memory": 1.0, "compute": 0.0}[x] if isinstance(x, str) else math.nan if x is None else x
    return [torch.tensor([num(r[j]) for r in rows], dtype=dtype) for j in range(len(rows[0]))]


def _named(got: dict, wrong: set, want: dict, produce: dict, names: tuple, tol) -> str | None:
    """The causes of the mistakes that reproduce the wrong answers (``rule.diagnose``), each told where these inputs
    cannot tell them apart; a mistake breaks the outputs where it differs from the reference on these inputs."""
    found = []
    for cause, make in produce.items():
        alt = dict(zip(names, make()))
        m = Mistake(cause, lambda alt=alt: alt, frozenset(
            n for n in names if not matches(alt[n], want[n], tol(n, want[n]))))
        if diagnose(got, wrong, [m], tol):
            found.append(cause)
    return "\n    or: ".join(found) or None


# ----------------------------------------------------------------------------- the roofline
def roofline_reference(kernel: dict, roofs: dict, bug: str | None = None):
    """(intensity FLOP/byte, attained TFLOP/s, roof TFLOP/s, "memory" | "compute", useful share or None), or with
    a classic ``bug``: "rate_as_bytes" (ncu's bytes per second taken for bytes), "roof_max" (the higher roof),
    "executed" (intensity and TFLOP/s of the tensor cores' executed FLOPs), "useful_inverse", a unit misread:
    "ns_as_us", "ns_as_s" (the duration), "gbps_as_bytes", "gbps_as_tbps" (the bandwidth), "flop_per_second" (the
    attained rate), "roof_flops" (the roof); a factor 2: "work_doubled" (work taken for multiply-adds), "useful_half"
    (the executed counter taken for them); "bound_swapped", "no_traffic_zero" (intensity 0 with no DRAM bytes)."""
    seconds = kernel["gpu__time_duration.sum"] * {"ns_as_us": 1e-6, "ns_as_s": 1.0}.get(bug, 1e-9)
    rate = kernel["dram__bytes.sum.per_second"]
    moved = rate if bug == "rate_as_bytes" else rate * seconds
    executed = kernel.get("sm__ops_path_tensor_src_fp16.sum") or 0
    work = kernel["work"] * (2 if bug == "work_doubled" else 1)
    flops = executed if bug == "executed" and executed else work
    intensity = flops / moved if moved else 0.0 if bug == "no_traffic_zero" else math.inf
    tflops = flops / seconds / (1.0 if bug == "flop_per_second" else 1e12)
    peak, bw = roofs["tflops"], roofs["gbps"] * {"gbps_as_bytes": 1.0, "gbps_as_tbps": 1e12}.get(bug, 1e9)
    memory_roof = intensity * bw / 1e12
    roof = max(peak, memory_roof) if bug == "roof_max" else min(peak, memory_roof)
    roof *= 1e12 if bug == "roof_flops" else 1.0
    bound = "memory" if (memory_roof < peak) != (bug == "bound_swapped") else "compute"
    useful = None if not executed else (executed / work if bug == "useful_inverse" else
                                        work / executed / (2 if bug == "useful_half" else 1))
    return intensity, tflops, roof, bound, useful


def roofline_inputs(case: str, seed: int) -> tuple[list[dict], list[dict]]:
    """(kernels, the roofs each is placed on) of a case."""
    if case not in ROOFLINE_CASES:
        raise KeyError(f"unknown roofline case {case!r}; known: {', '.join(ROOFLINE_CASES)}")
    if case == "records":
        kernels, roofs = record_kernels()
        return kernels, [roofs] * len(kernels)
    g = random.Random(int(seed))
    if case == "random":
        ks, rs = [], []
        for _ in range(40):
            r = {"tflops": g.uniform(300, 1000), "gbps": g.uniform(1500, 5000)}
            ns = g.uniform(2e3, 5e6)
            work = 10 ** g.uniform(6, 13)
            ks.append({"gpu__time_duration.sum": ns, "dram__bytes.sum.per_second": g.uniform(1e9, r["gbps"] * 1e9),
                       "sm__ops_path_tensor_src_fp16.sum": g.choice((0, work * g.uniform(1.0, 2.2))), "work": work})
            rs.append(r)
        return ks, rs
    roofs = {"tflops": g.uniform(400, 1000), "gbps": g.uniform(2000, 5000)}
    bw = roofs["gbps"] * 1e9
    ridge = roofs["tflops"] * 1e12 / bw                                    # FLOP per byte where the roofs meet
    ns = g.uniform(2e5, 4e6)

    def at(rate, intensity, ops):                  # a kernel of ns at this DRAM rate and intensity
        work = intensity * rate * ns * 1e-9
        return {"gpu__time_duration.sum": ns, "dram__bytes.sum.per_second": rate,
                "sm__ops_path_tensor_src_fp16.sum": ops * work, "work": work}
    in_l2 = 10 ** g.uniform(8, 10)
    ks = [at(g.uniform(0.5, 0.9) * bw, ridge * g.uniform(0.01, 0.3), 0),      # no tensor-core work (a softmax)
          {"gpu__time_duration.sum": g.uniform(2e3, 2e4), "dram__bytes.sum.per_second": 0.0,
           "sm__ops_path_tensor_src_fp16.sum": in_l2 * g.uniform(1.2, 2.5), "work": in_l2},   # everything in L2
          at(g.uniform(0.1, 0.5) * bw, ridge * g.uniform(1.5, 6), g.uniform(1, 1.5)),       # past the ridge
          at(g.uniform(0.5, 1) * bw, ridge, g.uniform(1, 1.5))]                            # at it
    return ks, [roofs] * len(ks)


ROOFLINE_MISTAKES = {
    "rate_as_bytes": "dram__bytes.sum.per_second is a rate: bytes moved = it x the duration "
                     "(gpu__time_duration.sum is in nanoseconds)",
    "roof_max": "the attainable roof at an intensity is the lower of the two: min(peak FLOP/s, intensity x "
                "bandwidth)",
    "executed": "intensity and TFLOP/s count the useful FLOPs (kernel['work'], the course's 4 B Hq D pairs), not "
                "the tensor cores' executed ones (which include masked and padded tiles)",
    "useful_inverse": "the useful share is work / executed tensor FLOPs (at most about 1), not its inverse",
    "ns_as_us": "gpu__time_duration.sum is in nanoseconds: seconds = it x 1e-9 (x 1e-6 reads microseconds)",
    "ns_as_s": "gpu__time_duration.sum is in nanoseconds: seconds = it x 1e-9, not the count itself",
    "gbps_as_bytes": "roofs['gbps'] is in GB/s: the memory roof is intensity x gbps x 1e9 FLOP/s, / 1e12 in TFLOP/s",
    "gbps_as_tbps": "roofs['gbps'] is in GB/s, not TB/s: the memory roof is intensity x gbps x 1e9 / 1e12 TFLOP/s",
    "flop_per_second": "the attained rate is in TFLOP/s, not FLOP/s: work / seconds / 1e12",
    "roof_flops": "the roof is in TFLOP/s, as roofs['tflops'] is, not FLOP/s: min(tflops, intensity x gbps / 1000)",
    "work_doubled": "kernel['work'] already counts FLOPs, 2 a multiply-add (4 B Hq D a visible pair): use it as it "
                    "is, not twice",
    "useful_half": "sm__ops_path_tensor_src_fp16.sum counts FLOPs as work does, 2 a multiply-add: useful = work / "
                   "it, without a factor 2",
    "bound_swapped": "'memory' and 'compute' are swapped: left of the ridge (intensity x bandwidth below the peak) "
                     "the memory roof is the lower one, and the kernel memory-bound",
    "no_traffic_zero": "a kernel that moves no DRAM bytes (its data in L2) has infinite intensity (math.inf), not 0: "
                       "the compute roof binds",
}
_ROOF_NAMES = ("intensity", "tflops", "roof_tflops", "bound", "useful")


def _roof_equal(a, b) -> bool:
    if isinstance(b, str) or b is None or a is None or isinstance(a, str):
        return a == b
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return False
    if math.isinf(b) or math.isinf(a):
        return a == b
    return abs(a - b) <= REL_TOL * max(abs(b), 1e-300)


def _zero_counter(kernel: dict, roofs: dict) -> str:
    """Why a division by zero on this kernel: which of its counters is 0."""
    why = []
    if not kernel["dram__bytes.sum.per_second"]:
        why.append("a kernel can move no DRAM bytes (its data in L2): then its intensity is math.inf, and the compute "
                   "roof binds")
    if not kernel.get("sm__ops_path_tensor_src_fp16.sum"):
        why.append("a kernel can run no tensor-core work (sm__ops_path_tensor_src_fp16.sum is 0): then useful is "
                   "None, not work / 0")
    return "; ".join(why) or "no counter of this kernel is 0: a divisor of your own is"


def _one_factor(outs: list, want: list, names: list) -> list[str]:
    """The wrong outputs that are one constant factor off on every kernel (a unit or a 2 usually), told as such."""
    said = []
    for name in names:
        j = _ROOF_NAMES.index(name)
        pairs = [(o[j], w[j]) for o, w in zip(outs, want) if isinstance(w[j], float) and math.isfinite(w[j]) and w[j]]
        if name == "bound" or len(pairs) < 2 or not all(type(a) in (int, float) and math.isfinite(a) for a, _ in pairs):
            continue
        ratios = [a / b for a, b in pairs]
        if abs(ratios[0] - 1) > 1e-6 and all(abs(x - ratios[0]) <= 1e-6 * abs(ratios[0]) for x in ratios):
            said.append(f"{name} is {ratios[0]:.6g} x the expected on every kernel")
    return said


def check_roofline_fn(fn, case: str = "records", *, seed: int | None = None, device=None,
                      verbose: bool = True) -> None:
    """Check ``fn(kernel, roofs) -> (intensity, tflops, roof_tflops, bound, useful)`` on the kernels of ``case``
    (ROOFLINE_CASES). Raises ProfilingCheckError."""
    seed = draw_seed(seed)
    tag = f"[roofline {case}] (seed {seed})"
    kernels, roofs = roofline_inputs(case, seed)
    outs = [_call(fn, (k, r), tag, _zero_counter) for k, r in zip(kernels, roofs)]
    if is_collecting():
        return
    for i, o in enumerate(outs):
        if not (isinstance(o, (tuple, list)) and len(o) == 5):
            raise ProfilingCheckError(f"{tag}: roofline_point must return a tuple (intensity, tflops, roof_tflops, "
                                      f"bound, useful), got {type(o).__name__} {o!r:.80}")
        if not (isinstance(o[3], str) and o[3] in ("memory", "compute")):
            raise ProfilingCheckError(f"{tag}: kernel {i}: bound is {o[3]!r:.40}; it must be the string 'memory' or "
                                      "'compute' (lower case, no suffix)")
    want = [roofline_reference(k, r) for k, r in zip(kernels, roofs)]
    # where the roofs meet (within the floats' tolerance) either bound is right: rounding alone picks the side
    either = [math.isfinite(w[0]) and abs(w[0] * r["gbps"] / 1e3 - r["tflops"]) <= REL_TOL * r["tflops"]
              for w, r in zip(want, roofs)]
    wrong = [(i, j) for i, (o, w) in enumerate(zip(outs, want)) for j in range(5)
             if not (j == 3 and either[i]) and not _roof_equal(o[j], w[j])]
    if not wrong:
        if verbose:
            say(f"{tag} passed: {len(kernels)} kernels")
        return
    i = wrong[0][0]
    names = sorted({_ROOF_NAMES[j] for _, j in wrong}, key=_ROOF_NAMES.index)
    try:
        got_t = dict(zip(_ROOF_NAMES, _columns(outs, torch.float64)))
    except (TypeError, ValueError):                  # an answer that is no number: no mistake reproduces it
        got_t = None

    def columns(rows):                               # at the ridge the student's bound stands for every answer's
        cols = _columns(rows, torch.float64)
        cols[3] = torch.where(torch.tensor(either), got_t["bound"], cols[3])
        return cols
    found = got_t and _named(got_t, set(names), dict(zip(_ROOF_NAMES, columns(want))),
                             {text: lambda b=b: columns([roofline_reference(k, r, b) for k, r in zip(kernels, roofs)])
                              for b, text in ROOFLINE_MISTAKES.items()}, _ROOF_NAMES,
                             lambda name, alt: REL_TOL * float(alt.nan_to_num(0.0, 0.0, 0.0).abs().max()))
    if found:
        cause = found
    elif names == ["bound"]:
        cause = ("a kernel is memory-bound where intensity x bandwidth is below the peak (left of the ridge, "
                 "peak / bandwidth FLOP per byte), compute-bound from the ridge on: 'memory' or 'compute'")
    elif names == ["useful"]:
        cause = ("useful = work / sm__ops_path_tensor_src_fp16.sum, and None where the tensor cores did nothing "
                 "(the counter is 0)")
    else:
        cause = ("bytes = dram__bytes.sum.per_second x seconds, seconds = gpu__time_duration.sum x 1e-9; intensity "
                 "= work / bytes (inf with no DRAM traffic); TFLOP/s = work / seconds / 1e12; roof = min(peak, "
                 "intensity x GB/s x 1e9 / 1e12)")
    scaled = [] if found else _one_factor(outs, want, names)
    if scaled:
        cause = f"{'; '.join(scaled)}: a unit (1e3, 1e9, 1e12) or a factor 2 is off there. {cause}"
    raise ProfilingCheckError(
        f"{tag}: {len({k for k, _ in wrong})} of {len(kernels)} kernels wrong ({', '.join(names)}).\n"
        f"  kernel {i}: {kernels[i]}, roofs {roofs[i]}\n"
        f"  got      {dict(zip(_ROOF_NAMES, outs[i]))}\n  expected {dict(zip(_ROOF_NAMES, want[i]))}\n"
        f"  likely cause: {cause}")


__all__ = ["CARVEOUTS_KB", "LAUNCH_KEYS", "LIMITS", "OCCUPANCY_CASES", "OCCUPANCY_GPU", "ROOFLINE_CASES",
           "OCCUPANCY_MISTAKES", "ROOFLINE_MISTAKES", "ProfilingCheckError", "check_occupancy_fn", "check_roofline_fn",
           "compact_run", "load_run", "occupancy_inputs",
           "occupancy_limits", "record_kernels", "record_launches", "records_table", "roofline_inputs", "summary_table",
           "roofline_reference"]
