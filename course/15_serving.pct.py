# %% [markdown]
# # 15 — Serving: packed variable-length batches, chunked prefill, MLA decode
#
# A server does not see the rectangular batches of the earlier lectures. In one step of its loop,
# sequence $b$ brings $L^q_b$ new query tokens (a whole prompt, a chunk of one, or the single token
# it is decoding) and attends to its $L^k_b$ keys, the new ones included. With every sequence's
# tokens packed one after another, query row $i$ of sequence $b$ (head $h$, KV head $h // G$) is
#
# $$o_{b,i} = \sum_{j \le i + L^k_b - L^q_b} e^{s_{ij} - \text{lse}_{b,i}}\, v_{b,j},
#   \qquad s_{ij} = \text{scale}\cdot q_{b,i}\cdot k_{b,j}, \qquad
#   \text{lse}_{b,i} = \log \sum_{j \le i + L^k_b - L^q_b} e^{s_{ij}},$$
#
# lecture 04's bottom-right causal rule, applied to each sequence on its own (without the mask,
# $j$ runs over all $L^k_b$ keys). Nothing in the formula is new. What is new is where the rows
# live: in one packed tensor whose boundaries are a list of offsets, and, for the keys, in step 09's
# paged cache.
#
# **What you will learn**
# - why padding a ragged batch to its longest sequence wastes most of the work, counted on a
#   length mix; packing with `cu_seqlens`, and why `max_seqlen` is passed in;
# - the grid of a varlen kernel, how many of its programs have nothing to do, why that costs little,
#   and what a list of real tiles, longest first, changes (a scheduling model);
# - bottom-right causal per sequence, and why it is the alignment that prefix caching needs;
# - **chunked prefill**: a long prompt cut into chunks that share each step with decodes, each chunk
#   attending to its cached prefix through the block table; how the chunk size trades the decodes'
#   latency against prefill throughput, in a roofline model;
# - **MLA decode**: DeepSeek-V2's latent KV cache, and the absorption of the up-projections that lets
#   decode attend over the latent directly; checked in float64, and the cache's bytes per token counted.
#
# **Sources followed.** Tri Dao, *FlashAttention-2* (ICLR 2024), and the `flash_attn_varlen_func`
# docstring of the flash-attention package: `cu_seqlens`, `max_seqlen`,
# bottom-right causal, the `[nheads, total_q]` layout of the lse. Yu et al., *Orca* (OSDI 2022):
# iteration-level scheduling. Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference
# with Sarathi-Serve* (OSDI 2024): chunked prefill and stall-free batching. Kwon et al., the vLLM
# paper (SOSP 2023), and lecture 09: the paged cache. DeepSeek-AI, *DeepSeek-V2: A Strong,
# Economical, and Efficient Mixture-of-Experts Language Model* (2024), §2.1: multi-head latent
# attention. Graham, *Bounds on Multiprocessing Timing Anomalies* (SIAM J. Appl. Math., 1969):
# longest-processing-time-first scheduling.
#
# Exercise 15 asks for `varlen_attention(...)` and `paged_prefill(...)` as Triton kernels. The PyTorch
# code here loops over sequences, one whole-tensor attention each, to show the ideas; it is not that
# answer.

# %%
import heapq
import math
import time

import matplotlib.pyplot as plt
import torch

from facourse import reference_attention

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

# Lecture 00's datasheet numbers (H100 SXM5): HBM bandwidth in bytes/s, dense FP16 tensor-core FLOP/s, SMs
H100 = dict(hbm=3.35e12, fp16=989e12, sms=132)

# %% [markdown]
# ## 1. Serving batches are ragged
#
# Requests arrive with prompts of every length, and a server batches whichever are waiting. Pad a
# batch of $B$ sequences to the longest, $L_{\max}$, and a kernel that does not know the lengths
# computes, per head,
#
# $$\text{padded: } B\,L_{\max}^2 \text{ pairs (or } B\,\tfrac{L_{\max}(L_{\max}+1)}{2} \text{ causal)},
#   \qquad \text{packed: } \sum_b L_b^2 \text{ (or } \sum_b \tfrac{L_b(L_b+1)}{2}\text{)},$$
#
# each pair costing $4d$ FLOPs. The padded pairs are masked, so the answer is right; the work is not
# saved. Prompt lengths are skewed: many short, a few long. The cell draws a batch of 32 from a
# log-normal (median 600 tokens, $\sigma = 1$, seeded, clipped to 16-8192 tokens; a stand-in for a
# real trace, said as one) and counts.

# %%
def draw_lengths(n, seed, median=600, sigma=1.0):
    """n prompt lengths from a seeded log-normal, rounded and clipped to [16, 8192] tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g, dtype=torch.float64))
    return x.round().clamp(16, 8192).long().tolist()


def pairs(lengths, causal):
    """(query, key) pairs of attention over these sequences, one head."""
    return sum(L * (L + 1) // 2 if causal else L * L for L in lengths)


LENS = draw_lengths(32, seed=15)
print("lengths:", sorted(LENS))
Lmax = max(LENS)
print(f"tokens: {sum(LENS)} real of {len(LENS) * Lmax} padded ({sum(LENS) / (len(LENS) * Lmax):.0%} real)")
for causal in (False, True):
    real, padded = pairs(LENS, causal), pairs([Lmax] * len(LENS), causal)
    print(f"{'causal' if causal else 'non-causal':10s} pairs: packed {real:.3e}, padded {padded:.3e}: "
          f"{1 - real / padded:.0%} of the padded work is padding")

print(f"\n{'B':>4s} {'max len':>8s} {'padding share of the causal work':>34s}")
for B in (4, 16, 64, 256):
    lens = draw_lengths(B, seed=100 + B)
    print(f"{B:4d} {max(lens):8d} {1 - pairs(lens, True) / pairs([max(lens)] * B, True):34.0%}")

# %% [markdown]
# Four fifths of the padded batch's work is padding, causal or not, and the bigger the batch the
# worse: its longest prompt grows with it while the typical one does not. Padding also costs memory
# and bandwidth: the rows of $q$, $k$, $v$ and $o$ for padded tokens are stored, read and written. The
# other layers of a transformer (projections, MLP) work token by token and never needed the batch
# dimension at all: packing all tokens into one `[total, hidden]` matrix is what they prefer anyway.
# Attention is the one layer that must know where each sequence starts.
#
# ![a padded batch against the same five sequences packed, with cu_seqlens; the grid of one head](../diagrams/varlen_packing.png)
#
# ## 2. Packing: `cu_seqlens`
#
# Pack the sequences one after another: `q [total_q, Hq, D]`, `k` and `v [total_k, Hkv, D]`. The
# boundaries are the cumulative lengths, $B + 1$ int32 numbers starting at 0:
#
# $$\texttt{cu\_seqlens}[0] = 0, \qquad \texttt{cu\_seqlens}[b+1] = \texttt{cu\_seqlens}[b] + L_b,$$
#
# and sequence $b$ is rows `cu_seqlens[b]:cu_seqlens[b+1]`. FlashAttention-2's `flash_attn_varlen_func`
# takes exactly this (`cu_seqlens_q`, `cu_seqlens_k`, `max_seqlen_q`, `max_seqlen_k`) and returns the lse
# as `[nheads, total_q]`; exercise 15 follows it. The figure's five sequences, packed, with $q$, $k$ and
# $v$ as views of one fused projection output `[total, Hq + 2 Hkv, D]`, as a model's QKV matmul writes it:

# %%
def as_bhsd(t):
    """[L, H, D] -> [1, H, L, D], the layout of lecture 01's reference (a view)."""
    return t.transpose(0, 1)[None]


LENGTHS = [7, 3, 12, 5, 9]                       # the figure's sequences
HQ, HKV, D = 4, 2, 8
gen = torch.Generator().manual_seed(2)

cu_seqlens = torch.zeros(len(LENGTHS) + 1, dtype=torch.int32)
cu_seqlens[1:] = torch.cumsum(torch.tensor(LENGTHS), 0)
total = int(cu_seqlens[-1])
print("cu_seqlens:", cu_seqlens.tolist(), " total:", total, " max_seqlen:", max(LENGTHS))

qkv = torch.randn(total, HQ + 2 * HKV, D, dtype=torch.float64, generator=gen)   # one fused QKV output
q, k, v = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]                   # views, no copy
print("q", tuple(q.shape), "strides", q.stride(), "| k", tuple(k.shape), "strides", k.stride(),
      "| shares qkv's storage:", q.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr())

# %% [markdown]
# Consecutive tokens of this `q` are $(H_q + 2H_{kv})D$ numbers apart (not $H_q D$, as in a `q` of its
# own), heads $D$ apart, elements 1 apart: a kernel takes the strides as arguments and needs only the last
# one to be 1. Sequence $b$ is a slice, `q[cu_seqlens[b]:cu_seqlens[b+1]]`, again a view.
#
# The reference is a loop: cut each sequence out, run lecture 01's attention on it, put the rows back.
# The lse goes to `[Hq, total_q]`, head first.

# %%
def varlen_by_loop(q, k, v, cu_q, cu_k, causal=False):
    """Packed attention, one sequence at a time (float64): o [total_q, Hq, D], lse [Hq, total_q]."""
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf)
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        ob, lb = reference_attention(as_bhsd(q[q0:q1]), as_bhsd(k[k0:k1]), as_bhsd(v[k0:k1]), causal=causal)
        o[q0:q1], lse[:, q0:q1] = ob[0].transpose(0, 1), lb[0]
    return o, lse


o_loop, lse_loop = varlen_by_loop(q, k, v, cu_seqlens, cu_seqlens, causal=True)
print("o", tuple(o_loop.shape), " lse", tuple(lse_loop.shape))

# %% [markdown]
# What the offsets prevent: run one causal attention over all 36 packed tokens as if they were one
# sequence. Sequence 0 comes out right (under a causal mask it sees nothing after itself); every later
# sequence attends to the ones before it. The same rows with a block-diagonal mask (query and key in
# the same sequence, and bottom-right causal inside it, lecture 10's document mask) are right again:

# %%
one_seq, _ = reference_attention(as_bhsd(q), as_bhsd(k), as_bhsd(v), causal=True)
one_seq = one_seq[0].transpose(0, 1)
for b in range(len(LENGTHS)):
    lo, hi = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
    print(f"sequence {b}: one causal attention over the packed tokens, max |o - per sequence| "
          f"{(one_seq[lo:hi] - o_loop[lo:hi]).abs().max():.2f}")

seq_id = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))   # [total]
pos = torch.arange(total) - cu_seqlens[seq_id]                                          # position in its sequence
mask = (seq_id[:, None] == seq_id[None, :]) & (pos[None, :] <= pos[:, None])            # Lq = Lk: plain causal
s = torch.einsum("ihd,jhd->hij", q, k.repeat_interleave(HQ // HKV, 1)) / math.sqrt(D)
o_mask = torch.einsum("hij,jhd->ihd", torch.softmax(s.masked_fill(~mask, -math.inf), -1),
                      v.repeat_interleave(HQ // HKV, 1))
print("block-diagonal mask over the packed tokens vs per sequence: max |o diff|", f"{(o_mask - o_loop).abs().max():.1e}")
assert torch.allclose(o_mask, o_loop, atol=1e-12)

# %% [markdown]
# The mask costs $\text{total}^2$ pairs to evaluate, the padded batch's problem again; a varlen kernel
# never looks at pairs across a boundary, because each program works inside one sequence.
#
# **The grid.** The exercise's kernel keeps step 05's grid with the batch axis over sequences:
# $(\lceil L^q_{\max} / B_M \rceil, B, H_q)$. Program $(m, b, h)$ reads `cu_seqlens_q[b]`,
# `cu_seqlens_q[b+1]` (and the same of `cu_seqlens_k`); if $m B_M \ge L^q_b$ its tile is past the end and
# it does nothing; otherwise it offsets its pointers by the sequence's start and runs step 05's loop over
# $L^k_b$ keys, masking the rows and keys past the ends.
#
# **Why `max_seqlen` is an argument.** The grid's size is decided on the host, before the launch. The
# host could compute $\max_b L_b$ from `cu_seqlens`, but `cu_seqlens` lives on the GPU: reading it
# (`.item()`, `.tolist()`) waits until every kernel queued before it has finished, and the CPU, which
# should be preparing the next launches, stalls; inside a CUDA graph capture such a read is not allowed at
# all. The scheduler that built the batch knows the lengths on the host anyway, so it passes the maximum
# in. (A grid sized for an upper bound works too: the surplus programs exit.)
#
# **Idle programs.** The grid is sized for the longest sequence, so the shorter ones leave programs with
# nothing to do. Counted for section 1's batch with $B_M = 128$ and 32 heads:

# %%
BLOCK_M = 128
n_m = math.ceil(Lmax / BLOCK_M)
launched = n_m * len(LENS) * 32
working = sum(math.ceil(L / BLOCK_M) for L in LENS) * 32
print(f"grid ({n_m}, {len(LENS)}, 32): {launched} programs, {working} with a tile, "
      f"{launched - working} ({1 - working / launched:.0%}) exit at once")
mean_keys = sum(math.ceil(L / BLOCK_M) * L for L in LENS) / sum(math.ceil(L / BLOCK_M) for L in LENS)
print(f"a working program: {BLOCK_M} rows x {mean_keys:.0f} keys on average (non-causal) = "
      f"{4 * BLOCK_M * mean_keys * 128 / 1e6:.0f} MFLOP at d = 128; an idle one: two int32 loads and no loop")

# %% [markdown]
# Most programs are idle, and it barely matters: an idle program costs a launch slot, two small loads
# (the same `cu_seqlens` entries all its neighbours read, from L2) and a loop that runs zero times, while a working one
# does tens of millions of FLOPs. What the grid does not control is **order**. Programs start roughly in
# the order of their index (GPUs tend to do that; CUDA promises nothing), so the long tiles of the
# longest sequence may start last and run alone at the end while the other SMs wait.
#
# A **packed tile list** removes the idle programs and fixes the order: a small pass computes, on the GPU, one entry per real tile
# (sequence, tile index, head), sorts it by work, and a persistent kernel walks it, longest first.
# Graham (1969) showed this longest-processing-time-first rule finishes within $4/3$ of the best
# possible schedule. FlashAttention-3's Hopper kernels do this (`hopper/tile_scheduler.hpp` and
# `flash_prepare_scheduler.cu`: persistent programs take tiles from a counter,
# longest first for causal masks, with a varlen variant that can sort sequences by their work).
#
# A model of it, said as one: one program per SM at a time, 132 SMs, a program's time proportional to
# the key tiles it visits ($B_N = 128$), an idle program's time a fiftieth of one key tile. Each program goes
# to the SM that frees first, in grid order or longest first; the table divides the finish time by the
# lower bound $\max(\text{total work} / 132, \text{longest tile})$. Fewer heads per GPU (tensor
# parallelism splits the heads across GPUs) means fewer tiles to balance:

# %%
def tile_costs(lengths, heads, causal, block=128):
    """Key tiles each program of the (m, b, h) grid visits, in grid order (m fastest); 0 for an idle one.
    Causal: a prefill (Lq = Lk), so tile m visits the key tiles 0 .. m."""
    n_m = math.ceil(max(lengths) / block)
    out = []
    for _ in range(heads):
        for L in lengths:
            for m in range(n_m):
                last_row = min(L, (m + 1) * block) - 1
                out.append(0 if m * block >= L else (last_row // block + 1 if causal else math.ceil(L / block)))
    return out


def finish_time(costs, sms=H100["sms"], idle=0.02):
    """List scheduling: each program, in order, goes to the SM that frees first."""
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + (c or idle))
    return max(free)


print(f"{'heads':>5s} {'mask':>10s} {'tiles':>6s} {'grid order':>11s} {'longest first':>14s}   (finish / lower bound)")
for heads in (32, 8, 4, 1):
    for causal in (False, True):
        costs = tile_costs(LENS, heads, causal)
        bound = max(sum(costs) / H100["sms"], max(costs))
        lpt = sorted((c for c in costs if c), reverse=True)
        print(f"{heads:5d} {'causal' if causal else 'non-causal':>10s} {sum(c > 0 for c in costs):6d} "
              f"{finish_time(costs) / bound:11.2f} {finish_time(lpt) / bound:14.2f}")

# %% [markdown]
# With 32 heads there are thousands of tiles and grid order is already close to the bound; with a few
# heads per GPU, and causal masks (whose tiles differ in length), grid order leaves SMs idle at the end
# and longest-first recovers most of it. The exercise keeps the simple grid.
#
# ## 3. Bottom-right, per sequence
#
# Inside each sequence the mask is lecture 04's: query $i$ of $L^q$ sees key $j$ of $L^k$ iff
# $j \le i + L^k - L^q$. The queries are the **last** $L^q$ of the sequence's $L^k$ tokens, so query $i$
# sits at position $L^k - L^q + i$ and sees every key up to its own position. With $L^q > L^k$ the first
# $L^q - L^k$ rows see no key: $o = 0$, $\text{lse} = -\infty$. Three sequences of one packed batch:

# %%
fig, axes = plt.subplots(1, 3, figsize=(9, 2.6))
for ax, (Lq, Lk) in zip(axes, ((3, 8), (6, 6), (6, 3))):
    i, j = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]
    ax.imshow((j <= i + Lk - Lq).float(), cmap="Blues", vmin=0, vmax=1.4)
    ax.set_xticks(range(Lk))
    ax.set_yticks(range(Lq))
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"Lq = {Lq}, Lk = {Lk}", fontsize=9)
fig.suptitle("j <= i + Lk - Lq: the queries are the last Lq tokens (blue = visible)", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# This is the alignment a server needs. With **prefix caching** (vLLM's automatic prefix caching;
# SGLang's RadixAttention, Zheng et al., NeurIPS 2024), a request whose prompt starts with tokens already
# cached (a system prompt, an earlier turn of the conversation) reuses their keys and values and computes
# only the rest: $L^q$ new queries against $L^k$ keys, the first $L^k - L^q$ of them cached. The new rows
# must equal the last $L^q$ rows of attention over the whole prompt, and only bottom-right alignment
# gives that. PyTorch's `is_causal` aligns top-left (query $i$ sees keys $j \le i$), which for $L^q < L^k$
# hides almost all of the cached prefix:

# %%
L_prompt, L_cached = 24, 16
gq, gk, gv = (torch.randn(1, HQ if t == "q" else HKV, L_prompt, D, dtype=torch.float64, generator=gen) for t in "qkv")
full, _ = reference_attention(gq, gk, gv, causal=True)                               # the whole prompt at once
new_br, _ = reference_attention(gq[:, :, L_cached:], gk, gv, causal=True)            # 8 new queries, 24 keys
new_tl, _ = reference_attention(gq[:, :, L_cached:], gk, gv, causal=True, align="top_left")
print(f"{L_prompt - L_cached} new queries after {L_cached} cached tokens, against the last rows of the full prompt:")
print(f"  bottom-right: max |o diff| {(new_br - full[:, :, L_cached:]).abs().max():.1e}")
print(f"  top-left:     max |o diff| {(new_tl - full[:, :, L_cached:]).abs().max():.2f}")
o_empty, lse_empty = reference_attention(gq[:, :, :5], gk[:, :, :2], gv[:, :, :2], causal=True)
print("Lq = 5, Lk = 2: lse of head 0 per row", [round(x, 2) for x in lse_empty[0, 0].tolist()],
      "| rows 0-2 of o are zero:", bool((o_empty[0, :, :3] == 0).all()))
assert torch.allclose(new_br, full[:, :, L_cached:], atol=1e-12)

# %% [markdown]
# ## 4. Chunked prefill on a paged cache
#
# A server runs the model one step at a time over a batch that changes every step: finished requests
# leave, new ones join (iteration-level scheduling, Orca, OSDI 2022; now called continuous batching).
# A new request's prompt must be **prefilled** (all its tokens through the model once, filling its KV
# cache) before it decodes. Prefilling a long prompt in one step makes that step long, and every request
# that is decoding waits for it: one long pause between two of their tokens. Sarathi-Serve (Agrawal et
# al., OSDI 2024) cuts the prompt into **chunks** and builds each step from the decodes plus as much
# prefill as a token budget allows, so decodes never stall; vLLM's scheduler implements the same idea
# (its `enable_chunked_prefill` option, the budget being `max_num_batched_tokens`).
#
# For attention, chunk $c$ of size $C$ of a prompt is $L^q = C$ new queries at positions
# $cC, \dots, cC + C - 1$ against $L^k = (c+1)C$ keys: everything cached by the earlier chunks plus the
# chunk itself, whose keys and values are written into the cache before the kernel runs. That is the
# bottom-right rule with $L^k = $ `seq_lens[b]`. A decode is the case $L^q = 1$. So one kernel serves the
# whole mixed step: packed new tokens (`cu_seqlens_q`), keys and values read from step 09's pages
# through the block table, `seq_lens` per sequence.
#
# ![one step of chunked prefill: packed new tokens, keys through the block table, a bottom-right mask per sequence](../diagrams/chunked_prefill_batch.png)
#
# The figure's step, built in PyTorch. Each sequence has its whole history of $q$, $k$, $v$ (the truth);
# the cache holds what earlier steps wrote; this step writes the new tokens' $k$, $v$ into their pages and
# attends. Every new row must equal the same row of one causal attention over the whole sequence.

# %%
PAGE, NUM_PAGES = 4, 12
MIXED = [(11, 1), (16, 8), (6, 1), (5, 5)]          # (seq_len after this step, new tokens), as in the figure
TABLE = [[3, 9, 0], [6, 1, 10, 4], [7, 2], [5, 8]]   # physical page of each logical page, as in the figure

k_cache = torch.full((NUM_PAGES, PAGE, HKV, D), math.nan, dtype=torch.float64)   # unwritten slots: NaN
v_cache = torch.full_like(k_cache, math.nan)
block_table = torch.full((len(MIXED), 4), -1, dtype=torch.int32)
for b, row in enumerate(TABLE):
    block_table[b, :len(row)] = torch.tensor(row, dtype=torch.int32)


def write_tokens(cache, table_row, start, rows):
    """Write rows [n, Hkv, D] at token positions start, start + 1, ... of one sequence."""
    for t in range(rows.shape[0]):
        p = start + t
        cache[int(table_row[p // PAGE]), p % PAGE] = rows[t]


def gather(cache, table_row, length):
    """[length, Hkv, D]: one sequence's tokens read through its block-table row (lecture 09)."""
    pages = cache[table_row[:math.ceil(length / PAGE)].long()]
    return pages.reshape(-1, *cache.shape[2:])[:length]


truth = [tuple(torch.randn(L, h, D, dtype=torch.float64, generator=gen) for h in (HQ, HKV, HKV)) for L, _ in MIXED]
for b, (L, n) in enumerate(MIXED):   # earlier steps wrote tokens 0 .. L-n-1; this step writes its n new ones first
    write_tokens(k_cache, block_table[b], 0, truth[b][1])
    write_tokens(v_cache, block_table[b], 0, truth[b][2])

seq_lens = torch.tensor([L for L, _ in MIXED], dtype=torch.int32)
cu_seqlens_q = torch.zeros(len(MIXED) + 1, dtype=torch.int32)
cu_seqlens_q[1:] = torch.cumsum(torch.tensor([n for _, n in MIXED]), 0)
q_new = torch.cat([truth[b][0][L - n:] for b, (L, n) in enumerate(MIXED)])     # packed new queries
print("cu_seqlens_q", cu_seqlens_q.tolist(), " seq_lens", seq_lens.tolist(), " q_new", tuple(q_new.shape))


def paged_prefill_by_loop(q, k_cache, v_cache, block_table, cu_q, seq_lens):
    """Each sequence's new queries against its cached keys (bottom-right causal), one at a time:
    o [total_q, Hq, D], lse [Hq, total_q]."""
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf)
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b:b + 2].tolist()
        L = int(seq_lens[b])
        kb, vb = (as_bhsd(gather(c, block_table[b], L)) for c in (k_cache, v_cache))
        ob, lb = reference_attention(as_bhsd(q[q0:q1]), kb, vb, causal=True)
        o[q0:q1], lse[:, q0:q1] = ob[0].transpose(0, 1), lb[0]
    return o, lse


o_step, _ = paged_prefill_by_loop(q_new, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens)
for b, (L, n) in enumerate(MIXED):
    whole, _ = reference_attention(*map(as_bhsd, truth[b]), causal=True)   # the sequence in one causal attention
    q0, q1 = cu_seqlens_q[b:b + 2].tolist()
    diff = (o_step[q0:q1] - whole[0, :, L - n:].transpose(0, 1)).abs().max()
    print(f"seq {b} ({'decode' if n == 1 else f'chunk of {n}'}, seq_len {L}): max |o - whole sequence's rows| {diff:.1e}")
    assert diff < 1e-12

# %% [markdown]
# The chunk size does not change the answer: one prompt of 40 tokens prefilled through the paged cache in
# chunks of 1 (that is, token by token, decoding), 7, 16 and 40 (all at once) gives the same rows.

# %%
L40 = 40
k40, v40 = (torch.full((10, PAGE, HKV, D), math.nan, dtype=torch.float64) for _ in range(2))
row40 = torch.arange(9, -1, -1, dtype=torch.int32)              # its 10 pages, in any order
tq, tk, tv = (torch.randn(L40, h, D, dtype=torch.float64, generator=gen) for h in (HQ, HKV, HKV))
whole, _ = reference_attention(as_bhsd(tq), as_bhsd(tk), as_bhsd(tv), causal=True)
for C in (1, 7, 16, 40):
    rows = []
    for start in range(0, L40, C):
        n = min(C, L40 - start)
        write_tokens(k40, row40, start, tk[start:start + n])
        write_tokens(v40, row40, start, tv[start:start + n])
        o_c, _ = paged_prefill_by_loop(tq[start:start + n], k40, v40, row40[None],
                                       torch.tensor([0, n], dtype=torch.int32), torch.tensor([start + n]))
        rows.append(o_c)
    print(f"chunks of {C:2d}: {math.ceil(L40 / C):2d} steps, max |o - one prefill| "
          f"{(torch.cat(rows) - whole[0].transpose(0, 1)).abs().max():.1e}")

# %% [markdown]
# **What the chunk size trades.** A model, not a measurement: one step's time is the roofline of the whole
# model's forward, $t = \max(\text{bytes} / \beta, \text{FLOPs} / \pi)$ at an H100's datasheet rates
# (3.35 TB/s, 989 TFLOP/s), with every byte read once, every FLOP at peak, and nothing else (no launch
# overhead, no efficiency below peak). The model has 8 billion parameters in fp16, 32 layers, 32 query
# heads and 8 KV heads of 128 (the shape of Llama 3 8B). A step reads the weights once, plus the KV cache
# every new token attends to; its FLOPs are $2 \times$ parameters per token plus attention's $4 d$ per
# (query, key) pair per head and layer. The batch: 32 requests decoding at a context of 2048 tokens, and
# one new prompt of 8192 tokens prefilled in chunks of $C$.

# %%
PARAMS, LAYERS, N_HQ, N_HKV, HEAD = 8.0e9, 32, 32, 8, 128
KV_BYTES = 2 * LAYERS * N_HKV * HEAD * 2                    # K and V of one token, all layers, fp16


def step_time(decode_ctx, chunk_start, chunk):
    """Roofline seconds of one step: decodes at contexts decode_ctx, one prefill chunk at chunk_start."""
    nbytes = PARAMS * 2 + KV_BYTES * (sum(decode_ctx) + chunk_start + chunk)
    pairs_ = sum(decode_ctx) + sum(chunk_start + i + 1 for i in range(chunk))
    flops = 2 * PARAMS * (len(decode_ctx) + chunk) + 4 * HEAD * N_HQ * LAYERS * pairs_
    return max(nbytes / H100["hbm"], flops / H100["fp16"])


DECODES, PROMPT = [2048] * 32, 8192
alone = step_time(DECODES, 0, 0)
print(f"decodes alone: a step every {alone * 1e3:.2f} ms (memory-bound: weights and KV cache)")
print(f"{'chunk':>6s} {'steps':>6s} {'between tokens (mean / worst, ms)':>34s} {'prompt prefilled in (ms)':>25s} "
      f"{'prefill tokens/s':>17s}")
for C in (128, 256, 384, 512, 1024, 2048, 8192):
    ts = [step_time(DECODES, s, min(C, PROMPT - s)) for s in range(0, PROMPT, C)]
    print(f"{C:6d} {len(ts):6d} {sum(ts) / len(ts) * 1e3:22.2f} / {max(ts) * 1e3:7.2f} {sum(ts) * 1e3:25.1f} "
          f"{PROMPT / sum(ts):17.0f}")
ridge_tokens = (PARAMS * 2 + KV_BYTES * sum(DECODES)) / H100["hbm"] * H100["fp16"] / (2 * PARAMS)
print(f"a step turns compute-bound at about {ridge_tokens:.0f} tokens (weights' FLOPs alone)")

# %% [markdown]
# Read it along the chunk size. While a step's tokens stay below the point where the step turns
# compute-bound, the chunk rides along with the decodes: the weights are read anyway, and the decodes'
# time between tokens barely moves. Past it, the step's time grows with the chunk, and every decoding
# request waits that long for its next token; the whole prompt in one step is the worst pause. Small chunks
# are not free either: the prompt takes many steps, each paying for a full read of the weights, so its
# time to first token grows. The best chunk sits near the turn; Sarathi-Serve chooses the token budget from a
# target for the time between tokens. Real kernels are slower than peak, and attention over a long prefix
# makes late chunks dearer than early ones (the worst column): the shape holds, the numbers are the model's.
#
# ## 5. MLA decode
#
# Lecture 09 measured decode by the bytes of the KV cache. DeepSeek-V2 (2024, §2.1) shrinks them with
# **multi-head latent attention**. Per token $t$ of hidden state $h_t$, the cache keeps a compressed latent
# and one small key shared by all heads,
#
# $$c_t = W^{DKV} h_t \in \mathbb{R}^{d_c}, \qquad k^R_t = \text{RoPE}_t(W^{KR} h_t) \in \mathbb{R}^{d_R},$$
#
# and head $i$'s key and value are up-projections of the latent, its key extended by the shared RoPE part:
#
# $$k_{t,i} = [\,W^{UK}_i c_t \,;\, k^R_t\,], \qquad v_{t,i} = W^{UV}_i c_t, \qquad
#   q_{i} = [\,q^C_i \,;\, q^R_i\,], \qquad u = W^O [o_1; \dots; o_{n_h}] .$$
#
# DeepSeek-V2 uses $n_h = 128$ heads of $d_h = 128$, $d_c = 512$ and $d_R = 64$: 576 numbers per token and
# layer, against $2 \cdot 128 \cdot 128$ for multi-head attention.
#
# **Absorption.** Up-projecting the cached latents into keys and values at every decode step would redo two
# $512 \times 128$ products per cached token and head; keeping the up-projected keys and values instead
# would give back what the latent saved. Move the matrices instead. For the score,
#
# $$q^C_i \cdot (W^{UK}_i c_j) = (W^{UK\top}_i q^C_i) \cdot c_j = \tilde q_i \cdot c_j,$$
#
# so with $\tilde q_i = W^{UK\top}_i q^C_i \in \mathbb{R}^{d_c}$, computed once per query, the score is
# $s_{ij} = \tilde q_i \cdot c_j + q^R_i \cdot k^R_j$: a dot product with the cached $[c_j; k^R_j]$ itself.
# For the output, the weights $p_{ij}$ sum the values linearly,
#
# $$o_i = \sum_j p_{ij} W^{UV}_i c_j = W^{UV}_i \Big(\sum_j p_{ij} c_j\Big) = W^{UV}_i \tilde o_i,
#   \qquad u = \sum_i W^O_i W^{UV}_i\, \tilde o_i ,$$
#
# and $W^O_i W^{UV}_i$ is one matrix, fixed after training. Decode then **is multi-query attention over the
# latent**: $n_h$ query heads of dimension $d_c + d_R = 576$ against one shared key head of 576 and value
# head of 512, the value being the first 512 numbers of the key. The RoPE part cannot be absorbed: the
# rotation depends on the positions of query and key, so no fixed matrix can stand between them; that is
# why DeepSeek-V2 keeps it separate (its "decoupled RoPE", §2.1.3). The scale stays the one of the per-head
# form, $1/\sqrt{d_h + d_R}$.
#
# ![MLA at decode: up-projecting every latent per head, against W_UK absorbed into the query and W_UV into the output](../diagrams/mla_absorption.png)
#
# Checked in float64 with small random weights: the explicit form and the absorbed one, for one query
# token after 10 cached ones.

# %%
def rope(x, positions, base=10000.0):
    """Rotary embedding of x [..., n, d] (d even) at the given positions: pairs (2k, 2k+1) rotated."""
    d = x.shape[-1]
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


d_model, n_h, d_h, d_c, d_R, L_ctx = 48, 4, 8, 16, 4, 10


def W(*shape):
    """A random weight, scaled so that products stay of order one."""
    return torch.randn(*shape, dtype=torch.float64, generator=gen) / math.sqrt(shape[-1])


W_DKV, W_KR = W(d_c, d_model), W(d_R, d_model)
W_UK, W_UV = W(n_h, d_h, d_c), W(n_h, d_h, d_c)
W_Q, W_QR, W_O = W(n_h, d_h, d_model), W(n_h, d_R, d_model), W(d_model, n_h * d_h)
h_ctx = torch.randn(L_ctx, d_model, dtype=torch.float64, generator=gen)      # the tokens' hidden states
x = torch.randn(d_model, dtype=torch.float64, generator=gen)               # the query token's, position L_ctx - 1
scale_mla = 1 / math.sqrt(d_h + d_R)

c = h_ctx @ W_DKV.T                                                # the cache: [L, d_c] ...
k_R = rope(h_ctx @ W_KR.T, torch.arange(L_ctx))                    # ... and [L, d_R], shared by the heads
q_C = W_Q @ x                                                      # [n_h, d_h]
q_R = rope((W_QR @ x)[:, None], torch.tensor([L_ctx - 1]))[:, 0]  # [n_h, d_R]

# explicit: every head's keys and values up-projected from the latent
k_C = torch.einsum("hdc,jc->hjd", W_UK, c)                         # [n_h, L, d_h]
v_h = torch.einsum("hdc,jc->hjd", W_UV, c)
s_exp = (torch.einsum("hd,hjd->hj", q_C, k_C) + q_R @ k_R.T) * scale_mla
o_exp = torch.einsum("hj,hjd->hd", torch.softmax(s_exp, -1), v_h)
u_exp = W_O @ o_exp.reshape(-1)

# absorbed: W_UK into the query, W_UV into the output; attention over [c; k_R] with value c
q_tilde = torch.einsum("hdc,hd->hc", W_UK, q_C)                   # [n_h, d_c]
q_abs = torch.cat([q_tilde, q_R], -1)                             # [n_h, d_c + d_R]: 576 in DeepSeek-V2
kv_latent = torch.cat([c, k_R], -1)                                # [L, d_c + d_R]: the cache, as it is stored
s_abs = q_abs @ kv_latent.T * scale_mla
o_tilde = torch.softmax(s_abs, -1) @ kv_latent[:, :d_c]           # the value is the latent part of the key
W_OUV = torch.einsum("mhd,hdc->mhc", W_O.view(d_model, n_h, d_h), W_UV).reshape(d_model, n_h * d_c)
u_abs = W_OUV @ o_tilde.reshape(-1)
print("max |scores explicit - absorbed|", f"{(s_exp - s_abs).abs().max():.1e}")
print("max |output explicit - absorbed|", f"{(u_exp - u_abs).abs().max():.1e}")
assert torch.allclose(u_exp, u_abs, atol=1e-12)

# %% [markdown]
# The two agree to float64's rounding. What it buys, per token and layer in a 16-bit format, for a model of
# 128 query heads of 128: the cache's bytes, and the FLOPs a decode step does per byte of cache it reads
# (one query token; lecture 09's intensity). For MLA the FLOPs are the absorbed form's: every one of 128 heads
# takes a 576-number dot product and a 512-number weighted sum per cached token.

# %%
Hq_, d_, e_ = 128, 128, 2
CACHES = {"MHA (128 KV heads of 128)": dict(k=128 * d_, v=128 * d_, qk=d_, pv=d_),
          "GQA (8 KV heads of 128)": dict(k=8 * d_, v=8 * d_, qk=d_, pv=d_),
          "MQA (1 KV head of 128)": dict(k=d_, v=d_, qk=d_, pv=d_),
          "MLA (512 + 64, absorbed)": dict(k=512 + 64, v=0, qk=512 + 64, pv=512)}   # v is part of k
print(f"{'cache':28s} {'numbers/token':>13s} {'bytes/token':>12s} {'vs MHA':>7s} {'decode FLOP/byte':>17s}")
for name, cfg in CACHES.items():
    numbers = cfg["k"] + cfg["v"]
    flops = Hq_ * 2 * (cfg["qk"] + cfg["pv"])                      # per cached token, one query token
    print(f"{name:28s} {numbers:13d} {numbers * e_:12d} {numbers / (2 * 128 * d_):7.1%} {flops / (numbers * e_):17.0f}")
print(f"MLA's cache equals GQA with {(512 + 64) / (2 * d_)} KV heads of 128 (the paper's '2.25 groups');"
      f" H100 ridge: {H100['fp16'] / H100['hbm']:.0f} FLOP/byte")
print(f"prefill, per (query, key) pair and head: explicit {2 * (128 + 64) + 2 * 128} FLOPs, "
      f"absorbed {2 * (512 + 64) + 2 * 512}")

# %% [markdown]
# MLA's cache is a little over twice MQA's and a small fraction of multi-head attention's, yet every head
# keeps its own keys and values (up to the shared RoPE part). Its decode is no longer far left of the
# roofline: 128 heads share every byte they read, and the intensity lands near an H100's ridge, so an MLA
# decode kernel has to care about its tensor cores as much as about its loads. The last line is why
# absorption is for decode: in prefill, where FLOPs are the cost, the absorbed form does more than three
# times the work per pair, and the explicit form (up-project the chunk's keys and values once, attend per
# head at $d = 192$ and 128) is cheaper. MLA stays on paper in this course: no exercise asks for it; DeepSeek
# published its own decode kernel for it, FlashMLA (2025).
#
# ## 6. On a GPU
#
# What the course measured for step 15 on a GPU (`course/results/measured.json`, read by `facourse.results`):
# every rung of the ladder on its timed batch, against FlashAttention-2's varlen kernel through PyTorch on the
# same batch. `prefill_mix` is sixteen prompts packed end to end, causal; `chunked_p16` is one step of
# continuous batching: eight chunks of 2048 new tokens over caches of 2k to 18k tokens and 32 one-token
# decodes, pages of 16. The v1 rows are the exercise's solution (section 2's grid, every tile masked); v2 adds
# step 05's causal split, starts each column with its last (longest) query tile and takes its tiles from a sweep;
# v3 makes the page size a compile-time constant, so that finding a key's page and row costs a shift and a mask
# instead of an integer division (which a GPU does in software).
# The paged batch is the harder one for a program per query tile: its chunks see up to 18k keys while its
# decodes fill 128-row tiles with one row each, and its keys are found one row at a time through the block table.

# %%
from facourse import results

R15 = results.show("15")   # the ladder's table (facourse.kinds.varlen); None until a measurement is committed

# %% [markdown]
# ## Summary
#
# - A server's batch is ragged. Padded to its longest sequence it does mostly padding (four fifths of the
#   work for section 1's 32 prompts), and more as the batch grows. Packing puts the tokens one after another;
#   `cu_seqlens` ($B + 1$ int32 offsets) says where each sequence starts; $q$, $k$, $v$ may be strided views
#   of one fused projection.
# - A varlen kernel keeps step 05's grid, $(\lceil L^q_{\max}/B_M \rceil, B, H_q)$; each program finds its
#   sequence in `cu_seqlens` and exits if its tile is past the end. `max_seqlen` is passed in so that the
#   grid is sized without reading the GPU from the host (no sync, capturable in a CUDA graph). Idle
#   programs cost next to nothing; the order of the real ones matters when there are few of them, and a
#   sorted list of tiles, longest first, fixes it (FlashAttention-3's schedulers).
# - The mask is bottom-right per sequence: the $L^q$ queries are the last of the $L^k$ tokens. That is what
#   makes prefix caching, chunked prefill and decoding one computation; rows with no key give $o = 0$,
#   $\text{lse} = -\infty$.
# - Chunked prefill (Sarathi-Serve) packs decodes and a chunk of a prompt into one step; the chunk reads its
#   prefix through the block table. In a roofline model, chunks up to the point where the step turns
#   compute-bound ride along with the decodes; larger ones make every decode wait.
# - MLA caches a 512-number latent and a 64-number RoPE key per token; absorbing $W^{UK}$ into the query and
#   $W^{UV}$ into the output turns decode into multi-query attention over the latent, at an intensity near
#   the ridge.
#
# **Next:** exercise 15 (`exercises/15_serving/15_serving.ipynb`) writes `varlen_attention` and
# `paged_prefill` in Triton: one kernel over packed sequences, and the same kernel reading its keys and
# values through the block table.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
