"""v6: step 07's Hopper CUDA kernel with a sliding window for the masks it can do, v4's Triton kernel for
the rest.

No Triton structure, tile or schedule got past 1.03x compiled FlexAttention on the 1024 window
(benchmarks/results/2026-11-23_h100_step10_window_probe.txt). Step 07's kernel (TMA, WGMMA, warp
specialization, persistent CTAs) ran causal 8k (B 2) at 584 TFLOP/s (2026-11-22_h100_step07.json); a
window is a causal mask with a lower edge, so it needs only a shorter key-block loop: for a tile of 128
query rows the loop runs right to left from the causal end down to the window's first block (from the
tile's first row, max(0, m0 + Skv - Sq - W + 1) / 128), and the blocks that cross the window's lower
edge get the element mask like the diagonal ones. At W = 1024 that is 9 key blocks of 128 per tile, 2 of them
masked. The kernel is step 07's solution built with HFA_WINDOW (v6_hopper_window.cu; the window is
FaParams::window, 0 for none), with step 07's binding. Measured on an H100 (2026-11-24_h100_step10.json):
400-401 TFLOP/s on the 1024 window at 8k and 16k (1.25-1.26x compiled FlexAttention), 547-560 on causal 8k,
605 on long.

Routing, call by call: the CUDA kernel on an sm_90 GPU for fp16/bf16, D 64 or 128, no score modifier
(or the identity), and a mask it computes itself: none, causal or a sliding window (recognised by the
Mod's Triton function: facourse.variants.all_visible_mask, causal_mask, sliding_window_mask with W =
INTS[0] >= 1), so it computes exactly what v4 computes with that Mod. A given block mask must be the
mask's own (its tiles' classes those of the mask; compared once per block-mask object): the CUDA
kernel visits the mask's tiles itself, and a block mask that says otherwise (FlexAttention's
semantics: exactly the listed tiles) goes to v4. Everything else, and every call on a CPU (Triton's
interpreter), is v4's flex_attention_triton.
"""
import os
import sys
from pathlib import Path

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common  # noqa: E402,F401  (sets up the interpreter without a GPU, before triton)
import v4_tuned  # noqa: E402

import torch  # noqa: E402

from facourse.steps import step_dir  # noqa: E402
from facourse.triton_setup import validate_triton_inputs  # noqa: E402
from facourse.variants import (all_visible_mask, causal_mask, classes_of_lists, identity_score,  # noqa: E402
                               sliding_window_mask, tile_classes)

KERNEL = Path(__file__).resolve().with_suffix(".cu")
_extension = None
_own_block_masks: dict = {}          # id(block mask) -> (block mask, mask, it is the mask's own)


def extension():
    """The torch extension of v6_hopper_window.cu + step 07's binding (built once, for sm_90a)."""
    global _extension
    if _extension is None:
        from facourse.cuda_build import load_hopper_rung
        _extension = load_hopper_rung("fa10_v6_hopper_window", [KERNEL, step_dir("07") / "fa_binding.cpp"])
    return _extension


def cuda_mask(mask):
    """(causal, window) for a mask the CUDA kernel computes itself, else None."""
    if mask is None or mask.fn is all_visible_mask:
        return False, 0
    if mask.fn is causal_mask:
        return True, 0
    if mask.fn is sliding_window_mask and int(mask.ints[0]) >= 1:
        return True, int(mask.ints[0])
    return None


def is_own_block_mask(block_mask, mask, Sq, Skv) -> bool:
    """Whether ``block_mask`` lists exactly the tiles of ``mask`` (partial and full as the mask makes
    them), for any batch and head; compared once per block-mask object, as a model builds it once."""
    hit = _own_block_masks.get(id(block_mask))
    if hit is not None and hit[0] is block_mask and hit[1] is mask:
        return hit[2]
    said = classes_of_lists(block_mask)
    ok = (block_mask.Sq, block_mask.Skv) == (Sq, Skv)
    if ok:
        want = tile_classes(mask, 1, 1, Sq, Skv, block_mask.BLOCK_M, block_mask.BLOCK_N, said.device)
        ok = said.shape[2:] == want.shape[2:] and torch.equal(said, want.expand_as(said))
    if len(_own_block_masks) >= 16:
        _own_block_masks.clear()
    _own_block_masks[id(block_mask)] = (block_mask, mask, ok)
    return ok


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """flex_attention_triton's contract (v4's): attention with a mask and a score modifier
    (facourse.variants.Mod, or None), visiting only the tiles of ``block_mask`` when one is given.
    q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D]. Returns (o, lse)."""
    how = cuda_mask(mask)
    if (how is None or (score_mod is not None and score_mod.fn is not identity_score) or not q.is_cuda
            or torch.cuda.get_device_capability(q.device) != (9, 0) or q.dtype not in (torch.float16, torch.bfloat16)
            or q.shape[-1] not in (64, 128)
            or (block_mask is not None and not is_own_block_mask(block_mask, mask, q.shape[2], k.shape[2]))):
        return v4_tuned.flex_attention_triton(q, k, v, mask, score_mod, scale, block_mask)
    validate_triton_inputs(q, k, v, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    causal, window = how
    return tuple(extension().forward(q, k, v, causal, scale, window))
