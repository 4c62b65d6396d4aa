# %% [markdown]
# # 10 — Attention variants: mask functions, score modifiers, block masks, FP8
#
# Every attention of lectures 01-09 computed the same thing with one switch, `causal`. Models use many
# more: windows, positional biases, capped logits, packed documents, bidirectional prefixes. All of
# them fit one formula. For batch $b$, query head $h$, query $i$ and key $j$, with $s_{ij} = \text{scale}
# \cdot q_i \cdot k_j$:
#
# $$\tilde s_{ij} = \begin{cases} \text{score\_mod}(s_{ij}, b, h, i, j) & \text{if } \text{mask}(b, h, i, j)\\
#   -\infty & \text{otherwise}\end{cases}, \qquad
#   o_i = \sum_j \frac{e^{\tilde s_{ij}}}{\sum_{j'} e^{\tilde s_{ij'}}}\, v_j, \qquad
#   \text{lse}_i = \log \sum_j e^{\tilde s_{ij}}.$$
#
# A **mask function** says which (query, key) pairs are visible; a **score modifier** changes a visible
# logit. The kernel stays FlashAttention-2's loop (lecture 04): the two functions are called inside it, on
# each tile of $S$. And because the mask is known before any data is read, the kernel can classify every
# (query tile, key tile) in advance and skip the tiles with nothing visible, as lecture 04 skipped the
# tiles above the causal diagonal.
#
# **What you will learn**
# - mask functions and score modifiers, written once and evaluated on whole index grids;
# - the variants: sliding window, ALiBi, logit soft-capping, documents packed in one row, prefix-LM, and
#   their combinations; each one's formula, picture, reference and FLOPs counted on visible pairs;
# - **block masks**: every tile full (no element mask), partial (element mask) or empty (skipped); how
#   FlexAttention stores them; what tile size costs; why the order "score modifier, then mask" matters;
# - a tiled loop that visits only the listed tiles and matches the dense reference;
# - **FP8** on Hopper: the e4m3 and e5m2 formats, per-tensor and per-block scales, which of $Q$, $K$,
#   $V$ and $P$ the error comes from, and FlashAttention-3's incoherent processing, measured.
#
# **Sources followed.** The mask-function / score-modifier split and the block mask are PyTorch's
# FlexAttention: Horace He, Driss Guessous, Yanbo Liang, Joy Dong, *FlexAttention: The Flexibility of
# PyTorch with the Performance of FlashAttention* (PyTorch blog, August 2024) and the documentation of
# `torch.nn.attention.flex_attention` (`mask_mod`, `score_mod`, `create_block_mask`, `BlockMask`).
# Sliding window: Jiang et al., *Mistral 7B* (2023), §2. ALiBi: Press, Smith, Lewis, *Train Short, Test
# Long: Attention with Linear Biases Enables Input Length Extrapolation* (ICLR 2022), §3 and the
# authors' reference code. Soft-capping: Gemma Team, *Gemma 2: Improving Open Language Models at a
# Practical Size* (2024), §2. Prefix-LM: Raffel et al., *Exploring the Limits of Transfer Learning with
# a Unified Text-to-Text Transformer* (T5, JMLR 2020), §3.2. FP8: Micikevicius et al., *FP8 Formats for
# Deep Learning* (2022); Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, *FlashAttention-3* (2024), §3.3
# and §4.3; NVIDIA H100 Tensor Core GPU datasheet.
#
# Exercise 10 will ask for `flex_attention_triton(q, k, v, mask=..., score_mod=..., scale=None) -> (o, lse)`
# as a Triton kernel with a block mask. The PyTorch code here works on whole tensors, or one head at a
# time in Python loops, to show the ideas; it is not that kernel.

# %%
import math
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from facourse import gpu_or_skip, reference_attention

torch.manual_seed(0)
torch.set_num_threads(1)   # every tensor here is small: one thread is faster, and steady on a busy machine
CPU_START = time.perf_counter()

ROOT = Path.cwd().parent if Path.cwd().name == "course" else Path.cwd()
sys.path.insert(0, str(ROOT / "diagrams"))
import variants_figures as vf  # noqa: E402  (the figures' own numbers, checked below)
# (it selects matplotlib's file backend for drawing; the magic below restores inline plots)

# %matplotlib inline

# %% [markdown]
# ## 1. Two functions instead of one switch
#
# A mask function takes the indices of a pair, `mask(b, h, i, j) -> bool`; a score modifier takes the
# logit and the same indices, `score_mod(s, b, h, i, j) -> s'`. We write them with tensor operations
# only (`&`, `|`, `torch.where`, indexing, never a Python `if` on a value), and call them once on whole
# index grids that broadcast against $S$ of shape `[B, Hq, Sq, Skv]`: `b` is `[B, 1, 1, 1]`, `h` is
# `[1, Hq, 1, 1]`, `i` is `[1, 1, Sq, 1]`, `j` is `[1, 1, 1, Skv]`. The same function can then be
# called on a tile's indices inside a loop, traced into a kernel (FlexAttention does that with
# `torch.compile`), or written as Triton code on a tile's `tl.arange` indices.
#
# The dense reference applies the score modifier first and the mask last (section 5 shows why that
# order), in float64, with the course's contract: query head $h$ reads KV head $h \,//\, (H_q/H_{kv})$,
# a row that sees no key gives $o = 0$ and $\text{lse} = -\infty$.

# %%
def index_grids(B, Hq, Sq, Skv):
    """b, h, i, j as tensors that broadcast to [B, Hq, Sq, Skv]."""
    return (torch.arange(B).view(B, 1, 1, 1), torch.arange(Hq).view(1, Hq, 1, 1),
            torch.arange(Sq).view(1, 1, Sq, 1), torch.arange(Skv).view(1, 1, 1, Skv))


def dense_attention(q, k, v, mask_mod=None, score_mod=None, scale=None):
    """Reference of every variant, in float64: S = scale·QKᵀ, S = score_mod(S, b, h, i, j), S = -inf where
    not mask_mod(b, h, i, j), O = softmax(S) V. q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D]. Returns (o, lse)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    k, v = (t.double().repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))   # head h reads KV head h // G
    s = scale * q.double() @ k.transpose(-1, -2)                               # S = scale · Q Kᵀ
    b, h, i, j = index_grids(B, Hq, Sq, Skv)
    if score_mod is not None:
        s = score_mod(s, b, h, i, j)                                           # first the score modifier
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, i, j), -math.inf)                    # then the mask
    lse = torch.logsumexp(s, dim=-1)                                           # -inf on a row with no key
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)                          # P = softmax(S); such a row: 0
    return p @ v, lse.float()


def causal(Sq, Skv):
    """The course's causal rule, bottom-right: key j is visible to query i iff j <= i + (Skv - Sq)."""
    off = Skv - Sq
    return lambda b, h, i, j: j <= i + off


# %% [markdown]
# First, the new reference reproduces the old one: `causal` as a mask function against
# `facourse.reference_attention(causal=True)`, with GQA, $S_q \ne S_{kv}$, and $S_q > S_{kv}$ (rows
# that see no key).

# %%
gen = torch.Generator().manual_seed(0)


def rand_qkv(B, Hq, Hkv, Sq, Skv, D, dtype=torch.float64):
    q = torch.randn(B, Hq, Sq, D, generator=gen, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Skv, D, generator=gen, dtype=dtype) for _ in range(2))
    return q, k, v


for Sq, Skv in ((96, 160), (160, 96)):
    q, k, v = rand_qkv(2, 4, 2, Sq, Skv, 32)
    o, lse = dense_attention(q, k, v, mask_mod=causal(Sq, Skv))
    o_ref, lse_ref = reference_attention(q, k, v, causal=True)
    empty = int((lse == -math.inf).sum())
    print(f"Sq = {Sq:3d}, Skv = {Skv:3d}: max |o - ref| {(o - o_ref).abs().max():.1e}, rows with no key {empty}")
    assert torch.allclose(o, o_ref, atol=1e-12) and torch.equal(lse == -math.inf, lse_ref == -math.inf)

# %% [markdown]
# ## 2. The variants
#
# ![five masks on 48 x 48 pairs in 8 x 8 tiles: each tile full, partial or empty](../diagrams/block_masks.png)
#
# ### Sliding window (Mistral 7B)
#
# Each query sees its own position and the $W - 1$ keys before it. Aligned bottom-right like the course's
# causal rule, with $\delta = S_{kv} - S_q$:
#
# $$\text{mask}(i, j) = \big(i + \delta - W < j \le i + \delta\big).$$
#
# Mistral 7B uses $W = 4096$ (§2). A layer sees $W$ tokens back, but the next layer's query reads outputs
# that each saw $W$ further: after $k$ layers information can travel $k \cdot W$ positions, which the
# paper puts at about 131k tokens for its 32 layers. Gemma 2 (§2 of its report) alternates layers with
# a 4096-token window and global layers. The work per row is at most $W$ keys instead of $S_{kv}$: linear
# in the sequence length.
#
# ### ALiBi
#
# No position embedding; instead a bias proportional to the distance, with a different slope per head:
#
# $$\text{score\_mod}(s, h, i, j) = s - m_h\,(i + \delta - j), \qquad m_h = 2^{-8h/H}\ \ (h = 1, \dots, H).$$
#
# For $H = 8$ the slopes are $1/2, 1/4, \dots, 1/256$: some heads look far back, some only nearby. For a
# head count that is no power of two, the authors' code takes the slopes of the power of two below
# $H$, then every other slope of the power of two above, until there are $H$ (for $H = 12$: the 8
# slopes $2^{-1}, \dots, 2^{-8}$ of $H = 8$, then $2^{-1/2}, 2^{-3/2}, 2^{-5/2}, 2^{-7/2}$, the odd ones of
# $H = 16$'s $2^{-h/2}$). In code, heads count from 0: head $h$ takes $m_{h+1}$. ALiBi is defined with a
# causal mask; here it is always combined with one.
#
# ### Logit soft-capping (Gemma 2)
#
# $$\text{score\_mod}(s) = c \tanh(s / c).$$
#
# Almost the identity for $|s| \ll c$, never beyond $\pm c$: no logit can take over a row, which
# Gemma 2 uses for training stability, with $c = 50$ in its attention layers (and 30 on the final
# logits; §2 of the report). FlashAttention added a `softcap` argument for it in version 2.6 (its
# README). Applied to the logits before the mask (section 5).
#
# ![ALiBi's biases against distance for 8 and 12 heads; the soft-cap curve](../diagrams/score_mods.png)
#
# ### Documents packed in one row
#
# Training packs several documents into one row of $S$ tokens, to avoid padding. A token must attend
# within its own document only (usually causally): with `doc[b, t]` the document of token $t$ in row $b$,
#
# $$\text{mask}(b, i, j) = \big(\text{doc}[b, i] = \text{doc}[b, j]\big) \wedge (j \le i).$$
#
# The mask depends on the data: it changes with every batch. (FlashAttention-2's "varlen" interface
# solves the same problem differently: one row per document, with cumulative lengths `cu_seqlens`.)
#
# ### Prefix-LM
#
# The first $P_b$ tokens of row $b$ (an instruction, a prompt, an image's patches) see each other in both
# directions; the tokens after them are generated causally (T5 §3.2's "prefix LM"):
#
# $$\text{mask}(b, i, j) = (j \le i) \vee (j < P_b).$$
#
# The prefix length depends on the row: that is what the mask's `b` argument is for.

# %%
def sliding_window(W, Sq, Skv):
    off = Skv - Sq
    return lambda b, h, i, j: (j <= i + off) & (j > i + off - W)


def alibi_slopes(H):
    """m_h = 2^(-8h/H) for a power-of-two H; else the slopes of the power of two below H, then every
    other slope of the power of two above, up to H slopes."""
    def pow2(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    n = 1 << (H.bit_length() - 1)                      # the largest power of two <= H
    return pow2(n) if n == H else pow2(n) + pow2(2 * n)[0::2][:H - n]


def alibi(H, Sq, Skv):
    slopes, off = torch.tensor(alibi_slopes(H), dtype=torch.float64), Skv - Sq
    return lambda s, b, h, i, j: s - slopes[h] * (i + off - j)


def softcap(cap):
    return lambda s, b, h, i, j: cap * torch.tanh(s / cap)


def documents(doc_ids):
    """doc_ids [B, S]: the document of every token of every row; causal within a document."""
    return lambda b, h, i, j: (doc_ids[b, i] == doc_ids[b, j]) & (j <= i)


def prefix_lm(prefix_lens):
    """prefix_lens [B]: row b's first prefix_lens[b] tokens see each other; causal after."""
    return lambda b, h, i, j: (j <= i) | (j < prefix_lens[b])


def and_masks(*masks):
    def mask(b, h, i, j):
        out = masks[0](b, h, i, j)
        for m in masks[1:]:
            out = out & m(b, h, i, j)
        return out
    return mask


def chain(*mods):
    """Score modifiers applied one after the other, in the order given."""
    def score_mod(s, b, h, i, j):
        for mod in mods:
            s = mod(s, b, h, i, j)
        return s
    return score_mod


print("ALiBi slopes, H = 8 :", [f"1/{1 / m:g}" for m in alibi_slopes(8)])
print("ALiBi slopes, H = 12:", [f"{m:.4g}" for m in alibi_slopes(12)])
assert alibi_slopes(12) == vf.alibi_slopes(12) and alibi_slopes(8) == vf.alibi_slopes(8)   # the figure's

# %% [markdown]
# The same masks as the figure, on its 48 tokens: the counts under each panel come from the mask
# (the tile classes are section 3's).

# %%
N = vf.N
doc_ids = torch.repeat_interleave(torch.arange(len(vf.DOC_LENS)), torch.tensor(vf.DOC_LENS))[None]   # [1, 48]
FIGURE_MASKS = {"causal": causal(N, N), "sliding window": sliding_window(vf.WINDOW, N, N),
                "documents": documents(doc_ids), "prefix-LM": prefix_lm(torch.tensor([vf.PREFIX])),
                "window and documents": and_masks(sliding_window(vf.WINDOW, N, N), documents(doc_ids))}
for (name, mask), drawn in zip(FIGURE_MASKS.items(), vf.figure_masks().values()):
    m = mask(*index_grids(1, 1, N, N))[0, 0]
    assert torch.equal(m, torch.from_numpy(drawn)), name
    print(f"{name:22s} visible pairs {int(m.sum()):5d} of {N * N} ({m.float().mean():.0%})")

# %% [markdown]
# **Checked against PyTorch's own FlexAttention.** `torch.nn.attention.flex_attention` takes the same two
# functions (it calls them on scalar indices, through `vmap`). Without `torch.compile` it runs an
# unfused version that materialises $S$, on the CPU too; it is a second, independent implementation
# of the formula. It has no notion of bottom-right alignment: that lives in our functions. Every
# variant, in float32, $S_q = 100$ queries against $S_{kv} = 130$ keys (documents and prefix-LM are
# self-attention, 130 against 130), GQA with 4 query heads on 2 KV heads:

# %%
try:
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:            # PyTorch before 2.5
    flex_attention = None
    print("This PyTorch has no torch.nn.attention.flex_attention: the cross-check is skipped.")

B, HQ, HKV, D = 2, 4, 2, 32
Sq, Skv = 100, 130
docs = torch.stack([torch.repeat_interleave(torch.arange(4), torch.tensor(lens))
                    for lens in ([40, 25, 50, 15], [10, 70, 30, 20])])          # [2, 130]
prefix = torch.tensor([30, 77])
VARIANTS = {   # name: (Sq, mask_mod, score_mod)
    "causal": (Sq, causal(Sq, Skv), None),
    "sliding window W=32": (Sq, sliding_window(32, Sq, Skv), None),
    "ALiBi + causal": (Sq, causal(Sq, Skv), alibi(HQ, Sq, Skv)),
    "softcap 5 + causal": (Sq, causal(Sq, Skv), softcap(5.0)),
    "documents": (Skv, documents(docs), None),
    "prefix-LM": (Skv, prefix_lm(prefix), None),
    "window + causal + softcap": (Sq, sliding_window(32, Sq, Skv), softcap(5.0)),
    "documents + ALiBi": (Skv, documents(docs), alibi(HQ, Skv, Skv)),
}
if flex_attention is not None:
    for name, (sq, mask_mod, score_mod) in VARIANTS.items():
        q, k, v = rand_qkv(B, HQ, HKV, sq, Skv, D, dtype=torch.float32)
        o_ref, _ = dense_attention(q, k, v, mask_mod, score_mod)
        bm = create_block_mask(mask_mod, B, HQ, sq, Skv, device="cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                       # "called without torch.compile()"
            o_flex = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
        err = (o_flex.double() - o_ref).abs().max().item()
        print(f"{name:26s} max |flex - ours| {err:.1e}")
        assert err < 1e-5, name

# %% [markdown]
# (A soft cap of 5 is far below Gemma 2's 50, to make the cap act on these small random logits.)
#
# ## 3. Block masks: tile skipping, generalised
#
# Lecture 04 classified the tiles of a causal attention by looking at two corners. For any mask, the
# rule is the same with the whole tile: a (query tile, key tile) is
#
# - **full** when every pair in it is visible: compute it, no element mask;
# - **partial** when some are: compute it and apply the element mask;
# - **empty** when none is: skip it, never load its $K_j$ and $V_j$.
#
# A general mask has no corners to look at, so the classes are computed by evaluating the mask on every
# pair once, before the kernel runs. That is what `create_block_mask` does; it costs one pass over
# $S_q \times S_{kv}$ booleans, shared by every layer that uses the same mask (and by every head when
# the mask ignores $h$, which is why FlexAttention lets you pass `None` for B or H). A tile that reaches
# past the end of the sequence is at most partial: its missing keys must be masked anyway.
#
# The kernel does not want a grid of classes; it wants, for each query tile, the key tiles to visit.
# FlexAttention's `BlockMask` stores two such lists, like a sparse matrix stores its rows: for each
# query tile the number of partial key tiles and their indices (`kv_num_blocks`, `kv_indices`), and the
# same for the full ones (`full_kv_num_blocks`, `full_kv_indices`). The kernel runs one loop over each
# list, with the element mask in the first only. Our version:

# %%
def block_classes(mask_mod, B, H, Sq, Skv, Br, Bc):
    """Class of every (query tile, key tile): 0 empty, 1 partial, 2 full; [B, H, Tq, Tk]."""
    Tq, Tk = math.ceil(Sq / Br), math.ceil(Skv / Bc)
    b, h, i, j = index_grids(B, H, Tq * Br, Tk * Bc)
    inside = (i < Sq) & (j < Skv)                             # padding of the last tiles: never visible
    m = mask_mod(b, h, i.clamp(max=Sq - 1), j.clamp(max=Skv - 1)) & inside
    return classes_of(m.expand(B, H, Tq * Br, Tk * Bc), Br, Bc)


def classes_of(m, Br, Bc):
    """The same from the mask's values [..., Tq·Br, Tk·Bc]: full if all are visible, empty if none."""
    m = m.reshape(*m.shape[:-2], m.shape[-2] // Br, Br, m.shape[-1] // Bc, Bc)
    visible_any, visible_all = m.any(-1).any(-2), m.all(-1).all(-2)
    return torch.where(visible_all, 2, torch.where(visible_any, 1, 0))


def tile_lists(classes):
    """For each query tile: (number, indices) of its partial key tiles, and of its full ones, indices in
    increasing order first in each row (FlexAttention's kv_num_blocks / kv_indices and full_*)."""
    out = {}
    for name, c in (("partial", 1), ("full", 2)):
        is_c = classes == c
        order = torch.argsort((~is_c).int(), dim=-1, stable=True)   # the tiles of class c first, in order
        out[name] = (is_c.sum(-1), order)
    return out


cls = block_classes(FIGURE_MASKS["sliding window"], 1, 1, N, N, vf.TILE, vf.TILE)
assert torch.equal(cls[0, 0], torch.from_numpy(vf.tile_classes(vf.figure_masks()["sliding window, W = 12"], vf.TILE)))
lists = tile_lists(cls)
print("tile classes of the sliding window (0 empty, 1 partial, 2 full):\n", cls[0, 0])
for t in range(cls.shape[2]):
    n_p, n_f = lists["partial"][0][0, 0, t].item(), lists["full"][0][0, 0, t].item()
    print(f"query tile {t}: partial key tiles {lists['partial'][1][0, 0, t, :n_p].tolist()}, "
          f"full key tiles {lists['full'][1][0, 0, t, :n_f].tolist()}")

# %% [markdown]
# No tile of this window is full: with $W = 12$ and tiles of 8, every band tile cuts the window's edge.
# With real sizes it is the other way round: most tiles of a 4096-wide band are full (section 4).
# Our counts agree with `create_block_mask`'s on every variant of section 2, with tiles of 64 (its
# default is 128):

# %%
if flex_attention is not None:
    for name, (sq, mask_mod, _) in VARIANTS.items():
        ours = block_classes(mask_mod, B, HQ, sq, Skv, 64, 64)
        bm = create_block_mask(mask_mod, B, HQ, sq, Skv, device="cpu", BLOCK_SIZE=64)
        same = (torch.equal((ours == 1).sum(-1), bm.kv_num_blocks.long())
                and torch.equal((ours == 2).sum(-1), bm.full_kv_num_blocks.long()))
        print(f"{name:26s} partial {int((ours == 1).sum()):3d}, full {int((ours == 2).sum()):3d}, "
              f"empty {int((ours == 0).sum()):3d} tiles over the {B}x{HQ} heads: same as create_block_mask: {same}")
        assert same, name

# %% [markdown]
# ## 4. FLOPs: visible pairs, and what the tiles cost
#
# Attention's useful work is $4D$ FLOPs per visible pair ($2D$ for $q \cdot k$, $2D$ for $p\,v$); the
# course reports TFLOP/s counted that way (`facourse.bench`: $4 \cdot B \cdot H_q \cdot D \cdot$ visible
# pairs). A tiled kernel computes more: every pair of every full or partial tile, visible or not. The
# ratio of the two is the price of working in tiles, and partial tiles also pay for the element mask.
# Counted at 4096 × 4096 with tiles of 128 (the window is scaled down with the sequence: 1024 of 4096
# is Mistral's 4096 of 16k):

# %%
def count(m, tile):
    """For the values m [S, S] of a mask (S a multiple of tile): visible pairs, the fractions of empty /
    partial / full tiles, and computed pairs / visible pairs."""
    visible = int(m.sum())
    c = classes_of(m, tile, tile)
    frac = [(c == k).float().mean().item() for k in (0, 1, 2)]
    computed = int((c > 0).sum()) * tile * tile
    return visible, frac, computed / visible


S4 = 4096
g4 = torch.Generator().manual_seed(4)
cuts = torch.sort(torch.randperm(S4 - 1, generator=g4)[:7] + 1).values          # 8 documents of random lengths
doc_lens4 = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([S4])]))
docs4 = torch.repeat_interleave(torch.arange(8), doc_lens4)[None]
COUNTED = {"full (no mask)": lambda b, h, i, j: torch.ones_like(i * j, dtype=torch.bool),
           "causal": causal(S4, S4),
           "sliding window W=1024": sliding_window(1024, S4, S4),
           "documents (8, causal)": documents(docs4),
           "prefix-LM, prefix 1024": prefix_lm(torch.tensor([1024])),
           "window and documents": and_masks(sliding_window(1024, S4, S4), documents(docs4))}
VALUES = {name: mask(*index_grids(1, 1, S4, S4))[0, 0].expand(S4, S4)          # each mask evaluated once
          for name, mask in COUNTED.items()}
print("document lengths:", doc_lens4.tolist())
print(f"{'mask':24s} {'visible':>8s} {'empty':>6s} {'partial':>8s} {'full':>6s} {'computed/visible':>17s}")
for name, m in VALUES.items():
    vis, (e, p, f), over = count(m, 128)
    print(f"{name:24s} {vis / S4 ** 2:8.1%} {e:6.1%} {p:8.1%} {f:6.1%} {over:17.3f}")

# %% [markdown]
# The FLOPs follow the visible fraction: the window does about a fifth of the non-causal work at this
# length, and its share keeps falling as the sequence grows (about $W / S$), while a causal attention
# stays near half. The tiles cost more than the visible pairs (the last column), all of it in the partial
# tiles: a few percent for causal and prefix-LM, more for the window, most for the documents, whose
# boundaries make many partial tiles. Smaller tiles waste less, but a tile is what a tensor-core
# instruction and a load work on; the kernel's tile size is chosen for speed (lectures 05-07), and the
# waste follows:

# %%
print(f"{'tile':>5s} " + " ".join(f"{name:>24s}" for name in list(COUNTED)[1:]))
for tile in (32, 64, 128, 256):
    print(f"{tile:5d} " + " ".join(f"{count(m, tile)[2]:24.3f}" for m in list(VALUES.values())[1:]))

# %% [markdown]
# ## 5. Order: the score modifier, then the mask
#
# FlexAttention (and our reference) applies `score_mod` to the logit first and the mask last. The other
# order breaks as soon as a score modifier does not keep $-\infty$ where it is: $\tanh(-\infty) = -1$,
# so a soft cap applied after the mask turns every masked logit into $-c$, and the masked keys come
# back with a weight $e^{-c}$ each. With $c = 50$ that weight is $e^{-50} \approx 2 \cdot 10^{-22}$ per key,
# invisible on a row that sees anything. On a row that sees **nothing** it is everything: all the logits
# equal $-c$, the row becomes the average of all values, and lse is finite, where the contract says
# $o = 0$, $\text{lse} = -\infty$. Shown with the causal mask for 160 queries against 96 keys (the first
# 64 rows see no key):

# %%
q, k, v = rand_qkv(1, 2, 2, 160, 96, 32)
mask160 = causal(160, 96)
cap = softcap(50.0)
o_right, lse_right = dense_attention(q, k, v, mask160, cap)
# the wrong order: mask first (as a score modifier writing -inf), then the cap
mask_then_cap = chain(lambda s, b, h, i, j: s.masked_fill(~mask160(b, h, i, j), -math.inf), cap)
o_wrong, lse_wrong = dense_attention(q, k, v, None, mask_then_cap)
rows_seen = slice(64, None)
print("rows that see keys: max |o_wrong - o_right| =", f"{(o_wrong - o_right)[..., rows_seen, :].abs().max():.1e}")
print("rows that see no key: o_right", o_right[0, 0, 0, :3].tolist(), "lse", lse_right[0, 0, 0].item())
print("                      o_wrong", [round(x, 3) for x in o_wrong[0, 0, 0, :3].tolist()], "lse",
      round(lse_wrong[0, 0, 0].item(), 2), "= -50 + log(96):", round(-50 + math.log(96), 2))

# %% [markdown]
# Two more consequences of the split between the two functions:
#
# - **Order among score modifiers is part of the model.** $c\tanh((s + \text{bias})/c)$ and
#   $c\tanh(s/c) + \text{bias}$ are different functions; a kernel must apply them in the order the model
#   was trained with. Below, ALiBi then the cap against the cap then ALiBi (with a small cap, so that the
#   difference shows).
# - **A mask written as a score modifier computes the same numbers and skips nothing.** A `score_mod`
#   that returns $-\infty$ outside a window gives the same output, but the block mask is built from the
#   mask function only: with no mask function every tile is computed. Masks go in `mask_mod`.

# %%
q, k, v = rand_qkv(1, 4, 4, 128, 128, 32)
m128 = causal(128, 128)
o_ac, _ = dense_attention(q, k, v, m128, chain(alibi(4, 128, 128), softcap(2.0)))
o_ca, _ = dense_attention(q, k, v, m128, chain(softcap(2.0), alibi(4, 128, 128)))
print(f"ALiBi then cap vs cap then ALiBi: max |diff| {(o_ac - o_ca).abs().max():.2f} (outputs of size "
      f"{o_ca.abs().max():.2f})")

w_mask = sliding_window(32, 128, 128)
as_score = lambda s, b, h, i, j: s.masked_fill(~w_mask(b, h, i, j), -math.inf)
o_mask, _ = dense_attention(q, k, v, w_mask, None)
o_score, _ = dense_attention(q, k, v, None, as_score)
print(f"window as mask_mod vs as score_mod: max |diff| {(o_mask - o_score).abs().max():.1e}; tiles computed "
      f"(of 64, tiles of 16): {int((block_classes(w_mask, 1, 1, 128, 128, 16, 16) > 0).sum())} vs "
      f"{int((block_classes(lambda b, h, i, j: i >= 0, 1, 1, 128, 128, 16, 16) > 0).sum())}")

# %% [markdown]
# **Combining masks, and their block masks.** An intersection of masks is a mask (`and_masks`; PyTorch
# has `and_masks` and `or_masks` too), and so is a union. Their block masks can be derived from the
# block masks of the parts without looking at elements. For `and`: empty if either is empty, full only if
# both are full, else partial. For `or`: full if either is full, empty only if both are empty, else
# partial. Both rules are safe (no needed tile is skipped) but can be loose: two partial tiles can make an
# empty one under `and` (not for the window and documents below, as their two lines show) or a full one
# under `or`: `j <= i` or `j >= i` is every pair, yet on the diagonal both parts are partial, so the rule
# keeps the element mask there. Evaluating the combined mask on the elements gets the classes exactly:

# %%
def and_classes(c1, c2):
    return torch.where((c1 == 0) | (c2 == 0), 0, torch.where((c1 == 2) & (c2 == 2), 2, 1))


def or_classes(c1, c2):
    return torch.where((c1 == 2) | (c2 == 2), 2, torch.where((c1 == 0) & (c2 == 0), 0, 1))


wd = and_masks(sliding_window(1024, S4, S4), documents(docs4))
upper = lambda b, h, i, j: j >= i
both = lambda b, h, i, j: causal(S4, S4)(b, h, i, j) | upper(b, h, i, j)
cases = {"window and documents": (and_classes(classes_of(VALUES["sliding window W=1024"], 128, 128),
                                              classes_of(VALUES["documents (8, causal)"], 128, 128)),
                                  classes_of(VALUES["window and documents"], 128, 128)),
         "causal or (j >= i)": (or_classes(classes_of(VALUES["causal"], 128, 128),
                                           block_classes(upper, 1, 1, S4, S4, 128, 128)[0, 0]),
                                block_classes(both, 1, 1, S4, S4, 128, 128)[0, 0])}
for name, (from_tiles, exact) in cases.items():
    assert bool(((exact > 0) <= (from_tiles > 0)).all())           # the tile rule never skips a needed tile
    for how, c in (("from the parts' block masks", from_tiles), ("from the combined mask", exact)):
        print(f"{name:21s} {how:28s}: empty {int((c == 0).sum()):4d}, partial {int((c == 1).sum()):3d}, "
              f"full {int((c == 2).sum()):4d}")

# %% [markdown]
# ## 6. The tiled loop: skip empty tiles, mask partial ones
#
# Lecture 04's loop, for one (batch, query head), with the two lists of section 3: for each query tile
# $Q_i$, first its partial key tiles (score modifier, element mask, online-softmax update), then its
# full ones (score modifier, update; no mask). Empty tiles are never read. The block mask is built once,
# outside, as a kernel would receive it. A row whose keys are all masked keeps $m_i = -\infty$; the
# update uses 0 in place of that max so that it computes $e^{-\infty} = 0$ instead of
# $e^{-\infty + \infty}$, and the row ends with $o = 0$, $\text{lse} = -\infty$.

# %%
def tiled_variant_one_head(q, k, v, lists, b, h, mask_mod=None, score_mod=None, Br=64, Bc=64, scale=None,
                           stats=None, score_mod_on_full=True):
    """One (batch b, query head h): q [Sq, D], k and v [Skv, D] (its KV head); lists = tile_lists(classes)
    of this (b, h), each [Tq, Tk]. Returns (o [Sq, D], lse [Sq]). score_mod_on_full=False is a bug
    (for the demo below)."""
    Sq, D = q.shape
    Skv = k.shape[0]
    scale = D ** -0.5 if scale is None else scale
    bb, hh = torch.tensor(b).view(1, 1), torch.tensor(h).view(1, 1)
    o, lse = torch.zeros(Sq, D, dtype=q.dtype), torch.full((Sq,), -math.inf)
    st = stats if stats is not None else {}
    for t in range(math.ceil(Sq / Br)):
        i0, i1 = t * Br, min((t + 1) * Br, Sq)
        Q_i, ii = q[i0:i1], torch.arange(i0, i1).view(-1, 1)
        m_i = torch.full((i1 - i0,), -math.inf, dtype=q.dtype)
        l_i = torch.zeros(i1 - i0, dtype=q.dtype)
        O_i = torch.zeros(i1 - i0, D, dtype=q.dtype)
        for kind in ("partial", "full"):
            n, idx = lists[kind]
            for u in idx[t, :n[t]].tolist():
                st[kind] = st.get(kind, 0) + 1
                j0, j1 = u * Bc, min((u + 1) * Bc, Skv)
                jj = torch.arange(j0, j1).view(1, -1)
                S_ij = scale * Q_i @ k[j0:j1].T                                  # S_ij = scale · Q_i K_jᵀ
                if score_mod is not None and (kind == "partial" or score_mod_on_full):
                    S_ij = score_mod(S_ij, bb, hh, ii, jj)                       # score modifier
                if kind == "partial":
                    S_ij = S_ij.masked_fill(~mask_mod(bb, hh, ii, jj), -math.inf)  # element mask
                m_new = torch.maximum(m_i, S_ij.amax(dim=1))
                m_use = torch.where(m_new == -math.inf, 0.0, m_new)             # a row with nothing yet
                P_ij = torch.exp(S_ij - m_use[:, None])
                alpha = torch.exp(m_i - m_use)
                l_i = alpha * l_i + P_ij.sum(dim=1)
                O_i = alpha[:, None] * O_i + P_ij @ v[j0:j1]
                m_i = m_new
        seen = l_i > 0
        o[i0:i1] = torch.where(seen[:, None], O_i / l_i.clamp_min(1e-300)[:, None], 0.0)
        lse[i0:i1] = torch.where(seen, m_i + torch.log(l_i), -math.inf).float()
    return o, lse


def tiled_variant(q, k, v, mask_mod, score_mod=None, Br=64, Bc=64, stats=None, **kw):
    """Every (batch, query head) through the one-head loop, for the comparison below."""
    B, Hq, Sq, D = q.shape
    G, Skv = Hq // k.shape[1], k.shape[2]
    lists = tile_lists(block_classes(mask_mod, B, Hq, Sq, Skv, Br, Bc))
    o, lse = torch.empty_like(q), torch.empty(B, Hq, Sq)
    for b in range(B):
        for h in range(Hq):
            one = {kind: (n[b, h], idx[b, h]) for kind, (n, idx) in lists.items()}
            o[b, h], lse[b, h] = tiled_variant_one_head(q[b, h], k[b, h // G], v[b, h // G], one, b, h,
                                                        mask_mod, score_mod, Br, Bc, stats=stats, **kw)
    return o, lse


# %% [markdown]
# Every variant of section 2 (including 160 queries against 130 keys, whose first 30 rows see nothing),
# against the dense reference, with tiles of 32 that do not divide the lengths:

# %%
ALL = dict(VARIANTS, **{"causal, Sq > Skv": (160, causal(160, Skv), None)})
print(f"{'variant':26s} {'max |o - ref|':>13s} {'max |lse - ref|':>15s} {'partial':>8s} {'full':>5s} {'skipped':>8s}")
for name, (sq, mask_mod, score_mod) in ALL.items():
    q, k, v = rand_qkv(B, HQ, HKV, sq, Skv, D)
    o_ref, lse_ref = dense_attention(q, k, v, mask_mod, score_mod)
    st = {}
    o, lse = tiled_variant(q, k, v, mask_mod, score_mod, 32, 32, stats=st)
    finite = lse_ref > -math.inf
    err_o = (o - o_ref).abs().max().item()
    err_l = (lse - lse_ref)[finite].abs().max().item()
    total = B * HQ * math.ceil(sq / 32) * math.ceil(Skv / 32)
    print(f"{name:26s} {err_o:13.1e} {err_l:15.1e} {st.get('partial', 0):8d} {st.get('full', 0):5d} "
          f"{total - st.get('partial', 0) - st.get('full', 0):8d}")
    assert err_o < 1e-12 and err_l < 1e-5 and torch.equal(finite, lse > -math.inf), name

# %% [markdown]
# A classic bug of a kernel with two loops is
# to specialise the full-tile loop and forget the score modifier there: the result is right wherever a
# row's keys all sit in partial tiles, and wrong elsewhere. Here with ALiBi:

# %%
q, k, v = rand_qkv(1, HQ, HKV, 256, 256, D)
o_ref, _ = dense_attention(q, k, v, causal(256, 256), alibi(HQ, 256, 256))
o_bug, _ = tiled_variant(q, k, v, causal(256, 256), alibi(HQ, 256, 256), 32, 32, score_mod_on_full=False)
bad_rows = ((o_bug - o_ref).abs().amax(-1) > 1e-9)[0, 0].nonzero().flatten()
print(f"score_mod skipped on full tiles: max |o - ref| {(o_bug - o_ref).abs().max():.2f}; "
      f"wrong rows of head 0 from row {bad_rows.min().item()} on (the first row whose tiles include a full one)")

# %% [markdown]
# ## 7. FP8 on Hopper
#
# Hopper's tensor cores multiply 8-bit floats at twice the 16-bit rate: the H100 SXM5 datasheet gives
# 1,979 dense FP8 TFLOP/s against 989 for FP16/BF16 (3,958 and 1,979 with structured sparsity).
# FlashAttention-3 reports close to 1.2 PFLOP/s for its FP8 forward (abstract and §4.1). Lecture 07
# (section 11) described what FP8 changes inside the kernel (layouts, the transposed $V$); this section
# is about the numbers.
#
# ### The formats
#
# ![the bit fields of fp16, bf16, e4m3 and e5m2, with their ranges and steps](../diagrams/fp8_formats.png)
#
# Two 8-bit formats (Micikevicius et al. 2022): **e4m3** (4 exponent bits, 3 mantissa bits) for
# precision, and **e5m2** (5, 2) for range. e4m3 as Hopper and PyTorch use it (`float8_e4m3fn`, "fn":
# finite, NaN only) gives up infinities, so its top exponent holds numbers too, up to 448; e5m2 keeps
# IEEE's infinities and reaches 57,344. A step of $2^{-m}$ between neighbours in $[1, 2)$ means a
# rounding error of at most $2^{-m-1}$ relative: 6.25% for e4m3, 12.5% for e5m2, against 0.05% for fp16.
# All 256 bit patterns of each format, decoded by PyTorch, against the numbers the figure computed from
# the field widths:

# %%
F8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
print(f"{'format':6s} {'finite':>6s} {'NaN':>4s} {'inf':>4s} {'max':>8s} {'min normal':>11s} {'min subnormal':>14s} "
      f"{'step at 1':>10s}")
for (name, dt), (_, e, mbits, ieee) in zip(F8.items(), vf.FORMATS[2:]):
    vals = torch.arange(256, dtype=torch.uint8).view(dt).float()
    fin = vals[vals.isfinite()]
    pos = fin[fin > 0]
    fi = torch.finfo(dt)
    print(f"{name:6s} {fin.numel():6d} {int(vals.isnan().sum()):4d} {int(vals.isinf().sum()):4d} {fi.max:8.0f} "
          f"{fi.tiny:11.3g} {pos.min().item():14.3g} {fi.eps:10.3g}")
    assert (fi.max, fi.tiny, pos.min().item(), fi.eps) == vf.format_numbers(e, mbits, ieee)   # the figure's numbers

# %% [markdown]
# ### Scales
#
# 448 is small: an activation of 1000 does not fit (PyTorch's cast saturates it to 448, as the cell below
# prints; a cast that does not saturate gives NaN, the "fn" format having no infinity), and small values
# sink into the subnormals (below $2^{-6}$: a fixed step of $2^{-9}$, so fewer and fewer significant bits)
# and then to zero (below $2^{-10}$). So each tensor is stored with a **scale**: $x \approx \sigma\, x_8$ with
# $\sigma = \max|x| / 448$, the largest element mapped to the largest number. The scales cost nothing in
# attention's loop: $S = \text{scale}\,(\sigma_Q \sigma_K)\,Q_8 K_8^\top$ folds into the softmax scale, and
# $\sigma_V$ multiplies $O$ once at the end.
#
# **Per tensor** is one $\sigma$ for the whole tensor; **per block** one for each tile ($B_r$ rows of $Q$,
# $B_c$ rows of $K$ and $V$), which FlashAttention-3 uses (§3.3): a large block no longer pushes a small
# one towards zero. Because the format is floating point, the relative precision of a value does not
# depend on the scale as long as it stays in the normal range, so per-block scales matter when magnitudes
# differ by more than that range, e.g. 64 rows a hundred thousand times smaller than the rest:

# %%
def fp8(x, dt=torch.float8_e4m3fn, block=None):
    """Quantise with one scale per tensor (block=None) or per block of rows, and dequantise: the value an
    FP8 kernel computes with (its scale applied back)."""
    xb = x.reshape(-1, block or x.shape[-2], x.shape[-1])
    sigma = xb.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-30) / torch.finfo(dt).max
    return ((xb / sigma).to(dt).to(x.dtype) * sigma).reshape(x.shape)


g8 = torch.Generator().manual_seed(8)
x = torch.randn(512, 128, generator=g8)
x[256:320] *= 1e-5                                   # one block of 64 rows, 100,000 times smaller
e4 = torch.finfo(torch.float8_e4m3fn)
few = torch.tensor([1000.0, 0.01, 0.001, 0.0009])
print("1000, 0.01, 0.001, 0.0009 in e4m3:", few.to(torch.float8_e4m3fn).float().tolist())
print(f"e4m3's normal range: max / smallest normal = {e4.max / e4.tiny:.0f}")
rel = lambda a, ref: ((a - ref).norm() / ref.norm()).item()
for label, blk in (("per tensor", None), ("per 64-row block", 64)):
    xq = fp8(x, block=blk)
    print(f"{label:17s}: relative error, large rows {rel(xq[:256], x[:256]):.3f}, small block "
          f"{rel(xq[256:320], x[256:320]):.3f} ({(xq[256:320] == 0).float().mean():.0%} of it rounded to 0)")

# %% [markdown]
# ### Where attention's error comes from
#
# An FP8 attention rounds four things: $Q$ and $K$ before $S = QK^\top$, then $\tilde P = e^{S - m}$ and
# $V$ before $\tilde P V$. ($S$ itself and the softmax stay in fp32, and the row sum $\ell$ is taken
# from $\tilde P$ in fp32, before its cast.) $\tilde P$ lies in $[0, 1]$ with its largest element exactly
# 1, so it needs no scale; in e4m3 its entries below $2^{-10}$ become 0 and those below $2^{-6}$ are
# subnormal.
#
# We emulate the kernel on the CPU: cast to FP8 and back, then compute in fp32, and compare $O$ with a
# float64 reference, rounding one operand at a time, then all four, in each format; fp16 and bf16 for
# scale. (A real kernel also accumulates its FP8 products with fewer bits than fp32: DeepSeek-V3's
# report, §3.3.2, measured about 14 bits of accumulation on its Hopper GPUs. The emulation leaves that
# out, so real errors can only be larger.)

# %%
def attention_emulated(q, k, v, cast_q=None, cast_k=None, cast_v=None, cast_p=None):
    """One head, fp32 arithmetic on rounded operands: S = scale·QKᵀ, P̃ = exp(S - m), ℓ = rowsum(P̃) in
    fp32, O = cast(P̃) V / ℓ."""
    same = lambda t: t
    q, k, v = (cast_q or same)(q), (cast_k or same)(k), (cast_v or same)(v)
    s = q @ k.T / math.sqrt(q.shape[-1])
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l = p.sum(-1, keepdim=True)
    return s, (cast_p or same)(p) @ v / l


Nf, Df = 1024, 128
q1, k1, v1 = (torch.randn(Nf, Df, generator=g8) for _ in range(3))
_, o64 = attention_emulated(q1.double(), k1.double(), v1.double())
print(f"{'rounded':22s} " + " ".join(f"{n:>8s}" for n in ("Q", "K", "V", "P", "all")))
for name, dt in (("e4m3 (per tensor)", F8["e4m3"]), ("e5m2 (per tensor)", F8["e5m2"]),
                 ("fp16", torch.float16), ("bf16", torch.bfloat16)):
    rnd = (lambda x, dt=dt: fp8(x, dt)) if dt in F8.values() else (lambda x, dt=dt: x.to(dt).float())
    rnd_p = lambda p, dt=dt: p.to(dt).float()                     # P̃ in [0, 1]: no scale
    errs = [rel(attention_emulated(q1, k1, v1, **{f"cast_{w}": (rnd_p if w == "p" else rnd)})[1].double(), o64)
            for w in "qkvp"]
    errs.append(rel(attention_emulated(q1, k1, v1, rnd, rnd, rnd, rnd_p)[1].double(), o64))
    print(f"{name:22s} " + " ".join(f"{e:8.4f}" for e in errs))
p_tilde = torch.exp((s := q1 @ k1.T / math.sqrt(Df)) - s.amax(-1, keepdim=True))
e4m3_all = rel(attention_emulated(q1, k1, v1, fp8, fp8, fp8, lambda p: p.to(F8["e4m3"]).float())[1].double(), o64)
for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    r = lambda x, dt=dt: x.to(dt).float()
    other = rel(attention_emulated(q1, k1, v1, r, r, r, r)[1].double(), o64)
    print(f"e4m3 (all four) / {name} (all four): {e4m3_all / other:.0f}x")
print(f"entries of P̃ that e4m3 rounds to 0: {(p_tilde.to(F8['e4m3']) == 0).float().mean():.2%}, "
      f"subnormal: {((p_tilde < 2 ** -6) & (p_tilde >= 2 ** -10)).float().mean():.2%}")

# %% [markdown]
# Read the table as relative errors of $O$ (the norm of the error over the norm of $O$). Each of the four
# roundings contributes about equally: e4m3 rounds every operand with the same *relative* precision,
# so no operand is special, and the errors add up roughly as independent ones do. e5m2's extra bit of
# range costs a bit of mantissa, which doubles every error; hence e4m3 for the forward pass (and e5m2,
# where used at all, for gradients, whose range is wider). FP8 attention's error is that of its
# operands' rounding, here about a hundred times fp16's and over ten times bf16's (the two ratios printed
# last): good enough for the inference of many models, a choice to validate on each one.
#
# ### Outliers and incoherent processing
#
# Language-model activations have a few channels much larger than the rest (Dettmers et al.,
# *LLM.int8()*, 2022, described these outlier features). When the same channel is large in both $Q$ and
# $K$, every logit contains a large product $q_c k_c$, rounded with a 6% relative error: one large
# error term per logit. FlashAttention-3 (§3.3) multiplies $Q$ and $K$ by the same random orthogonal
# matrix $M$ before quantising. Since $M M^\top = I$,
#
# $$ (QM)(KM)^\top = Q M M^\top K^\top = Q K^\top $$
#
# exactly, but after the rotation the outlier's energy is spread over all $D$ coordinates: each logit is
# now a sum of $D$ products of similar size, whose rounding errors are independent and partly cancel.
# FA3 takes $M$ = diag(random signs) × a Hadamard matrix, which is applied in $O(D \log D)$ additions
# (the fast Walsh–Hadamard transform) rather than a $D \times D$ product:

# %%
def fwht(x):
    """x @ H_D / sqrt(D) for the Sylvester Hadamard matrix H_D (D a power of two): log2 D butterflies."""
    D = x.shape[-1]
    y, half = x, 1
    while half < D:
        y = y.reshape(*x.shape[:-1], D // (2 * half), 2, half)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        half *= 2
    return y.reshape(x.shape) / math.sqrt(D)


def hadamard(n):
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < n:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    return H / math.sqrt(n)


signs = torch.where(torch.rand(Df, generator=g8) < 0.5, -1.0, 1.0)
M = torch.diag(signs.double()) @ hadamard(Df)
xx = torch.randn(4, Df, dtype=torch.float64, generator=g8)
assert torch.allclose(fwht(xx * signs.double()), xx @ M) and torch.allclose(M @ M.T, torch.eye(Df, dtype=torch.float64))
print(f"butterflies: {int(math.log2(Df))} passes of {Df} additions per row, against {Df * Df} multiply-adds for x @ M")

# %% [markdown]
# The measurement: 4 of the 128 channels of $Q$ and $K$ scaled by a factor $f$ (last line: of $K$ only),
# everything in e4m3 ($V$ per 64-row block), with per-tensor scales, per-block scales, and per-block
# scales after the rotation. The error of $S$ is the RMS of its difference from the float64 logits; the
# error of $O$ is relative.

# %%
ch = [3, 50, 77, 101]
print(f"{'outliers in':11s} {'f':>3s} {'logit std':>9s}   " + "   ".join(
    f"{n:>26s}" for n in ("per tensor: S, O", "per block: S, O", "per block + rotation: S, O")))
for where, f in (("Q and K", 1), ("Q and K", 3), ("Q and K", 6), ("Q and K", 10), ("K only", 10)):
    qo, ko = q1.clone(), k1.clone()
    if where == "Q and K":
        qo[:, ch] *= f
    ko[:, ch] *= f
    s64, o64o = attention_emulated(qo.double(), ko.double(), v1.double())
    v8 = fp8(v1, block=64)
    cells = []
    for qq, kk in ((fp8(qo), fp8(ko)), (fp8(qo, block=64), fp8(ko, block=64)),
                   (fp8(fwht(qo * signs), block=64), fp8(fwht(ko * signs), block=64))):
        s8, o8 = attention_emulated(qq, kk, v8)
        cells.append(f"{(s8.double() - s64).pow(2).mean().sqrt():12.3f} {rel(o8.double(), o64o):12.4f}")
    print(f"{where:11s} {f:3d} {s64.std():9.2f}   " + "   ".join(f"{c:>26s}" for c in cells))

# %%
# one logit, term by term: the D products q_c k_c before and after the rotation (f = 6, outliers in Q and K)
qo, ko = q1.clone(), k1.clone()
qo[:, ch] *= 6
ko[:, ch] *= 6
fig, axs = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
for ax, (title, a, c) in zip(axs, (("before: q_c k_c", qo[0], ko[0]),
                                   ("after the rotation: (qM)_c (kM)_c", fwht(qo[0] * signs), fwht(ko[0] * signs)))):
    ax.bar(range(Df), (a * c).tolist(), width=1.0, color="#4a90d9")
    ax.set_title(f"{title}; sum {float((a * c).sum()):.2f}, largest |term| {float((a * c).abs().max()):.2f}",
                 fontsize=9.5)
    ax.set_xlabel("coordinate c")
axs[0].set_ylabel("term of q · k")
fig.tight_layout()
plt.show()

# %% [markdown]
# The plot shows one logit of query 0 and key 0 as its $D$ terms: the same sum, first dominated by the
# four outlier products, each rounded with up to 6% of its size, then made of $D$ terms of ordinary size.
# Without outliers ($f = 1$) the rotation changes nothing: the errors are already those of random
# roundings. With outlier channels in both $Q$ and $K$ the rotation cuts the error of $S$ several times
# over and brings $O$'s error back near the no-outlier level, while per-block scales alone help little
# (the outliers are in every row, so in every block). When only $K$ has the outlier channels (last
# line), the rotation leaves the error of $S$ where it was: each large coordinate of $K$ multiplies an
# ordinary one of $Q$, so its rounding error is of the same order as every other term's, and there is
# nothing to spread. (The error of $O$ still moves a little between the columns of that line, as much
# with the per-block scales as with the rotation.) (FA3's own test, §4.3, draws
# 0.1% of all entries 10 times larger and reports an RMSE 2.6 times lower with block quantisation and
# the rotation than with per-tensor scales.)
#
# ### FA3's test, and a rung that quantises as FA3 does
#
# FA3's own test (§4.3, Table 3) puts no outliers in channels: it draws every entry of $Q$, $K$ and $V$
# from $N(0, 1)$ and adds $N(0, 100)$ to one entry in a thousand, anywhere, then compares the RMSE of
# $O$ against an exact reference: $2.4 \times 10^{-2}$ for FP8 with per-tensor scales, $9.1 \times
# 10^{-3}$ with block quantisation and the rotation. The emulation below runs that test on one head of
# 2048 keys (`facourse.fp8.fa3_outlier_inputs`, the inputs the GPU checks use), with the blocks of
# step 10's rung `v7_fp8_fa3` (64 rows of $Q$, 128 of $K$ and $V$), $\tilde P$ cast times 256 as the
# kernel casts it (so that its small entries stay out of e4m3's subnormals), and one more column: one
# scale per *row*, finer than any kernel would keep.

# %%
from facourse.fp8 import fa3_outlier_inputs

qa, ka, va = (t[0, 0].float() for t in fa3_outlier_inputs(1, 1, 2048, Df, seed=0))
_, o_ref = attention_emulated(qa.double(), ka.double(), va.double())
p256 = lambda p: (p * 256).to(F8["e4m3"]).float() / 256          # P̃ times 2^8 in e4m3, as v7 casts it
rot = lambda x: fwht(x * signs)
quants = {"per tensor": (None, None), "per block": (64, 128), "per row": (1, 1)}
print(f"{'':22s}" + "".join(f"{n:>14s}" for n in quants))
for label, r in (("no rotation", lambda x: x), ("rotated Q and K", rot)):
    cells = []
    for bq, bk in quants.values():
        _, o8 = attention_emulated(fp8(r(qa), block=bq), fp8(r(ka), block=bk), fp8(va, block=bk), cast_p=p256)
        cells.append(f"{(o8.double() - o_ref).pow(2).mean().sqrt():14.2e}")
    print(f"{label:22s}" + "".join(cells))

# %% [markdown]
# At the kernel's blocks the rotation is what cuts the RMSE, as in FA3's ablation; per-block scales alone
# move it a little. One scale per row would come close without the rotation (an outlier then costs
# precision in its own row only), but in a kernel it is one more multiply per element of $S$, in an FP8
# kernel whose softmax already limits its speed. With the rotation, finer scales add nothing: once no
# entry dominates its block, what is left is e4m3's rounding of every entry (3 mantissa bits), which no
# choice of scale removes.
#
# Where that rounding lands decides the RMSE. In FA3's test a row of $Q$ with an outlier meets the keys
# whose outlier sits in the same coordinate, and its attention falls on a few of them: its output is
# then little more than one or two rows of $V$, each with its own e4m3 rounding, which no average over
# keys dilutes. On one head of v7's numerics, the eighth of the rows whose largest weight passes 0.1
# carry about four fifths of the squared error, so the RMSE moves from one draw of the inputs to the
# next: over four seeds it stays below FA3's figure at 2048 and 4096 keys, and at 8192 it lands mostly
# a little above it (`2026-12-02_cpu_step10_fp8_error_spread.txt`, emulated on a CPU). One head's
# RMSE is a sample, and FA3's is one too.
#
# Which length FA3 measured at, its paper does not say; its other rows do. Emulated on the same draws
# against float64 attention, FlashAttention-2 in fp16, plain fp16 attention and FA3's per-tensor FP8
# baseline read FA3's three figures for them at 8192 keys, lower ones at 4096 and higher at 16384. At
# 8192 keys, over eight heads, v7's RMSE lies 1% above FA3's figure, single heads anywhere from 5% below
# it to 7% above: FA3's one figure is inside that spread, and the mean over heads still misses it. Finer
# scales for $Q$ or $K$ (per 16 rows, per row) move that mean less than the heads differ, up on some
# heads and down on others: in e4m3 a scale only decides where a block's largest entry lands, and every
# entry keeps its 3 mantissa bits wherever that is (`2026-12-03_cpu_step10_fp8_fa3_table3.txt`).
#
# The rounding itself can be paid for with tensor-core work instead. A tensor's rounding error
# $r = \text{e4m3}(x/s - \text{e4m3}(x/s))$ is itself an e4m3 tensor in the same scale, and $\tilde P V =
# \tilde P V_8 + \tilde P r$: one more product on the same $\tilde P$, no more softmax. Emulated on a CPU, adding
# $V$'s error back takes the RMSE at 8192 keys from 9.3-9.7e-3 to 6.8-7.6e-3, $Q$'s from there to 5.1-5.7e-3
# (`2026-12-04_cpu_step10_fp8_residual.txt`). `v7_fp8_fa3`'s switch `V_RESIDUAL` does the first in the kernel,
# $r$ stored under $V^\top$: on an H200 the RMSE on FA3's inputs fell from 9.45-9.51e-3 to 7.27-7.36e-3 at 8192
# keys, under FA3's figure, and the speed by 25-30% (666-669 TFLOP/s at 16k non-causal against 890-932 in the same
# run; `2026-12-04_h200_step10_fp8_v_residual.txt`): FA3's accuracy at a price its speed does not pay. The switch
# is off.
#
# ### Another format for $QK^\top$
#
# After the rotation a block of $Q$ or $K$ is close to Gaussian: no entry far above the others. That is where e4m3's
# exponent stops paying. It keeps the same relative precision from the block's largest entry down through many
# binades, which such a block hardly uses, while its 3 mantissa bits put an entry of the block's typical size on a
# grid of 8 steps a binade. An 8-bit integer with the block's largest entry at 127 spends all its bits on one
# uniform grid, about twice as fine for the typical entry. Hopper's tensor cores multiply int8 at e4m3's rate and
# sum exactly in int32, and SageAttention (Zhang et al., 2024) quantises $Q$ and $K$ to int8 for this reason,
# keeping $\tilde P$ and $V$ in FP8 ($\tilde P$'s entries span many binades, which a uniform grid would lose).
# On the same head as above, with $V$ and $\tilde P$ as `v7` rounds them:

# %%
def int8_blocks(x, block):
    """x rounded to integers with one scale per block of rows (its largest entry at 127), the scale applied back."""
    xb = x.reshape(-1, block, x.shape[-1])
    step = xb.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(xb / step) * step).reshape(x.shape)


qr = rot(qa)
for name, q_r in (("e4m3", fp8(qr, block=64)), ("int8", int8_blocks(qr, 64))):
    print(f"rotated Q in {name}: RMS rounding error {float((q_r - qr).pow(2).mean().sqrt() / qr.pow(2).mean().sqrt()):.2%} "
          f"of its RMS")
s_ref, _ = attention_emulated(qa.double(), ka.double(), va.double())
v_8 = fp8(va, block=128)
print(f"{'Q and K':22s} {'RMSE of O':>10s} {'RMS error of S':>15s}")
for label, cq, ck in (("e4m3, rotated (v7)", fp8(qr, block=64), fp8(rot(ka), block=128)),
                      ("int8, rotated", int8_blocks(qr, 64), int8_blocks(rot(ka), 128)),
                      ("int8, not rotated", int8_blocks(qa, 64), int8_blocks(ka, 128))):
    s8, o8 = attention_emulated(cq, ck, v_8, cast_p=p256)
    print(f"{label:22s} {float((o8.double() - o_ref).pow(2).mean().sqrt()):10.2e} "
          f"{float((s8.double() - s_ref).pow(2).mean().sqrt()):15.4f}")

# %% [markdown]
# After the rotation int8 rounds $Q$ less than half as coarsely as e4m3, cuts the error of $S$ to about two fifths
# and the RMSE of $O$ by almost a third; without the rotation it is worse than e4m3, since one outlier then sets its
# block's grid. Over eight heads at 8192 keys the emulation reads 6.38e-3 against `v7`'s 9.19e-3, and $QK^\top$'s
# share of it 2.01e-3 against 6.94e-3 (`2026-12-05_cpu_step10_int8_qk_error.txt`): what is left is $V$'s and
# $\tilde P$'s rounding. `v7_fp8_fa3`'s switch `INT8_QK` does it in the kernel (its quantisers store integers, the
# first product is an s8 WGMMA), and in Triton's interpreter it reads what the emulation reads. Its price is one
# instruction a score: the int32 sums must become fp32 before the softmax, by a conversion or by reading them as
# the low bits of $1.5 \cdot 2^{23}$ plus the sum, and the key loop issues 569 instructions a warp for a 128-key
# tile against 505 (its SASS, compiled on a CPU: `2026-12-05_cpu_step10_int8_qk_sass.txt`). Whether the speed pays
# for that is a GPU measurement not made yet; the switch is off.
#
# `v7_fp8_fa3` does this on the GPU: one fused Triton kernel per tensor reads the fp16 tile once,
# multiplies $Q$ and $K$ tiles by diag(signs) $H_D / \sqrt{D}$ with one `tl.dot` (entries $\pm 1$, exact),
# takes the tile's amax, and writes e4m3 and the tile's scale ($V$ goes out transposed, the layout the
# kernel's $\tilde P V$ reads). The attention kernel multiplies $S$ of tile $(i, j)$ by the two tiles'
# scales and each $\tilde P V_j$ by $V_j$'s scale. The committed run (a GPU's, if there is one): the RMSE
# of $O$ on FA3's inputs at 2048 and 8192 keys, the speed on inputs already in e4m3, and end to end (fp16
# in, the quantisation timed with the kernel) against the fp16 solution's CUDA kernel in the same run.

# %%
from facourse import results

_ = results.show("10", results.fp8_table, missing="No GPU measurement of step 10's FP8 rungs is committed yet.")

# %% [markdown]
# The first row quantises with PyTorch passes (amax, divide, cast, transpose: each a full read and write
# of a tensor), so end to end it is slower than the fp16 kernel it was meant to beat; v7's fused
# quantisers read each input once. The bracketed ratios time the same pair with Triton's `do_bench` back
# to back and with CUDA events around each call and no spin: the last counts the host's time to launch
# four kernels (the three quantisers, then attention) as GPU time, and it is the lowest. On an H200 that
# host time is 352 us a call, where the fp16 solution's single launch takes 42 us; quantising all three
# tensors in one launch saves about 60 us of it but makes the GPU's part slower, 1.42 ms against 1.39 ms
# (`benchmarks/results/2026-12-03_h200_step10_fp8_one_launch.txt`).
#
# The last row, `v8_hopper_fp8`, is step 07's CUDA kernel (TMA, WGMMA, two consumer warpgroups taking
# turns at the tensor cores) with both products in e4m3, fed by v7's quantisers: the same RMSE as v7,
# and slower than both Triton rungs. Three things change when step 07's kernel goes to e4m3. Hopper's
# 8-bit WGMMA reads shared memory K-major only, so $\tilde P V$ reads $V^\top$. Each instruction covers
# 32 keys instead of 16. And the registers that hold $\tilde P$ must be rearranged: the accumulator of $S$
# gives each lane of a quad the key pairs $\{2t, 2t+1\}$ and $\{8+2t, 9+2t\}$ of every 16, while the
# e4m3 operand wants $\{4t, \ldots, 4t+3\}$. Two shuffles inside the quad and a few byte permutes per 16
# columns do it. None of these is what costs the speed. The tensor cores do an e4m3 product in half the
# time of an fp16 one, but the softmax costs the same instructions per key block as in fp16 (one
# exponential, one multiply-add, one max and one add per score), and in ping-pong one warp per
# scheduler runs it while the other warpgroup's GEMMs run. In fp16 those GEMMs hid it; in e4m3 they are
# too short. On an H200, Nsight Compute found the tensor pipe 38.1% busy and the issue slots 48.63% (on its
# first build, 727 TFLOP/s on `long` where the committed build ran 702-737 in the same probes).
# Turning off ping-pong, deepening the ring, dropping the softmax overlap or skipping the register
# exchange each moved the speed by 5.6% or less (`benchmarks/results/2026-11-27_h200_step10_v8_probes.txt`).
# Triton's v5 and v7 run two or three independent programs per SM instead, and reach
# 852-915 TFLOP/s on inputs already in e4m3 in the same run (`2026-11-27_h200_step10_v8.json`). FlashAttention-3 reports
# about 1.2 PFLOP/s in FP8 on an H100 with a CUDA kernel of this shape; getting there takes a softmax
# that overlaps the tensor cores better, and this course has not got there yet.
#
# One more multiply per score is the accumulator's rescale: every key tile multiplies the $64 \times 128$
# accumulator by its row's $\alpha$ and by the ratio of two $V$ scales, as many multiplies as the tile has
# scores. FlashAttention-4 skips the rescale while no row's maximum has grown by more than a threshold
# $\tau$ (the unnormalised $\tilde P$ then reaches $2^\tau$ instead of 1). In e4m3 two things are in the
# way: $\tilde P$ is cast times $2^8$, so $2^{8 + \tau}$ must stay under e4m3's largest number, and the
# per-block $V$ scales change the accumulator's unit at every tile. The switch `LAZY_RESCALE` of
# `v7_fp8_fa3` keeps the accumulator in units of the head's largest $V$ scale, folds each tile's ratio
# into $\tilde P$'s exponent (a per-row offset, no multiply per score) and moves a row's maximum only when
# it grows by more than $\tau = 0.75$. On a CPU it computes the same attention, but on FA3's outlier
# inputs at 2048 keys its RMSE is 1.10-1.13x v7's: in the tiles whose $V$ scale is far below the
# head's largest, $\tilde P$ loses that much of its lift and more of it falls into e4m3's subnormals
# (the lazy maximum alone costs nothing). With one $V$ scale per head the lazy rescale is free, but the
# coarser $V$ scale costs 1-2 % (`benchmarks/results/2026-11-28_cpu_step10_fp8_lazy.txt`). And it is
# slower: on an H200 it ran at 0.71-0.72x v7's speed on inputs already in e4m3
# (`benchmarks/results/2026-11-28_h200_step10_fp8_lazy.txt`). The branch around the rescale inside the
# key loop is its one structural change, and Triton may no longer pipeline that loop; the switch is off.
#
# FlashAttention-4 also moves part of the exponentials off the MUFU unit, the one that computes exp2: a
# cubic and an integer add into the exponent compute $2^x$ on the FMA pipes, for a share of the columns.
# On Hopper that loses. The unit gives 16 results a clock per SM (FA3's paper, §3.2: 3.9 TFLOPS of
# special functions on an H100 SXM5), and at `v7`'s speed it is less than half busy, and so are the issue
# slots: `v7`'s key loop issued 565 instructions a warp for a 128-key tile, 67 of them `MUFU`, and two
# warps share each scheduler. What sets the speed is each warp's own chain: it waits for its $S$, then
# issues its softmax's dependent instructions with one other warp beside it, so the loop's time follows
# its instruction count, and an exponential moved to the FMA pipes is about ten instructions instead of
# one. With the switch `EXP2_FMA` at 8 (the last eighth of each tile's columns in software) `v7` loses
# 20-27% of its speed on `long` and at 16k on an H200, at 4 (a quarter) 23-30%
# (`benchmarks/results/2026-12-03_h200_step10_fp8_exp2_part.txt`; the loop's instructions, read in its
# SASS on a CPU, in `2026-12-03_cpu_step10_fp8_loop_sass.txt`). Taking the row sums of $\tilde P$ off the
# FMA pipes instead, as one more small product on the tensor cores ($\tilde P$ times a tile of ones),
# saves no instructions and costs accuracy: the FP8 tensor cores sum with fewer bits than fp32, and the
# RMSE on FA3's inputs at 8192 keys doubled (same file).
#
# The count is not the whole chain, though: what the chain waits for matters too. Each tile's $K$ descale
# enters right after $S$ (the row maximum needs $S$ times it). Through `tl.load` Triton's pipeliner copies
# it a step ahead into shared memory, which costs a wait, a shared load and the copy's bookkeeping every
# step. Read instead by a plain global load in the step that uses it, the loop holds 550 instructions
# instead of 565 and runs 5-9% slower at 16k and on `long`, most likely because that load comes back
# after $S$ does (`benchmarks/results/2026-12-03_h200_step10_fp8_plain_descales.txt`).
#
# What the chain waits for can also leave it. The register exchange that `v8` writes by hand, Triton
# does in `v7` too: 16 `SHFL`, 16 `SEL` and 16 `PRMT` a tile, between the exponentials and the second
# WGMMA. But $\tilde P V$ sums over the keys, and any order of them gives the same sum if $V$'s rows follow.
# So `v7`'s $V$ quantiser stores each group of 32 keys of $V^\top$ in the order in which the lanes already
# hold $\tilde P$: the accumulator's column $8a + 2t + b$ (lane $t$ of a quad, $a < 4$, $b < 2$) becomes
# key $16\lfloor a/2 \rfloor + 4t + 2(a \bmod 2) + b$, exactly where the e4m3 operand wants it. The
# kernel puts $\tilde P$ in the same order with a reshape and a permute that Triton resolves as a renaming
# of registers, and the exchange is gone. A key tile's two descales travel together the same way, one
# 16-byte record $(d_K, d_V, 1/d_V)$ through the pipeliner. The loop falls from 565 instructions to 503,
# and on an H200 `v7` runs 17-18% faster at 16k non-causal and 9-10% on `long`, end to end too
# (`benchmarks/results/2026-12-04_h200_step10_fp8_operand_order.txt`, which also times the new order
# alone: 5-10% at 16k, under 1% on `long`). The same freedom exists in any kernel whose second product
# sums over the dimension its first one produced. The figure below follows one group of 32 keys.

# %%
# one row of P, one group of 32 keys: the lane of a quad that holds column c of S's accumulator (2t, 2t + 1 of
# every 8), the lane the e4m3 operand of P V wants position k in (4t..4t + 3 of every 16), and the key that
# v7's operand order stores at position k (operand_ordered on one group)
cols = torch.arange(32)
acc_lane, op_lane = (cols % 8) // 2, (cols % 16) // 4
key_at = cols.reshape(2, 2, 4, 2).permute(0, 2, 1, 3).reshape(32)
assert torch.equal(acc_lane[key_at], op_lane)          # every key already sits in the lane that needs it
rows = {"the operand wants, at position k,\na value from lane": (op_lane, cols),
        "keys in order: position k holds key k,\nheld by lane": (acc_lane, cols),
        "operand order: position k holds key\nkey_at[k], held by lane": (acc_lane[key_at], key_at)}
fig, ax = plt.subplots(figsize=(11, 2.4))
ax.imshow(torch.stack([lane for lane, _ in rows.values()]), cmap=plt.get_cmap("Pastel1", 4), aspect="auto")
for r, (lane, key) in enumerate(rows.values()):
    for k in range(32):
        moved = r > 0 and lane[k] != op_lane[k]
        ax.text(k, r, f"{int(key[k])}" if r else f"{int(lane[k])}", ha="center", va="center", fontsize=8,
                color="#c0392b" if moved else "black", fontweight="bold" if moved else "normal")
ax.set_yticks(range(3), list(rows), fontsize=8.5)
ax.set_xticks(range(0, 32, 4))
ax.set_xlabel("position k in the group of 32 (colour: the lane of the quad; red: must come from another lane)")
fig.tight_layout()
plt.show()
print(f"keys in order: {int((acc_lane != op_lane).sum())} of 32 values move between lanes; operand order: "
      f"{int((acc_lane[key_at] != op_lane).sum())}")

# %% [markdown]
# Short sequences ask something else of the kernel. A causal row of 2048 keys is at most 16 key tiles long,
# so loading $Q$, filling the pipeline and writing $O$ take a larger share of each program's time. At `v7`'s
# tiles two programs fit on an SM (181 registers a thread, and 105 KiB of shared memory for three stages of
# $K$ and $V^\top$). With two stages, and ptxas told to keep to 168 registers (it does, without spilling),
# three fit, and one can compute while the others wait. On an H200 that is about 5% faster on `large`
# (causal, 2048 keys) and 8% at causal 1024, but 2-5% slower from 4096 keys up, likely because there the
# third stage of prefetch is worth more than the third program. So `v7` chooses by length
# (`benchmarks/results/2026-12-04_h200_step10_fp8_three_programs.txt`).
#
# FlashAttention-3's other answer to the softmax is to overlap it with the tensor cores inside one warpgroup: issue
# $S_{j+1} = Q K_{j+1}^\top$, then $\tilde P_j V_j$, wait for $S_{j+1}$ alone, and compute its softmax while
# $\tilde P_j V_j$ still runs. Triton cannot say this. It makes a `tl.dot` asynchronous only when the result is an
# accumulator that the next iteration's dot takes back: $O$ of $\tilde P V$ is one, $S$, which goes to the softmax, is
# not, so Triton waits for each $S$ right after issuing it. Writing `v7`'s loop with $S$ one tile ahead (its switch
# `AHEAD_S`) compiles to the same wait. Gluon, Triton's lower-level language (`triton.experimental.gluon`), leaves
# the layouts, the shared memory, the barriers and the waits to the kernel: `warpgroup_mma(..., is_async=True)`
# issues a product, `warpgroup_mma_wait(1)` waits until one is left in flight. `v9_gluon_fp8` writes FA3's loop
# that way on `v7`'s quantised inputs, its own TMA loads and mbarriers feeding a ring of three $K$ and $V^\top$ tiles,
# and the SASS shows the overlap: a wait with one group in flight before the softmax (`tests/test_step10_v9_gluon_fp8.py`
# checks it, and that `AHEAD_S` has none). It passes every check with `v7`'s RMSE, and it is not faster: on an H200,
# 888-904 TFLOP/s on `long` and at 16k non-causal against `v7`'s 904-922 in the same run, level on `large`
# (`benchmarks/results/2026-12-04_h200_step10_v9_gluon.txt`). What it adds, `v7` mostly had: two programs on each
# SM, so that one program's softmax already runs under the other's products. And it costs registers, since $\tilde P$
# now lives from one step to the next (242 a thread against 170). The converse measurement says the same: two
# warpgroups sharing one program's 128 query rows and its $K$ and $V^\top$ tiles (FA3's shape without its
# scheduler) run in step, both in their softmax at once, and lose 17-22% (702-751 TFLOP/s at 16k). FA3 adds a
# scheduler for exactly that: named barriers that make the two warpgroups take turns.
#
# ## 8. On a GPU: FlexAttention with a sliding window
#
# The cell times PyTorch's FlexAttention, compiled (`torch.compile(flex_attention)` generates a Triton
# kernel from the mask and score functions), with a sliding-window block mask and with a causal one,
# against SDPA's causal attention (FlashAttention-2 or cuDNN, whichever SDPA picks), with the course's
# timer (`facourse.bench.time_calls`: L2 flushed, GPU events, median of 20). TFLOP/s count the visible
# pairs only, so a kernel that skips its empty tiles well keeps its TFLOP/s while its time falls.

# %%
def window_pairs(S, W):
    """Visible pairs of a square sliding window: row i sees min(i + 1, W) keys."""
    return sum(min(i + 1, W) for i in range(S))


assert window_pairs(N, vf.WINDOW) == int(FIGURE_MASKS["sliding window"](*index_grids(1, 1, N, N)).sum())

if gpu_or_skip("timing FlexAttention (compiled) against SDPA"):
    import statistics

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from facourse.bench import new_flush_buffer, time_calls

    Bg, Hg, Sg, Dg, Wg = 4, 16, 8192, 128, 1024
    qg, kg, vg = (torch.randn(Bg, Hg, Sg, Dg, device="cuda", dtype=torch.float16) for _ in range(3))
    try:
        flex = torch.compile(flex_attention)
        win = create_block_mask(lambda b, h, i, j: (j <= i) & (j > i - Wg), None, None, Sg, Sg, device="cuda")
        cau = create_block_mask(lambda b, h, i, j: j <= i, None, None, Sg, Sg, device="cuda")
        calls = {f"flex, window {Wg}": lambda: flex(qg, kg, vg, block_mask=win),
                 "flex, causal": lambda: flex(qg, kg, vg, block_mask=cau),
                 "SDPA, causal": lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)}
        pairs = {f"flex, window {Wg}": window_pairs(Sg, Wg), "flex, causal": Sg * (Sg + 1) // 2,
                 "SDPA, causal": Sg * (Sg + 1) // 2}
        gpu_ms, _ = time_calls(calls, 20, new_flush_buffer())
        print(f"{torch.cuda.get_device_name()}, B={Bg}, H={Hg}, S={Sg}, D={Dg}, fp16")
        for name, times in gpu_ms.items():
            t = statistics.median(times) / 1e3
            print(f"{name:22s} {t * 1e3:8.3f} ms  {4 * Bg * Hg * Dg * pairs[name] / t / 1e12:6.0f} TFLOP/s "
                  f"(visible pairs: {pairs[name] / Sg ** 2:.1%} of S²)")
    except Exception as e:                                    # an old PyTorch, or no Triton for this GPU
        print(f"FlexAttention could not be compiled here ({type(e).__name__}: {str(e).splitlines()[0][:80]})")

# %% [markdown]
# What the course measured for step 10 on a GPU, if it is committed (`course/results/measured.json`,
# read by `facourse.results`; the runner's `python -m benchmarks.ladder 10`): every rung of the
# solution ladder, TFLOP/s on visible pairs, against compiled FlexAttention on the windows (both sides
# given their block mask built once) and SDPA on causal and `long`.

# %%
R10 = results.show("10", results.variant_table)   # None until a measurement of step 10 is committed
if R10:
    dense = {n: results.bench(R10, n, "window1024_8k") for n in ("v1_dense_mask", "v2_mask_fn")}
    print("every tile computed, window 1024 at 8k: "
          + ", ".join(f"{n} {r[0]['ratio']:.2f}x FlexAttention's speed" for n, r in dense.items() if r))

# %% [markdown]
# Read the table from the bottom of the ladder up. Computing every tile (v1 with the mask read from a
# tensor, v2 with the mask function) wastes most of the work of a 1024 window at 8k: a sixth of
# FlexAttention's speed or less (the line under the table). The block mask (v3, the exercise's
# solution) skips the empty tiles and applies the mask on the few partial ones; v4 adds tensor descriptors and a counted loop over a run of
# full tiles, and stays near FlexAttention's speed on the windows. v6, the ladder's solution, leaves
# Triton for the masks that need no mask function: step 07's Hopper kernel (TMA, WGMMA, warp
# specialization) computes causal itself, and a sliding window is causal with a lower edge, so its
# key-block loop only starts later (at the window's first block, 9 blocks of 128 per query tile at
# W = 1024, 2 of them masked); every other mask and score modifier goes to v4. The FP8 rungs (section 7)
# are timed on inputs already in e4m3 and end to end.
#
# ### One ratio, three clocks
#
# A speed-up is a ratio of two times, and how the times are taken moves it. The runner's `--methods`
# times every row of the table two more ways besides the course's bench (interleaved calls, the L2
# flushed and the GPU kept busy before each): Triton's `do_bench`, which runs one kernel back to back
# for a fixed time, and CUDA events around each call with no spin, which counts any wait for Python
# to launch the call. The cell prints the three for the solution's rows, from the newest committed run
# that measured them (a later run without `--methods` does not replace them).

# %%
if R10:
    M10 = results.load("10_methods")
    rows = [r for r in results.bench(M10, M10["solution"]) if r.get("ratio_methods")] if M10 else []
    if rows:
        print(f"{M10['source']}: {results.header(M10)}")
    for r in rows:
        m = r["ratio_methods"]
        print(f"{r['config']:>15} vs {r['ref_backend'][:15]:<15} course's bench {r['ratio']:.2f}x   "
              + "   ".join(f"{k} {v:.2f}x" for k, v in m.items()))
    if not rows:
        print("The committed run of step 10 has no second timing method.")

# %% [markdown]
# On the windows the three disagree by more than the noise of any one of them. The course's bench
# rests the GPU between calls; `do_bench` keeps it busy long enough for its clock to fall, and in one
# probe on an H100 the clock fell further under the window kernel than under FlexAttention's (the
# benchmarks README has it). A later probe on an H200 timed each kernel in four patterns with NVML
# sampling the clock (`benchmarks/results/2026-11-28_h200_step07_overlap_probes.txt`, section 3): run
# back to back, the window kernel averaged 1878-1920 MHz and the ratio read 1.22-1.24x; with a short
# spin before each call, 1.30-1.31x; interleaved with FlexAttention, as a model interleaves attention
# with other kernels, 1.31-1.33x. The clock explains part of the drop, not all of it. None of the three is wrong: they answer different questions (a burst, or
# a sustained stream of calls), so a speed-up near its bar must hold under more than one before it
# counts.

# %% [markdown]
# ## Summary
#
# - One formula covers the variants: a mask function says which pairs are visible, a score modifier
#   changes visible logits; apply the score modifier first and the mask last, so that masked logits stay
#   $-\infty$ and a row that sees nothing gives $o = 0$, $\text{lse} = -\infty$.
# - Sliding window $i + \delta - W < j \le i + \delta$; ALiBi $s - m_h (i + \delta - j)$ with
#   $m_h = 2^{-8h/H}$; soft-capping $c \tanh(s / c)$; documents $\text{doc}[i] = \text{doc}[j] \wedge j \le i$;
#   prefix-LM $j \le i \vee j < P_b$. Combinations are `and` / `or` of masks and chains of modifiers, and
#   the order of the modifiers is part of the model.
# - A block mask classifies each (query tile, key tile) as full (no element mask), partial (element
#   mask) or empty (skipped), from one evaluation of the mask on every pair; the kernel gets, per query
#   tile, the lists of partial and full key tiles. FLOPs are $4D$ per visible pair; the tiles add work in
#   the partial ones, from a few percent (causal) to a quarter or more (short documents) at tiles of 128.
# - FP8: e4m3 (max 448, 3 mantissa bits) for the forward; scales per tensor or per block fold into the
#   softmax scale and the output; the error comes about equally from $Q$, $K$, $V$ and $\tilde P$; a random
#   Hadamard rotation of $Q$ and $K$ removes the extra error of outlier channels shared by $Q$ and $K$.
#
# **Next:** exercise 10 writes `flex_attention_triton`: lecture 05's kernel with a block mask's two tile
# lists, the mask and the score modifier applied on tiles.

# %%
print(f"lecture executed in {time.perf_counter() - CPU_START:.1f} s")
