"""Step 10's support file (no rung): the block-mask builder (the exercise's; the BlockMask itself, its
lists and what it lets through are facourse.variants'), and the parts of the kernels rungs v1, v2 and
v4 share (v3 is the exercise's solution cells).

A **block mask** classifies every (query tile, key tile) as empty, partial or full (lecture 10,
section 3) and stores, for each query tile, the list of its partial key tiles and the list of its full
ones, like FlexAttention's kv_num_blocks / kv_indices and full_kv_num_blocks / full_kv_indices. A
kernel visits exactly the listed tiles: the partial ones with the mask function, the full ones without.
"""
from __future__ import annotations

import math

import torch

from facourse.steps import exercise_module
from facourse.triton_setup import interpret_without_gpu, validate_triton_inputs
from facourse.variants import Mod, mask_values, no_mask, no_score_mod

interpret_without_gpu()  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# ----------------------------------------------------------------------------- the block mask
# The builder is the exercise's (its cells `classes_kernel` and `builder`): one source for the rungs and
# the exercise's solution. build_block_mask(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device) -> BlockMask,
# with batch and head dimensions of 1 where the mask reads neither.
build_block_mask = exercise_module("10", ("setup", "classes_kernel", "builder")).build_block_mask


# ----------------------------------------------------------------------------- host helpers
def prepare(q, k, v, scale, mask, score_mod):
    """The wrapper's common start: the contract's checks, the default scale, o and lse allocated (a
    query with no key at all: o = 0, lse = -inf), and the Mods with None replaced by their no-ops.
    Returns (o, lse, scale, mask, score_mod)."""
    validate_triton_inputs(q, k, v, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    o = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full(q.shape[:3], -math.inf, device=q.device, dtype=torch.float32)
    return o, lse, scale, no_mask() if mask is None else mask, no_score_mod() if score_mod is None else score_mod


def mod_args(mask: Mod, score_mod: Mod, device) -> tuple:
    """MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS: the Mods' arguments on ``device``."""
    return (*mask.args(device), *score_mod.args(device))


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def online_softmax_step(acc, m_i, l_i, s, v):
    """One key tile of the online softmax in base 2: s [BLOCK_M, BLOCK_N] in log2 units (-inf where
    not visible), v [BLOCK_N, D]. A row that has seen no key keeps m = -inf; 0 stands in for it so that
    exp2(-inf - m) is 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


def tma_ready(t) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last."""
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


@triton.jit
def query_tile(pid_m, Hq, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Where query tile pid_m of this program (axis 1: batch x query head) lies: (bh, b, h, h_kv,
    start_m, i), h_kv = h // GROUP the KV head it reads (GQA), i its rows [BLOCK_M, 1]."""
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    h_kv = h // GROUP
    start_m = pid_m * BLOCK_M
    i = start_m + tl.arange(0, BLOCK_M)[:, None]
    return bh, b, h, h_kv, start_m, i


@triton.jit
def finish(acc, m_i, l_i):
    """O = acc / l and lse = ln 2 * (m + log2 l); a row that saw no key: O = 0, lse = -inf."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    return acc / l_safe[:, None], lse


@triton.jit
def every_tile_fwd(Q, K, V, O, LSE, MASK_VALUES,
                   sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, smb, smh, sms,
                   MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, Hq, Sq, Skv, scale,
                   mask: tl.constexpr, score_mod: tl.constexpr, DENSE_MASK: tl.constexpr,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rungs v1 and v2: one query tile of one (batch, head) against every key tile, no skipping.
    DENSE_MASK: the mask's values are read from MASK_VALUES (bool [B, Hq, Sq, Skv], strides sm?, 0 on
    a broadcast dimension); else the mask function is called on the tile's indices."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i * sqs + d[None, :], mask=i < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + (h // GROUP).to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + (h // GROUP).to(tl.int64) * svh
    m_base = MASK_VALUES + b.to(tl.int64) * smb + h.to(tl.int64) * smh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, Skv, BLOCK_N):
        jv = start_n + tl.arange(0, BLOCK_N)[:, None]
        j = start_n + tl.arange(0, BLOCK_N)[None, :]
        kT = tl.load(k_base + j * sks + d[:, None], mask=j < Skv, other=0.0)      # K_j^T [D, BLOCK_N]
        v = tl.load(v_base + jv * svs + d[None, :], mask=jv < Skv, other=0.0)     # V_j [BLOCK_N, D]
        s = score_mod(tl.dot(q, kT) * scale, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)
        if DENSE_MASK:
            keep = tl.load(m_base + i * sms + j, mask=(i < Sq) & (j < Skv), other=0) != 0
        else:
            keep = mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS) & (j < Skv)
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, tl.where(keep, s * LOG2E, float("-inf")), v)

    o, lse = finish(acc, m_i, l_i)
    tl.store(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i * sos + d[None, :], o.to(O.dtype.element_ty),
             mask=i < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


def run_every_tile(q, k, v, mask, score_mod, scale, dense: bool, BLOCK_M=64, BLOCK_N=64):
    """v1 (dense=True) and v2's wrapper: the launch of :func:`every_tile_fwd`."""
    o, lse, scale, mask, score_mod = prepare(q, k, v, scale, mask, score_mod)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    if Sq == 0 or Skv == 0:
        return o, lse
    # v1: the mask's values, bool [B, Hq, Sq, Skv] as a view (stride 0 where the mask ignores b or h,
    # so causal stores Sq x Skv booleans once); v2 passes a placeholder it never reads
    values = (mask_values(mask, B, Hq, Sq, Skv, q.device) if dense
              else torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=q.device))
    grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    every_tile_fwd[grid](q, k, v, o, lse, values, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                         *o.stride()[:3], *values.stride()[:3], *mod_args(mask, score_mod, q.device),
                         Hq, Sq, Skv, scale, mask.fn, score_mod.fn, dense, Hq // Hkv, D, BLOCK_M, BLOCK_N)
    return o, lse
