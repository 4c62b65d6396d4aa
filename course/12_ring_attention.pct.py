# %% [markdown]
# # 12 — Beyond one GPU: ring attention, zigzag balance, overlap
#
# Every lecture so far ran one attention on one GPU. At 128k tokens and beyond, one GPU can neither
# hold what a layer keeps for its backward pass nor finish the quadratic work in a reasonable time.
# So the sequence is split over $P$ GPUs, called **ranks**: rank $r$ holds a set of rows
# $\mathcal{I}_r$ of $Q$, $K$ and $V$ (a **shard**). Its output rows still need every key. Split the
# sum over keys by the shard each key lives in:
#
# $$o_i = \sum_{u=0}^{P-1}\ \sum_{j \in \mathcal{I}_u,\ j \text{ visible to } i} e^{s_{ij} - \text{lse}_i}\, v_j,
#   \qquad \text{lse}_i = \log \sum_{u=0}^{P-1}\ \sum_{j \in \mathcal{I}_u,\ j \text{ visible to } i} e^{s_{ij}},
#   \qquad i \in \mathcal{I}_r .$$
#
# Each inner sum is the attention of rank $r$'s queries over **one** shard of keys: a partial result
# $(o^{(u)}, \text{lse}^{(u)})$, which lecture 03's merge combines exactly, in any order. Ring attention
# brings the $P$ key/value shards to every rank one after the other, around a ring of ranks, while the
# rank computes on the shard it already has.
#
# **What you will learn**
# - why one GPU runs out at 128k-1M tokens: the KV cache and the activations a layer stores, counted
#   for a concrete model; what **context parallelism** splits, and why only attention must talk;
# - the merge of partial $(o, \text{lse})$ written in lse form, derived, with its empty-block case;
# - the **ring**: which rank holds which shard at each step, what it holds in memory, what it sends;
# - **hiding the communication** behind the computation: the inequality between a block's compute
#   time and a shard's transfer time, evaluated for NVLink and PCIe, the minimum shard length;
# - **causal load balance**: contiguous shards leave rank 0 idle and the last rank busy; the
#   **zigzag** layout (Llama 3's context parallelism, the ring-flash-attention project) balances it,
#   counted pair by pair;
# - the **all-gather** alternative (Llama 3) and when each wins; a two-rank run on this CPU;
# - the **backward** on a ring: $dQ$ stays, $dK$ and $dV$ travel with their shards.
#
# **Sources followed.** Hao Liu, Matei Zaharia, Pieter Abbeel, *Ring Attention with Blockwise
# Transformers for Near-Infinite Context* (2023, arXiv 2310.01889), §3: the ring, the overlap and its
# condition on the block size. Llama Team, AI @ Meta, *The Llama 3 Herd of Models* (2024): §3.3.2,
# context parallelism with an all-gather of $K$ and $V$ and $2P$ chunks, rank $i$ holding chunks $i$
# and $2P-1-i$; Table 3, the 8B model's shape. Zilin Zhu's `ring-flash-attention` project (GitHub,
# `zhuzilin/ring-flash-attention`): `zigzag_ring_flash_attn`, the same zigzag on a ring, and the merge
# in sigmoid form. Brandon et al., *Striped Attention: Faster Ring Attention for Causal Transformers*
# (2023, arXiv 2311.09431): the causal imbalance and a round-robin layout. Yang et al., *Context
# Parallelism for Scalable Million-Token Inference* (2024, arXiv 2411.01783): passing $K/V$ or passing
# $Q$. NVIDIA's H100 and H200 datasheets (NVLink, PCIe, tensor-core rates). Lecture 03 (the merge) and
# lecture 08 (the backward from the lse).
#
# Exercise 12 asks for `ring_attention(q, k, v, causal=False, scale=None, group=None) -> (o, lse)`: the
# ring itself, with point-to-point transfers between neighbours, on the sharding rule of
# `facourse.ring`. This lecture gives the ring in mathematics, prose and pictures, and runs the
# all-gather alternative on two CPU processes; the ring's code is the exercise.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

from facourse import default_scale, reference_attention, results
from facourse.ring import chunk_bounds, check_ring, rank_chunks, shard_index

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30
# Datasheet numbers (SXM parts; sources in section 4): memory, dense FP16/BF16 tensor-core rate
GPUS = {"H100": dict(hbm_gb=80, fp16_tflops=989), "H200": dict(hbm_gb=141, fp16_tflops=989)}
# What one GPU moves to one neighbour, per direction (bytes/s): section 4 says where each comes from
LINKS = {"NVLink 4": 450e9, "PCIe Gen5 x16": 64e9}


def measured_tflops(step="07", config="causal_16k", dtype="float16"):
    """The course's own forward kernel on one long configuration, from course/results/measured.json
    (None when that measurement is not committed)."""
    d = results.load(step)
    if not d:
        return None
    rows = [r for r in d.get("rows", []) if r.get("rung") == d.get("solution") and r.get("config") == config
            and r.get("dtype") == dtype and "tflops" in r]
    return max(r["tflops"] for r in rows) if rows else None


F_PEAK = GPUS["H100"]["fp16_tflops"] * 1e12
F_KERNEL = measured_tflops()
F_KERNEL = F_KERNEL * 1e12 if F_KERNEL else None
print("dense FP16 tensor-core rate, datasheet:", f"{F_PEAK / 1e12:.0f} TFLOP/s")
print("the course's Hopper kernel (step 07), causal 16k, measured:",
      f"{F_KERNEL / 1e12:.0f} TFLOP/s" if F_KERNEL else "not committed here (the datasheet rate is used alone)")
F_RUN = F_KERNEL or F_PEAK          # the rate a block really runs at, where the course measured one

# %% [markdown]
# ## 1. Why one GPU runs out
#
# Take the shape of Llama 3 8B (Table 3 of the Llama 3 paper): 32 layers, model width 4096, 32 query
# heads and 8 KV heads of $D = 128$, an MLP of width 14336 (SwiGLU: gate, up, down), weights and
# activations in bf16 (2 bytes). One sequence ($B = 1$) of $S$ tokens.
#
# **Inference** keeps the KV cache: for every token and layer, $K$ and $V$ of the 8 KV heads,
# $2 \cdot 8 \cdot 128 \cdot 2 = 4$ KiB.
#
# **Training** keeps, for every token and layer, what the backward pass reads. With FlashAttention
# (lectures 04 and 08) that is $Q$, $K$, $V$, $O$ and one lse per query head, never $P$; around it, the
# input of every matrix product (its weight gradient needs it) and of every norm. One plain count,
# recomputing nothing (frameworks differ in the details: the order of magnitude is the point):

# %%
M = dict(layers=32, d=4096, Hq=32, Hkv=8, D=128, ffn=14336)   # Llama 3 8B's shape
E = 2                                                        # bytes per bf16 element

SAVED = {   # elements per token and layer that the backward reads
    "attention norm's input (the residual stream)": M["d"],
    "normed input (the Q, K, V projections' input)": M["d"],
    "Q": M["Hq"] * M["D"],
    "K and V": 2 * M["Hkv"] * M["D"],
    "O (the output projection's input)": M["Hq"] * M["D"],
    "MLP norm's input (the residual stream)": M["d"],
    "normed input (the gate and up projections' input)": M["d"],
    "gate and up": 2 * M["ffn"],
    "silu(gate) * up (the down projection's input)": M["ffn"],
}
LSE_BYTES = M["Hq"] * 4                                      # one fp32 lse per query head
saved_token = sum(SAVED.values()) * E + LSE_BYTES            # bytes per token and layer
kv_token = 2 * M["Hkv"] * M["D"] * E
input_token = M["d"] * E                                     # a layer's input: all that checkpointing keeps

for name, n in SAVED.items():
    print(f"  {name:52s} {n * E / KiB:6.1f} KiB")
print(f"  {'lse (fp32, one per query head)':52s} {LSE_BYTES / KiB:6.3f} KiB")
print(f"  {'total per token and layer':52s} {saved_token / KiB:6.1f} KiB   (the KV cache alone: {kv_token / KiB:.0f} KiB)")

# %%
# per sequence of S tokens: the KV cache, the stored activations, and the attention's work, one GPU
print(f"{'S':>6s} {'KV cache':>9s} {'saved, 1 layer':>15s} {'saved, 32':>10s} {'checkpointed':>13s} "
      f"{'attention, 1 layer':>19s}")
for S in (32 * 1024, 128 * 1024, 512 * 1024, 1024 * 1024):
    kv = S * kv_token * M["layers"]
    one = S * saved_token
    ckpt = S * input_token * M["layers"] + one               # every layer's input, plus one layer recomputed
    flops = 4 * M["D"] * M["Hq"] * S * (S + 1) / 2            # causal forward: 4·D·Hq per visible pair
    print(f"{S // 1024:5d}k {kv / GiB:7.0f} G {one / GiB:13.1f} G {one * M['layers'] / GiB:8.0f} G "
          f"{ckpt / GiB:11.0f} G {flops / F_RUN:15.2f} s fwd")
print(f"one GPU holds {GPUS['H100']['hbm_gb']} GB (H100) or {GPUS['H200']['hbm_gb']} GB (H200), weights and "
      "optimizer state included; time at", f"{F_RUN / 1e12:.0f} TFLOP/s")

# %% [markdown]
# (G is GiB here.) At 128k tokens one layer's stored activations, 17 GiB, are nearly a quarter of an
# H100's 80 GB, and 32 layers would need 544 GiB. Checkpointing every layer (keeping only its
# 8 KiB-per-token input and recomputing the rest in the backward) brings it down to about 49 GiB, next
# to 16 GB of bf16 weights, their gradients and the optimizer's state; at 1M tokens the layer inputs
# alone are 256 GiB. The KV cache of a single 1M-token request, 128 GiB, is nearly an H200's whole
# memory. And time grows as $S^2$: the causal attention forward of one layer at 1M tokens takes over
# ten seconds on one GPU (last column), and a model has 32 of them, plus a backward of 2.5 times the
# forward's work.
#
# **Context parallelism.** Everything in a transformer layer except attention works token by token:
# the norms, the projections, the MLP, the residual additions. Cut the sequence into $P$ shards, one
# per rank, and every one of those tensors, with its memory and its work, is divided by $P$ with no
# communication at all. Only attention mixes tokens, and it does so only through $K$ and $V$: a query
# row needs the keys and values of other ranks, never their queries or their MLP activations. So the
# whole design question is how each rank sees the other ranks' $K$ and $V$. (Data parallelism splits
# the batch, and there is one sequence; tensor parallelism splits heads and the MLP's width, not the
# tokens, and there are only 8 KV heads to split. Real systems combine all of them; Llama 3 trained
# at 128k with four kinds of parallelism at once, context parallelism among them.)
#
# ## 2. Attention over shards, merged in lse form
#
# For the rows $i$ of rank $r$ and the keys of shard $u$, the **partial result** is the attention over
# that shard alone:
#
# $$\text{lse}^{(u)}_i = \log \sum_{j \in \mathcal{I}_u \text{ visible}} e^{s_{ij}}, \qquad
#   o^{(u)}_i = \sum_{j \in \mathcal{I}_u \text{ visible}} e^{s_{ij} - \text{lse}^{(u)}_i}\, v_j .$$
#
# The full sum of exponentials is the sum over shards, $\sum_u e^{\text{lse}^{(u)}_i}$, so
#
# $$\text{lse}_i = \log \sum_u e^{\text{lse}^{(u)}_i}, \qquad
#   o_i = \sum_u \sum_{j \in \mathcal{I}_u} e^{s_{ij} - \text{lse}_i}\, v_j
#       = \sum_u e^{\text{lse}^{(u)}_i - \text{lse}_i} \sum_{j \in \mathcal{I}_u} e^{s_{ij} - \text{lse}^{(u)}_i}\, v_j
#       = \sum_u e^{\text{lse}^{(u)}_i - \text{lse}_i}\, o^{(u)}_i .$$
#
# A ring receives one shard per step, so it folds the partials in two at a time. Merging a running
# state $(o_a, \text{lse}_a)$ with a block's $(o_b, \text{lse}_b)$:
#
# $$\text{lse} = \log\big(e^{\text{lse}_a} + e^{\text{lse}_b}\big), \qquad
#   o = e^{\text{lse}_a - \text{lse}}\, o_a + e^{\text{lse}_b - \text{lse}}\, o_b .$$
#
# This is lecture 03's $(m, \ell)$ merge with $\text{lse} = m + \ln \ell$ and the outputs carried
# normalised. Written for computing, with $\sigma(x) = 1 / (1 + e^{-x})$: since
# $e^{\text{lse}_b - \text{lse}} = e^{\text{lse}_b} / (e^{\text{lse}_a} + e^{\text{lse}_b}) = \sigma(\text{lse}_b - \text{lse}_a)$,
#
# $$o = o_a - \sigma(\text{lse}_b - \text{lse}_a)\,(o_a - o_b), \qquad
#   \text{lse} = \text{lse}_a - \log \sigma(\text{lse}_a - \text{lse}_b),$$
#
# the form `ring-flash-attention` uses: no exponential of a large number anywhere, and one weight per row.
# Three details decide whether it is right:
#
# - **empty rows**: a row that sees no key of the block (causal attention, a block entirely in the
#   row's future) has $\text{lse}_b = -\infty$, and its weight $\sigma(-\infty) = 0$ leaves the state
#   unchanged, as it must. The running state can be empty too (before the first block, or for a row
#   that has seen nothing yet): then the sigmoid form's lse reads $-\infty - \log\sigma(-\infty) =
#   -\infty + \infty$ = NaN, and with both empty every form computes $-\infty - (-\infty)$. Take the
#   first block as the state (ring-flash-attention does), or guard these rows (lecture 03 met the same
#   case);
# - **the causal test uses global positions**: query $i$ sees key $j$ iff $j \le i$ in the *sequence*,
#   not in the shard's local numbering (with $S_q = S_{kv}$, bottom-right and top-left agree);
# - **accumulate in fp32**: $P$ merges of fp16 outputs would round $P$ times; keep $o$ and the lse in
#   fp32 and cast $o$ once at the end.
#
# Lecture 03 (section 4) checked this merge on four chunks of keys merged in a shuffled order; the
# ring only decides where the chunks come from.
#
# ## 3. The ring
#
# Put the ranks on a ring: rank $r$ sends to rank $r + 1$ and receives from rank $r - 1$ (mod $P$).
# Each rank keeps its queries. At step 0 it computes on its own $K$ and $V$; at each step it passes the
# shard in hand to the next rank and receives one from the previous rank, so at step $t$ rank $r$ holds
# the $K/V$ shard of rank $(r - t) \bmod P$. After $P$ steps every rank has seen every shard, and every
# shard has made $P - 1$ hops.

# %%
# the ring's schedule: the K/V shard each rank holds at each step (P = 4)
P4 = 4
colors = ["#4a90d9", "#f0ad4e", "#5cb85c", "#d9534f"]
fig, ax = plt.subplots(figsize=(9.5, 3.6))
for r in range(P4):
    for t in range(P4):
        u = (r - t) % P4
        y = P4 - 1 - r
        ax.add_patch(plt.Rectangle((t * 1.4, y), 1.0, 0.78, color=colors[u], alpha=0.85))
        zig = rank_chunks(P4, u, causal=True)
        ax.text(t * 1.4 + 0.5, y + 0.48, f"K, V of rank {u}", ha="center", va="center", fontsize=8.5)
        ax.text(t * 1.4 + 0.5, y + 0.2, f"(zigzag: chunks {zig[0]}, {zig[1]})", ha="center", va="center", fontsize=7)
        if t < P4 - 1:                      # passed on to rank r + 1 for the next step
            y_next = P4 - 1 - (r + 1) % P4
            style = "arc3,rad=0" if r < P4 - 1 else "arc3,rad=-0.25"
            ax.annotate("", xy=(t * 1.4 + 1.4, y_next + 0.39), xytext=(t * 1.4 + 1.0, y + 0.39),
                        arrowprops=dict(arrowstyle="->", color="#555555", lw=0.9, connectionstyle=style,
                                        linestyle="-" if r < P4 - 1 else "--"))
ax.set_xlim(-0.1, P4 * 1.4 - 0.3)
ax.set_ylim(-0.15, P4)
ax.set_xticks([t * 1.4 + 0.5 for t in range(P4)], [f"step {t}" for t in range(P4)])
ax.set_yticks([P4 - 1 - r + 0.39 for r in range(P4)], [f"rank {r}: keeps its Q" for r in range(P4)])
ax.tick_params(length=0)
for s in ax.spines.values():
    s.set_visible(False)
ax.set_title("ring attention, P = 4: at step t rank r computes on the K/V shard of rank (r - t) mod P; "
             "arrows: the shard passed on\n(the dashed arrows close the ring: rank 3 sends to rank 0)", fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# One rank's work, in words (the code is exercise 12's):
#
# 1. keep $Q_r$, with the rank's own $K, V$ in hand; no state yet (or the empty one, $o = 0$,
#    $\text{lse} = -\infty$ per row, with section 2's guard);
# 2. at each step $t = 0, \dots, P - 1$:
#    (a) unless it is the last step, **post** the send of the $K, V$ in hand to rank $r + 1$ and the
#    receive of the next ones from rank $r - 1$ into a second buffer, both non-blocking;
#    (b) compute the block: $Q_r$ against the $K, V$ in hand, masked by the global positions of both,
#    giving $(o_b, \text{lse}_b)$, and merge it into the state (section 2);
#    (c) wait for both transfers, and make the received buffer the one in hand;
# 3. cast $o$ to the input's dtype; return $(o, \text{lse})$ of the rank's rows.
#
# Posting the transfers *before* computing is what lets them run while the block computes (section 4).
# Posting them together matters too: if every rank first made a blocking send, each would wait for a
# receive that its neighbour has not posted yet, and the ring would stop (a **deadlock**; `facourse.ring`
# stops such a world after its time limit and names the line where each rank waits).
#
# **What a rank holds**: its $Q$, $O$ and lse rows, and **two** $K/V$ shards (the one it computes on and
# the one arriving): $2 \cdot 2\, (S/P)\, H_{kv} D e$ bytes, whatever $P$ is. **What it sends**: $P - 1$
# shards of $K$ and $V$, i.e. $(P-1)/P$ of the whole $K$ and $V$, once each, to one neighbour.
#
# ## 4. Hiding the communication behind the computation
#
# Step $t$ takes the longer of its block's computation and its shard's transfer, since both run at once.
# Count both for a shard of $c = S/P$ tokens, batch $B$, $H_q$ query and $H_{kv}$ KV heads of size $D$,
# $e$ bytes per element, a kernel that runs at $F$ FLOP/s and a link that moves $\beta$ bytes/s **per
# direction** (each rank sends one shard and receives one at the same time, on the two directions of
# its links):
#
# $$t_{\text{comp}} = \frac{4\, B H_q D\, c^2\, f}{F}, \qquad t_{\text{comm}} = \frac{2\, B H_{kv} D\, c\, e}{\beta},$$
#
# where $4 D$ FLOPs count one visible (query, key) pair ($QK^\top$ and $PV$, lecture 01) and $f$ is
# the fraction of the block's pairs that are visible: 1 without a mask, $\tfrac12$ for a causal block
# in the zigzag layout (section 5 counts it). The transfer hides when $t_{\text{comp}} \ge t_{\text{comm}}$:
#
# $$c \;\ge\; c_{\min} = \frac{H_{kv}}{H_q} \cdot \frac{e\, F}{2 f \beta}.$$
#
# $B$ and $D$ cancel: both sides are linear in them. The work of a block grows as $c^2$ and its bytes
# as $c$, so **long enough shards always hide**. GQA divides the bound by the group size ($K$ and $V$
# are that much smaller than $Q$), a causal mask doubles it (half the work for the same bytes), and a
# faster kernel raises it. For multi-head attention in 16-bit without a mask it reads $c \ge F/\beta$,
# the condition Liu et al. derive in §3 of the ring attention paper.
#
# The numbers, all per GPU:
#
# - **NVLink 4** (H100 and H200 SXM): 900 GB/s of total bandwidth over its 18 links, counted in both
#   directions (NVIDIA's H100 and H200 datasheets), so **450 GB/s per direction**; through the
#   NVSwitches of an 8-GPU board, one GPU can in principle send at that rate to any single peer.
# - **PCIe Gen5 x16**: 32 GT/s on each of 16 lanes, **64 GB/s per direction** (63 after the 128b/130b
#   coding; the datasheets' "128 GB/s" counts both directions).
# - **$F$**: the H100's dense FP16/BF16 tensor-core rate, 989 TFLOP/s (datasheet; 1979 is with 2:4
#   sparsity), H200 the same. No kernel runs faster, so a shard at the bound computed with it hides on
#   every kernel. The course's own Hopper kernel measured about two thirds of it on a long causal
#   problem (setup cell); a real attention block runs at such a rate.

# %%
def min_shard(F, beta, Hq=32, Hkv=8, e=2, visible=1.0):
    """Shortest shard c (tokens) whose block computes at least as long as its K/V take to arrive."""
    return Hkv / Hq * e * F / (2 * visible * beta)


rates = {"datasheet 989": F_PEAK, **({f"measured {F_KERNEL / 1e12:.0f}": F_KERNEL} if F_KERNEL else {})}
print(f"{'link':14s} {'GB/s/dir':>8s} {'F (TFLOP/s)':>14s} {'non-causal':>11s} {'causal':>8s} "
      f"{'causal, MHA':>12s}   (minimum shard c, tokens; GQA 32/8 unless MHA)")
for link, beta in LINKS.items():
    for label, F in rates.items():
        print(f"{link:14s} {beta / 1e9:8.0f} {label:>14s} {min_shard(F, beta):11.0f} "
              f"{min_shard(F, beta, visible=0.5):8.0f} {min_shard(F, beta, Hkv=32, visible=0.5):12.0f}")

print()
for S in (128 * 1024, 1024 * 1024):
    for link, beta in LINKS.items():
        c = min_shard(F_PEAK, beta, visible=0.5)
        print(f"S = {S // 1024:5d}k, causal, {link:13s}: shards of S/P tokens hide up to P = {S / c:6.0f} ranks")

# %% [markdown]
# Within one NVLink board the bound is a few hundred to a thousand tokens; across PCIe a few thousand.
# A 128k sequence on 8 GPUs has shards of 16k tokens: far above both, so the transfers hide with a wide
# margin, and in principle hundreds of ranks could share a long sequence before they stop hiding. The
# margin is needed, because the model is optimistic in four ways:
#
# - the link never reaches its datasheet rate (a large point-to-point transfer gets a good fraction of
#   it, each small message pays a latency of microseconds), so divide $\beta$ by the fraction achieved;
# - the transfer is not free for the GPU: NCCL (NVIDIA's library of collective and point-to-point
#   operations between GPUs, which `torch.distributed` calls on GPUs) runs its copies on some of the
#   SMs the attention kernel wants, and both compete for HBM bandwidth;
# - a small block runs below the kernel's long-sequence rate (lecture 05's sweep: the rate falls at
#   short lengths), which *helps* hiding but makes everything slower;
# - the backward moves more (section 7).
#
# The figure shows the two times of one step against the shard length, for one layer's attention with
# $B = 1$, 32/8 heads, $D = 128$, fp16, and the kernel's rate; where the compute line passes above a
# link's line, that link's transfer hides.

# %%
# one ring step: compute time of a block against transfer time of a shard
cs = [2 ** e for e in range(7, 18)]
B1, HQ, HKV, D = 1, 32, 8, 128
t_comp = lambda c, f: 4 * B1 * HQ * D * c * c * f / F_RUN
t_comm = lambda c, beta: 2 * B1 * HKV * D * c * 2 / beta
fig, ax = plt.subplots(figsize=(7.5, 4))
ax.plot(cs, [t_comp(c, 1.0) * 1e6 for c in cs], "-", color="#4a90d9", lw=2, label="compute, non-causal block")
ax.plot(cs, [t_comp(c, 0.5) * 1e6 for c in cs], "--", color="#4a90d9", lw=2, label="compute, causal (zigzag) block")
for (link, beta), col in zip(LINKS.items(), ("#5cb85c", "#d9534f")):
    ax.plot(cs, [t_comm(c, beta) * 1e6 for c in cs], "-", color=col, label=f"transfer of K, V over {link}")
    for f, mk in ((1.0, "o"), (0.5, "s")):
        c0 = min_shard(F_RUN, beta, visible=f)
        ax.plot([c0], [t_comm(c0, beta) * 1e6], mk, color=col, ms=7, mfc="white")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("shard length c = S / P (tokens)")
ax.set_ylabel("time of one step (us)")
ax.set_title(f"B = 1, Hq/Hkv = 32/8, D = 128, fp16, F = {F_RUN / 1e12:.0f} TFLOP/s: "
             "the transfer hides right of each marker", fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# And the steps of one rank in time, $P = 4$, causal zigzag blocks over PCIe, for a shard half as long
# as the bound and one twice as long: each step starts the next shard's transfer together with its
# block and ends when both are done. Below the bound, the rank waits for every shard; above it, the
# transfers vanish under the blocks and the ring costs what its $P$ blocks cost.

# %%
# the time line of one rank: compute and transfer of each step, below and above the bound (PCIe)
beta = LINKS["PCIe Gen5 x16"]
c_min = min_shard(F_RUN, beta, visible=0.5)
fig, axs = plt.subplots(2, 1, figsize=(9, 3.4))
for ax, c in zip(axs, (int(c_min / 2), int(c_min * 2))):
    tc, tm = t_comp(c, 0.5) * 1e6, t_comm(c, beta) * 1e6
    start, waited = 0.0, 0.0
    for t in range(P4):
        ax.broken_barh([(start, tc)], (1.1, 0.8), color="#4a90d9")
        ax.text(start + tc / 2, 1.5, f"block {t}", ha="center", va="center", fontsize=7.5, color="white")
        step = tc
        if t < P4 - 1:
            ax.broken_barh([(start, tm)], (0.1, 0.8), color="#d9534f", alpha=0.8)
            if tm > tc:
                ax.broken_barh([(start + tc, tm - tc)], (1.1, 0.8), facecolor="none", edgecolor="#999999", hatch="///")
                waited += tm - tc
            step = max(tc, tm)
        start += step
    ax.set_yticks([0.5, 1.5], ["transfer", "compute"])
    ax.set_xlim(0, start * 1.02)
    ax.set_title(f"c = {c} tokens: {start:.0f} us for 4 blocks of {tc:.0f} us; waiting {waited:.0f} us "
                 f"(hatched)", fontsize=9)
axs[1].set_xlabel("time (us)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Causal load balance: contiguous shards against zigzag
#
# With a causal mask, query $i$ sees keys $j \le i$. Cut the sequence into $P$ contiguous shards and
# give shard $r$ to rank $r$: rank 0's queries see only its own keys, a triangle, and the $K/V$ of every
# other rank arrive for nothing; rank $P - 1$'s queries see every key, $P - 1$ full blocks and a
# triangle. The attention is done when its busiest rank is done, and that rank does almost a full
# non-causal attention's share: most of the causal mask's saving of half the work is lost. (Waiting for shards
# can only add to the busiest rank's time; the efficiency below, the even share over the busiest
# rank's work, is the best the layout allows.)
#
# The **zigzag** layout cuts the sequence into $2P$ chunks and gives rank $r$ chunks $r$ and
# $2P - 1 - r$: one from the start and its mirror image from the end, so every rank holds as much
# "early" as "late" sequence. This is what Llama 3's context parallelism does (§3.3.2: $2 \times$ CP
# chunks, rank $i$ receiving chunks $i$ and $2 \times \text{CP} - 1 - i$) and what `ring-flash-attention`'s
# `zigzag_ring_flash_attn` does, and it is the rule of `facourse.ring` for causal calls (chunks cut as
# `torch.tensor_split` cuts them, so lengths that do not divide differ by one row at most).
# Striped attention (Brandon et al.) balances another way, giving token $i$ to rank $i \bmod P$.
#
# Counted, not drawn by hand: for every rank and step, the (query, key) pairs of the block that the
# causal mask lets through, from the rows `facourse.ring.shard_index` gives each rank, $S = 4096$,
# $P = 4$, in units of a full block $c^2 = (S/P)^2$.

# %%
def layout_rows(S, P, r, layout):
    """The global positions of rank r's rows: facourse.ring's contiguous and zigzag layouts, and the
    striped one of Brandon et al. (token i on rank i mod P) for comparison."""
    if layout == "striped":
        return torch.arange(r, S, P)
    return shard_index(S, P, r, causal=True, layout=layout)


def causal_work(S, P, layout):
    """[rank, step] visible (query, key) pairs of the block rank r computes at step t: its queries
    against the K/V shard of rank (r - t) mod P, query i seeing key j iff j <= i."""
    rows = [layout_rows(S, P, r, layout) for r in range(P)]
    work = torch.zeros(P, P, dtype=torch.long)
    for r in range(P):
        for t in range(P):
            keys = rows[(r - t) % P]
            work[r, t] = int((keys[None, :] <= rows[r][:, None]).sum())
    return work


S_BAL = 4096
block = (S_BAL // P4) ** 2
WORK = {lay: causal_work(S_BAL, P4, lay) for lay in ("contiguous", "zigzag", "striped")}
total = S_BAL * (S_BAL + 1) // 2
print(f"{'layout':11s} {'busiest rank':>13s} {'idlest rank':>12s} {'efficiency':>11s}")
for lay, w in WORK.items():
    assert int(w.sum()) == total                         # every visible pair is computed once, somewhere
    per_rank = w.sum(1)
    print(f"{lay:11s} {per_rank.max() / block:11.2f} c² {per_rank.min() / block:10.2f} c² "
          f"{total / P4 / per_rank.max():11.0%}")        # the even share over the busiest rank's work
print(f"(ideal: the causal total spread evenly, {total / P4 / block:.2f} c² per rank; a non-causal ring costs {P4} c²)")

# %%
# work per rank and per step, contiguous against zigzag, in units of c^2 (P = 4, S = 4096)
fig, axs = plt.subplots(1, 3, figsize=(12.5, 3.6), gridspec_kw=dict(width_ratios=[1, 1, 1.1]))
for ax, lay in zip(axs, ("contiguous", "zigzag")):
    w = WORK[lay].double() / block
    ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
    for r in range(P4):
        for t in range(P4):
            ax.text(t, r, f"{w[r, t]:.2f}", ha="center", va="center", fontsize=9,
                    color="white" if w[r, t] > 0.6 else "black")
    ax.set_xticks(range(P4), [f"step {t}" for t in range(P4)])
    chunks = [", ".join(map(str, rank_chunks(P4, r, True, lay))) for r in range(P4)]
    ax.set_yticks(range(P4), [f"rank {r} (chunk{'s' if lay == 'zigzag' else ''} {chunks[r]})" for r in range(P4)])
    ax.set_title(f"{lay}: the busiest rank computes {WORK[lay].sum(1).max() / block:.2f} c²", fontsize=9.5)
x = torch.arange(P4)
for i, (lay, col) in enumerate(zip(WORK, ("#d9534f", "#4a90d9", "#999999"))):
    axs[2].bar(x + (i - 1) * 0.27, (WORK[lay].sum(1).double() / block).tolist(), 0.27, color=col, label=lay)
axs[2].axhline(total / P4 / block, color="black", lw=0.8, ls="--", label="even share")
axs[2].set_xticks(range(P4), [f"rank {r}" for r in range(P4)])
axs[2].set_ylabel("visible pairs, all steps (c²)")
axs[2].set_title("work per rank", fontsize=9.5)
axs[2].legend(fontsize=8)
fig.suptitle("causal ring attention, P = 4: visible (query, key) pairs per block, counted from facourse.ring's "
             "layouts", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# With contiguous shards the last rank computes a full block at every step after the first while rank 0
# idles: the ring takes 3.5 full blocks' time, against 4 for a non-causal ring, and 57% of the GPUs'
# time does useful work. With zigzag every block holds half a block of visible pairs, at every step, on
# every rank: 100%, and the ring takes 2 full blocks' time instead of 3.5. Why exactly a half: split each block
# into four quarters, (early or late query chunk) × (early or late key chunk). Against the shard of an
# earlier rank ($u < r$), both of rank $r$'s chunks come after chunk $u$ and before chunk $2P-1-u$: the
# two quarters with key chunk $u$ are full, the two with key chunk $2P-1-u$ empty. Against a later rank
# ($u > r$), the early chunk $r$ comes before both of $u$'s chunks and the late chunk $2P-1-r$ after
# both: one row of quarters full, the other empty. Against itself: two triangles, one full quarter and
# one empty. A kernel that skips empty tiles (lecture 04) skips the empty quarters for free.
# Striped attention balances as well, but each of its blocks is a small causal triangle (query $a$ of
# the block sees keys $b < a$, and $b = a$ on some ranks) rather than quarters that are wholly full or
# wholly empty.
#
# ## 6. The alternative: gather all of $K$ and $V$
#
# Llama 3 (§3.3.2) does not pass shards around a ring. Each rank **all-gathers** $K$ and $V$, i.e.
# receives every other rank's shard in one collective operation, then computes the attention of its
# own queries over the whole sequence (with the zigzag layout, for balance). The paper gives two
# reasons: any mask (documents packed in a row, for one) is easy when a rank has every key in hand, and
# with GQA the $K$ and $V$ are much smaller than $Q$, so the all-gather is short next to an attention
# whose work grows as $S^2$ while the gather grows as $S$.
#
# What each costs, per rank and per layer. In the backward the all-gather has a mirror image, the
# **reduce-scatter**: every rank holds a gradient for the whole of $K$ and $V$, the ranks' gradients are
# summed, and each rank receives the sum for its own shard only.
#
# | | ring (pass $K/V$) | all-gather $K/V$ |
# |---|---|---|
# | $K/V$ held | 2 shards: $4 (S/P) H_{kv} D e$ | all of it: $2 S H_{kv} D e$ |
# | bytes received | $(P-1)/P$ of $K$ and $V$ | the same |
# | hidden? | yes, when $c \ge c_{\min}$ (section 4) | only if something else runs meanwhile; exposed otherwise |
# | masks | each block needs its own slice of the mask | any mask on the full rows |
# | backward | $dK, dV$ travel with their shards | a reduce-scatter of $dK, dV$ (same volume) |
#
# The volume is the same: what differs is *when* the bytes move (spread over $P-1$ steps behind compute,
# or all at once before it) and how much is held. Counted for the model of section 1, causal, on 8 ranks:

# %%
# all-gather against ring, per rank and per layer: memory held and the gather's exposed time
P8 = 8
print(f"{'S':>6s} {'heads':>6s} {'K/V held: ring':>15s} {'all-gather':>11s} {'gather (NVLink)':>16s} "
      f"{'gather (PCIe)':>14s} {'attention per rank':>19s}")
for S in (128 * 1024, 1024 * 1024):
    for hkv in (8, 32):                                        # GQA 32/8, and multi-head for comparison
        kv_all = 2 * S * hkv * M["D"] * E
        ring_held = 2 * 2 * (S // P8) * hkv * M["D"] * E
        received = kv_all * (P8 - 1) / P8
        t_attn = 4 * M["D"] * M["Hq"] * S * (S + 1) / 2 / P8 / F_RUN
        t_nv, t_pcie = received / LINKS["NVLink 4"], received / LINKS["PCIe Gen5 x16"]
        print(f"{S // 1024:5d}k {M['Hq']:>3d}/{hkv:<2d} {ring_held / MiB:11.0f} MiB {kv_all / MiB:7.0f} MiB "
              f"{t_nv * 1e3:8.1f} ms {t_nv / t_attn:5.1%} {t_pcie * 1e3:6.1f} ms {t_pcie / t_attn:6.1%} "
              f"{t_attn * 1e3:15.1f} ms")

# %% [markdown]
# (The percentages compare the gather with the causal attention it precedes.) With GQA on NVLink the
# exposed gather is a few percent of the attention: Llama 3's "negligible", and the simplicity and the
# free choice of mask win. The ring wins when the gather would show: over PCIe or between nodes, with
# multi-head attention (4 times the bytes here), or when memory is short (at 1M tokens a rank holding
# all of one layer's $K$ and $V$ holds 4 GiB; the ring, 1 GiB on 8 ranks, and less on more). The gather
# can also be hidden by hand: start it asynchronously and wait only where the data is needed, as the
# demo below does for $V$ while it computes with $K$. When the queries are fewer than the keys (a short
# new prompt against a long cached context), passing $Q$ and the partial outputs around the ring moves
# fewer bytes than passing $K$ and $V$: Yang et al. (2024) compare pass-KV and pass-Q.
#
# ### Two ranks on this CPU
#
# `facourse.ring.run_ring` forks one process per rank on this machine, joins them in a `gloo` process
# group (PyTorch's CPU backend of `torch.distributed`; on GPUs it would be NCCL), hands each its shards
# by the sharding rule, and gathers their results. Written as a rank sees it: its own shards of $q$,
# $k$, $v$ in, its rows' $(o, \text{lse})$ out.

# %%
def allgather_kv_attention(q, k, v, causal=False, scale=None, group=None):
    """Context parallelism by all-gather (Llama 3's way), run by every rank on its own shards
    q [B, Hq, S_r, D], k and v [B, Hkv, S_r, D], laid out by facourse.ring's rule. Returns its rows' (o, lse)."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    # the shard lengths (they may differ by one): all_gather moves equal sizes, so pad to the longest
    lens = [torch.zeros(1, dtype=torch.long) for _ in range(P)]
    dist.all_gather(lens, torch.tensor([k.shape[2]]), group=group)
    lens = [int(n) for n in lens]
    S, L = sum(lens), max(lens)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, L - t.shape[2])).contiguous()
    ks, vs = [pad(k).new_empty(pad(k).shape) for _ in range(P)], [pad(v).new_empty(pad(v).shape) for _ in range(P)]
    v_arrives = dist.all_gather(vs, pad(v), group=group, async_op=True)   # V travels while S is computed
    dist.all_gather(ks, pad(k), group=group)
    K = torch.cat([t[:, :, :n] for t, n in zip(ks, lens)], dim=2)        # in rank order, not sequence order
    # the global positions of this rank's queries and of every key: the causal test needs those
    q_pos = shard_index(S, P, r, causal)
    k_pos = torch.cat([shard_index(S, P, u, causal) for u in range(P)])
    G = q.shape[1] // k.shape[1]                                         # query head h reads KV head h // G
    s = default_scale(q.shape[-1], scale) * (q.float() @ K.float().repeat_interleave(G, 1).transpose(-1, -2))
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], -math.inf)    # S = scale·QKᵀ, j <= i globally
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)                    # P = softmax(S); a row with no key: 0
    v_arrives.wait()                                                     # only now is V needed
    V = torch.cat([t[:, :, :n] for t, n in zip(vs, lens)], dim=2)
    o = p @ V.float().repeat_interleave(G, 1)                            # O = P V
    chunks = rank_chunks(P, r, causal)
    bounds = chunk_bounds(S, 2 * P if causal else P)
    print(f"rows {' and '.join(f'{bounds[c][0]}-{bounds[c][1] - 1}' for c in chunks)} "
          f"(chunk{'s' if len(chunks) > 1 else ''} {', '.join(map(str, chunks))}); gathered K and V of {S} keys "
          f"from {P} ranks: {sum(t.numel() * t.element_size() for t in (K, V)) / KiB:.0f} KiB held")
    return o.to(q.dtype), lse


# %% [markdown]
# `check_ring` runs it on one of the ring cases of `facourse.ring` (the inputs drawn from a seed,
# sharded by the rule, each rank in its own process) and checks the gathered output with the course's
# one rule (`facourse.check_attention`). Each line a rank printed comes back prefixed with its rank:

# %%
RUNS = {}
for case in ("w2_causal", "w2_noncausal", "w3_ragged"):
    t0 = time.perf_counter()
    RUNS[case] = check_ring(allgather_kv_attention, case, seed=0)
    print(f"  ({time.perf_counter() - t0:.1f} s: {len(RUNS[case].out)} processes forked, joined and checked)\n")

# %% [markdown]
# In the causal case rank 0 holds rows 0-127 and 384-511 (chunks 0 and 3 of 4), rank 1 the middle: the
# zigzag. `w3_ragged` has three ranks and 500 rows cut into 6 chunks of 84 or 83 rows: shards of 167
# and 166 rows, padded for the gather and cut after. The ranks also counted their operations on the process
# group (`RingRun.traffic`: each kind, how many calls and the bytes of the tensors handed to them):

# %%
for case, run in RUNS.items():
    for r, t in enumerate(run.traffic):
        ops = ", ".join(f"{name} x{n} ({b / KiB:.0f} KiB)" for name, (n, b) in t.items())
        print(f"{case:12s} rank {r}: {ops}; point-to-point bytes {run.p2p_bytes()[r]}; {run.seconds[r]:.2f} s")

# %% [markdown]
# Three all-gathers per rank (the lengths, $K$, $V$; the bytes counted are the gathered lists, every
# rank's shard included) and no point-to-point transfer: this is the all-gather design. Exercise 12's
# ring moves the same bytes as sends and receives between neighbours, one shard per step, and its
# check counts them.
#
# ## 7. The backward on a ring
#
# Lecture 08's backward needs, for each block of rows $i$ and keys $j$, only
#
# $$P_{ij} = \exp(\text{scale}\cdot q_i \cdot k_j - \text{lse}_i), \qquad dV_j \mathrel{+}= \sum_i P_{ij}\, dO_i, \qquad
#   dS_{ij} = P_{ij}\,(dO_i \cdot v_j - D_i), \qquad D_i = dO_i \cdot O_i ,$$
#
# $$dQ_i \mathrel{+}= \text{scale} \sum_j dS_{ij}\, k_j, \qquad dK_j \mathrel{+}= \text{scale} \sum_i dS_{ij}\, q_i .$$
#
# With the **final** $\text{lse}_i$ saved by the forward, $P_{ij}$ is already the normalised
# probability, so the blocks of the backward need **no merge**: their contributions simply add. On a
# ring:
#
# - rank $r$ keeps $Q_r$, $O_r$, $dO_r$, $\text{lse}_r$ and $D_r$ (computed once, before the loop), and
#   accumulates $dQ_r$ locally over the $P$ steps;
# - $K_u$ and $V_u$ travel around the ring as in the forward, and with them two accumulators
#   $dK_u$, $dV_u$: each rank adds its queries' contribution to the accumulators of the shard in hand
#   before passing all four on;
# - after $P$ steps the accumulators of shard $u$ have visited every rank; one more hop brings them home
#   to rank $u$ ($P$ hops for $dK$, $dV$, $P - 1$ for $K$, $V$). With GQA, as in lecture 08, a KV head's
#   gradient sums over its group of query heads.
#
# Checked in one process, in float64: per (query shard, key shard) block of the zigzag layout, the five
# lines above with the global lse, summed into $dQ$ by query shard and into $dK$, $dV$ by key shard,
# against autograd.

# %%
def block_grads(q, k, v, o, do, lse, visible, scale):
    """Lecture 08's lines for one block (one query head per KV head here): rows q, o, do, lse of a query
    shard against k, v of a key shard, visible [rows, keys]. Returns this block's (dq, dk, dv) parts."""
    p = torch.exp(scale * q @ k.transpose(-1, -2) - lse[..., None]).masked_fill(~visible, 0.0)  # P from the final lse
    dv = p.transpose(-1, -2) @ do                                           # dV = Pᵀ dO
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))    # dS = P ∘ (dP - D)
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, dv             # dQ = scale dS K, dK = scale dSᵀ Q


gen = torch.Generator().manual_seed(0)
Bb, Hqb, Hkvb, Sb, Db, Pb = 1, 4, 2, 96, 16, 3
qg, kg, vg, dog = (torch.randn(Bb, h, Sb, Db, dtype=torch.float64, generator=gen) for h in (Hqb, Hkvb, Hkvb, Hqb))
leaves = [t.clone().requires_grad_() for t in (qg, kg, vg)]
o_ref, lse_ref = reference_attention(*leaves, causal=True)
o_ref.backward(dog)
with torch.no_grad():
    o64 = o_ref.detach()
    scale, G = 1 / math.sqrt(Db), Hqb // Hkvb
    kx, vx = kg.repeat_interleave(G, 1), vg.repeat_interleave(G, 1)       # KV head of every query head
    causal_all = torch.arange(Sb)[None, :] <= torch.arange(Sb)[:, None]
    lse64 = torch.logsumexp((scale * qg @ kx.transpose(-1, -2)).masked_fill(~causal_all, -math.inf), -1)  # float64
    rows = [shard_index(Sb, Pb, r, causal=True) for r in range(Pb)]      # zigzag: chunks r and 2P-1-r
    dq, dk, dv = torch.zeros_like(qg), torch.zeros_like(kx), torch.zeros_like(vx)
    for r in range(Pb):                                                  # rank r's queries ...
        for t in range(Pb):                                              # ... against the shard in hand at step t
            u = (r - t) % Pb
            vis = rows[u][None, :] <= rows[r][:, None]
            i, j = rows[r], rows[u]
            gq, gk, gv = block_grads(qg[:, :, i], kx[:, :, j], vx[:, :, j], o64[:, :, i], dog[:, :, i],
                                     lse64[:, :, i], vis, scale)
            dq[:, :, i] += gq                                           # stays on rank r
            dk[:, :, j] += gk                                           # travels with shard u
            dv[:, :, j] += gv
    dk, dv = (x.view(Bb, Hkvb, G, Sb, Db).sum(2) for x in (dk, dv))      # GQA: sum over the group
for name, mine, ref in (("dQ", dq, leaves[0].grad), ("dK", dk, leaves[1].grad), ("dV", dv, leaves[2].grad)):
    print(f"{name}: max |ring blocks - autograd| = {(mine - ref).abs().max():.1e}")
    assert torch.allclose(mine, ref, atol=1e-10)

# %% [markdown]
# The communication condition of section 4 carries over with the backward's numbers: a block costs
# 2.5 times the forward's work (lecture 08: five matrix products instead of two), and a step moves
# $K$ and $V$ in $e$ bytes plus the accumulators $dK$, $dV$, usually in fp32 (4 bytes). So
# $t_{\text{comp}} \ge t_{\text{comm}}$ needs
# $c \ge \frac{H_{kv}}{H_q} \cdot \frac{(e + 4)\, F}{5 f \beta}$, 1.2 times the forward's bound with
# $e = 2$: the backward hides about as easily as the forward does.

# %%
for link, beta in LINKS.items():
    fwd = min_shard(F_PEAK, beta, visible=0.5)
    bwd = 8 / 32 * (2 + 4) * F_PEAK / (5 * 0.5 * beta)
    print(f"{link:14s} causal, 32/8 heads, F = 989 TFLOP/s: forward c >= {fwd:5.0f}, backward c >= {bwd:5.0f} tokens")

# %% [markdown]
# ## 8. On two GPUs
#
# What the course measured for step 12, if it is committed (`course/results/measured.json`, read by
# `facourse.results`): the solution ladder's rings on two GPUs of one machine, NCCL between them, against
# one GPU running the whole attention; the speedup, the scaling efficiency (speedup over the number of
# GPUs) and the time the ranks spent waiting for a shard (the communication that was not hidden).

# %%
COLUMNS = (   # (heading, the names a results row may give it)
    ("rung", ("rung",)), ("config", ("config",)), ("dtype", ("dtype",)), ("GPUs", ("world", "ranks", "gpus")),
    ("ms", ("ms", "ms_ring", "time_ms")), ("one GPU, ms", ("ms_one_gpu", "one_gpu_ms", "ms_single", "ms_1gpu", "ms_ref")),
    ("speedup", ("speedup", "ratio")), ("scaling efficiency", ("efficiency", "scaling_efficiency")),
    ("overlap wait", ("wait_ms", "overlap_wait_ms", "comm_wait_ms", "overlap_wait", "wait_fraction")))


def ring_rows(d):
    return [r for r in d.get("rows", []) if isinstance(r, dict) and r.get("kind", "bench") == "bench"]


def ring_table(rows):
    """A markdown table of whatever the rows carry: the known columns first (a row may name a column by
    any of its names), then any other scalar field."""
    cols = [(head, keys) for head, keys in COLUMNS if any(k in r for r in rows for k in keys)]
    known = {k for _, keys in COLUMNS for k in keys} | {"kind"}
    cols += [(k, (k,)) for k in dict.fromkeys(k for r in rows for k in r)
             if k not in known and all(isinstance(r.get(k), (int, float, str, list, type(None))) for r in rows)]

    def cell(r, keys):
        key = next((k for k in keys if k in r), None)
        x = None if key is None else r[key]
        if x is None:
            return "—"
        if isinstance(x, list):                                   # one number per rank
            return " / ".join(f"{y:.3g}" if isinstance(y, float) else str(y) for y in x)
        if isinstance(x, float) and key in ("speedup", "ratio"):
            return f"{x:.2f}x"
        if isinstance(x, float) and ("efficiency" in key or "fraction" in key) and x <= 1.5:
            return f"{x:.0%}"
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    return "\n".join(["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(r, keys) for _, keys in cols) + " |" for r in rows])


R12 = results.load("12")   # None until a measurement of step 12 is committed
rows12 = ring_rows(R12) if isinstance(R12, dict) else []
if not rows12:
    print("No GPU measurement of step 12 is committed yet (course/results/measured.json has no \"12\" rows): "
          "the two-GPU ring timings will appear here once the runner has measured them.")
else:
    from IPython.display import Markdown, display

    try:
        print(results.header(R12))
    except Exception:             # a header with fields missing: what there is of it
        env = R12.get("env", {})
        print(", ".join(str(env[k]) for k in ("gpu", "date", "torch") if k in env))
    try:                          # the README's renderer of the same rows, where this library has one
        table = results.ring_table(R12)
    except Exception:             # none, or rows of another shape: the generic table above
        table = ring_table(rows12)
    display(Markdown(table))

# %% [markdown]
# Read the measurement against sections 4 and 5: at 64k and 128k tokens on two GPUs the shards are 32k
# and 64k tokens long, far above NVLink's bound, so the waiting time should be a small part of the
# total and the speedup close to 2 when the rung overlaps its transfers; a rung that sends and only then
# computes pays the transfers in full, and a causal rung with contiguous shards pays the imbalance
# (with $P = 2$ the busiest rank computes 3/4 of the causal work instead of half: an efficiency of at
# most 67%).
#
# ## Summary
#
# - Past 128k tokens one GPU holds neither a layer's stored activations (about 136 KiB per token per
#   layer for Llama 3 8B's shape) nor, at 1M, the KV cache; the attention's time grows as $S^2$.
#   Context parallelism splits the sequence: everything but attention divides by $P$ with no
#   communication; attention needs every rank's $K$ and $V$.
# - Partial results over shards of keys merge exactly in lse form:
#   $\text{lse} = \log(e^{\text{lse}_a} + e^{\text{lse}_b})$, $o = o_a - \sigma(\text{lse}_b - \text{lse}_a)(o_a - o_b)$;
#   an empty block has $\text{lse} = -\infty$ and weight 0; accumulate in fp32.
# - The ring: rank $r$ keeps $Q_r$ and at step $t$ computes on the $K/V$ of rank $(r - t) \bmod P$, passing
#   it to $r + 1$; it holds two shards and sends $(P-1)/P$ of $K$ and $V$.
# - Post the next shard's transfer before computing on the current one; it hides when
#   $c = S/P \ge \frac{H_{kv}}{H_q}\cdot\frac{e F}{2 f \beta}$: a few hundred tokens on NVLink (450 GB/s per
#   direction), a few thousand on PCIe Gen5 (64 GB/s), twice that for causal blocks.
# - Causal with contiguous shards: the last rank does almost everything and the ring saves little over
#   non-causal (3.5 full blocks' time against 4 at $P = 4$, 57% efficiency). Zigzag (chunks $r$ and
#   $2P-1-r$ of $2P$; Llama 3, ring-flash-attention) gives every rank half a block per step: 100%.
# - All-gather $K/V$ (Llama 3): the same bytes, all at once and exposed, all of $K/V$ held; cheap with
#   GQA on NVLink and any mask is easy; the ring wins on slow links, with many KV heads, or when memory
#   is short.
# - Backward: with the forward's final lse no merge is needed; $dQ$ accumulates where its rows live,
#   $dK$ and $dV$ travel with their shards and come home after $P$ hops.
#
# **Next:** exercise 12 writes `ring_attention` with point-to-point transfers between neighbours,
# checked by `facourse.ring.check_ring` on two to four CPU ranks.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
