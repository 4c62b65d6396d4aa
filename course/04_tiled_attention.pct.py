# %% [markdown]
# # Lecture 04 — Tiled attention in PyTorch (FlashAttention-2's algorithm)
#
# For one head, cut $Q$ into $T_r$ row tiles $Q_i$ of $B_r$ rows and $K, V$ into $T_c$ tiles
# $K_j, V_j$ of $B_c$ rows. For each $Q_i$, start from $m_i = -\infty$, $\ell_i = 0$, $O_i = 0$ and
# for $j = 1 \dots T_c$:
#
# $$\begin{aligned}
# S_{ij} &= \text{scale}\cdot Q_i K_j^\top &&(B_r \times B_c,\ \text{on chip})\\
# m_i^{\rm new} &= \max\big(m_i,\ \operatorname{rowmax}(S_{ij})\big)\\
# P_{ij} &= \exp\big(S_{ij} - m_i^{\rm new}\big)\\
# \alpha &= \exp\big(m_i - m_i^{\rm new}\big)\\
# \ell_i &\leftarrow \alpha\,\ell_i + \operatorname{rowsum}(P_{ij})\\
# O_i &\leftarrow \operatorname{diag}(\alpha)\,O_i + P_{ij} V_j, \qquad m_i \leftarrow m_i^{\rm new}
# \end{aligned}$$
#
# then $O_i \leftarrow \operatorname{diag}(\ell_i)^{-1} O_i$ and $\text{lse}_i = m_i + \ln \ell_i$.
# $S$ and $P$ exist one $B_r \times B_c$ tile at a time; HBM sees $Q$, $K$, $V$ read and $O$, lse written.
#
# **What you will learn**
# - how $B_r, B_c$ follow from the on-chip memory size (FlashAttention-1's rule), computed for H100;
# - FlashAttention-1's vs FlashAttention-2's loop order, and why FA2 parallelizes over the sequence;
# - the per-tile rescale (lecture 03's $\alpha$) in a working tiled attention;
# - causal attention at two levels: whole tiles skipped, element masks only on diagonal tiles;
# - GQA: which KV head a query head reads;
# - the bottom-right vs top-left causal pitfall when $S_q \ne S_{kv}$, shown on a chunked prefill
#   against a KV cache;
# - the lse returned for the backward pass, and the HBM traffic of tiled vs vanilla attention.
#
# **Paper sections followed.** FlashAttention (Dao, Fu, Ermon, Rudra, Ré 2022): §3.1, Algorithm 1
# (tiling, block sizes from SRAM size $M$), Theorem 2 (IO complexity). FlashAttention-2 (Dao 2023):
# §3.1 Algorithm 1 (loop order, one rescale at the end, lse), §3.2 (parallelism over the sequence).
#
# Exercise 04 asks for `tiled_attention(q, k, v, causal=False, scale=None, block_m=64, block_n=64)`
# returning `(o, lse)`. The demo below is deliberately loop-heavy and small in scope: one (batch, head)
# pair, `q: [Sq, D]`, `k, v: [Skv, D]`, and causal only for square problems ($S_q = S_{kv}$), so that every
# line is one line of the algorithm. The exercise adds what the demo leaves out: the whole
# `[B, H, S, D]` contract batched over heads, GQA, and causal masking with the bottom-right offset when
# $S_q \ne S_{kv}$ (sections 3, 4 and 6 explain them; the code is yours to write).

# %%
import math
import time

import torch

from facourse import kv_head_index, reference_attention

_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. Tiles: $B_r$ and $B_c$ from the on-chip memory
#
# ![S cut into tiles](../diagrams/tiling_grid.png)
#
# FlashAttention-1 sizes the tiles so that $Q_i$, $K_j$, $V_j$ and $O_i$ (each about $B \times d$)
# fit in an on-chip memory of $M$ elements together: $B_c = \lceil M / 4d \rceil$, and
# $B_r = \min(\lceil M / 4d \rceil, d)$ (the cap at $d$ keeps the $B_r \times B_c$ tile of $S$ no
# bigger than $M$ as well). H100 has up to 228 KB of shared memory per SM (227 KB for one block);
# A100 164 KB (NVIDIA architecture whitepapers).

# %%
def fa1_block_sizes(smem_bytes, d, bytes_per_elem):
    M = smem_bytes // bytes_per_elem            # on-chip memory in elements
    Bc = math.ceil(M / (4 * d))                 # Bc = ceil(M / 4d)
    Br = min(math.ceil(M / (4 * d)), d)         # Br = min(ceil(M / 4d), d)
    return Bc, Br


print(f"{'GPU':5s} {'dtype':5s} {'d':>4s} {'M (elems)':>10s} {'Bc':>5s} {'Br':>5s}")
for gpu, smem_kb in (("A100", 164), ("H100", 228)):
    for dt, nbytes in (("fp16", 2), ("fp32", 4)):
        for d in (64, 128, 256):
            Bc, Br = fa1_block_sizes(smem_kb * 1024, d, nbytes)
            print(f"{gpu:5s} {dt:5s} {d:4d} {smem_kb * 1024 // nbytes:10d} {Bc:5d} {Br:5d}")

# %% [markdown]
# For H100, fp16, $d = 128$ the rule gives $B_c = 228$, $B_r = 128$. Real kernels round to the
# hardware's shapes instead: powers of two that match the tensor-core instruction tiles (64 rows
# per warpgroup for WGMMA), and a $B_r \times B_c$ fp32 tile of $S$ that must fit in **registers**
# (128 × 128 × 4 B = 64 KB, a quarter of an SM's register file), leaving room for two or three
# pipeline stages of $K_j, V_j$ in shared memory. Typical choices: 128 × 64 or 128 × 128 at $d = 128$.
# The rule tells you the order of magnitude; the profiler decides the rest (lecture 05, autotuning).
#
# ## 2. Loop order: FA1 vs FA2
#
# ![FA1 vs FA2 loop order](../diagrams/loop_order.png)
#
# FlashAttention-1 puts $K_j, V_j$ in the **outer** loop: load a K/V tile once, then sweep all $Q_i$,
# reading and writing $O_i, m_i, \ell_i$ from HBM at every step. One thread block per (batch, head),
# so a GPU with 132 SMs needs $B \cdot H \gtrsim 132$ to be busy; long sequences come with small
# batches and leave most SMs idle.
#
# FlashAttention-2 swaps the loops: $Q_i$ **outer**, $K_j, V_j$ inner. Now $O_i, m_i, \ell_i$ live in
# registers for the whole inner loop and are written once; the divide by $\ell_i$ happens once at the
# end instead of at every step; and the $T_r$ row tiles are **independent**, so the grid is
# $T_r \times B \times H$ programs. At $B = 1$, $H = 16$, $N = 16\,384$, $B_r = 128$ that is
# $128 \cdot 16 = 2048$ programs instead of 16.
#
# The HBM traffic for $Q$ and $O$ in each order, one head, fp16 (FA1 also moves $m, \ell$):

# %%
def qo_traffic_bytes(N, d, Br, Bc, order, bytes_per=2):
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)
    if order == "FA1":   # every (j, i): read Q_i, O_i, m_i, l_i; write O_i, m_i, l_i
        return Tc * (3 * N * d * bytes_per + 4 * N * 4)
    return 2 * N * d * bytes_per + N * 4  # FA2: read Q_i once, write O_i and lse_i once


for N in (1024, 4096, 16384):
    fa1, fa2 = qo_traffic_bytes(N, 128, 128, 128, "FA1"), qo_traffic_bytes(N, 128, 128, 128, "FA2")
    print(f"N={N:6d}: Q/O traffic FA1 {fa1 / 2**20:8.1f} MiB   FA2 {fa2 / 2**20:6.1f} MiB   ({fa1 / fa2:5.1f}x)")

# %% [markdown]
# ## 3. Causal attention, tile by tile
#
# The course's causal rule is **bottom-right aligned**: key $j$ is visible to query $i$ iff
# $j \le i + (S_{kv} - S_q)$. For a tile with rows $[i_0, i_1)$ and columns $[j_0, j_1)$ and
# offset $\delta = S_{kv} - S_q$ there are three cases:
#
# - **full**: $j_1 - 1 \le i_0 + \delta$ (even the first row sees the last column): no mask;
# - **skipped**: $j_0 > i_1 - 1 + \delta$ (even the last row cannot see the first column): never loaded;
# - **diagonal**: otherwise: compute it and apply the element mask.
#
# ![causal tile classes](../diagrams/causal_tiles.png)
#
# Only diagonal tiles pay for the mask; skipped tiles cost nothing, which halves the work of a
# square causal attention. In a kernel the inner loop simply stops at the last visible $K_j$.
#
# ## 4. GQA: which KV head?
#
# ![GQA head sharing](../diagrams/gqa_heads.png)
#
# With $H_q$ query heads and $H_{kv}$ KV heads, query head $h$ reads KV head $h \,//\, (H_q / H_{kv})$.
# The classic bug is `h % Hkv`, which spreads consecutive query heads over different KV heads:

# %%
Hq, Hkv = 8, 2
print("h // group :", kv_head_index(Hq, Hkv).tolist())
print("h % Hkv    :", [h % Hkv for h in range(Hq)], " <- wrong")

# %% [markdown]
# ## 5. The tiled attention, loop by loop
#
# One query head of one batch (`q: [Sq, D]`, `k, v: [Skv, D]`), one $Q_i$ tile at a time (FA2 order),
# with the tile classification of section 3. Causal masking is for a square problem here
# ($S_q = S_{kv}$, so $\delta = 0$: every row sees at least its own key); the demo refuses the
# other case rather than silently using the wrong offset. `stats` (optional) counts tiles and the
# bytes that a kernel with this loop structure would move between HBM and the chip, for section 8.

# %%
def flash_attention_demo(q, k, v, causal=False, scale=None, Br=64, Bc=64, stats=None, rescale=True):
    """Tiled attention with online softmax, FA2 loop order, for ONE head: q [Sq, D], k and v [Skv, D].
    Returns (o [Sq, D], lse [Sq]). A lecture demo: clear, not fast (Python loops over tiles), causal
    only with Sq == Skv. rescale=False drops alpha (a bug, for section 5)."""
    Sq, D = q.shape
    Skv = k.shape[0]
    if causal and Sq != Skv:
        raise ValueError("the demo's causal mask is for Sq == Skv only; the bottom-right offset "
                         "Skv - Sq (section 6) is exercise 04's")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32  # accumulate in fp32 (or fp64)
    o = torch.empty(Sq, D, dtype=q.dtype)
    lse = torch.empty(Sq, dtype=torch.float32)
    Tr, Tc = math.ceil(Sq / Br), math.ceil(Skv / Bc)
    st = stats if stats is not None else {}
    for key in ("full", "diagonal", "skipped", "bytes"):
        st.setdefault(key, 0)
    nbytes = q.element_size()
    for i in range(Tr):
        i0, i1 = i * Br, min((i + 1) * Br, Sq)
        Q_i = q[i0:i1].to(acc)                       # load Q_i
        st["bytes"] += Q_i.numel() * nbytes
        m_i = torch.full((i1 - i0,), -math.inf, dtype=acc)
        l_i = torch.zeros(i1 - i0, dtype=acc)
        O_i = torch.zeros(i1 - i0, D, dtype=acc)
        for j in range(Tc):
            j0, j1 = j * Bc, min((j + 1) * Bc, Skv)
            if causal and j0 > i1 - 1:               # tile entirely above the diagonal: skip
                st["skipped"] += 1
                continue
            full = (not causal) or (j1 - 1 <= i0)    # even the first row sees the last column
            st["full" if full else "diagonal"] += 1
            K_j = k[j0:j1].to(acc)                   # load K_j, V_j
            V_j = v[j0:j1].to(acc)
            st["bytes"] += (K_j.numel() + V_j.numel()) * nbytes
            S_ij = scale * (Q_i @ K_j.T)              # S_ij = scale · Q_i K_j^T
            if not full:                              # diagonal tile: element mask
                rows = torch.arange(i0, i1)[:, None]
                cols = torch.arange(j0, j1)[None, :]
                S_ij = S_ij.masked_fill(cols > rows, -math.inf)
            m_new = torch.maximum(m_i, S_ij.amax(dim=1))   # m_new = max(m_i, rowmax(S_ij))
            P_ij = torch.exp(S_ij - m_new[:, None])        # P_ij = exp(S_ij - m_new)
            alpha = torch.exp(m_i - m_new)                 # alpha = exp(m_i - m_new)
            if not rescale:
                alpha = torch.ones_like(alpha)             # the bug: no rescale
            l_i = alpha * l_i + P_ij.sum(dim=1)            # l_i = alpha l_i + rowsum(P_ij)
            O_i = alpha[:, None] * O_i + P_ij @ V_j        # O_i = diag(alpha) O_i + P_ij V_j
            m_i = m_new
        O_i = O_i / l_i[:, None]                           # O_i = diag(l_i)^-1 O_i
        o[i0:i1] = O_i.to(q.dtype)                         # write O_i
        lse[i0:i1] = m_i + torch.log(l_i)                  # lse_i = m_i + ln l_i
        st["bytes"] += O_i.numel() * nbytes + (i1 - i0) * 4
    return o, lse


# %% [markdown]
# Every row of a square causal problem sees at least its own key, and the first $K_j$ tile a row visits
# always holds a visible key, so $m_i$ is finite after the first tile: `exp(m_i - m_new)` is never
# $e^{-\infty - (-\infty)}$. With $S_q > S_{kv}$ (bottom-right) that is no longer true: some rows see no
# key at all and need a guard, and their output is 0 and their lse $-\infty$ by the contract. That is
# part of the exercise.
#
# Checked against the course's float64 reference on one head: square causal, ragged lengths
# (200: no multiple of a block), non-causal with $S_q \ne S_{kv}$ (200 × 333) and decode ($S_q = 1$).

# %%
def compare_one_head(fn, Sq, Skv, causal, D=64, seed=0):
    """max |o - ref| and max |lse - ref| of fn(q, k, v, causal) for one head, in float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Sq, D, dtype=torch.float64, generator=g)
    k, v = (torch.randn(Skv, D, dtype=torch.float64, generator=g) for _ in range(2))
    o, lse = fn(q, k, v, causal)
    o_ref, lse_ref = reference_attention(q[None, None], k[None, None], v[None, None], causal)
    return (o - o_ref[0, 0]).abs().max().item(), (lse.double() - lse_ref[0, 0].double()).abs().max().item()


t0 = time.perf_counter()
for Sq, Skv, causal in ((128, 128, True), (200, 200, True), (200, 333, False), (1, 515, False)):
    err_o, err_lse = compare_one_head(flash_attention_demo, Sq, Skv, causal)
    print(f"Sq={Sq:4d} Skv={Skv:4d} causal={causal!s:5}: max|o - ref| {err_o:.1e}, max|lse - ref| {err_lse:.1e}")
    assert err_o < 1e-10 and err_lse < 1e-5
print(f"({time.perf_counter() - t0:.1f} s)")

# %% [markdown]
# And the tile counts on a square causal problem: about half the tiles are skipped.

# %%
q, k, v = (torch.randn(512, 64) for _ in range(3))
st = {}
o_demo, lse_demo = flash_attention_demo(q, k, v, causal=True, stats=st)
print({key: st[key] for key in ("full", "diagonal", "skipped")}, "of", (512 // 64) ** 2, "tiles")

# %% [markdown]
# **The rescale matters.** Drop $\alpha$ and the result is wrong as soon as a later $K_j$ tile holds
# a larger score than every earlier one: rows past the first tile go wrong. The course's check names
# this bug ("does not rescale the accumulator by alpha").

# %%
def demo_without_alpha(q, k, v, causal=False, scale=None):
    return flash_attention_demo(q, k, v, causal, scale, rescale=False)


err_o, _ = compare_one_head(demo_without_alpha, 128, 128, True)
print(f"without alpha: max|o - ref| = {err_o:.2f}")

# %% [markdown]
# ## 6. The causal pitfall: top-left vs bottom-right when $S_q \ne S_{kv}$
#
# PyTorch's `is_causal=True` (and FlashAttention before 2.1) aligns the mask **top-left**: $j \le i$.
# For $S_q = S_{kv}$ the two rules agree. They differ when a *chunk* of new queries attends to a
# KV cache that already holds earlier tokens: chunked prefill, speculative decoding, decode itself.
# Query $i$ of the chunk is token $i + (S_{kv} - S_q)$ of the sequence and must see every key up to
# that position: bottom-right.
#
# The test: run a 256-token sequence whole; then run it in two chunks, the second chunk's 96 queries
# against a KV cache holding all 256 keys. The chunked result must equal the last 96 rows of the
# whole result.

# %%
Bx, Hx, N, D = 1, 2, 256, 64
q, k, v = (torch.randn(Bx, Hx, N, D, dtype=torch.float64) for _ in range(3))
o_whole, _ = reference_attention(q, k, v, causal=True)     # the whole sequence at once

c = 160                                                    # chunk 1 = tokens [0, 160), chunk 2 = [160, 256)
q2 = q[:, :, c:]                                           # 96 new queries
k_cache, v_cache = k, v                                    # cache holds the 160 old keys + 96 new ones
o2_br, _ = reference_attention(q2, k_cache, v_cache, causal=True)                     # bottom-right (ours)
o2_tl, _ = reference_attention(q2, k_cache, v_cache, causal=True, align="top_left")  # top-left
o2_sdpa = torch.nn.functional.scaled_dot_product_attention(q2, k_cache, v_cache, is_causal=True)
o1, _ = reference_attention(q[:, :, :c], k[:, :, :c], v[:, :, :c], causal=True)       # chunk 1

print("chunk 1 (Sq = Skv, both rules agree)   :", (o1 - o_whole[:, :, :c]).abs().max().item())
print("chunk 2, bottom-right                  :", (o2_br - o_whole[:, :, c:]).abs().max().item())
print("chunk 2, top-left                      :", (o2_tl - o_whole[:, :, c:]).abs().max().item())
print("chunk 2, torch SDPA is_causal=True     :", (o2_sdpa - o_whole[:, :, c:]).abs().max().item())

# %% [markdown]
# Top-left lets query 0 of chunk 2 (token 160) see only key 0, instead of keys 0..160. The error is
# of the order of the outputs themselves: not a rounding problem, a wrong model. With $S_q > S_{kv}$
# bottom-right leaves the first $S_q - S_{kv}$ rows with no key at all; the contract says their output
# is 0 and their lse $-\infty$ (the `empty_rows` configuration of the exercise).
#
# Inside a tiled loop, the offset $\delta = S_{kv} - S_q$ moves everything of section 3: which tiles are
# full, which are diagonal, where the inner loop stops, and the element mask. The demo of section 5 is
# square-only; carrying $\delta$ through it (and guarding the rows that see no key) is exercise 04.
#
# ## 7. The lse, for the backward pass
#
# The forward pass returns $\text{lse}_i = m_i + \ln \ell_i$ (fp32, one number per row) and throws
# $P$ away. The backward pass needs $P$ again, and rebuilds any tile of it exactly from $Q_i$, $K_j$
# and the lse, with no running max and no second pass:
#
# $$P_{ij} = \exp(S_{ij} - \text{lse}_i).$$

# %%
q, k, v = (torch.randn(300, 64, dtype=torch.float64) for _ in range(3))
o_d, lse_d = flash_attention_demo(q, k, v, causal=True)
scale = 1 / math.sqrt(64)
i0, i1, j0, j1 = 128, 192, 64, 128                          # one tile of P
S_tile = scale * q[i0:i1] @ k[j0:j1].T
P_tile = torch.exp(S_tile - lse_d[i0:i1, None].double())    # P_ij = exp(S_ij - lse_i)
s_full = scale * q @ k.T
s_full = s_full.masked_fill(torch.ones(300, 300).triu(1).bool(), -math.inf)
P_full = torch.softmax(s_full, dim=-1)
print("tile of P rebuilt from lse, max err:", (P_tile - P_full[i0:i1, j0:j1]).abs().max().item(),
      "(lse is stored in fp32)")

# %% [markdown]
# Storing lse costs $4 S_q$ bytes per head; storing $P$ would cost $2 S_q S_{kv}$. The lse is also the
# state that lecture 03's merge combines (split-KV, ring attention).
#
# ## 8. HBM traffic: tiled vs vanilla
#
# ![the six HBM trips of vanilla attention](../diagrams/hbm_trips_vanilla.png)
#
# Per head, fp16, non-causal, $N = S_q = S_{kv}$:
#
# - **vanilla** (three kernels): read $Q, K$ ($2Nd$), write and read $S$ ($2N^2$), write and read $P$
#   ($2N^2$), read $V$ ($Nd$), write $O$ ($Nd$): $4N^2 + 4Nd$ elements;
# - **tiled, FA2 order**, K/V streamed from HBM for every $Q_i$: $Q$ and $O$ once, $K$ and $V$
#   $T_r$ times, plus the lse: $2Nd + 2Nd\,T_r$ elements $+\,4N$ bytes. In practice $K_j, V_j$
#   tiles are shared through L2 by the programs that run at the same time, so the true HBM traffic
#   lies between this and the ideal $4Nd$.
#
# First, the demo's own count (what its loads and stores would move) agrees with the formula:

# %%
def vanilla_bytes(N, d, bpe=2):
    return (4 * N * N + 4 * N * d) * bpe


def tiled_bytes(N, d, Br, bpe=2):
    Tr = math.ceil(N / Br)
    return (2 * N * d + 2 * N * d * Tr) * bpe + 4 * N


q, k, v = (torch.randn(512, 128, dtype=torch.float16) for _ in range(3))
st = {}
flash_attention_demo(q, k, v, causal=False, Br=128, Bc=64, stats=st)
print("demo counted:", st["bytes"], " formula:", tiled_bytes(512, 128, 128))

# %%
print(f"{'N':>7s} {'vanilla MiB':>12s} {'tiled, no L2':>13s} {'ideal 4Nd':>10s} {'vanilla/tiled':>14s} {'vanilla/ideal':>14s}")
for N in (1024, 2048, 4096, 8192, 16384, 32768):
    va, ti, ideal = vanilla_bytes(N, 128), tiled_bytes(N, 128, 128), 4 * N * 128 * 2
    print(f"{N:7d} {va / 2**20:12.1f} {ti / 2**20:13.1f} {ideal / 2**20:10.1f} {va / ti:14.1f} {va / ideal:14.0f}")

# %% [markdown]
# Read the table honestly:
#
# - If every $K_j, V_j$ re-read went to HBM, tiling would save only a factor $2B_r/d$ of traffic
#   (2 at $B_r = d = 128$): $K$ and $V$ are streamed $T_r = N/B_r$ times.
# - They do not go to HBM. Triton's grid (lecture 05) numbers the $T_r$ programs of one head
#   consecutively, so they run at about the same time and read the same $K_j, V_j$ tiles; the second
#   and later reads hit the 50 MB L2 (one head's $K$ and $V$ at $N = 16\,384$, $d = 128$ are 8 MiB).
#   The HBM traffic approaches the ideal $4Nd$, and the saving grows as $N/d$: the last column.
# - Independently of traffic, the extra **memory** drops from $O(N^2)$ ($S$ and $P$) to $O(N)$ (the lse).
#
# FlashAttention-1's Theorem 2 states the bound without a cache: $\Theta(N^2 d^2 / M)$ HBM accesses
# for on-chip memory $M$ (elements), against $\Theta(Nd + N^2)$ for standard attention; with
# $d = 128$ and $M \approx 10^5$, $d^2/M \approx 0.14$. Lecture 00's roofline turns these byte counts
# into "memory-bound or compute-bound".
#
# ## Summary
#
# - Tiles: FA1's rule $B_c = \lceil M/4d \rceil$, $B_r = \min(B_c, d)$ gives 228 × 128 on H100 at
#   $d = 128$; real kernels use 128 × 64 or 128 × 128 for registers and tensor-core shapes.
# - FA2 order ($Q_i$ outer) keeps $O_i, m_i, \ell_i$ on chip, divides once, and gives $T_r \cdot B \cdot H$
#   independent programs.
# - Per tile: new max, $\alpha$ rescale of $\ell_i$ and $O_i$, $P_{ij} V_j$. Causal: skip tiles above
#   the diagonal, mask only diagonal tiles, bottom-right aligned. GQA: KV head $h \,//\, (H_q/H_{kv})$.
# - Return lse $= m + \ln \ell$ for the backward pass; rows with no key give $O = 0$, lse $= -\infty$.
#
# **Next:** exercise 04 (write `tiled_attention`: batched over heads, GQA, bottom-right causal for any
# $S_q$, $S_{kv}$, rows that see no key), then lecture 05 maps each
# $Q_i$ tile onto a Triton program.
