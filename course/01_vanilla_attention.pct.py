# %% [markdown]
# # 01 — Vanilla attention, and why it does not scale
#
# Scaled dot-product attention (Vaswani et al., 2017, §3.2.1) maps queries $Q\in\mathbb{R}^{N\times d}$,
# keys $K$ and values $V\in\mathbb{R}^{N_k\times d}$ to
#
# $$S = \tfrac{1}{\sqrt d}\,QK^\top \in \mathbb{R}^{N\times N_k},\qquad
#   P = \operatorname{softmax}_{\text{row}}(S),\qquad O = PV \in \mathbb{R}^{N\times d}.$$
#
# Row $i$ of $O$ is an average of the value vectors, weighted by how well query $i$ matches each key:
# $O_i = \sum_j P_{ij} V_j$ with $P_{ij} = e^{S_{ij}} / \sum_{j'} e^{S_{ij'}}$.
#
# **What you will learn**
# - the tensor contract every kernel of this course follows (batch, heads, GQA, bottom-right causal);
# - attention written directly in PyTorch, checked against the course's reference;
# - its memory: the $N\times N$ matrices $S$ and $P$, measured, growing as $N^2$;
# - its traffic: the six trips to HBM of the standard implementation (FlashAttention paper,
#   Dao et al. 2022, §2.2 and Algorithm 0), which FlashAttention removes.

# %%
import math

import matplotlib.pyplot as plt
import torch

from facourse import (check_entry_point, causal_mask, get_config, gpu_or_skip, make_inputs,
                      reference_attention)

torch.manual_seed(0)

# %% [markdown]
# ## 1. The contract
#
# Real models run many heads at once, in batches, so every function of the course takes
# `q: [B, Hq, Sq, D]` and `k, v: [B, Hkv, Skv, D]`:
#
# | symbol | meaning | in the five test configurations |
# |---|---|---|
# | `B` | batch | 1 to 8 |
# | `Hq` | query heads | 32 |
# | `Hkv` | key/value heads; `Hq % Hkv == 0` | 8 (grouped-query attention, a group of 4) |
# | `Sq`, `Skv` | query and key lengths | 128 to 2048; `Sq != Skv` in `asymmetric` |
# | `D` | head dimension | 128 |
#
# **Grouped-query attention** (GQA, Ainslie et al. 2023) lets `Hq // Hkv` query heads share one K/V
# head: query head `h` reads KV head `h // (Hq // Hkv)`. With `Hkv == 1` it is multi-query attention.
# The KV cache shrinks by the group factor; the arithmetic per query head is unchanged.
#
# ![GQA: query heads h read KV head h // group](../diagrams/gqa_heads.png)
#
# **Causal masking** lets query $i$ see only keys that are not in its future. When `Sq == Skv` that
# is the lower triangle $j \le i$. When `Sq != Skv` the course aligns the mask **bottom-right**, as
# FlashAttention ≥ 2.1 and FlashInfer do: key $j$ is visible to query $i$ iff $j \le i + (S_{kv} - S_q)$.
# Think of a chunk of `Sq` new tokens appended to a cache of `Skv - Sq` earlier ones: the last new
# token sees everything. PyTorch's `is_causal=True` aligns **top-left** ($j \le i$), which for that
# chunk would hide almost the whole cache from it.

# %%
def show(mask):
    return "\n".join("".join("█" if x else "·" for x in row) for row in mask.tolist())

print("Sq=4, Skv=10, bottom-right (the course's rule):")
print(show(causal_mask(4, 10)))
print("\nSq=4, Skv=10, top-left (PyTorch's is_causal): the pitfall")
print(show(causal_mask(4, 10, align="top_left")))
print("\nSq=6, Skv=3, bottom-right: the first 3 rows see no key; their output is 0, not NaN")
print(show(causal_mask(6, 3)))

# %% [markdown]
# ## 2. Attention in a few lines of PyTorch
#
# The plainest version, for one head group with `Hq == Hkv` and no mask. It materialises $S$ and $P$
# in full. (Exercise 01 asks you for the whole contract: GQA, the bottom-right mask, empty rows,
# float16 inputs.)

# %%
def attention_one_group(q, k, v):
    """q: [B, H, N, D], k and v: [B, H, Nk, D], no mask."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    S = (q @ k.transpose(-1, -2)) * scale     # S = Q K^T / sqrt(d)      [B, H, N, Nk]
    P = torch.softmax(S, dim=-1)              # P = softmax(S), row-wise [B, H, N, Nk]
    return P @ v                              # O = P V                  [B, H, N, D]

cfg = get_config("mqa").__class__("demo", 2, 4, 4, 96, 160, 64, False)  # B=2, H=4, 96 x 160, D=64
q, k, v = make_inputs(cfg, seed=1)
o = attention_one_group(q, k, v)
o_ref, lse_ref = reference_attention(q, k, v)
print("max |o - reference| =", float((o.double() - o_ref).abs().max()))

# %% [markdown]
# The course checks every implementation with one function, `check_entry_point`: it draws inputs for a
# named configuration (as non-contiguous views, with new allocations filled with NaN so an unwritten
# element shows), calls the function, and compares with a float64 reference under the rule of
# the course (its correctness rule): no worse than twice PyTorch's own rounding in the same dtype, plus $10^{-3}$, and under
# 1 % relative (in fp16; bf16, with three significand bits fewer, is allowed 8 times that). A failure
# names the configuration, the wrong rows and heads, and a likely cause.

# %%
def attention_mha(q, k, v, causal=False, scale=None):
    assert q.shape[1] == k.shape[1] and not causal, "this demo handles Hq == Hkv, non-causal only"
    return attention_one_group(q, k, v)

check_entry_point(attention_mha, cfg)
try:
    check_entry_point(attention_mha, "small")     # small is causal with GQA: the demo refuses
except AssertionError as err:
    print("as expected:", err)

# %% [markdown]
# ## 3. Memory: $S$ and $P$ are $N \times N$
#
# For each (batch, head) the scores $S$ and probabilities $P$ hold $S_q \cdot S_{kv}$ numbers each,
# while $Q, K, V, O$ hold only $S \cdot d$. We **measure** what the implementation above allocates:
# a `TorchDispatchMode` sees every tensor each PyTorch operator returns, so we can add up the bytes
# of the intermediates without guessing.

# %%
from torch.utils._python_dispatch import TorchDispatchMode


class AllocationLog(TorchDispatchMode):
    """Records (operator, bytes) for every new buffer an operator returns (views are not counted)."""
    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.log.append((func.__name__, t.untyped_storage().nbytes()))
        return out


B, H, D = 1, 8, 64
sizes = [128, 256, 512, 1024, 2048]
measured, io_bytes = [], []
for N in sizes:
    x = torch.randn(B, H, N, D)
    with AllocationLog() as alog:
        attention_one_group(x, x, x)
    measured.append(sum(b for _, b in alog.log))
    io_bytes.append(4 * B * H * N * D * 4)          # Q, K, V, O in fp32
    if N == 512:
        for name, b in alog.log:
            print(f"  {name:<28s} {b / 2**20:8.2f} MiB")

for N, m, io in zip(sizes, measured, io_bytes):
    print(f"N={N:5d}: intermediates {m / 2**20:8.1f} MiB, "
          f"that is {m / (B * H * N * N * 4):.2f} x (B*H*N^2 fp32 numbers); Q,K,V,O {io / 2**20:6.1f} MiB")

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.loglog(sizes, [m / 2**20 for m in measured], "o-", label="measured: intermediates of vanilla attention")
ax.loglog(sizes, [b / 2**20 for b in io_bytes], "s--", label="Q, K, V, O (what must be stored)")
ax.set_xlabel("sequence length N"); ax.set_ylabel("MiB (B=1, H=8, d=64, fp32)")
ax.set_xscale("log", base=2); ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
ax.set_title("Memory grows as N² for the scores, N for the inputs")
plt.show()
slope = math.log(measured[-1] / measured[-2]) / math.log(sizes[-1] / sizes[-2])
print(f"log-log slope of the measured intermediates between N=1024 and 2048: {slope:.2f}")

# %% [markdown]
# Three $N\times N$ buffers per head: $QK^\top$, its scaled copy, and $P$ (the ratio above tends to 3
# as $N$ grows; the rest is $O$). The slope of 2 on the log-log plot is the $N^2$.
#
# At the `large` configuration (B=8, Hq=32, N=2048) in fp16, **one** of $S$ or $P$ is
# $8\cdot32\cdot2048^2\cdot2$ bytes = 2 GiB, against 128 MiB for $Q$. At 128k tokens of context a
# single head's $S$ would be 32 GiB. The memory is one problem; the time spent moving it is the other.
#
# ## 4. Six trips to HBM
#
# On a GPU the tensors live in HBM (high-bandwidth memory, 3.35 TB/s on an H100 SXM) and the
# arithmetic happens on chip. The standard implementation (Algorithm 0 of the FlashAttention paper)
# runs three kernels, each reading its inputs from HBM and writing its output back:
#
# ![the six HBM trips of vanilla attention](../diagrams/hbm_trips_vanilla.png)
#
# | kernel | reads from HBM | writes to HBM |
# |---|---|---|
# | $S = QK^\top$ | 1. $Q$, $K$ ($2Nd$) | 2. $S$ ($N^2$) |
# | $P = \operatorname{softmax}(S)$ | 3. $S$ ($N^2$) | 4. $P$ ($N^2$) |
# | $O = PV$ | 5. $P$, $V$ ($N^2 + Nd$) | 6. $O$ ($Nd$) |
#
# Four of the six trips move $N^2$ numbers. A fused kernel that keeps $S$ and $P$ on chip moves
# only $Q, K, V, O$: $4Nd$ numbers.

# %%
def hbm_bytes_vanilla(B, H, N, d, bytes_per=2):
    nd, nn = B * H * N * d, B * H * N * N
    return bytes_per * (2 * nd + nn + nn + nn + nn + nd + nd)

def hbm_bytes_fused(B, H, N, d, bytes_per=2):
    return bytes_per * 4 * B * H * N * d

print(f"{'N':>6} {'vanilla GiB':>12} {'fused GiB':>10} {'ratio':>7}   time at 3.35 TB/s (vanilla / fused)")
for N in [512, 1024, 2048, 4096, 8192, 16384]:
    v_, f_ = hbm_bytes_vanilla(8, 32, N, 128), hbm_bytes_fused(8, 32, N, 128)
    print(f"{N:6d} {v_ / 2**30:12.2f} {f_ / 2**30:10.3f} {v_ / f_:7.1f}   "
          f"{v_ / 3.35e12 * 1e3:8.2f} ms / {f_ / 3.35e12 * 1e3:.3f} ms")

# %% [markdown]
# The ratio is $1 + N/d$ roughly: at $N = 2048$, $d = 128$ vanilla attention moves about 17 times
# the bytes it needs to. The arithmetic, $4N^2d$ flops per head, is the same in both. This is why
# attention is **memory-bound** when written plainly and can become **compute-bound** when fused —
# the roofline of lecture 00 makes that precise.
#
# ## 5. On a GPU: the same contrast, timed
#
# The next cell times the plain implementation against PyTorch's fused FlashAttention-2 backend
# on a GPU. On a CPU it says so and does nothing.

# %%
if gpu_or_skip("timing vanilla attention against SDPA's FlashAttention backend"):
    from facourse import bench_attention

    def vanilla_gqa(q, k, v, causal=False, scale=None):
        g = q.shape[1] // k.shape[1]
        k2, v2 = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = (q @ k2.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
        return (torch.softmax(s, -1).to(q.dtype) @ v2)

    print(bench_attention(vanilla_gqa, "large", rounds=20).summary())

# %% [markdown]
# ## Summary
#
# - Attention is $O = \operatorname{softmax}(QK^\top/\sqrt d)\,V$, per head, with GQA sharing K/V
#   heads and a bottom-right causal mask.
# - Written plainly it stores two $N\times N$ matrices: memory grows as $N^2$ (measured above).
# - It moves $S$ and $P$ through HBM four times; a fused kernel moves only $Q, K, V, O$.
# - The obstacle to fusing is the softmax: its denominator needs a whole row of $S$ before any
#   output can be written. Lectures 02 and 03 remove that obstacle; 04 tiles the whole computation.
#
# **Next:** exercise `exercises/01_vanilla_attention`, then lecture 02 (safe softmax).
