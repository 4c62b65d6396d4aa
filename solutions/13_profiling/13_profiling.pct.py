# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 13 — reading Nsight Compute: occupancy limits and the measured roofline
#
# Nsight Compute (`ncu`) replays one kernel many times and reads the GPU's hardware counters. Its report is a
# few hundred numbers; two questions come first, and this exercise answers both from the numbers, as functions,
# checked against what ncu itself reported for the course's own kernels on an H200.
#
# **1. How many blocks fit on one SM?** A block needs registers, shared memory and warp slots, and an SM has a
# fixed amount of each. ncu's Occupancy section reports the blocks each resource allows
# (`launch__occupancy_limit_registers`, `_shared_mem`, `_warps`, `_blocks`); the smallest is the occupancy.
# With $w = \lceil \text{threads} / 32 \rceil$ warps a block, $r$ registers a thread and $s$ bytes of shared
# memory a block:
#
# $$\text{registers: } \left\lfloor \frac{4 \lfloor 16384 / \lceil 32 r \rceil_{256} \rfloor}{w} \right\rfloor,
# \qquad \text{shared memory: } \left\lfloor \frac{\text{carve-out}}{\lceil s + 1024 \rceil_{128}} \right\rfloor,
# \qquad \text{warps: } \left\lfloor \frac{64}{w} \right\rfloor, \qquad \text{blocks: } 32,$$
#
# where $\lceil x \rceil_u$ rounds up to a multiple of $u$. Each term is a fact of the hardware: a warp's
# registers are allocated 256 at a time (8 a thread), from one of the four schedulers' register files of 16384;
# the driver keeps 1 KB of shared memory for every block; shared memory is allocated in 128-byte steps, out of
# the carve-out the SM was configured with for this launch (the rest of its 256 KB is L1 cache).
#
# **2. What bounds the kernel?** The roofline (Williams, Waterman and Patterson, 2009) puts a kernel at its
# arithmetic intensity $I$ = FLOPs per byte of DRAM traffic; it cannot run faster than
# $\min(\text{peak FLOP/s},\ I \times \text{bandwidth})$. Left of the ridge (peak / bandwidth) the memory roof
# is the lower one. A *measured* roofline takes both roofs from kernels that reach them (a copy and a GEMM,
# profiled in the same run) and both coordinates from counters: ncu gives the duration
# (`gpu__time_duration.sum`, nanoseconds) and the DRAM traffic as a rate (`dram__bytes.sum.per_second`), and
# the tensor cores' executed FLOPs (`sm__ops_path_tensor_src_fp16.sum`), which count masked and padded tiles too:
# the course's count of the useful FLOPs ($4 B H_q D \cdot$ visible pairs) divided by it is the share of the
# tensor cores' work that was useful.
#
# **What you will learn**: where occupancy's limits come from and which one binds your kernels; what ncu's
# counters mean and in which units; how to place a kernel on a measured roofline and read what bounds it.
#
# **Sources**: NVIDIA's Nsight Compute documentation (the Occupancy and Roofline sections, the metrics
# reference) and its CUDA Occupancy Calculator; Williams, Waterman and Patterson, "Roofline: an insightful
# visual performance model" (CACM, 2009); lecture 13 for the counters of every rung.
#
# **The contract**:
# - `occupancy(launch, gpu) -> (registers, shared_mem, warps, blocks)`: `launch` a dict of ncu's launch metrics
#   (`launch__registers_per_thread`, `launch__block_size`, `launch__shared_mem_per_block_static`,
#   `launch__shared_mem_per_block_dynamic` and `launch__shared_mem_config_size`, in bytes), `gpu` a dict of the
#   SM's limits (the H200's is `OCCUPANCY_GPU`, printed below; some graded launches run on other SMs, whose dict has
#   the same keys and other values). Returns four whole numbers: the blocks per SM each resource allows, as ncu's
#   `launch__occupancy_limit_*` report them.
# - `roofline_point(kernel, roofs) -> (intensity, tflops, roof_tflops, bound, useful)`: `kernel` a dict with
#   `gpu__time_duration.sum` (ns), `dram__bytes.sum.per_second` (bytes/s), `sm__ops_path_tensor_src_fp16.sum`
#   (executed tensor-core FLOPs, 0 when none) and `work` (useful FLOPs); `roofs` a dict with `tflops` and `gbps`.
#   Returns the intensity (useful FLOPs per DRAM byte; `math.inf` with no DRAM traffic), the attained TFLOP/s,
#   the roof above the kernel (TFLOP/s), `"memory"` or `"compute"` (which roof that is: memory left of the ridge,
#   compute right of it, either at the ridge itself), and `work / executed` (`None` when the tensor cores did
#   nothing). Floats within $10^{-6}$.
#   Both functions leave their dicts untouched.
#
# **What is graded** (6 points by the autograder, 2 by hand): both functions on every kernel of the committed
# Nsight Compute run (your limits against ncu's own), on launches and kernels drawn from a seed you do not see
# (some launches on SMs other than the H200), and on the edges (blocks that are no multiple of 32, 255 registers,
# shared memory one byte over a step, no DRAM traffic, no tensor-core work), also at sizes drawn from the seed.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

from facourse import OCCUPANCY_CASES, OCCUPANCY_GPU, ROOFLINE_CASES, check_occupancy_fn, check_roofline_fn
from facourse.profiling import load_run, records_table

RUN = load_run()           # the committed Nsight Compute run (course/results/measured.json)
print(f"{RUN['env']['gpu']}, {RUN['env']['date']}, {RUN['profile']['tool']}; roofs measured under ncu: "
      f"GEMM {RUN['roofs']['tflops']} TFLOP/s, copy {RUN['roofs']['gbps']} GB/s")
print("OCCUPANCY_GPU =", OCCUPANCY_GPU)

# %% [markdown] nbgrader={"grade": false, "grade_id": "records_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The course's kernels as ncu saw them (lecture 13 reads the rest of their counters): each row one kernel of a
# rung on its configuration, its launch, and the four limits ncu reported.

# %% nbgrader={"grade": false, "grade_id": "records", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(records_table(RUN))

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_occupancy", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 1: `occupancy`
#
# Hints:
# 1. Warps a block: round up (`-(-threads // 32)`); a block of 33 threads takes two warps' slots.
# 2. Registers: a warp's are `32 * r` rounded up to `gpu["register_allocation_unit"]`; each scheduler's file holds
#    `gpu["max_registers_per_multiprocessor"] // gpu["num_schedulers_per_multiprocessor"]` registers, so
#    `floor(that / per warp)` warps, times the schedulers; then divide by the block's warps.
# 3. Shared memory: static + dynamic + `gpu["reserved_shared_memory_per_block"]`, rounded up to
#    `gpu["shared_memory_allocation_unit"]`, into the launch's carve-out `launch__shared_mem_config_size`.

# %% nbgrader={"grade": false, "grade_id": "occupancy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def occupancy(launch, gpu):
    """Blocks per SM that registers, shared memory, warp slots and block slots each allow (ncu's four limits)."""
    # YOUR CODE HERE (about 11 lines)
    ### BEGIN SOLUTION
    warps = -(-launch["launch__block_size"] // gpu["warp_size"])               # a partial warp is a whole one
    unit = gpu["register_allocation_unit"]
    per_warp = -(-launch["launch__registers_per_thread"] * gpu["warp_size"] // unit) * unit
    parts = gpu["num_schedulers_per_multiprocessor"]
    by_registers = parts * (gpu["max_registers_per_multiprocessor"] // parts // per_warp) // warps
    step = gpu["shared_memory_allocation_unit"]
    smem = (launch["launch__shared_mem_per_block_static"] + launch["launch__shared_mem_per_block_dynamic"]
            + gpu["reserved_shared_memory_per_block"])
    by_smem = launch["launch__shared_mem_config_size"] // (-(-smem // step) * step)
    return (by_registers, by_smem, gpu["max_warps_per_multiprocessor"] // warps,
            gpu["max_blocks_per_multiprocessor"])
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_occupancy_records", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_occupancy_fn(occupancy, "records")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_occupancy_records", occupancy)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_roofline", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Task 2: `roofline_point`
#
# Hints:
# 1. Seconds = `gpu__time_duration.sum * 1e-9`; bytes = the DRAM rate times the seconds.
# 2. The memory roof at intensity $I$ is $I \times$ `gbps` $\times 10^9$ FLOP/s; the roof is the lower of it and
#    `tflops` $\times 10^{12}$ (return it in TFLOP/s). With no DRAM traffic, $I = \infty$ and the compute roof binds.
# 3. The useful share: `work / sm__ops_path_tensor_src_fp16.sum`, or `None` when that counter is 0.

# %% nbgrader={"grade": false, "grade_id": "roofline_point", "locked": false, "schema_version": 3, "solution": true, "task": false}
def roofline_point(kernel, roofs):
    """A kernel on the measured roofline: (intensity, attained TFLOP/s, roof TFLOP/s, bound, useful share)."""
    # YOUR CODE HERE (about 8 lines)
    ### BEGIN SOLUTION
    seconds = kernel["gpu__time_duration.sum"] * 1e-9
    moved = kernel["dram__bytes.sum.per_second"] * seconds                     # a rate times the duration
    intensity = kernel["work"] / moved if moved else math.inf
    memory_roof = intensity * roofs["gbps"] * 1e9 / 1e12
    executed = kernel["sm__ops_path_tensor_src_fp16.sum"]
    return (intensity, kernel["work"] / seconds / 1e12, min(roofs["tflops"], memory_roof),
            "memory" if memory_roof < roofs["tflops"] else "compute",
            kernel["work"] / executed if executed else None)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_roofline_records", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_roofline_fn(roofline_point, "records")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_roofline_records", roofline_point)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded on inputs you do not see. Try the cases yourself first, e.g.
# `check_occupancy_fn(occupancy, "random")` or `check_roofline_fn(roofline_point, "edges")`:

# %% nbgrader={"grade": false, "grade_id": "cases", "locked": true, "schema_version": 3, "solution": false, "task": false}
for name, what in OCCUPANCY_CASES.items():
    print(f"occupancy {name:8s} {what}")
for name, what in ROOFLINE_CASES.items():
    print(f"roofline  {name:8s} {what}")

# %% nbgrader={"grade": true, "grade_id": "test_occupancy_random", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: launches drawn from the seed, some whose shared memory fits only before the 128-byte rounding, some
# on other SMs (other warps, blocks and shared-memory values in gpu)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_occupancy_random", occupancy)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_occupancy_edges", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: 255 registers, blocks of 1, 33 and 1024 threads, shared memory filling the carve-out exactly, and
# more of each at sizes drawn from the seed
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_occupancy_edges", occupancy)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_roofline_random", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: kernels on both sides of the ridge, on random roofs
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_roofline_random", roofline_point)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_roofline_edges", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: no tensor-core work, no DRAM traffic, a kernel past the ridge and one at it, on roofs from the seed
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_roofline_edges", roofline_point)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "question_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Written answer (2 points, graded by your instructor)
#
# Use the table above and your two functions on the committed kernels.
# (a) Step 05's autotuned rung (`05_v4`) fits one block on an SM, by registers and by shared memory, where `05_v3`
# fits two; yet v4 is the faster. Why is a higher occupancy not the goal for an attention forward, and what
# does the kernel do instead to keep the tensor cores busy?
# (b) `05_v2`'s useful share is about 0.5 and `05_v3`'s about 0.97 on the same causal configuration: what did v3
# stop computing? Why is the decode kernels' share (0.25) no loss for them, although it looks worse?

# %% [markdown] nbgrader={"grade": true, "grade_id": "written_profiling", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# (a) Occupancy hides latency by switching between warps; an attention forward hides it inside one block
# instead: large tiles (more independent MMAs a warp, instruction-level parallelism), K/V loads issued stages
# ahead (cp.async or TMA into a multi-stage ring), and registers spent on a big accumulator. Beyond the few warps
# that keep the tensor pipe fed, more blocks only split the same shared memory and registers into smaller
# tiles, which raises the bytes moved per FLOP. v4 takes bigger tiles and more stages at one block per SM.
# (b) v2 runs every key tile of a row and masks the upper triangle (half the causal work is thrown away);
# v3 splits the loop and skips the tiles above the diagonal, masking only the tiles the diagonal crosses.
# Decode is memory-bound (left of the ridge): its time is the time to read K and V, and the tensor cores'
# padded rows (a few query heads in an MMA tile of 16 rows) cost issue slots that are idle anyway.
#
# === BEGIN MARK SCHEME ===
# 2 points in all:
# - 1.0: (a) latency hidden by ILP / asynchronous multi-stage loads within a block, bigger tiles raise
#   intensity; occupancy is a means, not the goal. 0.5 for "fewer blocks are fine" without the mechanism.
# - 1.0: (b) v3 skips the fully masked tiles above the diagonal (0.5); decode is bound by memory, so the
#   wasted tensor FLOPs do not cost time (0.5).
# === END MARK SCHEME ===
# ### END SOLUTION
