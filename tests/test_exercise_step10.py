"""Step 10, attention variants: the exercise as it is graded (CPU tier), and the check's diagnoses.

The exercise's solution, put into the released notebook, scores every point a CPU can give (the
block-mask builder and the kernel through the judge; bf16 and speed need a GPU and score 0 here,
saying why); the untouched stub scores 0 (``GRADING``, graded by tests/test_exercise_grading.py in
one autograde run with the other steps'). Each classic mistake a student's kernel can make, planted
in the solution's cells, loses the points of a test whose message names it (``PLANTED``, through the
judge in one process). The mistakes that live in a mask function or a score modifier (a window off
by one, ALiBi's slopes, documents that leak into each other) are the student's when they write their
own: ``check_variant`` must name them too, here on PyTorch stand-ins that compute the wrong variant.
The GPU tier (every test, perf included) is ``python -m autograder.gpu_selftest 10``.
"""
from __future__ import annotations

import pytest
import torch

from conftest import assert_planted_bugs_named, planted_verdicts, solution_and_stub, solution_code
from facourse import AttentionCheckError
from facourse import variants as V

STEP = "10_attention_variants"
GPU_ONLY = {"test_bf16", "perf_window1024_8k", "perf_window1024_16k"}


_ORDER = '''    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)  # first the score modifier
    keep = j < Skv
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)  # then the mask
    s = tl.where(keep, s * 1.4426950408889634, float("-inf"))      # log2 units for exp2'''
_BASE2 = '''    s = tl.dot(q, kT) * scale                                       # natural units for score_mod
    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)  # first the score modifier
    keep = j < Skv
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)  # then the mask
    s = tl.where(keep, s * 1.4426950408889634, float("-inf"))      # log2 units for exp2'''

_SCORE = "    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)  # first the score modifier\n"
_SCORE_THEN_MASK = _SCORE + """    keep = j < Skv
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)  # then the mask
"""
_LOOPS = """                                    True, D, BLOCK_N)
    for t in range(0, tl.load(FULL_NUM + row)):                     # full tiles: no mask function
        start_n = tl.load(FULL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv,
                                    scale, MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    False, D, BLOCK_N)"""
_SCORE_ON_PARTIAL = _SCORE_THEN_MASK.replace(_SCORE, "").replace("    if PARTIAL:\n", "    if PARTIAL:\n    " + _SCORE)
_SWAPPED = _LOOPS.replace("True, D", "@").replace("False, D", "True, D").replace("@", "False, D")
_ROW = "row = ((b % Bm) * Hm + h % Hm) *"
_MASK_IF = "    if PARTIAL:\n        keep = keep & mask("

# (the cell, the solution's text, the mistake, the test that loses its points, what its message names)
PLANTED = {
    "softcap_after_mask": ("kernel", _ORDER, '''    keep = j < Skv
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)
    s = tl.where(keep, s, float("-inf"))
    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)
    s = s * 1.4426950408889634''', "test_softcap", "the soft cap is applied after the mask"),
    "partial_as_full": ("classes_kernel", "tl.where(n == BLOCK_M * BLOCK_N, FULL, tl.where(n > 0, PARTIAL, EMPTY))",
                        "tl.where(n > 0, FULL, EMPTY)", "test_block_mask", "a partial tile is treated as full"),
    "mask_skipped": ("kernel", "    if PARTIAL:\n        keep = keep & mask(", "    if False:\n        keep = keep & mask(",
                     "test_window", "a partial tile is treated as full"),
    "score_mod_in_base_2": ("kernel", _BASE2, _BASE2.replace("tl.dot(q, kT) * scale  ", "tl.dot(q, kT) * scale * 1.4426950408889634")
                            .replace("s * 1.4426950408889634, float", "s, float"), "test_alibi", "base 2"),
    "ignores_given_lists": ("launch", "    if block_mask is None:\n", "    if True:\n", "test_tile_lists",
                            "not of the block mask"),
    # the course's own block mask in place of the student's kernel (the builder cell is locked: the
    # launch cell, after it, rebinds the name)
    "builder_from_reference": ("launch", "def flex_attention_triton(",
                               "from facourse.variants import reference_block_mask\n\n\n"
                               "def build_block_mask(mask, B, H, Sq, Skv, BLOCK_M=128, BLOCK_N=64, device=None):\n"
                               "    return reference_block_mask(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device)\n\n\n"
                               "def flex_attention_triton(", "test_block_mask", "the mask's Triton function"),
    "no_empty_row_guard": ("kernel", 'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_use = m_new",
                           "test_window_edges", "see no key"),
    # the sequence's bounds left to the mask: only a case with no mask on ragged lengths shows it
    "keys_past_skv": ("kernel", "    keep = j < Skv\n", "    keep = j >= 0\n", "test_softcap", "keys past Skv"),
    "tiles_past_the_end_full": ("classes_kernel",
                                "visible = mask(b, h, i, j, Sq, Skv, INTS, FLOATS) & (i < Sq) & (j < Skv)",
                                "visible = mask(b, h, i, j, Sq, Skv, INTS, FLOATS)", "test_block_mask",
                                "full, should be partial"),
    # the score modifier skipped with the mask on full tiles: causal + ALiBi has full tiles below the diagonal
    "score_mod_on_partial_tiles_only": ("kernel", _SCORE_THEN_MASK, _SCORE_ON_PARTIAL, "test_alibi",
                                        "the score modifier is applied on partial tiles only"),
    "score_mod_on_partial_tiles_only_lists": ("kernel", _SCORE_THEN_MASK, _SCORE_ON_PARTIAL, "test_tile_lists",
                                              "the score modifier is applied on partial tiles only"),
    # the mask on every tile is harmless with the mask's own lists: only a changed block mask shows it
    "mask_on_full_tiles_too": ("kernel", _MASK_IF, _MASK_IF.replace("PARTIAL", "True"), "test_tile_lists",
                               "applied on the tiles listed as full too"),
    "mask_on_full_tiles_only": ("kernel", _LOOPS, _SWAPPED, "test_tile_lists",
                                "the PARTIAL switch of the two loops is swapped"),
    "mask_skipped_lists": ("kernel", _MASK_IF, _MASK_IF.replace("PARTIAL", "False"), "test_tile_lists",
                           "the mask function is not applied on any tile"),
    # the row of the lists: the changed block mask has lists per head and per batch; documents, per batch
    "lists_row_ignores_head": ("kernel", _ROW, "row = ((b % Bm) * Hm) *", "test_tile_lists",
                               "every head reads head 0's lists"),
    "lists_row_of_kv_head": ("kernel", _ROW, "row = ((b % Bm) * Hm + (h // GROUP) % Hm) *", "test_tile_lists",
                             "query head h reads the lists of head h // (Hq // Hkv)"),
    "lists_row_ignores_batch": ("kernel", _ROW, "row = (h % Hm) *", "test_documents",
                                "every batch reads batch 0's lists"),
    # the score modifier given the wrong head: ALiBi's slope is the query head's
    "score_mod_head_0": ("kernel", "score_mod(s, b, h, i, j", "score_mod(s, b, 0, i, j", "test_alibi",
                         "get head 0 for every query head"),
    "mods_get_kv_head": ("kernel", "start_n, b, h, i, Sq, Skv,\n", "start_n, b, h // GROUP, i, Sq, Skv,\n",
                         "test_alibi", "indexed by the KV head instead of the query head"),
    # correct but slower: only the builder's test sees it
    "empty_tiles_partial": ("classes_kernel", "tl.where(n > 0, PARTIAL, EMPTY)", "PARTIAL", "test_block_mask",
                            "empty tiles listed as partial"),
    # a window's first partial tile hides every key of its last rows: NaN in rows that do see keys
    "no_guard_window": ("kernel", 'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_use = m_new",
                        "test_window", "exp(-inf - (-inf)) is NaN"),
}

# mistakes in two cells at once: (the cells' {cell: (the solution's text, the mistake)}, the test, what it names)
PLANTED_TOGETHER = {
    # empty tiles listed as partial change nothing, but with no guard for m = -inf every row that misses
    # the first key tile turns NaN
    "empty_tiles_partial_no_guard": ({"classes_kernel": PLANTED["empty_tiles_partial"][1:3],
                                      "kernel": PLANTED["no_guard_window"][1:3]}, "test_window",
                                     "the block mask lists empty tiles as partial"),
}

# the demo's samples, graded by tests/test_exercise_grading.py: the solution scores every CPU point, the
# untouched stub 0, the solution with the planted 'softcap_after_mask' loses its test's points
GRADING = solution_and_stub(STEP, 22, GPU_ONLY, 6, PLANTED["softcap_after_mask"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names it."""
    assert_planted_bugs_named(tmp_path, STEP, ("setup", "builder"), PLANTED)


def test_planted_bugs_in_two_cells_lose_the_points_that_name_them(tmp_path):
    """A mistake harmless alone, planted with one that it makes visible, is named in the test that fails."""
    solution = solution_code(STEP)
    bugs = {}
    for bug, (cells, test, says) in PLANTED_TOGETHER.items():
        for cell, (old, new) in cells.items():
            assert old in solution[cell], f"{bug}: the solution no longer holds {old!r}: update the planted bug"
            bugs.setdefault(bug, {})[cell] = solution[cell].replace(old, new)
    got = planted_verdicts(tmp_path, STEP, ("setup", "builder"), bugs,
                           tests={bug: [p[1]] for bug, p in PLANTED_TOGETHER.items()})
    for bug, (cells, test, says) in PLANTED_TOGETHER.items():
        v = got[bug][test]
        assert v["points"] == 0, f"{bug}: {test} still scored {v['points']}"
        assert says in v["message"], f"{bug}: {test}'s message does not name it:\n{v['message']}"


# ----------------------------------------------------------------------------- the check's diagnoses
def _computing(mask_of=None, score_of=None, **kw):
    """A PyTorch stand-in for a kernel: the variant's reference with its mask or score modifier swapped
    for a wrong one (``mask_of(mask, q, k)``, ``score_of(score, q, k)``)."""
    def fn(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
        m = mask_of(mask, q, k) if mask_of else mask
        s = score_of(score_mod, q, k) if score_of else score_mod
        o, lse = V.variant_reference(q, k, v, m, s, scale, **kw)
        return o.to(q.dtype), lse
    return fn


def _slopes(change):
    """A score modifier of ALiBi whose slopes are ``change(the right ones)``."""
    def score_of(score, q, k):
        Hq, Sq, Skv = q.shape[1], q.shape[2], k.shape[2]
        slopes = change(torch.tensor(V.alibi_slopes(Hq), dtype=torch.float64))
        return V.Mod("wrong slopes", None, lambda s, b, h, i, j: s - slopes[h] * (i + Skv - Sq - j))
    return score_of


WRONG = [
    ("window_off_by_one", "window", _computing(lambda m, q, k: V.sliding_window(101, q.shape[2], k.shape[2])),
     "the window is off by one"),
    ("documents_leak", "documents_alibi", _computing(lambda m, q, k: V.causal(q.shape[2], k.shape[2])),
     "the documents leak across a boundary"),
    ("alibi_slopes_reversed", "alibi", _computing(score_of=_slopes(lambda m: m.flip(0))), "ALiBi's slope per head is wrong"),
    ("alibi_wrong_sign", "documents_alibi", _computing(score_of=_slopes(lambda m: -m)), "ALiBi's bias has the wrong sign"),
    ("softcap_after_mask", "window_softcap", _computing(mask_first=True), "the soft cap is applied after the mask"),
    ("gqa_heads_mod", "window", lambda q, k, v, mask=None, score_mod=None, scale=None, block_mask=None: _computing()(
        q, k[:, torch.arange(q.shape[1]) % k.shape[1]], v[:, torch.arange(q.shape[1]) % k.shape[1]], mask, score_mod,
        scale), "wrong KV head"),
]


@pytest.mark.parametrize("case, fn, says", [w[1:] for w in WRONG], ids=[w[0] for w in WRONG])
def test_check_names_the_wrong_variant(case, fn, says):
    with pytest.raises(AttentionCheckError) as err:
        V.check_variant(fn, case, seed=3, device="cpu", verbose=False)
    assert says in str(err.value), str(err.value)
    assert f"[{case}]" in str(err.value)


def test_check_accepts_the_reference_and_the_block_mask_rules():
    V.check_variant(_computing(), "documents_alibi", seed=4, device="cpu", verbose=False)
    bm = V.perturbed_block_mask(V.sliding_window(37, 200, 333), 1, 4, 200, 333, 64, 64, 5, "cpu")
    cls = V.classes_of_lists(bm)
    assert cls.shape == (1, 4, 4, 6) and {0, 1, 2} <= set(cls.unique().tolist())
    # a full tile never reaches past Skv (333 is no multiple of 64): the last key tile is at most partial
    assert int(cls[..., -1].max()) <= 1


@pytest.mark.parametrize("relabel, says", [
    (lambda c: torch.where(c == 0, 1, c), "empty tiles listed as partial"),
    (lambda c: torch.where(c == 0, 2, c), "an empty tile is listed as full"),
    (lambda c: torch.where(c > 0, 1, c), "full tiles classified partial"),
], ids=["empty_as_partial", "empty_as_full", "full_as_partial"])
def test_block_mask_check_names_the_wrong_class(relabel, says):
    """A builder whose classes are the right ones relabelled: the check names what it relabelled."""
    cfg, mask, _ = V.VARIANT_CASES["window_beyond"].build("cpu")      # empty, partial and full tiles

    def builder(_mask, B, H, Sq, Skv, bm, bn, device):
        return V.lists_of(relabel(V.tile_classes(mask, B, H, Sq, Skv, bm, bn, device)), bm, bn, Sq, Skv)
    with pytest.raises(AttentionCheckError) as err:
        V.check_block_mask(builder, "window_beyond", device="cpu", verbose=False)
    assert says in str(err.value), str(err.value)


def test_scan_flags_pytorchs_flex_attention_but_not_the_entry_point():
    """The exercise's own name is no framework attention; PyTorch's FlexAttention, called or imported, is."""
    from autograder.scan import scan_source
    assert not scan_source("def flex_attention_triton(q, k, v, mask=None):\n    return q, q\n", "cell")
    for src in ("from torch.nn.attention.flex_attention import flex_attention\n",
                "o = torch.nn.attention.flex_attention.flex_attention(q, k, v)\n"):
        assert any("flex_attention" in f.line for f in scan_source(src, "cell")), src
