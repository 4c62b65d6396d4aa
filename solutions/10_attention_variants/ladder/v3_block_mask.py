"""v3: the block mask: empty tiles skipped, the mask function on partial tiles only. The exercise's solution.

The block mask (variants_common.build_block_mask, lecture 10, section 3) lists, for each query tile,
its partial key tiles and its full key tiles. One program per (query tile, b * Hq + h) runs two loops
(lecture 10, section 6): first over the partial tiles, with the score modifier, then the mask
function and the bounds; then over the full tiles, with the score modifier only. Empty tiles are never
loaded. The online softmax is lecture 05's in base 2: the score modifier sees natural-unit logits
scale * q . k, and the result is multiplied by log2(e) after it. Rows that see no key end with
o = 0 and lse = -inf.

Given a block mask, the kernel visits exactly its listed tiles, consistent with the mask or not
(FlexAttention's semantics; variants_common.visible_pairs is what it then computes). Without one, it
builds one for its own tiles. The kernel is this file's own (it is the exercise's code), not the
shared one of v1, v2 and v4.
"""
import math
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common as vc  # noqa: E402  (sets up the interpreter without a GPU, before triton)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from facourse.triton_setup import validate_triton_inputs  # noqa: E402
from facourse.variants import no_mask, no_score_mod  # noqa: E402

BLOCK_M, BLOCK_N = 64, 64


@triton.jit
def attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv, scale,
                MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask: tl.constexpr, score_mod: tl.constexpr,
                PARTIAL: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile of the online softmax: S, score_mod, (partial tiles:) the mask, the update."""
    jv = start_n + tl.arange(0, BLOCK_N)[:, None]                   # key indices [BLOCK_N, 1] for V_j
    j = start_n + tl.arange(0, BLOCK_N)[None, :]                    # and [1, BLOCK_N] for K_j^T and S
    d = tl.arange(0, D)
    kT = tl.load(k_base + j * sks + d[:, None], mask=j < Skv, other=0.0)      # K_j^T [D, BLOCK_N]
    v = tl.load(v_base + jv * svs + d[None, :], mask=jv < Skv, other=0.0)     # V_j [BLOCK_N, D]
    s = tl.dot(q, kT) * scale                                       # natural units for score_mod
    s = score_mod(s, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)  # first the score modifier
    keep = j < Skv                                                  # a relabelled ragged tile stays in bounds
    if PARTIAL:
        keep = keep & mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)  # then the mask
    s = tl.where(keep, s * 1.4426950408889634, float("-inf"))      # log2 units for exp2
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)            # a row that has seen no key yet
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])            # O_i = alpha O_i + P_ij V_j
    return acc, m_new, l_i


@triton.jit
def flex_fwd(Q, K, V, O, LSE, PARTIAL_NUM, PARTIAL_IDX, FULL_NUM, FULL_IDX, Bm, Hm,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, Hq, Sq, Skv, scale,
             mask: tl.constexpr, score_mod: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]           # query indices [BLOCK_M, 1]
    d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i * sqs + d[None, :], mask=i < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + (h // GROUP).to(tl.int64) * skh   # GQA: KV head h // GROUP
    v_base = V + b.to(tl.int64) * svb + (h // GROUP).to(tl.int64) * svh

    # this query tile's row of the block mask (a block mask of one batch or head is shared by all)
    row = ((b % Bm) * Hm + h % Hm) * tl.cdiv(Sq, BLOCK_M) + pid_m
    Tk = tl.cdiv(Skv, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for t in range(0, tl.load(PARTIAL_NUM + row)):                  # partial tiles: the mask applies
        start_n = tl.load(PARTIAL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv,
                                    scale, MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    True, D, BLOCK_N)
    for t in range(0, tl.load(FULL_NUM + row)):                     # full tiles: no mask function
        start_n = tl.load(FULL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, sks, svs, start_n, b, h, i, Sq, Skv,
                                    scale, MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    False, D, BLOCK_N)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                         # a row with no key: o = 0, lse = -inf
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o = acc / l_safe[:, None]
    tl.store(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i * sos + d[None, :], o.to(O.dtype.element_ty),
             mask=i < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """Attention with a mask and a score modifier (facourse.variants.Mod, or None) that visits only
    the tiles ``block_mask`` lists (built from ``mask`` when None). q [B, Hq, Sq, D], k and v
    [B, Hkv, Skv, D]. Returns (o, lse)."""
    validate_triton_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    mask = no_mask() if mask is None else mask
    score_mod = no_score_mod() if score_mod is None else score_mod
    o = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full((B, Hq, Sq), -math.inf, device=q.device, dtype=torch.float32)
    if Sq == 0 or Skv == 0:                                         # no key at all: every row is empty
        return o, lse
    if block_mask is None:
        block_mask = vc.build_block_mask(mask, B, Hq, Sq, Skv, BLOCK_M, BLOCK_N, q.device)
    assert (block_mask.Sq, block_mask.Skv) == (Sq, Skv), "the block mask was built for other lengths"
    grid = (triton.cdiv(Sq, block_mask.BLOCK_M), B * Hq)
    flex_fwd[grid](q, k, v, o, lse, *block_mask.kernel_args(B, Hq),
                   *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   *mask.args(q.device), *score_mod.args(q.device), Hq, Sq, Skv, scale,
                   mask.fn, score_mod.fn, Hq // Hkv, D, block_mask.BLOCK_M, block_mask.BLOCK_N)
    return o, lse
