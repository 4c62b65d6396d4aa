# %% [markdown]
# # 09 — Decoding with split-KV, GQA packing and a paged KV cache
#
# A language model generates one token at a time. At each step, every sequence $b$ of the batch
# brings $S_q$ new query tokens (usually one) and attends to the $L_b$ keys and values cached so far,
# its own new ones included. For query head $h$, reading KV head $h_{kv} = h // G$ with
# $G = H_q / H_{kv}$, and query token $i$ (position $L_b - S_q + i$ of the sequence):
#
# $$o_{b,h,i} = \sum_{j \le L_b - S_q + i} e^{s_j - \text{lse}}\, v_{b,h_{kv},j},
#   \qquad s_j = \text{scale}\cdot q_{b,h,i}\cdot k_{b,h_{kv},j}, \qquad
#   \text{lse} = \log \sum_{j \le L_b - S_q + i} e^{s_j}.$$
#
# The keys and values do not sit in one tensor per sequence: they live in fixed-size **pages** of a
# shared pool, and a **block table** says which physical page holds each sequence's $p$-th logical page.
#
# **What you will learn**
# - why decoding is memory-bound: the arithmetic intensity of one query row, and of a GQA group,
#   on lecture 00's roofline; decode time predicted from the bytes of $K$ and $V$;
# - why a forward kernel like step 05's leaves most of the GPU idle at $S_q = 1$, and how
#   **split-KV** fixes it: programs over chunks of keys, each writing a partial $(o_s, \text{lse}_s)$,
#   and a second pass that merges them with lecture 03's merge (flash-decoding); how many splits;
# - **GQA packing**: the $G$ query heads of a group read their $K$ and $V$ once;
# - the **paged KV cache**: pages, block tables, why they end fragmentation, shared prefix pages,
#   FlashInfer's compressed layout; variable lengths in one batch; a few query tokens per sequence
#   (speculative decoding) with the bottom-right causal mask.
#
# **Sources followed.** Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, *Flash-Decoding for
# long-context inference* (PyTorch / Stanford CRFM blog post, October 2023): split-KV and the merge.
# Kwon et al., *Efficient Memory Management for Large Language Model Serving with PagedAttention*
# (SOSP 2023, the vLLM paper): §3-4, paging the KV cache. Ye et al., *FlashInfer: Efficient and
# Customizable Attention Engine for LLM Inference Serving* (MLSys 2025) and the FlashInfer documentation
# (`flashinfer.page`): the compressed page table. Ainslie et al., *GQA* (EMNLP 2023). Leviathan,
# Kalman, Matias, *Fast Inference from Transformers via Speculative Decoding* (ICML 2023).
#
# Exercise 09 asks for `paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None) -> (o, lse)`
# as Triton kernels: a split-KV kernel that reads the paged cache and a merge kernel. The PyTorch code in
# this lecture works on whole tensors, one sequence at a time, to show the ideas; it is not that answer.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch

from facourse import gpu_or_skip, reference_attention
from facourse.decode import get_decode_case

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

# Lecture 00's datasheet numbers (SXM parts): HBM bandwidth in TB/s, dense FP16 tensor-core TFLOP/s, SMs
GPUS = {"A100": dict(hbm_tbs=2.039, fp16_tflops=312, sms=108),
        "H100": dict(hbm_tbs=3.35, fp16_tflops=989, sms=132),
        "H200": dict(hbm_tbs=4.8, fp16_tflops=989, sms=132)}

# %% [markdown]
# ## 1. Decoding is memory-bound
#
# Count one step for one sequence of length $L$, one KV head, head dimension $d$, $e$ bytes per
# element (2 in fp16/bf16), with $G$ query heads reading that KV head and $S_q$ query tokens each:
#
# - **FLOPs**: every query row does $q K^\top$ ($2Ld$) and $p V$ ($2Ld$): $4 L d \cdot G S_q$;
# - **bytes**: $K$ and $V$ of the KV head, $2 L d e$, read **once** if the $G S_q$ rows share the read
#   (the query and output rows, $2 G S_q d e$, are negligible next to it for $L \gg G S_q$).
#
# $$I = \frac{4 L d\, G S_q}{2 L d e} = \frac{2\, G S_q}{e} \quad\text{FLOP/byte}
#   \qquad (= G S_q \text{ in fp16}).$$
#
# $L$ and $d$ cancel: however long the context, one query row per KV head does **1 FLOP per byte**
# (fp16). Lecture 00 put the H100's ridge at $989 / 3.35 \approx 295$ FLOP/byte. Multi-head attention
# ($G = 1$) at decode sits 295 times to the left of it; a GQA group of 8 is still 37 times too far
# left; only prefill, where $S_q$ is the whole prompt, crosses the ridge (lecture 00: $I = N/2$).

# %%
def decode_intensity(G, Sq=1, elem_bytes=2):
    """FLOP per byte of one decode step for one KV head: G·Sq query rows sharing one read of K and V."""
    return 2 * G * Sq / elem_bytes


h100 = GPUS["H100"]
ridge = h100["fp16_tflops"] / h100["hbm_tbs"]
print(f"H100 ridge: {ridge:.0f} FLOP/byte (fp16 tensor cores over HBM3)\n")
print(f"{'case':34s} {'I (FLOP/B)':>11s} {'best TFLOP/s':>13s} {'of peak':>8s}")
POINTS = {"decode, MHA (G = 1)": decode_intensity(1), "decode, GQA G = 4": decode_intensity(4),
          "decode, GQA G = 8": decode_intensity(8), "verify 4 drafted tokens, G = 8": decode_intensity(8, Sq=4),
          "prefill N = 4096 (lecture 00)": 4096 / 2}
for name, I in POINTS.items():
    best = min(h100["fp16_tflops"], h100["hbm_tbs"] * I)
    print(f"{name:34s} {I:11.0f} {best:13.1f} {best / h100['fp16_tflops']:8.1%}")

# %%
# the roofline of lecture 00, with the decode points
fig, ax = plt.subplots(figsize=(7.5, 4.2))
xs = [2 ** e for e in range(-1, 14)]
for name, style in (("H100", "-"), ("H200", "--")):
    g = GPUS[name]
    xg = sorted(xs + [g["fp16_tflops"] / g["hbm_tbs"]])              # the ridge itself, for a sharp corner
    ax.plot(xg, [min(g["fp16_tflops"], g["hbm_tbs"] * x) for x in xg], style, color="#444444",
            label=f"{name}: {g['hbm_tbs']} TB/s, {g['fp16_tflops']} TFLOP/s (ridge {g['fp16_tflops'] / g['hbm_tbs']:.0f})")
for (name, I), c in zip(POINTS.items(), ("#d9534f", "#f0ad4e", "#e67e22", "#8e44ad", "#4a90d9")):
    ax.plot([I], [min(h100["fp16_tflops"], h100["hbm_tbs"] * I)], "o", color=c, ms=8, label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("arithmetic intensity (FLOP/byte, fp16)")
ax.set_ylabel("attainable TFLOP/s")
ax.set_title("decode on lecture 00's roofline", fontsize=10)
ax.legend(fontsize=7.5, loc="lower right")
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
plt.show()

# %% [markdown]
# At decode the tensor cores are nearly irrelevant: the time is the time to **read the KV cache**.
# So the prediction is one division, bytes over bandwidth:
#
# $$t \approx \frac{\sum_b 2\, L_b\, H_{kv}\, d\, e}{\beta}.$$
#
# Below, one attention layer of a model shaped like many recent ones ($H_q = 32$, $H_{kv} = 8$,
# $d = 128$, fp16) at three batch sizes: 64 sequences of 8k tokens, 16 of 32k (the same number of
# tokens), one of 128k (a quarter of it); step 09's GPU benchmark cases carry these names.
# $\beta$ is the datasheet bandwidth (H100 SXM5: 3.35 TB/s HBM3; H200: 4.8 TB/s HBM3e). Lecture 00
# measured a plain copy on an H100 at about 90% of it: a good kernel takes about these times divided
# by 0.9, and none takes less than these times.

# %%
def kv_cache_bytes(seq_lens, Hkv, D, elem_bytes=2):
    """Bytes of K and V that one decode step reads: every cached token, every KV head, once."""
    return 2 * sum(seq_lens) * Hkv * D * elem_bytes


SHAPES = {"b64_8k": [8192] * 64, "b16_32k": [32768] * 16, "b1_128k": [131072]}
Hq_, Hkv_, D_ = 32, 8, 128
for name, lens in SHAPES.items():   # the same bytes as step 09's benchmark cases (pages of 16 tokens here)
    case = get_decode_case(name + "_p16")
    assert (case.Hq, case.Hkv, case.D, list(case.seq_lens)) == (Hq_, Hkv_, D_, lens)
    assert case.kv_bytes() == kv_cache_bytes(lens, Hkv_, D_)
print(f"{'shape':8s} {'KV bytes':>9s} {'H100 t_mem':>11s} {'H200 t_mem':>11s} {'H100 t_compute':>15s} {'ratio':>6s}")
for name, lens in SHAPES.items():
    nbytes = kv_cache_bytes(lens, Hkv_, D_)
    flops = 4 * sum(lens) * Hq_ * D_                     # one query token per sequence
    t_mem = {g: nbytes / (GPUS[g]["hbm_tbs"] * 1e12) for g in ("H100", "H200")}
    t_cmp = flops / (h100["fp16_tflops"] * 1e12)
    print(f"{name:8s} {nbytes / 1e9:7.2f} GB {t_mem['H100'] * 1e3:8.3f} ms {t_mem['H200'] * 1e3:8.3f} ms "
          f"{t_cmp * 1e6:12.1f} us {t_mem['H100'] / t_cmp:5.0f}x")

# %% [markdown]
# The memory time is 74 times the compute time at $G = 4$ (the ratio is $295 / I$). Two consequences
# shape everything that follows:
#
# - a decode kernel is judged in **bytes per second**, against the HBM bandwidth, not in TFLOP/s;
# - anything that reads $K$ or $V$ twice (a GQA group's heads each loading the same KV head, a page
#   loaded by two programs) costs time directly, and anything that leaves HBM idle (too few programs
#   in flight) does too.
#
# ## 2. Why step 05's kernel idles at $S_q = 1$
#
# Step 05 launches one program per (query tile, batch, query head): a grid of
# $\lceil S_q / B_r \rceil \times B H_q$. At $S_q = 1$ that is $B H_q$ programs, each holding **one**
# real query row in a tile of $B_r = 64$ or 128 rows, and each walking through its head's whole $K$ and
# $V$ alone. Three things go wrong:
#
# 1. **Too few programs.** With $B = 1$ and $H_q = 32$, 32 programs meet an H100's 132 SMs: 100 SMs
#    have nothing to do. Worse, an SM can only keep so many loads in flight. By Little's law the bytes
#    in flight must equal bandwidth × latency; with a DRAM latency of several hundred nanoseconds (an
#    order of magnitude, not a datasheet line) an H100 needs a few MB in flight to reach 3.35 TB/s,
#    i.e. tens of KB per SM when all 132 take part, and several times that per SM when only 32 do,
#    beyond what one program's registers and shared memory hold.
# 2. **$K$ and $V$ loaded $G$ times.** The $G$ programs of a GQA group each load the same KV head. L2
#    (50 MB on an H100) may catch some of the repeats when they run at the same time; a 128k-token KV
#    head (64 MiB in fp16) does not fit.
# 3. **Padded tiles.** One real row of 64 in each `tl.dot`: 63/64 of the tensor-core work is padding.
#    At 1 FLOP/byte that costs nothing measurable, the tensor cores being idle anyway; it is 2. seen
#    from the other side: the rows that could fill the tile belong to the other heads of the group,
#    which load the same $K$ and $V$ in other programs.
#
# The table counts programs and busy SMs for a few shapes ($H_q = 32$, $H_{kv} = 8$):

# %%
def step05_grid(B, Hq, Sq=1, block_m=64):
    """(programs, real rows per program) of a one-program-per-query-tile launch."""
    return math.ceil(Sq / block_m) * B * Hq, min(Sq, block_m)


sms = h100["sms"]
print(f"{'B':>3s} {'L':>7s} {'programs':>9s} {'SMs busy':>9s} {'KV loads per KV head':>21s}")
for B, L in ((64, 8192), (16, 32768), (4, 32768), (1, 131072)):
    n, rows = step05_grid(B, Hq_)
    print(f"{B:3d} {L:7d} {n:9d} {min(n, sms) / sms:9.0%} {Hq_ // Hkv_:21d}")

# %% [markdown]
# A large batch fills the GPU on its own. One long sequence does not: 128k tokens are a quarter of the
# bytes of the 64 × 8k batch, but 32 programs would stream them through a quarter of the SMs, so it
# could take as long or longer (section 9 measures exactly this on an H100). Batch and heads are
# exhausted; the fix must find parallelism **along the keys**, the only long axis left.
#
# ## 3. Split-KV and the merge: flash-decoding
#
# Cut the $L$ keys of a (sequence, KV head) into $S$ chunks $C_1, \dots, C_S$. Program $s$ computes the
# attention of its query rows over **its chunk only**, with the online softmax of lecture 03, and
# writes the normalised partial output and its log-sum-exp:
#
# $$o_s = \sum_{j \in C_s} \frac{e^{s_j}}{\sum_{j' \in C_s} e^{s_{j'}}}\, v_j,
#   \qquad \text{lse}_s = \log \sum_{j \in C_s} e^{s_j}.$$
#
# A second, small kernel merges the $S$ partials of each row. Lecture 03 (section 4) derived the
# merge of two partials; over $S$ of them it reads
#
# $$\text{lse} = \log \sum_s e^{\text{lse}_s}, \qquad o = \sum_s e^{\text{lse}_s - \text{lse}}\, o_s ,$$
#
# exact, in any order, because the weights $e^{\text{lse}_s - \text{lse}}$ are each chunk's share of
# the softmax's denominator. A chunk with no visible key has $\text{lse}_s = -\infty$ and weight 0.
# This is flash-decoding (Dao, Haziza, Massa, Sizov 2023): the grid gains a third axis, the split,
# so $B H_{kv} S$ programs share the work (with section 5's packing); the partials are written in fp32.
#
# ![flash-decoding: split the keys, merge the partials; the SMs busy with each grid](../diagrams/flash_decoding_split.png)
#
# In PyTorch, on whole tensors of one (sequence, KV head): the partials of every chunk, then the
# merge, against the float64 attention over all keys.

# %%
def chunk_partials(q, k, v, n_splits, scale):
    """Pass 1 of flash-decoding for one (sequence, KV head), as whole-tensor ops: q [R, D] (the query
    rows), k, v [L, D]. Returns o [S, R, D] (each chunk's normalised output) and lse [S, R]."""
    L = k.shape[0]
    chunk = max(1, math.ceil(L / n_splits))
    o_parts, lse_parts = [], []
    for s in range(n_splits):
        ks, vs = k[s * chunk:(s + 1) * chunk], v[s * chunk:(s + 1) * chunk]   # may be empty
        scores = scale * q @ ks.T                          # s_j = scale · q · k_j over the chunk
        lse_s = torch.logsumexp(scores, dim=-1)            # -inf for an empty chunk
        o_parts.append(torch.exp(scores - lse_s[:, None]) @ vs)   # o_s (zeros for an empty chunk)
        lse_parts.append(lse_s)
    return torch.stack(o_parts), torch.stack(lse_parts)


def merge_partials(o_parts, lse_parts):
    """Pass 2: lse = log Σ_s exp(lse_s), o = Σ_s exp(lse_s - lse) o_s (at least one chunk not empty)."""
    lse = torch.logsumexp(lse_parts, dim=0)
    w = torch.exp(lse_parts - lse)                         # each chunk's share of the denominator
    return (w[..., None] * o_parts).sum(0), lse


gen = torch.Generator().manual_seed(1)
G, D, L = 4, 64, 1000
q1 = torch.randn(G, D, dtype=torch.float64, generator=gen)          # the 4 query heads of one KV head
k1, v1 = (torch.randn(L, D, dtype=torch.float64, generator=gen) for _ in range(2))
scale = D ** -0.5
o_ref, lse_ref = reference_attention(q1[None, :, None], k1[None, None], v1[None, None])   # [1, G, 1, D]
for S in (1, 2, 3, 7, 16, 64):
    o, lse = merge_partials(*chunk_partials(q1, k1, v1, S, scale))
    print(f"S = {S:2d} chunks of {math.ceil(L / S):4d} keys: max |o - ref| {(o - o_ref[0, :, 0]).abs().max():.1e}, "
          f"max |lse - ref| {(lse - lse_ref[0, :, 0].double()).abs().max():.1e}")
    assert torch.allclose(o, o_ref[0, :, 0], atol=1e-12)

# %% [markdown]
# (The lse differs by $10^{-7}$ because the reference returns it in fp32, as the contract says.)
# Empty chunks happen: a short sequence in a batch launched with many splits. Ten keys in 16 chunks
# of one key leave six chunks empty; they get weight zero. A sequence with **no** key at all (length 0)
# makes every chunk empty, and then the formula divides $-\infty$ by $-\infty$:

# %%
# empty chunks, then a sequence with no key at all
o, lse = merge_partials(*chunk_partials(q1, k1[:10], v1[:10], 16, scale))
o_ref10, _ = reference_attention(q1[None, :, None], k1[None, None, :10], v1[None, None, :10])
print("10 keys, 16 splits (6 empty):", f"max |o - ref| {(o - o_ref10[0, :, 0]).abs().max():.1e}")
o, lse = merge_partials(*chunk_partials(q1, k1[:0], v1[:0], 4, scale))
print("0 keys, 4 splits: lse", lse.tolist(), " o has NaN:", bool(o.isnan().any()),
      " <- the contract wants o = 0, lse = -inf: a merge kernel must guard this row")

# %% [markdown]
# **What the split costs.** Each program writes $R$ rows of $d + 1$ fp32 numbers, and the merge reads
# them back: $2 \cdot S R (d+1) \cdot 4$ bytes per (sequence, KV head), against $2 L d e$ bytes of $K$
# and $V$. With $R = G = 4$, $d = 128$, fp16:

# %%
# bytes of the partials (written, then read by the merge) against the bytes of K and V
for L, S in ((8192, 1), (32768, 4), (131072, 16), (131072, 64), (4096, 64)):
    extra = 2 * S * G * (128 + 1) * 4
    kv = 2 * L * 128 * 2
    print(f"L = {L:6d}, S = {S:2d}: partials {extra / 1024:7.1f} KiB vs K/V {kv / 2**20:5.1f} MiB  (+{extra / kv:.2%})")

# %% [markdown]
# Negligible while chunks hold a few hundred keys or more; with chunks of 64 keys it starts to show.
# The merge is also one more kernel launch (a few microseconds), which matters when the whole step
# takes tens of microseconds.
#
# ## 4. How many splits?
#
# Enough programs to fill the GPU, and no more: more splits mean shorter chunks, more partials and a
# bigger merge. A rule in three lines:
#
# 1. if the grid without splits already fills most of the SMs (at least 80%, one wave's worth), one split;
# 2. otherwise, consider $S$ up to a cap, never with chunks shorter than a minimum (here 256 keys);
# 3. among them, take the smallest $S$ whose **wave efficiency** is close to the best: with $n$
#    programs on $N_{SM}$ SMs the launch runs in $\lceil n / N_{SM} \rceil$ waves and the last one may
#    be partly empty; efficiency $= (n / N_{SM}) / \lceil n / N_{SM} \rceil$.
#
# The same idea drives FlashAttention-2's `num_splits_heuristic` (`csrc/flash_attn/flash_api.cpp` of the
# `flash-attn` package; PyTorch's copy calls it for every forward without dropout): one split when the
# grid fills 80% of the SMs, otherwise the smallest split count whose wave efficiency is within 85% of
# the best, counting two programs per SM and at most 128 splits. Our function is our own, with one
# program per SM and a floor on the chunk length added.

# %%
def wave_efficiency(programs, n_sm):
    waves = programs / n_sm
    return waves / math.ceil(waves)


def choose_splits(B, Hkv, L, n_sm=132, min_chunk=256, max_splits=128):
    """Number of KV splits for a decode launch of B·Hkv (sequence, KV head) programs."""
    programs = B * Hkv
    if programs >= 0.8 * n_sm:
        return 1
    cap = max(1, min(max_splits, L // min_chunk))
    eff = {s: wave_efficiency(programs * s, n_sm) for s in range(1, cap + 1)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= 0.85 * best)


print(f"{'B':>3s} {'Hkv':>4s} {'L':>7s} {'splits':>7s} {'chunk':>7s} {'programs':>9s} {'waves':>6s} {'efficiency':>11s}")
for B, Hkv, L in ((64, 8, 8192), (16, 8, 32768), (8, 8, 32768), (4, 8, 32768), (1, 8, 131072), (1, 1, 131072),
                  (2, 8, 1024), (1, 8, 300)):
    S = choose_splits(B, Hkv, L)
    n = B * Hkv * S
    print(f"{B:3d} {Hkv:4d} {L:7d} {S:7d} {math.ceil(L / S):7d} {n:9d} {n / sms:6.2f} {wave_efficiency(n, sms):11.0%}")

# %% [markdown]
# The large batches get one split: their grid is already one or more full waves, and splitting would
# only add the merge. Halving the batch doubles the splits and keeps 128 programs. One sequence of 128k
# tokens with 8 KV heads gets 15 splits of about 8.7k keys: 120 programs, one wave at 91% (16 would fill
# 97%, but 15 is within the 85% margin and writes fewer partials). Multi-query attention
# ($H_{kv} = 1$) needs 109 splits of 1.2k keys for the same. Short sequences are held back by the chunk
# floor: 1024 keys get 4 splits of 256, 300 keys one, however idle the GPU; at that size the launch
# overhead dominates anyway. Like every such rule, it is a starting point to be checked by timing.
#
# ## 5. GQA packing
#
# The $G$ query heads $h_{kv} G, \dots, h_{kv} G + G - 1$ read the same KV head. Give them to **one**
# program: stack their query rows into one tile of $G S_q$ rows,
#
# $$Q^{\text{pack}}_{b, h_{kv}} = \begin{bmatrix} q_{b,\,h_{kv}G,\,0:S_q} \\ \vdots \\ q_{b,\,h_{kv}G + G-1,\,0:S_q}\end{bmatrix}
#   \in \mathbb{R}^{G S_q \times d}, \qquad S = \text{scale}\cdot Q^{\text{pack}} K^\top,$$
#
# and every $K$, $V$ tile the program loads serves $G S_q$ rows: the KV head is read once (the
# intensity of section 1), and the tile's rows are real query rows instead of padding ($G S_q = 4$ or
# 32 rows, padded up to the 16 that `tl.dot` needs at least). With $q$ in `[B, Hq, Sq, D]` layout the
# packed tile is a free reshape, `q.view(B, Hkv, G * Sq, D)`; row $r$ of it is query head
# $h_{kv} G + r // S_q$ and query token $r \bmod S_q$ (the causal mask of section 7 needs the latter).
# FlashAttention-2's forward does the same at $S_q = 1$: when there are fewer KV heads than query heads
# it reshapes $q$ so that the $G$ heads of a group become $G$ query rows of their KV head
# (`seqlenq_ngroups_swapped` in `flash_api.cpp`, credited there to Daniel Haziza).

# %%
# one packed tile per KV head: [B, Hkv, G·Sq, D], a view of q
B, Hq, Hkv, Sq, D, L = 2, 8, 2, 3, 16, 40
Gq = Hq // Hkv
gen = torch.Generator().manual_seed(2)
q = torch.randn(B, Hq, Sq, D, dtype=torch.float64, generator=gen)
k, v = (torch.randn(B, Hkv, L, D, dtype=torch.float64, generator=gen) for _ in range(2))
packed = q.view(B, Hkv, Gq * Sq, D)                                 # no copy: same storage
assert packed.data_ptr() == q.data_ptr()
r = 7
print(f"packed row {r} of KV head 1 is query head {1 * Gq + r // Sq}, token {r % Sq}:",
      torch.equal(packed[0, 1, r], q[0, 1 * Gq + r // Sq, r % Sq]))

s_packed = packed @ k.transpose(-1, -2) / math.sqrt(D)               # [B, Hkv, G·Sq, L]: one K read per KV head
o_packed = (torch.softmax(s_packed, -1) @ v).view(B, Hq, Sq, D)     # back to [B, Hq, Sq, D]: free again
o_ref, _ = reference_attention(q, k, v)                              # non-causal here; section 7 adds the mask
print("packed vs per-head reference: max |o diff|", f"{(o_packed - o_ref).abs().max():.1e}")
per_head = B * Hq * 2 * L * D * 2
print(f"K/V bytes loaded (fp16): one program per query head {per_head} B, packed {per_head // Gq} B ({Gq}x fewer)")

# %% [markdown]
# ## 6. The paged KV cache
#
# **The problem.** A serving system holds the KV caches of many requests at once, and does not know
# how long each will grow. Stored contiguously, each request's cache needs its maximum length
# reserved up front: what is reserved but never written is wasted (internal fragmentation), and as
# requests of different sizes come and go the free memory splits into holes too small for a new one
# (external fragmentation). Kwon et al. (SOSP 2023, §3) measured that in the serving systems of the
# time only about 20-40% of the KV-cache memory held actual token states; with fewer requests fitting,
# the batch, and therefore throughput, shrinks.
#
# **Paging** (the vLLM paper's PagedAttention, after virtual memory in operating systems): the cache
# is one pool of fixed-size **pages** (vLLM: *blocks*) of $P$ tokens, `k_cache[num_pages, P, Hkv, D]` and
# `v_cache` alike. A request receives pages one at a time as it grows, from anywhere in the pool; its
# **block table** row lists them in logical order. Token $t$ of sequence $b$ is at
#
# $$\text{page} = \texttt{block\_table}[b,\ t // P], \qquad \text{slot} = t \bmod P .$$
#
# The waste is at most $P - 1$ slots per sequence, in its last page; any free page serves any
# request, so there are no holes. And two sequences that start with the same prompt can **share** the
# pages of that prefix: two rows of the block table name the same physical page (a reference count
# says when it is free; a write into a shared, partly filled page first copies it).
#
# ![the paged KV cache: logical pages, the block table, the physical pool, shared prefix pages](../diagrams/paged_kv_cache.png)
#
# The figure's example, built in PyTorch: a pool of 12 pages of 4 tokens, handed out in a shuffled
# order; three sequences of 11, 14 and 6 tokens; the first two share an 8-token prompt (two pages).

# %%
# the figure's example: a pool of 12 pages of 4 tokens, 2 KV heads of dimension 8
P, HKV, DH, NUM_PAGES = 4, 2, 8, 12
gen = torch.Generator().manual_seed(3)
k_cache = torch.full((NUM_PAGES, P, HKV, DH), float("nan"), dtype=torch.float64)   # never-written slots: NaN
v_cache = torch.full_like(k_cache, float("nan"))
free_pages = [10, 8, 6, 3, 1, 4, 11, 5, 0, 9, 2, 7]   # the allocator's free list (pops from the end), as a
                                                      # busy server leaves it: in no particular order

prefix_k, prefix_v = (torch.randn(8, HKV, DH, dtype=torch.float64, generator=gen) for _ in range(2))
seqs_k, seqs_v = [], []                                             # each sequence's K, V, contiguous: the truth
for L, shares_prefix in ((11, True), (14, True), (6, False)):
    kk, vv = (torch.randn(L, HKV, DH, dtype=torch.float64, generator=gen) for _ in range(2))
    if shares_prefix:
        kk[:8], vv[:8] = prefix_k, prefix_v
    seqs_k.append(kk)
    seqs_v.append(vv)

prefix_pages = [free_pages.pop(), free_pages.pop()]                 # written once, for both sequences
for p, page in enumerate(prefix_pages):
    k_cache[page], v_cache[page] = prefix_k[p * P:(p + 1) * P], prefix_v[p * P:(p + 1) * P]

seq_lens = [kk.shape[0] for kk in seqs_k]
max_pages = max(math.ceil(L / P) for L in seq_lens)
block_table = torch.full((len(seqs_k), max_pages), -1, dtype=torch.int32)   # -1: no page
for b, (kk, vv) in enumerate(zip(seqs_k, seqs_v)):
    shared = len(prefix_pages) if b < 2 else 0
    block_table[b, :shared] = torch.tensor(prefix_pages[:shared], dtype=torch.int32)
    for p in range(shared, math.ceil(seq_lens[b] / P)):              # the sequence's own pages
        page = free_pages.pop()
        block_table[b, p] = page
        n = min(P, seq_lens[b] - p * P)                              # the last page may be partly filled
        k_cache[page, :n], v_cache[page, :n] = kk[p * P:p * P + n], vv[p * P:p * P + n]

print("block_table (as in the figure):\n", block_table)
print("seq_lens:", seq_lens, "  free pages left:", sorted(free_pages))

# %% [markdown]
# Reading a sequence back is a gather along the block table: its pages in logical order, flattened,
# cut at its length. (A kernel never materialises this copy; it computes each page's address and
# loads the tile from there.)

# %%
def gather_pages(cache, table_row, length):
    """[length, Hkv, D]: the tokens of one sequence, read page by page through its block-table row."""
    n_pages = math.ceil(length / cache.shape[1])
    pages = cache[table_row[:n_pages].long()]                        # [n_pages, P, Hkv, D]
    return pages.reshape(-1, *cache.shape[2:])[:length]


for b in range(3):
    assert torch.equal(gather_pages(k_cache, block_table[b], seq_lens[b]), seqs_k[b])
    assert torch.equal(gather_pages(v_cache, block_table[b], seq_lens[b]), seqs_v[b])
print("every sequence reads back exactly; sequences 0 and 1 read physical pages",
      block_table[0, :2].tolist(), "for their common prefix")

# %% [markdown]
# Attention reads through the table and never sees where pages are. Shuffle the physical pages
# (a new order in the pool, the block table renamed to match): the outputs are **bitwise** the same.
# And each sequence, shared prefix pages included, gets bitwise what it would get from a private,
# contiguous copy of its keys and values.

# %%
def decode_one(q_b, cache_k, cache_v, table_row, length):
    """Attention of one sequence's query rows [Hq, Sq, D] over its cached keys (whole tensors)."""
    kk = gather_pages(cache_k, table_row, length).transpose(0, 1)[None]   # [1, Hkv, L, D]
    vv = gather_pages(cache_v, table_row, length).transpose(0, 1)[None]
    return reference_attention(q_b[None], kk, vv, causal=True)


HQ = 4
qs = torch.randn(3, HQ, 1, DH, dtype=torch.float64, generator=gen)
before = [decode_one(qs[b], k_cache, v_cache, block_table[b], seq_lens[b]) for b in range(3)]

perm = torch.randperm(NUM_PAGES, generator=gen)                     # physical page i moves to perm[i]
k_moved, v_moved = torch.empty_like(k_cache), torch.empty_like(v_cache)
k_moved[perm], v_moved[perm] = k_cache, v_cache
table_moved = torch.where(block_table >= 0, perm[block_table.long().clamp(min=0)], -1).to(torch.int32)
after = [decode_one(qs[b], k_moved, v_moved, table_moved[b], seq_lens[b]) for b in range(3)]
print("block table after the shuffle:\n", table_moved)
print("outputs bitwise equal after the shuffle:",
      all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(before, after)))
private = [reference_attention(qs[b][None], seqs_k[b].transpose(0, 1)[None], seqs_v[b].transpose(0, 1)[None],
                               causal=True) for b in range(3)]
print("outputs bitwise equal to private contiguous copies:",
      all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(before, private)))

# %% [markdown]
# **Slots past the end hold garbage.** Here they are NaN on purpose (the course's inputs do the same).
# Masking the scores of those slots to $-\infty$ is not enough: their probability is 0, but
# $0 \cdot \text{NaN} = \text{NaN}$ in $PV$. A kernel must also keep the *values* of masked slots out of
# the product (load them as 0). Reading whole pages, with only the scores masked:

# %%
# sequence 0 read as whole pages, the scores of the slots past its end masked
b = 0
n_pages = math.ceil(seq_lens[b] / P)
k_pages = k_cache[block_table[b, :n_pages].long()].reshape(-1, HKV, DH)   # 12 slots, 11 tokens
v_pages = v_cache[block_table[b, :n_pages].long()].reshape(-1, HKV, DH)
s = qs[b, 0:2, 0] @ k_pages[:, 0].T / math.sqrt(DH)                   # query heads 0, 1 read KV head 0
s[:, seq_lens[b]:] = -math.inf                                       # scores of the slots past the end masked
p = torch.softmax(s, -1)
print("probability of the slot past the end:", p[:, -1].tolist())
print("output with the scores masked only:", (p @ v_pages[:, 0])[0, :3].tolist(), "...")
print("output with the values masked too: ", (p @ v_pages[:, 0].nan_to_num(0.0))[0, :3].tolist(), "...")

# %% [markdown]
# **Memory, counted.** A batch of 64 requests whose lengths are spread between 100 and 4000 tokens,
# each reserved for a maximum of 4096 contiguously, against pages of 16 tokens (vLLM's default block
# size) holding the same requests:

# %%
# 64 requests of 100 to 4000 tokens: paged vs reserved contiguously
lens = torch.randint(100, 4001, (64,), generator=gen)
reserved = 64 * 4096
for page in (16, 64, 256):
    paged = int((torch.ceil(lens / page) * page).sum())
    print(f"pages of {page:3d} tokens: {paged:6d} slots for {int(lens.sum())} tokens ({int(lens.sum()) / paged:.1%} used)")
print(f"contiguous, 4096 reserved each: {reserved:6d} slots ({int(lens.sum()) / reserved:.1%} used)")

# %% [markdown]
# Larger pages waste more of each last page but make each page a longer contiguous read and the block
# table shorter; step 09's GPU cases time pages of 16 and 64 tokens. (The vLLM paper reports 2-4× the
# throughput of the serving systems it compares with, at the same latency, mostly from fitting larger
# batches.)
#
# ### FlashInfer's compressed page table
#
# A padded `[B, max_pages]` table wastes entries when lengths differ widely. FlashInfer (documentation,
# `flashinfer.page`; Ye et al. 2025) stores the same information the way a sparse matrix stores its rows
# (CSR): one flat list `kv_indices` of every sequence's pages, one after another; `kv_indptr[b]` and
# `kv_indptr[b+1]` delimit sequence $b$'s run in it; and `kv_last_page_len[b]` says how many slots of
# its last page are filled, so that its length is $(\text{pages} - 1) P + \text{last\_page\_len}$. The
# page pool itself uses the same `[num_pages, page_size, num_kv_heads, head_dim]` order as ours (FlashInfer
# calls it the `NHD` layout; `HND` puts the heads before the slots). Converting one into the other:

# %%
def to_compressed(block_table, seq_lens, page_size):
    n_pages = [math.ceil(L / page_size) for L in seq_lens]
    indptr = [0]
    for n in n_pages:
        indptr.append(indptr[-1] + n)
    indices = [int(block_table[b, p]) for b, n in enumerate(n_pages) for p in range(n)]
    last = [L - (n - 1) * page_size if n else 0 for L, n in zip(seq_lens, n_pages)]
    return indptr, indices, last


def from_compressed(indptr, indices, last, page_size):
    B = len(indptr) - 1
    n_pages = [indptr[b + 1] - indptr[b] for b in range(B)]
    table = torch.full((B, max(n_pages)), -1, dtype=torch.int32)
    for b in range(B):
        table[b, :n_pages[b]] = torch.tensor(indices[indptr[b]:indptr[b + 1]], dtype=torch.int32)
    lens = [(n - 1) * page_size + l if n else 0 for n, l in zip(n_pages, last)]
    return table, lens


indptr, indices, last = to_compressed(block_table, seq_lens, P)
print("kv_indptr       ", indptr, "\nkv_indices      ", indices, "\nkv_last_page_len", last)
table2, lens2 = from_compressed(indptr, indices, last, P)
assert torch.equal(table2, block_table) and lens2 == seq_lens

# %% [markdown]
# ## 7. Variable lengths and several query tokens per sequence
#
# **Variable lengths.** One launch serves the whole batch; each program reads its sequence's length
# from `seq_lens` and its chunk of keys from the block table. With a fixed number of splits, short
# sequences have short chunks (or empty ones, which write $\text{lse}_s = -\infty$ and exit) while long
# ones have long chunks: the programs of one launch do unequal work, and the longest decides when the
# launch ends. Choosing chunks of a fixed number of keys instead (so a number of splits per sequence)
# balances it, at the price of a grid computed on the host from the lengths. A sequence of length 0
# (a slot of the batch not in use) has no key: $o = 0$, $\text{lse} = -\infty$, as for the empty rows
# of lecture 04. Counted on the lengths of step 09's `mixed` GPU case:

# %%
# keys per program: a fixed number of splits per sequence, or a fixed chunk length
from facourse.decode import DECODE_CASES

mixed = list(DECODE_CASES["mixed"].seq_lens)
print("seq_lens:", mixed)
for label, chunk_of in (("8 splits per sequence", lambda L: math.ceil(L / 8)), ("chunks of 1024 keys", lambda L: 1024)):
    work = [min(chunk_of(L), L - start) for L in mixed if L for start in range(0, L, chunk_of(L))]
    print(f"{label:22s}: {len(work):3d} programs per KV head with keys, the longest {max(work):5d} keys, "
          f"the mean {sum(work) / len(work):6.0f} (longest / mean {max(work) / (sum(work) / len(work)):4.1f})")

# %% [markdown]
# With 8 splits, the 32k sequence's programs read 4096 keys each while the average program reads about
# 800: the launch waits on a few programs that run 5 times longer than the mean. Chunks of 1024 keys give
# a few fewer programs, the longest only 1.1 times the mean. (Lengths this uneven are the normal case for
# a server: requests arrive and finish at different times.)
#
# **Several query tokens.** Speculative decoding (Leviathan et al. 2023) lets a small model draft a few
# tokens, then verifies them with the large model in **one** step: $S_q$ query tokens per sequence
# instead of one, the last $S_q$ tokens of the sequence, their keys and values already appended to the
# cache. Query $i$ sits at position $L - S_q + i$ and may see keys $j \le L - S_q + i$: the course's
# bottom-right causal rule with $S_{kv} = L$. Packed with GQA, a program's tile holds $G S_q$ rows and
# its intensity grows to $G S_q$ FLOP/byte (section 1): verifying 4 drafted tokens costs about the same
# time as decoding one, as long as $G S_q$ stays far below the ridge.
#
# Checked on the paged cache: $S_q = 3$ query tokens of sequence 1 at once, against three separate
# one-token decodes over the first $L - 2$, $L - 1$ and $L$ keys (what generating them one at a time
# would have computed).

# %%
# three query tokens of sequence 1 at once, against three one-token decodes
b, Sq3 = 1, 3
q3 = torch.randn(HQ, Sq3, DH, dtype=torch.float64, generator=gen)
o3, lse3 = decode_one(q3, k_cache, v_cache, block_table[b], seq_lens[b])        # bottom-right causal
for i in range(Sq3):
    visible = seq_lens[b] - Sq3 + i + 1                                           # keys 0 .. L - Sq + i
    o1, lse1 = decode_one(q3[:, i:i + 1], k_cache, v_cache, block_table[b], visible)
    print(f"query token {i} (position {visible - 1}) sees {visible} keys: max |o diff| "
          f"{(o3[0, :, i] - o1[0, :, 0]).abs().max():.1e}")
    assert torch.allclose(o3[0, :, i], o1[0, :, 0], atol=1e-12)

kk = gather_pages(k_cache, block_table[b], seq_lens[b]).transpose(0, 1)[None]
vv = gather_pages(v_cache, block_table[b], seq_lens[b]).transpose(0, 1)[None]
o_tl, _ = reference_attention(q3[None], kk, vv, causal=True, align="top_left")
print("with PyTorch's top-left is_causal instead, query token 0 would see key 0 only: max |o diff|",
      f"{(o_tl - o3).abs().max():.2f}")

# %% [markdown]
# ## 8. The course's decode inputs
#
# Exercise 09 and its checks draw their inputs from `facourse.decode`: named cases (`get_decode_case`),
# paged inputs built from a case (`make_paged_inputs`: pages handed out in a shuffled order, some shared
# between sequences, unused slots NaN) and the float64 reference that reads through the block table
# (`paged_reference`). Here the reference is checked against this lecture's gather on every case of
# the CPU profile; the table shows what each case exercises: lengths 0, 1 and one either side of a page,
# pages of 16, 48 (no power of two) and 64 tokens, pages shared by a prefix, multi-query attention,
# 4 query tokens per sequence, and the slots that hold NaN because no sequence owns them.

# %%
from facourse.decode import make_paged_inputs, paged_reference

print(f"{'case':7s} {'Hq':>3s} {'Hkv':>3s} {'Sq':>3s} {'D':>4s} {'page':>4s}  {'seq_lens':34s} {'pages':>5s} "
      f"{'shared':>6s} {'NaN rows':>8s} {'max |diff|':>10s}")
for name in ("mixed", "page64", "page48", "prefix", "mqa", "spec", "d64"):
    case = get_decode_case(name, "cpu")
    x = make_paged_inputs(case, seed=0)                     # fp32 on a CPU
    o_ref, lse_ref = paged_reference(*x)                    # float64, read through the block table
    worst, users = 0.0, {}
    for b, L in enumerate(x.seq_lens.tolist()):
        used = x.block_table[b, :math.ceil(L / case.page_size)].tolist()
        for page in used:
            users[page] = users.get(page, 0) + 1
        if L == 0:                                          # an empty sequence: o = 0, lse = -inf
            assert (o_ref[b] == 0).all() and (lse_ref[b] == -math.inf).all()
            continue
        o_b, _ = decode_one(x.q[b].double(), x.k_cache.double(), x.v_cache.double(), x.block_table[b], L)
        worst = max(worst, (o_b[0] - o_ref[b]).abs().max().item())
    nan_rows = x.k_cache.isnan().any(-1).any(-1).sum().item()
    print(f"{name:7s} {case.Hq:3d} {case.Hkv:3d} {case.Sq:3d} {case.D:4d} {case.page_size:4d}  "
          f"{str(x.seq_lens.tolist()):34s} {x.k_cache.shape[0]:5d} {sum(n > 1 for n in users.values()):6d} "
          f"{nan_rows:8d} {worst:10.1e}")
    assert worst < 1e-10

# %% [markdown]
# ## 9. On a GPU
#
# What the course measured for step 09 on a GPU, if it is committed (`course/results/measured.json`,
# read by `facourse.results`):

# %%
from facourse import results

R09 = results.show("09", results.decode_table)   # None until a measurement of step 09 is committed
if R09:
    print("SDPA's own decode of the same K and V, stored contiguously (GB/s of K and V read):")
    for case in dict.fromkeys(r["config"] for r in results.bench(R09, R09["solution"])):
        rates = {r["ref_backend"]: r["gbps_ref"] for r in results.bench(R09, R09["solution"], case)}
        print(f"  {case:12s} " + "  ".join(f"{b}: {g:5.0f}" for b, g in rates.items()))

# %% [markdown]
# Read the last lines for section 2: on the two large batches cuDNN and FlashAttention-2 come close to
# the copy rate, but on one sequence of 128k tokens a backend whose grid does not split the keys reads far
# below it, with a quarter of the bytes of the 64-sequence batch: section 2's idle GPU, measured.
# That is why the graded reference is SDPA's *fastest* backend on each shape. The table shows the
# ladder: v1 and v2 (one query head per program, a row at a time) reach an eighth of the copy rate
# at most (v1 far less on one long sequence, which it does not split); GQA packing (v3, the exercise's solution) multiplies it; v4's tuning takes it to the copy rate.

# %% [markdown]
# And on a GPU, this cell checks section 1's prediction. It measures what this GPU's memory really
# delivers (a 1 GiB device-to-device copy, `facourse.decode.copy_rate_gbps`), then times PyTorch's own
# attention at $S_q = 1$ on contiguous caches of the three shapes, the $G$ query heads of each KV head
# passed as $G$ query rows of it (`facourse.decode.sdpa_decode`: section 5's packing, so $K$ and $V$ are
# read once), with the course's timer (L2 flushed, GPU events, median), and compares each time with the
# bytes of $K$ and $V$ over the datasheet bandwidth and over the measured copy rate.

# %%
if gpu_or_skip("timing decode against the bytes of the KV cache"):
    import statistics

    from facourse.bench import new_flush_buffer, time_calls
    from facourse.decode import copy_rate_gbps, sdpa_decode

    name = torch.cuda.get_device_name()
    sheet = next((g for key, g in GPUS.items() if key in name), None)   # datasheet bandwidth, if we know it
    copy = copy_rate_gbps() * 1e9                                     # bytes/s, reads + writes
    flush = new_flush_buffer()
    print(f"{name}: copy {copy / 1e12:.2f} TB/s" + (f" ({copy / (sheet['hbm_tbs'] * 1e12):.0%} of the datasheet's "
                                                     f"{sheet['hbm_tbs']} TB/s)" if sheet else ""))
    print(f"{'shape':8s} {'backend':16s} {'KV GB':>6s} {'ms':>7s} {'TB/s':>6s} {'of copy':>8s} "
          f"{'predicted ms (sheet, copy)':>27s}")
    for shape, lens in SHAPES.items():
        B, L = len(lens), lens[0]
        q = torch.randn(B, Hq_, 1, D_, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, Hkv_, L, D_, device="cuda", dtype=torch.float16) for _ in range(2))
        nbytes = kv_cache_bytes(lens, Hkv_, D_)
        for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
            fn = sdpa_decode(backend)
            try:
                gpu, _ = time_calls({"sdpa": lambda: fn(q, k, v)}, 20, flush)
            except RuntimeError as e:                                  # a backend that refuses this shape
                print(f"{shape:8s} {fn.backend:16s} not available here ({str(e).splitlines()[0][:60]})")
                continue
            t = statistics.median(gpu["sdpa"]) / 1e3                   # seconds
            pred = (f"{nbytes / (sheet['hbm_tbs'] * 1e12) * 1e3:.3f}" if sheet else "?") + f", {nbytes / copy * 1e3:.3f}"
            print(f"{shape:8s} {fn.backend:16s} {nbytes / 1e9:6.2f} {t * 1e3:7.3f} {nbytes / t / 1e12:6.2f} "
                  f"{nbytes / t / copy:8.0%} {pred:>27s}")
        del q, k, v

# %% [markdown]
# ## Summary
#
# - Decoding does $2 G S_q / e$ FLOP per byte of $K$ and $V$ ($G S_q$ in fp16): 1 for multi-head
#   attention, 4-8 for GQA, far left of the ridge (295 on an H100). Its time is the bytes of the KV
#   cache over the HBM bandwidth; its speed is measured in bytes per second.
# - One program per query tile gives $B H_q$ programs of one row at $S_q = 1$: too few for 132 SMs at
#   small batch and long context, and each KV head loaded $G$ times.
# - Split-KV (flash-decoding) adds a grid axis over chunks of keys; each program writes a partial
#   $(o_s, \text{lse}_s)$ and a second kernel merges them with lecture 03's merge (empty chunks weigh
#   0; a sequence with no key must give $o = 0$, $\text{lse} = -\infty$). Split only as much as fills
#   the GPU.
# - GQA packing puts the $G S_q$ query rows of a KV head into one tile: $K$ and $V$ are read once.
# - A paged KV cache stores tokens in fixed-size pages of a shared pool, found through a block table;
#   it wastes at most one partial page per sequence and lets sequences share prefix pages. Slots past
#   a sequence's end hold garbage: mask the values, not only the scores.
# - Several query tokens per sequence (speculative decoding) are the last $S_q$ tokens: bottom-right causal.
#
# **Next:** exercise 09 writes `paged_decode` in Triton: a split-KV kernel that reads pages through the
# block table, with GQA packing, and a merge kernel.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
