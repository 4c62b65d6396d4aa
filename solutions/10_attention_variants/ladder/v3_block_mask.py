"""v3: the block mask: empty tiles skipped, the mask function on partial tiles only. The exercise's
solution: its code is the exercise's (solutions/10_attention_variants/10_attention_variants.pct.py, the
cells `setup`, `classes_kernel`, `builder`, `kernel` and `launch`); this file loads those cells
(facourse.steps.exercise_module), so the rung and the exercise's solution are one source.

The block mask (the exercise's build_block_mask, lecture 10, section 3) lists, for each query tile,
its partial key tiles and its full key tiles. One program per (query tile, b * Hq + h) runs two loops:
first over the partial tiles, with the score modifier, then the mask function and the bounds; then
over the full tiles, with the score modifier and the bounds only (a block mask given by the caller may
call a ragged tile full). Empty tiles are never loaded. The online softmax is lecture 05's in base 2:
the score modifier sees natural-unit logits scale * q . k, and the result is multiplied by log2(e)
after it. Rows that see no key end with o = 0 and lse = -inf. Given a block mask, the kernel visits
exactly its listed tiles, consistent with the mask or not (FlexAttention's semantics;
facourse.variants.visible_pairs is what it then computes); without one, it builds one for its tiles
(64 x 64).

What it leaves to v4: one tile size and launch for every shape, masked loads, the scale multiplied
on every tile even without a score modifier, the bounds checked on every tile.
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common  # noqa: E402,F401  (sets up the interpreter without a GPU, before triton)

from facourse.steps import exercise_module  # noqa: E402

_exercise = exercise_module("10", ("setup", "classes_kernel", "builder", "kernel", "launch"))
flex_attention_triton = _exercise.flex_attention_triton
build_block_mask = _exercise.build_block_mask
BLOCK_M, BLOCK_N = _exercise.BLOCK_M, _exercise.BLOCK_N
