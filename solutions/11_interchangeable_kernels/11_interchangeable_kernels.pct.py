# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import importlib.util
import inspect
import math
import os
from pathlib import Path

import torch

from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()    # before FlashInfer-Bench imports Triton: without a GPU, your exercise 05 kernel
                           # (registered near the end) runs in Triton's interpreter
from flashinfer_bench import (AxisConst, AxisVar, BuildSpec, Definition, Solution, SourceFile, TensorSpec,
                              apply, enable_apply)
from flashinfer_bench.compile import BuilderRegistry

from facourse import interchange as fx
from facourse import HardwareUnavailable, check_all, require_sm90a
from facourse.tilelang_kernels import Tiles, check_tilelang_cpu, hopper_source, run_attention

LN2 = math.log(2.0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 11 — one operator, interchangeable kernels
#
# By now the course has several kernels for one operator: your Triton kernel (step 05), your CUDA kernel
# (step 06), a Hopper kernel (step 07), a TileLang one (`course/11_interchangeable_kernels.ipynb`). A
# serving system must pick one for every call, and must never pick one that is wrong on that call's
# shape. [FlashInfer-Bench](https://github.com/flashinfer-ai/flashinfer-bench) (imported as
# `flashinfer_bench`) gives the pieces, and you will put them together:
#
# 1. a **`Definition`**: the operator, once (its axes, its tensors, a PyTorch reference);
# 2. **`Trace`s**: every `Solution` run on every `Workload` (one concrete shape) and checked, with
#    the course's one correctness rule (and timed, on a GPU);
# 3. a **deployment**: `enable_apply` reads the traces, and `apply()` sends each call to the fastest
#    solution that *passed* on that shape, or to your fallback;
# 4. one more solution of your own: **FlashAttention-2 in TileLang**, the third language of the step.
#
# **The operator** (the spec you will write down in part 1): `mini_flash_attention_prefill`, op_type
# `gqa_ragged`, `run(q, k, v, causal) -> out`, with `q [batch, seq_q, num_heads, head_dim]`,
# `k, v [batch, seq_kv, num_kv_heads, head_dim]`, all float16, `causal` a scalar bool, `out` like `q`.
# `batch`, `seq_q` and `seq_kv` change from call to call; `num_heads = 32`, `num_kv_heads = 8` and
# `head_dim = 128` are fixed. The layout `[batch, seq, heads, dim]` is the course's `[B, H, S, D]`
# transposed (a view: `fx.to_course(q, k, v)`, `fx.from_course(o)`), and the meaning is the course's:
# query head `h` reads KV head `h // 4`, causal is aligned bottom-right (key `j` is visible to query
# `i` iff `j <= i + seq_kv - seq_q`), a row that sees no key is 0.
#
# **What is graded** (50 points). On a CPU (40): the definition's fields (5) and its reference (5); the
# traces (10); the deployment: its routing (5) and its fallback (5); your TileLang program on the
# course's CPU stand-in of TileLang, causal cases (5) and the others (5). On an H100 or H200 (10): the
# TileLang kernel on the five configurations and the edge cases (5), and its speed against PyTorch
# SDPA's FlashAttention-2 on `large` (3) and `long` (2): half the points at 0.4 of its speed, all at
# 0.6 (`autograder/thresholds.toml`). The hidden tests run the same checks as the visible cells, with
# inputs, solution names and tags drawn from seeds you do not see.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_definition", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 1: the definition
#
# Write `make_definition()`, returning a `flashinfer_bench.Definition` with
#
# * `name`, `op_type` as above;
# * `axes`: `AxisVar()` for the three that vary, `AxisConst(value=...)` for the three that are fixed
#   (a const axis is a promise every solution may rely on: a kernel compiled for 128-wide heads);
# * `inputs` `q, k, v` as `TensorSpec(shape=[axis names...], dtype="float16")`, in the calling order,
#   and `causal` as a scalar: `TensorSpec(shape=None, dtype="bool")`; `outputs` `out`;
# * `reference`: Python source text defining `run(q, k, v, causal)`, attention in PyTorch in the
#   definition's layout (compute in float32, return float16). Every solution is checked against what
#   this function means, so it must be right on every shape: GQA, and causal bottom-right on
#   `seq_q != seq_kv` (PyTorch's `is_causal=True` is top-left, the wrong one here).
#
# `fx.check_definition(d)` compares the fields with the spec and says why a difference matters;
# `fx.check_definition_reference(run)` runs a reference on six small shapes with the course's rule.

# %% nbgrader={"grade": false, "grade_id": "definition", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_definition() -> Definition:
    """The operator, as a flashinfer_bench Definition (axes, inputs, outputs, a PyTorch reference)."""
    # YOUR CODE HERE (about 35 lines)
    ### BEGIN SOLUTION
    reference = '''
import math
import torch


def run(q, k, v, causal):
    """Attention in the definition's layout [batch, seq, heads, dim]; float32 inside, q's dtype out."""
    seq_q, heads, dim = q.shape[1], q.shape[2], q.shape[3]
    seq_kv, kv_heads = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2).float()                                          # [batch, heads, seq_q, dim]
    kh = k.transpose(1, 2).float().repeat_interleave(heads // kv_heads, dim=1)
    vh = v.transpose(1, 2).float().repeat_interleave(heads // kv_heads, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(dim)                          # S = Q K^T / sqrt(d)
    if causal:                                                              # bottom-right aligned
        i = torch.arange(seq_q, device=q.device)[:, None]
        j = torch.arange(seq_kv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (seq_kv - seq_q), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                            # a row with no key: 0
    return (p @ vh).transpose(1, 2).to(q.dtype)
'''
    fp16 = "float16"
    return Definition(
        name="mini_flash_attention_prefill",
        op_type="gqa_ragged",
        axes={"batch": AxisVar(), "seq_q": AxisVar(), "seq_kv": AxisVar(),
              "num_heads": AxisConst(value=32), "num_kv_heads": AxisConst(value=8), "head_dim": AxisConst(value=128)},
        inputs={"q": TensorSpec(shape=["batch", "seq_q", "num_heads", "head_dim"], dtype=fp16),
                "k": TensorSpec(shape=["batch", "seq_kv", "num_kv_heads", "head_dim"], dtype=fp16),
                "v": TensorSpec(shape=["batch", "seq_kv", "num_kv_heads", "head_dim"], dtype=fp16),
                "causal": TensorSpec(shape=None, dtype="bool")},
        outputs={"out": TensorSpec(shape=["batch", "seq_q", "num_heads", "head_dim"], dtype=fp16)},
        reference=reference,
        tags=["stage:prefill", "attention:flash"],
    )
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_definition", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_definition(make_definition())
print("the definition's fields match the spec")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_definition", make_definition)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_definition_reference", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_definition_reference(fx.definition_reference_run(make_definition()))
print("the definition's reference passes the course's check on the CPU shapes")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_definition_reference", make_definition)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_traces", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 2: traces
#
# A `Solution` is a kernel packaged for a definition: its language, the hardware it targets, its source
# files and an entry point `"file.py::function"`. `BuilderRegistry.get_instance().build(definition,
# solution)` turns it into a callable in the definition's convention (it imports a Python or Triton
# solution's files; a CUDA or TileLang solution needs their toolchain, and its build raises where they
# are missing). For example, a solution that wraps a course-contract kernel:

# %% nbgrader={"grade": false, "grade_id": "solution_example", "locked": true, "schema_version": 3, "solution": false, "task": false}
EXAMPLE_SOURCE = '''


def run(q, k, v, causal):
    o, _ = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)
    return o.transpose(1, 2).to(q.dtype)
'''
example = Solution(name="torch_reference", definition="mini_flash_attention_prefill", author="you",
                   spec=BuildSpec(language="python", target_hardware=["cpu", "cuda"], entry_point="main.py::run",
                                  destination_passing_style=False),
                   sources=[SourceFile(path="main.py", content=EXAMPLE_SOURCE)])
print([w.axes for w in fx.workloads("cpu")])

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_traces_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Write `trace_solutions(definition, solutions, workloads)`: every solution on every workload, one
# `Trace` each, in a list. Build each solution once; `fx.trace(definition, solution, run, workload)`
# draws the workload's inputs, calls `run`, checks the output with the course's rule (and times it
# against SDPA on a GPU) and returns the `Trace`: PASSED, or INCORRECT_NUMERICAL (the check's message
# in `evaluation.log`), INCORRECT_SHAPE, INCORRECT_DTYPE, RUNTIME_ERROR. A solution whose build raises
# is traced too: pass the exception in place of `run`, and the trace says COMPILE_ERROR. One broken
# solution must not stop the others from being traced (about 8 lines).
#
# The check hands your function four candidates with meaningless names: one correct, one with top-left
# causal, one that raises, one that does not build, on three small shapes.

# %% nbgrader={"grade": false, "grade_id": "trace_solutions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def trace_solutions(definition, solutions, workloads) -> list:
    """One flashinfer_bench Trace per (solution, workload): built, run, checked (and timed on a GPU)."""
    # YOUR CODE HERE (about 8 lines)
    ### BEGIN SOLUTION
    registry = BuilderRegistry.get_instance()
    traces = []
    for solution in solutions:
        try:
            run = registry.build(definition, solution)
        except Exception as err:        # no toolchain, a syntax error: COMPILE_ERROR on every workload
            run = err
        traces += [fx.trace(definition, solution, run, w) for w in workloads]
    return traces
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_traces", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
fx.check_traces(trace_solutions)
print("every candidate traced with the right status")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_traces", trace_solutions)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_deploy", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 3: the deployment
#
# `fx.save_trace_set(root, definition, solutions, workloads, traces)` writes a folder that
# `enable_apply(root, config)` reads. From then on `apply(name, args=(q, k, v, causal), fallback=f)`
# looks the call's var axes up in a table of the fastest PASSED trace per shape and calls that solution,
# or `f(q, k, v, causal)` when the shape has no such trace.
#
# Write `deploy(root)`: enable apply on the trace set in `root` and return a function `attn(q, k, v,
# causal) -> out` that routes each call through `apply()`. It must be safe:
#
# * only PASSED traces count, the fastest of them per shape (apply's table does this, with tolerances
#   that let the course's PASSED traces through: `fx.apply_config()`; flashinfer_bench's default
#   `ApplyConfig` has `max_rtol=1e-5` and drops every float16 trace);
# * a shape with no trace goes to the fallback, never to a solution that was not checked on it
#   (`on_miss_policy="fallback_only"`, as in `fx.apply_config()`);
# * the fallback is correct on every shape, if slow: the definition's own reference is (part 1
#   checked it), and `fx.definition_reference_run(definition)` gives its `run`.
#
# About 6 lines. The check writes a trace set of three tagged solutions: on one shape the fastest
# solution failed its check, on another a different solution wins, a third shape has no trace; it
# reads from each output which solution served it. Routing (5 points) and the fallback (5 points) are
# graded apart.

# %% nbgrader={"grade": false, "grade_id": "deploy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def deploy(root):
    """attn(q, k, v, causal) -> out, routed by apply() over the traces in root, with a safe fallback."""
    # YOUR CODE HERE (about 6 lines)
    ### BEGIN SOLUTION
    enable_apply(str(root), fx.apply_config())
    fallback = fx.definition_reference_run(make_definition())

    def attn(q, k, v, causal):
        return apply(fx.DEFINITION_NAME, args=(q, k, v, causal), fallback=fallback)

    return attn
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_routing", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_deployment(deploy, workloads=("A", "B"))
print("each shape with traces went to its fastest PASSED solution")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_routing", deploy)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_fallback", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_deployment(deploy, workloads=("C",))
print("the shape with no trace went to the fallback, and its output is right")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_fallback", deploy)
### END HIDDEN TESTS


# %% [markdown] nbgrader={"grade": false, "grade_id": "task_tilelang", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 4: FlashAttention-2 in TileLang
#
# The lecture's TileLang section shows the model: a program names its tiles and where they live (shared
# memory `T.alloc_shared`, registers `T.alloc_fragment`), and the compiler turns `T.copy` into TMA loads
# and stores, `T.gemm` into WGMMA, and the block into a producer warpgroup and consumer warpgroups.
# What stays yours is the algorithm of step 04: for one query tile $Q_i$ (`BM` rows of one head),
#
# $$S = Q_i K_j^\top,\quad m' = \max(m, \operatorname{rowmax} S),\quad P = 2^{c S - c m'},\quad
#   \ell' = 2^{c m - c m'} \ell + \operatorname{rowsum} P,\quad O' = 2^{c m - c m'} O + P V_j$$
#
# over the K/V tiles $j$ it can see, with $c$ = `qk_scale` $= \text{scale} \cdot \log_2 e$, then
# $O / \ell$ and $\text{lse} = (c\,m + \log_2 \ell) \ln 2$. The lecture's tile of $S$ has the first
# steps: `T.copy` of a box into shared memory, `T.gemm(q_s, k_s, s, transpose_B=True, ...)`, and the
# running max `T.reduce_max(s, m, dim=1, clear=False)` (keep the old `m` first: `T.copy(m, m_prev)`).
#
# Write the body of `flash_attention_program(T, dtype, D, causal, tiles)`: the signature, the grid (one
# program per query tile, head and batch) and the buffers are given. The contract is the course's: Q
# `[B, Hq, Sq, D]`, K, V `[B, Hkv, Skv, D]` (contiguous), query head `h` reads KV head `h // (Hq //
# Hkv)`, causal bottom-right (key `j` visible to row `i` iff `j <= i + Skv - Sq`), and a row that sees
# no key gets `O = 0`, `lse = -inf`. What to get right:
#
# * **the loop bound**: causal tiles stop at the last key the tile's last row can see (the others are
#   never loaded, which is where causal attention's factor of two comes from), but a tile loads at
#   least one K/V tile (its rows may all be empty);
# * **the mask**, on the tiles that need it (a ragged last tile, the tiles the diagonal crosses): keys
#   past `Skv` and (causal) after the diagonal get $-\infty$; lengths need not be multiples of the
#   tiles: `T.copy` of a box that runs past the tensor's end reads zeros, and stores only the rows inside;
# * **the rows that see no key** (`Sq > Skv`, causal): they end with `O = 0` and `lse = -inf`, not
#   $0 / 0$; on the way their `m` stays $-\infty$, and $-\infty - (-\infty)$ is NaN: use 0 in place of
#   $c\,m$ while `m` is $-\infty$, so that no NaN is ever computed;
# * **the epilogue**: `O` through `o_s` to global memory; `LSE` one element per row, and only for rows
#   `< Sq` (an element store out of bounds is a fault on a GPU, and an error here).
#
# `causal` is a Python `bool` when the program is built: `x if causal else y` chooses at build time (a
# kernel is compiled per value). About 40 lines.
#
# **Running it without a GPU.** The program is a function of the language module `T`. On a GPU,
# `run_attention` calls it with `tilelang.language` and TileLang compiles it; on CPU tensors it calls it
# with `facourse.tilelang_cpu`, the course's CPU stand-in: the same operations on NumPy arrays, one block
# after another and one element at a time in `T.Parallel`, buffers NaN-filled at allocation as a GPU
# leaves them undefined, `T.copy` zero-filling and clipping at the tensors' ends as TMA does. It checks
# the arithmetic, the mask, the loop bounds and the stores, with 16- and 32-wide tiles; it cannot show
# speed, nor whether TileLang's compiler accepts the program: the compile cell below does that where
# `tilelang` is installed, and the GPU tests grade the real kernel.

# %% nbgrader={"grade": false, "grade_id": "tilelang_program", "locked": false, "schema_version": 3, "solution": true, "task": false}
def flash_attention_program(T, dtype: str, D: int, causal: bool, tiles: Tiles):
    """FlashAttention-2's forward as a TileLang program: (Q, K, V, O, LSE, qk_scale), sizes symbolic."""
    BM, BN = tiles.block_m, tiles.block_n
    acc = "float32"
    B, Hq, Hkv, Sq, Skv = T.dynamic("B, Hq, Hkv, Sq, Skv")
    NEG_INF = -T.infinity(acc)

    @T.prim_func
    def attention(Q: T.Tensor([B, Hq, Sq, D], dtype), K: T.Tensor([B, Hkv, Skv, D], dtype),
                  V: T.Tensor([B, Hkv, Skv, D], dtype), O: T.Tensor([B, Hq, Sq, D], dtype),
                  LSE: T.Tensor([B, Hq, Sq], acc), qk_scale: T.float32):
        with T.Kernel(T.ceildiv(Sq, BM), Hq, B, threads=tiles.threads) as (bx, h, b):
            q_s = T.alloc_shared([BM, D], dtype)          # Q_i, loaded once
            k_s = T.alloc_shared([BN, D], dtype)          # K_j
            v_s = T.alloc_shared([BN, D], dtype)          # V_j
            o_s = T.alloc_shared([BM, D], dtype)          # O_i on its way out
            s = T.alloc_fragment([BM, BN], acc)           # scores, then P in float32
            p = T.alloc_fragment([BM, BN], dtype)         # P in the input dtype, for P V
            o = T.alloc_fragment([BM, D], acc)            # the output accumulator
            m = T.alloc_fragment([BM], acc)               # running row max (of unscaled scores)
            m_prev = T.alloc_fragment([BM], acc)
            m_c = T.alloc_fragment([BM], acc)             # c * m, or 0 while m is -inf
            alpha = T.alloc_fragment([BM], acc)           # 2^(c m_prev - c m): rescales l and O
            row_sum = T.alloc_fragment([BM], acc)
            l = T.alloc_fragment([BM], acc)               # running row sum of P
            # YOUR CODE HERE (about 40 lines)
            ### BEGIN SOLUTION
            kv_head = h // (Hq // Hkv)                    # GQA
            row0 = bx * BM
            off = Skv - Sq                                # bottom-right: key j visible to row i iff j <= i + off
            n_kv = T.ceildiv(Skv, BN)
            # causal: up to the tile of the last key that the last row sees, and at least one tile
            n_end = T.max(T.min(n_kv, T.ceildiv(row0 + BM + off, BN)), 1) if causal else n_kv
            # tiles before n_full are inside Skv and (causal) wholly below the diagonal: no mask
            n_full = T.min(T.floordiv(row0 + off + 1, BN), T.floordiv(Skv, BN)) if causal else T.floordiv(Skv, BN)

            T.copy(Q[b, h, row0:row0 + BM, :], q_s)
            T.fill(o, 0)
            T.fill(l, 0)
            T.fill(m, NEG_INF)
            for j in T.Pipelined(n_end, num_stages=tiles.num_stages):
                T.copy(K[b, kv_head, j * BN:(j + 1) * BN, :], k_s)
                T.gemm(q_s, k_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if j >= n_full:
                    for r, c in T.Parallel(BM, BN):
                        key = j * BN + c
                        visible = (key < Skv) and (key <= row0 + r + off) if causal else key < Skv
                        s[r, c] = T.if_then_else(visible, s[r, c], NEG_INF)
                T.copy(m, m_prev)
                T.reduce_max(s, m, dim=1, clear=False)
                for r in T.Parallel(BM):
                    m_c[r] = T.if_then_else(m[r] == NEG_INF, 0, m[r] * qk_scale)
                    alpha[r] = T.exp2(m_prev[r] * qk_scale - m_c[r])
                for r, c in T.Parallel(BM, BN):
                    s[r, c] = T.exp2(s[r, c] * qk_scale - m_c[r])
                T.reduce_sum(s, row_sum, dim=1)
                for r in T.Parallel(BM):
                    l[r] = l[r] * alpha[r] + row_sum[r]
                T.copy(s, p)
                for r, c in T.Parallel(BM, D):
                    o[r, c] *= alpha[r]
                T.copy(V[b, kv_head, j * BN:(j + 1) * BN, :], v_s)
                T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for r, c in T.Parallel(BM, D):
                o[r, c] = T.if_then_else(l[r] > 0, o[r, c] / l[r], 0)
            T.copy(o, o_s)
            T.copy(o_s, O[b, h, row0:row0 + BM, :])
            for r in T.Parallel(BM):
                if row0 + r < Sq:
                    LSE[b, h, row0 + r] = T.if_then_else(l[r] > 0, m[r] * qk_scale * LN2 + T.log(l[r]), NEG_INF)
            ### END SOLUTION

    return attention


# %% nbgrader={"grade": false, "grade_id": "tilelang_entry_point", "locked": true, "schema_version": 3, "solution": false, "task": false}
def flash_attention_tilelang(q, k, v, causal=False, scale=None, tiles=None):
    """Your program as an attention function of the course's contract: -> (o, lse). CPU tensors run on
    the CPU stand-in (tiles 16 x 16 unless given), GPU tensors on TileLang's compiled kernel."""
    return run_attention(flash_attention_program, q, k, v, causal, scale, tiles)


cpu_q, cpu_k, cpu_v = (torch.randn(1, h, 32, 32, dtype=torch.float16) for h in (4, 1, 1))   # a first run
cpu_o, cpu_lse = flash_attention_tilelang(cpu_q, cpu_k, cpu_v, causal=True)
print("ran on the CPU stand-in:", tuple(cpu_o.shape), "NaN in o:", bool(cpu_o.isnan().any()))

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_tilelang_cpu", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The CPU checks run eight small cases, each with the next of three tile shapes (16 x 16, 16 x 32,
# 32 x 16): the causal ones (a square, `Sq < Skv`, ragged lengths, `Sq > Skv` with rows that see no
# key, one query row) and the others (non-causal, one KV head for all query heads, logits in the
# hundreds). A failure names the case, the rows and the likely cause, as every check of the course does.

# %% nbgrader={"grade": true, "grade_id": "test_tilelang_causal", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
check_tilelang_cpu(flash_attention_tilelang, seed=11, cases="causal")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_tilelang_causal", flash_attention_program)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_tilelang_other", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
check_tilelang_cpu(flash_attention_tilelang, seed=12, cases="other")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_tilelang_other", flash_attention_program)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_your_solution", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your kernel as a solution of the definition
#
# A `Solution` carries its sources, so your program becomes one: its source (as this notebook has it)
# and a `run` in the definition's layout, in one `main.py`. Your `trace_solutions` traces it like any
# other: here on the CPU stand-in, on the smallest CPU workload (the stand-in runs one element at a time);
# on an H100 the same solution runs TileLang's compiled kernel, its traces are timed against SDPA, and
# `apply()` sends it the shapes where it is the fastest that passed. Your step 05 and 06 kernels enter
# the same way (the cell after this one).

# %% nbgrader={"grade": false, "grade_id": "your_solution", "locked": true, "schema_version": 3, "solution": false, "task": false}
YOUR_SOURCE = ("import math\n\nfrom facourse.tilelang_kernels import Tiles, run_attention\n\nLN2 = math.log(2.0)\n\n\n"
               + inspect.getsource(flash_attention_program) + '''

def run(q, k, v, causal):
    o, _ = run_attention(flash_attention_program, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         bool(causal))
    return o.transpose(1, 2)
''')
yours = Solution(name="your_tilelang", definition=fx.DEFINITION_NAME, author="you",
                 spec=BuildSpec(language="python", target_hardware=["cpu", "NVIDIA H100"], entry_point="main.py::run",
                                destination_passing_style=False),
                 sources=[SourceFile(path="main.py", content=YOUR_SOURCE)])
for trace in trace_solutions(make_definition(), [yours], fx.workloads("cpu")[:1]):
    print(trace.solution, trace.workload.axes, trace.evaluation.status.value)

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_your_kernels", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your Triton and CUDA kernels, registered the same way
#
# `fx.student_solutions(root)` reads your exercise 05 and 06 notebooks as you last saved them, from
# their folders beside this one: the cells that define your kernel (and, for exercise 06, your
# `student_kernel.cu` with the files it includes) become a solution's sources, with a `run` in the
# definition's layout (`fx.definition_run`: views both ways, no copy). Your Triton kernel runs here in
# Triton's interpreter on the smallest CPU workload; your CUDA kernel needs a GPU, where this cell traces
# both on the first GPU workload. Not graded (the autograder skips this cell); with every solution
# traced on the GPU workloads, `fx.save_trace_set` and `enable_apply` route calls among your four
# kernels as they do among the course's (`benchmarks/README.md`, step 11).

# %% nbgrader={"grade": false, "grade_id": "your_kernels", "locked": true, "schema_version": 3, "solution": false, "task": false}
if os.environ.get("FACOURSE_JUDGE"):
    print("skipped while grading: this cell is for you")
else:
    mine = []
    for step, found in fx.student_solutions(Path.cwd().parent).items():
        if isinstance(found, str):
            print(f"exercise {step}: not registered: {found}")
        else:
            print(f"exercise {step}: {found.name}, {found.description}")
            mine.append(found)
    here = "gpu" if torch.cuda.is_available() else "cpu"
    runnable = [s for s in mine if here == "gpu" or "cpu" in s.spec.target_hardware]
    for trace in trace_solutions(make_definition(), runnable, fx.workloads(here)[:1]):
        why = [ln for ln in (trace.evaluation.log or "").splitlines() if ln.strip()][-1:]
        print(trace.solution, trace.workload.axes, trace.evaluation.status.value, *why)

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_tilelang_compile", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## TileLang's compiler, without a GPU
#
# Where `tilelang` is installed (`pip install tilelang==0.1.15`; no GPU needed), this cell lowers your
# program for Hopper (sm_90a) and reads the CUDA it wrote: TMA loads (`tma_load`), WGMMA
# (`wgmma_ss`: both operands in shared memory, `wgmma_rs`: `P` from registers), and the producer
# warpgroup handing its registers to the consumers (`warpgroup_reg_dealloc`). A program the stand-in
# runs but TileLang rejects fails here with TileLang's message. It takes about ten seconds per kernel.

# %% nbgrader={"grade": false, "grade_id": "tilelang_compile", "locked": true, "schema_version": 3, "solution": false, "task": false}
if importlib.util.find_spec("tilelang") is None:
    print("tilelang is not installed here: pip install tilelang==0.1.15 to see your program lowered for sm_90a")
else:
    cuda_source = hopper_source(flash_attention_program, "float16", 128, causal=True)
    found = {k: cuda_source.count(k) for k in ("tma_load", "tma_store", "wgmma_ss", "wgmma_rs",
                                                "warpgroup_reg_dealloc", "exp2f")}
    print(f"{len(cuda_source.splitlines())} lines of CUDA for sm_90a; {found}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_tilelang_gpu", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## On an H100 or H200
#
# TileLang compiles your program (128 x 128 tiles, two consumer warpgroups: `TILES` of
# `facourse.tilelang_kernels`) and the course's check runs it on the five configurations and the edge
# cases in float16 and bfloat16; the hidden tests then time it on `large` and `long` against SDPA's
# FlashAttention-2 in the same process (the course's TileLang solution reaches about 1.5 times its speed).
# Where FlashInfer is installed, each timed test also prints your kernel against FlashInfer's prefill
# kernel, the seed's reference (its FA3 kernel on Hopper: the course's solution reaches about 0.8-0.9 of
# its speed); that line is for you, the points come from the FlashAttention-2 ratio.

# %% nbgrader={"grade": true, "grade_id": "test_tilelang_gpu", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
try:
    require_sm90a(what="the TileLang kernel's GPU tests")
    check_all(flash_attention_tilelang, expect_lse=True)
except HardwareUnavailable as e:
    print(f"Skipped, 0 points on this machine: {e}")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_tilelang_gpu", flash_attention_program)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_large", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_large", flash_attention_program)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_long", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_long", flash_attention_program)
### END HIDDEN TESTS
