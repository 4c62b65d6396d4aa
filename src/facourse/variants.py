"""Step 10: attention variants as a mask function and a score modifier, in Triton and in PyTorch.

A variant is two pieces (lecture 10, section 1): a **mask function** says which (query, key) pairs are
visible, a **score modifier** changes a visible logit; the score modifier is applied first, the mask
last. Each piece is a :class:`Mod`: its Triton function (called inside a kernel on a tile's indices),
its PyTorch twin (called on whole index grids by the reference and the block-mask check), and the
arguments both read (a window, ALiBi's slopes, a cap, the document of every token).

The Triton signatures, the same for every mask and every score modifier::

    @triton.jit
    def mask(b, h, i, j, Sq, Skv, INTS, FLOATS):          # -> a boolean block, broadcast of i and j
    @triton.jit
    def score_mod(s, b, h, i, j, Sq, Skv, INTS, FLOATS):   # -> s changed, same shape

``b`` and ``h`` are the program's batch and query head (scalars); ``i`` is a ``[BLOCK_M, 1]`` block of
query indices, ``j`` a ``[1, BLOCK_N]`` block of key indices; ``s`` is the ``[BLOCK_M, BLOCK_N]`` block
of logits ``scale * q . k`` in natural units (before any conversion to base 2). ``INTS`` (int32) and
``FLOATS`` (float32) point at the Mod's own arguments, ``Mod.ints`` and ``Mod.floats``. Masks follow
the course's bottom-right alignment: with ``delta = Skv - Sq`` query ``i`` sits at position ``i + delta``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from .configs import AttnConfig, get_config, make_inputs, resolve_device
from .rule import (AttentionCheckError, Mistake, check_lse, compare, describe_rows, diagnose, draw_seed,
                   expect_tensor, guarded_call, is_collecting, make_tag, max_abs, say)
# the Mods, the reference and block masks (re-exported: the exercise, its kernels and the tests import them here)
from .variant_mods import (Mod, all_visible_mask, causal_mask, sliding_window_mask, documents_mask, prefix_lm_mask,
                           identity_score, alibi_score, softcap_score, softcap_alibi_score, alibi_slopes, no_mask,
                           causal, sliding_window, documents, prefix_lm, no_score_mod, alibi, softcap, softcap_alibi,
                           index_grids, mask_values, variant_reference, BlockMask, tile_classes, lists_of,
                           reference_block_mask, classes_of_lists, visible_pairs)  # noqa: F401


# ----------------------------------------------------------------------------- the graded cases
def _doc_ids(lengths, S) -> torch.Tensor:
    """Token -> document for documents of the given lengths, repeated until S tokens."""
    ids, d = [], 0
    while len(ids) < S:
        for n in lengths:
            ids += [d] * n
            d += 1
    return torch.tensor(ids[:S])


@dataclass(frozen=True)
class VariantCase:
    """One graded variant: a configuration's shape (facourse.configs) and its mask and score modifier."""
    name: str
    config: str
    mask: str                      # "none", "causal", "window", "documents", "prefix"
    score: str = "none"            # "none", "alibi", "softcap", "softcap_alibi"
    window: int = 0                # on the GPU; on a CPU scaled with the sequence (see build)
    cap: float = 0.0
    doc_lengths: tuple = ()

    def build(self, device) -> tuple[AttnConfig, Mod | None, Mod | None]:
        cfg = get_config(self.config, device)
        if resolve_device(device).type != "cuda":
            # Triton's interpreter: four heads, one row (two where the mask reads b), at most 256 queries
            # and 512 keys; the shapes keep what the case is about (GQA or MQA, Sq < Skv or Sq > Skv)
            cfg = replace(cfg, B=2 if self.mask in ("documents", "prefix") else 1, Hq=4, Hkv=min(cfg.Hkv, 2),
                          Sq=min(cfg.Sq, 256), Skv=min(cfg.Skv, 512 if cfg.Skv > cfg.Sq else 256))
        B, Hq, Sq, Skv = cfg.B, cfg.Hq, cfg.Sq, cfg.Skv
        g = torch.Generator().manual_seed(len(self.name))
        mask = {"none": lambda: None, "causal": lambda: causal(Sq, Skv),
                "window": lambda: sliding_window(self.window, Sq, Skv),
                "documents": lambda: documents(torch.stack([_doc_ids(self.doc_lengths[b::B] or self.doc_lengths, Sq)
                                                            for b in range(B)])),
                "prefix": lambda: prefix_lm(torch.randint(0, Skv + 1, (B,), generator=g), Sq, Skv)}[self.mask]()
        score = {"none": None, "alibi": alibi(Hq, Sq, Skv), "softcap": softcap(self.cap),
                 "softcap_alibi": softcap_alibi(self.cap, Hq, Sq, Skv)}[self.score]
        return cfg, mask, score

    def describe(self, device=None) -> str:
        if not self.config:
            return self.name
        cfg, mask, score = self.build(device)
        parts = [mask.name if mask else "no mask"] + ([score.name] if score else [])
        return (f"{self.name}: {' + '.join(parts)} on {cfg.name} (B={cfg.B}, Hq={cfg.Hq}, Hkv={cfg.Hkv}, "
                f"Sq={cfg.Sq}, Skv={cfg.Skv}, D={cfg.D})")


#: The graded cases (hidden tests pick from them; ``check_variant(fn, name)`` runs one): the shapes of
#: facourse.configs' configurations on a GPU, cut down for the interpreter on a CPU (``build``). Windows
#: and documents are sized for the shorter sequences (128-512 tokens); "window_beyond" is wider than any.
VARIANT_CASES: dict[str, VariantCase] = {c.name: c for c in (
    VariantCase("causal", "small", "causal"),
    VariantCase("causal_asymmetric", "asymmetric", "causal"),
    VariantCase("window", "medium", "window", window=100),
    VariantCase("window_ragged", "ragged", "window", window=37),
    VariantCase("window_1", "small", "window", window=1),
    VariantCase("window_beyond", "noncausal", "window", window=5000),       # wider than the sequence
    VariantCase("window_empty_rows", "empty_rows", "window", window=40),    # Sq > Skv: rows with no key
    VariantCase("alibi", "large", "causal", "alibi"),
    VariantCase("softcap", "noncausal", "none", "softcap", cap=2.0),
    VariantCase("softcap_ragged", "ragged", "none", "softcap", cap=2.0),      # no mask: Sq, Skv bound the keys
    VariantCase("window_softcap", "medium", "window", "softcap", window=64, cap=2.0),
    VariantCase("documents_alibi", "medium", "documents", "alibi", doc_lengths=(1, 37, 200, 1, 90, 64, 119)),
    VariantCase("documents_short", "small", "documents", doc_lengths=(1, 1, 3, 1, 16, 2)),
    VariantCase("prefix", "asymmetric", "prefix"),
    VariantCase("softcap_alibi_window", "ragged", "window", "softcap_alibi", window=64, cap=3.0),
    VariantCase("mqa_window", "mqa", "window", window=48),
    VariantCase("d64_documents", "d64", "documents", "softcap", cap=2.0, doc_lengths=(30, 1, 97)),
)}


def make_variant_inputs(case: VariantCase, seed, device, dtype=None):
    cfg, mask, score = case.build(device)
    q, k, v = make_inputs(cfg, seed, device, dtype, layout="bshd")
    return cfg, mask, score, q, k, v


def _mistakes(case: VariantCase, cfg: AttnConfig, mask, score, q, k, v, scale, block_mask: BlockMask | None = None,
              right: torch.Tensor | None = None) -> list[Mistake]:
    """The classic mistakes of this case, each with the output it gives (a reference, computed only when
    the diagnosis gets to it), to name the one a wrong result matches. With ``block_mask`` the kernel
    was given those lists: a mistake computes the pairs they let through; ``right`` is the right o."""
    B, Hq, Sq, Skv = cfg.B, cfg.Hq, cfg.Sq, cfg.Skv
    out = []

    def add(cause, m=mask, sm=score, tiles=None, **kw):     # tiles: the block-sparse kernel's, at bm x bn
        if block_mask is not None and tiles is not None:    # the tiles are the given lists' (_kernel_mistakes)
            return
        def visible():
            if block_mask is not None:                      # the wrong mask (None: none) on the partial tiles
                return {"visible": visible_pairs(block_mask, m, B, Hq, q.device)}
            return {} if tiles is None else {"visible": _listed(mask, B, Hq, Sq, Skv, *tiles, q.device)}
        out.append(Mistake(cause, lambda: {"o": variant_reference(q, k, v, m, sm, scale, **kw, **visible())[0]}))
    if case.mask == "window":
        for W, how in ((case.window + 1, "one key too many"), (case.window - 1, "one key too few")):
            if W >= 1:
                add(f"the window is off by one ({how}): query i sits at position p = i + Skv - Sq and sees keys "
                    f"p - W < j <= p, W = {case.window} keys with its own", m=sliding_window(W, Sq, Skv))
    if case.mask == "documents":
        add("tokens see keys of earlier documents: the documents leak across a boundary; a pair is visible only "
            "when doc[b, i] == doc[b, j] (and j <= i)", m=causal(Sq, Skv))
    if score is not None and case.score in ("alibi", "softcap_alibi"):
        slopes = torch.tensor(alibi_slopes(Hq), dtype=torch.float64)
        G = Hq // k.shape[1]
        d = Skv - Sq
        for wrong, why in (
                (-slopes, "ALiBi's bias has the wrong sign: it must lower the logit of a key by m_h times its "
                          "distance, s - m_h * (i + Skv - Sq - j), so that far keys count less; adding it makes "
                          "the farthest keys win"),
                (slopes.flip(0), "in reverse order"),
                (torch.tensor([2.0 ** (-8.0 * h / Hq) for h in range(Hq)]),
                 "of head h taken as 2^(-8h/H) instead of 2^(-8(h+1)/H)"),
                (slopes[torch.arange(Hq) // G], "indexed by the KV head instead of the query head")):
            mod = Mod("wrong ALiBi", None, (lambda w: lambda s_, b, h, i, j: s_ - w.to(s_.device)[h] * (i + d - j))(wrong))
            if case.score == "softcap_alibi":
                mod = Mod("wrong", None, (lambda m2: lambda s_, b, h, i, j: m2.ref(case.cap * torch.tanh(s_ / case.cap),
                                                                                   b, h, i, j))(mod))
            add(why if why.startswith("ALiBi") else f"ALiBi's slope per head is wrong: the slopes are {why} (head h, "
                "counted from 0, takes m = 2^(-8(h+1)/Hq) for a power-of-two Hq)", sm=mod)
    if score is not None and "softcap" in case.score:
        why = ("the soft cap is applied after the mask: cap * tanh(-inf / cap) = -cap makes the masked pairs "
               "visible again; apply the score modifier first, then the mask")
        add(why, mask_first=True)
        if mask is not None:            # ... in the tiles a block-sparse kernel visits only
            masked_first = Mod("mask, then score_mod", None, lambda s_, b, h, i, j: score.ref(
                s_.masked_fill(~mask.ref(b, h, i, j), -math.inf), b, h, i, j))
            for bm, bn in TILE_SIZES:
                add(why, m=None, sm=masked_first, tiles=(bm, bn))
    if score is not None:
        add("the score modifier is not applied (or not where the tile is full)", sm=None)
        log2e = 1.4426950408889634
        add("the score modifier saw logits already in base 2 (multiplied by log2 e): call it on scale * q.k in "
            "natural units, then convert to base 2",
            sm=Mod("base 2", None, lambda s_, b, h, i, j: score.ref(s_ * log2e, b, h, i, j) / log2e))
    if 1 < k.shape[1] < Hq:
        heads = torch.arange(Hq, device=k.device) % k.shape[1]
        out.append(Mistake("the query heads map to the wrong KV head: query head h reads KV head h // (Hq // Hkv) "
                           "(the heads of a group are consecutive), not h % Hkv", lambda: {"o": variant_reference(
                               q, k[:, heads], v[:, heads], mask, score, scale, visible=None if block_mask is None
                               else visible_pairs(block_mask, mask, B, Hq, q.device))[0]}))
    if mask is not None:
        add("the mask function is not applied" + ("" if block_mask is None else " on any tile: a partial tile is "
            "treated as full; the partial tiles need the element mask, only the full ones may skip it"), m=None)
        for bm, bn in TILE_SIZES:
            add(f"a partial tile is treated as full (tiles of {bm} x {bn}): the tiles the mask cuts through need the "
                "element mask, only the full ones may skip it", tiles=(bm, bn))
    if mask is None:                # keys past Skv loaded as zeros and kept: score_mod(0), in the softmax's sum
        for bn in sorted({bn for _, bn in TILE_SIZES}, reverse=True):
            if Skv % bn:
                pad = (0, 0, 0, -Skv % bn)
                out.append(Mistake(
                    f"the keys past Skv = {Skv} are not masked (tiles of {bn} keys): the last tile's out-of-range "
                    "keys load as zeros and count in the softmax with score score_mod(0). Keep j < Skv in every "
                    "tile, with or without a mask function", lambda pad=pad: {"o": variant_reference(
                        q, torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad), None, score, scale)[0]}))
    return out + _kernel_mistakes(mask, score, q, k, v, scale, block_mask, right)


def _kernel_mistakes(mask, score, q, k, v, scale, block_mask: BlockMask | None, right=None) -> list[Mistake]:
    """A block-sparse kernel's own mistakes, tile by tile: on the lists of ``block_mask`` when it was given
    one, else on the mask's own at each of TILE_SIZES (the kernel builds its own). A mistake that changes
    nothing on these inputs raises: the diagnosis skips it (a right result is never named a mistake)."""
    B, Hq, Sq = q.shape[:3]
    Skv, G = k.shape[2], Hq // k.shape[1]
    dev = q.device
    if block_mask is not None:
        tilings = [(functools.cache(lambda: classes_of_lists(block_mask).to(dev)), block_mask.BLOCK_M,
                    block_mask.BLOCK_N, f"the block mask of {block_mask.BLOCK_M} x {block_mask.BLOCK_N} it was given")]
    else:
        tilings = [(functools.cache(lambda bm=bm, bn=bn: tile_classes(mask, B, Hq, Sq, Skv, bm, bn, dev)), bm, bn,
                    f"tiles of {bm} x {bn}") for bm, bn in TILE_SIZES]
    mv = (lambda m: mask_values(m, B, Hq, Sq, Skv, dev))

    def right_o():
        if right is None:
            return variant_reference(q, k, v, mask, score, scale, visible=None if block_mask is None else
                                     visible_pairs(block_mask, mask, B, Hq, dev))[0]
        return right

    def pairs(cls, bm, bn):                  # a tile's class on each of its pairs, [B, Hq, Sq, Skv]
        cls = cls.expand(B, Hq, *cls.shape[2:])
        return cls.repeat_interleave(bm, 2).repeat_interleave(bn, 3)[..., :Sq, :Skv]

    def kernel(c, mask_on=(1,), score_on=(1, 2), m=mask, sm=score):
        """o of a kernel visiting the tiles of pair classes ``c``, its mask on the classes ``mask_on``,
        its score modifier on ``score_on``."""
        mval = mv(m)
        vis = ((c == 1) & (mval if 1 in mask_on else True)) | ((c == 2) & (mval if 2 in mask_on else True))
        if sm is not None and tuple(score_on) != (1, 2):
            on = (c == score_on[0]) if len(score_on) == 1 else c > 0
            sm = Mod(sm.name, None, (lambda f: lambda s_, b, h, i, j: torch.where(on, f(s_, b, h, i, j), s_))(sm.ref))
        return variant_reference(q, k, v, None, sm, scale, visible=vis)[0]

    def unless_right(o):
        if torch.equal(o, right_o()):
            raise ValueError("this mistake changes nothing here")
        return {"o": o}

    out = []
    # the mods given the wrong head: h = 0, or the KV head (ALiBi's own message, above, comes first)
    for wrong, who in ((lambda h: torch.zeros_like(h), "get head 0 for every query head (h = 0)"),
                       (lambda h: h // G, "get the KV head h // (Hq // Hkv) instead of the query head h")):
        def produce(wrong=wrong):
            m2 = None if mask is None else Mod(mask.name, None, lambda b, h, i, j: mask.ref(b, wrong(h), i, j))
            s2 = None if score is None else Mod(score.name, None,
                                                lambda s_, b, h, i, j: score.ref(s_, b, wrong(h), i, j))
            if block_mask is None:
                return unless_right(variant_reference(q, k, v, m2, s2, scale)[0])
            cls = classes_of_lists(block_mask).to(dev)
            return unless_right(kernel(pairs(cls, block_mask.BLOCK_M, block_mask.BLOCK_N), m=m2, sm=s2))
        out.append(Mistake(f"the mask and the score modifier {who}: call them with the program's query head "
                           "h = bh % Hq (ALiBi's slope is the query head's)", produce))

    for classes, bm, bn, tiles in tilings:
        if score is not None:
            def produce(classes=classes, bm=bm, bn=bn):
                c = pairs(classes(), bm, bn)
                if not bool((c == 2).any()):
                    raise ValueError("no full tile")
                return {"o": kernel(c, score_on=(1,))}
            out.append(Mistake(f"the score modifier is applied on partial tiles only ({tiles}): a full tile skips "
                               "the mask function, never the score modifier; call score_mod on every tile", produce))
        if block_mask is not None:       # with the mask's own lists these are right, or "a partial tile ... as full"
            out.append(Mistake(
                f"the mask function is applied on the tiles listed as full too ({tiles}): harmless with the mask's "
                "own lists, whose full tiles see every pair, but a kernel must follow the lists it is given: the "
                "mask on the partial tiles only", lambda classes=classes, bm=bm, bn=bn: unless_right(
                    kernel(pairs(classes(), bm, bn), mask_on=(1, 2)))))
            out.append(Mistake(
                f"the mask function is applied on the tiles listed as full and skipped on the partial ones ({tiles}): "
                "the PARTIAL switch of the two loops is swapped", lambda classes=classes, bm=bm, bn=bn: unless_right(
                    kernel(pairs(classes(), bm, bn), mask_on=(2,)))))
        # the row of the lists a program reads, ((b % Bm) * Hm + h % Hm) * Tq + t, from the wrong batch or head
        for rows, who in (((lambda b: b * 0, None), "ignores the batch: every batch reads batch 0's lists"),
                          ((None, lambda h: h * 0), "ignores the head: every head reads head 0's lists"),
                          ((None, lambda h: h // G), "takes the KV head: query head h reads the lists of head "
                                                     "h // (Hq // Hkv)"),
                          ((lambda b: b * 0, lambda h: h * 0), "ignores the batch and the head: every program "
                                                               "reads the lists of batch 0, head 0")):
            def produce(classes=classes, bm=bm, bn=bn, rows=rows):
                cls = classes()
                cls = cls.expand(B, Hq, *cls.shape[2:])
                wrong = cls[rows[0](torch.arange(B, device=dev)) if rows[0] else slice(None)]
                wrong = wrong[:, rows[1](torch.arange(Hq, device=dev))] if rows[1] else wrong
                if torch.equal(wrong, cls):
                    raise ValueError("the same lists")
                return unless_right(kernel(pairs(wrong, bm, bn)))
            out.append(Mistake(f"the row of the block mask {who} ({tiles}); query tile t of batch b and query head "
                               "h reads row ((b % Bm) * Hm + h % Hm) * Tq + t", produce))

    # no guard while a row's max is -inf: its first tile, all masked for it, gives exp(-inf - (-inf)) = NaN
    orders = (("partial tiles first", lambda c: torch.where(c == 1, 0, 1)), ("in key order", lambda c: c * 0),
              ("full tiles first", lambda c: torch.where(c == 2, 0, 1)))
    for classes, bm, bn, tiles in tilings:
        @functools.cache
        def seen(classes=classes, bm=bm, bn=bn):      # bool [B, Hq, Sq, Tk]: the row sees a key of the tile
            c = pairs(classes(), bm, bn)
            vis = (c == 2) | ((c == 1) & mv(mask))
            Tk = classes().shape[-1]
            return torch.nn.functional.pad(vis, (0, Tk * bn - Skv)).reshape(B, Hq, Sq, Tk, bn).any(-1)
        for empty_listed in ((False, True) if block_mask is None else (False,)):
            for order, rank in orders:
                def produce(classes=classes, bm=bm, seen=seen, rank=rank, empty_listed=empty_listed):
                    cls = classes().expand(B, Hq, -1, -1)
                    Tk = cls.shape[-1]
                    if empty_listed:
                        cls = torch.where(cls == 0, 1, cls)
                    rows = cls.repeat_interleave(bm, 2)[:, :, :Sq]                  # [B, Hq, Sq, Tk]
                    key = torch.where(rows > 0, rank(rows) * Tk + torch.arange(Tk, device=dev), 2 * Tk + 1)
                    first = key.argmin(-1, keepdim=True)
                    nan = (rows > 0).any(-1) & ~seen().gather(-1, first)[..., 0]
                    if not bool(nan.any()):
                        raise ValueError("no row meets a tile with all its keys masked first")
                    return {"o": right_o().masked_fill(nan[..., None], math.nan)}
                out.append(Mistake(
                    f"a row met a tile where all its keys are masked before it saw any key ({tiles}, {order}"
                    + (", and the block mask lists empty tiles as partial: the kernel visits tiles where no pair is "
                       "visible" if empty_listed else "") + "): its max m is still -inf, and exp(s - m) = "
                    "exp(-inf - (-inf)) is NaN; while m is -inf, subtract 0 instead", produce))
    return out


#: The tile sizes a diagnosis tries (a student's kernel may use any of them); the notebook's own 64 x 64 first,
#: the likelier where two sizes explain a result.
TILE_SIZES = ((64, 64), (128, 64), (128, 128), (64, 32), (32, 32), (16, 16))


def _listed(mask, B, Hq, Sq, Skv, bm, bn, device) -> torch.Tensor:
    """bool [B, Hq, Sq, Skv]: the pairs of every tile that is not empty, at tiles of bm x bn."""
    cls = tile_classes(mask, B, Hq, Sq, Skv, bm, bn, device)
    return (cls > 0).repeat_interleave(bm, 2).repeat_interleave(bn, 3)[..., :Sq, :Skv]


def check_variant_result(o, lse, case: VariantCase, cfg, mask, score, q, k, v, scale=None, *, seed=None,
                         block_mask: BlockMask | None = None, mistakes: tuple = ()) -> dict:
    """Check (o, lse) of ``case`` with the course's rule (``facourse.rule.compare``): finite, rows that see
    no key exactly 0 with lse -inf, no worse than twice PyTorch's own rounding error in the inputs' dtype
    (+1e-3), relative error below 1%. With ``block_mask`` the reference is what that block mask lets
    through; ``mistakes`` are tried before the case's own to name the cause of a wrong result."""
    tag = make_tag(case.name, seed)
    if is_collecting():
        return {}
    B, Hq, Sq, D = q.shape
    expect_tensor(o, q, name="o", like_name="q", tag=tag, shape_note=" = [B, Hq, Sq, D]")     # lse: check_lse
    visible = None if block_mask is None else visible_pairs(block_mask, mask, B, Hq, q.device)
    ref, ref_lse = variant_reference(q, k, v, mask, score, scale, visible=visible)
    empty = torch.isneginf(ref_lse)
    def own():                  # the same computation with the matmuls' inputs in the kernel's dtype
        return max_abs(variant_reference(q, k, v, mask, score, scale, visible=visible, dtype=q.dtype)[0].double() - ref)
    cmp = compare(o, ref, own, name="o", tag=tag, empty=empty[..., None])
    found = None if cmp.ok else diagnose({"o": o}, {"o"}, [*mistakes, *_mistakes(case, cfg, mask, score, q, k, v, scale,
                                                                                  block_mask, ref)], cmp.allowed)
    if cmp.failure == "nonfinite":
        cause = ("these rows see no key: o must be 0 and lse -inf (guard l == 0 and exp(m_old - m_new) while m is "
                 "-inf)" if not bool((cmp.nonfinite_rows & ~empty).any()) else found.cause if found else
                 "a masked logit became NaN or +inf: a score modifier applied to -inf, or a tile read past the end")
        raise AttentionCheckError(f"{tag} o has NaN or inf at {describe_rows(cmp.nonfinite_rows)}\n  case: "
                                  f"{case.describe(q.device)}\n  likely cause: {cause}")
    if cmp.failure == "not_empty":
        raise AttentionCheckError(f"{tag} rows that see no key must be exactly 0 (lse -inf); wrong at "
                                  f"{describe_rows(cmp.not_empty_rows)}\n  case: {case.describe(q.device)}"
                                  + (f"\n  likely cause: {found.cause}" if found else ""))
    if cmp.failure == "values":
        raise cmp.error(found.cause if found else "compare with facourse.variants.variant_reference on the same "
                        "inputs: the order score_mod, then mask; the tile lists; the bottom-right offset Skv - Sq",
                        what="o is wrong", where=f"{describe_rows(cmp.bad_rows)}\n  case: {case.describe(q.device)}",
                        index_names=("b", "h", "row", "d"))
    lse_err = check_lse(lse, ref_lse, q, tag)
    return {"max_abs_err": cmp.max_err, "allowed": cmp.allowed, "lse_err": lse_err}


def call_o_lse(fn, tag, q, k, v, **kwargs):
    """``fn(q, k, v, **kwargs)`` through the guarded call (seed, NaN-filled allocator), its result a pair (o, lse)."""
    result = guarded_call(fn, q, k, v, tag=tag, inputs={"q": q, "k": k, "v": v}, **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AttentionCheckError(f"{tag} the function must return a pair (o, lse), got {type(result).__name__}")
    return result


def check_variant(fn, case: str | VariantCase, *, seed: int | None = None, device=None, dtype=None, scale=None,
                  verbose: bool = True) -> None:
    """Call ``fn(q, k, v, mask=..., score_mod=...[, scale=])`` on the inputs of ``case`` (a name of
    VARIANT_CASES) and check ``(o, lse)`` against the float64 reference. Raises AttentionCheckError with
    the likely cause; prints one line on success."""
    device = resolve_device(device)
    c = VARIANT_CASES[case] if isinstance(case, str) else case
    seed = draw_seed(seed)
    cfg, mask, score, q, k, v = make_variant_inputs(c, seed, device, dtype)
    o, lse = call_o_lse(fn, f"[{c.name}]", q, k, v, mask=mask, score_mod=score, **({} if scale is None else {"scale": scale}))
    rep = check_variant_result(o, lse, c, cfg, mask, score, q, k, v, scale, seed=seed)
    if verbose and rep:
        say(f"[{c.name}] passed ({c.describe(device)}): max|o-ref| {rep['max_abs_err']:.2e}, allowed "
            f"{rep['allowed']:.2e}; lse err {rep['lse_err']:.2e}")


def check_block_mask(fn, case: str | VariantCase = "window", *, seed: int | None = None, device=None,
                     blocks=((128, 64), (64, 64), (32, 16)), verbose: bool = True) -> None:
    """Call the block-mask builder ``fn(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device)`` for ``case``'s mask at
    several tile sizes and compare the classes it says with the mask's own (full: every pair visible;
    partial: some; empty: none, not listed). Raises AttentionCheckError naming the wrong tiles."""
    device = resolve_device(device)
    c = VARIANT_CASES[case] if isinstance(case, str) else case
    cfg, mask, _ = c.build(device)
    B, H = (cfg.B, cfg.Hq) if c.mask in ("documents", "prefix") else (1, 1)
    # the builder gets the mask with a PyTorch twin that answers one pair only (what mask_extent asks):
    # the tiles' classes must come from the mask's Triton function, not from the course's reference
    given = None if mask is None else Mod(mask.name, mask.fn, _one_pair_only(mask.ref), mask.ints, mask.floats)
    for bm, bn in blocks:
        tag = f"[{c.name}, block mask {bm} x {bn}]"
        got = fn(given, B, H, cfg.Sq, cfg.Skv, bm, bn, device)
        if is_collecting():
            continue
        if not isinstance(got, tuple) or len(got) != len(BlockMask._fields):
            raise AttentionCheckError(f"{tag} the builder must return a facourse.variants.BlockMask, got "
                                      f"{type(got).__name__}")
        got = BlockMask(*got)
        want = tile_classes(mask, B, H, cfg.Sq, cfg.Skv, bm, bn, device)
        Tq, Tk = want.shape[-2:]
        shape = getattr(got.partial_num, "shape", None)
        Bm, Hm = (shape[0], shape[1]) if shape is not None and len(shape) == 3 else (0, 0)
        for name, want_shape in (("partial_num", (Bm, Hm, Tq)), ("full_num", (Bm, Hm, Tq)),
                                 ("partial_idx", (Bm, Hm, Tq, Tk)), ("full_idx", (Bm, Hm, Tq, Tk))):
            t = getattr(got, name)
            if Bm not in (1, B) or Hm not in (1, H) or not isinstance(t, torch.Tensor) or tuple(t.shape) != want_shape:
                raise AttentionCheckError(f"{tag} {name} must be a tensor [B or 1, H or 1, Tq{', Tk' * name.endswith('idx')}] "
                                          f"with B={B}, H={H}, Tq={Tq}, Tk={Tk}; got {getattr(t, 'shape', type(t).__name__)}")
        if tuple(got[4:]) != (bm, bn, cfg.Sq, cfg.Skv):
            raise AttentionCheckError(f"{tag} BLOCK_M, BLOCK_N, Sq, Skv are {tuple(got[4:])}, not {(bm, bn, cfg.Sq, cfg.Skv)}")
        said = classes_of_lists(got).to(want.device).expand(B, H, Tq, Tk)
        if not torch.equal(said, want):
            tiles = torch.nonzero(said != want)[:4].tolist()
            names = {0: "empty", 1: "partial", 2: "full"}
            what = "; ".join(f"query tile {t[2]}, key tile {t[3]}" + (f" (b={t[0]}, h={t[1]})" if B * H > 1 else "")
                             + f": {names[int(said[tuple(t)])]}, should be {names[int(want[tuple(t)])]}" for t in tiles)
            kinds = {(int(said[tuple(t)]), int(want[tuple(t)])) for t in torch.nonzero(said != want).tolist()}
            cause = ("a partial tile is treated as full: a tile is full only when EVERY pair in it is visible "
                     "(and inside the sequence); the kernel skips the mask function on full tiles"
                     if (2, 1) in kinds else
                     "a tile with visible pairs is left out (the kernel would never read its keys): check the "
                     "tiles that reach past Sq or Skv, and the indices the mask sees" if (0, 1) in kinds or (0, 2) in kinds
                     else "an empty tile is listed as full: the kernel would attend to pairs the mask hides (it skips "
                     "the mask function on full tiles); a tile is full only when EVERY pair in it is visible"
                     if (2, 0) in kinds else "; ".join(why for kind, why in (
                         ((1, 2), "full tiles classified partial (correct, but the mask is evaluated for nothing)"),
                         ((1, 0), "empty tiles listed as partial (correct, but the kernel loads and masks tiles where "
                                  "no pair is visible): a tile with no visible pair is EMPTY, in neither list"))
                                                   if kind in kinds) if kinds <= {(1, 2), (1, 0)}
                     else "evaluate the mask on every pair of the tile and count the visible ones")
            raise AttentionCheckError(f"{tag} {int((said != want).sum())} tiles are misclassified, e.g. {what}.\n"
                                      f"  likely cause: {cause}")
    if verbose:
        say(f"[{c.name}] block masks passed at tiles {', '.join(f'{a} x {b}' for a, b in blocks)}")


def _one_pair_only(ref):
    def twin(b, h, i, j):
        if i.numel() > 1 or j.numel() > 1:
            raise AttentionCheckError(
                "[block mask] the builder evaluated the mask's PyTorch twin (mask.ref) on the tiles' indices: "
                "classify the tiles with the mask's Triton function (mask.fn) in your kernel; the twin only "
                "says, on one pair, whether the mask reads b or h (mask_extent)")
        return ref(b, h, i, j)
    return twin


def perturbed_block_mask(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, seed, device) -> BlockMask:
    """The block mask of ``mask`` with about a third of its listed tiles dropped and some partial and
    full tiles swapped, from ``seed``: a kernel that follows the lists computes exactly
    ``visible_pairs`` of it; one that computes every tile, or applies the mask everywhere, does not."""
    cls = tile_classes(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device).cpu()
    g = torch.Generator().manual_seed(int(seed))
    r = torch.rand(cls.shape, generator=g)
    cls = torch.where((cls > 0) & (r < 0.3), 0, cls)                              # dropped
    cls = torch.where((cls > 0) & (r > 0.8), 3 - cls, cls)                         # partial <-> full
    Tk = cls.shape[-1]
    in_bounds = (torch.arange(Tk) * BLOCK_N + BLOCK_N <= Skv)                      # a full tile stays inside Skv
    cls = torch.where((cls == 2) & ~in_bounds, 1, cls)
    return BlockMask(*(t.to(device) if isinstance(t, torch.Tensor) else t
                       for t in lists_of(cls, BLOCK_M, BLOCK_N, Sq, Skv)))


def check_tile_lists(fn, case: str | VariantCase = "window", *, seed: int | None = None, device=None,
                     blocks=(64, 64), verbose: bool = True) -> None:
    """Evidence that the kernel visits exactly the tiles of its block mask: ``fn(q, k, v, mask=...,
    score_mod=..., block_mask=bm)`` with a block mask whose lists were changed (tiles dropped, partial and
    full swapped) must compute what those lists let through (``visible_pairs``), not the mask itself."""
    device = resolve_device(device)
    c = VARIANT_CASES[case] if isinstance(case, str) else case
    seed = draw_seed(seed)
    cfg, mask, score, q, k, v = make_variant_inputs(c, seed, device)
    bm = perturbed_block_mask(mask, cfg.B, cfg.Hq, cfg.Sq, cfg.Skv, *blocks, seed, device)
    tag = f"[{c.name}, a changed block mask]"
    o, lse = call_o_lse(fn, tag, q, k, v, mask=mask, score_mod=score, block_mask=bm)
    if is_collecting():
        return
    ignored = Mistake("the result is that of the mask, not of the block mask it was given: the kernel computes tiles "
                      "the lists leave out. A block-sparse kernel "
                      "visits, for each query tile, exactly its partial_idx[:partial_num] and full_idx[:full_num] "
                      "key tiles, and applies the mask function on the partial ones only",
                      lambda: {"o": variant_reference(q, k, v, mask, score)[0]})
    check_variant_result(o, lse, replace(c, name=f"{c.name}, a changed block mask"), cfg, mask, score, q, k, v,
                         seed=seed, block_mask=bm, mistakes=(ignored,))
    if verbose:
        print(f"[{c.name}] the kernel follows its block mask ({int((classes_of_lists(bm) > 0).sum())} tiles listed)")


# ----------------------------------------------------------------------------- speed (GPU)
#: The perf cases (fp16, D = 128, Hq = Hkv = 16, B·S = 32k): a 1024-token sliding window at 8k and 16k,
#: and plain causal at 8k, where a block-mask kernel must keep step 05's speed.
PERF_CASES: dict[str, tuple] = {          # name: (B, H, S, mask kind, window)
    "window1024_8k": (4, 16, 8192, "window", 1024),
    "window1024_16k": (2, 16, 16384, "window", 1024),
    "causal_8k": (4, 16, 8192, "causal", 0),
}


#: The tiles of the block mask the perf cells pass (128 x 64: step 05's best causal tile on an H100).
PERF_TILES = (128, 64)     # (measured: 128 x 128 tiles ran out of shared memory with v4's two loops)


def perf_case(name: str):
    """(config, mask) of a perf case; FLOPs count the visible pairs only."""
    B, H, S, kind, W = PERF_CASES[name]
    cfg = AttnConfig(name, B, H, H, S, S, 128, True)
    return cfg, (sliding_window(W, S, S) if kind == "window" else causal(S, S))


def perf_flops(name: str) -> int:
    cfg, mask = perf_case(name)
    pairs = int(mask_values(mask, 1, 1, cfg.Sq, cfg.Skv).sum())
    return 4 * cfg.B * cfg.Hq * cfg.D * pairs


def flex_reference(mask: Mod, B, H, Sq, Skv, device="cuda"):
    """PyTorch's FlexAttention, compiled, on ``mask`` (its block mask built once, tiles of 128): a
    function of the course's signature returning o (the reference of the perf cells)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(lambda b, h, i, j: mask.ref(b, h, i, j), None, None, Sq, Skv, device=device)

    def run(q, k, v, mask=None, score_mod=None, scale=None, **_):
        return flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    run.last_backend = "FLEX (compiled)"
    return run


def bench_variant(fn, case: str = "window1024_8k", *, backend: str = "FLEX", rounds: int = 25, warmup: int = 5,
                  seed: int = 0):
    """Time ``fn(q, k, v, mask=...)`` against compiled FlexAttention (``backend="FLEX"``) or SDPA's
    ``backend`` (causal cases only) on a perf case, with the course's bench (facourse.bench.time_calls);
    TFLOP/s on visible pairs. Returns a facourse.bench.BenchResult."""
    import statistics

    from .bench import BenchResult, new_flush_buffer, sdpa_reference, time_calls
    from .hw import gpu_name, require_gpu

    require_gpu(what="benchmarking")
    cfg, mask = perf_case(case)
    q, k, v = make_inputs(cfg, seed, "cuda", torch.float16, layout="bhsd")
    if backend == "FLEX":
        ref = flex_reference(mask, cfg.B, cfg.Hq, cfg.Sq, cfg.Skv)
        ref_call = lambda: ref(q, k, v)                                          # noqa: E731
    else:
        if PERF_CASES[case][3] != "causal":
            raise ValueError(f"SDPA has no sliding window: time {case} against backend='FLEX'")
        ref, _ = sdpa_reference(backend)
        ref_call = lambda: ref(q, k, v, causal=True)                             # noqa: E731
    # Both sides get their block mask built once, outside the timing, as a model builds it once for all
    # its layers: FlexAttention's from create_block_mask (tiles of 128), ours from the mask (PERF_TILES)
    bm = reference_block_mask(mask, 1, 1, cfg.Sq, cfg.Skv, *PERF_TILES, device="cuda")
    calls = {"s": lambda: fn(q, k, v, mask=mask, block_mask=bm), "r": ref_call}
    gpu, host = time_calls(calls, max(rounds, 20), new_flush_buffer(), warmup)
    ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
    flops = perf_flops(case)
    return BenchResult(f"{case} (B={cfg.B}, H={cfg.Hq}, S={cfg.Sq}, D=128, {mask.name})", gpu_name(), "float16",
                       getattr(ref, "last_backend", backend), ts, tr, flops / ts / 1e9, flops / tr / 1e9, tr / ts,
                       statistics.median(host["s"]), statistics.median(host["r"]))


def check_perf_variant(fn, case: str, *, seed: int | None = None, device=None) -> None:
    """The correctness half of a perf cell: ``fn`` on the perf case at full size (one batch, a quarter
    of the heads, to keep the float64 reference small)."""
    device = resolve_device(device)
    seed = draw_seed(seed)
    cfg, mask = perf_case(case)
    small = replace(cfg, B=1, Hq=4, Hkv=4)
    q, k, v = make_inputs(small, seed, device, torch.float16 if device.type == "cuda" else None, layout="bshd")
    o, lse = call_o_lse(fn, f"[{case}]", q, k, v, mask=mask)
    c = VariantCase(case, "", PERF_CASES[case][3], window=PERF_CASES[case][4])
    check_variant_result(o, lse, c, small, mask, None, q, k, v, seed=seed)
