# %% [markdown]
# # 08 — The backward pass of attention
#
# Lectures 04-07 computed $O = \operatorname{softmax}(\text{scale}\cdot QK^\top)\,V$ without ever
# writing $S$ or $P$ to memory, and returned one extra number per row, $\text{lse}_i$. Training needs
# the gradients $dQ, dK, dV$ from the gradient of the output $dO$. For one head, with
# $D_i = \sum_c dO_{ic}\,O_{ic}$:
#
# $$\begin{aligned}
# P &= \exp(\text{scale}\cdot QK^\top - \text{lse}) && \text{(rebuilt, not stored)}\\
# dV &= P^\top dO, \qquad dP = dO\,V^\top\\
# dS &= P \circ (dP - D), \qquad D = \operatorname{rowsum}(dO \circ O)\\
# dQ &= \text{scale}\cdot dS\,K, \qquad dK = \text{scale}\cdot dS^\top Q
# \end{aligned}$$
#
# **What you will learn**
# - where each of these lines comes from: the forward's lines read backwards, the softmax's
#   Jacobian folded into one number per row ($D_i$), checked against autograd in float64, with GQA
#   and the course's bottom-right causal mask;
# - recomputation: why the backward rebuilds $P$ from $Q$, $K$ and the lse instead of reading it,
#   and how much memory that saves (measured, for growing $N$);
# - FlashAttention-2's backward loop order: key tiles outer, one program per key tile, $dK_j, dV_j$ in
#   registers, $dQ$ accumulated across programs; atomics or a second pass for $dQ$, and what the
#   choice does to determinism (shown, in the last bits);
# - causal tile skipping in the backward, and GQA: $dK$, $dV$ summed over the query heads of a group;
# - the FLOP count (2.5× the forward) and where the time goes;
# - a tiled backward in PyTorch inside a `torch.autograd.Function` whose forward saves $O(N)$ state,
#   used to train a small transformer, step for step against PyTorch's own attention;
# - on Hopper: which of the backward's products run as WGMMA with which operand in registers, why
#   $dQ$ is the hard part, and the two ways to collect it (in any order, or in a fixed one) with
#   what each costs, measured.
#
# **Papers followed.** FlashAttention (Dao, Fu, Ermon, Rudra, Ré 2022): §3.1 and Appendix B
# (recomputation, the backward pass, the rowsum trick for the softmax gradient). FlashAttention-2
# (Dao 2023): §3.1 Algorithm 2 (the backward, $D$ computed first), §3.2 (parallelism over key tiles
# in the backward, atomic adds for $dQ$).
#
# Exercise 08 asks for `flash_attention_train(q, k, v, causal=False, scale=None) -> o`, differentiable,
# with Triton kernels for the forward and the backward. The PyTorch code in this lecture is the
# algorithm written out loop by loop, in fp32; it is not that exercise's answer.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from facourse import causal_mask, gpu_or_skip, reference_attention

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

# %% [markdown]
# ## 1. The gradients, read off the forward's lines
#
# For one head, the forward is three lines (the mask sets some $S_{ij}$ to $-\infty$):
#
# $$S = \text{scale}\cdot Q K^\top, \qquad P = \operatorname{softmax}_{\text{row}}(S), \qquad O = P V.$$
#
# Backpropagation walks them from the last to the first. Write $dX$ for $\partial L / \partial X$,
# the gradient of the loss with respect to $X$, of $X$'s shape.
#
# **$O = PV$.** A matrix product $C = AB$ gives $dA = dC\,B^\top$ and $dB = A^\top dC$. So
# $$dV = P^\top dO \quad (S_{kv}\times d), \qquad dP = dO\,V^\top \quad (S_q \times S_{kv}).$$
#
# **$P = \operatorname{softmax}(S)$, row by row.** For one row $p = \operatorname{softmax}(s)$,
# $\partial p_j / \partial s_k = p_j(\delta_{jk} - p_k)$, so
# $$dS_{ik} = \sum_j dP_{ij}\, P_{ij}(\delta_{jk} - P_{ik}) = P_{ik}\Big(dP_{ik} - \sum_j P_{ij}\, dP_{ij}\Big).$$
# The sum looks like a full row of $P$ times a full row of $dP$: a second pass over $N$ keys. It is
# not. Substitute $dP_{ij} = \sum_c dO_{ic} V_{jc}$:
# $$\sum_j P_{ij}\, dP_{ij} = \sum_c dO_{ic} \sum_j P_{ij} V_{jc} = \sum_c dO_{ic}\, O_{ic} =: D_i .$$
# One dot product per row, of two $d$-vectors the backward already has ($dO$ is its input, $O$ the
# forward's output). Hence
# $$dS = P \circ (dP - D), \qquad D = \operatorname{rowsum}(dO \circ O).$$
# A masked entry has $P_{ij} = 0$ and therefore $dS_{ij} = 0$: the mask needs no rule of its own.
#
# **$S = \text{scale}\cdot QK^\top$.** The matrix-product rule once more:
# $$dQ = \text{scale}\cdot dS\, K, \qquad dK = \text{scale}\cdot dS^\top Q .$$
#
# **GQA.** Query head $h$ reads KV head $h // g$ with $g = H_q / H_{kv}$: one $K$ is used by $g$ heads,
# and the gradient of a tensor used $g$ times is the sum of the $g$ gradients. So $dK$ and $dV$ of a
# KV head are the sums of the per-query-head $dK$ and $dV$ over its group; $dQ$ stays per head.
#
# The dense version, all heads at once, in float64. $P$ is rebuilt from the lse (section 2 says why):
# $P = \exp(S - \text{lse})$. A row that sees no key has $\text{lse} = -\infty$; replacing it by
# $+\infty$ makes its $P$ exactly zero instead of NaN ($-\infty - (-\infty)$).

# %%
def attention_backward_dense(q, k, v, o, lse, do, causal=False, scale=None):
    """dq, dk, dv of attention from the saved (q, k, v, o, lse) and dO: the five formulas, dense."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kx, vx = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)   # head h reads KV head h // g
    s = scale * q @ kx.transpose(-1, -2)                                    # S = scale · Q Kᵀ
    if causal:                                                              # bottom-right: j <= i + Skv - Sq
        i, j = torch.arange(Sq)[:, None], torch.arange(Skv)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), -math.inf)
    lse_safe = torch.where(lse == -math.inf, math.inf, lse).to(s.dtype)     # rows with no key: P = 0
    p = torch.exp(s - lse_safe[..., None])                                  # P = exp(S - lse)
    dv = p.transpose(-1, -2) @ do                                           # dV = Pᵀ dO      (per query head)
    dp = do @ vx.transpose(-1, -2)                                          # dP = dO Vᵀ
    Drow = (do * o).sum(-1, keepdim=True)                                   # D = rowsum(dO ∘ O)
    ds = p * (dp - Drow)                                                    # dS = P ∘ (dP - D)
    dq = scale * ds @ kx                                                    # dQ = scale · dS K
    dk = scale * ds.transpose(-1, -2) @ q                                   # dK = scale · dSᵀ Q  (per query head)
    fold = lambda t: t.reshape(B, Hkv, g, Skv, D).sum(2)                    # GQA: sum over the group
    return dq, fold(dk), fold(dv)


# %% [markdown]
# The check: autograd through `facourse.reference_attention` (the course's definition of attention:
# GQA, bottom-right causal) in float64, against the formulas, on shapes that exercise every case:
# $S_q < S_{kv}$ (a prefill against a cache), $S_q > S_{kv}$ (rows that see no key), a group of 4
# and multi-query attention.

# %%
def autograd_grads(q, k, v, do, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = reference_attention(q, k, v, causal=causal)
    o.backward(do)
    return o.detach(), lse.double(), q.grad, k.grad, v.grad


shapes = [  # B, Hq, Hkv, Sq, Skv, D, causal
    (2, 4, 4, 37, 53, 16, False),
    (2, 8, 2, 37, 53, 16, True),      # GQA 4, causal with Sq < Skv
    (1, 4, 1, 50, 30, 8, True),       # MQA, Sq > Skv: the first 20 rows see no key
]
for B, Hq, Hkv, Sq, Skv, D, causal in shapes:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, Hq, Sq, D, dtype=torch.float64, generator=gen)
    k, v = (torch.randn(B, Hkv, Skv, D, dtype=torch.float64, generator=gen) for _ in range(2))
    do = torch.randn(B, Hq, Sq, D, dtype=torch.float64, generator=gen)
    o, lse, dq_ref, dk_ref, dv_ref = autograd_grads(q, k, v, do, causal)
    dq, dk, dv = attention_backward_dense(q, k, v, o, lse, do, causal)
    errs = [(a - b).abs().max().item() for a, b in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref))]
    print(f"Hq={Hq} Hkv={Hkv} Sq={Sq} Skv={Skv} causal={causal}:  max |error| dQ {errs[0]:.1e}  "
          f"dK {errs[1]:.1e}  dV {errs[2]:.1e}")
    # lse is fp32 in the contract: P = exp(S - lse) carries its ~1e-7 relative rounding into the grads
    assert max(errs) < 1e-5, errs
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()

# %% [markdown]
# The errors are about $10^{-7}$, not $10^{-15}$, and that is the contract, not the formulas: the
# lse is returned in fp32 (lecture 04), so the rebuilt $P$ carries fp32's relative rounding. With the
# lse in float64 the formulas agree with autograd to float64's last digits:

# %%
# q, k, v, do, o and the autograd gradients are still those of the loop's last case (MQA, Sq > Skv)
s64 = (q @ k.repeat_interleave(4, dim=1).transpose(-1, -2) / math.sqrt(8)).masked_fill(~causal_mask(50, 30), -math.inf)
lse64 = torch.logsumexp(s64, dim=-1)                # -inf on the 20 rows that see no key
dq, dk, dv = attention_backward_dense(q, k, v, o, lse64, do, causal=True)
err64 = max((a - b).abs().max().item() for a, b in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)))
print(f"with a float64 lse: max |error| {err64:.1e}")
assert err64 < 1e-12

# %% [markdown]
# ## 2. Recomputation: keep the lse, rebuild $P$
#
# Autograd keeps whatever the forward's operations need for their backward. For attention written
# plainly that includes $P$ ($S_q \times S_{kv}$ per head, the output of the softmax, which the
# softmax's backward and $P V$'s backward both read) and the mask: $O(N^2)$ memory per head, exactly
# what the forward worked to avoid. FlashAttention's backward instead keeps $Q, K, V, O$ and the lse
# ($O(N d)$ and $O(N)$) and rebuilds each tile of $P$ on chip when it needs it:
#
# $$P_{ij} = \exp\big(\text{scale}\cdot Q_i K_j^\top - \text{lse}_i\big),$$
#
# one more $Q_i K_j^\top$ per tile: the backward pays $2 N^2 d$ FLOPs to avoid reading (and having
# written) $N^2$ numbers. On a GPU that is a good trade twice over: the memory is gone, and reading
# a tile of $P$ back from HBM would take longer than the matmul that recomputes it (per element of
# $P$: $2d$ FLOPs against 2 bytes, an intensity of $d = 128$ FLOP/byte, below an H100's 295;
# lecture 00's roofline). FlashAttention §3.1 and Appendix B introduce this recomputation.
#
# Measured below: the bytes autograd saves for the backward, counted with
# `torch.autograd.graph.saved_tensors_hooks` (every tensor that an operation saves passes through
# the pack hook; views of one storage are counted once). Plain attention against `TiledAttention`,
# the `torch.autograd.Function` of section 5, which saves `q, k, v, o, lse`. The function is defined
# there; the measurement is repeated there. Here, the plain side and what the tiled side would save:

# %%
class SavedBytes:
    """Bytes of the distinct storages that autograd saves for the backward inside the `with` block."""

    def __init__(self):
        self.storages = {}

    def pack(self, t):
        s = t.untyped_storage()
        self.storages[s.data_ptr()] = s.nbytes()
        return t

    def __enter__(self):
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)

    @property
    def total(self):
        return sum(self.storages.values())


def plain_attention(q, k, v, causal=False, scale=None):
    """Attention as three lines of PyTorch; autograd saves what their backwards need."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        Sq, Skv = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(Sq, Skv, dtype=torch.bool).tril(Skv - Sq).logical_not(), -math.inf)
    return torch.softmax(s, dim=-1) @ v


N_LIST = (256, 512, 1024, 2048)
plain_saved = {}
for N in N_LIST:
    q, k, v = (torch.randn(1, 2, N, 64, requires_grad=True) for _ in range(3))
    with SavedBytes() as sb:
        plain_attention(q, k, v, causal=True)
    plain_saved[N] = sb.total
    print(f"N={N:5d}: plain attention saves {sb.total / 2**20:7.2f} MiB "
          f"(P alone: {2 * N * N * 4 / 2**20:6.2f} MiB, q, k, v, o and lse: {(4 * 2 * N * 64 + 2 * N) * 4 / 2**20:5.2f} MiB)")

# %% [markdown]
# Doubling $N$ multiplies the plain version's saved bytes by about four. At $N = 16\,384$, 32 heads
# and fp16, $P$ alone would be $16\,384^2 \cdot 32 \cdot 2$ bytes = 16 GiB for one layer of one sequence.
#
# ## 3. FlashAttention-2's backward loop order
#
# Look at which tiles each gradient needs. For a query tile $i$ and a key tile $j$:
#
# $$\begin{aligned}
# P_{ij} &= \exp(\text{scale}\cdot Q_i K_j^\top - \text{lse}_i), &
# dP_{ij} &= dO_i V_j^\top, &
# dS_{ij} &= P_{ij}\circ(dP_{ij} - D_i),\\
# dV_j &\mathrel{+}= P_{ij}^\top dO_i, &
# dK_j &\mathrel{+}= \text{scale}\cdot dS_{ij}^\top Q_i, &
# dQ_i &\mathrel{+}= \text{scale}\cdot dS_{ij} K_j .
# \end{aligned}$$
#
# $dV_j$ and $dK_j$ are sums over **query** tiles $i$; $dQ_i$ is a sum over **key** tiles $j$. One of
# the two has to be summed across programs. FlashAttention-2 (Algorithm 2, §3.2) makes the **key
# tile** the outer loop and the unit of parallelism: one program per $(K_j, V_j)$, batch and head. It
# loads $K_j, V_j$ once, keeps $dK_j, dV_j$ in registers while it walks over all $Q_i$, and writes them
# once. $dQ_i$ receives a contribution from every program, so each program adds its
# $\text{scale}\cdot dS_{ij}K_j$ into an fp32 $dQ$ buffer in HBM with **atomic adds**; a last small
# kernel converts it to the input dtype. A first small kernel computes $D = \operatorname{rowsum}(dO
# \circ O)$ for every row, so that the main loop reads $D_i$ next to $\text{lse}_i$.
#
# ![FA2 backward: one program per key tile, dQ accumulated by every program](../diagrams/backward_loop_order.png)
#
# Why keys outer? Per tile pair, the program reads $Q_i$, $dO_i$, $\text{lse}_i$, $D_i$ and updates
# $dQ_i$ (read-modify-write, fp32); the other choice, queries outer, would keep $dQ_i$ in registers
# but would have to sum $dK_j$ **and** $dV_j$ across programs: twice the atomic traffic.
#
# **Atomics make the result depend on timing.** Floating-point addition is not associative: the
# order in which programs add into $dQ_i$ changes the last bits of the sum, and with atomics that
# order is whatever order the programs happen to reach the add. Two runs of the same backward on the
# same inputs can then differ. The alternatives:
#
# - **a second pass for $dQ$** (queries outer, key tiles in a fixed order; Triton's fused-attention
#   tutorial computes $dQ$ this way, in a second loop of the same kernel): deterministic, no atomics,
#   but the pass recomputes $S_{ij}$, $P_{ij}$, $dP_{ij}$ and $dS_{ij}$, three matmuls instead of one
#   (section 6 counts them);
# - **a deterministic mode**: the `flash-attn` package's backward takes `deterministic=True`,
#   documented as slightly slower and using more memory, for runs that must reproduce bit for bit
#   (one way to get there: keep the programs' partial $dQ$ sums apart and add them in a fixed order,
#   which is where the memory goes).
#
# Sections 5 and 6 show both on the CPU.
#
# ## 4. Causal tiles and GQA in the backward
#
# With the bottom-right rule (key $j$ visible to query $i$ iff $j \le i + S_{kv} - S_q$), key tile $j$
# starting at column $j_0$ is seen only by queries $i \ge j_0 - (S_{kv} - S_q)$. The program of key
# tile $j$ therefore starts its inner loop at the first query tile that contains such a row; the
# query tiles above are skipped, the ones crossing the diagonal get the element mask, the rest need
# none. This is the forward's rule seen from the other side: in the forward the **last** query tiles
# have the most work, in the backward the **first** key tiles do (key tile 0 is seen by every query),
# so a kernel does well to launch those first.
#
# For GQA there are two choices. The `flash-attn` package's FlashAttention-2 runs one program per key tile and
# **query** head and writes a $dK$, $dV$ per query head to a scratch buffer $g$ times the size of $K$,
# then sums each group (a reduction after the kernel). Or one program per key tile and **KV** head
# loops over the $g$ query heads of its group and accumulates all of them into the same $dK_j, dV_j$
# registers: no scratch buffer, $g$ times fewer and longer programs. The code below does the second
# (it processes the group's heads side by side, as one batched matmul, and sums).

# %%
def tiles(n, block, start=0):
    """[(start, stop), ...] of the tiles of `block` rows that cover [start, n)."""
    return [(s, min(s + block, n)) for s in range(start, n, block)]


def query_tiles_for_key_tile(j0, Sq, Skv, block_m, causal):
    """The query tiles that the program of the key tile starting at column j0 visits."""
    if not causal:
        return tiles(Sq, block_m)
    first_row = max(j0 - (Skv - Sq), 0)                    # first query that sees column j0
    return tiles(Sq, block_m, start=first_row // block_m * block_m)


Sq = Skv = 1024
bm = bn = 128
visits = [len(query_tiles_for_key_tile(j0, Sq, Skv, bm, True)) for j0, _ in tiles(Skv, bn)]
print("query tiles visited by each key-tile program (causal, 1024 x 1024, 128 x 128 tiles):", visits)
print(f"{sum(visits)} of {(Sq // bm) * (Skv // bn)} tile pairs; the first program does {visits[0]}x the last one's work")

# %% [markdown]
# ## 5. A tiled backward in PyTorch
#
# First the forward of lecture 04, batched over batch and heads (the loops are over tiles only),
# returning `(o, lse)`. Query heads are grouped by the KV head they read, `[B, Hkv, g, S, d]`, so that
# one $K_j$ tile of shape `[B, Hkv, 1, Bc, d]` broadcasts over its group.

# %%
def tiled_forward(q, k, v, causal=False, scale=None, block_m=64, block_n=64):
    """Tiled attention, FA2 loop order, fp32 accumulation. Returns (o, lse)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    delta = Skv - Sq                                         # bottom-right: j visible iff j <= i + delta
    qg = q.float().reshape(B, Hkv, g, Sq, D)
    kg, vg = k.float()[:, :, None], v.float()[:, :, None]    # [B, Hkv, 1, Skv, D]: broadcast over the group
    o = torch.empty(B, Hkv, g, Sq, D)
    lse = torch.empty(B, Hkv, g, Sq)
    for i0, i1 in tiles(Sq, block_m):
        Q_i = qg[..., i0:i1, :]
        m = torch.full((B, Hkv, g, i1 - i0), -math.inf)
        l = torch.zeros(B, Hkv, g, i1 - i0)
        acc = torch.zeros(B, Hkv, g, i1 - i0, D)
        for j0, j1 in tiles(Skv, block_n):
            if causal and j0 > i1 - 1 + delta:               # above the diagonal: this and every later tile
                break
            s = scale * Q_i @ kg[..., j0:j1, :].transpose(-1, -2)
            if causal and j1 - 1 > i0 + delta:               # a diagonal tile: element mask
                rows, cols = torch.arange(i0, i1)[:, None], torch.arange(j0, j1)[None, :]
                s = s.masked_fill(cols > rows + delta, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            m_use = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp(s - m_use[..., None])
            alpha = torch.exp(m - m_use)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vg[..., j0:j1, :]
            m = m_new
        empty = l == 0                                       # rows that saw no key
        o[..., i0:i1, :] = acc / torch.where(empty, 1.0, l)[..., None]
        lse[..., i0:i1] = torch.where(empty, -math.inf, m + torch.log(l))
    return o.reshape(B, Hq, Sq, D).to(q.dtype), lse.reshape(B, Hq, Sq)


# %% [markdown]
# Then the backward, FlashAttention-2's order. `program_order` is the order in which the key-tile
# programs run (on a GPU: whatever order they reach the atomic add); `dq_mode="atomic"` adds each
# program's share into the fp32 `dq` buffer as it goes, `dq_mode="separate"` computes $dQ$ in a second
# pass with queries outer and the key tiles in a fixed order.

# %%
def tiled_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=64, block_n=64,
                   dq_mode="atomic", program_order=None):
    """dq, dk, dv from the saved (q, k, v, o, lse): FA2's backward, one key tile per 'program'."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    delta = Skv - Sq
    group = lambda t: t.float().reshape(B, Hkv, g, Sq, -1)
    qg, og, dog = group(q), group(o), group(do)
    kf, vf = k.float(), v.float()
    lse_g = lse.reshape(B, Hkv, g, Sq)
    lse_g = torch.where(lse_g == -math.inf, math.inf, lse_g)     # rows with no key: P = 0, not NaN
    Drow = (dog * og).sum(-1)                                    # kernel 1: D = rowsum(dO ∘ O)
    dq = torch.zeros(B, Hkv, g, Sq, D)                           # fp32 accumulator (atomic adds)
    dk, dv = torch.empty(B, Hkv, Skv, D), torch.empty(B, Hkv, Skv, D)

    def tile_grads(i0, i1, j0, j1):
        """P_ij and dS_ij of one tile pair: the recomputation."""
        K_j, V_j = kf[:, :, None, j0:j1], vf[:, :, None, j0:j1]
        s = scale * qg[..., i0:i1, :] @ K_j.transpose(-1, -2)   # S_ij, recomputed
        if causal and j1 - 1 > i0 + delta:                       # a diagonal tile
            rows, cols = torch.arange(i0, i1)[:, None], torch.arange(j0, j1)[None, :]
            s = s.masked_fill(cols > rows + delta, -math.inf)
        p = torch.exp(s - lse_g[..., i0:i1, None])               # P_ij = exp(S_ij - lse_i)
        dp = dog[..., i0:i1, :] @ V_j.transpose(-1, -2)          # dP_ij = dO_i V_jᵀ
        ds = p * (dp - Drow[..., i0:i1, None])                   # dS_ij = P_ij ∘ (dP_ij - D_i)
        return p, ds, K_j

    key_tiles = tiles(Skv, block_n)
    order = range(len(key_tiles)) if program_order is None else program_order
    for jt in order:                                             # kernel 2: one program per key tile
        j0, j1 = key_tiles[jt]
        dK_j = torch.zeros(B, Hkv, j1 - j0, D)                   # registers of the program
        dV_j = torch.zeros(B, Hkv, j1 - j0, D)
        for i0, i1 in query_tiles_for_key_tile(j0, Sq, Skv, block_m, causal):
            p, ds, K_j = tile_grads(i0, i1, j0, j1)
            dV_j += (p.transpose(-1, -2) @ dog[..., i0:i1, :]).sum(2)          # dV_j += P_ijᵀ dO_i, summed over the group
            dK_j += scale * (ds.transpose(-1, -2) @ qg[..., i0:i1, :]).sum(2)  # dK_j += scale dS_ijᵀ Q_i
            if dq_mode == "atomic":
                dq[..., i0:i1, :] += scale * ds @ K_j                          # atomic add into HBM
        dk[:, :, j0:j1], dv[:, :, j0:j1] = dK_j, dV_j            # written once
    if dq_mode == "separate":                                    # kernel 3: queries outer, fixed order
        for i0, i1 in tiles(Sq, block_m):
            dQ_i = torch.zeros(B, Hkv, g, i1 - i0, D)
            for j0, j1 in key_tiles:
                if causal and j0 > i1 - 1 + delta:
                    break
                p, ds, K_j = tile_grads(i0, i1, j0, j1)
                dQ_i += scale * ds @ K_j
            dq[..., i0:i1, :] = dQ_i
    return dq.reshape(B, Hq, Sq, D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# %% [markdown]
# And the `torch.autograd.Function` that joins them. Its forward saves `q, k, v, o, lse`, nothing of
# size $N^2$; its backward receives $dO$ and returns one gradient per input of `forward`.

# %%
class TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_m, block_n):
        o, lse = tiled_forward(q, k, v, causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)                   # O(N d) + O(N): the whole state
        ctx.args = (causal, scale, block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, block_m, block_n = ctx.args
        dq, dk, dv = tiled_backward(q, k, v, o, lse, do, causal, scale, block_m, block_n)
        return dq, dk, dv, None, None, None, None                # no gradient for causal, scale, blocks


def tiled_attention(q, k, v, causal=False, scale=None, block_m=64, block_n=64):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return TiledAttention.apply(q, k, v, causal, scale, block_m, block_n)


# %% [markdown]
# The gradients, fp32 tiles against float64 autograd, on the configurations of section 1 plus a
# ragged one (no length a multiple of a tile), a case with $S_q > S_{kv}$ (rows with no key) and a
# larger head dimension. The tiles compute in fp32, so the errors relative to the largest gradient
# are fp32's rounding, a few $10^{-7}$; the assertion allows $10^{-5}$. (`torch.autograd.gradcheck`
# would test the same thing by finite differences, in float64 and much more slowly.)

# %%
def grad_errors(fn, B, Hq, Hkv, Sq, Skv, D, causal, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, dtype=torch.float64, generator=gen)
    k, v = (torch.randn(B, Hkv, Skv, D, dtype=torch.float64, generator=gen) for _ in range(2))
    do = torch.randn(B, Hq, Sq, D, dtype=torch.float64, generator=gen)
    _, _, *ref = autograd_grads(q, k, v, do, causal)
    x = [t.float().requires_grad_() for t in (q, k, v)]
    fn(*x, causal=causal).backward(do.float())
    return [((t.grad.double() - r).abs().max() / r.abs().max()).item() for t, r in zip(x, ref)]


cases = shapes + [(1, 4, 2, 200, 333, 32, True), (1, 4, 2, 300, 100, 32, True), (2, 6, 3, 128, 128, 64, False)]
for case in cases:
    rel = grad_errors(lambda q, k, v, causal: tiled_attention(q, k, v, causal, block_m=32, block_n=48), *case)
    print(f"{str(case):34s} max error / max |grad|:  dQ {rel[0]:.1e}  dK {rel[1]:.1e}  dV {rel[2]:.1e}")
    assert max(rel) < 1e-5, (case, rel)

# %% [markdown]
# Now the saved bytes of section 2 with the Function in place of the plain attention:

# %%
tiled_saved = {}
for N in N_LIST:
    q, k, v = (torch.randn(1, 2, N, 64, requires_grad=True) for _ in range(3))
    with SavedBytes() as sb:
        tiled_attention(q, k, v, causal=True, block_m=256, block_n=256)
    tiled_saved[N] = sb.total
    assert sb.total == (4 * 2 * N * 64 + 2 * N) * 4            # exactly q, k, v, o (fp32) and lse
    print(f"N={N:5d}: plain {plain_saved[N] / 2**20:7.2f} MiB   tiled {sb.total / 2**20:5.2f} MiB   "
          f"ratio {plain_saved[N] / sb.total:5.1f}")

fig, ax = plt.subplots(figsize=(6, 3.6))
ax.loglog(N_LIST, [plain_saved[n] / 2**20 for n in N_LIST], "o-", base=2, label="plain attention (autograd saves P, mask)")
ax.loglog(N_LIST, [tiled_saved[n] / 2**20 for n in N_LIST], "s-", base=2, label="TiledAttention (q, k, v, o, lse)")
ax.set_xlabel("sequence length N (2 heads, d = 64, fp32, causal)")
ax.set_ylabel("bytes saved for the backward (MiB)")
ax.set_title("measured with saved_tensors_hooks")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Determinism.** Run the backward twice with the key-tile programs in two different orders, as
# atomics would let them finish. $dK$ and $dV$ are written by one program each and come out bit for
# bit the same; $dQ$, summed across programs, does not. The separate-pass $dQ$ does not depend on
# the order.

# %%
gen = torch.Generator().manual_seed(3)
B, Hq, Hkv, S, D = 1, 4, 2, 512, 64
q = torch.randn(B, Hq, S, D, generator=gen)
k, v = (torch.randn(B, Hkv, S, D, generator=gen) for _ in range(2))
do = torch.randn(B, Hq, S, D, generator=gen)
o, lse = tiled_forward(q, k, v, causal=False, scale=D**-0.5)
n_programs = S // 64
orders = [list(range(n_programs)), torch.randperm(n_programs, generator=gen).tolist()]
runs = {(mode, i): tiled_backward(q, k, v, o, lse, do, False, D**-0.5, dq_mode=mode, program_order=order)
        for mode in ("atomic", "separate") for i, order in enumerate(orders)}
for mode in ("atomic", "separate"):
    a, b = runs[(mode, 0)], runs[(mode, 1)]
    same = [torch.equal(x, y) for x, y in zip(a, b)]
    differ = (a[0] != b[0]).float().mean().item()
    print(f"{mode:8s}: bitwise equal dQ {same[0]}, dK {same[1]}, dV {same[2]};  elements of dQ that differ "
          f"{differ:6.1%}, max |difference| {(a[0] - b[0]).abs().max().item():.1e}")
assert not torch.equal(runs[("atomic", 0)][0], runs[("atomic", 1)][0])
assert all(torch.equal(x, y) for x, y in zip(runs[("separate", 0)], runs[("separate", 1)]))
assert torch.equal(runs[("atomic", 0)][1], runs[("atomic", 1)][1])

# %% [markdown]
# The differences are in the last bit or two of fp32 ($\sim 10^{-7}$ relative): harmless for
# training, fatal for a test that compares two runs with `torch.equal`, and a source of runs that do
# not reproduce. The same effect appears with a different number of programs in flight or a
# different GPU.
#
# ## 6. The FLOP count, and where the time goes
#
# Count the matrix products per tile pair ($B_r \times B_c$ tile, head dimension $d$; each product
# costs $2 B_r B_c d$ FLOPs):
#
# | pass | matmuls | FLOPs per visible (query, key) pair |
# |---|---|---|
# | forward | $S = QK^\top$, $O \mathrel{+}= PV$ | $2 \cdot 2d = 4d$ |
# | backward (FA2, atomic $dQ$) | $S = QK^\top$ (recompute), $dV \mathrel{+}= P^\top dO$, $dP = dO V^\top$, $dK \mathrel{+}= dS^\top Q$, $dQ \mathrel{+}= dS K$ | $5 \cdot 2d = 10d$ |
# | backward, separate $dQ$ pass | the four above without $dQ$; then, in the $dQ$ pass, $QK^\top$ and $dO V^\top$ once more and $dQ = dS K$ | $7 \cdot 2d = 14d$ |
#
# So the backward does $10/4 = 2.5\times$ the forward's matmul FLOPs (3.5× with a separate $dQ$ pass),
# and a training step (forward + backward) $3.5\times$ the forward. Measured, not assumed: PyTorch's
# `FlopCounterMode` counts the FLOPs of every matmul our code dispatches.

# %%
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn):
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


B, Hq, Hkv, S, D = 1, 4, 2, 256, 64
q, k, v = (torch.randn(B, h, S, D, requires_grad=True) for h in (Hq, Hkv, Hkv))
do = torch.randn(B, Hq, S, D)
for causal in (False, True):
    o, lse = tiled_forward(q.detach(), k.detach(), v.detach(), causal, D**-0.5)
    fwd = count_flops(lambda: tiled_forward(q.detach(), k.detach(), v.detach(), causal, D**-0.5))
    bwd = {m: count_flops(lambda: tiled_backward(q.detach(), k.detach(), v.detach(), o, lse, do, causal, D**-0.5, dq_mode=m))
           for m in ("atomic", "separate")}
    pairs = S * S if not causal else S * (S + 1) // 2
    print(f"causal={causal!s:5s}: forward {fwd / 1e6:6.1f} MFLOP ({fwd / (B * Hq * pairs * D):.2f} d per pair), "
          f"backward {bwd['atomic'] / fwd:.2f}x the forward, with a separate dQ pass {bwd['separate'] / fwd:.2f}x")
    assert bwd["atomic"] == 5 * fwd // 2 and bwd["separate"] == 7 * fwd // 2

# %% [markdown]
# (With causal masking the tiles count whole, diagonal ones included, so "per pair" exceeds $4d$ a
# little at these tile sizes; the ratio stays exactly 2.5 because the forward and the backward visit
# the same tiles.) The course's benchmark counts $4d$ per visible pair for the forward; for a
# backward, $10d$. That is FlashAttention-2's convention (§4.1): its benchmarks multiply the forward's
# FLOPs by 2.5 for the backward, 2 matmuls against 5 once $S$ is recomputed.
#
# ![FLOPs per pass, and one tile pair's time on an H100 (a model)](../diagrams/backward_flops.png)
#
# **Where the time goes.** FLOPs are not the whole story. Per tile pair the backward also computes
# $B_r B_c$ exponentials (the recomputed $P$; the forward computes as many), reads $Q_i$, $dO_i$,
# $\text{lse}_i$, $D_i$ and read-modify-writes $dQ_i$ in fp32. The right panel of the figure is a
# model of one tile pair on one SM of an H100 ($B_r = B_c = d = 128$; tensor cores at the dense FP16
# peak, 989 TFLOP/s over 132 SMs; 16 `exp2` per clock per SM at 1.83 GHz, the CUDA C++ Programming
# Guide's throughput table, as in lecture 07). The exponentials, which cost the forward half as much
# time as its matmuls (the reason FlashAttention-3 overlaps them, lecture 07), are a fifth of the
# backward's: the backward is dominated by its matmuls. Yet real backward kernels reach a lower
# fraction of the peak than forward kernels; in FlashAttention-2's own benchmarks (§4.1) the backward
# runs below the forward's fraction of the A100's peak. What the model leaves out is why:
#
# - five matmuls whose operands alternate between tiles and their transposes ($P^\top$, $dS^\top$,
#   $K_j$ for $dQ$ but $K_j^\top$ for $S$), so each tile must be laid out for two uses;
# - more live state per program: the $dK_j$ and $dV_j$ accumulators ($2 B_c d$ fp32 values) on top of
#   the $S$/$P$ and $dP$/$dS$ tiles, so smaller tiles or fewer pipeline stages fit;
# - the $dQ$ traffic: a $B_r \times d$ fp32 read-modify-write per tile pair, through atomics in L2,
#   where the forward writes each $O_i$ once;
# - a prologue kernel ($D$) and an epilogue kernel ($dQ$ to the input dtype), each a pass over HBM.
#
# The GPU cell at the end of this lecture measures PyTorch's FlashAttention-2 backward against its
# forward.
#
# ## 7. A real use: training a small transformer
#
# The Function is a drop-in attention for a model. A two-layer decoder (width 32, 4 query heads
# sharing 2 KV heads, causal) learns a copy task: 8 random digits, a separator, the same 8
# digits again; the loss is on the second copy, which only attention can predict. It is trained
# twice from the same seed on the same batches: once with `tiled_attention`, once with PyTorch's
# `scaled_dot_product_attention` (`enable_gqa=True`; for $S_q = S_{kv}$ its top-left `is_causal`
# equals the course's bottom-right rule). Everything else is identical, so the two loss curves
# may differ only by fp32 rounding, which training then carries along.

# %%
class Block(torch.nn.Module):
    def __init__(self, width, hq, hkv, attn):
        super().__init__()
        self.hq, self.hkv, self.dh, self.attn = hq, hkv, width // hq, attn
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.wq = torch.nn.Linear(width, hq * self.dh)
        self.wkv = torch.nn.Linear(width, 2 * hkv * self.dh)
        self.wo = torch.nn.Linear(hq * self.dh, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x):
        B, S, _ = x.shape
        h = self.ln1(x)
        q = self.wq(h).view(B, S, self.hq, self.dh).transpose(1, 2)             # [B, Hq, S, dh]
        k, v = self.wkv(h).view(B, S, 2, self.hkv, self.dh).permute(2, 0, 3, 1, 4)  # [B, Hkv, S, dh] each
        a = self.attn(q, k, v).transpose(1, 2).reshape(B, S, -1)
        x = x + self.wo(a)
        return x + self.mlp(self.ln2(x))


class TinyDecoder(torch.nn.Module):
    def __init__(self, attn, vocab, seq, width=32, layers=2, hq=4, hkv=2):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, width), torch.nn.Parameter(0.1 * torch.randn(seq, width))
        self.blocks = torch.nn.ModuleList(Block(width, hq, hkv, attn) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(x)


ATTENTION = {
    "tiled_attention (this lecture)": lambda q, k, v: tiled_attention(q, k, v, causal=True, block_m=8, block_n=8),
    "torch SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
}
L, SEP, VOCAB, STEPS, BATCH = 8, 10, 11, 300, 16
data_gen = torch.Generator().manual_seed(1234)
digits = torch.randint(0, 10, (STEPS, BATCH, L), generator=data_gen)
batches = torch.cat([digits, torch.full((STEPS, BATCH, 1), SEP), digits], dim=-1)   # [steps, batch, 2L + 1]

def train(attn, steps=STEPS):
    """The loss of each step, from the same initial weights and batches for every attention."""
    torch.manual_seed(0)
    model = TinyDecoder(attn, VOCAB, seq=2 * L + 1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    for step in range(steps):
        tokens = batches[step]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits[:, L:].reshape(-1, VOCAB), tokens[:, L + 1:].reshape(-1))  # the second copy
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


curves, seconds = {}, {}
for name, attn in ATTENTION.items():
    t0 = time.perf_counter()
    curves[name] = train(attn)
    seconds[name] = time.perf_counter() - t0

(a_name, a), (b_name, b) = curves.items()
gap = (a - b).abs().max().item()
print(f"loss: {a[0]:.3f} -> {a[-10:].mean():.3f} (mean of the last 10 steps); chance is ln 10 = {math.log(10):.3f}")
print(f"|loss difference| over the first 10 steps: at most {(a[:10] - b[:10]).abs().max().item():.1e}")
print(f"max |loss difference| over {STEPS} steps: {gap:.1e} (step {(a - b).abs().argmax().item()});  time: "
      + ", ".join(f"{n} {s:.1f} s" for n, s in seconds.items()))
TOL = 1e-3
assert gap < TOL, f"the two runs drifted apart by {gap:.1e} (> {TOL})"
assert a[-10:].mean() < 0.5 * math.log(10), "the model did not learn to copy"

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
for name, c in curves.items():
    ax1.plot(c, label=name, lw=1.2, ls="-" if "tiled" in name else "--")
ax1.set_xlabel("step")
ax1.set_ylabel("cross-entropy on the copied half")
ax1.legend(fontsize=8)
ax1.set_title("the same run with two attentions")
ax2.semilogy((a - b).abs().clamp_min(1e-9))
ax2.axhline(TOL, color="r", ls=":", label=f"tolerance {TOL:g}")
ax2.set_xlabel("step")
ax2.set_ylabel("|loss difference|")
ax2.legend(fontsize=8)
ax2.set_title("fp32 rounding, carried through training")
fig.tight_layout()
plt.show()

# %% [markdown]
# The tolerance, $10^{-3}$ in the loss, is a statement about fp32, not about the algorithm: the two
# attentions round differently in their last bits (different summation orders, one $\exp$ per
# tile), and training carries those differences along: the gap starts near fp32's rounding of the loss
# (the cell's second line) and grows over the 300 steps to the largest gap it prints, below the
# tolerance by about two orders of magnitude on the CPUs we ran it on. (A larger learning rate makes
# the late, fast part of training amplify it more.)
#
# A wrong gradient is of another order. The cell below trains the same model with $D$ dropped from
# $dS$ (the softmax's Jacobian cut short: `tiled_backward` handed $O = 0$, so that
# $D = \mathrm{rowsum}(dO \circ O) = 0$) and prints how far its loss is from SDPA's as it goes.

# %%
class NoDTerm(TiledAttention):
    """The classic mistake: dS = P ∘ dP, without the - D term."""
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, block_m, block_n = ctx.args
        dq, dk, dv = tiled_backward(q, k, v, torch.zeros_like(o), lse, do, causal, scale, block_m, block_n)
        return dq, dk, dv, None, None, None, None


WRONG_STEPS = 40
wrong = train(lambda q, k, v: NoDTerm.apply(q, k, v, True, q.shape[-1] ** -0.5, 8, 8), WRONG_STEPS)
off = (wrong - curves["torch SDPA"][:WRONG_STEPS]).abs()
print("|loss difference| from SDPA's run with D dropped, at steps "
      + ", ".join(f"{i}: {off[i].item():.1e}" for i in (1, 5, 10, 20, WRONG_STEPS - 1)))
first = (off > TOL).nonzero()
print(f"past the tolerance {TOL:g} from step {first[0].item() if len(first) else 'never'}; "
      f"loss {wrong[0]:.3f} -> {wrong[-1]:.3f} (SDPA's {curves['torch SDPA'][WRONG_STEPS - 1]:.3f})")
assert len(first), "the wrong gradient stayed within the tolerance"

# %% [markdown]
# The model still trains with the wrong gradient, but its loss leaves SDPA's within a few steps and
# passes the tolerance soon after (the lines above): the gap of a wrong gradient grows by orders of
# magnitude in steps where fp32's rounding stays put.
#
# ## 8. On a GPU
#
# What the course measured for step 08 on a GPU, if it is committed (`course/results/measured.json`,
# read by `facourse.results`):

# %%
from facourse import results

R08 = results.load("08")   # None until a measurement of step 08 is committed
if not R08:
    print("No GPU measurement of step 08 is committed yet (course/results/measured.json has no \"08\").")
else:
    from IPython.display import Markdown, display

    try:
        print(results.header(R08))
        display(Markdown(results.solution_table(R08)))
    except (KeyError, TypeError, ValueError) as e:   # a layout this lecture does not know: say so
        print(f"Step 08's committed results are there but this lecture cannot lay them out ({e!r}).")

# %% [markdown]
# And on a GPU, this cell times PyTorch's own FlashAttention-2 (SDPA's `FLASH_ATTENTION` backend)
# forward and backward with the course's timer (`facourse.bench.time_calls`: L2 flushed, GPU events,
# median), and reports the backward's time against the forward's and its TFLOP/s counted with
# $10 d$ per visible pair. Were the backward as efficient as the forward, the ratio would be 2.5;
# the amount by which it exceeds 2.5 is section 6's list, measured.

# %%
if gpu_or_skip("timing SDPA's backward"):
    import statistics

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from facourse.bench import new_flush_buffer, time_calls
    from facourse.configs import visible_pairs

    flush = new_flush_buffer()
    print(f"{'S':>6s} {'causal':>6s} {'fwd ms':>8s} {'bwd ms':>8s} {'bwd/fwd':>8s} {'fwd TFLOP/s':>12s} {'bwd TFLOP/s':>12s}")
    for S in (1024, 4096, 8192):
        for causal in (False, True):
            B, H, D = 16384 // S * 2, 16, 128
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                calls = {"fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                         "bwd": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)}
                gpu, _ = time_calls(calls, 20, flush)
            tf, tb = statistics.median(gpu["fwd"]), statistics.median(gpu["bwd"])
            pairs = B * H * visible_pairs(S, S, causal)
            print(f"{S:6d} {causal!s:>6s} {tf:8.3f} {tb:8.3f} {tb / tf:8.2f} "
                  f"{4 * D * pairs / tf / 1e9:12.0f} {10 * D * pairs / tb / 1e9:12.0f}")

# %% [markdown]
# ## 9. On Hopper: the backward with WGMMA, and where $dQ$ goes
#
# Exercise 08's kernels are Triton; the step's solution ladder ends with a CUDA rung for H100/H200,
# `v4_hopper` (`solutions/08_backward/ladder/v4_hopper.cu`), written with lecture 07's instructions
# and helpers (TMA, mbarriers, WGMMA, a producer warpgroup and two consumer warpgroups) and following
# FlashAttention-3's plan for the backward (Shah et al. 2024, §3 and Appendix B).
#
# One CTA owns a block of 128 keys, keeps $K_j$ and $V_j$ in shared memory for its whole life, and
# walks the query blocks $i$ of $B_M$ rows that see it (causal: from the first row that sees key
# $128j$), with $Q_i$, $dO_i$ arriving by TMA in a two-deep ring; $B_M$ is 64, or 80 at $d = 128$
# without a causal mask (the last paragraphs say why). Each consumer warpgroup owns 64 of the keys,
# and per query block issues five products:
#
# | product | per warpgroup | WGMMA form | A | B |
# |---|---|---|---|---|
# | $S^\top = K_j Q_i^\top$ | 64 keys × $B_M$ queries, $k = d$ | SS | $K_j$ (shared, K-major) | $Q_i$ (shared, K-major) |
# | $dP^\top = V_j\, dO_i^\top$ | 64 × $B_M$, $k = d$ | SS | $V_j$ | $dO_i$ |
# | $dV_j \mathrel{+}= P^\top dO_i$ | 64 × $d$, $k = B_M$ | RS | $P^\top$ (registers) | $dO_i$ (shared, MN-major) |
# | $dK_j \mathrel{+}= dS^\top Q_i$ | 64 × $d$, $k = B_M$ | RS | $dS^\top$ (registers) | $Q_i$ (shared, MN-major) |
# | $dQ_i^\top = K_j^\top dS_i^\top$ | 64 of $d$ × $B_M$ queries, $k = 128$ keys | SS | $K_j$ (shared, read transposed) | $dS_i$ (shared, K-major) |
#
# **Why $S^\top$, not $S$.** A WGMMA accumulator is laid out exactly as the A operand of the next
# product wants its registers (lecture 07, section 4: the `mma.sync` fragments stacked along $N$). With
# keys as the rows, $P^\top$ and $dS^\top$ come out of the first two products already in the place
# where $dV$ and $dK$ take their A operand: no transpose through shared memory. Only $dQ$ needs the
# other warpgroup's keys, so $dS$ goes through shared memory once: `stmatrix .trans` stores a warp's
# 8 × 8 blocks of $dS^\top$ transposed, as $dS$ (queries as rows), 128-byte swizzled like a TMA tile,
# and after one barrier each warpgroup computes 64 columns of $dQ_i^\top = K_j^\top dS_i^\top$ over all
# 128 keys, reading $K_j$ transposed (WGMMA's "transpose A" immediate, `wgmma_ss<T, N, 1, 0>` in
# `hopper_primitives.cuh`). $dQ$ comes out transposed so that the query block is WGMMA's $N$, which
# may be 80; its $M$ is always 64.
#
# **Registers.** $dK_j$ and $dV_j$ stay in registers for the whole walk: at $d = 128$ that is
# $2 \times 64 \times 128$ fp32 values per warpgroup, 128 registers per thread, before $S^\top$ and
# $dP^\top$ ($B_M / 2$ each) are in flight. `setmaxnreg` gives each consumer thread 240 and the producer 24
# (lecture 07's split is 232 and 40; at 232, with the issue order of the section's last paragraphs,
# ptxas spilled and serialised the WGMMAs, the C7512 below). Both move registers within the CTA's
# launch allocation, 168 a thread at 384 threads: a split past it (32 and 240) made every launch fail.
# The budget is tight enough that the compiler's view of it decides the speed: with a
# deadlock trap (`__trap()` after four seconds) in the consumers' barrier waits, ptxas reported
# "wgmma.mma_async instructions are serialized due to insufficient register resources" (C7512), waited
# after every WGMMA and spilled, and the first build ran at 155-185 TFLOP/s on an H200
# (`2026-11-27_h200_step08_v4_probes.txt`); without the trap (and with lecture 07's split of the
# registers), no spill and no serialisation. The consumers now spin without one (`mbar_wait_spin`); the producer, whose waits
# keep the trap, stops a lost arrival as well. The lesson generalises: read ptxas's `-v` output and
# its C75xx notes for every WGMMA kernel, not only the spill count (`facourse.cuda_build.nvcc_compile_check`
# lists them in its report and warns).
#
# **Why $dQ$ is the hard part.** $dQ_i = \sum_j dS_{ij} K_j$ sums over key blocks, which live in
# different CTAs. Two ways to collect it:
#
# - *add as you go*: every CTA adds its $64 \times d$ fp32 partial into a buffer in global memory.
#   FlashAttention-2 uses one atomic add per element; v4, like FlashAttention-3, hands the tile to a
#   writer thread through shared memory, which adds all of it in one instruction
#   (`cp.reduce.async.bulk ... .add.f32`, done in L2), and a small kernel scales and converts the
#   buffer at the end. The CTAs arrive in any order and fp32 addition is not associative: the last
#   bits of $dQ$ change from run to run (section 3's demonstration, now in hardware).
# - *in a fixed order*: either a separate pass for $dQ$ that loops over key blocks inside one program
#   (v3's choice: it recomputes $S$ and $dP$, seven products where five would do), or v4's
#   `deterministic=True`: a counter per $dQ$ tile, and the writer of key block $n$ adds only when the
#   counter reads $n$, waits until its add has landed, then bumps it. CTAs take their key blocks in
#   order from a ticket counter, so the block it waits for is already running and never waits on it.
#   The price is the wait, and the walk decides it: a key block whose first tile its predecessors
#   reach only late idles until they do. Causal, walking the query blocks upwards, key block $n$ starts
#   at its diagonal, which key block 0 reaches last; walking downwards from the last query block, every
#   key block starts on the same tile and each waits only for the add of the one before.
#
# **Where the tickets go.** Per query block a CTA reads 32 KB of $Q_i$, $dO_i$ and adds a 32 KB fp32
# tile into $dQ$'s buffer, so all of the GPU's resident CTAs together move a few MB per step: whether
# that comes from L2 or from HBM depends on which heads they work on at the same moment. The first
# build handed tickets out key block first over every head (the longest causal blocks first, for the
# load balance), so the resident CTAs each worked on a different head and nothing they read was in
# L2: on an H100 it ran 0.67x cuDNN's backward on large and 0.54x at non-causal 4k
# (`2026-11-27_h100_step08.json`). Tickets now go key block first within sections of 4 (batch, KV
# head) pairs, and each CTA walks its query blocks from the last one down with the group's query
# heads innermost, so a head's key blocks read the same rows at the same time. Nothing else changed;
# in the probes (`2026-11-28_h100_step08_v4_probes.txt`) sections of 2, 4 and 8 ran 331-348 TFLOP/s
# on large against 255 with one section of every pair, and the downward walk took the causal deterministic mode from 0.65-0.70x the default (the
# upward walk, same sections) to 0.95-0.96x.
#
# **The small kernels count.** A profile of the backward kernel by kernel
# (`2026-11-28_h100_step08_v4_profile.txt`) found $dQ$'s conversion taking 15% of the time on large:
# each thread wrote its fragments straight to $dQ$, two fp16 values at a time, so every warp's store
# covered 8 rows × 16 bytes, half of each 32-byte sector it touched. Staged through shared memory and
# written a whole row at a time, the same kernel takes half as long. Zeroing the fp32 buffer and the
# preprocess (the row sums $D_i$) are the rest: memory-bound passes, on an H200 3.5% and 4.5% of the
# backward on large, the conversion 5.8%, each already near the card's bandwidth
# (`2026-11-28_h200_step08_v4_dq_passes_probes.txt`). Folding them into the kernel is not free: a
# build that counted each tile's adds (the first key block stores, so nothing is zeroed; the last
# reads the sum back and converts it) ran 1.25-1.39x slower, because the counters' round trips come
# before the copy that frees the hand-over buffer, and because a non-causal tile is complete only when
# its last key block passes, near the end of every CTA, where no tensor-core work is left to hide the
# conversion under. FlashAttention-3 keeps the two small kernels too.
#
# **Keeping the tensor cores fed.** Nsight Compute on the main kernel at non-causal 16k on an H100
# (`2026-11-28_h100_step08_v4_profile.txt`) found the tensor pipe busy 55 % of the time: about 4670
# cycles per step where the five products need 2560 at peak. Both consumer warpgroups meet at the
# barrier before $dQ$ in every step, so they also idle together: while $dS^\top$ is computed and
# stored, and while $dQ$'s fragments go to the hand-over buffer. The order of issue now fills both
# gaps with this warpgroup's own work: $dV$ as soon as $P^\top$ is in registers (it runs under
# $dS^\top$, its store and the barrier) and $dK$ behind $dQ$ (it runs under the hand-over); a WGMMA
# descriptor is built once per operand and product and stepped by adding to its address field. On one
# H100 the new build ran 382 TFLOP/s on large against 368 for the old one in the same process, on
# another H100 the two ran within 2 % of each other (`2026-11-28_h100_step08_v4_probes.txt`, probes 6
# and 7): what the order saves depends on the card.
#
# Would they idle less if they never met? In a probe each warpgroup added its own keys' share of
# $dQ_i$ through its own hand-over buffer, with no barrier between the two (twice the reduce-adds),
# and a variant started one warpgroup half a step late: on an H200 both ran at 0.97-0.99x the
# committed build's speed, and adding the two shares in shared memory first (one reduce-add again) at
# 0.88-0.89x (`2026-11-28_h200_step08_v4_desync.txt`). The shared barrier is not what holds the
# tensor pipe at 55 %; the probe build was not kept.
#
# **A wider step.** FlashAttention-3's backward at $d = 128$ without a causal mask takes 80 query rows
# a step, not 64: each step's fixed costs (the barrier, the hand-over, the wait for $dK$ before the next
# $S^\top$) are then spread over a quarter more products. Two things had to change. The query block
# must be every product's $N$ (WGMMA's $M$ is 64 per warpgroup), hence $dQ^\top$ in the table above
# and $dS$ stored transposed. And the registers: with $P^\top$ and $dP^\top$ at 40 each, $P^\top$'s
# 16-bit copy held for $dV$ in flight made ptxas spill and serialise the WGMMAs (C7512 again), so at 80
# rows $dV$ is issued once $dS^\top$ is made, and $m_2$ and $D_i$ reach shared memory by `cp.async`
# instead of through a thread's registers. In one probe on an H200
# (`2026-11-28_h200_step08_v4_bm80_probes.txt`) the non-causal backward went from 0.84-0.86x cuDNN's
# to 0.98-1.01x; the new code at 64 rows, which causal blocks keep, took large from 0.96x to 1.02x.
#
# **Fewer instructions a step.** Then a comparison with the authors' own kernel: FlashAttention-4's
# Hopper backward (a port of FA3's) ran 1.12-1.22x this build's speed on the same H200, with the same
# grid, threads, registers and shared memory, and Nsight Compute counted 1.53x its instructions in
# ours (`2026-12-02_h200_fa4_reference.txt`). Nothing in the plan differed; what each consumer thread
# executed did. The SASS showed three integer divisions a step (a step's head and query block, from
# its index) and the key mask tested on all 40 elements of $P^\top$, though only a ragged last key
# block needs it. A cursor that walks the same order, and the mask compiled in only where a step needs
# it, cut the loop from 939 instructions to about 690 on an unmasked step; in one probe on an H200 the
# backward went from 1.02x cuDNN's to 1.10x on large and from 0.95-1.01x to 1.01-1.08x at 4k-16k
# (`2026-12-02_h200_step08_v4_cursor_probes.txt`). In a kernel that waits on latency, instructions
# that are not multiply-adds are not free: they sit between one product and the next. One more kind
# was left: the descriptors of $K$ and $V$, built from the warpgroup index `threadIdx.x / 128`. WGMMA
# reads its descriptors from the uniform registers, one copy a warp; nvcc cannot see that this index
# is the same in all 32 lanes, so it built them per thread and copied them over, 48 `R2UR` a step.
# Taken through `__shfl_sync` (lane 0's value, which the compiler knows is uniform), the index kept
# them on the uniform datapath: the loop, both paths of the mask counted, went from 826 instructions
# to 695. This time the gain was small: a few TFLOP/s on large and with a causal mask, none without one
# (`2026-12-02_h200_step08_v4_uniform_probes.txt`): the loop now waits on its products more than on
# its instructions.
#
# The cell below reads the newest committed ladder run: each rung's backward at the 4k-16k points
# (fp16, TFLOP/s), cuDNN's backward beside them, and what the deterministic mode costs. v4 is the
# step's solution: on an H200, in fp16, it runs 1.10x cuDNN's backward on large, 1.01-1.05x without a
# causal mask and 1.06-1.09x with one at 4k-16k (`2026-12-02_h200_step08.json`).

# %%
R08 = results.load("08")
if not R08 or "v4_hopper" not in R08.get("rungs", {}):
    print("No measurement of step 08's Hopper rung is committed yet (course/results/measured.json).")
else:
    def rate(rung, cfg, backend="FLASH_ATTENTION", key="tflops"):
        for r in R08["rows"]:
            if (r["rung"], r["config"], r["dtype"], r["ref_backend"][:15], r.get("mode")) == \
                    (rung, cfg, "float16", backend[:15], None):
                return r[key]
        return float("nan")

    cfgs = ["causal_4k", "causal_8k", "causal_16k", "noncausal_4k", "noncausal_8k", "noncausal_16k"]
    rungs = ["v2_two_kernel", "v3_tma_causal_split", "v4_hopper", "v4_hopper_deterministic"]
    bars = {r: [rate(r, c) for c in cfgs] for r in rungs if r in R08["rungs"]}   # a run may time a few
    bars["SDPA cuDNN"] = [rate("v4_hopper", c, "CUDNN_ATTENTION", "tflops_ref") for c in cfgs]
    bars["SDPA FA2"] = [rate("v4_hopper", c, key="tflops_ref") for c in cfgs]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / len(bars)
    for k, (name, ys) in enumerate(bars.items()):
        ax.bar([i + k * width for i in range(len(cfgs))], ys, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cfgs))], cfgs)
    ax.set_ylabel("backward TFLOP/s (fp16)")
    ax.set_title(f"step 08's ladder on {R08['env']['gpu']} ({R08['env']['date']})")
    ax.legend(ncol=3, fontsize=8)
    plt.show()
    # each ratio from rows of one run: v4 against cuDNN timed in the same round, the others against FA2's rows
    print(f"{'config':>14s} {'v4 / cuDNN':>10s} {'v4 / v3':>8s} {'deterministic / default':>24s}")
    for c in cfgs:
        v4, det = rate("v4_hopper", c), rate("v4_hopper_deterministic", c)
        print(f"{c:>14s} {rate('v4_hopper', c, 'CUDNN_ATTENTION', 'ratio'):10.2f} "
              f"{v4 / rate('v3_tma_causal_split', c):8.2f} {det / v4:24.2f}")

# %% [markdown]
# ## Summary
#
# - The gradients follow from the forward's three lines: $dV = P^\top dO$, $dP = dO V^\top$,
#   $dS = P\circ(dP - D)$ with $D = \operatorname{rowsum}(dO\circ O)$, $dQ = \text{scale}\, dS K$,
#   $dK = \text{scale}\, dS^\top Q$; masked entries get $dS = 0$ for free; GQA sums $dK$, $dV$ over a group.
# - The forward saves $Q, K, V, O$ and the lse; the backward rebuilds $P = \exp(S - \text{lse})$ tile by
#   tile. Memory for the backward is $O(N)$ instead of $O(N^2)$ (measured above).
# - FlashAttention-2's backward: one program per key tile, $dK_j$, $dV_j$ in registers, $dQ$ summed
#   across programs with fp32 atomics (not deterministic) or in a second pass (deterministic, 3.5×
#   instead of 2.5× the forward's FLOPs). Causal: a key tile's program starts at the first query
#   tile that sees it.
# - The backward does 2.5× the forward's matmul FLOPs, and runs at a lower fraction of peak.
# - On Hopper (the ladder's v4): $S^\top$ and $dP^\top$ by WGMMA so that $P^\top$ and $dS^\top$ feed $dV$
#   and $dK$ from registers; $dQ^\top = K^\top dS^\top$ from $dS$ stored transposed by `stmatrix`, added across CTAs
#   in L2 by a bulk reduce-add, or in a fixed order behind a counter per tile when it must be
#   bit-reproducible. Read ptxas's notes: a trap in a wait loop serialised every WGMMA. Hand the work
#   out so that the resident CTAs share their heads: their reads and adds then stay in L2.
#
# **Next:** exercise 08 writes the forward and the backward as Triton kernels behind
# `flash_attention_train`.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
