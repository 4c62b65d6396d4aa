# %% [markdown]
# # 11 — Interchangeable kernels: one definition, many implementations, `apply()`
#
# Lectures 05, 06 and 07 wrote the same operator three times, and the ladder of step 11 writes it a
# fourth time in TileLang. For batch $b$, query head $h$ and query row $i$, with $G = H_q / H_{kv}$:
#
# $$o_i = \sum_{j \in \mathcal{V}(i)} \frac{e^{s_{ij}}}{\sum_{j' \in \mathcal{V}(i)} e^{s_{ij'}}}\, v_j,
#   \qquad s_{ij} = \text{scale} \cdot q_i \cdot k_j, \qquad k_j, v_j \text{ of KV head } \lfloor h / G \rfloor,$$
#
# where $\mathcal{V}(i)$ is every key, or with `causal` the keys $j \le i + (S_{kv} - S_q)$. Four kernels
# that compute this are **interchangeable** if, given the same tensors, each returns the same $o$ within
# the course's correctness rule. Which one to run then becomes a choice made per call, by measurement: the
# fastest kernel that was checked on the call's shape. This lecture is about making that choice
# mechanical and safe.
#
# **What you will learn**
# - what a **definition** pins down: the axes that vary from call to call and those that are constant,
#   the tensors in calling order with their dtypes, scalar inputs, and the reference that gives the
#   operator its meaning; what it does *not* check at call time;
# - **three ways to write one tile**: $S = Q_i K_j^\top$ with a running row max, in Triton, in
#   TileLang and in CUDA C++, side by side, and what each compiler does for you;
# - the course's **TileLang FlashAttention** for Hopper: its structure and what it measured;
# - **solutions, workloads and traces**: correctness and speed recorded per (solution, shape);
# - **runtime dispatch** with FlashInfer-Bench's `apply()`: its table (keyed on the var axes only, PASSED
#   traces only, the highest speedup), its tolerances, its miss policies, and what happens when a
#   solution does not build; each rule read in the library's source and run here on a small operator;
# - **which backend wins where** on an H100, from the course's measurements.
#
# **Sources followed.** FlashInfer-Bench (GitHub `flashinfer-ai/flashinfer-bench`, version 0.1.2, the
# package this lecture imports): `data/definition.py`, `data/workload.py`, `data/solution.py`,
# `data/trace.py`, `data/trace_set.py` (the objects), `apply/config.py`, `apply/key.py`, `apply/table.py`,
# `apply/runtime.py`, `apply/presets.py` (dispatch) and `compile/registry.py` (builds). Lei Wang et al.,
# *TileLang: A Composable Tiled Programming Model for AI Systems* (2025, arXiv 2504.17577) and its
# repository (GitHub `tile-ai/tilelang`: `src/op/gemm.cc`, `src/transform/warp_specialized_rewriter.cc`,
# `src/transform/inject_pipeline.cc`). Philippe Tillet, H. T. Kung, David Cox, *Triton: An Intermediate
# Language and Compiler for Tiled Neural Network Computations* (MAPL 2019). Jay Shah, Ganesh Bikshandi,
# Ying Zhang, Vijay Thakkar, Pradeep Ramani, Tri Dao, *FlashAttention-3* (2024, arXiv 2407.08608), §3.1
# (producer and consumer warpgroups, ping-pong) and §3.2 (softmax overlapped with the products inside a
# warpgroup). Lectures 02 and 03 (safe and online softmax), 05 (Triton), 06 and 07 (CUDA).
#
# Exercise 11 asks you to write the attention operator as a FlashInfer-Bench `Definition`, to trace
# solutions of it, and to deploy them with `apply()`. To leave that work to you, this lecture shows every
# piece of FlashInfer-Bench on a different, smaller operator: a softmax over a vocabulary with a
# temperature.

# %%
import ctypes
import html
import importlib.util
import inspect
import os
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

# FlashInfer-Bench caches builds and apply tables under FIB_CACHE_PATH (default ~/.cache/flashinfer_bench):
# this lecture keeps them, and the trace sets it writes, in a temporary folder that goes when the kernel exits.
SCRATCH = tempfile.TemporaryDirectory(prefix="lecture11_")
os.environ.setdefault("FIB_CACHE_PATH", SCRATCH.name)

from facourse.triton_setup import interpret_without_gpu

INTERPRETED = interpret_without_gpu()     # no GPU: Triton kernels run in its CPU interpreter

import torch
import triton
import triton.language as tl
from IPython.display import HTML, Markdown, display

import flashinfer_bench as fib
from flashinfer_bench import (AxisConst, AxisVar, BuildSpec, Definition, Solution, SourceFile, TensorSpec,
                              Workload)
from flashinfer_bench.apply.key import ApplyKeyFactory
from flashinfer_bench.compile import BuilderRegistry
from flashinfer_bench.compile.builders import PythonBuilder, TileLangBuilder, TorchBuilder, TritonBuilder, TVMFFIBuilder
from flashinfer_bench.data.workload import RandomInput, ScalarInput

from facourse import interchange as fx
from facourse import results

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()
print("Triton runs in its CPU interpreter" if INTERPRETED else "a GPU is present: Triton compiles for it")
print("flashinfer_bench", version("flashinfer-bench"), "| torch", torch.__version__)

# %% [markdown]
# ## 1. One operator, many implementations
#
# The course now has four kernels of the operator above, each checked by the same rule
# (`facourse.check_attention`) and timed by the same bench (`facourse.bench_attention`):
#
# | step | kernel | written in | runs on |
# |---|---|---|---|
# | 05 | FlashAttention-2, host tensor descriptors, a tile table per shape class | Triton | a GPU Triton compiles for (measured on an H100) |
# | 06 | FlashAttention-2 on `mma.sync`, cp.async pipeline, swizzled shared memory | CUDA C++ | sm_80 and newer |
# | 07 | TMA, WGMMA, producer and consumer warpgroups, ping-pong, persistent | CUDA C++ | sm_90a (Hopper) only |
# | 11 | TMA, WGMMA, warp specialisation chosen by the compiler | TileLang | sm_90a as the course builds it |
#
# Their speeds differ from shape to shape, and two of them do not even build on a GPU older than Hopper.
# A model server that calls attention millions of times, on shapes that change from call to call, wants
# for each call the fastest kernel *that is right for that call*, and something correct when none is
# known. Three things make that possible:
#
# 1. one **definition** of the operator, which every kernel implements with the same calling convention;
# 2. **traces**: every kernel run on every shape of interest (a **workload**), checked against the
#    definition's meaning and timed;
# 3. a **dispatcher** that reads the traces and routes each call.
#
# FlashInfer-Bench provides all three: `Definition`, `Workload`, `Solution` and `Trace` are pydantic
# models (`data/*.py`) with a JSON form; a folder of them is a `TraceSet` (`data/trace_set.py`);
# `enable_apply(folder, config)` and `apply(name, args=..., fallback=...)` do the dispatch
# (`apply/apply_api.py`, `apply/runtime.py`).
#
# ## 2. What a definition pins down
#
# The operator of this lecture is a softmax over a vocabulary with a temperature $\tau$, the last step
# before sampling a token. For each row $r$ of a batch of logits $x$:
#
# $$p_{rc} = \frac{e^{x_{rc}/\tau}}{\sum_{c'} e^{x_{rc'}/\tau}}, \qquad c = 0 \ldots V - 1 .$$
#
# A definition says, in data:
#
# - its **axes**: the named sizes of its tensors. An axis is **var** when it changes from call to call (the
#   batch: how many sequences are sampled now) and **const** when it is fixed by the model (the
#   vocabulary size $V$). A kernel may be compiled for a const axis; it must accept any value of a var one.
# - its **inputs** and **outputs**, in calling order, each with a shape made of axis names and a dtype.
#   A scalar is an input whose shape is `None`: here the temperature.
# - a **reference**: Python source defining `run(...)`, whose result *is* the operator. Every solution is
#   checked against it, so it must be right on every shape, not fast.
#
# (For attention the same questions have the answers you would expect: the batch and the two sequence
# lengths change from call to call, the head counts and the head dimension are the model's; the layout
# of each tensor is part of the contract; `causal` is a scalar input. Writing that definition is part 1
# of exercise 11.)

# %%
VOCAB = 2048      # small enough for this CPU; a real vocabulary is 32k-256k

TOY_REFERENCE = '''
import torch


def run(logits, temperature):
    """The operator's meaning: softmax(logits / temperature) over the vocabulary, in float64."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    return p.to(logits.dtype)
'''

TOY = Definition(
    name="softmax_temperature_v2048",
    op_type="softmax",
    description="softmax over the vocabulary of logits / temperature (lecture 11's example operator)",
    axes={"batch": AxisVar(description="rows sampled in this call"),
          "vocab": AxisConst(value=VOCAB, description="the model's vocabulary")},
    inputs={"logits": TensorSpec(shape=["batch", "vocab"], dtype="float16"),
            "temperature": TensorSpec(shape=None, dtype="float32")},
    outputs={"probs": TensorSpec(shape=["batch", "vocab"], dtype="float16")},
    reference=TOY_REFERENCE,
)
print(TOY.model_dump_json(indent=1, exclude={"reference"}))
print("var axes:", TOY.var_axes, "  const axes:", TOY.const_axes)

# %% [markdown]
# A definition is checked when it is built (pydantic validators in `data/definition.py`: every axis a
# shape names must exist, input and output names must differ, the reference must parse and define a
# top-level `run`). What happens at **call** time is narrower. The dispatcher reads the values of the var
# axes from the call's tensors (`Definition.get_axes_values`): it walks the inputs in order, skips
# scalars, and collects the size of each var axis. It never compares a const axis with the tensor, and it
# never looks at a dtype. Both are promises that the solutions rely on, not checks:

# %%
logits = torch.randn(16, VOCAB).half()
print("float16, vocab 2048:", TOY.get_axes_values_from_inputs([logits, 1.0]))
print("float32, vocab 1000:", TOY.get_axes_values_from_inputs([torch.randn(16, 1000), 1.0]),
      "  <- the same: a const axis and a dtype are not looked at")
try:
    TOY.get_axes_values_from_inputs([torch.randn(16, VOCAB, 2), 1.0])
except ValueError as e:
    print("a tensor of the wrong rank is refused:", e)

# %% [markdown]
# So a call with the wrong vocabulary or the wrong dtype reaches a kernel compiled for the right ones.
# The definition is the contract; the caller must keep it.
#
# ## 3. Three ways to write one tile
#
# Each interchangeable kernel is written against the same definition, in a different language. To see
# what each language asks of you, take a piece of FlashAttention small enough to read three times: the
# running row maximum of the scores. For query rows $Q_i$ (a tile of $B_r$ rows) and keys in tiles
# $K_j$ of $B_c$ rows,
#
# $$S_{ij} = Q_i K_j^\top \in \mathbb{R}^{B_r \times B_c}, \qquad m_i \leftarrow \max\big(m_i,\ \operatorname{rowmax} S_{ij}\big),
#   \qquad m_i^{(0)} = -\infty,$$
#
# which after the last tile is $m_i = \max_j q_i \cdot k_j$: the first line of FlashAttention's inner loop
# (lecture 05) without the softmax. One program computes one $Q_i$; the loop over $j$ is where a load
# pipeline pays. (Lengths are multiples of the tiles here; lecture 05 masked the ragged ones.)
#
# In **Triton** a program owns a tile, and the kernel is written on whole tiles. Triton's interpreter runs
# it on this CPU:

# %%
@triton.jit
def rowmax_qk(Q, K, M_out, N, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)                                  # this program owns rows i*BLOCK_M ...
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + cols[None, :])    # Q_i: where it lives is the compiler's choice
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for j in range(0, N, BLOCK_N):                        # num_stages at launch: loads run ahead
        keys = j + tl.arange(0, BLOCK_N)
        k = tl.load(K + keys[:, None] * D + cols[None, :])
        s = tl.dot(q, tl.trans(k))                        # S = Q_i K_j^T on tensor cores
        m = tl.maximum(m, tl.max(s, axis=1))              # m = max(m, rowmax(S))
    tl.store(M_out + rows, m)


Mq, Nk, Dh = 256, 512, 64
q_t, k_t = torch.randn(Mq, Dh), torch.randn(Nk, Dh)     # float32: the interpreter's dot is exact in it
m_t = torch.empty(Mq)
rowmax_qk[(Mq // 64,)](q_t, k_t, m_t, Nk, D=Dh, BLOCK_M=64, BLOCK_N=64)   # on a GPU: num_warps=4, num_stages=2
print(f"{Mq // 64} programs x {Nk // 64} key tiles; max |m - rowmax(Q K^T)| =",
      float((m_t - (q_t @ k_t.T).amax(-1)).abs().max()))

# %% [markdown]
# The same tile in **TileLang** and in **CUDA C++** (on `mma.sync`, sm_80). TileLang is not a student
# dependency of this course (its kernels run on a GPU, compiled by CUDA's `nvcc`), so the TileLang
# program is written as a function of its language module `T`: on a GPU it is given
# `tilelang.language` and compiled; below, on this CPU, it is given `facourse.tilelang_cpu`, the
# course's stand-in, which runs the same program on NumPy arrays, one block after another (exercise 11
# grades your TileLang program on it). A CUDA kernel needs a GPU. The
# CUDA version calls small device functions in the style of lecture 06 (`ldmatrix_x4`, `mma_m16n8k16`,
# a cp.async tile copy) whose bodies are not shown; everything else a CUDA programmer writes is there.

# %%
TILELANG_SRC = '''def rowmax_program(T, M, N, D, BLOCK_M=128, BLOCK_N=64, dtype="float16"):
    @T.prim_func
    def kernel(Q: T.Tensor((M, D), dtype), K: T.Tensor((N, D), dtype),
               M_out: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, BLOCK_M), threads=128) as i:  # a block per Q_i
            q_s = T.alloc_shared((BLOCK_M, D), dtype)              # shared memory
            k_s = T.alloc_shared((BLOCK_N, D), dtype)
            s = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")    # registers
            m = T.alloc_fragment((BLOCK_M,), "float32")
            T.copy(Q[i * BLOCK_M:(i + 1) * BLOCK_M, :], q_s)        # TMA on Hopper
            T.fill(m, -T.infinity("float32"))
            for j in T.Pipelined(N // BLOCK_N, num_stages=2):      # K_j+1 loads during S_j
                T.copy(K[j * BLOCK_N:(j + 1) * BLOCK_N, :], k_s)
                T.gemm(q_s, k_s, s, transpose_B=True,              # S = Q_i K_j^T:
                       clear_accum=True)                           #   WGMMA on Hopper
                T.reduce_max(s, m, dim=1, clear=False)             # m = max(m, rowmax(S))
            T.copy(m, M_out[i * BLOCK_M:(i + 1) * BLOCK_M])

    return kernel

# on a GPU: tilelang.compile(rowmax_program(tilelang.language, M, N, D))
'''

CUDA_SRC = '''// sm_80+: BLOCK_M 64 (4 warps x 16 rows), BLOCK_N 64, D 128, fp16
__global__ void __launch_bounds__(128)
rowmax_qk(const half* Q, const half* K, float* M_out, int N) {
  __shared__ alignas(128) half q_s[64 * 128], k_s[2][64 * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile_async(q_s, Q + blockIdx.x * 64 * 128);  // cp.async,
  load_tile_async(k_s[0], K);                       // swizzled
  cp_async_commit();
  float m[2] = {-INFINITY, -INFINITY};  // rows lane/4, lane/4 + 8
  for (int j = 0; j < N / 64; ++j) {
    if (j + 1 < N / 64)                 // stage j+1 while j computes
      load_tile_async(k_s[(j + 1) % 2], K + (j + 1) * 64 * 128);
    cp_async_commit();
    cp_async_wait<1>();                 // tile j has landed
    __syncthreads();
    float s[8][4] = {};                 // S: 16 x 64 per warp
    for (int kk = 0; kk < 128; kk += 16) {   // S = Q_i K_j^T
      uint32_t a[4];
      ldmatrix_x4(a, q_s, warp * 16, kk);
      for (int n = 0; n < 8; ++n) {
        uint32_t b[2];
        ldmatrix_x2(b, k_s[j % 2], n * 8, kk);
        mma_m16n8k16(s[n], a, b);       // tensor cores, fp32
      }
    }
    for (int n = 0; n < 8; ++n) {       // rowmax: my columns ...
      m[0] = fmaxf(m[0], fmaxf(s[n][0], s[n][1]));
      m[1] = fmaxf(m[1], fmaxf(s[n][2], s[n][3]));
    }
    __syncthreads();                    // k_s[j % 2] is refilled next
  }
  for (int off = 1; off < 4; off *= 2)  // ... then the 4 lanes of a row
    for (int r = 0; r < 2; ++r)
      m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], off));
  if (lane % 4 == 0) {
    const int row = blockIdx.x * 64 + warp * 16 + lane / 4;
    M_out[row] = m[0];
    M_out[row + 8] = m[1];
  }
}
'''
TRITON_SRC = inspect.getsource(rowmax_qk.fn)


def side_by_side(columns):
    """Sources in columns of one HTML table (read-only text)."""
    head = "".join(f"<th style='text-align:left'>{html.escape(t)} ({len(s.strip().splitlines())} lines)</th>"
                   for t, s in columns)
    cells = "".join(f"<td style='vertical-align:top'><pre style='font-size:68%;line-height:1.25'>{html.escape(s)}"
                    "</pre></td>" for _, s in columns)
    return HTML(f"<table><tr>{head}</tr><tr>{cells}</tr></table>")


display(side_by_side([("Triton", TRITON_SRC), ("TileLang", TILELANG_SRC), ("CUDA C++, sm_80", CUDA_SRC)]))

# %% [markdown]
# The TileLang column, run: its program given the CPU stand-in (16-row tiles here: it runs one element at
# a time), on the same $Q$ and $K$ as the Triton tile above.

# %%
from facourse import tilelang_cpu

tl_scope = {}
exec(TILELANG_SRC, tl_scope)                     # defines rowmax_program(T, M, N, D, ...)
m_tl = torch.empty(Mq)
tl_scope["rowmax_program"](tilelang_cpu, Mq, Nk, Dh, BLOCK_M=16, BLOCK_N=16, dtype="float32")(q_t, k_t, m_tl)
print(f"{Mq // 16} blocks x {Nk // 16} key tiles on the stand-in; max |m - rowmax(Q K^T)| =",
      float((m_tl - (q_t @ k_t.T).amax(-1)).abs().max()))

# %% [markdown]
# The three compute the same thing; they differ in who decides how.
#
# | | Triton | TileLang | CUDA C++ |
# |---|---|---|---|
# | unit of work | a program per tile, `tl.program_id` | a block per tile, `T.Kernel(..., threads=128)` | a block; you index threads, warps and lanes |
# | where a tile lives | the compiler's choice: registers, shared memory where it stages or converts | yours: `T.alloc_shared`, `T.alloc_fragment` (registers spread over the threads) | yours: `__shared__` arrays, per-thread register arrays |
# | layouts and swizzles | the compiler's | the compiler's (layout inference gives the shared-memory swizzle and each fragment's layout) | yours (lecture 06: the XOR swizzle, the `mma` fragment layouts) |
# | global to shared memory | `tl.load` through pointers, or tensor descriptors (TMA on Hopper, lecture 05's `v6`) | `T.copy`: cp.async, or TMA on Hopper | cp.async (above) or TMA descriptors and mbarriers (lecture 07), by hand |
# | the product | `tl.dot`: `mma.sync`, or WGMMA on Hopper | `T.gemm`: `mma.sync`, or WGMMA on Hopper | `ldmatrix` + `mma.sync`, or WGMMA descriptors, by hand |
# | the pipeline | `num_stages` at launch; buffers rotated by the compiler | `T.Pipelined(n, num_stages=2)`; buffers and barriers by the compiler | the ring, its indices, commits and waits (and mbarrier phases on Hopper), by hand |
# | warp specialisation | the compiler's; Triton 3.6 does not split FlashAttention's loop on sm_90 (step 05's ladder, `v6`) | on Hopper the compiler adds a producer warpgroup for the TMA copies and moves registers to the consumers | by hand (lecture 07, §5) |
# | the row reduction | `tl.max(s, axis=1)` | `T.reduce_max(s, m, dim=1)` | each lane's columns, then shuffles across the 4 lanes that hold a row |
#
# TileLang's paper calls this the separation of **dataflow** from **scheduling**: the program says which
# tiles move where and what is computed on them; thread binding, layouts, tensor-core instructions and
# the pipeline are filled in by the compiler, and can be overridden by annotations. In its repository:
# `T.gemm` lowers to WGMMA on a Hopper target when the tile has at least 64 rows and the block a multiple
# of four warps, otherwise to `mma.sync` (`src/op/gemm.cc`); `T.Pipelined` becomes a multi-stage ring of
# shared buffers (`src/transform/inject_pipeline.cc`), and on Hopper, with TMA copies, the block is split
# into a producer warpgroup and consumer warpgroups synchronised by mbarriers
# (`src/transform/warp_specialized_rewriter.cc`). The course checks this on its own TileLang kernel
# (`tests/test_step11_tilelang.py` in the course repository, with TileLang installed): the source lowered for sm_90a launches
# 128 threads more than the kernel asks for (the producer warpgroup), calls `tl::tma_load`, `tl::wgmma_ss`
# and `tl::wgmma_rs`, and moves registers with `setmaxnreg`; its SASS holds `HGMMA`, `UTMALDG` and
# `USETMAXREG`.
#
# Triton decides more and lets you decide less: you cannot name shared memory or say which warps load.
# CUDA decides nothing for you: lecture 07's Hopper kernel is the same computation in several hundred
# lines, with every mbarrier phase written out. TileLang sits between: you name the buffers and the
# copies, and the compiler writes the Hopper machinery.
#
# ## 4. The course's TileLang FlashAttention
#
# The ladder of step 11 holds the course's FlashAttention-2 forward in TileLang for Hopper
# (`solutions/11_interchangeable_kernels/ladder/tilelang_fa.py`; writing one is part 4 of this step's
# exercise, so its code is not shown here). Its structure, in the terms of sections 3 and lecture 07:
#
# - one block per (query tile of $B_r = 128$ rows, query head, batch); key/value tiles of $B_c = 128$ rows;
# - **two consumer warpgroups** (256 threads), each owning 64 query rows: $S = Q_i K_j^\top$ is one WGMMA of
#   shape m64n128k16 per 16 columns of $D$ with both operands in shared memory, and $P V_j$ a WGMMA with
#   $P$ from registers;
# - a **producer warpgroup** that TileLang adds (384 threads in all): it loads $Q_i$ once and $K_j, V_j$
#   through a **two-stage** ring of shared buffers with TMA and mbarriers, while `setmaxnreg` gives the
#   consumers 240 registers a thread (160 KB of shared memory for $D = 128$: one block per SM);
# - the online softmax of lecture 05 in base 2, the causal bound as a loop limit, and masking only on the
#   tiles that cross the diagonal or the end of the keys; shapes are symbolic, so one compiled kernel
#   serves every batch and sequence length.
#
# What it does not do is what lecture 07's kernel adds on top: FlashAttention-3's ping-pong between the
# two consumer warpgroups (§3.1) and the softmax of one tile overlapped with the products of the next
# inside a warpgroup (§3.2), and a persistent tile scheduler. What it measured on an H100 (fp16, D = 128,
# Hq = 32, Hkv = 8; GPU time with CUDA events, L2 flushed, interleaved rounds against SDPA's
# FLASH_ATTENTION backend, median of at least 20 after warm-up; `benchmarks/results/2026-11-23_h100_step11_tilelang.json`
# in the course repository): 44 of 44 checks in fp16 and bf16; **456 TFLOP/s on `large`, 1.48x FA2's 307**, and
# **586 TFLOP/s on `long` (B 2, H 16, S 8192, non-causal), 1.60x FA2's 365**; in bf16 1.49x and 1.64x. A
# third stage measured 466 and 583 TFLOP/s (no gain on `long`), 128 x 64 tiles 1.34-1.41x, and the same
# kernel without fast math 1.30x on `large`. It also reads the `[batch, seq, heads, dim]` storage of a
# FlashInfer-Bench definition in place (a second kernel whose TMA descriptors differ, nothing else): 32 of
# 32 checks, 456 and 577 TFLOP/s on `large` and `long` (`..._step11_tilelang_layouts.json`). Step 07's
# kernel, measured in its own run:

# %%
R7 = results.load("07")
if not R7:
    print("No step-07 measurement is committed in course/results/measured.json.")
else:
    for cfg in ("large", "long"):
        r = results.bench(R7, R7["solution"], cfg, "float16", "FLASH_ATTENTION")
        if r:
            print(f"step 07 ({R7['solution']}), {cfg:5s}: {r[0]['tflops']:.0f} TFLOP/s, {r[0]['ratio']:.2f}x FA2 "
                  f"({r[0]['tflops_ref']:.0f}); {R7['env']['gpu']}, {R7['env']['date']}")

# %% [markdown]
# The hand-written kernel with FA3's overlap is ahead on these two shapes; the TileLang kernel, written
# at the level of section 3's middle column, gets most of the way there. Section 7 compares all four on
# the same shapes in one run.
#
# The seed grades its TileLang kernel against FlashInfer's prefill, not SDPA. FlashInfer is the
# course's bench reference `FLASHINFER` where it is installed (`facourse.bench.flashinfer_reference`:
# `flashinfer.single_prefill_with_kv_cache`, its FA3 kernel on Hopper). Timed against both in one run:

# %%
FI = results.load("11_flashinfer")
if not FI:
    print("No FlashInfer measurement is committed in course/results/measured.json.")
else:
    for r in FI["rows"]:
        if r["layout"] == "bhsd":
            print(f"{r['config']:5s} TileLang {r['tflops']:.0f} TFLOP/s against {r['ref_backend']} "
                  f"{r['tflops_ref']:.0f}: {r['ratio']:.2f}x")
    print(f"({FI['env']['gpu']}, {FI['env']['date']}, fp16)")

# %% [markdown]
# FlashInfer's FA3 kernel takes 14-19 % less time than this TileLang kernel on these shapes (its
# TFLOP/s are 1.7-1.9 times FA2's in the same run): the ping-pong and intra-warpgroup overlap the
# TileLang kernel leaves out. Measured against it, the TileLang kernel still clears the seed's bar
# (0.4 of the reference's speed for half the points, 0.6 for all) with room to spare.
#
# ## 5. Solutions, workloads and traces
#
# A **solution** is one implementation of a definition, packaged: its language (`python`, `triton`, `cuda`,
# `tilelang`), the hardware it targets, its source files, and an entry point `"file.py::function"`
# (`data/solution.py`). `BuilderRegistry.get_instance().build(definition, solution)` turns it into a
# callable: each builder says whether it is available on this machine (`TileLangBuilder` needs the
# `tilelang` package, `TorchBuilder` a GPU) and which languages it takes (`compile/registry.py`,
# `compile/builders/`). The builder checks the entry point's number of parameters against the
# definition's inputs (`compile/builder.py`).
#
# Three solutions of the toy operator, each real code, the kind of variants a team ends up with:

# %%
SOURCES = {
    "exp_normalise": '''
import torch


def run(logits, temperature):
    """exp(x / t) / sum exp(x / t) in float32, written for speed: in place, and no max subtracted."""
    e = logits.float().div_(temperature).exp_()
    return e.div_(e.sum(-1, keepdim=True)).to(logits.dtype)
''',
    "max_exp_normalise": '''
import torch


def run(logits, temperature):
    """Lecture 02's safe softmax in float32: subtract the row max before exp."""
    s = logits.float() / temperature
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(logits.dtype)
''',
    "online_blocks": '''
import torch

BLOCK = 512


def run(logits, temperature):
    """Lecture 03's online softmax: one pass over column blocks keeps (m, l), a second normalises."""
    s = logits.float() / temperature
    m = torch.full_like(s[:, :1], float("-inf"))
    l = torch.zeros_like(m)
    for j in range(0, s.shape[-1], BLOCK):
        b = s[:, j:j + BLOCK]
        m_new = torch.maximum(m, b.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(b - m_new).sum(-1, keepdim=True)
        m = m_new
    return (torch.exp(s - m) / l).to(logits.dtype)
''',
}


def python_solution(name, source, definition=TOY):
    return Solution(name=name, definition=definition.name, author="lecture 11",
                    spec=BuildSpec(language="python", target_hardware=["cpu"], entry_point="main.py::run",
                                   destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=source)])


SOLUTIONS = [python_solution(n, s) for n, s in SOURCES.items()]
REGISTRY = BuilderRegistry.get_instance()
print("builders available here:", {b.__name__: b.is_available() for b in
                                   (TritonBuilder, TileLangBuilder, PythonBuilder, TVMFFIBuilder, TorchBuilder)})
RUNS = {s.name: REGISTRY.build(TOY, s) for s in SOLUTIONS}        # each builds: they are plain Python
REFERENCE = REGISTRY.build_reference(TOY)                         # the reference is built like a solution
print({name: type(r).__name__ for name, r in RUNS.items()})

# %% [markdown]
# A **workload** is one concrete call: a value for every var axis, and how to get each input
# (`RandomInput`, `ScalarInput(value=...)`, or a safetensors file of a captured call;
# `data/workload.py`). Four workloads here, two of which have the same batch and differ only in the
# temperature: $\tau = 0.02$ sharpens the distribution (and makes $x / \tau$ large).

# %%
WORKLOADS = {   # name: (batch, temperature)
    "b16": (16, 1.0),
    "b128": (128, 1.0),
    "b128_sharp": (128, 0.02),
    "b512": (512, 1.0),
}


def toy_workload(name, batch, temperature):
    return Workload(axes={"batch": batch},
                    inputs={"logits": RandomInput(), "temperature": ScalarInput(value=temperature)},
                    uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"facourse/lecture11/{name}")))


TOY_WORKLOADS = {name: toy_workload(name, *bt) for name, bt in WORKLOADS.items()}
WL_NAME = {w.uuid: name for name, w in TOY_WORKLOADS.items()}


def toy_inputs(workload, seed=0):
    """(logits, temperature) of a workload: logits ~ N(0, 3^2) in float16, drawn from a seed."""
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(workload.axes["batch"], VOCAB, generator=g)).half()
    return logits, float(workload.inputs["temperature"].value)

# %% [markdown]
# A **trace** is one solution on one workload: its status (`PASSED`, `INCORRECT_NUMERICAL`,
# `INCORRECT_SHAPE`, `INCORRECT_DTYPE`, `RUNTIME_ERROR`, `COMPILE_ERROR`, `TIMEOUT`), its errors and its
# speed (`data/trace.py`). The model enforces what goes with which status: a PASSED trace must carry
# correctness *and* performance, an INCORRECT_NUMERICAL one correctness and no performance, every other
# failure neither.
#
# Two measurements make a trace. **Correctness**, by the toy's rule, which is the course's softmax rule
# (lecture 02) applied to $x/\tau$: the output is finite and within twice PyTorch's own float16 error
# plus $10^{-3}$ of the float64 reference, element by element. **Speed**, by the course's performance
# rule on a CPU clock: the solution and the reference alternate, round after round, on the same inputs,
# after a warm-up; `speedup_factor` is the median over 20 rounds of $t_\text{ref} / t_\text{solution}$ (a
# ratio taken within one round is disturbed less by a busy machine than a ratio of two medians). The
# reference is the definition's own (float64): every speedup below is against it, measured here.
#
# One more thing decides CPU times of tensors this large. glibc's allocator (Linux) gives freed blocks above
# a threshold back to the system and maps fresh pages for the next request; a call then pays for page
# faults, and which call pays depends on what ran just before it. Before timing, the cell below raises both
# thresholds (`mallopt`), so that freed memory stays in the process; without it, the times measured on this
# machine depended on the order in which the solutions ran. Where there is no glibc it does nothing.

# %%
HARDWARE = f"this CPU ({os.cpu_count()} cores), torch {torch.__version__}, one thread"


def keep_freed_memory(limit=32 * 2**20):
    """glibc only: serve blocks up to `limit` bytes from the heap and never trim it (M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD); True when both settings took."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(-3, limit)) and bool(libc.mallopt(-1, 2 * limit))


print("freed memory kept in the process while timing:", keep_freed_memory())


def toy_check(probs, logits, temperature):
    """(passed, max |p - ref|, max |p - ref| / max |ref|, allowed) of the toy's rule."""
    ref = torch.softmax(logits.double() / temperature, dim=-1)
    p_torch = torch.softmax((logits.float() / temperature).half(), dim=-1).double()   # PyTorch in fp16
    allowed = 2 * float((p_torch - ref).abs().max()) + 1e-3
    err = (probs.double() - ref).abs()
    max_err = float(err.max()) if bool(torch.isfinite(probs).all()) else float("nan")
    passed = probs.shape == logits.shape and probs.dtype == logits.dtype and max_err <= allowed
    return passed, max_err, max_err / float(ref.abs().max()), allowed


def time_cpu(fn, ref, args, rounds=20, warmup=3):
    """fn against ref on the same args, in alternating rounds after a warm-up: the median seconds of each,
    and the median over the rounds of t_ref / t_fn."""
    t_fn, t_ref = [], []
    for r in range(warmup + rounds):
        t0 = time.perf_counter()
        fn(*args)
        t1 = time.perf_counter()
        ref(*args)
        t2 = time.perf_counter()
        if r >= warmup:
            t_fn.append(t1 - t0)
            t_ref.append(t2 - t1)
    return statistics.median(t_fn), statistics.median(t_ref), statistics.median(b / a for a, b in zip(t_fn, t_ref))


def trace_toy(solution_name, run, workload, seed=0):
    """One solution on one workload as a flashinfer_bench Trace: checked, then (if PASSED) timed."""
    logits, temperature = toy_inputs(workload, seed)
    env = fib.Environment(hardware=HARDWARE)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        probs = run(logits, temperature)
    except Exception as e:                                   # the call itself failed
        ev = fib.Evaluation(status="RUNTIME_ERROR", environment=env, timestamp=stamp, log=repr(e))
        return fib.Trace(definition=TOY.name, workload=workload, solution=solution_name, evaluation=ev)
    passed, max_err, rel_err, allowed = toy_check(probs, logits, temperature)
    correctness = fib.Correctness(max_absolute_error=max_err, max_relative_error=rel_err,
                                  extra={"allowed_abs_err": allowed})
    if not passed:
        ev = fib.Evaluation(status="INCORRECT_NUMERICAL", environment=env, timestamp=stamp, correctness=correctness,
                            log=f"max |p - ref| = {max_err:.3g} (NaN: a non-finite output), allowed {allowed:.3g}")
    else:
        t, t_ref, speedup = time_cpu(run, REFERENCE, (logits, temperature))
        perf = fib.Performance(latency_ms=t * 1e3, reference_latency_ms=t_ref * 1e3, speedup_factor=speedup)
        ev = fib.Evaluation(status="PASSED", environment=env, timestamp=stamp, correctness=correctness,
                            performance=perf, log=f"max |p - ref| = {max_err:.3g} <= {allowed:.3g}")
    return fib.Trace(definition=TOY.name, workload=workload, solution=solution_name, evaluation=ev)


t0 = time.perf_counter()
TRACES = [trace_toy(s.name, RUNS[s.name], w) for w in TOY_WORKLOADS.values() for s in SOLUTIONS]
print(f"{len(TRACES)} traces in {time.perf_counter() - t0:.1f} s\n")
print(f"{'workload':12s}" + "".join(f"{s.name:>26s}" for s in SOLUTIONS))
for wname, w in TOY_WORKLOADS.items():
    cells = []
    for s in SOLUTIONS:
        t = next(t for t in TRACES if t.workload.uuid == w.uuid and t.solution == s.name)
        ev = t.evaluation
        p = ev.performance
        cells.append(f"{p.speedup_factor:.2f}x ({p.latency_ms:.2f} / {p.reference_latency_ms:.2f} ms)"
                     if ev.status.value == "PASSED" else ev.status.value)
    print(f"{wname:12s}" + "".join(f"{c:>26s}" for c in cells))

# %% [markdown]
# Each cell is a speedup over the float64 reference, measured on this CPU (in brackets the median times of
# the solution and of the reference in the same rounds), or the reason the trace failed. `exp_normalise` does the least work (in place, no max) and
# is the fastest wherever it passes; it fails on `b128_sharp`, where $x/\tau$ reaches a few hundred and
# $e^{x/\tau}$ overflows float32 to infinity (lecture 02's failure, here in float32). A failed trace
# keeps its errors and its log; the failed one, then a PASSED one in full:

# %%
failed = next(t for t in TRACES if t.evaluation.status.value != "PASSED")
passed = next(t for t in TRACES if t.evaluation.status.value == "PASSED")
print(failed.solution, WL_NAME[failed.workload.uuid], failed.evaluation.status.value, "|", failed.evaluation.log)
print(passed.model_dump_json(indent=1, exclude={"workload": {"inputs"}}))

# %% [markdown]
# A folder of definitions, solutions, workloads and traces in FlashInfer-Bench's layout is a trace set;
# `TraceSet.from_path` and `enable_apply` read it. `facourse.interchange.save_trace_set` writes one for
# any definition:

# %%
def write_set(traces, solutions=SOLUTIONS, definition=TOY):
    root = Path(tempfile.mkdtemp(prefix="traces_", dir=SCRATCH.name))
    return fx.save_trace_set(root, definition, solutions, list(TOY_WORKLOADS.values()), traces)


ROOT = write_set(TRACES)
for p in sorted(ROOT.rglob("*.json*")):
    print(p.relative_to(ROOT))
TS = fib.TraceSet.from_path(str(ROOT))
print(f"read back: {len(TS.definitions)} definition, {len(TS.solutions[TOY.name])} solutions, "
      f"{len(TS.traces[TOY.name])} traces")

# %% [markdown]
# ## 6. Runtime dispatch: what `apply()` does
#
# `enable_apply(root, config)` reads the trace set and builds a table (`apply/table.py`,
# `ApplyTable._build` and `_sweep_def`). Write $\kappa(w)$ for the **key** of a workload: the values of
# its var axes, sorted by name (`apply/key.py`: `AxesOnlyKeyBuilder`, the builder every `op_type` gets
# unless one is registered for it; `gemm`, `gqa` and `mla` are, and all three are the same axes-only
# builder). For each key,
#
# $$T[\kappa] = \underset{t\,:\ \kappa(t.\text{workload}) = \kappa,\ t \in \text{kept}}{\arg\max}\ t.\text{speedup\_factor},
#   \qquad \text{kept} = \{t : \text{status PASSED},\ \text{abs err} \le \text{max\_atol},\ \text{rel err} \le \text{max\_rtol}\}$$
#
# (`TraceSet.filter_traces` in `data/trace_set.py` keeps the PASSED traces within both tolerances; a later
# trace replaces the one held only when its speedup is strictly higher, so a tie keeps the first read).
# A call builds its key from its own tensors (section 2) and runs $T[\kappa]$; when the key is not in the
# table, the **miss policy** decides (`apply/runtime.py`, `ApplyRuntime.dispatch`): `"fallback_only"`
# calls the `fallback` passed to `apply()`, `"use_def_best"` the solution that holds the most keys of
# the table. With neither a solution nor a fallback, `apply()` raises. The config's defaults
# (`apply/config.py`) are `max_atol = 1e-2`, `max_rtol = 1e-5`, `aot_ratio = 1.0`,
# `on_miss_policy = "fallback_only"`; `enable_apply(root)` without a config uses them
# (`apply/presets.py`).
#
# A small serving function for the toy, and a fallback that counts its calls:

# %%
FALLBACK_CALLS = [0]


def fallback(logits, temperature):
    FALLBACK_CALLS[0] += 1
    return REFERENCE(logits, temperature)


def serve(root, config):
    """Enable apply() on the trace set in root; returns (runtime, softmax routed through apply())."""
    runtime = fib.enable_apply(str(root), config)

    def softmax(logits, temperature):
        return fib.apply(TOY.name, args=(logits, temperature), fallback=fallback)

    return runtime, softmax


KEYER = ApplyKeyFactory.specialize(TOY)


def route_all(runtime, softmax, calls):
    """Call softmax on each (name, batch, temperature); print what served it and whether it passed."""
    for name, batch, temperature in calls:
        logits, t = toy_inputs(toy_workload(name, batch, temperature), seed=1)
        key = KEYER.build_from_args((logits, t))
        chosen = runtime._table.match_solution(TOY.name, key)      # the table's entry (read here to show it)
        before = FALLBACK_CALLS[0]
        probs = softmax(logits, t)
        who = "fallback" if FALLBACK_CALLS[0] > before else (chosen or runtime._table.def_best.get(TOY.name))
        ok = toy_check(probs, logits, t)[0]
        print(f"  batch {batch:4d}, temperature {t:5.2f}  key {dict(key.axes)} -> {who:18s} "
              f"{'passes' if ok else 'FAILS the check'}")


CALLS = [("b16", 16, 1.0), ("b128", 128, 1.0), ("b128_sharp", 128, 0.02), ("b512", 512, 1.0)]

# %% [markdown]
# ### The default tolerances drop every float16 trace
#
# The relative error a trace records is a property of the dtype: float16 keeps 11 significant bits, so a
# correct float16 result is off by about $2^{-11} \approx 5 \cdot 10^{-4}$ relative, fifty times the default
# `max_rtol`. With the defaults, nothing is kept, the table is empty, and every call falls back:

# %%
default = fib.ApplyConfig()
kept = TS.filter_traces(TOY.name, default.max_atol, default.max_rtol)
print(f"default ApplyConfig: max_atol {default.max_atol}, max_rtol {default.max_rtol}, aot_ratio "
      f"{default.aot_ratio}, on_miss_policy {default.on_miss_policy!r}")
print(f"PASSED traces: {sum(t.evaluation.status.value == 'PASSED' for t in TRACES)}; kept by the defaults: "
      f"{len(kept)}; smallest relative error of a PASSED trace: "
      f"{min(t.evaluation.correctness.max_relative_error for t in TRACES if t.evaluation.status.value == 'PASSED'):.1e}")
rt, softmax = serve(ROOT, default)
route_all(rt, softmax, CALLS)
rt.stop()

# %% [markdown]
# FlashInfer-Bench's own benchmark records an elementwise relative error, $|x - y| / (|y| + 10^{-8})$
# (`bench/utils.py`, `compute_error_stats`), which is large wherever the reference is near zero; the
# traces here record the course's convention, $\max|p - \text{ref}| / \max|\text{ref}|$. Either way the
# tolerances must be chosen for the traces at hand. The status already says whether the check passed, so
# the tolerances only need to let every PASSED trace through: a probability is off by at most 1.
#
# ### The table, and what its key cannot see

# %%
LOOSE = fib.ApplyConfig(max_atol=1.0, max_rtol=1.0)
rt, softmax = serve(ROOT, LOOSE)
print("table:", {str(dict(k.axes)): s for k, s in rt._table.index[TOY.name].items()},
      "  def_best:", rt._table.def_best.get(TOY.name))
route_all(rt, softmax, CALLS)
rt.stop()

# %% [markdown]
# `b128` and `b128_sharp` have one key, `{'batch': 128}`: the temperature is a scalar input, and the key
# holds only var axes. The table holds the fastest PASSED trace of that key, `exp_normalise`'s on `b128`;
# its failed trace on `b128_sharp` was simply dropped by the filter. So every call with 128 rows goes to
# it, and at $\tau = 0.02$ it returns NaN. Tracing every solution on both workloads did not prevent this:
# the table never compares a solution's traces across workloads of one key.
#
# Attention has the same hole. Its scalar input is `causal`, and two of the course's workloads are one
# key:

# %%
for w in fx.workloads("gpu"):
    print(f"{fx.describe_workload(w):70s} key {dict(sorted(w.axes.items()))}")

# %% [markdown]
# `medium` and `noncausal` share a key. A kernel that is right and fast on causal calls but wrong on
# non-causal ones (a mask applied when it should not be, say) would be routed every non-causal call of
# that shape. Two ways out: keep the scalar out of the problem (one definition per value of the flag, so
# that each has its own table), or make sure no solution holds a key on which it failed. The second,
# applied to the toy before the table is built:

# %%
def key_of(workload):
    return KEYER.build_from_workload(workload)


failed_on = {(t.solution, key_of(t.workload)) for t in TRACES if t.evaluation.status.value != "PASSED"}
SAFE_TRACES = [t for t in TRACES if (t.solution, key_of(t.workload)) not in failed_on]
print("dropped:", sorted({(s, str(dict(k.axes))) for s, k in failed_on}))
ROOT_SAFE = write_set(SAFE_TRACES)
rt, softmax = serve(ROOT_SAFE, LOOSE)
print("table:", {str(dict(k.axes)): s for k, s in rt._table.index[TOY.name].items()})
route_all(rt, softmax, CALLS)
rt.stop()

# %% [markdown]
# ### A key the table does not hold
#
# A call with 48 rows has no trace at all. `"fallback_only"` sends it to the fallback; `"use_def_best"` to
# the solution that holds the most keys of the table (`def_best` above), which was never run on 48 rows:

# %%
MISSES = [("b48", 48, 1.0), ("b48_sharp", 48, 0.02)]
for policy in ("fallback_only", "use_def_best"):
    print(f"on_miss_policy = {policy!r}")
    rt, softmax = serve(ROOT, fib.ApplyConfig(max_atol=1.0, max_rtol=1.0, on_miss_policy=policy))
    route_all(rt, softmax, MISSES)
    rt.stop()

# %% [markdown]
# ### A solution that does not build here
#
# A trace set is usually measured on one machine and deployed on another. Suppose it holds a TileLang
# solution that PASSED on the GPU machine, and it is deployed on a machine without that GPU. The solution
# below stands in for such a kernel: like a TileLang kernel compiled for sm_90a when its module is
# imported, its module refuses a machine without a Hopper GPU. Where TileLang is installed (the course's
# environment), `TileLangBuilder` imports the module and the import fails; where it is absent, no builder
# takes the solution. Either way `BuilderRegistry.build` raises `BuildError` (`compile/registry.py`) and
# remembers the failure. Where the dispatcher builds, it does not catch that error:
#
# - `enable_apply` builds the table's solutions ahead of time when `aot_ratio > 0` (the default 1.0 builds
#   every solution that holds a key; `ApplyTable._prewarm_aot` in `apply/table.py`), so it raises there;
# - with `aot_ratio = 0` it starts, and the first call whose key names that solution raises from
#   `ApplyRuntime.dispatch` (`apply/runtime.py`): the fallback is used only when no solution is found,
#   not when the one found cannot be built.
#
# The trace below is written by hand to show this: its numbers are zeros, not a measurement.

# %%
TILELANG_SOLUTION = Solution(
    name="softmax_tilelang_sm90", definition=TOY.name, author="lecture 11",
    spec=BuildSpec(language="tilelang", target_hardware=["NVIDIA H100"], entry_point="main.py::run",
                   destination_passing_style=False),
    sources=[SourceFile(path="main.py", content=(
        "import torch\n\n"
        "if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):\n"
        "    raise RuntimeError('this kernel is compiled for sm_90a when it is imported: no Hopper GPU here')\n\n\n"
        "def run(logits, temperature):\n"
        "    return torch.softmax(logits / temperature, dim=-1)\n"))])
HAND_WRITTEN = fib.Trace(
    definition=TOY.name, workload=TOY_WORKLOADS["b128"], solution=TILELANG_SOLUTION.name,
    evaluation=fib.Evaluation(status="PASSED", environment=fib.Environment(hardware="(hand-written, not measured)"),
                              timestamp="2026-01-01T00:00:00+00:00", log="hand-written for lecture 11",
                              correctness=fib.Correctness(), performance=fib.Performance()))
ROOT_GPU = write_set([HAND_WRITTEN], solutions=[TILELANG_SOLUTION])

if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
    print("This machine has the Hopper GPU the solution was built for: it builds here, so this example does "
          "not show a failed build. Run it on a CPU to see one.")
else:
    print("TileLang installed:", importlib.util.find_spec("tilelang") is not None)
    for aot_ratio in (1.0, 0.0):
        try:
            rt, softmax = serve(ROOT_GPU, fib.ApplyConfig(max_atol=1.0, max_rtol=1.0, aot_ratio=aot_ratio))
        except Exception as e:
            print(f"aot_ratio {aot_ratio}: enable_apply raised {type(e).__name__}: {e}")
            continue
        try:
            FALLBACK_CALLS[0] = 0
            softmax(*toy_inputs(TOY_WORKLOADS["b16"]))          # key {batch: 16}: not in the table
            print(f"aot_ratio {aot_ratio}: enable_apply started; batch 16 (no entry) -> fallback calls "
                  f"{FALLBACK_CALLS[0]}")
            softmax(*toy_inputs(TOY_WORKLOADS["b128"]))         # key {batch: 128}: the TileLang solution
        except Exception as e:
            print(f"  batch 128 (the TileLang solution's key) raised {type(e).__name__}: {e}; "
                  f"fallback calls still {FALLBACK_CALLS[0]}")
        finally:
            rt.stop()

# %% [markdown]
# A key without an entry falls back; a key whose entry cannot be built raises. So **a solution that
# cannot be built where the table is deployed must not hold a key there.** Its traces must say so, with a
# status that is not PASSED, so that the filter drops them; and a trace set measured on one machine says
# nothing about which of its solutions build on another.
#
# ### A speedup is a ratio to a reference timed per trace
#
# `speedup_factor` is $t_\text{ref} / t_\text{solution}$, and $t_\text{ref}$ was timed again for every trace.
# The table compares speedups across traces, so the reference's own spread between timings enters the
# choice. On this CPU, the reference's times for one workload, one per trace:

# %%
for wname, w in TOY_WORKLOADS.items():
    refs = [t.evaluation.performance.reference_latency_ms for t in TRACES
            if t.workload.uuid == w.uuid and t.evaluation.status.value == "PASSED"]
    if len(refs) > 1:
        print(f"{wname:11s} reference {min(refs):.3f} - {max(refs):.3f} ms over {len(refs)} traces "
              f"(spread {max(refs) / min(refs) - 1:.1%})")

# %% [markdown]
# When two solutions are closer than that spread, the table's choice between them is a coin toss: on
# `asymmetric` the Hopper and TileLang kernels are within 1 % of each other on an H100, and with a
# reference time of its own per trace `apply()` can pick the slower of the two. So before `apply()`
# reads a workload's traces, the course's runner gives them one reference time, the median of theirs
# (`benchmarks/traces.py` and `benchmarks/README.md`, step 11, in the course repository).
#
# ## 7. Which backend wins where (H100)
#
# The course's four solution kernels were traced as FlashInfer-Bench solutions of the attention
# definition on an H100 (the seed's five workloads and `long`, fp16, Hq 32, Hkv 8, D 128), deployed with
# `apply()`, and re-timed. The figure puts those traces (left) next to each kernel's own ladder run in the
# course's `[B, H, S, D]` layout (right); a blank cell was not measured.
#
# ![Speed relative to SDPA's FlashAttention-2 of the Triton, CUDA, Hopper and TileLang kernels per configuration on an H100](../diagrams/backend_heatmap.png)
#
# The traces themselves, from `course/results/measured.json` (a copy of the course's benchmark results):

# %%
TR = results.show("11_traces", results.traces_table, results.traces_header)
if TR:
    print("per workload, the fastest trace and its lead over the next:")
    for w in dict.fromkeys(r["workload"] for r in TR["traces"]):
        rs = sorted((r for r in TR["traces"] if r["workload"] == w and r["status"] == "PASSED"),
                    key=lambda r: -r["speedup"])
        lead = rs[0]["speedup"] / rs[1]["speedup"] - 1 if len(rs) > 1 else float("nan")
        print(f"  {w:11s} {rs[0]['solution']:9s} {rs[0]['speedup']:.2f}x FA2, {lead:+.1%} over "
              f"{rs[1]['solution'] if len(rs) > 1 else '-'}; slowest {rs[-1]['solution']} {rs[-1]['speedup']:.2f}x")

# %% [markdown]
# How to read it:
#
# - On the large shapes (`large`, `long`, `medium`, `noncausal`) the hand-written Hopper kernel of step 07
#   is the fastest: the ping-pong and intra-warpgroup overlap of FlashAttention-3 are what the other
#   three lack. The TileLang kernel is next on most of them, without any of the hand-written Hopper code.
# - On `small` (one batch, 128 rows: about ten microseconds) every kernel is bound by its launch, and the
#   order changes from one timing to the next; the table's choice there is worth little either way.
# - On `asymmetric` (128 queries against 2048 keys) SDPA has no bottom-right causal FlashAttention, so the
#   reference is a slower backend and every ratio is large; between the Hopper and TileLang kernels the
#   margin is within the reference's spread (section 6), and the runner's re-timing decides.
# - The `mma.sync` kernel of step 06 is the slowest of the four on the large shapes of an H100, and the
#   only one of the two CUDA kernels that runs on an A100. On an A100 the Hopper and TileLang solutions
#   would fail to build, and by section 6 a table measured on the H100 would then raise, not fall back:
#   a trace set belongs to the machine it was measured on.
#
# ## Summary
#
# - Interchangeable kernels implement one **definition**: var axes (read from each call's tensors), const
#   axes and dtypes (promises, never checked at call time), inputs in calling order, scalar inputs, and a
#   reference that gives the operator its meaning.
# - Triton, TileLang and CUDA differ in who decides: Triton's compiler chooses where tiles live and how they
#   are pipelined; TileLang has you name shared and fragment buffers and copies, and on Hopper lowers
#   `T.copy` to TMA, `T.gemm` to WGMMA and `T.Pipelined` to a warp-specialised pipeline; in CUDA you write
#   all of it. The course's TileLang FlashAttention measured 1.48x FA2 on `large` and 1.60x on `long`.
# - A **trace** records one solution on one workload: PASSED with errors and speed, or why not.
# - `apply()` keys calls on the **var axes only**; it keeps **PASSED** traces within `max_atol` and
#   `max_rtol` and picks the **highest speedup_factor** per key. A scalar input such as `causal` or a
#   temperature is not in the key: a solution that failed on one workload can serve another of the same
#   key. The default `max_rtol = 1e-5` drops every float16 trace. On a miss, `"fallback_only"` calls the
#   fallback and `"use_def_best"` a solution never checked on that shape. A table solution that does not
#   build raises, at `enable_apply` or at the call, instead of falling back.
# - On an H100 the hand-written Hopper kernel wins the large shapes; small shapes are launch-bound.
#
# **Next:** exercise 11 writes the attention definition, traces solutions of it (including ones that fail
# to build or to run) and deploys them with `apply()`, checked by `facourse.interchange` on a CPU.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
