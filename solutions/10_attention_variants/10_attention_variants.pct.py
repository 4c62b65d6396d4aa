# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Without a GPU, Triton's interpreter runs the kernels on the CPU (in NumPy). It must be switched
# on BEFORE triton is imported, so this cell comes first.
import math
import os

import torch

from facourse.triton_setup import interpret_without_gpu, validate_triton_inputs

interpret_without_gpu()

import triton
import triton.language as tl

from facourse.variants import (VARIANT_CASES, BlockMask, Mod, alibi, causal, check_block_mask, check_tile_lists,
                               check_variant, documents, index_grids, lists_of, no_mask, no_score_mod, prefix_lm,
                               sliding_window, softcap)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 10 — attention variants: a mask function, a score modifier and a block mask in Triton
#
# You will write the kernel of `course/10_attention_variants.ipynb`, section 6, in Triton: a function
#
# `flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None) -> (o, lse)`
#
# that computes, for every batch $b$, query head $h$, query $i$ and key $j$ with $s_{ij} = \text{scale}\cdot q_i\cdot k_j$,
#
# $$\tilde s_{ij} = \begin{cases}\text{score\_mod}(s_{ij}, b, h, i, j) & \text{if mask}(b, h, i, j)\\ -\infty & \text{otherwise}\end{cases},
# \qquad o_i = \sum_j \operatorname{softmax}(\tilde s_i)_j\, v_j, \qquad \text{lse}_i = \log\sum_j e^{\tilde s_{ij}},$$
#
# visiting only the key tiles a **block mask** lists, and the builder of that block mask.
#
# **The contract.** `q` is `[B, Hq, Sq, D]`, `k` and `v` are `[B, Hkv, Skv, D]` (any strides with
# `stride(-1) == 1`); query head `h` reads KV head `h // (Hq // Hkv)`; `scale` defaults to `1/sqrt(D)`; a
# row that sees no key gives `o = 0` and `lse = -inf`, never NaN; `o` has `q`'s dtype, `lse` is float32
# `[B, Hq, Sq]` (natural log). `mask` and `score_mod` are `facourse.variants.Mod` objects (or None: every
# pair visible, no modifier): `mod.fn` is a Triton function with the signature
#
# ```
# mask(b, h, i, j, Sq, Skv, INTS, FLOATS) -> bool block        score_mod(s, b, h, i, j, Sq, Skv, INTS, FLOATS) -> s
# ```
#
# called on a tile: `i` is a `[BLOCK_M, 1]` block of query indices, `j` a `[1, BLOCK_N]` block of key
# indices, `s` the `[BLOCK_M, BLOCK_N]` logits in natural units; `mod.args(device)` gives the two tensors
# to pass as `INTS` and `FLOATS` (a window, ALiBi's slopes, a cap, the document of every token). Pass
# `mod.fn` to the kernel as a `tl.constexpr` argument and call it like any Triton function. The course's
# mods: `causal`, `sliding_window(W, Sq, Skv)`, `documents(doc_ids)`, `prefix_lm(lens, Sq, Skv)`,
# `alibi(Hq, Sq, Skv)`, `softcap(cap)`; each also has its PyTorch twin, `mod.ref`, used by the checks
# (the graded builder gets a twin that answers one pair only: classify the tiles with `mod.fn`).
#
# **The block mask** (`facourse.variants.BlockMask`, FlexAttention's idea in our names): for each query
# tile of each (batch, head), the number and the indices of its **partial** key tiles (some pairs visible:
# the mask function applies) and of its **full** ones (every pair visible: no mask function); empty
# tiles are in neither list and are never loaded. Its first two dimensions are `B` and `Hq`, or 1 where
# the mask reads neither `b` nor `h` (one list shared by all; read row 0). When a block mask is given,
# your kernel must visit exactly its tiles, even one that disagrees with the mask (a hidden test gives
# one with tiles removed and classes swapped, and checks that you computed what its lists say: that is
# how the grader sees that empty tiles are skipped, without timing anything).
#
# **What is graded** (22 points): the block-mask builder on a window, documents, a prefix-LM and no mask
# (2); causal, with Sq ≠ Skv and a scale of 0.05 (2); sliding windows (2); a window of 1, a window wider
# than the sequence and rows that see no key (2); ALiBi (1); soft-capping, alone and with a window and
# ALiBi (2); documents packed in a row, with ALiBi, documents of length 1, D = 64 (2); prefix-LM and MQA
# (1); a changed block mask followed tile by tile (2); bf16 (2, GPU); speed (4, GPU): a 1024-token sliding
# window at 8k and 16k tokens (B·S = 32k, 16 heads, D = 128, fp16) against PyTorch's FlexAttention
# compiled on the same mask, in TFLOP/s of visible pairs, half the points at a `min` fraction of its
# speed and all at a `target` (the instructor's thresholds file sets both). Every result by the
# course's rule: no worse than twice PyTorch's own error in the same dtype (+1e-3), relative error below
# 1%. While graded your functions may not call PyTorch's attention or its matrix products. Without a GPU
# the kernels run in Triton's interpreter at CPU sizes (float32), and the GPU cells score 0.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_classes", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: classify the tiles
#
# Program `(t, b * H + h)` classifies the key tiles of query tile `t` of batch `b` and head `h`: for
# each key tile `u` it evaluates the mask on the tile's `BLOCK_M x BLOCK_N` pairs (query indices
# `t * BLOCK_M + tl.arange(0, BLOCK_M)`, key indices `u * BLOCK_N + tl.arange(0, BLOCK_N)`), counts the
# visible ones and stores the tile's class in `CLASSES[b, h, t, u]` (int8): `FULL` when every pair is
# visible, `PARTIAL` when some are, `EMPTY` when none is. A pair past `Sq` or past `Skv` (the padding of
# the last tiles) is never visible: a tile that reaches past the end is at most partial.

# %% nbgrader={"grade": false, "grade_id": "classes_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
EMPTY, PARTIAL, FULL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)   # tile classes (constexpr: a kernel reads them)


@triton.jit
def tile_classes_kernel(CLASSES, INTS, FLOATS, H, Sq, Skv, Tk, mask: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    i = t * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]            # query indices [BLOCK_M, 1]
    row = CLASSES + (bh * tl.num_programs(0) + t).to(tl.int64) * Tk
    # YOUR CODE HERE
    ### BEGIN SOLUTION
    for u in range(0, Tk):
        j = u * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]        # key indices [1, BLOCK_N]
        visible = mask(b, h, i, j, Sq, Skv, INTS, FLOATS) & (i < Sq) & (j < Skv)
        n = tl.sum(visible.to(tl.int32))
        tl.store(row + u, tl.where(n == BLOCK_M * BLOCK_N, FULL, tl.where(n > 0, PARTIAL, EMPTY)).to(tl.int8))
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "builder_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The builder (given), `build_block_mask(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device)`, launches your kernel and turns the classes into the two lists with
# `facourse.variants.lists_of` (per query tile: the tiles of the class first, in increasing order). It
# evaluates the mask for one batch and one head when the mask reads neither: `mask_extent` asks the
# mask's PyTorch twin on a single pair which of `b` and `h` change its value's shape.

# %% nbgrader={"grade": false, "grade_id": "builder", "locked": true, "schema_version": 3, "solution": false, "task": false}
def mask_extent(mask, B, H):
    """(B or 1, H or 1): whether the mask reads b and h (its PyTorch twin's broadcast shape)."""
    shape = mask.ref(*index_grids(B, H, 1, 1)).shape
    return (B if shape[0] > 1 else 1), (H if shape[1] > 1 else 1)


def build_block_mask(mask, B, H, Sq, Skv, BLOCK_M=128, BLOCK_N=64, device=None):
    """The BlockMask of ``mask`` (None: every pair visible) for tiles of BLOCK_M x BLOCK_N."""
    mask = no_mask() if mask is None else mask
    Bm, Hm = mask_extent(mask, B, H)
    Tq, Tk = triton.cdiv(Sq, BLOCK_M), triton.cdiv(Skv, BLOCK_N)
    classes = torch.zeros(Bm, Hm, Tq, Tk, dtype=torch.int8, device=device)
    if classes.numel():
        tile_classes_kernel[(Tq, Bm * Hm)](classes, *mask.args(device), Hm, Sq, Skv, Tk, mask.fn,
                                           BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return lists_of(classes, BLOCK_M, BLOCK_N, Sq, Skv)

# %% nbgrader={"grade": true, "grade_id": "test_block_mask", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_block_mask(build_block_mask, "window_ragged")   # a window of 37 on 200 x 333: every kind of tile
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_block_mask", build_block_mask)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: the kernel
#
# One program per (query tile, `b * Hq + h`), lecture 05's loop with two changes. It walks two lists
# instead of a range: first the query tile's partial key tiles (`PARTIAL_IDX[row, :PARTIAL_NUM[row]]`),
# then its full ones; `row` is the query tile's row of the block mask, `(b % Bm) * Hm + h % Hm` times the
# number of query tiles, plus the tile. And on each tile it computes the logits in natural units,
# applies the score modifier, then, on partial tiles only, the mask (and the bounds `j < Skv` on every
# tile), and only then converts to base 2 for `exp2`:
#
# `s = score_mod(scale * q·kᵀ)`, `s = where(mask & (j < Skv), s · log2(e), -inf)`, then the online-softmax update.
#
# Write one tile's work as `attend_tile` (its `PARTIAL` switch says whether the mask applies) and call it
# from both loops. Keep lecture 05's guards: a row whose max is still `-inf` uses 0 in its place, and
# `l = 0` at the end means `o = 0`, `lse = -inf`.

# %% nbgrader={"grade": false, "grade_id": "kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv, scale,
                MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask: tl.constexpr, score_mod: tl.constexpr,
                PARTIAL: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile: S, the score modifier, (partial tiles:) the mask, the online-softmax update."""
    # YOUR CODE HERE
    ### BEGIN SOLUTION
    jv = start_n + tl.arange(0, BLOCK_N)[:, None]                   # key indices [BLOCK_N, 1] for V_j
    j = start_n + tl.arange(0, BLOCK_N)[None, :]                    # and [1, BLOCK_N] for K_j^T and S
    d = tl.arange(0, D)
    kT = tl.load(k_base + j * sks + d[:, None], mask=j < Skv, other=0.0)      # K_j^T [D, BLOCK_N]
    v = tl.load(v_base + jv * svs + d[None, :], mask=jv < Skv, other=0.0)     # V_j [BLOCK_N, D]
    s = tl.dot(q, kT) * scale                                       # natural units for score_mod
    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)  # first the score modifier
    keep = j < Skv
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)  # then the mask
    s = tl.where(keep, s * 1.4426950408889634, float("-inf"))      # log2 units for exp2
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)            # a row that has seen no key yet
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])            # O_i = alpha O_i + P_ij V_j
    return acc, m_new, l_i
    ### END SOLUTION


@triton.jit
def flex_fwd(Q, K, V, O, LSE, PARTIAL_NUM, PARTIAL_IDX, FULL_NUM, FULL_IDX, Bm, Hm,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, Hq, Sq, Skv, scale,
             mask: tl.constexpr, score_mod: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]           # query indices [BLOCK_M, 1]
    d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i * sqs + d[None, :], mask=i < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + (h // GROUP).to(tl.int64) * skh   # GQA: KV head h // GROUP
    v_base = V + b.to(tl.int64) * svb + (h // GROUP).to(tl.int64) * svh
    row = ((b % Bm) * Hm + h % Hm) * tl.cdiv(Sq, BLOCK_M) + pid_m    # this query tile's row of the lists
    Tk = tl.cdiv(Skv, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # YOUR CODE HERE: the loop over the partial tiles, the loop over the full tiles, o and lse
    ### BEGIN SOLUTION
    for t in range(0, tl.load(PARTIAL_NUM + row)):                  # partial tiles: the mask applies
        start_n = tl.load(PARTIAL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv,
                                    scale, MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    True, D, BLOCK_N)
    for t in range(0, tl.load(FULL_NUM + row)):                     # full tiles: no mask function
        start_n = tl.load(FULL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv,
                                    scale, MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    False, D, BLOCK_N)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                         # a row with no key: o = 0, lse = -inf
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i * sos + d[None, :],
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=i < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_launch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 3: the launch
#
# `flex_attention_triton` checks its inputs (given), replaces a missing mask or score modifier by
# `no_mask()` / `no_score_mod()`, allocates `o` and `lse`, builds the block mask for its own tiles when
# none is given, and launches `flex_fwd` with one program per (query tile, `b * Hq + h`) and the block
# mask's own tile sizes. `BlockMask.kernel_args(B, Hq, Sq, Skv)` checks that a block mask fits the call
# and returns its lists and `Bm`, `Hm` as the kernel reads them.

# %% nbgrader={"grade": false, "grade_id": "launch", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Tiles of 64 x 64 when the kernel builds its own block mask (a tuned kernel picks them per shape);
# on a GPU, 8 warps for tiles of 128 x 64 or more (two warpgroups share the tile's rows).
BLOCK_M, BLOCK_N = 64, 64


def launch_options(block_m, block_n):
    return {} if INTERPRET else {"num_warps": 8 if block_m * block_n >= 8192 else 4, "num_stages": 3}


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """(o, lse) of attention with a mask and a score modifier, visiting only the listed tiles."""
    validate_triton_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    # YOUR CODE HERE
    ### BEGIN SOLUTION
    mask = no_mask() if mask is None else mask
    score_mod = no_score_mod() if score_mod is None else score_mod
    o = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full((B, Hq, Sq), -math.inf, device=q.device, dtype=torch.float32)
    if Sq == 0 or Skv == 0:                                         # no key at all: every row is empty
        return o, lse
    if block_mask is None:
        block_mask = build_block_mask(mask, B, Hq, Sq, Skv, BLOCK_M, BLOCK_N, q.device)
    grid = (triton.cdiv(Sq, block_mask.BLOCK_M), B * Hq)
    flex_fwd[grid](q, k, v, o, lse, *block_mask.kernel_args(B, Hq, Sq, Skv),
                   *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   *mask.args(q.device), *score_mod.args(q.device), Hq, Sq, Skv, scale,
                   mask.fn, score_mod.fn, Hq // Hkv, D, block_mask.BLOCK_M, block_mask.BLOCK_N,
                   **launch_options(block_mask.BLOCK_M, block_mask.BLOCK_N))
    return o, lse
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_variant(fn, case)` draws the inputs of one of the course's cases (`VARIANT_CASES`: a
# configuration's shape, a mask, a score modifier), calls your function and checks `(o, lse)` against a
# float64 reference. A failure names the rows that are wrong and the likely cause: the window off by
# one, ALiBi's slopes, the soft cap after the mask, a partial tile treated as full, documents leaking
# into each other. In the interpreter a case takes seconds.

# %% nbgrader={"grade": true, "grade_id": "test_causal", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_variant(flex_attention_triton, "causal")        # lecture 05's causal attention, as a mask function
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_causal", flex_attention_triton)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same names yourself, for instance
# `check_variant(flex_attention_triton, "documents_alibi")`; the cases are the keys of `VARIANT_CASES`,
# and `check_tile_lists(flex_attention_triton, "window")` is the changed-block-mask test.

# %% nbgrader={"grade": true, "grade_id": "test_window", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: sliding windows on medium and on ragged lengths (Sq != Skv)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_window", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_window_edges", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: a window of 1, a window wider than the sequence, rows that see no key
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_window_edges", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_alibi", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: ALiBi with causal on large
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_alibi", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_softcap", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: soft-capping alone (also on ragged lengths, no mask), with a window, and capped then ALiBi with a window
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_softcap", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_documents", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: documents packed in a row (some of length 1), with ALiBi, and with D = 64
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_documents", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_prefix", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: prefix-LM with Sq != Skv, and a window with one KV head (MQA)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_prefix", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_tile_lists", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: a block mask with tiles removed and classes swapped: visit exactly its tiles
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_tile_lists", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: bf16 on a window, documents with ALiBi, and capped ALiBi with a window (GPU only)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", flex_attention_triton)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "perf_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Speed (graded on a GPU)
#
# A sliding window of 1024 tokens at 8k and 16k: most key tiles of a query tile are empty, and the few
# that are not are mostly full. The cells time your kernel against PyTorch's FlexAttention, compiled
# (`torch.compile(flex_attention)` on the same mask, its block mask built once), same process,
# interleaved rounds, L2 flushed, median of 25, GPU time; TFLOP/s count visible pairs only. Try it on a
# GPU: `facourse.variants.bench_variant(flex_attention_triton, "window1024_8k").summary()`.

# %% nbgrader={"grade": true, "grade_id": "perf_window1024_8k", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: 4 x 16 heads x 8192 tokens, window 1024, D = 128, fp16
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_window1024_8k", flex_attention_triton)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_window1024_16k", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: 2 x 16 heads x 16384 tokens, window 1024, D = 128, fp16
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_window1024_16k", flex_attention_triton)
### END HIDDEN TESTS
