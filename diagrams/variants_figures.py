"""Step 10 figures: attention variants as mask functions and score modifiers (course/10_attention_variants).

- ``block_masks``: five masks on one 48 x 48 grid of (query, key) pairs cut into 8 x 8 tiles (6 x 6
  tiles): causal, sliding window (W = 12), documents packed in one row (lengths 10, 17, 6, 15, causal
  inside each), prefix-LM (a bidirectional prefix of 14 tokens, causal after) and the sliding window
  intersected with the documents. Each tile is coloured by its class in the block mask: full (every
  pair visible: no element mask), partial (the element mask is applied) or empty (skipped: never
  loaded). Inside full and partial tiles the visible pairs are the dark cells. Under each panel, the
  counts of its tile classes and of its visible pairs, computed here from the mask.
- ``score_mods``: left, ALiBi's bias -m_h (i - j) against the distance i - j for H = 8 heads (slopes
  2^(-8h/H), h = 1..H) and for H = 12, whose slopes are those of the power of two below (8) followed
  by every other slope of the power of two above (16) (Press, Smith, Lewis, "Train Short, Test Long",
  ICLR 2022, and the authors' reference code). Right, logit soft-capping cap * tanh(s / cap) for the
  cap Gemma 2 uses in its attention layers (50) and a smaller one, against no cap (Gemma Team, "Gemma 2:
  Improving Open Language Models at a Practical Size", 2024).
- ``fp8_formats``: the bit fields of fp16, bf16 and the two 8-bit formats of Hopper's tensor cores,
  e4m3 (the "fn" variant: no infinities, one NaN pattern per sign, so the top exponent still holds
  numbers) and e5m2 (IEEE-like), with the largest finite value, the smallest normal and subnormal
  values and the relative step 2^-m, all computed from the field widths (Micikevicius et al., "FP8
  Formats for Deep Learning", 2022). Lecture 10 checks the same numbers against ``torch.finfo``.

FIGURES maps a figure name to fn(out_dir) -> path, like diagrams/draw.py, which draws these too.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from figstyle import INK, save as _save  # noqa: E402
COL = dict(full="#4a90d9", diag="#f5b041", skip="#eeeeee")

# The block_masks example (lecture 10 uses the same numbers for its first pictures).
N, TILE, WINDOW, PREFIX = 48, 8, 12, 14
DOC_LENS = [10, 17, 6, 15]


def _doc_ids():
    return np.repeat(np.arange(len(DOC_LENS)), DOC_LENS)


def figure_masks():
    i = np.arange(N)[:, None]                  # query index (Sq = Skv: bottom-right = top-left here)
    j = np.arange(N)[None, :]                  # key index
    doc = _doc_ids()
    causal = j <= i
    window = causal & (j > i - WINDOW)
    same_doc = doc[:, None] == doc[None, :]
    return {
        "causal": causal,
        f"sliding window, W = {WINDOW}": window,
        f"documents {DOC_LENS}, causal": same_doc & causal,
        f"prefix-LM, prefix = {PREFIX}": causal | (j < PREFIX),
        "window and documents": window & same_doc,
    }


def tile_classes(mask, tile):
    """[Tq, Tk] array of 0 empty, 1 partial, 2 full."""
    T = mask.shape[0] // tile
    t = mask.reshape(T, tile, T, tile).transpose(0, 2, 1, 3).reshape(T, T, tile * tile)
    return np.where(t.all(-1), 2, np.where(t.any(-1), 1, 0))


def _rgb(hex_color):
    return np.array([int(hex_color[k:k + 2], 16) / 255 for k in (1, 3, 5)])


def block_masks(out):
    masks = figure_masks()
    fig, axs = plt.subplots(1, len(masks), figsize=(3.1 * len(masks), 4.4))
    light = {0: _rgb(COL["skip"]), 1: 0.35 * _rgb(COL["diag"]) + 0.65, 2: 0.35 * _rgb(COL["full"]) + 0.65}
    dark = {1: 0.75 * _rgb(COL["diag"]), 2: 0.8 * _rgb(COL["full"])}
    for ax, (title, m) in zip(axs, masks.items()):
        cls = tile_classes(m, TILE)
        img = np.zeros((N, N, 3))
        for a in range(N):
            for b in range(N):
                c = cls[a // TILE, b // TILE]
                img[a, b] = dark[c] if (m[a, b] and c) else light[c]
        ax.imshow(img, interpolation="nearest", extent=(0, N, N, 0))
        for t in range(0, N + 1, TILE):
            ax.axhline(t, color=INK, lw=0.6)
            ax.axvline(t, color=INK, lw=0.6)
        ax.set_xticks(range(0, N + 1, TILE))
        ax.set_yticks(range(0, N + 1, TILE))
        ax.tick_params(labelsize=6.5, length=2)
        ax.set_title(title, fontsize=9)
        n = cls.size
        ax.set_xlabel(f"key j\nfull {int((cls == 2).sum())}, partial {int((cls == 1).sum())}, "
                      f"empty {int((cls == 0).sum())} of {n} tiles\n"
                      f"visible pairs {int(m.sum())} of {N * N} ({m.mean():.0%})", fontsize=8)
    axs[0].set_ylabel("query i", fontsize=8.5)
    handles = [Rectangle((0, 0), 1, 1, fc=COL[k], ec=INK) for k in ("full", "diag", "skip")]
    fig.legend(handles, ["full tile: computed, no element mask", "partial tile: computed, element mask applied",
                         "empty tile: skipped, never loaded"], loc="upper center", ncol=3, fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 0.95))
    fig.suptitle(f"Block masks: {N} queries x {N} keys in {TILE} x {TILE} tiles; dark cells = visible (query, key) pairs",
                 fontsize=10.5)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return _save(fig, "block_masks", out)


def alibi_slopes(H):
    """ALiBi's head slopes: 2^(-8h/H) for a power of two H; otherwise the power of two below, then
    every other slope of the power of two above, up to H slopes."""
    def pow2(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    n = 1 << (H.bit_length() - 1)
    return pow2(n) if n == H else pow2(n) + pow2(2 * n)[0::2][:H - n]


def score_mods(out):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.9))
    dist = np.arange(0, 65)
    cmap = plt.get_cmap("viridis")
    for H, ls in ((8, "-"), (12, ":")):
        for h, m in enumerate(alibi_slopes(H)):
            a.plot(dist, -m * dist, ls, color=cmap(h / (H - 1)), lw=1.3,
                   label=f"H = {H}" if h == 0 else None)
    a.set_xlabel("distance i - j (keys behind the query)")
    a.set_ylabel("bias added to the logit")
    a.set_ylim(-33, 1)
    a.set_title("ALiBi: bias -m_h (i - j); solid H = 8, dotted H = 12\n"
                "(slopes from 1/2 (steepest) to 1/256; colour = head)", fontsize=9.5)
    a.legend(fontsize=8, loc="lower left")
    a.grid(alpha=0.3)
    s = np.linspace(-120, 120, 481)
    b.plot(s, s, color="#999999", ls="--", lw=1, label="no cap")
    for cap, c in ((50.0, COL["full"]), (20.0, COL["diag"])):
        b.plot(s, cap * np.tanh(s / cap), color=c, lw=2, label=f"cap = {cap:g}" + (" (Gemma 2's attention)" if cap == 50 else ""))
        b.axhline(cap, color=c, lw=0.6, ls=":")
        b.axhline(-cap, color=c, lw=0.6, ls=":")
    b.set_xlabel("logit s")
    b.set_ylabel("cap · tanh(s / cap)")
    b.set_title("logit soft-capping: about s for |s| << cap, never beyond ±cap", fontsize=9.5)
    b.legend(fontsize=8, loc="upper left")
    b.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, "score_mods", out)


# name, exponent bits, mantissa bits, has infinities (IEEE top exponent reserved)
FORMATS = [("fp16", 5, 10, True), ("bf16", 8, 7, True), ("fp8 e4m3 (fn)", 4, 3, False), ("fp8 e5m2", 5, 2, True)]


def format_numbers(e, m, ieee):
    """(largest finite, smallest normal, smallest subnormal, relative step 2^-m) of a binary format."""
    bias = 2 ** (e - 1) - 1
    if ieee:                                   # top exponent = inf / NaN
        emax, top_mant = (2 ** e - 2) - bias, 2 - 2.0 ** -m
    else:                                      # e4m3fn: only S.1111.111 is NaN
        emax, top_mant = (2 ** e - 1) - bias, 2 - 2 * 2.0 ** -m
    return top_mant * 2.0 ** emax, 2.0 ** (1 - bias), 2.0 ** (1 - bias - m), 2.0 ** -m


def fp8_formats(out):
    fig, ax = plt.subplots(figsize=(12, 3.9))
    cw, rh = 0.42, 0.62
    colors = dict(s="#d9534f", e="#4a90d9", m="#5cb85c")
    for r, (name, e, m, ieee) in enumerate(FORMATS):
        y = -r * 0.95
        ax.text(-0.2, y + rh / 2, name, ha="right", va="center", fontsize=10, weight="bold")
        fields = [("s", 1)] + [("e", e)] + [("m", m)]
        x = 0.0
        for kind, n in fields:
            for _ in range(n):
                ax.add_patch(Rectangle((x, y), cw, rh, fc=colors[kind], ec="white", lw=1.2, alpha=0.9))
                x += cw
        big, norm, sub, step = format_numbers(e, m, ieee)
        ax.text(16 * cw + 0.4, y + rh / 2,
                f"{e} exponent, {m} mantissa bits (bias {2 ** (e - 1) - 1})   max {big:,.6g}   min normal {norm:.3g}   "
                f"min subnormal {sub:.3g}   step {step:.3g}" + ("" if ieee else "   (no inf; S.1111.111 = NaN)"),
                va="center", fontsize=8.5)
    for kind, lab, x in (("s", "sign", 0.0), ("e", "exponent", 1.3), ("m", "mantissa", 3.3)):
        ax.add_patch(Rectangle((x, 0.95), 0.3, 0.25, fc=colors[kind], ec="white"))
        ax.text(x + 0.38, 1.07, lab, va="center", fontsize=9)
    ax.text(6.0, 1.07, "step = 2^-m: the spacing of the numbers in [1, 2), i.e. twice the largest relative "
            "rounding error", va="center", fontsize=8.5, color="#444444")
    ax.set_xlim(-2.0, 16 * cw + 13.5)
    ax.set_ylim(-3 * 0.95 - 0.2, 1.4)
    ax.axis("off")
    ax.set_title("16- and 8-bit floating-point formats (value = (-1)^s · 1.m · 2^(e - bias); subnormals 0.m · 2^(1 - bias))",
                 fontsize=10.5)
    return _save(fig, "fp8_formats", out)


FIGURES = {f.__name__: f for f in (block_masks, score_mods, fp8_formats)}
