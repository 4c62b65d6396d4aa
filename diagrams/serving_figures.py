"""Step 15 figures: serving (course/15_serving).

- ``varlen_packing``: five sequences of 7, 3, 12, 5 and 9 tokens. Top, padded to the longest into a
  ``[B, max_len]`` batch (the padding hatched); middle, packed one after another into ``[total, H, D]``,
  with ``cu_seqlens`` (the offsets where each sequence starts) marked; bottom, the grid
  ``(cdiv(max_seqlen, BLOCK_M), B)`` of one head with BLOCK_M = 4: each program's packed rows, and the
  programs whose tile starts past their sequence's end, which exit at once. Lecture 15 packs the same
  five sequences in PyTorch.
- ``chunked_prefill_batch``: one step of a server with chunked prefill: two sequences decode one token
  each, one prefills the second chunk of its prompt, one the first chunk of another; their new tokens are
  packed into one ``q`` (``cu_seqlens_q``), their keys and values are read from step 09's paged cache
  through the block table (``seq_lens`` counts the new tokens too), and each sequence's mask is causal,
  aligned bottom-right. Lecture 15 builds the same batch in PyTorch.
- ``mla_absorption``: DeepSeek-V2's multi-head latent attention at decode. Left, the explicit form: each
  cached latent ``c_j`` (512 numbers) is up-projected into every head's key and value; right, the absorbed
  form: ``W_UK`` moves into the query and ``W_UV`` into the output, and all heads attend over the latent
  itself (plus the shared 64-number RoPE key). A schematic; the dimensions are DeepSeek-V2's (the
  paper's §2.1 and its model hyper-parameters).

Sources: Tri Dao, "FlashAttention-2" (ICLR 2024) and ``flash_attn_varlen_func`` of the flash-attention
package (cu_seqlens, max_seqlen, bottom-right causal); Agrawal et al., "Taming Throughput-Latency Tradeoff
in LLM Inference with Sarathi-Serve" (OSDI 2024): chunked prefill; Kwon et al. (SOSP 2023): the paged
cache; DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model"
(2024): MLA.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402

SEQ = ["#4a90d9", "#16a085", "#8e44ad", "#e67e22", "#c0392b"]
PAD = "#dddddd"
IDLE = "#f2f2f2"

# varlen_packing's example (lecture 15, section 2, packs the same five sequences)
LENGTHS = [7, 3, 12, 5, 9]
BLOCK_M = 4

# chunked_prefill_batch's example (lecture 15, section 4): (seq_len after this step, new tokens this step)
PAGE = 4
MIXED = [(11, 1), (16, 8), (6, 1), (5, 5)]
MIXED_ROLE = ["decode", "prefill,\ntokens 8-15", "decode", "prefill,\ntokens 0-4"]
MIXED_TABLE = [[3, 9, 0], [6, 1, 10, 4], [7, 2], [5, 8]]      # physical page of each logical page
NUM_PAGES = 12


def _cumsum(xs):
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _box(ax, x, y, w, h, text, color, fs=8.5, tc="black", lw=0.9, ls="-"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=INK, lw=lw, ls=ls))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def _arrow(ax, p, q, color=INK, lw=1.1, ms=9, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=ms, color=color, lw=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))


# ----------------------------------------------------------------------------- padded vs packed
def varlen_packing(out):
    B, Lmax, total = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
    cu = _cumsum(LENGTHS)
    cw, ch = 0.36, 0.34
    fig, ax = plt.subplots(figsize=(13.5, 6.9))
    # --- top: padded
    top = 10.2
    ax.text(0, top + 0.12, f"padded: [B, max_len, H, D] = [{B}, {Lmax}, H, D]: {B * Lmax} rows, {total} of them real",
            fontsize=10, weight="bold")
    for b, L in enumerate(LENGTHS):
        y = top - (b + 1) * (ch + 0.06)
        ax.text(-0.15, y + ch / 2, f"seq {b}", ha="right", va="center", fontsize=8)
        for t in range(Lmax):
            real = t < L
            ax.add_patch(Rectangle((t * cw, y), cw, ch, fc=SEQ[b] if real else PAD, ec="white" if real else "#999999",
                                   lw=0.6, hatch=None if real else "////", alpha=0.9 if real else 1))
    ax.text(Lmax * cw + 0.3, top - 3 * (ch + 0.06), "hatched: padding. A kernel on this layout computes\n"
            "scores for it (then masks them), and reads and\nwrites its rows of q, k, v, o", fontsize=8, va="center")
    # --- middle: packed
    ym = top - B * (ch + 0.06) - 1.35
    ax.text(0, ym + 0.6, f"packed: [total, H, D] = [{total}, H, D]; sequence b is rows cu_seqlens[b] : cu_seqlens[b+1]",
            fontsize=10, weight="bold")
    pw = 0.3
    for b, L in enumerate(LENGTHS):
        for t in range(L):
            x = (cu[b] + t) * pw
            ax.add_patch(Rectangle((x, ym), pw, ch, fc=SEQ[b], ec="white", lw=0.6, alpha=0.9))
    for b, c in enumerate(cu):
        ax.plot([c * pw, c * pw], [ym - 0.12, ym + ch + 0.12], color=INK, lw=1.6)
        ax.text(c * pw, ym - 0.2, str(c), ha="center", va="top", fontsize=8.5, weight="bold")
    ax.text(total * pw + 0.35, ym + ch / 2, f"cu_seqlens = {cu}  (int32, B + 1 entries)\n"
            f"max_seqlen = {Lmax}", fontsize=9, va="center", family="monospace")
    # --- bottom: the grid of one head
    yg = ym - 1.2
    nm = -(-Lmax // BLOCK_M)
    ax.text(0, yg + 0.35, f"the grid (cdiv(max_seqlen, BLOCK_M), B, H) for one head, BLOCK_M = {BLOCK_M}: "
            f"{nm * B} programs, {sum(-(-L // BLOCK_M) for L in LENGTHS)} with rows to do",
            fontsize=10, weight="bold")
    gw, gh = 2.05, 0.5
    for b, L in enumerate(LENGTHS):
        x = b * (gw + 0.15)
        ax.text(x + gw / 2, yg - 0.05, f"b = {b} (len {L})", ha="center", va="top", fontsize=8)
        for m in range(nm):
            y = yg - 0.3 - (m + 1) * (gh + 0.08)
            start = m * BLOCK_M
            if start < L:
                rows = min(BLOCK_M, L - start)
                lo, hi = cu[b] + start, cu[b] + start + rows - 1
                label = (f"m={m}: rows {lo}-{hi}" if hi > lo else f"m={m}: row {lo}") + \
                    ("" if rows == BLOCK_M else f"\n({rows} of {BLOCK_M}, rest masked)")
                _box(ax, x, y, gw, gh, label, SEQ[b], fs=7, tc="white")
            else:
                _box(ax, x, y, gw, gh, f"m={m}: {start} >= {L}, exits", IDLE, fs=7, tc="#777777", ls="--")
    ax.text(B * (gw + 0.15) + 0.1, yg - 0.3 - nm * (gh + 0.08) / 2,
            "each program reads cu_seqlens[b], cu_seqlens[b+1]\n(for keys: cu_seqlens_k) and returns at once\n"
            "when m * BLOCK_M >= its sequence's length:\nno host sync, the grid's size needs only\nmax_seqlen",
            fontsize=8, va="center")
    ax.set_xlim(-1.0, 13.4)
    ax.set_ylim(yg - 0.45 - nm * (gh + 0.08), top + 0.4)
    ax.axis("off")
    fig.tight_layout()
    return _save(fig, "varlen_packing", out)


# ----------------------------------------------------------------------------- one mixed batch
def chunked_prefill_batch(out):
    B = len(MIXED)
    lq = [n for _, n in MIXED]
    cu = _cumsum(lq)
    fig, ax = plt.subplots(figsize=(13.5, 8.0))
    cw, ch = 0.36, 0.42
    top = 9.6
    # --- packed q
    ax.text(0, top + 0.6, f"packed q: the batch's new tokens, [total_q = {cu[-1]}, Hq, D]", fontsize=10,
            weight="bold")
    for b, n in enumerate(lq):
        for t in range(n):
            ax.add_patch(Rectangle(((cu[b] + t) * cw, top), cw, ch, fc=SEQ[b], ec="white", lw=0.6, alpha=0.95))
    for c in cu:
        ax.plot([c * cw, c * cw], [top - 0.1, top + ch + 0.1], color=INK, lw=1.5)
        ax.text(c * cw, top - 0.17, str(c), ha="center", va="top", fontsize=8.5, weight="bold")
    ax.text(cu[-1] * cw + 0.4, top + ch / 2, f"cu_seqlens_q = {cu}\nseq_lens     = {[L for L, _ in MIXED]}\n"
            f"max_seqlen_q = {max(lq)}", fontsize=9, va="center", family="monospace")
    # --- each sequence's keys, page by page
    y0 = top - 1.4
    ax.text(0, y0 + 0.55, "each sequence's keys and values, pages of 4 slots", fontsize=10, weight="bold")
    rows_y = []
    for b, (L, n) in enumerate(MIXED):
        y = y0 - b * 0.95
        rows_y.append(y)
        ax.text(-0.15, y + ch / 2, f"seq {b}\n{MIXED_ROLE[b]}", ha="right", va="center", fontsize=7.5)
        for p in range(-(-L // PAGE)):
            x0 = p * (PAGE * cw + 0.12)
            for s in range(PAGE):
                t = p * PAGE + s
                if t < L:
                    new = t >= L - n
                    ax.add_patch(Rectangle((x0 + s * cw, y), cw, ch, fc=SEQ[b], ec="white", lw=0.6,
                                           alpha=0.95 if new else 0.35))
                    ax.text(x0 + (s + 0.5) * cw, y + ch / 2, str(t), ha="center", va="center", fontsize=6.5,
                            color="white" if new else INK)
                else:
                    ax.add_patch(Rectangle((x0 + s * cw, y), cw, ch, fc="white", ec="#999999", lw=0.5))
    # --- the block table and the pool
    bx = 7.4
    ax.text(bx, y0 + ch + 0.3, "block_table", fontsize=9, weight="bold")
    cellw = 0.5
    owner = {pg: b for b, row in enumerate(MIXED_TABLE) for pg in row}
    cell_xy = {}
    for b, row in enumerate(MIXED_TABLE):
        y = rows_y[b]
        for p in range(4):
            has = p < len(row)
            ax.add_patch(Rectangle((bx + p * cellw, y), cellw, ch, fc=SEQ[b] if has else "white", ec=INK, lw=0.7,
                                   alpha=0.9 if has else 1))
            ax.text(bx + (p + 0.5) * cellw, y + ch / 2, str(row[p]) if has else "–", ha="center", va="center",
                    fontsize=8.5, color="white" if has else INK)
            ax.text(bx + (p + 0.5) * cellw, y + ch + 0.04, f"p={p}", ha="center", va="bottom", fontsize=6,
                    color="#777777")
            if has:
                cell_xy[(b, p)] = (bx + 4 * cellw + 0.08, y + ch / 2 + (1.5 - p) * 0.09)
    px, pw, ph = 11.3, 1.7, 0.3
    ax.text(px - 0.1, y0 + ch + 0.3, "page pool", fontsize=9, weight="bold")
    ypage = {}
    for pg in range(NUM_PAGES):
        y = y0 + 0.1 - pg * 0.33
        b = owner.get(pg)
        _box(ax, px, y, pw, ph * 0.9, f"page {pg}" + (f": seq {b}" if b is not None else ": free"),
             SEQ[b] if b is not None else IDLE, fs=7, tc="white" if b is not None else "#777777")
        ypage[pg] = y + ph * 0.45
    for (b, p), (x, y) in cell_xy.items():
        _arrow(ax, (x, y), (px - 0.03, ypage[MIXED_TABLE[b][p]]), color=SEQ[b], lw=0.7, ms=6)
    ax.text(0, rows_y[-1] - 0.3, "light: cached by earlier steps; dark: the new tokens, written into their pages "
            "before the kernel runs; white: free slots of a last page", fontsize=8, va="top")
    # --- the masks
    ym = rows_y[-1] - 1.25
    ax.text(0, ym + 0.25, "each sequence's mask: query i (of Lq) sees key j (of Lk = seq_len) iff j <= i + Lk - Lq",
            fontsize=10, weight="bold")
    s = 0.2
    x = 0.0
    for b, (L, n) in enumerate(MIXED):
        for i in range(n):
            for j in range(L):
                vis = j <= i + L - n
                ax.add_patch(Rectangle((x + j * s, ym - (i + 1) * s), s, s, fc=SEQ[b] if vis else "white",
                                       ec="#bbbbbb", lw=0.3, alpha=0.9 if vis else 1))
        ax.text(x + L * s / 2, ym - n * s - 0.12, f"seq {b}: Lq = {n}, Lk = {L}", ha="center", va="top", fontsize=8)
        x += L * s + 0.45
    ax.text(x + 0.1, ym - 0.8, "a decode is the row Lq = 1 (sees\neverything); a chunk is the bottom of\n"
            "its prompt's causal triangle, with the\nwhole cached prefix to its left", fontsize=8, va="center")
    ax.set_xlim(-1.6, px + pw + 0.2)
    ax.set_ylim(ym - 8 * s - 0.6, top + 1.0)
    ax.axis("off")
    fig.tight_layout()
    return _save(fig, "chunked_prefill_batch", out)


# ----------------------------------------------------------------------------- MLA, explicit vs absorbed
def mla_absorption(out):
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13.5, 5.4))
    lat, rope, q, hd, out_c = "#16a085", "#f0ad4e", "#8e44ad", "#4a90d9", "#c0392b"
    for a in (ax, bx):
        a.set_xlim(0, 10)
        a.set_ylim(0, 7.2)
        a.axis("off")
    # --- explicit
    ax.set_title("explicit: up-project every cached latent, per head", fontsize=10.5)
    _box(ax, 0.2, 5.4, 2.5, 0.9, "cache, per token $j$:\n$c_j$ (512), $k^R_j$ (64)", lat, fs=9, tc="white")
    _box(ax, 3.3, 5.9, 3.0, 0.75, r"$k^C_{j,i} = W^{UK}_i c_j$  (128)", hd, fs=9, tc="white")
    _box(ax, 6.8, 4.7, 3.0, 0.75, r"$v_{j,i} = W^{UV}_i c_j$  (128)", hd, fs=9, tc="white")
    _arrow(ax, (2.7, 6.05), (3.3, 6.25))
    _arrow(ax, (2.7, 5.6), (6.8, 5.05))
    _box(ax, 0.2, 3.3, 2.5, 0.9, "query of head $i$:\n$q^C_i$ (128), $q^R_i$ (64)", q, fs=9, tc="white")
    _box(ax, 3.3, 3.3, 3.3, 0.9, r"$s_j = q^C_i \cdot k^C_{j,i} + q^R_i \cdot k^R_j$" + "\n"
         r"$p = \mathrm{softmax}(s / \sqrt{192})$", "#d6eaf8", fs=9)
    _arrow(ax, (2.7, 3.75), (3.3, 3.75))
    _arrow(ax, (4.8, 5.9), (4.8, 4.2))
    _box(ax, 3.3, 1.7, 6.5, 0.9, r"$o_i = \sum_j p_j v_{j,i}$  (128),   $u = W^O [o_1; \ldots; o_{128}]$", out_c,
         fs=9, tc="white")
    _arrow(ax, (4.9, 3.3), (4.9, 2.6))
    _arrow(ax, (8.3, 4.7), (8.3, 2.6))
    ax.text(0.2, 0.9, "per token of context and per head: two 512 x 128 products before attention can start;\n"
            "or keep the up-projected K and V, and lose what the latent cache saved", fontsize=8.3, va="center")
    # --- absorbed
    bx.set_title("absorbed: $W^{UK}$ into the query, $W^{UV}$ into the output", fontsize=10.5)
    _box(bx, 0.2, 5.4, 2.5, 0.9, "query of head $i$:\n$q^C_i$ (128), $q^R_i$ (64)", q, fs=9, tc="white")
    _box(bx, 3.2, 5.4, 3.3, 0.9, r"$\tilde q_i = W^{UK\top}_i q^C_i$  (512)" + "\nonce per query, not per token", q,
         fs=9, tc="white")
    _arrow(bx, (2.7, 5.85), (3.2, 5.85))
    _box(bx, 7.0, 5.4, 2.8, 0.9, "cache, per token $j$:\n$c_j$ (512), $k^R_j$ (64)", lat, fs=9, tc="white")
    _box(bx, 3.2, 3.3, 6.6, 0.9, r"$s_j = \tilde q_i \cdot c_j + q^R_i \cdot k^R_j$   (key $[c_j; k^R_j]$: 576)" + "\n"
         r"$p = \mathrm{softmax}(s / \sqrt{192})$: the same scores as the explicit form", "#d6eaf8", fs=9)
    _arrow(bx, (4.8, 5.4), (4.8, 4.2))
    _arrow(bx, (8.4, 5.4), (8.4, 4.2))
    _box(bx, 3.2, 1.7, 3.5, 0.9, r"$\tilde o_i = \sum_j p_j c_j$  (512)" + "\nvalue = the latent itself", lat, fs=9,
         tc="white")
    _box(bx, 7.2, 1.7, 2.6, 0.9, r"$o_i = W^{UV}_i \tilde o_i$" + "\n(folded into $W^O$)", out_c, fs=9, tc="white")
    _arrow(bx, (4.9, 3.3), (4.9, 2.6))
    _arrow(bx, (6.7, 2.15), (7.2, 2.15))
    bx.text(0.2, 0.9, "all 128 query heads attend over one shared 'KV head' of 576 (keys) / 512 (values):\n"
            "multi-query attention on the latent; the cache is read once for every head", fontsize=8.3,
            va="center")
    fig.text(0.01, 0.0, "Dimensions of DeepSeek-V2 (2024): 128 heads of 128, latent d_c = 512, decoupled RoPE "
             "key and query parts of 64. The RoPE part cannot be absorbed: the rotation depends on the "
             "positions of query and key.", fontsize=7.8, color="#444444")
    fig.tight_layout()
    return _save(fig, "mla_absorption", out)


FIGURES = {f.__name__: f for f in (varlen_packing, chunked_prefill_batch, mla_absorption)}
