"""v2: the mask function called in the kernel on each tile's indices; still every tile computed.

Instead of v1's bool tensor, the kernel calls the mask's Triton function on the tile's index blocks
(i [BLOCK_M, 1], j [1, BLOCK_N]): a few integer operations per pair in registers, no Sq x Skv bytes
written on the host or read from memory. The score modifier comes first, the mask last (lecture 10,
section 5). Every key tile is still visited, the empty ones too: the work is that of a non-causal
attention whatever the mask.

The kernel is variants_common.every_tile_fwd (shared with v1) with DENSE_MASK=False.
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common as vc  # noqa: E402  (sets up the interpreter without a GPU, before triton)


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """Attention with a mask and a score modifier (facourse.variants.Mod, or None). q [B, Hq, Sq, D],
    k and v [B, Hkv, Skv, D]. Returns (o, lse). ``block_mask`` is accepted and unused: no tile is
    skipped."""
    return vc.run_every_tile(q, k, v, mask, score_mod, scale, dense=False)
