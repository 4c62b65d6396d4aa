"""Step 09 figures: decoding with a paged KV cache (course/09_decode_paged_kv).

- ``paged_kv_cache``: three sequences of a batch with page size 4. Left, each sequence's logical
  token positions cut into logical pages (the first two pages of sequences 0 and 1 are the same
  8-token prompt prefix). Middle, the block table ``[B, max_pages]``: logical page p of sequence b
  lives in physical page ``block_table[b, p]``; unused slots are never read. Right, the physical page
  pool ``k_cache[num_pages, page_size, Hkv, D]`` (and ``v_cache`` alike): pages in no particular
  order, the prefix pages referenced from two rows, free pages anywhere. Below, the same table in
  FlashInfer's compressed form (indptr, indices, last_page_len; FlashInfer documentation,
  ``flashinfer.page``).
- ``flash_decoding_split``: top, one (sequence, KV head) with its G query heads packed into one
  tile; the L cached keys cut into S chunks, one program per chunk producing a partial (o_s, lse_s),
  and a second kernel merging them with lecture 03's merge. Bottom, the SMs of an H100 (132) busy
  with a one-program-per-query-tile grid (B·Hq programs) against a split-KV grid (B·Hkv·S programs),
  for B = 1, Hq = 32, Hkv = 8. A schematic: no timing is drawn.

Flash-decoding: Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for
long-context inference" (2023). Paged KV cache: Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention" (SOSP 2023).

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402
SEQ = ["#4a90d9", "#16a085", "#8e44ad"]          # sequences 0, 1, 2
SHARED = "#f0ad4e"                                # the shared prefix pages
FREE = "#eeeeee"
HBM = "#d9534f"

# The example of the paged_kv_cache figure (lecture 09 builds the same one in PyTorch).
PAGE = 4
SEQ_LENS = [11, 14, 6]
PREFIX_PAGES = 2                                  # sequences 0 and 1 share their first 2 pages
BLOCK_TABLE = [[7, 2, 9], [7, 2, 0, 5], [11, 4]]  # physical page of each logical page
NUM_PAGES = 12

# The SM panel of flash_decoding_split: B = 1, Hq = 32, Hkv = 8, 16 splits, an H100's 132 SMs.
SMS, B, HQ, HKV, SPLITS = 132, 1, 32, 8, 16


def _box(ax, x, y, w, h, text, color, fs=9, tc="black", lw=1.0, alpha=1.0, ls="-"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec=INK, lw=lw,
                                alpha=alpha, ls=ls))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def _arrow(ax, p, q, color=INK, lw=1.2, ms=10, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=ms, color=color, lw=lw,
                                 linestyle=ls, connectionstyle=f"arc3,rad={rad}"))


def _owner(page):
    """Colour and label of a physical page: which sequence(s) reference it."""
    users = [b for b, row in enumerate(BLOCK_TABLE) if page in row]
    if len(users) > 1:
        return SHARED, "shared " + ",".join(map(str, users))
    if users:
        return SEQ[users[0]], f"seq {users[0]}"
    return FREE, "free"


def paged_kv_cache(out):
    fig, ax = plt.subplots(figsize=(13.5, 6.6))
    cw, ch, row_gap = 0.32, 0.62, 1.35                 # token cell, row pitch
    top = 6.0
    # --- left: logical tokens of each sequence
    ax.text(0.0, top + 1.0, "logical token positions (page size 4)", fontsize=10, weight="bold")
    for b, L in enumerate(SEQ_LENS):
        y = top - b * row_gap
        ax.text(-0.15, y + ch / 2, f"seq {b}\nlen {L}", ha="right", va="center", fontsize=8.5)
        n_pages = -(-L // PAGE)
        for p in range(n_pages):
            x0 = p * (PAGE * cw + 0.18)
            shared = b < 2 and p < PREFIX_PAGES
            for t in range(PAGE):
                pos = p * PAGE + t
                used = pos < L
                fc = (SHARED if shared else SEQ[b]) if used else "white"
                ax.add_patch(Rectangle((x0 + t * cw, y), cw, ch, fc=fc, ec=INK, lw=0.5, alpha=0.9 if used else 1))
                if used:
                    ax.text(x0 + (t + 0.5) * cw, y + ch / 2, str(pos), ha="center", va="center", fontsize=6.5,
                            color="white" if not shared else "black")
            ax.text(x0 + PAGE * cw / 2, y - 0.17, f"page {p}", ha="center", va="top", fontsize=7)
    ax.text(0.0, top - 3 * row_gap + 0.25,
            "orange: the 8-token prompt prefix that seqs 0 and 1 share; white: slots of a last page not yet written",
            fontsize=7.5, va="top")

    # --- middle: the block table
    bx = 7.3
    ax.text(bx, top + 1.0, "block_table [B, max_pages]", fontsize=10, weight="bold")
    cellw = 0.55
    for p in range(4):
        ax.text(bx + (p + 0.5) * cellw, top + ch + 0.08, f"p={p}", ha="center", fontsize=7.5)
    cells = {}
    for b, row in enumerate(BLOCK_TABLE):
        y = top - b * row_gap
        for p in range(4):
            has = p < len(row)
            fc = (_owner(row[p])[0] if has else "white")
            ax.add_patch(Rectangle((bx + p * cellw, y), cellw, ch, fc=fc, ec=INK, lw=0.8, alpha=0.9 if has else 1))
            ax.text(bx + (p + 0.5) * cellw, y + ch / 2, str(row[p]) if has else "–", ha="center", va="center",
                    fontsize=9, color="white" if has and fc != SHARED else "black", weight="bold" if has else None)
            if has:
                cells[(b, p)] = (bx + (p + 0.5) * cellw + 0.16, y + ch / 2 - 0.12)
        ax.text(bx, y - 0.1, f"seq_lens[{b}] = {SEQ_LENS[b]}", va="top", fontsize=8)
    ax.text(bx, top - 3 * row_gap + 0.25, "token t of seq b: page block_table[b, t // 4], slot t % 4\n"
            "'–': never read (t >= seq_lens[b])", fontsize=7.5, va="top")

    # --- right: the physical pool
    px, pw, ph = 11.6, 1.55, 0.42
    ax.text(px - 0.2, top + 1.0, "physical pages k_cache[num_pages, 4, Hkv, D]", fontsize=10, weight="bold")
    ypage = {}
    for pg in range(NUM_PAGES):
        y = top + 0.3 - (pg + 1) * 0.5
        fc, label = _owner(pg)
        _box(ax, px, y, pw, ph, f"page {pg}: {label}", fc, fs=7.5,
             tc="white" if fc not in (FREE, SHARED) else "black", alpha=0.9)
        ypage[pg] = y + ph / 2
    # arrows from the table to the pool (the shared ones from both rows)
    for (b, p), (x, y) in cells.items():
        pg = BLOCK_TABLE[b][p]
        fc = _owner(pg)[0]
        ax.plot([x], [y], marker="o", ms=3, color=INK, zorder=5)
        _arrow(ax, (x, y), (px - 0.03, ypage[pg]), color="#b9770e" if fc == SHARED else fc, lw=1.0, ms=8)
    # --- below: FlashInfer's compressed form
    indptr = [0]
    for row in BLOCK_TABLE:
        indptr.append(indptr[-1] + len(row))
    indices = [pg for row in BLOCK_TABLE for pg in row]
    last = [L - (-(-L // PAGE) - 1) * PAGE for L in SEQ_LENS]
    yb = top - 3 * row_gap - 0.95
    ax.text(0.0, yb, "the same table, compressed (FlashInfer's paged layout):", fontsize=9.5, weight="bold")
    ax.text(0.0, yb - 0.45, f"kv_indptr = {indptr}      (pages of seq b: kv_indices[indptr[b] : indptr[b+1]])",
            fontsize=9, family="monospace")
    ax.text(0.0, yb - 0.85, f"kv_indices = {indices}", fontsize=9, family="monospace")
    ax.text(0.0, yb - 1.25, f"kv_last_page_len = {last}      (length = (pages - 1) * 4 + last_page_len)",
            fontsize=9, family="monospace")
    ax.set_xlim(-1.0, px + pw + 0.3)
    ax.set_ylim(yb - 1.6, top + 1.3)
    ax.axis("off")
    fig.tight_layout()
    return _save(fig, "paged_kv_cache", out)


def _split_merge(ax):
    S, L = 4, 16                                       # chunks, key cells drawn
    cw = 0.55
    x0, y_kv = 1.2, 4.2
    # the packed query tile
    _box(ax, -1.55, y_kv + 0.05, 1.9, 1.1, "Q tile: the G query\nheads of KV head h\n(G·Sq rows)", "#c39bd3", fs=7.5)
    ax.text(x0 + L * cw / 2, y_kv + 1.55, f"K, V of one (sequence, KV head): L keys, cut into {S} chunks",
            ha="center", fontsize=9.5)
    cols = ["#4a90d9", "#16a085", "#f0ad4e", "#8e44ad"]
    per = L // S
    for j in range(L):
        s = j // per
        ax.add_patch(Rectangle((x0 + j * cw, y_kv + 0.6), cw, 0.55, fc=cols[s], ec="white", lw=1, alpha=0.85))
        ax.add_patch(Rectangle((x0 + j * cw, y_kv), cw, 0.55, fc=cols[s], ec="white", lw=1, alpha=0.55))
    ax.text(x0 - 0.1, y_kv + 0.87, "K", ha="right", va="center", fontsize=9)
    ax.text(x0 - 0.1, y_kv + 0.27, "V", ha="right", va="center", fontsize=9)
    # one program per chunk
    yp = 2.35
    for s in range(S):
        xc = x0 + (s * per + per / 2) * cw
        _arrow(ax, (xc, y_kv - 0.05), (xc, yp + 0.95), color=cols[s], lw=1.6)
        _box(ax, xc - 0.95, yp, 1.9, 0.9, f"program s={s}\no_{s}, lse_{s}", cols[s], fs=8, tc="white")
    ax.text(x0 + L * cw + 0.25, yp + 0.45, "pass 1: split-KV kernel\ngrid (B·Hkv, S): each program\n"
            "a partial over its chunk,\nnormalised over it, in fp32", fontsize=8, va="center")
    # the merge
    ym = 0.2
    xm = x0 + L * cw / 2
    for s in range(S):
        xc = x0 + (s * per + per / 2) * cw
        _arrow(ax, (xc, yp - 0.05), (xm + (s - 1.5) * 0.5, ym + 1.05), color=cols[s], lw=1.2, ls="--")
    _box(ax, xm - 3.0, ym, 6.0, 1.0, "lse = log Σ_s exp(lse_s)\no = Σ_s exp(lse_s − lse) · o_s", HBM, fs=9.5,
         tc="white")
    ax.text(x0 + L * cw + 0.25, ym + 0.5, "pass 2: merge kernel\n(lecture 03's ⊕); an empty\nchunk has lse = −∞, "
            "weight 0", fontsize=8, va="center")
    ax.set_xlim(-1.8, x0 + L * cw + 3.4)
    ax.set_ylim(-0.1, y_kv + 1.9)
    ax.axis("off")
    ax.set_title("flash-decoding: split the keys, merge the partials", fontsize=10.5)


def _sm_strip(ax, y, busy, label, color):
    per_row = 33
    for i in range(SMS):
        r, c = divmod(i, per_row)
        ax.add_patch(Rectangle((c * 0.3, y - r * 0.3), 0.26, 0.26, fc=color if i < busy else FREE, ec=INK, lw=0.3))
    ax.text(0, y + 0.42, label, fontsize=8.5)


def flash_decoding_split(out):
    fig = plt.figure(figsize=(12.5, 8.2))
    a = fig.add_axes([0.02, 0.36, 0.96, 0.62])
    _split_merge(a)
    b = fig.add_axes([0.06, 0.0, 0.9, 0.33])
    n05 = B * HQ
    nsplit = B * HKV * SPLITS
    _sm_strip(b, 3.1, n05, f"one program per (query tile, batch, head), step 05's grid: B·Hq = {n05} programs "
              f"of one row each on {SMS} SMs; {SMS - n05} SMs idle, each KV head loaded by {HQ // HKV} programs", "#4a90d9")
    _sm_strip(b, 1.0, min(nsplit, SMS), f"split-KV with GQA packing: B·Hkv·S = {B}·{HKV}·{SPLITS} = {nsplit} "
              f"programs, each reading 1/{SPLITS} of one KV head once for its {HQ // HKV} query heads", "#16a085")
    b.text(0, -0.25, f"B = {B} sequence, Hq = {HQ}, Hkv = {HKV}, H100 ({SMS} SMs); one square per SM, "
           "filled when a program runs on it (one wave)", fontsize=8, color="#555555")
    b.set_xlim(-0.1, 33 * 0.3 + 0.2)
    b.set_ylim(-0.45, 3.75)
    b.axis("off")
    return _save(fig, "flash_decoding_split", out)


FIGURES = {f.__name__: f for f in (paged_kv_cache, flash_decoding_split)}
