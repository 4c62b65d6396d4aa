# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 06 — FlashAttention in CUDA C++ on tensor cores
#
# The same computation as steps 04 and 05, now one level down: for each row block $Q_i$ and key
# tile $K_j, V_j$ (FlashAttention-2, Dao 2023, Algorithm 1)
#
# $$S_{ij} = Q_i K_j^\top,\quad m_i^{new} = \max(m_i, \operatorname{rowmax} S_{ij}),\quad
#   P_{ij} = e^{S_{ij} - m_i^{new}},\quad l_i \leftarrow e^{m_i - m_i^{new}} l_i + \operatorname{rowsum} P_{ij},\quad
#   O_i \leftarrow e^{m_i - m_i^{new}} O_i + P_{ij} V_j$$
#
# and at the end $O_i / l_i$ and $\mathrm{lse}_i = m_i + \log l_i$ (with the scale folded into $S$).
#
# **What you write**: four device functions in **`student_kernel.cu`** (next to this notebook):
# `load_tile_async` (the cp.async pipeline, XOR-swizzled shared memory), `qk_tile` ($S = Q_i K_j^\top$
# with `ldmatrix` + `mma.sync.m16n8k16`), `online_softmax_update` (registers and quad shuffles) and
# `pv_tile` ($O_i \mathrel{+}= P V_j$, $P$ straight from registers). The kernel that calls them, the
# launcher and the torch binding are given (`fa_harness.cuh`, `fa_primitives.cuh`, `fa_binding.cpp`):
# do not edit them, and do not edit this notebook's cells.
#
# **The contract** is the course's: `q` `[B, Hq, Sq, D]`, `k`, `v` `[B, Hkv, Skv, D]`, GQA, any strides
# with `stride(-1) == 1`, bottom-right causal, empty rows give `o = 0` and `lse = -inf`, D in {64, 128},
# fp16 and bf16. `flash_attention_cuda(q, k, v, causal=False, scale=None)` returns `(o, lse)`.
#
# **What is graded** (13 points, on a GPU with compute capability 8.0+): the visible test on `small`;
# hidden tests on `medium`, `large`, `noncausal`, `asymmetric`, ragged lengths, empty rows, the other
# edge cases (decode, D = 64, MQA, large logits) and bf16; performance on `large` and on the long
# configuration against PyTorch SDPA's FLASH_ATTENTION backend (half the points at a `min` fraction
# of its speed, all at a `target`: the instructor's thresholds file sets both, the graded result
# states them). **Without a GPU** the cell "Compile check" still compiles your code with `nvcc` for
# sm_80 and reports errors, registers, spills, shared memory and the functions you have not written
# yet, and the cell "CPU check" runs each of your four device functions on one emulated warp
# (g++, no GPU) and names the likely cause of a wrong result; the graded cells need a GPU and, on a
# machine without one, say so and move on.
#
# Read `course/06_cuda_flash_attention.ipynb` first: it draws the fragment layouts you need.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import hashlib
import math
import tempfile
import warnings
from pathlib import Path

import torch

from facourse import check_entry_point, gpu_or_skip, has_gpu, require_gpu, validate_inputs
from facourse.cuda_build import load_cuda_extension, nvcc_compile_check
from facourse.cuda_host_check import check_device_functions, prebuild_host_check, report_unwritten

KERNEL_DIR = Path.cwd()                       # this notebook's folder
STUDENT_SOURCE = KERNEL_DIR / "student_kernel.cu"

# %% [markdown] nbgrader={"grade": false, "grade_id": "task", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task
#
# Open `student_kernel.cu` and write the four function bodies marked `YOUR CODE HERE`. The comments
# above each function give its exact specification. Hints, in the order you will need them:
#
# 1. `load_tile_async`: a row of D fp16 values is D/8 chunks of 16 bytes; thread `tid` copies chunks
#    `tid, tid + NTHREADS, ...` of the tile; `swizzle<D>(r, c)` gives the element offset in shared memory.
# 2. `qk_tile`: for each 16-column step `kk` of D and each pair of 8-key blocks, one `ldmatrix_x4` of K
#    gives the B fragments of two `mma_16816` calls. Which lanes address which 8x8 matrix? (the figure
#    `diagrams/ldmatrix_x4.png`). K is stored `[key][d]`, which is B "col" already: no `.trans`.
# 3. `online_softmax_update`: a row lives in the 4 lanes of a quad (`quad_max`, `quad_sum`); a row
#    whose keys were all masked so far has `m = -inf`: `exp2(-inf - (-inf))` is NaN. The scalar steps
#    of `fa_primitives.cuh` carry that guard (`fa::finite_max` for the exponents' offset,
#    `fa::rescale_factor` for alpha), as in every rung of the course's ladder: this exercise is about
#    the fragments, the quad reductions and the loop over them; read the two, and use them.
# 4. `pv_tile`: the C fragments of keys `16kk..16kk+7` and `16kk+8..16kk+15` are the A fragment of P
#    (`diagrams/mma_m16n8k16_fragments.png`); V is `[key][d]`, row-major B: `ldmatrix_x4_trans`.
#
# After editing the .cu file, restart the kernel before rerunning the tests (a built extension stays
# loaded in the Python process).

# %% nbgrader={"grade": false, "grade_id": "entry_point", "locked": true, "schema_version": 3, "solution": false, "task": false}
_extension = None
# One build folder per copy of this exercise (not inside it): two copies never share a build.
BUILD_DIR = Path(tempfile.gettempdir()) / f"fa06_{hashlib.sha1(str(KERNEL_DIR).encode()).hexdigest()[:12]}"


def build_extension():
    """Compile student_kernel.cu (+ the given harness and binding) for this GPU; cached on disk."""
    require_gpu(what="building and running your CUDA kernel")
    with warnings.catch_warnings(record=True) as caught:   # build warnings go to stdout, not stderr
        warnings.simplefilter("always")
        ext = load_cuda_extension("fa06_student", [STUDENT_SOURCE, KERNEL_DIR / "fa_binding.cpp"],
                                  include_dirs=[KERNEL_DIR], build_directory=str(BUILD_DIR))
    for w in caught:
        print(f"build warning: {w.message}")
    return ext


def flash_attention_cuda(q, k, v, causal=False, scale=None):
    """FlashAttention forward with your device functions. Returns (o, lse)."""
    global _extension
    validate_inputs(q, k, v, scale)
    if _extension is None:
        _extension = build_extension()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = _extension.forward(q, k, v, bool(causal), float(scale))
    return o, lse


# %% [markdown] nbgrader={"grade": false, "grade_id": "compile_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Compile check (runs anywhere `nvcc` is installed, GPU or not)
#
# `nvcc` compiles your file for sm_80 with `-Xptxas -v`. Read the table: a kernel over 255 registers
# or with spills (bytes of local memory per thread) will be slow; the solution uses no spills. A
# function whose body is still the stub (it carries the line `FA_TODO("...")`) is listed as not
# implemented: delete that line when you write the function.

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
prebuild_host_check(STUDENT_SOURCE)   # g++ builds the CPU check below while nvcc runs
compile_report = nvcc_compile_check(STUDENT_SOURCE, "sm_80", include_dirs=[KERNEL_DIR])
unwritten = report_unwritten(STUDENT_SOURCE)
if compile_report.ok and not compile_report.spills and not unwritten:
    print("Compiles without spills. The CPU check below tests each function; the graded tests run the kernel on a GPU.")

# %% [markdown] nbgrader={"grade": false, "grade_id": "cpu_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## CPU check (runs anywhere `g++` is installed, GPU or not)
#
# Your file is compiled with `g++` against a host stand-in of `fa_primitives.cuh`: one warp is 32
# threads that meet at every shuffle, and `cp_async_16`, `ldmatrix_x4` and `mma_16816` are emulated
# after the PTX ISA's fragment tables. Each function runs on one warp's data and is compared with a
# NumPy reference of the same fragments: `load_tile_async` on four tiles (strided rows, rows past
# `rows_valid`), read back through `swizzle<D>`; `qk_tile` and `pv_tile` on 16 rows x 64 keys, D = 64
# and 128; `online_softmax_update` on five calls that each isolate one step (the first tile, a growing
# max, a steady max, rows whose keys are all masked so far, a masked tile). A wrong result names its
# likely cause. It takes a few seconds (the build is cached until you edit the file). It cannot show
# the real instructions, the whole kernel or its speed: the output says what only a GPU checks.

# %% nbgrader={"grade": false, "grade_id": "cpu_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
cpu_report = check_device_functions(STUDENT_SOURCE)   # raises, naming the cause, when a function is wrong

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
if gpu_or_skip(what="this test (your kernel on the configuration `small`)"):
    check_entry_point(flash_attention_cuda, "small", expect_lse=True)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_other", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_other", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_large", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_large", flash_attention_cuda)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_long", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_long", flash_attention_cuda)
### END HIDDEN TESTS
