# %%
# Without a GPU, Triton's interpreter runs kernels on the CPU. It must be switched on BEFORE
# triton is imported and before any kernel is defined, so this is the first cell.
import os

import torch

from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()

import math

import triton
import triton.language as tl

from facourse import AttnConfig, check_entry_point, gpu_or_skip

GPU = torch.cuda.is_available()
print("GPU" if GPU else "no GPU: kernels run in Triton's interpreter (float32, small shapes)")

# %% [markdown]
# # 05 — FlashAttention-2 in Triton
#
# The same computation as step 04, now as a GPU kernel. For each query tile $Q_i$ (rows
# $i\cdot B_r \ldots$) and each key/value tile $K_j, V_j$:
#
# $$S_{ij} = \text{scale}\cdot Q_i K_j^\top,\qquad m_i^{new} = \max\big(m_i,\ \operatorname{rowmax} S_{ij}\big),\qquad
# P_{ij} = e^{S_{ij} - m_i^{new}}$$
# $$l_i \leftarrow e^{m_i - m_i^{new}}\, l_i + \operatorname{rowsum} P_{ij},\qquad
# O_i \leftarrow e^{m_i - m_i^{new}}\, O_i + P_{ij} V_j,\qquad O_i \leftarrow O_i / l_i,\quad \text{lse}_i = m_i + \log l_i$$
#
# **Paper followed:** FlashAttention-2 (Dao, 2023), Algorithm 1 (forward) and §3.2 (parallelism over
# the query length, one thread block per query tile). The Triton structure follows the ideas of
# Triton's fused-attention tutorial (06); the code here is our own.
#
# **What you will learn**
# 1. Triton's programming model: a *program* owns a block of the output; `tl.program_id`,
#    `tl.arange`, pointer arithmetic with strides, masks, `tl.dot`.
# 2. The program-id mapping: which program computes which $(b, h, Q_i)$ and which KV head it reads.
# 3. The kernel in stages, each checked against the float64 reference: one tile → a loop over
#    $K_j, V_j$ with the online softmax → causal, split into off-band and on-band tiles, tiles above
#    the diagonal skipped → GQA → `exp2` with $\log_2 e$ folded into the scale → autotuning.
# 4. How far a Triton kernel gets against SDPA's FlashAttention-2 and cuDNN on an H100.
#
# The graded exercise is `exercises/05_triton_flash_attention/`; the fastest kernels are the ladder in
# `solutions/05_triton_flash_attention/ladder/`.

# %% [markdown]
# ## 1. The programming model
#
# A Triton kernel is a Python function decorated with `@triton.jit`, launched on a *grid* of
# programs: `kernel[grid](args...)`. Each program runs the whole function on **blocks**
# (tensors whose shapes are compile-time constants, `tl.constexpr`), and the compiler spreads a
# block over the threads of one thread block (`num_warps` warps). You never index threads.
#
# | Triton | meaning | CUDA counterpart |
# |---|---|---|
# | `tl.program_id(axis)` | which program am I | `blockIdx` |
# | `tl.arange(0, BLOCK)` | a block of offsets `0..BLOCK-1` | `threadIdx` spread, by the compiler |
# | `ptr + offs * stride` | a block of addresses | pointer arithmetic per thread |
# | `tl.load(ptrs, mask=m, other=0)` | read where `m` is true, `0` elsewhere | bounds check + load |
# | `tl.dot(a, b)` | a tile matrix product on tensor cores (fp32 accumulate) | `mma.sync` / `wgmma` |
# | `num_warps`, `num_stages` | threads per program; depth of the load pipeline | block size; cp.async stages |
#
# Masks replace bounds checks: the last tile of a length that is not a multiple of the block reads
# `other` where the mask is false, and stores only where it is true.

# %%
@triton.jit
def scale_rows(X, Y, n_rows, stride_row, alpha, BLOCK_R: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)                              # this program owns rows [pid*BLOCK_R, ...)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)        # [BLOCK_R]
    cols = tl.arange(0, D)                              # [D]
    ptrs = X + rows[:, None] * stride_row + cols[None, :]   # [BLOCK_R, D] addresses
    x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    tl.store(Y + rows[:, None] * D + cols[None, :], x * alpha, mask=rows[:, None] < n_rows)


dev = "cuda" if GPU else "cpu"            # a compiled kernel reads GPU memory, the interpreter CPU memory
x = torch.randn(10, 64, device=dev)[:, :32]          # a strided view: stride(0) = 64
y = torch.empty(10, 32, device=dev)
scale_rows[(triton.cdiv(10, 4),)](x, y, 10, x.stride(0), 2.0, BLOCK_R=4, D=32)
print("3 programs of 4 rows each cover 10 rows; max error:", float((y - 2 * x).abs().max()))

# %% [markdown]
# ## 2. The program-id mapping
#
# ![Program ids to tiles: axis 0 picks the query tile Q_i, axis 1 the (batch, head) pair](../diagrams/triton_program_id.png)
#
# FlashAttention-2 parallelises over batch, heads **and** query tiles (FA1 parallelised over batch
# and heads only). Our grid is `(Tr, B * Hq)` with `Tr = cdiv(Sq, BLOCK_M)`:
#
# - axis 0, `pid_m = tl.program_id(0)`: the query tile, rows `pid_m * BLOCK_M ... + BLOCK_M - 1`;
# - axis 1, `bh = tl.program_id(1)`: `b = bh // Hq`, `h = bh % Hq`; with GQA the KV head is
#   `h_kv = h // (Hq // Hkv)`.
#
# Axis 0 varies fastest in launch order, so the `Tr` programs of one head run side by side and share
# that head's K and V in L2. The function below is the kernel's first lines, in plain Python.

# %%
def program_to_tile(pid_m, bh, Hq, Hkv, BLOCK_M, Sq, causal=False):
    Tr = math.ceil(Sq / BLOCK_M)
    if causal:
        pid_m = Tr - 1 - pid_m            # longest tiles first (section 4)
    b, h = bh // Hq, bh % Hq
    return dict(b=b, h=h, h_kv=h // (Hq // Hkv), rows=(pid_m * BLOCK_M, min(Sq, (pid_m + 1) * BLOCK_M) - 1))


# the graded `large` config: B=8, Hq=32, Hkv=8, Sq=2048, BLOCK_M=128 -> grid (16, 256) = 4096 programs
for pid in [(0, 0), (3, 0), (0, 37), (15, 255)]:
    print(pid, program_to_tile(*pid, Hq=32, Hkv=8, BLOCK_M=128, Sq=2048))
# a ragged length: Sq = 200 with BLOCK_M = 128 -> 2 tiles; the second has 72 real rows (masked)
print((1, 5), program_to_tile(1, 5, Hq=4, Hkv=1, BLOCK_M=128, Sq=200))

# %% [markdown]
# ## 3. The kernel in stages
#
# Every stage has the same host wrapper: read the strides (inputs may be views of `[B, S, H, D]`
# storage), allocate `o` and `lse`, launch. The check draws fresh inputs and compares `o` and `lse`
# with float64. On the CPU, shapes stay small so the interpreter answers in seconds.

# %%
def launch(kernel, q, k, v, causal, scale, BLOCK_M, BLOCK_N, **extra):
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    if Hq != Hkv:
        raise ValueError(f"the lecture's kernels are multi-head (Hq == Hkv), got Hq={Hq}, Hkv={Hkv}; "
                         "GQA (stage 4) is exercise 05's")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    kernel[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                 Hq, Sq, Skv, scale, GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal),
                 BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **extra)
    return o, lse


# small shapes for the interpreter; the GPU runs them as well. Multi-head only (Hq == Hkv): GQA is
# the exercise's (stage 4)
ONE_TILE = AttnConfig("one_tile", 1, 2, 2, 100, 64, 64, True)      # Skv fits in one tile
MHA = AttnConfig("mha", 1, 2, 2, 200, 333, 64, True)               # ragged, causal, Sq < Skv
MHA_NC = AttnConfig("mha_noncausal", 1, 2, 2, 77, 200, 64, False)
MHA_EMPTY = AttnConfig("mha_empty_rows", 1, 2, 2, 300, 100, 64, True)  # Sq > Skv: 200 rows see no key

# %% [markdown]
# ### Stage 1: one tile
#
# If every key fits in one tile (`BLOCK_N >= Skv`), a program loads $Q_i$, all of $K$ and $V$, and
# computes the plain softmax: no loop, no running statistics. This is where the bounds masks and the
# bottom-right causal mask (`j <= i + (Skv - Sq)`) first appear.

# %%
@triton.jit
def attn_one_tile(Q, K, V, O, LSE, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
                  Hq, Sq, Skv, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < Sq, other=0.0)
    kT = tl.load(K + b * skb + h * skh + offs_n[None, :] * sks + offs_d[:, None], mask=offs_n[None, :] < Skv, other=0.0)
    v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svs + offs_d[None, :], mask=offs_n[:, None] < Skv, other=0.0)
    s = tl.dot(q, kT) * scale                                   # S = scale Q K^T
    keep = offs_n[None, :] < Skv
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + (Skv - Sq))
    s = tl.where(keep, s, float("-inf"))
    m = tl.max(s, 1)
    m = tl.where(m == float("-inf"), 0.0, m)                    # a row that sees no key
    p = tl.exp(s - m[:, None])                                  # P = exp(S - m)
    l = tl.sum(p, 1)
    l_safe = tl.where(l == 0.0, 1.0, l)
    o = tl.dot(p.to(v.dtype), v) / l_safe[:, None]              # O = P V / l
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], o.to(O.dtype.element_ty), mask=offs_m[:, None] < Sq)
    tl.store(LSE + bh * Sq + offs_m, tl.where(l == 0.0, float("-inf"), m + tl.log(l_safe)), mask=offs_m < Sq)


def stage1(q, k, v, causal=False, scale=None):
    return launch(attn_one_tile, q, k, v, causal, scale, 64, triton.next_power_of_2(max(k.shape[2], 16)))


check_entry_point(stage1, ONE_TILE, expect_lse=True)

# %% [markdown]
# ### Stage 2: a loop over $K_j, V_j$ with the online softmax
#
# The key range no longer fits: loop over tiles of `BLOCK_N` keys and keep $m_i$, $l_i$ and the
# unnormalised $O_i$ in registers (step 03's merge, one tile at a time). The update is one small
# device function, and so is the loop over a range of key tiles, `key_tiles`: stage 3 calls it
# twice. Here it runs over every tile with the mask on (`MASKED`); stage 3 says when the mask can go.
# A query tile's start (load $Q_i$, the empty state) and end (divide by $l_i$, store $O_i$ and the lse)
# are two more, `row_tile_start` and `row_tile_store`, which stage 3 shares.

# %%
@triton.jit
def online_softmax_update(m_i, l_i, s):
    """s: scaled scores of one tile, -inf where masked. Returns m, l, alpha, P."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)       # a row that has seen no key yet
    alpha = tl.exp(m_i - m_use)                                 # alpha = exp(m_old - m_new)
    p = tl.exp(s - m_use[:, None])                              # P_ij = exp(S_ij - m_new)
    return m_new, l_i * alpha + tl.sum(p, 1), alpha, p


@triton.jit
def key_tiles(acc, m_i, l_i, q, k_ptr, v_ptr, sks, svs, offs_m, lo, hi, Skv, scale, off,
              BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """The key tiles [lo, hi) folded into (acc, m_i, l_i); MASKED: bounds and causal mask on."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for start_n in tl.range(lo, hi, BLOCK_N):                   # K_j, V_j
        cols = start_n + offs_n
        if MASKED:
            kT = tl.load(k_ptr + cols[None, :] * sks + offs_d[:, None], mask=cols[None, :] < Skv, other=0.0)
            v = tl.load(v_ptr + cols[:, None] * svs + offs_d[None, :], mask=cols[:, None] < Skv, other=0.0)
        else:                                                   # off-band (stage 3): no mask, no bounds check
            kT = tl.load(k_ptr + cols[None, :] * sks + offs_d[:, None])
            v = tl.load(v_ptr + cols[:, None] * svs + offs_d[None, :])
        s = tl.dot(q, kT) * scale                               # S_ij = scale Q_i K_j^T
        if MASKED:
            keep = cols[None, :] < Skv
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + off)
            s = tl.where(keep, s, float("-inf"))
        m_i, l_i, alpha, p = online_softmax_update(m_i, l_i, s)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])    # O_i = alpha O_i + P_ij V_j
    return acc, m_i, l_i


@triton.jit
def row_tile_start(Q, b, h, sqb, sqh, sqs, offs_m, Sq, BLOCK_M: tl.constexpr, D: tl.constexpr):
    """Q_i (rows past Sq read as 0) and the empty state: m_i = -inf, l_i = 0, O_i = 0."""
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < Sq, other=0.0)
    return q, tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M, D], tl.float32)


@triton.jit
def row_tile_store(O, LSE, acc, m_i, l_i, b, h, bh, sob, soh, sos, offs_m, Sq, D: tl.constexpr):
    """O_i = acc / l_i and lse_i = m_i + log l_i; a row that saw no key stores 0 and -inf."""
    offs_d = tl.arange(0, D)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < Sq)
    tl.store(LSE + bh * Sq + offs_m, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe)), mask=offs_m < Sq)


@triton.jit
def attn_loop(Q, K, V, O, LSE, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
              Hq, Sq, Skv, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q, m_i, l_i, acc = row_tile_start(Q, b, h, sqb, sqh, sqs, offs_m, Sq, BLOCK_M, D)
    acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, K + b * skb + h * skh, V + b * svb + h * svh, sks, svs, offs_m,
                              0, Skv, Skv, scale, Skv - Sq, BLOCK_N, D, True, CAUSAL)
    row_tile_store(O, LSE, acc, m_i, l_i, b, h, bh, sob, soh, sos, offs_m, Sq, D)


def stage2(q, k, v, causal=False, scale=None):
    return launch(attn_loop, q, k, v, causal, scale, 64, 64)


check_entry_point(stage2, MHA, expect_lse=True)
check_entry_point(stage2, MHA_NC, expect_lse=True)

# %% [markdown]
# ### Stage 3: causal, off-band and on-band tiles, tiles above the diagonal skipped
#
# With bottom-right alignment, row `i` sees keys `j <= i + off`, `off = Skv - Sq`. For the query tile
# starting at `start_m`:
#
# - every row sees keys `< start_m + off + 1`: the **off-band** tiles `[0, end_free)` need no mask
#   at all (`end_free` rounded down to a whole tile, and below the last full tile of a ragged `Skv`);
# - the last row sees keys `< start_m + BLOCK_M + off`: the **on-band** tiles `[end_free, hi)` cross
#   the diagonal and get the mask;
# - tiles at or past `hi` are entirely above the diagonal: **never visited**. That halves the work
#   of a square causal problem, and the masked `tl.where` runs on one or two tiles per program only.
#
# A query tile near the bottom does `Tr` times the work of the top one: launching the **longest
# first** (`pid_m = Tr - 1 - program_id(0)`) lets the short ones fill the tail of the grid. The loop
# is stage 2's `key_tiles`, called once per range.

# %%
@triton.jit
def attn_causal(Q, K, V, O, LSE, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
                Hq, Sq, Skv, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m                 # longest tiles first
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q, m_i, l_i, acc = row_tile_start(Q, b, h, sqb, sqh, sqs, offs_m, Sq, BLOCK_M, D)
    k_ptr = K + b * skb + h * skh            # multi-head: query head h reads KV head h (stage 4: GQA)
    v_ptr = V + b * svb + h * svh
    off = Skv - Sq
    end_free = Skv // BLOCK_N * BLOCK_N      # the whole tiles: past them, a ragged Skv needs the mask
    hi = Skv
    if CAUSAL:
        seen_by_all = tl.maximum(start_m + off + 1, 0)           # keys the tile's first row sees
        seen_by_last = tl.maximum(start_m + BLOCK_M + off, 0)    # keys its last row sees
        end_free = tl.minimum(seen_by_all // BLOCK_N * BLOCK_N, end_free)
        hi = tl.minimum(seen_by_last, Skv)
    acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, k_ptr, v_ptr, sks, svs, offs_m, 0, end_free, Skv, scale, off, BLOCK_N, D, False, CAUSAL)
    acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, k_ptr, v_ptr, sks, svs, offs_m, end_free, hi, Skv, scale, off, BLOCK_N, D, True, CAUSAL)
    row_tile_store(O, LSE, acc, m_i, l_i, b, h, bh, sob, soh, sos, offs_m, Sq, D)


def stage3(q, k, v, causal=False, scale=None):
    return launch(attn_causal, q, k, v, causal, scale, 64, 64)


check_entry_point(stage3, MHA, expect_lse=True)
check_entry_point(stage3, MHA_EMPTY, expect_lse=True)   # Sq > Skv: the first rows see no key

# %% [markdown]
# How much work does the skipping save? Count the tiles each variant visits on `large`
# (2048 x 2048, BLOCK_M = 128, BLOCK_N = 64): stage 2 visits all of them, stage 3 only those at or
# below the diagonal.

# %%
def tiles_visited(Sq, Skv, BM, BN, skip):
    total = 0
    for pid in range(math.ceil(Sq / BM)):
        hi = min(max(pid * BM + BM + Skv - Sq, 0), Skv) if skip else Skv
        total += math.ceil(hi / BN)
    return total


print("stage 2:", tiles_visited(2048, 2048, 128, 64, False), "tiles per head;  stage 3:",
      tiles_visited(2048, 2048, 128, 64, True))

# %% [markdown]
# ### Stage 4: GQA
#
# Grouped-query attention changes which K and V a program reads: query head `h` reads KV head
# `h // GROUP` with `GROUP = Hq // Hkv` (section 2's `program_to_tile` computes it), so the base
# pointers of K and V use that head's stride offset instead of `h`'s. With the `(Tr, B*Hq)` grid the
# `GROUP` query heads of one KV head are neighbours in launch order, so they also share K and V in
# L2. The lecture's kernels stop at multi-head attention (their `launch` refuses `Hq != Hkv`):
# the GQA line, with `exp2` (stage 5) and the int64 offsets of large tensors, is yours to write in
# exercise 05. Getting it wrong (`h % Hkv`) is one of the mistakes the check names.

# %% [markdown]
# ### Stage 5: `exp2`, with $\log_2 e$ folded into the scale
#
# The GPU's special-function unit computes $2^x$; `exp(x)` costs an extra multiply per element.
# Since $e^{\text{scale}\cdot s - m} = 2^{\,s\cdot(\text{scale}\log_2 e) - m\log_2 e}$, keep the
# running max in log2 units and pass `qk_scale = scale * log2(e)`: one fused multiply-add per score
# (`s * qk_scale - m`) and one `exp2`. At the end, `lse = (m + log2 l) * ln 2` gives the natural log
# back. This is the form of the exercise and of the ladder (`v4` onward):
#
# ```python
# m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
# p     = tl.math.exp2(s * qk_scale - m_new[:, None])
# ```
#
# ### Stage 6: autotuning
#
# `BLOCK_M`, `BLOCK_N`, `num_warps` and `num_stages` trade registers and shared memory against
# parallelism and latency hiding, and the best choice moves with the sequence length. `triton.autotune`
# times a short list of configurations the first time it meets a new key and keeps the fastest:
#
# ```python
# configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
#            for bm, bn, w, s in [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
#                                 (128, 128, 8, 3), (64, 64, 4, 3)]]
# attn_fwd_tuned = triton.autotune(configs, key=["Sq", "Skv", "D", "CAUSAL"])(attn_fwd)
# ```
#
# On an H100, 128-row query tiles with 8 warps (two warpgroups of `wgmma`) and 3 pipeline stages won
# for long sequences. The interpreter cannot autotune (it has no timer): the ladder runs one fixed
# configuration there. The ladder's `v5` also reads tiles through **tensor descriptors**
# (`tl.make_tensor_descriptor`, the Hopper TMA unit), which clip the ragged edges in hardware; `v6`
# builds them once on the host (`triton.tools.tensor_descriptor.TensorDescriptor`) and replaces the
# autotuner with a table of tile shapes measured per shape class, some of which let two programs
# share an SM. It is the ladder's last rung and the solution.

# %% [markdown]
# ## 4. How fast, against FlashAttention-2 and cuDNN
#
# The first cell below draws what we measured on an H100 for the ladder's solution, SDPA's
# FLASH_ATTENTION backend (FlashAttention-2) and its CUDNN_ATTENTION backend over sequence lengths
# 512 ... 16k (D = 128, B·H·S = 16·16k), and prints the solution's speed against both on `large` and
# at 4k-16k, fp16 and bf16. The numbers come from `course/results/measured.json`, a copy of the
# instructors' benchmark results (`facourse.results` reads it; the full tables are in the course
# repository's `benchmarks/README.md`). cuDNN's kernel is FlashAttention-3-class: it overlaps the
# softmax with the tensor cores through warp specialisation, which step 07 builds by hand. On a GPU
# the second cell measures this lecture's own stage-3 kernel the same way, with
# `facourse.bench_attention`.

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from facourse import results

R05 = results.load("05")  # None when the file is not there
if R05 is None:
    print("No measurement is committed in course/results/measured.json.")
else:
    print(results.header(R05))
    results.plot_sweep(R05)
    plt.show()
    display(Markdown(results.bar_table(R05)))

# %%
if gpu_or_skip("the benchmark"):
    import matplotlib.pyplot as plt

    from facourse import bench_attention
    from facourse.configs import SWEEP, SWEEP_LENGTHS

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind in zip(axes, ("noncausal", "causal")):
        ours, fa2, cudnn = [], [], []
        for cfg in [c for n, c in SWEEP.items() if n.startswith(kind + "_")]:
            r1 = bench_attention(stage3, cfg, backend="FLASH_ATTENTION")
            r2 = bench_attention(stage3, cfg, backend="CUDNN_ATTENTION")
            ours.append(r1.tflops_student), fa2.append(r1.tflops_ref), cudnn.append(r2.tflops_ref)
        for ys, label in ((ours, "this lecture's stage 3"), (fa2, "SDPA FLASH_ATTENTION (FA2)"), (cudnn, f"SDPA {r2.backend}")):
            ax.plot(SWEEP_LENGTHS, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{kind}, D=128, fp16, {r1.gpu}")
        ax.set_xlabel("sequence length")
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    plt.show()

# %% [markdown]
# ### What a timer measures: a lesson from this step
#
# `bench_attention` brackets each call with two CUDA events. Events are recorded on the GPU's
# queue, so the window opens when the GPU reaches the start event, not when Python calls the
# kernel. On an H100 the step's wrapper (v7's, then the solution) spent 145-219 µs in Python per
# call (building four tensor descriptors, checking strides, launching); the L2 flush queued before the start event kept the GPU busy for
# only 94-107 µs. Whenever the enqueue outlasts the flush, the GPU reaches the start event, then
# waits for the kernel to arrive, and the wait is charged to the kernel.
#
# ![Host and GPU timelines of one timed call: without a spin the GPU idles inside the timed window while Python enqueues the kernel; with a spin longer than the enqueue the window holds the kernel only](../diagrams/timer_window.png)
#
# For several runs the course's benchmark measured exactly that. Ratios moved from run to run by
# more than the differences they were meant to show, and a rung built to fix a scheduling tail (a
# `v7` that ran causal tiles longest first across heads) looked faster than v6 at causal 4k. Once the
# GPU was kept busy for longer than the enqueue (a spin kernel before the start event,
# `facourse.bench.time_calls`), the scatter went and so did v7's gain: it was slower than v6 at causal
# 4k, and left the ladder.
# Two habits follow: time the same thing twice before you believe a difference, and know what your
# timer's window contains. The cell below shows the committed probe (the instructors'
# `benchmarks/timing_probe.py`, copied into `course/results/measured.json`).

# %%
probe = results.load("timing_probe")
if probe is None:
    print("The timing probe is not in course/results/measured.json.")
else:
    print(f"{probe['env']['gpu']}, {probe['env']['date']}, {probe['rounds']} rounds each")
    display(Markdown(results.timing_probe_table(probe)))
