"""A probe of step 15 (serving_paged.py, serving_paged_ab.py), not a rung: v2_split_tiles with the page size a
compile-time constant (no runtime integer division per key) and a switch PREFETCH (SERVING_PREFETCH=1: the next
key tile's pages looked up one iteration ahead). Measured: benchmarks/results/2026-12-04_h200_step15_paged_probes.txt
(it pays at 128 x 128 tiles with 2 stages: ladder rung v3_paged).
"""
import math
import os

import torch

from facourse.serving import validate_paged_prefill_inputs, validate_varlen_inputs
from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634
# (BLOCK_M, BLOCK_N, num_warps, num_stages) of the packed and the paged entry point, the best of a sweep on one
# H200 (benchmarks/probes/serving_tiles.py, 2026-12-04_h200_step15_tiles.txt); SERVING_TILES overrides both
_ENV = os.environ.get("SERVING_TILES")
PREFETCH = os.environ.get("SERVING_PREFETCH", "1") == "1"
TILES = {paged: tuple(int(x) for x in (_ENV or ("64,64,4,1" if INTERPRET else default)).split(","))
         for paged, default in ((False, "128,32,4,3"), (True, "128,128,8,2"))}


@triton.jit
def _tiles(acc, l_i, m_i, q, K, V, TABLE, b, kvh, k_start, Lk, Lq, offs_m, lo, hi,
           stb, skp, skr, skh, svp, svr, svh, qk_scale, page_size: tl.constexpr,
           MASKED: tl.constexpr, CAUSAL: tl.constexpr, PAGED: tl.constexpr, PAGE_TILES: tl.constexpr,
           D: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    offs_d = tl.arange(0, D)
    nxt = lo + tl.arange(0, BLOCK_N)
    page_next = tl.load(TABLE + b.to(tl.int64) * stb + nxt // page_size, mask=nxt < Lk, other=0).to(tl.int64)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < Lk
        if PAGED:
            if PREFETCH and not PAGE_TILES:
                page = page_next
                row = (offs_n % page_size).to(tl.int64)
                nxt = offs_n + BLOCK_N
                page_next = tl.load(TABLE + b.to(tl.int64) * stb + nxt // page_size, mask=nxt < Lk,
                                    other=0).to(tl.int64)
            elif PAGE_TILES:                      # the tile lies in one page: one lookup
                page = tl.load(TABLE + b.to(tl.int64) * stb + n0 // page_size).to(tl.int64)
                row = (n0 % page_size + tl.arange(0, BLOCK_N)).to(tl.int64)
            else:
                page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0).to(tl.int64)
                row = (offs_n % page_size).to(tl.int64)
            rk = page * skp + row * skr
            rv = page * svp + row * svr
        else:
            rk = (k_start + offs_n).to(tl.int64) * skr
            rv = (k_start + offs_n).to(tl.int64) * svr
        if MASKED:
            k = tl.load(K + rk[:, None] + kvh * skh + offs_d[None, :], mask=inside[:, None], other=0.0)
            keep = inside[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + Lk - Lq)
            s = tl.where(keep, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        else:
            k = tl.load(K + rk[:, None] + kvh * skh + offs_d[None, :])
            s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(V + rv[:, None] + kvh * svh + offs_d[None, :], mask=inside[:, None], other=0.0)
        else:
            v = tl.load(V + rv[:, None] + kvh * svh + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def serving_kernel_v3(Q, K, V, O, LSE, CU_Q, CU_K, LENS, TABLE,
                      sqt, sqh, skp, skr, skh, svp, svr, svh, sot, soh, stb,
                      total_q, qk_scale, G, page_size: tl.constexpr,
                      CAUSAL: tl.constexpr, PAGED: tl.constexpr, PAGE_TILES: tl.constexpr, D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    m_block = tl.num_programs(0) - 1 - tl.program_id(0)      # the last (longest causal) tiles first
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // G
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_start = tl.load(CU_Q + b)
    Lq = tl.load(CU_Q + b + 1) - q_start
    if PAGED:
        k_start = 0
        Lk = tl.load(LENS + b).to(tl.int32)
    else:
        k_start = tl.load(CU_K + b)
        Lk = tl.load(CU_K + b + 1) - k_start
    live = offs_m < Lq
    q = tl.load(Q + (q_start + offs_m).to(tl.int64)[:, None] * sqt + h * sqh + offs_d[None, :],
                mask=live[:, None], other=0.0)
    m_start = m_block * BLOCK_M
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Lk, m_start + BLOCK_M + Lk - Lq), 0)
        full = tl.maximum(tl.minimum(Lk, m_start + Lk - Lq + 1), 0) // BLOCK_N * BLOCK_N
    else:
        hi = Lk
        full = Lk // BLOCK_N * BLOCK_N
    work = m_start < Lq
    hi = tl.where(work, hi, 0)
    full = tl.where(work, tl.minimum(full, hi), 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, K, V, TABLE, b, kvh, k_start, Lk, Lq, offs_m, 0, full,
                           stb, skp, skr, skh, svp, svr, svh, qk_scale, page_size,
                           False, CAUSAL, PAGED, PAGE_TILES, D, BLOCK_N, PREFETCH)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, K, V, TABLE, b, kvh, k_start, Lk, Lq, offs_m, full, hi,
                           stb, skp, skr, skh, svp, svr, svh, qk_scale, page_size,
                           True, CAUSAL, PAGED, PAGE_TILES, D, BLOCK_N, PREFETCH)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(O + (q_start + offs_m).to(tl.int64)[:, None] * sot + h * soh + offs_d[None, :],
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=live[:, None])
    tl.store(LSE + h.to(tl.int64) * total_q + q_start + offs_m, lse, mask=live)


def _launch(q, K, V, cu_q, cu_k, lens, table, kv_strides, stb, page_size, max_seqlen_q, Hkv, causal, paged, scale):
    total_q, Hq, D = q.shape
    BM, BN, warps, stages = TILES[paged]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty((Hq, total_q), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(max(max_seqlen_q, 1), BM), cu_q.shape[0] - 1, Hq)
    serving_kernel_v3[grid](q, K, V, o, lse, cu_q, cu_k, lens, table, q.stride(0), q.stride(1), *kv_strides,
                            o.stride(0), o.stride(1), stb, total_q, scale * LOG2E, Hq // Hkv, page_size,
                            CAUSAL=causal, PREFETCH=PREFETCH, PAGED=paged, PAGE_TILES=paged and page_size % BN == 0, D=D,
                            BLOCK_M=BM, BLOCK_N=BN, **({} if INTERPRET else {"num_warps": warps, "num_stages": stages}))
    return o, lse


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None):
    validate_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
    strides = (0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1))
    return _launch(q, k, v, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k, cu_seqlens_k, strides, 0, 1, max_seqlen_q,
                   k.shape[1], causal, False, scale)


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale=None):
    validate_paged_prefill_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale)
    strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    return _launch(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_q, seq_lens, block_table, strides,
                   block_table.stride(0), k_cache.shape[1], max_seqlen_q, k_cache.shape[2], True, True, scale)


if __name__ == "__main__":
    from facourse.serving import PAGED_CASES, VARLEN_CASES, check_paged_prefill, check_varlen
    for case in VARLEN_CASES:
        check_varlen(varlen_attention, case, seed=0)
    for case in PAGED_CASES:
        check_paged_prefill(paged_prefill, case, seed=0)
