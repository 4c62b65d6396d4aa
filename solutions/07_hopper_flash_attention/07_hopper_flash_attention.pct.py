# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 07 — FlashAttention on Hopper: TMA, WGMMA, producer and consumer warpgroups
#
# The computation is the one of steps 04-06 (FlashAttention-2, Dao 2023, Algorithm 1): for a row
# block $Q_i$ and key blocks $K_j, V_j$,
#
# $$S_{ij} = Q_i K_j^\top,\quad m_i^{new} = \max(m_i, \operatorname{rowmax} S_{ij}),\quad
#   P_{ij} = e^{S_{ij} - m_i^{new}},\quad l_i \leftarrow e^{m_i - m_i^{new}} l_i + \operatorname{rowsum} P_{ij},\quad
#   O_i \leftarrow e^{m_i - m_i^{new}} O_i + P_{ij} V_j$$
#
# and at the end $O_i / l_i$ and $\mathrm{lse}_i = m_i + \log l_i$ (scale folded into $S$). What
# changes is who moves the data and who multiplies, as in FlashAttention-3 (Shah et al. 2024, §3.1
# and §3.2): one CTA of three warpgroups per 128 query rows. **Warpgroup 0 is the producer**: one of
# its threads issues TMA copies (`cp.async.bulk.tensor`) of $Q_i$ and of $K_j, V_j$ into a ring of
# shared-memory slots, each guarded by a *full* and an *empty* mbarrier. **Warpgroups 1 and 2 are
# consumers**, 64 rows each: $S = Q_i K_j^\top$ by WGMMA (`wgmma.mma_async`) from shared memory, the
# online softmax in registers, $O_i \mathrel{+}= P V_j$ by WGMMA with $P$ straight from registers.
#
# **What you write**: four device functions in **`student_kernel.cu`** (next to this notebook), in
# the order the harness calls them:
#
# | who | calls | what it does |
# |---|---|---|
# | warpgroup 0, thread 0 | `producer` (yours) | per tile: TMA of $Q_i$, then $K_j$, $V_j$ for $j$ = last .. 0 into the ring |
# | warpgroups 1, 2 | `consumer_mainloop` (yours) | per key block: wait *full*, `gemm_qk`, mask, softmax, `gemm_pv`, release *empty* |
# | | `gemm_qk` (yours) | $S = Q_i K_j^\top$: `D/16` WGMMAs, A and B from shared memory |
# | | `gemm_pv` (yours) | $O_i \mathrel{+}= P V_j$: `BLOCK_N/16` WGMMAs, A = $P$ from registers |
# | | epilogue (given) | $O_i / l_i$, $\mathrm{lse}_i$, rows without a key: 0 and $-\infty$ |
#
# The kernel around them (`hopper_harness.cuh`: barrier set-up, `setmaxnreg`, tile scheduler,
# epilogue, tensor maps, launch), the instructions as small functions (`hopper_primitives.cuh`), the
# shared layout and softmax helpers (`hopper_common.cuh`) and the torch binding (`fa_binding.cpp`,
# `fa_params.h`, step 06's) are given: do not edit them, and do not edit this notebook's cells.
#
# **The contract** is the course's: `q` `[B, Hq, Sq, D]`, `k`, `v` `[B, Hkv, Skv, D]`, GQA, any strides
# with `stride(-1) == 1`, bottom-right causal, empty rows give `o = 0` and `lse = -inf`, D in {64, 128},
# fp16 and bf16. `flash_attention_hopper(q, k, v, causal=False, scale=None)` returns `(o, lse)`.
#
# **What is graded** (15 points; the GPU tests need an H100 or H200, sm_90a): the visible test on
# `small` (1); hidden tests on `medium` (with a check that nothing is cached between calls),
# `large`, `noncausal`, `asymmetric`, ragged lengths, empty rows, the other edge cases (decode,
# D = 64, MQA, large logits) and all of them again in bf16 (8); a **structural check** (2): the
# machine code (SASS) of your kernel must contain `HGMMA` (WGMMA) and `UTMALDG` (TMA loads), so a
# port of step 06 (`mma.sync`, `cp.async`) does not pass it; performance on `large` and on the long
# configuration against PyTorch SDPA's CUDNN_ATTENTION backend, a FlashAttention-3-class kernel
# (FLASH_ATTENTION where cuDNN is absent): half the points at a `min` fraction of its speed, all at
# a `target` (2 + 2; the instructor's thresholds file sets both, the graded result states them).
# **Without a Hopper GPU** the cell "Compile check" still compiles your file for sm_90a, reports
# errors, registers and spills, lists the functions that are still the stub, and counts the
# instructions that the structural check looks for; the cell "CPU check" runs your four functions on
# an emulated Hopper CTA and names what is wrong; the GPU cells say why they are skipped and score 0
# there.
#
# Read `course/07_hopper_flash_attention.ipynb` first: it explains TMA and mbarrier phases, the WGMMA
# operand layouts and descriptors, and why the ring, ping-pong and the in-warpgroup overlap pay.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import hashlib
import math
import tempfile
import warnings
from pathlib import Path

import torch

from facourse import HardwareUnavailable, check_entry_point, require_sm90a, validate_inputs
from facourse.cuda_build import (SassCheckError, ToolUnavailable, check_sass, load_cuda_extension,
                                 nvcc_compile_check)
from facourse.cuda_host_check import check_device_functions, prebuild_host_check, report_unwritten

KERNEL_DIR = Path.cwd()                       # this notebook's folder
STUDENT_SOURCE = KERNEL_DIR / "student_kernel.cu"


def on_hopper(what: str) -> bool:
    """True on an H100/H200 (sm_90); otherwise one sentence saying why `what` is skipped here."""
    try:
        require_sm90a(what=what)
        return True
    except HardwareUnavailable as e:
        print(f"Skipped, 0 points on this machine: {e}")
        return False

# %% [markdown] nbgrader={"grade": false, "grade_id": "task", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task
#
# Open `student_kernel.cu` and write the four function bodies marked `YOUR CODE HERE` (delete the
# line `FA_TODO("...")` of each as you do); the comment above each gives its exact specification. A
# good order, with the compile check and the CPU check after each step (the SASS counts show
# `UTMALDG` once the producer is written, `HGMMA` once a GEMM is; the CPU check names what is wrong):
#
# 1. `producer`: per tile, `mbar_expect_tx` on `q_full` with the bytes of $Q_i$, then one
#    `tma_load_4d` per 64-column panel; per key block the same on `k_full[slot(it)]` and
#    `v_full[slot(it)]`, after waiting for the slot to be empty. The empty barriers start "released":
#    wait on parity `phase(it) ^ 1`. GQA: query head `h` reads KV head `h / (Hq / Hkv)`.
# 2. `gemm_qk`: between one `wgmma_fence()` and one `wgmma_commit()`, `D/16` calls of
#    `wgmma_ss_n128`, one per 16 columns of D. A 128-byte swizzled panel holds 64 columns, so step
#    `kk` starts in panel `kk / 4` at byte `32 * (kk % 4)`; `smem_desc(addr, 16, 1024)`.
# 3. `gemm_pv`: `BLOCK_N/16` calls of `wgmma_rs` with `p[kk]` as the A operand; V is MN-major here:
#    step `kk` starts 16 key rows (`16 * 128` bytes) further, and the leading offset is the distance
#    between the D/64 panels (`BLOCK_N * 128` bytes).
# 4. `consumer_mainloop`: first make it right, then fast. A plain loop (wait `k_full`, `gemm_qk`,
#    `wgmma_wait<0>`, release `k_empty`, mask, `online_softmax_update`, `rescale_o`, `convert_p`,
#    wait `v_full`, `gemm_pv`, `wgmma_wait<0>`, release `v_empty`) passes the correctness tests. The
#    fast version issues $S_j = Q_i K_j^\top$ and $O \mathrel{+}= P_{j+1} V_{j+1}$ back to back and
#    does the softmax of $S_j$ while the second product runs (`wgmma_wait<1>`); the stub's comment
#    says in which order.
#
# Rules that bite: issue every GEMM between `gemm_turn_begin(wg)` and `gemm_turn_end(wg)` (both
# consumer warpgroups must take the same number of turns, or they wait for each other forever);
# `pin_registers` the accumulators after a `wgmma_wait`; `it` must end advanced by `nb`, as the
# producer's. A lost arrival or a wrong parity makes `mbar_wait` trap after a few seconds: the test
# then fails with a CUDA launch error, and every later cell too (restart the kernel).
#
# After editing the .cu file, restart the kernel before rerunning the tests (a built extension stays
# loaded in the Python process).

# %% nbgrader={"grade": false, "grade_id": "entry_point", "locked": true, "schema_version": 3, "solution": false, "task": false}
_extension = None
_build_error = None
# One build folder per copy of this exercise (not inside it): two copies never share a build.
BUILD_DIR = Path(tempfile.gettempdir()) / f"fa07_{hashlib.sha1(str(KERNEL_DIR).encode()).hexdigest()[:12]}"


def build_extension():
    """Compile student_kernel.cu (+ the given harness and binding) for sm_90a; cached on disk."""
    require_sm90a(what="building and running your Hopper kernel")
    with warnings.catch_warnings(record=True) as caught:   # build warnings go to stdout, not stderr
        warnings.simplefilter("always")
        ext = load_cuda_extension("fa07_student", [STUDENT_SOURCE, KERNEL_DIR / "fa_binding.cpp"],
                                  arch="sm_90a", include_dirs=[KERNEL_DIR], build_directory=str(BUILD_DIR))
    for w in caught:
        print(f"build warning: {w.message}")
    return ext


def flash_attention_hopper(q, k, v, causal=False, scale=None):
    """FlashAttention forward with your producer and consumer. Returns (o, lse)."""
    global _extension, _build_error
    validate_inputs(q, k, v, scale)
    if _extension is None:
        if _build_error is not None:      # a failed build is not retried in every test
            raise RuntimeError(f"student_kernel.cu did not build (see the first failing cell):\n{_build_error}")
        try:
            _extension = build_extension()
        except Exception as e:
            _build_error = str(e)[-3000:]
            raise
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = _extension.forward(q, k, v, bool(causal), float(scale))
    return o, lse

# %% [markdown] nbgrader={"grade": false, "grade_id": "compile_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Compile check (runs anywhere `nvcc` is installed, GPU or not)
#
# `nvcc` compiles your file for sm_90a with `-Xptxas -v`. Read the table: the consumer warpgroups
# get 232 registers each at run time (`setmaxnreg`), but ptxas allocates for the whole kernel, 168
# per thread at 384 threads; any spill (bytes of local memory per thread) costs speed, and the
# solution has none. Then `cuobjdump` reads the machine code: `HGMMA` are your WGMMAs, `UTMALDG` your
# TMA loads, `SYNCS` the mbarrier operations; `HMMA`, `LDSM` and `LDGSTS` would be step 06's
# `mma.sync`, `ldmatrix` and `cp.async`. A function whose body is still the stub (it carries the line
# `FA_TODO("...")`) is listed as not implemented: delete that line when you write the function.

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
prebuild_host_check(STUDENT_SOURCE)   # g++ builds the CPU check below while nvcc runs
compile_report = nvcc_compile_check(STUDENT_SOURCE, "sm_90a", include_dirs=[KERNEL_DIR])
unwritten = report_unwritten(STUDENT_SOURCE)
if compile_report.ok:
    try:
        check_sass(STUDENT_SOURCE, include_dirs=[KERNEL_DIR])
        print("The structural check will pass: your kernel uses WGMMA and TMA.")
    except SassCheckError as e:
        print(f"The structural check would fail:\n{e}")
    except ToolUnavailable as e:
        print(f"No SASS report here: {e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "cpu_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## CPU check (runs anywhere `g++` is installed, GPU or not)
#
# Your file is compiled with `g++` against a host stand-in of `hopper_primitives.cuh`, and one CTA of
# 384 threads runs the given kernel of `hopper_harness.cuh` on an emulated Hopper SM: an mbarrier is
# the PTX ISA's phase state (arrivals, transaction bytes, parity), TMA copies a box into shared memory
# as `SWIZZLE_128B` stores it, WGMMA reads its operands through your descriptors and computes each
# product at the `wgmma_wait` that ends it. Each side of the K/V ring is checked against a correct one:
#
# - `producer` with consumers that check what landed in every slot: tiles, key blocks right to left,
#   GQA, coordinates, slots, bytes announced, the waits for empty slots and their parities;
# - `gemm_qk` and `gemm_pv` on one warpgroup: $S = Q_i K_j^\top$ and $O \mathrel{+}= P V_j$ against
#   NumPy, and your descriptors against the layout;
# - `consumer_mainloop` with a correct producer on three problems (fp16 and bf16, D = 64 and 128,
#   causal, rows with no key, five key blocks): $O$ and lse against NumPy, and the ring protocol as it
#   runs (a GEMM reads only a slot it waited for, a slot is released after its `wgmma_wait`, the
#   accumulators and $P$ stay untouched while a product is in flight, the GEMM turns match).
#
# A wrong result names its likely cause, a deadlock what each thread waits for. It takes several
# seconds (the build is cached until you edit the file). It cannot show the real instructions, their
# timing and overlap, registers, many CTAs at once or speed: the output says what only an H100 checks.

# %% nbgrader={"grade": false, "grade_id": "cpu_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
cpu_report = check_device_functions(STUDENT_SOURCE)   # raises, naming the cause, when a function is wrong

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
if on_hopper("the correctness tests of step 07"):
    check_entry_point(flash_attention_hopper, "small", expect_lse=True)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_other", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_other", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_structure", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_structure", None)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_large", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_large", flash_attention_hopper)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_long", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_long", flash_attention_hopper)
### END HIDDEN TESTS
