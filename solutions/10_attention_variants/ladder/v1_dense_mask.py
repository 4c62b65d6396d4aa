"""v1: the mask materialised as a bool tensor, loaded tile by tile; every tile computed. The baseline.

The mask's PyTorch twin (``Mod.ref``) is evaluated on the host once per call, on every (query, key)
pair: a bool tensor [B, Hq, Sq, Skv] (a broadcast view where the mask ignores b or h). The kernel,
FlashAttention-2's forward (base-2 online softmax, GQA, lse), visits every key tile of every query
tile, computes S = scale * Q K^T, applies the score modifier (in-kernel, on natural-unit logits), then
loads the tile's mask values and sets the hidden logits to -inf. Costs: Sq x Skv bytes of mask
written and read again by every head's tiles, and every tile computed, visible or not.

The kernel is variants_common.every_tile_fwd (shared with v2) with DENSE_MASK=True.
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common as vc  # noqa: E402  (sets up the interpreter without a GPU, before triton)


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """Attention with a mask and a score modifier (facourse.variants.Mod, or None), the mask read from
    a bool tensor built on the host. q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D]. Returns (o, lse).
    ``block_mask`` is accepted and unused: no tile is skipped."""
    return vc.run_every_tile(q, k, v, mask, score_mod, scale, dense=True)
