"""Shared by every rung of step 09 (a support file, no rung): the interpreter set-up, the exercise's
cells (v3 is them; v2 and v4 reuse its merge kernel), the wrappers' common start, the split-count
heuristic, and the per-head key loop that v1 and v2 share.

Its name is the step's own (``import decode_common``, after the rung puts its folder on sys.path):
step 08's ladder has a ``common.py``, and one process (pytest, benchmarks/ladder.py) may load both.
"""
from __future__ import annotations

import math
import types

import torch

from facourse import steps
from facourse.decode import validate_paged_inputs
from facourse.triton_setup import TRITON_HEAD_DIMS, interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before triton is imported anywhere

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
EXERCISE_CELLS = ("setup", "split_kernel", "merge_kernel", "launch")


# ----------------------------------------------------------------------------- the exercise's cells
def exercise_source(names=EXERCISE_CELLS) -> str:
    """The code of the exercise's cells ``names`` (facourse.steps.exercise_source)."""
    return steps.exercise_source("09", tuple(names))


def exercise_module() -> types.ModuleType:
    """The exercise's solution cells run as one module, once per process: ``split_kv_kernel``,
    ``merge_kernel``, ``paged_decode``, ``sm_count``, ``BLOCK_N`` ... (facourse.steps.exercise_module)."""
    return steps.exercise_module("09", EXERCISE_CELLS)


# ----------------------------------------------------------------------------- host wrappers
def prepare(q, k_cache, v_cache, block_table, seq_lens, scale):
    """A wrapper's common start: the contract's checks (facourse.decode), the default scale, o and lse
    allocated (o like q, lse float32 [B, Hq, Sq]). Returns (o, lse, scale)."""
    validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale, head_dims=TRITON_HEAD_DIMS)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    return o, lse, scale


# ----------------------------------------------------------------------------- launch sizes
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU (132 on an H100 SXM). The interpreter pretends to have
    4, as the exercise does, so that small CPU cases still get several splits and run the merge."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(keys: int, groups: int, programs: int, granule: int, max_splits: int | None = None
               ) -> tuple[int, int]:
    """``(num_splits, split_len)``: cut ``keys`` (enough for the longest sequence the block table can
    hold: ``max_pages * page_size``, a shape, not ``seq_lens``, so the host never waits for the GPU)
    into splits of a whole number of ``granule``-key blocks, about ``programs / groups`` of them
    (rounded), so that ``groups * num_splits`` is about ``programs``; at least one, at most one per
    block and ``max_splits``. Every split starts before ``keys``."""
    blocks = max(1, triton.cdiv(keys, granule))
    want = max(1, min(blocks, (programs + groups // 2) // max(1, groups), max_splits or blocks))
    per_split = triton.cdiv(blocks, want)
    return triton.cdiv(blocks, per_split), per_split * granule


def merge(o_part, lse_part, o, lse, num_splits: int) -> None:
    """Launch the exercise's merge kernel (v2, v3 and v4 write their partial states in its layout:
    ``O_PART [B, Hq, Sq, num_splits, D]`` normalised, ``LSE_PART [B, Hq, Sq, num_splits]`` in base 2)."""
    B, Hq, Sq, D = o.shape
    exercise_module().merge_kernel[(B * Hq * Sq,)](
        o_part, lse_part, o, lse, *o.stride()[:3], Hq, Sq, num_splits, D=D,
        SPLITS=triton.next_power_of_2(num_splits))


# ----------------------------------------------------------------------------- v1 and v2's key loop
@triton.jit
def attend_one_head(Q, K, V, TABLE, b, h, kvh, L, start, end,
                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb,
                    Sq, page_size, qk_scale,
                    SQ_P: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys ``[start, end)`` of sequence ``b`` for the ``Sq`` new tokens of ONE query head ``h``
    (KV head ``kvh``): the online softmax in base 2 without tl.dot, each token's q a [D] vector
    times the K tile [BLOCK_N, D], multiplied out and summed (``SQ_P`` = Sq rounded up to a power of
    two: a small rows dimension; K and V are read once for the Sq tokens). Each key looks its page
    up in the block table. Returns ``(m, l, acc)``: running max (base 2), sum, unnormalised output."""
    tok = tl.arange(0, SQ_P)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + tok[:, None] * sqs + offs_d[None, :],
                mask=(tok < Sq)[:, None], other=0.0).to(tl.float32)                # [SQ_P, D]
    m_i = tl.full([SQ_P], float("-inf"), tl.float32)
    l_i = tl.zeros([SQ_P], tl.float32)
    acc = tl.zeros([SQ_P, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < end                                   # never past the chunk (nor past L)
        page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0).to(tl.int64)
        row = offs_n % page_size
        k = tl.load(K + page[:, None] * skp + row[:, None] * skr + kvh * skh + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)                # [BLOCK_N, D]
        v = tl.load(V + page[:, None] * svp + row[:, None] * svr + kvh * svh + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], 2) * qk_scale                      # [SQ_P, BLOCK_N]
        keep = inside[None, :] & (offs_n[None, :] <= tok[:, None] + L - Sq)        # bottom-right causal
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)    # no key seen yet: exp2(-inf - 0) = 0
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    return m_i, l_i, acc
