# %% [markdown]
# # 13 — Profiling: the course's kernels under Nsight Compute
#
# Twelve lectures measured a kernel with one number: its time, turned into TFLOP/s and set against
# FlashAttention-2's. A time says how fast a kernel is, not why. Nsight Compute (`ncu`) reads the GPU's
# hardware counters while one kernel runs and reports a few hundred numbers about it: how busy each unit
# was, how many warps the SMs held, what those warps waited for, how many bytes crossed each level of the
# memory hierarchy. This lecture reads one committed `ncu` run of the course's own kernels on an H200
# (step 05's Triton rungs, the decode kernels of step 09, step 01's PyTorch attention, SDPA's two
# references, and whichever other rungs the run holds) and asks four questions in order:
#
# $$\underbrace{\text{which unit is busy?}}_{\text{speed of light}} \;\to\;
#   \underbrace{\text{how many warps fit?}}_{\text{occupancy}} \;\to\;
#   \underbrace{\text{what do they wait for?}}_{\text{warp stalls}} \;\to\;
#   \underbrace{\text{how far from the roofs?}}_{\text{measured roofline}}$$
#
# **What you will learn**
# - how the course ran `ncu` (one process per kernel, an NVTX range, kernel replay, clocks locked to
#   base) and what that does to the durations it reports;
# - how to read a metric's name, `unit__counter.rollup.submetric`, and its units;
# - the Speed of Light section: which unit limits a kernel, and ncu's rule of thumb for latency;
# - occupancy: the four limits of an SM (registers, shared memory, warp slots, block slots), and why the
#   FlashAttention kernels run with few warps on purpose;
# - warp stall reasons, and Little's law, which ties them to occupancy;
# - a roofline whose roofs were measured in the same run, and how much of the tensor cores' work was useful;
# - what to look at first when your own kernel is slow, tried on a slow kernel made fast one counter at a time.
#
# **Sources followed.** NVIDIA, *Nsight Compute Kernel Profiling Guide*: kernel replay, clock and cache
# control, the metrics' structure and naming, the Speed of Light, Occupancy and Warp State Statistics
# sections, the warp stall reasons; *Nsight Compute CLI* (`--nvtx`, `--nvtx-include`, `--section`,
# `--page raw`, `--print-units`); the *Compute Triage Guide* ("duration is the ground truth"). NVIDIA's
# CUDA Occupancy Calculator (allocation units) and the CUDA C++ Programming Guide's table of limits per
# compute capability. S. Williams, A. Waterman, D. Patterson, *Roofline: an insightful visual performance
# model for multicore architectures* (CACM, 2009). J. D. C. Little, *A proof for the queuing formula
# L = λW* (Operations Research, 1961). V. Volkov, *Better performance at lower occupancy* (GTC 2010).
# Lectures 05 and 09 for the kernels; `benchmarks/counters.py` for how the run was taken.
#
# Exercise 13 asks for `occupancy(launch, gpu)`, the four limits computed from a launch, and
# `roofline_point(kernel, roofs)`, a kernel placed on the measured roofline. This lecture shows the limits
# ncu itself reported and the roofline as a figure; computing them is the exercise.

# %%
import time
from collections import defaultdict

from facourse.configs import CONFIGS
from facourse.decode import get_decode_case
from facourse import results
from facourse.profiling import OCCUPANCY_GPU, TENSOR_OPS, load_run, records_table

CPU_START = time.perf_counter()
RUN = load_run()                       # the committed run: course/results/measured.json, "13_ncu"
KERNELS = defaultdict(list)            # target -> its kernels, in launch order
for k in RUN["kernels"]:
    KERNELS[k["target"]].append(k)


def main_kernel(target):
    """A target's longest kernel (a split-KV decode adds a short merge; step 01's attention launches a dozen)."""
    return max(KERNELS[target], key=lambda k: k["gpu__time_duration.sum"])


def present(*targets):
    """Those of ``targets`` that the run holds, in the order given."""
    return [t for t in targets if t in KERNELS]


def short(k, width=24):
    """A kernel's name without its template arguments."""
    return k["Kernel Name"].removeprefix("void ").replace("<unnamed>::", "").split("<")[0].split("(")[0][:width]


env, dev = RUN["env"], RUN["device"]
cc = ".".join(map(str, env["capability"]))
print(f"{env['gpu']}: {dev['multiprocessor_count']} SMs, compute capability {cc}; {env['date']}; "
      f"torch {env['torch']}, Triton {env['triton']}, CUDA {env['cuda']}")
print(f"Nsight Compute {RUN['profile']['tool']}; from {RUN['source']}")
print(f"\n{'target':11s} {'step':5s} {'rung or backend':27s} {'configuration':34s} kernels")
for t, ks in KERNELS.items():
    print(f"{t:11s} {ks[0]['step']:5s} {ks[0]['rung']:27s} {ks[0]['config'][:34]:34s} {len(ks):7d}")

# %% [markdown]
# ## 1. How the course measured
#
# `benchmarks/counters.py` profiles each target in a process of its own:
#
# ```bash
# PYTHONPATH=src:. python -m benchmarks.counters --out DIR            # every target of TARGETS
# ncu --nvtx --nvtx-include profile/ --section LaunchStats --section Occupancy ... \
#     -o DIR/05_v6 python -m benchmarks.counters --one 05_v6          # what it runs for each target
# ncu -i DIR/05_v6.ncu-rep --page raw --csv --print-units base      # every metric, in base units
# ```
#
# Inside the process the target is called a few times first, outside any range, so that Triton compiles
# and autotunes and PyTorch's allocator warms up; then it is called once inside an NVTX range named
# `profile`. `--nvtx --nvtx-include profile/` tells ncu to profile only the kernels launched inside that
# push/pop range: every kernel of that one call, and nothing of the warm-up.
#
# **Kernel replay.** The SM has only so many counter registers, so ncu cannot collect a few hundred
# metrics in one run of a kernel. It groups them into passes and *replays* the kernel once per pass: before
# the first pass it saves the device memory the kernel can reach, and before each later pass it restores
# what the kernel wrote, so every pass computes on the same inputs. By default it also flushes the caches
# before each pass (`--cache-control all`), so every pass starts with a cold L2, as the course's bench does.
#
# **Clock control.** By default ncu locks the GPU's clocks to their base frequency (`--clock-control
# base`, recorded in the run as `clock_control`), so that counters and durations do not drift with boost
# and temperature from pass to pass and from run to run. The price: a duration under ncu is longer than
# the same kernel's time under the course's bench, which lets the clocks boost. Compare kernels **within
# one ncu run**, never an ncu duration against a TFLOP/s of `benchmarks/results/`. ncu also reports the
# elapsed cycles per second of each kernel, so the clock it ran at can be read back:

# %%
long_ones = [k for k in RUN["kernels"] if k["gpu__time_duration.sum"] > 1e4] or RUN["kernels"]   # ns
clocks = [k["sm__cycles_elapsed.avg.per_second"] / 1e9 for k in long_ones]
print(f"clock control: {RUN['profile']['clock_control']}; NVTX range: {RUN['profile']['nvtx_range']!r}")
print("sections:", ", ".join(RUN["profile"]["sections"]))
print(f"SM clock while profiled (sm__cycles_elapsed.avg.per_second): {min(clocks):.2f} to {max(clocks):.2f} GHz "
      f"over {len(long_ones)} kernels; the device's maximum (device__attribute_max_gpu_frequency_khz): "
      f"{dev['max_gpu_frequency_khz'] / 1e6:.2f} GHz")

# %% [markdown]
# ## 2. Reading a metric's name
#
# Every ncu metric is named `unit__counter.rollup.submetric` (the Profiling Guide's "metrics structure"):
#
# - **unit**: where it is counted: `gpu`, `sm` (a streaming multiprocessor), `smsp` (one of its four
#   sub-partitions, each with its own warp scheduler), `lts` (an L2 slice), `dram`; `launch__` and
#   `device__attribute_` are not counters but the launch's configuration and the GPU's properties;
# - **counter**: what is counted: `bytes`, `cycles_elapsed`, `warps_active`, `throughput`,
#   `ops_path_tensor_src_fp16` (FLOPs through the tensor cores with fp16 sources);
# - **rollup**: how the unit's instances are combined: `.sum` over all of them, `.avg`, `.min`, `.max`;
# - **submetric**: what is made of it: `.per_second`, `.per_cycle_active`, `.peak_sustained` (the most the
#   unit can do per cycle), `.pct_of_peak_sustained_elapsed` (achieved against that peak over the
#   kernel's elapsed cycles, in percent), `.ratio`.
#
# So `dram__bytes.sum.per_second` is the bytes read from and written to device memory, summed over all
# memory partitions, divided by the duration; `sm__throughput.avg.pct_of_peak_sustained_elapsed` is the
# SMs' busiest sub-unit as a percentage of its peak, averaged over the SMs; `gpu__time_duration.sum` is the
# kernel's duration. With `--print-units base` the raw page gives every value in its base unit
# (nanoseconds, bytes, bytes per second, percent, cycles) instead of ncu's scaled display units. One kernel:

# %%
EXAMPLE = (present("05_v6", "05_v4", "sdpa_cudnn") or list(KERNELS))[0]
k = main_kernel(EXAMPLE)
UNITS = {"gpu__time_duration.sum": "ns", "dram__bytes.sum.per_second": "bytes/s",
         "sm__cycles_elapsed.avg.per_second": "cycles/s", "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
         "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "%",
         "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "%",
         "sm__ops_path_tensor_src_fp16.sum": "FLOPs", "inst_executed": "warp instructions",
         "launch__registers_per_thread": "registers", "launch__shared_mem_per_block_dynamic": "bytes"}
print(f"{EXAMPLE}: {short(k, 60)}")
for name, unit in UNITS.items():
    print(f"  {name:66s} {k[name]:>18,.1f} {unit}")

# %% [markdown]
# ## 3. Speed of Light: which unit is busy?
#
# ncu's first section compares each unit's achieved throughput with its peak over the elapsed time. Two
# numbers summarise it: **compute (SM) throughput**, `sm__throughput`, the busiest of the SM's sub-units
# (instruction issue, the tensor pipe, the FMA pipe, shared memory, ...), and **memory throughput**,
# `gpu__compute_memory_throughput`, the busiest of the memory units (L1, L2, DRAM). ncu's reading, from
# its SOL rule:
#
# - one of the two close to its peak: the kernel is bound by that side, and the question becomes *which
#   unit* (the DRAM column below tells device memory from L1 and L2);
# - both low, below 60 percent of peak by ncu's rule (`NCU_LATENCY_RULE` below): the kernel neither feeds
#   its pipes nor saturates its memory; ncu suggests *latency* issues and points to the warp states (§5).
#
# For a tensor-core kernel one more number matters: `sm__pipe_tensor_cycles_active`, the share of cycles
# the tensor pipe was busy. Each target's longest kernel:

# %%
NCU_LATENCY_RULE = 60.0    # ncu's SOL rule: compute and memory both below this share of peak suggest latency


def sol_reading(k):
    """ncu's first reading of a kernel: which side is busy (compute, memory or both), or latency."""
    busy = [side for side, m in (("compute", "sm__throughput"), ("memory", "gpu__compute_memory_throughput"))
            if k[f"{m}.avg.pct_of_peak_sustained_elapsed"] >= NCU_LATENCY_RULE]
    return " and ".join(busy) or "latency"


print(f"{'target':11s} {'kernel':24s} {'us':>8s} {'SM %':>5s} {'mem %':>6s} {'DRAM %':>7s} {'tensor %':>8s} "
      f"{'L2 hit %':>8s}  reading")
for t in KERNELS:
    k = main_kernel(t)
    print(f"{t:11s} {short(k):24s} {k['gpu__time_duration.sum'] / 1e3:8.1f} "
          f"{k['sm__throughput.avg.pct_of_peak_sustained_elapsed']:5.1f} "
          f"{k['gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed']:6.1f} "
          f"{k['gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed']:7.1f} "
          f"{k['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:8.1f} "
          f"{k['lts__t_sector_hit_rate.pct']:8.1f}  {sol_reading(k)}")

# %% [markdown]
# The two calibration kernels read as they should. The copy is memory-bound, its DRAM column equal to its
# memory column: DRAM is the busy unit. The GEMM is busy on both sides: its tensor pipe almost every cycle,
# and, with DRAM low, the shared memory and L2 that feed the tensor cores. Read the attention forwards next.
# An attention forward reads $Q$, $K$, $V$ and writes $O$ once, and does up to $4 S_q S_k D$ FLOPs per head on
# them (lecture 00): far right of the ridge, so its DRAM column stays small, and its L2 hit rate high (the
# $K$, $V$ tiles of a head are read by every query tile of that head). It should be compute-bound, and by
# ncu's rule many of them read as latency instead: their tensor pipe is busy for a part of the cycles, and the
# rest is spent elsewhere. That is what §4 and §5 take apart. The decode kernels are the opposite: they read
# the whole KV cache for one query token, so the DRAM column is the one to watch. A "memory" reading with a
# low DRAM column means the busy memory unit is L1 or shared memory: the kernel is moving bytes inside the SM,
# not streaming from DRAM (step 09's v1 sums its dot products across threads; step 06's v2 reads shared
# memory with `ldmatrix` whose rows conflict on the banks until v4's swizzle, as step 06's manifest says).
#
# One caution from NVIDIA's Compute Triage Guide: the SOL percentages are *rates*. A change that removes
# work (skipping masked tiles, §7) can make a kernel faster while its percentages stay put or fall. The
# duration is the ground truth; the percentages say where the remaining time goes.
#
# Step 01's attention is not one kernel but a dozen, and its time is theirs together:

# %%
if "vanilla" in KERNELS:
    ks = sorted(KERNELS["vanilla"], key=lambda k: -k["gpu__time_duration.sum"])
    total = sum(k["gpu__time_duration.sum"] for k in ks)
    print(f"step 01's attention on {ks[0]['config']}: {len(ks)} kernels, {total / 1e3:.0f} us in all")
    for k in ks:
        ns = k["gpu__time_duration.sum"]
        print(f"  {short(k, 32):32s} {ns / 1e3:8.1f} us {ns / total:6.1%}"
              f"   DRAM {k['gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed']:5.1f} %   "
              f"tensor {k['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:5.1f} %")
    for t in present("05_v6", "sdpa_flash", "sdpa_cudnn"):
        print(f"{t}: one kernel, {main_kernel(t)['gpu__time_duration.sum'] / 1e3:.0f} us")

# %% [markdown]
# The matrix products (the `nvjet` kernels, cuBLAS's) are a small share of step 01's time; the softmax and
# the elementwise passes over $S$ (the scale, the causal mask; the small ones copy $K$ and $V$ per query
# head) are most of it, each a full pass over the $S_q \times S_k$ scores, read and written through memory
# for a few operations per element. That is lecture 01's count of HBM trips, now read off the counters.
#
# ## 4. Occupancy: how many warps fit?
#
# An SM holds up to 64 warps and 32 blocks at once, and a block is placed on an SM only if all of it fits:
# its registers, its shared memory, its warp slots. With $w = \lceil \text{threads} / 32 \rceil$ warps a block,
# $r$ registers a thread and $s$ bytes of static and dynamic shared memory a block, the blocks one SM can
# hold by each resource are (CUDA Occupancy Calculator; compute capability 9.0):
#
# $$\text{registers: } \left\lfloor \frac{4 \left\lfloor 16384 / \lceil 32 r \rceil_{256} \right\rfloor}{w} \right\rfloor,
#   \qquad \text{shared memory: } \left\lfloor \frac{C}{\lceil s + 1024 \rceil_{128}} \right\rfloor,
#   \qquad \text{warps: } \left\lfloor \frac{64}{w} \right\rfloor, \qquad \text{blocks: } 32,$$
#
# with $\lceil x \rceil_u$ rounding up to a multiple of $u$. A warp's registers are allocated 256 at a time
# from one of the four schedulers' register files of 16384 (65536 in all); the driver reserves 1024 bytes
# of shared memory for every block; shared memory is allocated in 128-byte steps out of the **carve-out**
# $C$ the SM is configured with for the launch (`launch__shared_mem_config_size`; what is left of the SM's
# unified L1 and shared memory stays L1 cache). The smallest of the four is the blocks per SM, and
#
# $$\text{theoretical occupancy} = \frac{w \cdot \min(\text{limits})}{64}, \qquad
#   \text{achieved occupancy} = \frac{\text{warps active, averaged over the SM's active cycles}}{64}.$$
#
# ncu reports the four limits (`launch__occupancy_limit_*`) and both occupancies. The GPU's side, as the
# check module stores it and as ncu read it from the device:

# %%
print("OCCUPANCY_GPU =", OCCUPANCY_GPU)
print({k: v for k, v in dev.items() if k.startswith(("max_", "reserved", "num_"))})
print(f"{CONFIGS['large']}\n")
print(records_table(RUN))

# %% [markdown]
# `records_table` lists every kernel of the run: its launch (registers a thread, threads a block, static
# and dynamic shared memory, carve-out), ncu's four limits in the order registers / shared memory / warps /
# blocks, the theoretical occupancy, the duration, the DRAM rate and the SM throughput. The figure shows
# each target's longest kernel, the binding limits framed, with theoretical and achieved occupancy:
#
# ![ncu's four occupancy limits per kernel, the binding ones framed; theoretical and achieved occupancy](../diagrams/occupancy_limits.png)
#
# The cell groups the kernels: which limit binds, and how many warps a scheduler had (four schedulers an
# SM, so 16 warps a scheduler at full occupancy), active and eligible (ready to issue) per cycle:

# %%
LIMITS = ("registers", "shared_mem", "warps", "blocks")
ATTENTION = [t for t in KERNELS if KERNELS[t][0]["step"] in ("05", "06", "07", "08", "sdpa")
             and main_kernel(t)["sm__ops_path_tensor_src_fp16.sum"]]        # the tensor-core ones
print(f"{'target':11s} {'limits r/s/w/b':>14s} {'binding':>20s} {'theor. %':>8s} {'achieved %':>10s} "
      f"{'active/sched':>12s} {'eligible/sched':>14s}")
for t in KERNELS:
    k = main_kernel(t)
    lim = {x: int(k[f"launch__occupancy_limit_{x}"]) for x in LIMITS}
    binding = "+".join(x for x in LIMITS if lim[x] == min(lim.values()))
    print(f"{t:11s} {'/'.join(map(str, lim.values())):>14s} {binding:>20s} "
          f"{k['sm__maximum_warps_per_active_cycle_pct']:8.1f} "
          f"{k['sm__warps_active.avg.pct_of_peak_sustained_active']:10.1f} "
          f"{k['smsp__warps_active.avg.per_cycle_active']:12.2f} {k['smsp__warps_eligible.avg.per_cycle_active']:14.2f}")
occ = [main_kernel(t)["sm__maximum_warps_per_active_cycle_pct"] for t in ATTENTION]
if occ:
    print(f"\ntensor-core attention kernels ({', '.join(ATTENTION)}): theoretical occupancy {min(occ):.1f} "
          f"to {max(occ):.1f} %")
for t in present("06_v1"):                     # step 06's scalar rung: no tensor cores
    k = main_kernel(t)
    print(f"{t} (no tensor cores): theoretical occupancy {k['sm__maximum_warps_per_active_cycle_pct']:.1f} %, "
          f"{k['gpu__time_duration.sum'] / 1e3:.0f} us")

# %% [markdown]
# Every attention kernel sits at a small fraction of the SM's warp slots, bound by registers or shared memory
# (often both at once), and reaches about what it is allowed (achieved close to theoretical): a scheduler
# holds a few warps (the active column), not sixteen. This is by design, not neglect. A FlashAttention block
# keeps its output tile $O_i$ and its row statistics in registers for the whole key loop (a 128-row tile at
# $D = 128$ in fp32 is 64 KB per block) and a ring of $K_j$, $V_j$ tiles in shared memory; larger tiles mean
# fewer bytes per FLOP (lecture 04) and more independent MMAs per warp. A kernel hides latency in two ways:
# by switching to another warp (occupancy), or by having work in flight inside one warp (instruction-level
# parallelism: independent MMAs issued back to back, the next tiles' loads issued stages ahead with
# `cp.async` or TMA while the current tiles compute). Volkov's GTC 2010 talk made the case for the second on
# matrix products; FlashAttention takes it. Doubling the blocks per SM would halve the registers and shared
# memory each one gets. The elementwise kernels of step 01 are the other regime: no reuse, no tiles, full
# occupancy, and still slow, because each moves all of $S$ for a handful of operations per element. And the
# cell's last line, where the run has step 06's scalar rung, is the counter-example: without tensor cores it
# holds more warps than any tensor-core kernel and is the slowest kernel of the run.
#
# Which is enough? That is a question about latency, and the next section answers it with the stalls.
#
# ## 5. Warp stalls: what do the warps wait for?
#
# Each scheduler issues at most one instruction a cycle, from one of its eligible warps. Between two of
# its instructions a warp spends some cycles in a *state*: selected (issuing), or stalled for a reason.
# ncu's `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio` counts, per issued instruction,
# the warp-cycles spent in each state; summed over the states it is ncu's *warp cycles per issued
# instruction*, $L$. If a scheduler holds $W$ warps on average and issues on a fraction $R$ of its cycles,
# then every cycle contributes $W$ warp-cycles and $R$ instructions, so (Little's law: occupancy =
# throughput × latency)
#
# $$W = R \cdot L, \qquad\text{and to issue every cycle } (R = 1) \text{ a scheduler needs } W \ge L.$$
#
# Either more warps (occupancy) or fewer cycles per instruction (fewer or shorter stalls) raises $R$. The
# cell checks the identity on ncu's own numbers:

# %%
STALL, END = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def stalls(k):
    """reason -> warp-cycles per issued instruction, largest first."""
    st = {n[len(STALL):-len(END)]: v for n, v in k.items() if n.startswith(STALL) and n.endswith(END)}
    return dict(sorted(st.items(), key=lambda kv: -kv[1]))


print(f"{'target':11s} {'W active':>8s} {'R issue':>8s} {'W / R':>6s} {'L = sum':>7s}   top three reasons")
for t in KERNELS:
    k = main_kernel(t)
    W, R = k["smsp__warps_active.avg.per_cycle_active"], k["smsp__issue_active.avg.pct_of_peak_sustained_active"] / 100
    st = stalls(k)
    top = ", ".join(f"{r} {v:.2f}" for r, v in list(st.items())[:3])
    print(f"{t:11s} {W:8.2f} {R:8.2f} {W / R:6.2f} {sum(st.values()):7.2f}   {top}")

# %% [markdown]
# The reasons that matter here (Profiling Guide, "warp stall reasons"):
#
# - **selected**: the cycle the warp issues: exactly 1 per instruction. **not_selected**: eligible, but
#   another warp issued; many of these mean more warps than the scheduler needs.
# - **long_scoreboard**: waiting for the result of an L1TEX operation: a global or local memory load
#   (local memory includes register spills). The copy's main reason, and the tuned decode kernel's.
# - **short_scoreboard**: waiting for an MIO result that stays in the SM: shared memory reads, and special
#   functions (MUFU: `exp2`). **mio_throttle**: the MIO queue is full: too many shared-memory or MUFU
#   instructions in a row.
# - **barrier**: waiting at a block-wide barrier (`__syncthreads`, `bar.sync`) for the block's other warps;
#   it grows with the warps of a block and with uneven work between them.
# - **wait**: a fixed-latency dependency the compiler encoded in the instruction (an FMA's result used by
#   the next instruction). **math_pipe_throttle**: the pipe the instruction needs is busy.
# - **gmma**: Hopper's asynchronous warpgroup MMA (`wgmma`): the warp waits on it.
#
# ![cycles per issued instruction by stall reason for a few kernels](../diagrams/stall_reasons.png)
#
# Two regimes show. The copy and the tuned decode kernel wait on global memory: long_scoreboard leads, and the
# fix is more bytes in flight (wider loads, more stages, more warps or splits), not fewer instructions.
# Decode's v1 has its largest stalls inside the SM instead (short_scoreboard, wait, mio_throttle: its
# reductions across threads), the reason §3 found its memory busy and its DRAM idle; step 06's v2 is the
# extreme case, its warps waiting on conflicting shared-memory reads (short_scoreboard) for most of their
# cycles, and v4's swizzle takes that wait away. The attention forwards wait a few cycles per instruction,
# spread over barriers, fixed latencies and the MMA rather than dominated by global memory, because their
# loads were issued stages earlier. With a few warps a scheduler and $L$ of several cycles, $R = W / L$ stays
# well below one: the tensor pipe is fed in bursts. Raising $W$ faster than $L$ grows (§7, v4 to v6), or
# shortening $L$ (fewer instructions between MMAs), is what is left.
#
# ## 6. The measured roofline
#
# A kernel that does $F$ useful FLOPs and moves its bytes between DRAM and the chip has operational
# intensity $I = F / \text{bytes}$ (Williams, Waterman and Patterson), and its rate $P$ is bounded by the two roofs:
#
# $$P \le \min(\pi,\; \beta \cdot I), \qquad I^* = \pi / \beta \text{ (the ridge)}.$$
#
# Data-sheet roofs are peaks that real kernels seldom approach, at clocks ncu does not run. This run measures both roofs
# the same way it measures the kernels: $\pi$ is the useful rate of an fp16 GEMM of $8192^3$
# ($2 \cdot 8192^3$ FLOPs over its ncu duration), $\beta$ the useful rate of a 1 GiB copy (read once,
# written once: 2 GiB over its duration), both at the same locked clocks. The cell prints them, the ridge,
# and two cross-checks: the GEMM's clock against lecture 14's 4096 dense fp16 FLOPs per clock per SM, and
# the copy's useful rate against the DRAM rate ncu counted for it.

# %%
roofs = RUN["roofs"]
print(f"roofs (run {env['date']}): GEMM {roofs['tflops']} TFLOP/s, copy {roofs['gbps']} GB/s; "
      f"ridge {roofs['tflops'] * 1e12 / (roofs['gbps'] * 1e9):.0f} FLOP/byte")
if "gemm" in KERNELS:
    g = main_kernel("gemm")
    clock = g["sm__cycles_elapsed.avg.per_second"]
    peak = 4096 * dev["multiprocessor_count"] * clock / 1e12          # dense fp16 at the clock it ran at
    print(f"GEMM: {short(g, 40)}, SM clock {clock / 1e9:.2f} GHz: dense fp16 peak at that clock {peak:.0f} "
          f"TFLOP/s, of which it reaches {roofs['tflops'] / peak:.0%} (tensor pipe busy "
          f"{g['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:.1f} % of active cycles)")
if "copy" in KERNELS:
    c = main_kernel("copy")
    print(f"copy: useful {roofs['gbps']:.0f} GB/s; DRAM as ncu counts it "
          f"{c['dram__bytes.sum.per_second'] / 1e9:.0f} GB/s "
          f"({c['gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed']:.1f} % of the DRAM peak)")
faster = [t for t in KERNELS if t != "copy" and main_kernel(t)["dram__bytes.sum.per_second"] > roofs["gbps"] * 1e9]
print("kernels whose DRAM rate exceeds the copy's useful rate:", ", ".join(faster) or "none")

# %% [markdown]
# The GEMM's roof is below the data sheet's 989 TFLOP/s for two reasons the cell separates: the clock (base,
# not boost) and what a real GEMM reaches of its clock's peak. The copy's two rates need not agree: DRAM
# counts what crossed it (a write still held in L2 when the kernel ends is not counted, for one), and the
# memory roof is the *useful* rate, 2 GiB over the duration. And a kernel that only reads (a decode kernel
# streaming the KV cache) can stream faster than a copy, which alternates reads and writes; such a kernel
# plots above the memory roof, and the cell lists any. The measured roofs are a yardstick for the course's
# kernels, not the machine's limits.
#
# Each kernel that carries the course's count of useful FLOPs (`work`: set on a target's only kernel, or on
# its only tensor-core kernel) is one point: $I$ = work / DRAM bytes, $P$ = work / duration. The distance
# below its roof is what a kernel has left to gain; the kernels without tensor cores (step 06's scalar rung,
# decode's v1) sit far below theirs. The right panel divides the same work by what the tensor cores
# executed, `sm__ops_path_tensor_src_fp16.sum`, which counts every FLOP of every MMA, masked or padded:
#
# ![the measured roofline of the course's kernels, and the useful share of their tensor-core FLOPs](../diagrams/measured_roofline.png)
#
# The useful share is a count of tiles, and can be predicted. On `large` (causal, $S = 2048$), a kernel
# that computes every key tile of a query tile does $S^2$ pairs for $S(S+1)/2$ useful ones; one that skips
# the tiles above the diagonal computes, for query tile $i$ of $B_M$ rows, the $\lceil (i+1) B_M / B_N \rceil$
# key tiles its last row sees, and masks inside the diagonal ones. Decode packs the $G = H_q / H_{kv}$
# query heads of a KV head into one MMA, whose rows come in multiples of 16:

# %%
cfg = CONFIGS["large"]
S, useful_pairs = cfg.Sq, cfg.Sq * (cfg.Sq + 1) // 2


def pairs_computed(bm, bn, skip):
    """(query, key) pairs a causal kernel computes on S x S in bm x bn tiles, with or without tile skipping."""
    if not skip:
        return S * S
    return sum(bm * bn * -(-min(S, (i + 1) * bm) // bn) for i in range(-(-S // bm)))


for bm, bn, skip, who in ((64, 64, False, "v2: every key tile"), (64, 64, True, "v3: skips above the diagonal"),
                          (128, 64, True, "v6's table on large"), (128, 128, True, "square, for comparison"),
                          (128, 176, True, "step 07's tiles from its v6 on")):
    share = useful_pairs / pairs_computed(bm, bn, skip)
    print(f"{bm:3d} x {bn:<3d} tiles, {'skip' if skip else 'no skip':7s}: useful share {share:.3f}  {who}")
dc = get_decode_case("b64_8k_p16", "cuda")
G = dc.Hq // dc.Hkv
print(f"decode on {dc.name}: G = {G} query heads in an MMA of 16 rows: useful share {G / 16:.3f}")
print(f"a backward that computes dQ in a pass of its own: 14D against 10D FLOPs a pair (lecture 08), "
      f"the share times {10 / 14:.3f}")

# %% [markdown]
# The model and the counters agree (compare with the right panel). v2 computes every tile and throws half
# of its MMAs away; v3's causal split skips them; larger tiles waste a little more on the diagonal, which
# costs less than their better reuse gains. FlashAttention-2 and cuDNN land where the model puts a kernel
# with tile skipping and 128-row tiles; step 07's 176-key tiles (its `v6_block_n176` and every rung after)
# pay a little more on the diagonal for fewer, longer MMAs. A backward's share counts its recomputation
# too: the course counts five products a tile pair, and a backward that keeps dQ out of atomics by
# recomputing $S$ and $dP$ in a pass of its own executes seven. Decode's quarter is no loss: its points sit
# left of the ridge, bound by the bytes of the KV cache, and the tensor cores' padded rows fill issue slots
# that would idle anyway.
#
# ## 7. From counters to a fix: step 05's rungs
#
# Step 05's ladder changed one thing at a time (lecture 05; `solutions/05_triton_flash_attention/step.toml`):
# v3 added the causal split, v4 GQA's head map, `exp2` with $\log_2 e$ folded into the scale and autotuned
# tiles, v6 host-side TMA descriptors and a measured table of tiles (on `large`: 128 x 64 tiles, 8 warps,
# two stages, registers capped at 128 so that two blocks fit an SM). The counters of each rung:

# %%
RUNGS = present("05_v2", "05_v3", "05_v4", "05_v5", "05_v6")
ROWS = {"duration (us)": lambda k: k["gpu__time_duration.sum"] / 1e3,
        "tensor FLOPs executed (1e9)": lambda k: k["sm__ops_path_tensor_src_fp16.sum"] / 1e9,
        "warp instructions (1e6)": lambda k: k["inst_executed"] / 1e6,
        "registers / thread": lambda k: k["launch__registers_per_thread"],
        "threads / block": lambda k: k["launch__block_size"],
        "blocks / SM (min of limits)": lambda k: min(k[f"launch__occupancy_limit_{x}"] for x in LIMITS),
        "warps active / scheduler": lambda k: k["smsp__warps_active.avg.per_cycle_active"],
        "warps eligible / scheduler": lambda k: k["smsp__warps_eligible.avg.per_cycle_active"],
        "issue active (%)": lambda k: k["smsp__issue_active.avg.pct_of_peak_sustained_active"],
        "cycles / instruction (L)": lambda k: sum(stalls(k).values()),
        "  barrier": lambda k: stalls(k).get("barrier", 0.0),
        "  long_scoreboard": lambda k: stalls(k).get("long_scoreboard", 0.0),
        "tensor pipe busy (%)": lambda k: k["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"],
        "SM throughput (%)": lambda k: k["sm__throughput.avg.pct_of_peak_sustained_elapsed"]}
print(f"{'':30s}" + "".join(f"{t:>10s}" for t in RUNGS))
for name, f in ROWS.items():
    print(f"{name:30s}" + "".join(f"{f(main_kernel(t)):10.2f}" for t in RUNGS))

# %% [markdown]
# Read the table one step at a time, asking which counter moved with the change:
#
# - **v2 to v3, the causal split.** The tensor FLOPs executed fall by half, the instructions by half or
#   more, and the duration with them: the work went, not the rate. The SM throughput barely moves or
#   falls, the Triage Guide's caution in one row.
# - **v3 to v4, exp2 and autotuned tiles.** One `MUFU.EX2` per score instead of an exponential built from
#   a multiply and `ex2`, and larger tiles where the autotuner picks them: fewer instructions for the same
#   MMAs. Its pick for this run is in the launch rows (threads a block, blocks an SM); with blocks of 8
#   warps one fits an SM, and the barrier stall grows with the warps a barrier must wait for.
# - **v4 to v6, two blocks an SM.** v6 caps the registers at 128 so that two blocks of 8 warps fit: warps
#   active and eligible per scheduler rise, the issue rate and the tensor pipe with them, although each
#   warp's $L$ lengthens (more warps at the same barriers, and `not_selected`, the cost of having a warp
#   to spare). Little's law at work: $W$ grew faster than $L$.
#
# **What to look at first when your own kernel is slow.**
#
# 1. *Is it the kernel you think?* Profile one call inside an NVTX range; count its kernels and their
#    durations (step 01's attention is a dozen). Compare durations only within one ncu run.
# 2. *Is the work the work you meant?* Executed tensor FLOPs (`sm__ops_path_tensor_src_fp16.sum`) against
#    your own count, and `inst_executed` between versions: masked tiles, padding and redundant
#    instructions show here before anywhere else.
# 3. *Which side binds?* Speed of Light: SM against memory throughput; the DRAM column against the memory
#    column; the tensor pipe for a matmul kernel. Both low: latency, go to 5.
# 4. *Where on the roofline?* Left of the ridge, count the bytes: is each input read once (the L2 hit rate
#    and the DRAM rate tell)? Right of it, the tensor pipe's busy share is your headroom.
# 5. *What do the warps wait for?* The top stall reasons and $W = R \cdot L$: long_scoreboard wants bytes
#    in flight; barrier wants fewer or better-balanced syncs; short_scoreboard and mio_throttle want fewer
#    shared-memory or MUFU instructions, or no bank conflicts; not_selected means warps to spare.
# 6. *Then occupancy*, and only as a means: which limit binds, spills
#    (`sass__inst_executed_register_spilling`), achieved against theoretical (a tail, too few waves).
#    More warps help only if $L$ does not grow with them.
# 7. Change one thing, profile again, keep it only if the duration fell.
#
# ## 8. A slow kernel made fast: step 13's own ladder
#
# Section 7 read counters that a good change moved. The other way round is the one you will need: a slow
# kernel, and counters that point at what is wrong. `solutions/13_profiling/ladder/v0_slow.py` is step 05's
# kernel with four defects, each of a kind met in real code, and each leaving its mark in one counter:
#
# | defect in v0 | what it costs | the counter that shows it | removed in |
# |---|---|---|---|
# | Q, K, V and P cast to fp32 before `tl.dot` | TF32 runs the tensor cores at half the fp16 rate, operands twice the bytes | tensor ops of source type `tf32`, not `fp16` | v1 |
# | 128 x 128 tiles on 4 warps | S and the accumulator of 128 rows in 128 threads exceed 255 registers: ptxas spills to local memory | `derived__local_spilling_requests`; the long-scoreboard stall | v2 (8 warps) |
# | one pipeline stage | each K and V tile loads, then is used: no load in flight under the dots | the long-scoreboard stall | v3 (128 x 64, 3 stages) |
# | every key tile visited and masked | on causal `large`, half the tensor work is thrown away | executed tensor ops over the course's FLOPs (useful 0.5) | v4 |
#
# and v5 changes the tiles once more, for a reason section 4 prepares: v4's program of 128 query rows on 8
# warps holds an SM alone (128 KiB of shared memory at 3 stages), so all its warps wait at the same barriers;
# two programs of 64 rows on 4 warps each hold as many warps and run out of step.
#
# Both runs below are committed: the ladder runner's timings (the course's bench, against FA2, the rungs on
# `large` and `long`) and one Nsight Compute run of the six rungs and FA2 on `large`.

# %%
LADDER = results.load("13")                  # python -m benchmarks.ladder 13
LNCU = results.load("13_ladder_ncu")         # python -m benchmarks.counters --targets copy,gemm,sdpa_flash,13_v0,...
print(f"bench: {LADDER['source']} ({LADDER['env']['gpu']}, {LADDER['env']['date']}); "
      f"counters: {LNCU['source']} ({LNCU['env']['gpu']}, {LNCU['env']['date']})")
TENSOR = {t: TENSOR_OPS[t] for t in ("fp16", "tf32")}      # the types these rungs use


def bench_row(rung, config):
    """The ladder run's row of ``rung`` on ``config`` (fp16) against FA2."""
    return next(r for r in LADDER["rows"] if r["rung"] == rung and r["config"] == config
                and r["dtype"] == "float16" and r["ref_backend"] == "FLASH_ATTENTION")


print(f"{'rung':17s}{'large':>8s}{'vs FA2':>8s}{'long':>8s}{'vs FA2':>8s}   "
      f"{'us':>6s}{'type':>5s}{'useful':>7s}{'regs':>5s}{'spills (1e6)':>13s}{'progs/SM':>9s}"
      f"{'tensor %':>9s}{'issue %':>8s}{'long_sb':>8s}")
def counters(k):
    """One kernel's columns of the table: duration, tensor ops' type and useful share, registers, spills,
    programs an SM, tensor pipe and issue busy, long-scoreboard stall."""
    kind = max(TENSOR, key=lambda t: k.get(TENSOR[t]) or 0)
    return (f"{k['gpu__time_duration.sum'] / 1e3:6.0f}{kind:>5s}{k['work'] / k[TENSOR[kind]]:7.2f}"
            f"{k['launch__registers_per_thread']:5d}{k['derived__local_spilling_requests'] / 1e6:13.1f}"
            f"{min(k[f'launch__occupancy_limit_{x}'] for x in LIMITS):9d}"
            f"{k['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']:9.0f}"
            f"{k['smsp__issue_active.avg.pct_of_peak_sustained_active']:8.0f}"
            f"{k['smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio']:8.2f}")


for k in LNCU["kernels"]:
    if k["step"] == "13":
        lg, ln = bench_row(k["rung"], "large"), bench_row(k["rung"], "long")
        print(f"{k['rung']:17s}{lg['tflops']:8.0f}{lg['ratio']:7.2f}x{ln['tflops']:8.0f}{ln['ratio']:7.2f}x   "
              + counters(k))
print(f"{'FA2 (SDPA)':17s}{'':40s}" + counters(next(k for k in LNCU["kernels"] if k["target"] == "sdpa_flash")))

# %% [markdown]
# Read it rung by rung, as in section 7, asking which counter moved (the bench's TFLOP/s on the left, the
# counters of one ncu run on `large` on the right):
#
# - **v0 to v1, fp16 dots.** The tensor ops change type, TF32 to fp16, at the same count, and `large` runs about
#   four times faster (22 to 87 TFLOP/s): TF32 runs the tensor cores at half the fp16 rate, and its fp32
#   operands doubled the bytes each tile moved. The spill requests remain (255 registers a thread), and v1 is
#   still at 0.29x FA2.
# - **v1 to v2, 8 warps.** The same tiles over twice the threads: 222 registers a thread and no spill request
#   left; 117 TFLOP/s. Occupancy did not rise: v1 fit two programs of 4 warps an SM, v2 one of 8.
# - **v2 to v3, three stages.** The long-scoreboard stall falls to about a quarter: the next K and V tiles are
#   in flight while the dots run. 143 TFLOP/s on `large`, 322 on `long` (0.89x FA2), where no tile is masked.
# - **v3 to v4, the causal split.** The useful share goes from 0.50 to 0.94: on causal `large` half the tensor
#   work was thrown away by the mask. 1.9x v3 on `large`; non-causal `long` does not move.
# - **v4 to v5, two programs an SM.** The same warps per scheduler (two) and the same theoretical occupancy,
#   yet more of them eligible, the issue rate and the tensor pipe's busy share up, the barrier and `wait`
#   stalls down (the long-scoreboard stall grows, a smaller cost than what the others gave). Each program's
#   4 warps wait at their own barriers, so one program's softmax overlaps the other's dots. 344 TFLOP/s on
#   `large`, 1.13x FA2, and 1.03-1.18x over the 4k-16k sweep: step 05's v3, reached from the other end.
#
# FA2's own kernel (the last row) spills too, an order of magnitude less than v1, and keeps its tensor pipe
# busier than any rung: a counter names a suspect, and the duration says whether removing it paid.
#
# ## 9. Proton: the same kernels from inside Triton
#
# Triton ships its own profiler, Proton (`triton.profiler`). Its default backend is CUPTI, the same
# library ncu is built on, used the other way round: no replay and no locked clocks, every kernel of the
# run timed as it ran, grouped under *scopes* that the Python code opens. A scope can carry metrics; given
# the FLOPs of its calls, Proton reports their TFLOP/s. The course's run (`benchmarks/counters.py --proton`)
# wraps each Triton target and the two SDPA references in a scope:
#
# ```python
# import triton.profiler as proton
# proton.start("ladder", hook="triton")                   # writes ladder.hatchet at finalize()
# with proton.scope("05_v6", {"flops": flops * calls}):   # the course's count of the useful FLOPs
#     for _ in range(calls):
#         fn(q, k, v, causal=True)
# proton.finalize()
# ```
#
# The calls follow one another with no cache flush, so after the first one a call finds part of its
# inputs in L2, and the clocks boost: Proton's times are the application's, ncu's are reproducible.
# Proton's second mode, `mode="pcsampling"`, has CUPTI sample each warp's program counter at a fixed
# interval with its state, the stall reasons of §5 as counts of samples of one real run. (Proton can also
# instrument the inside of a kernel, `triton.profiler.language.enter_scope`, but Triton 3.6 allows it only
# in Gluon: its module says why, the compiler's pipelining and reordering of a Triton kernel would leave a
# marker bracketing something other than what it seems to.) Both, side by side with ncu. The two are separate
# runs (ncu replays a process that Proton would watch), half an hour apart on H200s lent to the same session,
# not necessarily the same card: read the last column as a tool's effect, not a measured constant.

# %%
PROTON = results.load("13_proton")
if PROTON is None:
    print("No Proton run is committed (course/results/measured.json has no \"13_proton\").")
else:
    calls = PROTON["proton"]["calls"]
    print(f"{PROTON['env']['gpu']}, {PROTON['env']['date']}, Triton {PROTON['env']['triton']}; "
          f"{calls} calls a target; from {PROTON['source']}")
    print(f"{'target':11s} {'Proton us/call':>14s} {'TFLOP/s':>8s} {'ncu us (base clocks)':>21s} {'ncu / Proton':>12s}")
    for t in PROTON["targets"]:
        ns = sum(k["time_ns"] for k in t["kernels"])
        ncu = sum(k["gpu__time_duration.sum"] for k in KERNELS.get(t["target"], []))
        ratio = f"{ncu / (ns / calls):12.2f}" if ncu else f"{'—':>12s}"
        print(f"{t['target']:11s} {ns / calls / 1e3:14.1f} {t['flops'] / ns / 1e3:8.1f} {ncu / 1e3:21.1f} {ratio}")
    for t, s in PROTON["pc_sampling"].items():
        top = sorted(s["by_reason"].items(), key=lambda kv: -kv[1])[:4]
        ncu_top = sorted(stalls(main_kernel(t)).items(), key=lambda kv: -kv[1])[:4] if t in KERNELS else []
        print(f"\n{t} ({s['kernel'][:30]}): {s['samples']} samples, {s['stalled']} of them stalled")
        print("  Proton's PC samples: " + ", ".join(f"{r} {n / s['samples']:.0%}" for r, n in top))
        if ncu_top:
            print("  ncu's warp states (cycles per instruction): " + ", ".join(f"{r} {v:.2f}" for r, v in ncu_top))

# %% [markdown]
# The two profilers rank the kernels alike. For the forwards ncu's durations are the longer ones: its SMs
# ran at base clock, Proton's at whatever the GPU boosted to, and Proton's repeated calls found a warm L2; the ratio stays below the ratio of the clocks (§1's cell prints ncu's), since a GPU
# under a long load does not hold its top boost. Only the decode that streams at the memory roof (v4) reads
# about the same under both: its time is the memory's, and the memory ran at its full clock under ncu too
# (the cell below); v1 and v3, further below that roof, slow down with the SM clock like the forwards. The
# sampled stall reasons lead with the same states as ncu's warp-state ratios:
# barrier and long_scoreboard for step 05's kernel, long_scoreboard for the decode, whose warps wait on
# the KV cache. Proton answers "where does my program's GPU time go" in the program's own terms, cheaply
# enough to leave on; ncu answers "why is this one kernel slow" with every counter, at a replay's cost.

# %%
for t in present("09_v4", "05_v6"):
    k = main_kernel(t)
    print(f"{t}: under ncu the DRAM ran at {k['dram__cycles_elapsed.avg.per_second'] / 1e9:.2f} GHz (its maximum: "
          f"{dev['max_mem_frequency_khz'] / 1e6:.2f} GHz), the SMs at {k['sm__cycles_elapsed.avg.per_second'] / 1e9:.2f} "
          f"GHz (maximum {dev['max_gpu_frequency_khz'] / 1e6:.2f} GHz)")

# %% [markdown]
# ## Summary
#
# - `ncu` replays each kernel once per pass of counters, restoring its memory and flushing the caches, at
#   clocks locked to base: durations are reproducible and longer than the bench's; compare within a run.
# - Metric names read `unit__counter.rollup.submetric`; the raw page with `--print-units base` gives
#   nanoseconds, bytes, bytes per second and percent.
# - Speed of Light compares each side's busiest unit with its peak; both low means latency, and the
#   duration, not a percentage, is the ground truth.
# - Occupancy is the smallest of four limits (registers in 256s per warp from four files of 16384,
#   shared memory with 1 KB reserved per block in 128-byte steps of the carve-out, 64 warps, 32 blocks).
#   The FlashAttention kernels run at low occupancy on purpose: big tiles in registers and shared memory,
#   latency hidden by asynchronous, multi-stage loads and independent MMAs inside each warp.
# - Stall reasons sum to the cycles per issued instruction $L$, and $W = R \cdot L$ ties them to occupancy.
# - On a roofline measured in the same run (a GEMM and a copy), the attention forwards sit right of the
#   ridge, below the compute roof; decode left of it, at the memory roof; the useful share counts the
#   masked and padded tiles the tensor cores computed anyway.
# - A slow kernel made fast: TF32 dots show in the tensor ops' type, spills in the spill requests, loads not in
#   flight in the long-scoreboard stall, masked work in the useful share, and one program an SM in few eligible
#   warps at the same occupancy; each fix is kept because the duration fell.
# - Proton, Triton's profiler, times the same kernels as the program runs them (scopes with FLOPs, PC-sampled
#   stall reasons): cheap enough to leave on, where ncu's replay is for one kernel at a time.
#
# **Next:** exercise 13 (`exercises/13_profiling/13_profiling.ipynb`) computes `occupancy(launch, gpu)`, the
# four limits from a launch, checked against ncu's own on every kernel of this run, and
# `roofline_point(kernel, roofs)`, each kernel's intensity, rate, roof, bound and useful share.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
