# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Without a GPU, Triton's interpreter runs the kernels on the CPU (in NumPy). It must be switched
# on BEFORE triton is imported, so this cell comes first.
import os

import torch

from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()

import math

import triton
import triton.language as tl

from facourse import validate_inputs
from facourse.backward import check_gradients, gradcheck

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 08 — the backward pass of FlashAttention-2 in Triton
#
# You will write the backward pass of `course/08_backward.ipynb` and make attention trainable: a
# function `flash_attention_train(q, k, v, causal=False, scale=None) -> o` whose output supports
# `o.backward(dO)`. The forward is given (it returns `o` and the row log-sum-exp `lse`); you write
# the three kernels of the backward and the `torch.autograd.Function` that joins them. With
# $P = \operatorname{softmax}(\text{scale}\cdot QK^\top + \text{mask})$ rebuilt tile by tile from the
# forward's `lse` (FlashAttention-2, Dao 2023, Algorithm 2):
#
# $$P_{ij} = e^{\text{scale}\cdot Q_i K_j^\top - \text{lse}_i},\quad dV_j = \sum_i P_{ij}^\top dO_i,\quad
# dP_{ij} = dO_i V_j^\top,\quad dS_{ij} = P_{ij}\circ(dP_{ij} - D_i),\quad D_i = \operatorname{rowsum}(dO_i\circ O_i)$$
#
# $$dQ_i = \text{scale}\sum_j dS_{ij} K_j,\qquad dK_j = \text{scale}\sum_i dS_{ij}^\top Q_i .$$
#
# **The contract** (every step of the course): `q` is `[B, Hq, Sq, D]`, `k`, `v` are `[B, Hkv, Skv, D]`,
# any strides with `stride(-1) == 1` (and so is `dO`); query head `h` reads KV head `h // (Hq // Hkv)`,
# so `dK` and `dV` of a KV head are sums over the `Hq // Hkv` query heads that read it; `causal=True`
# is bottom-right aligned (key `j` visible to query `i` iff `j <= i + (Skv - Sq)`); a row that sees no
# key has `o = 0`, `lse = -inf`, and zero gradients, never NaN. Gradients have their input's dtype
# and shape. D is 64 or 128. The forward may keep only O(N) state for the backward: `q, k, v, o`
# and `lse` (not `P`: that is the point of recomputation, and it is checked).
#
# **What is graded** (16 points): gradients of `q`, `k` and `v` (12 points) on `small` (visible), the
# hidden `medium`, `large`, `noncausal`, `asymmetric`, edge cases (ragged lengths, decode `Sq = 1`,
# empty rows `Sq > Skv`, D = 64 and MQA, logits large enough to overflow), a finite-difference
# gradient check, and bf16 (on a GPU); each gradient by the course's rule: no worse than twice
# PyTorch's own error in the same dtype, relative error below 1%, against a float64 reference.
# Speed (4 points, on a GPU only): your backward's time on `large` and on `long` (B=2, H=16,
# S=8192, non-causal) against the backward of PyTorch SDPA's FlashAttention-2 backend on the same
# GPU: half the points at a `min` fraction of its speed, all at a `target` (the instructor's
# thresholds file sets both; your graded result states them). While graded, your functions may not
# call PyTorch's attention or its matrix products (`@`, `torch.matmul`, ...): the products are
# `tl.dot`s in your kernels. Without a GPU the kernels run in Triton's interpreter on the CPU
# sizes of the configurations (in float32), and the speed cells score 0.

# %% nbgrader={"grade": false, "grade_id": "forward", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Given: the forward (step 05's algorithm, kept plain: every key tile it visits is masked). It
# returns o and lse_i = log sum_j exp(scale * q_i . k_j), the one number per row that the backward
# needs to rebuild P. Nothing to write here; you may paste your own step-05 kernel instead.
@triton.jit
def attn_fwd(Q, K, V, O, LSE, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             Hq, Sq, Skv, qk_scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    b, h = tl.program_id(2), tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                mask=offs_m[:, None] < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + (h // GROUP) * skh
    v_base = V + b.to(tl.int64) * svb + (h // GROUP) * svh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)      # running max, log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    off = Skv - Sq
    hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), Skv) if CAUSAL else Skv
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None] * sks + offs_d[None, :], mask=offs_n[:, None] < Skv, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * svs + offs_d[None, :], mask=offs_n[:, None] < Skv, other=0.0)
        keep = offs_n[None, :] < Skv
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + off)
        s = tl.where(keep, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :],
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < Sq)
    tl.store(LSE + (b * Hq + h).to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)


LOG2E = 1.4426950408889634
# Tile sizes: bigger in the interpreter, where fewer and larger NumPy operations run faster.
FWD_TILES = (256, 256, {}) if INTERPRET else (128, 64, {"num_warps": 8, "num_stages": 3})


def attention_forward(q, k, v, causal=False, scale=None):
    """(o, lse): o like q (contiguous), lse float32 [B, Hq, Sq] in natural log, -inf for empty rows."""
    validate_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    BLOCK_M, BLOCK_N, launch = FWD_TILES
    attn_fwd[(triton.cdiv(Sq, BLOCK_M), Hq, B)](
        q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        Hq, Sq, Skv, scale * LOG2E, GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return o, lse

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_preprocess", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: D, the preprocess
#
# $dS = P\circ(dP - D)$ needs, for every query row, $D_i = \sum_d dO_{id}\, O_{id}$ (it equals
# $\sum_j P_{ij} dP_{ij}$, the softmax's own correction, but costs one pass over `O` and `dO`
# instead of one over all keys). One program per (query tile, batch x head); accumulate in fp32 and
# write `Delta[b, h, i]` (a contiguous `[B, Hq, Sq]` float32 tensor). Mask the rows past `Sq`.

# %% nbgrader={"grade": false, "grade_id": "preprocess", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def bwd_preprocess(O, DO, Delta, sob, soh, sos, sdob, sdoh, sdos, Hq, Sq,
                   D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d], in fp32. Grid: (query tiles, B * Hq)."""
    # YOUR CODE HERE (about 10 lines)
    ### BEGIN SOLUTION
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m[:, None] < Sq
    o = tl.load(O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], mask=rows, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :], mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh.to(tl.int64) * Sq + offs_m, delta, mask=offs_m < Sq)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_dkdv", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: dK and dV
#
# Both reductions of the backward run in different directions: $dK_j, dV_j$ sum over query rows $i$,
# $dQ_i$ sums over keys $j$. FlashAttention-2 gives each its own loop. This kernel is the outer loop
# over **key tiles**: one program per (key tile, KV head, batch) keeps $K_j$, $V_j$ and the fp32
# accumulators $dK_j$, $dV_j$ on chip and walks over the query tiles that can see its keys, for
# **every query head of its GQA group** (so the group's sum happens in registers, without atomics).
#
# `rebuild_p` is the piece both kernels share: the tile $P_{ij}$ from $S_{ij} = \text{scale}\cdot Q_i K_j^\top$
# and the forward's `lse`, zero where masked (out of bounds, or above the bottom-right causal diagonal)
# and zero for rows that see no key (`lse = -inf`: `exp(s - (-inf))` would be `inf`). Hints:
# 1. Causal: key tile `start_n` is first seen by query row `start_n - (Skv - Sq)`; start the loop at
#    that row's tile (rounded down to a multiple of `BLOCK_M`, never below 0): the tiles above are
#    all masked. That is the backward's causal tile skipping.
# 2. `tl.dot(tl.trans(p.to(do.dtype)), do)` is $P^\top dO$; convert to the input dtype before a `tl.dot`.
# 3. The scale of $dK$ can be applied once, after the loop.

# %% nbgrader={"grade": false, "grade_id": "dkdv", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def rebuild_p(q, k, lse, offs_m, offs_n, Sq, Skv, scale, CAUSAL: tl.constexpr):
    """P_ij = exp(scale * q k^T - lse_i), 0 where masked and for rows with lse = -inf."""
    # YOUR CODE HERE (about 7 lines)
    ### BEGIN SOLUTION
    lse = tl.where(lse == float("-inf"), float("inf"), lse)      # empty rows: exp(-inf) = 0
    p = tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None])
    keep = (offs_m[:, None] < Sq) & (offs_n[None, :] < Skv)
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + (Skv - Sq))
    return tl.where(keep, p, 0.0)
    ### END SOLUTION


@triton.jit
def bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
             sdkb, sdkh, sdks, sdvb, sdvh, sdvs, Hq, Sq, Skv, scale,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK_j, dV_j of one key tile of one KV head, summed over its group. Grid: (key tiles, Hkv, B)."""
    # YOUR CODE HERE (about 30 lines)
    ### BEGIN SOLUTION
    start_n = tl.program_id(0) * BLOCK_N
    h_kv, b = tl.program_id(1), tl.program_id(2)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    cols = offs_n[:, None] < Skv
    k = tl.load(K + b.to(tl.int64) * skb + h_kv * skh + offs_n[:, None] * sks + offs_d[None, :], mask=cols, other=0.0)
    v = tl.load(V + b.to(tl.int64) * svb + h_kv * svh + offs_n[:, None] * svs + offs_d[None, :], mask=cols, other=0.0)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    lo = tl.maximum(start_n - (Skv - Sq), 0) // BLOCK_M * BLOCK_M if CAUSAL else 0
    for g in range(GROUP):                                        # every query head of the group
        h = h_kv * GROUP + g
        q_base = Q + b.to(tl.int64) * sqb + h * sqh
        do_base = DO + b.to(tl.int64) * sdob + h * sdoh
        row_base = (b * Hq + h).to(tl.int64) * Sq                 # lse, Delta: [B, Hq, Sq]
        for start_m in range(lo, Sq, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = offs_m[:, None] < Sq
            q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :], mask=rows, other=0.0)
            do = tl.load(do_base + offs_m[:, None] * sdos + offs_d[None, :], mask=rows, other=0.0)
            lse = tl.load(LSE + row_base + offs_m, mask=offs_m < Sq, other=float("-inf"))
            delta = tl.load(Delta + row_base + offs_m, mask=offs_m < Sq, other=0.0)
            p = rebuild_p(q, k, lse, offs_m, offs_n, Sq, Skv, scale, CAUSAL)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)                # dV_j += P^T dO_i
            dp = tl.dot(do, tl.trans(v))                              # dP = dO_i V_j^T
            ds = p * (dp - delta[:, None])                            # dS = P o (dP - D_i)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)                 # dK_j += dS^T Q_i
    tl.store(DK + b.to(tl.int64) * sdkb + h_kv * sdkh + offs_n[:, None] * sdks + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=cols)
    tl.store(DV + b.to(tl.int64) * sdvb + h_kv * sdvh + offs_n[:, None] * sdvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=cols)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_dq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 3: dQ
#
# The other direction: one program per (query tile, query head, batch) keeps $Q_i$, $dO_i$, `lse_i`,
# $D_i$ and the fp32 accumulator $dQ_i$ on chip and walks over the key tiles its rows can see (causal:
# stop after the tile that holds the diagonal of its last row, as the forward does). It rebuilds $P_{ij}$
# and $dP_{ij}$ a second time (the price of no atomics: seven matrix products per tile pair instead
# of five), and writes $dQ_i = \text{scale}\sum_j dS_{ij} K_j$ once. Deterministic: the same inputs
# give the same bits.

# %% nbgrader={"grade": false, "grade_id": "dq", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def bwd_dq(Q, K, V, DO, LSE, Delta, DQ,
           sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, sdqb, sdqh, sdqs,
           Hq, Sq, Skv, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ_i of one query tile of one query head. Grid: (query tiles, Hq, B)."""
    # YOUR CODE HERE (about 25 lines)
    ### BEGIN SOLUTION
    start_m = tl.program_id(0) * BLOCK_M
    h, b = tl.program_id(1), tl.program_id(2)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m[:, None] < Sq
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=rows, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :], mask=rows, other=0.0)
    row_base = (b * Hq + h).to(tl.int64) * Sq
    lse = tl.load(LSE + row_base + offs_m, mask=offs_m < Sq, other=float("-inf"))
    delta = tl.load(Delta + row_base + offs_m, mask=offs_m < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + (h // GROUP) * skh
    v_base = V + b.to(tl.int64) * svb + (h // GROUP) * svh
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    hi = tl.minimum(tl.maximum(start_m + BLOCK_M + (Skv - Sq), 0), Skv) if CAUSAL else Skv
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        cols = offs_n[:, None] < Skv
        k = tl.load(k_base + offs_n[:, None] * sks + offs_d[None, :], mask=cols, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * svs + offs_d[None, :], mask=cols, other=0.0)
        p = rebuild_p(q, k, lse, offs_m, offs_n, Sq, Skv, scale, CAUSAL)
        dp = tl.dot(do, tl.trans(v))                                  # dP = dO_i V_j^T
        ds = p * (dp - delta[:, None])                                # dS = P o (dP - D_i)
        dq += tl.dot(ds.to(k.dtype), k)                               # dQ_i += dS K_j
    tl.store(DQ + b.to(tl.int64) * sdqb + h * sdqh + offs_m[:, None] * sdqs + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=rows)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_autograd", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 4: the launches and the autograd.Function
#
# `attention_backward` allocates `Delta`, `dq`, `dk`, `dv` and launches the three kernels (write the
# three grids; the kernels' docstrings name their axes). `FlashAttentionTrain` joins forward and
# backward for autograd: `forward` runs `attention_forward`, saves **only** `q, k, v, o, lse` with
# `ctx.save_for_backward` (and the two non-tensor arguments on `ctx`), and returns `o`; `backward`
# gets `dO` and returns one gradient per input of `forward`: `dq, dk, dv, None, None` (causal and
# scale have no gradient). `dO` can arrive with any strides: your kernels take its strides, as
# they take every other tensor's.

# %% nbgrader={"grade": false, "grade_id": "autograd", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Tile sizes: bigger in the interpreter, where fewer and larger NumPy operations run faster (256 x 256
# instead of 128 x 128: the `large` check in 4.7 s instead of 8.0 on one CPU core).
BWD_TILES = (256, 256, {}) if INTERPRET else (64, 64, {"num_warps": 4, "num_stages": 2})


def attention_backward(q, k, v, o, lse, do, causal=False, scale=None):
    """(dq, dk, dv) in the inputs' dtypes. q, o, do [B,Hq,Sq,D]; k, v [B,Hkv,Skv,D]; lse [B,Hq,Sq]."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    BLOCK_M, BLOCK_N, launch = BWD_TILES
    delta = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    meta = dict(GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    # YOUR CODE HERE (3 lines): grid_pre = ..., grid_dkdv = ..., grid_dq = ...
    ### BEGIN SOLUTION
    grid_pre = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    grid_dkdv = (triton.cdiv(Skv, BLOCK_N), Hkv, B)
    grid_dq = (triton.cdiv(Sq, BLOCK_M), Hq, B)
    ### END SOLUTION
    bwd_preprocess[grid_pre](o, do, delta, *o.stride()[:3], *do.stride()[:3], Hq, Sq, D=D, BLOCK_M=BLOCK_M)
    bwd_dkdv[grid_dkdv](q, k, v, do, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                        *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], Hq, Sq, Skv, scale, **meta)
    bwd_dq[grid_dq](q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                    *do.stride()[:3], *dq.stride()[:3], Hq, Sq, Skv, scale, **meta)
    return dq, dk, dv


class FlashAttentionTrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        # YOUR CODE HERE (4 lines)
        ### BEGIN SOLUTION
        o, lse = attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do):
        # YOUR CODE HERE (3 lines)
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None
        ### END SOLUTION


def flash_attention_train(q, k, v, causal=False, scale=None):
    """Attention whose output supports .backward(): o = softmax(scale q k^T + mask) v."""
    return FlashAttentionTrain.apply(q, k, v, bool(causal), scale)

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_gradients` draws `q, k, v` (non-contiguous views of `[B, S, H, D]` storage) and a
# non-contiguous `dO`, runs your forward and `torch.autograd.grad` through your backward, and compares
# `o`, `dq`, `dk`, `dv` with a float64 reference; it also measures what your forward kept for the
# backward. A failure names the gradient, the rows, and the likely cause (the `D` term, the GQA sum,
# a scale applied twice, the causal mask in the backward, another row's `lse`, ...). `gradcheck`
# compares your gradients with finite differences of your forward. In the interpreter `small` takes
# about ten seconds.

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_gradients(flash_attention_train, "small")
check_gradients(flash_attention_train, "small", scale=0.05, layout="bhsd")
check_gradients(flash_attention_train, "ragged")  # several tiles each way, Sq != Skv, causal
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", flash_attention_train)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same names yourself, for instance
# `check_gradients(flash_attention_train, "empty_rows")`; the edge cases are `ragged`,
# `ragged_noncausal`, `decode`, `empty_rows`, `d64`, `mqa`, `overflow`; and `gradcheck(flash_attention_train)`.

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "medium"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "noncausal"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "asymmetric"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: ragged lengths, causal and not
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_decode", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: decode, Sq = 1
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_decode", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: Sq > Skv causal: rows that see no key get zero gradients
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_d64_mqa", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: D = 64, and MQA (one KV head)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_d64_mqa", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_overflow", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: logits in the hundreds
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_overflow", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_gradcheck", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
gradcheck(flash_attention_train)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_gradcheck", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: bf16 on "medium", "ragged", "empty_rows" (GPU only)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", flash_attention_train)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "perf_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Speed (graded on a GPU)
#
# The two cells below time your backward (one `torch.autograd.grad` through `flash_attention_train`,
# the forward run once beforehand) against the backward of SDPA's FlashAttention-2 backend on the
# grading GPU (same process, same inputs, interleaved rounds, L2 flushed, median of 25; GPU time),
# on `large` and on `long`; TFLOP/s count the backward as 2.5 forwards (five matrix products against
# two). Half the points at the `min` fraction of its speed, all at the `target` (the graded result
# states both). Try it yourself on a GPU:
# `facourse.bench_attention(flash_attention_train, "large", mode="backward").summary()`.

# %% nbgrader={"grade": true, "grade_id": "perf_large", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: backward speed on "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_large", flash_attention_train)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_long", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: backward speed on "long"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_long", flash_attention_train)
### END HIDDEN TESTS
