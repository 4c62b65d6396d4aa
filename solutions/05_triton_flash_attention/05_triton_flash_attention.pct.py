# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Without a GPU, Triton's interpreter runs the kernel on the CPU (in NumPy). It must be switched
# on BEFORE triton is imported, so this cell comes first.
import os

import torch

from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()

import math

import triton
import triton.language as tl

from facourse import check_entry_point, check_visible
from facourse.triton_setup import validate_triton_inputs

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 05 — FlashAttention-2 forward in Triton
#
# You will write the kernel of `course/05_triton_flash_attention.ipynb`: one Triton program computes
# one query tile $Q_i$ (`BLOCK_M` rows of one query head) and walks over the key/value tiles
# $K_j, V_j$ (`BLOCK_N` rows each) with the online softmax (FlashAttention-2, Dao 2023, Algorithm 1):
#
# $$S_{ij} = \text{scale}\cdot Q_i K_j^\top,\quad m_i^{new} = \max(m_i, \operatorname{rowmax} S_{ij}),\quad
# P_{ij} = e^{S_{ij} - m_i^{new}},\quad l_i \leftarrow e^{m_i - m_i^{new}} l_i + \operatorname{rowsum} P_{ij},\quad
# O_i \leftarrow e^{m_i - m_i^{new}} O_i + P_{ij} V_j$$
#
# and at the end $O_i / l_i$ and $\text{lse}_i = m_i + \log l_i$.
#
# **The contract** (every step of the course): `q` is `[B, Hq, Sq, D]`, `k`, `v` are `[B, Hkv, Skv, D]`,
# any strides with `stride(-1) == 1`; query head `h` reads KV head `h // (Hq // Hkv)`; `causal=True` is
# bottom-right aligned (key `j` visible to query `i` iff `j <= i + (Skv - Sq)`); a row that sees no key
# gives `o = 0` and `lse = -inf`, never NaN; `o` has `q`'s dtype, `lse` is float32 `[B, Hq, Sq]`
# in natural log. D is 64 or 128.
#
# **What is graded** (14 points): correctness (10 points) on `small` (visible), the hidden `medium`,
# `large`, `noncausal`, `asymmetric`, and edge cases (ragged lengths, decode `Sq = 1`, empty rows
# `Sq > Skv`, D = 64 and MQA, logits large enough to overflow); speed (4 points, on a GPU only) on
# `large` and on `long` (B=2, H=16, S=8192, non-causal) against PyTorch SDPA's FlashAttention-2
# backend on the same GPU: half the points at a `min` fraction of its speed, all at a `target` (the
# instructor's thresholds file sets both; your graded result states them). Without a GPU the kernel
# runs in Triton's interpreter on the CPU sizes of the configurations (in float32), and the speed
# cells score 0.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: the kernel
#
# `online_softmax_update` is one step of the online softmax, in base 2: `qk_scale = scale * log2(e)`,
# so that `exp(scale * s - m) = exp2(s * qk_scale - m')` with `m'` kept in log2 units.
# `attn_fwd` is the kernel; one program per (query tile, batch x head). Hints:
# 1. Program ids: axis 0 is the query tile, axis 1 is `b * Hq + h`. When `CAUSAL`, launch the longest
#    tiles first: `pid_m = num_m - 1 - tl.program_id(0)`.
# 2. Offsets: `base + row * stride_s + tl.arange(0, D)`; multiply batch and head indices by their
#    strides in int64 (`b.to(tl.int64) * sqb`) so that large tensors do not overflow 32 bits.
# 3. Two stages of key tiles: `[0, end_free)` where every row of the tile sees every key (no mask,
#    no bounds check: stop at the last full tile), then `[end_free, hi)` with the mask
#    `cols < Skv` and, when causal, `cols <= rows + (Skv - Sq)`. Tiles past `hi` are never visited.
# 4. `tl.dot(q, kT)` with `kT` loaded as `[D, BLOCK_N]`; `acc = tl.dot(p.to(v.dtype), v, acc)`.
# 5. A row that has seen no key has `m = -inf`: `exp2(-inf - (-inf))` is NaN. Guard it.

# %% nbgrader={"grade": false, "grade_id": "kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def online_softmax_update(m_i, l_i, s, qk_scale):
    """One online-softmax step. s = Q_i K_j^T (unscaled, -inf where masked); m_i in log2 units.
    Returns (m_new, l_new, alpha, p): alpha rescales the accumulator, p = exp2(s*qk_scale - m_new)."""
    # YOUR CODE HERE (about 6 lines)
    ### BEGIN SOLUTION
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet
    alpha = tl.math.exp2(m_i - m_use)                         # alpha = exp(m_old - m_new)
    p = tl.math.exp2(s * qk_scale - m_use[:, None])           # P_ij = exp(S_ij - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)                        # l = alpha * l + rowsum(P_ij)
    return m_new, l_new, alpha, p
    ### END SOLUTION


@triton.jit
def attn_fwd(Q, K, V, O, LSE,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             Hq, Sq, Skv, qk_scale,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile of one (batch, head). Strides: s?b (batch), s?h (head), s?s (sequence)."""
    # YOUR CODE HERE (about 50 lines)
    ### BEGIN SOLUTION
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m                             # longest tiles first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    h_kv = h // GROUP                                         # GQA
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    k_base = K + b.to(tl.int64) * skb + h_kv.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + h_kv.to(tl.int64) * svh
    q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < Sq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    off = Skv - Sq                                            # bottom-right alignment
    full_n = (Skv // BLOCK_N) * BLOCK_N
    if CAUSAL:
        end_free = tl.minimum(tl.maximum(start_m + off + 1, 0) // BLOCK_N * BLOCK_N, full_n)
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), Skv)
    else:
        end_free = full_n
        hi = Skv
    # stage 1: off-band tiles, every key visible: no mask
    for start_n in tl.range(0, end_free, BLOCK_N):
        cols = start_n + offs_n
        kT = tl.load(k_base + cols[None, :] * sks + offs_d[:, None])        # K_j^T
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :])         # V_j
        s = tl.dot(q, kT)                                                    # S_ij = Q_i K_j^T
        m_i, l_i, alpha, p = online_softmax_update(m_i, l_i, s, qk_scale)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])                # O_i = alpha O_i + P V_j
    # stage 2: on-band and ragged tiles, masked
    for start_n in tl.range(end_free, hi, BLOCK_N):
        cols = start_n + offs_n
        kT = tl.load(k_base + cols[None, :] * sks + offs_d[:, None], mask=cols[None, :] < Skv, other=0.0)
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :], mask=cols[:, None] < Skv, other=0.0)
        s = tl.dot(q, kT)
        keep = cols[None, :] < Skv
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + off)         # j <= i + (Skv - Sq)
        s = tl.where(keep, s, float("-inf"))
        m_i, l_i, alpha, p = online_softmax_update(m_i, l_i, s, qk_scale)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                   # rows with no visible key: o = 0
    o = acc / l_safe[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    tl.store(o_base + offs_m[:, None] * sos + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=offs_m[:, None] < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_launch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: the launch grid
#
# The host wrapper allocates the outputs and launches `attn_fwd`. The tile sizes are fixed here
# (128 x 64, 8 warps, 3 pipeline stages on a GPU, a good start on sm_80 and sm_90; bigger tiles in
# the interpreter, where fewer and larger NumPy operations run faster). Write the grid: how many
# programs along each axis?

# %% nbgrader={"grade": false, "grade_id": "wrapper", "locked": false, "schema_version": 3, "solution": true, "task": false}
LOG2E = 1.4426950408889634


def flash_attention_triton(q, k, v, causal=False, scale=None):
    """FlashAttention-2 forward. Returns (o, lse): o like q, lse float32 [B, Hq, Sq]."""
    validate_triton_inputs(q, k, v, scale)    # the contract; D = 64 or 128; no bf16 in the interpreter
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    if INTERPRET:
        BLOCK_M, BLOCK_N, launch = 128, 128, {}
    else:
        BLOCK_M, BLOCK_N, launch = 128, 64, {"num_warps": 8, "num_stages": 3}
    # YOUR CODE HERE (1 line): grid = (..., ...)
    ### BEGIN SOLUTION
    grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    ### END SOLUTION
    attn_fwd[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   Hq, Sq, Skv, scale * LOG2E, GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal),
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return o, lse

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_entry_point` draws inputs (non-contiguous views of `[B, S, H, D]` storage), calls your
# function, and compares `o` and `lse` with a float64 reference; a failure names the rows and heads
# that are wrong and the likely cause. In the interpreter `small` takes a few seconds.

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_entry_point(flash_attention_triton, "small", expect_lse=True)
check_entry_point(flash_attention_triton, "small", expect_lse=True, scale=0.05)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "visible_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The visible cases: each classic bug of the kernel fails one of them, in the interpreter's tiles
# (128 x 128) as in a GPU's: several key tiles (the alpha rescale), Sq != Skv (the causal offset),
# ragged lengths (the grid and the last partial tile), rows that see no key, decode, D = 64.
# It stops at the first failure with the check's message. In the interpreter it takes about 20 s.
check_visible(flash_attention_triton, "05")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same names yourself, for instance
# `check_entry_point(flash_attention_triton, "empty_rows", expect_lse=True)`; the edge cases are
# `ragged`, `ragged_noncausal`, `decode`, `empty_rows`, `d64`, `mqa`, `overflow`.

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "medium"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "noncausal"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "asymmetric"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: ragged lengths
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_decode", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: one query row against a long KV cache
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_decode", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: Sq > Skv, causal: rows that see no key
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_d64_mqa", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: D = 64, and one KV head for every query head (MQA)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_d64_mqa", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_overflow", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: logits in the hundreds
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_overflow", flash_attention_triton)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "perf_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Speed (graded on a GPU)
#
# The two cells below time your kernel against SDPA's FlashAttention-2 backend on the grading GPU
# (same process, same inputs, interleaved rounds, L2 flushed, median of 25; GPU time: Python's
# launch cost stays out of both sides): on `large` and on `long`. Half the points at the `min`
# fraction of its speed, all at the `target` (the graded result states both). Try it yourself on a GPU:
# `facourse.bench_attention(flash_attention_triton, "large").summary()`.

# %% nbgrader={"grade": true, "grade_id": "perf_large", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: speed on "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_large", flash_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_long", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: speed on "long"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_long", flash_attention_triton)
### END HIDDEN TESTS
