"""v3: the fast backward: host tensor descriptors (TMA), the causal split (unmasked tiles carry
no mask, only the diagonal's are masked), exp2 with log2(e) folded into the scale, the dK/dV loop
computed transposed (no register transposes), the dK/dV and dQ programs in one launch, and a tile
table measured per shape class.

v3 verdict: 331-333 TFLOP/s backward on large (1.59-1.60x SDPA FLASH's backward), 390-457 on the 4k-16k sweep (1.45-1.57x), fp16 and bf16, causal and not; deterministic (H100).
Measured: tune.py --no-sweep on an H100 80GB HBM3 (PyTorch 2.11, Triton 3.6), 2026-11-22: the backward alone (torch.autograd.grad after one forward), L2 flushed, median of 25, interleaved with SDPA FLASH_ATTENTION's backward in the same process; TFLOP/s count the backward as 2.5x the forward's FLOPs.
Forward + backward (step 05's v6 forward): 358-361 TFLOP/s on large (1.57-1.58x SDPA FLASH), 409-498 on the sweep (1.52-1.58x).
v2 -> v3: both rungs are in the step's results file, timed in one run against SDPA FLASH's backward.

What changed from v2, and why.
* The preprocess writes, besides D_i = rowsum(dO_i * O_i), m_i = lse_i * log2(e) (+inf on empty
  rows) into buffers padded to a multiple of 128 rows (padding: D = 0, m = +inf). The main loops
  then load both with no mask, and P_ij = exp2(S_ij * scale * log2(e) - m_i) is one FMA and one
  exp2 per element (ex2.approx, as in the forward).
* Q, K, V, dO, dQ, dK, dV go through 4-D host tensor descriptors ([B, H, S, D] with the tensors'
  own strides, as in step 05's v6): rows past Sq or Skv read as zeros and their stores are
  clipped. Padded query rows have m = +inf, hence P = 0; padded key rows only touch dK, dV rows
  that are never stored; so the only masks left are the causal diagonal's and, in the dQ loop,
  the ragged last key tile's.
* The dK/dV program computes S^T = K Q^T, P^T, dP^T = V dO^T and dS^T directly: P^T and dS^T come
  out of the tensor cores in the layout the next products (dV += P^T dO, dK += dS^T Q) take from
  registers, so no tile is transposed through shared memory.
* Causal: the dK/dV loop visits the masked query tiles on the diagonal first, then the unmasked
  ones below it; the dQ loop the unmasked key tiles first, then the diagonal. The heaviest
  programs (key tile 0, the last query tile) are launched first.
* One launch: the dK/dV programs and the dQ programs share one grid (dK/dV first), so the dQ
  programs fill the SMs the dK/dV programs' tail leaves idle, with no gap between two kernels.
  They write disjoint outputs: the result is still deterministic.
* ``FUSED_DQ`` (a candidate, see TILES): the dK/dV program also adds scale * dS_ij K_j into an
  fp32 dQ with atomics, as FlashAttention-2 does, and the dQ kernel is skipped. Float atomics add
  in whatever order the programs arrive: dQ is then not bit-reproducible from run to run.

Run on its own:  python v3_tma_causal_split.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from facourse.reference import default_scale  # noqa: E402
import common  # noqa: E402  (sets up the interpreter without a GPU, before triton is imported)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

# key tiles [0, end_free) of a query tile need no mask, [end_free, hi) are the diagonal's (step 05's)
causal_split_bounds = common.step05_kernel().causal_split_bounds

LOG2E = 1.4426950408889634
PAD = 128                                   # lse / Delta rows are padded to a multiple of this


# ----------------------------------------------------------------------------- kernels
@triton.jit
def bwd_preprocess(O, DO, LSE, Delta, M2, sob, soh, sos, sdob, sdoh, sdos, Hq, Sq, Sq_pad,
                   D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta = rowsum(dO * O) and M2 = lse * log2(e) (+inf where lse = -inf), padded rows 0 / +inf."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m < Sq
    o = tl.load(O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :],
                mask=rows[:, None], other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :],
                 mask=rows[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    lse = tl.load(LSE + bh.to(tl.int64) * Sq + offs_m, mask=rows, other=float("-inf"))
    m2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(Delta + bh.to(tl.int64) * Sq_pad + offs_m, delta)
    tl.store(M2 + bh.to(tl.int64) * Sq_pad + offs_m, m2)


@triton.jit
def dkdv_tiles(dk, dv, k, v, q_desc, do_desc, M2, Delta, DQacc, row_base, b, h, offs_n, lo, hi,
               off, qk_scale, scale, sdq_s,
               BLOCK_M: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, FUSED_DQ: tl.constexpr):
    """Query tiles [lo, hi) against one key tile, transposed: S^T = K Q^T [BLOCK_N, BLOCK_M]."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, D)       # rows past Sq read 0
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, D)
        m2 = tl.load(M2 + row_base + offs_m)                          # padded: +inf
        delta = tl.load(Delta + row_base + offs_m)                    # padded: 0
        sT = tl.dot(k, tl.trans(q))                                   # S^T = K Q^T
        pT = tl.math.exp2(sT * qk_scale - m2[None, :])                # P^T
        if MASKED:                                                    # key j visible iff j <= i + off
            pT = tl.where(offs_n[:, None] <= offs_m[None, :] + off, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)                          # dV += P^T dO
        dpT = tl.dot(v, tl.trans(do))                                 # dP^T = V dO^T
        dsT = pT * (dpT - delta[None, :])                             # dS^T = P^T (dP^T - D)
        dsT = dsT.to(q.dtype)
        dk = tl.dot(dsT, q, dk)                                       # dK += dS^T Q
        if FUSED_DQ:                                                  # dQ += scale dS K, atomically
            dq = tl.dot(tl.trans(dsT), k) * scale
            ptrs = DQacc + (row_base + offs_m[:, None]) * D + tl.arange(0, D)[None, :]
            tl.atomic_add(ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def dkdv_program(pid_n, h_kv, b, q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, M2, Delta, DQacc,
                 Hq, Sq, Skv, Sq_pad, qk_scale, scale,
                 GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FUSED_DQ: tl.constexpr):
    """dK_j, dV_j of key tile pid_n of KV head h_kv, summed over the query heads of its group."""
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
    v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)

    off = Skv - Sq
    end_m = tl.cdiv(Sq, BLOCK_M) * BLOCK_M
    if CAUSAL:
        # masked: from the first row that sees key start_n to the first row that sees the whole tile
        lo = tl.maximum(start_n - off, 0) // BLOCK_M * BLOCK_M
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), end_m)
    else:
        lo = 0
        mid = 0
    for g in range(GROUP):                   # the query heads of this KV head: no atomics for dK/dV
        h = h_kv * GROUP + g
        row_base = (b * Hq + h).to(tl.int64) * Sq_pad
        if CAUSAL:
            dk, dv = dkdv_tiles(dk, dv, k, v, q_desc, do_desc, M2, Delta, DQacc, row_base, b, h, offs_n,
                                lo, mid, off, qk_scale, scale, D, BLOCK_M, D, True, FUSED_DQ)
        dk, dv = dkdv_tiles(dk, dv, k, v, q_desc, do_desc, M2, Delta, DQacc, row_base, b, h, offs_n,
                            mid, end_m, off, qk_scale, scale, D, BLOCK_M, D, False, FUSED_DQ)
    dk_desc.store([b, h_kv, start_n, 0], (dk * scale).to(dk_desc.dtype).reshape(1, 1, BLOCK_N, D))
    dv_desc.store([b, h_kv, start_n, 0], dv.to(dv_desc.dtype).reshape(1, 1, BLOCK_N, D))


@triton.jit
def bwd_dkdv(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, M2, Delta, DQacc,
             Hq, Sq, Skv, Sq_pad, qk_scale, scale,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FUSED_DQ: tl.constexpr):
    # program ids: key tile (tile 0, the most work when causal, first), KV head, batch
    dkdv_program(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_desc, k_desc, v_desc, do_desc,
                 dk_desc, dv_desc, M2, Delta, DQacc, Hq, Sq, Skv, Sq_pad, qk_scale, scale,
                 GROUP, D, CAUSAL, BLOCK_M, BLOCK_N, FUSED_DQ)


@triton.jit
def dq_tiles(dq, q, do, m2, delta, k_desc, v_desc, b, h_kv, offs_m, lo, hi, Skv, off, qk_scale,
             BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Key tiles [lo, hi) against one query tile."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
        v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
        s = tl.dot(q, tl.trans(k))                                    # S = Q K^T
        p = tl.math.exp2(s * qk_scale - m2[:, None])                  # P
        if MASKED:
            cols = start_n + tl.arange(0, BLOCK_N)
            keep = cols[None, :] < Skv
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + off)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v))                                  # dP = dO V^T
        ds = p * (dp - delta[:, None])                                # dS = P (dP - D)
        dq = tl.dot(ds.to(k.dtype), k, dq)                            # dQ += dS K
    return dq


@triton.jit
def dq_program(pid_m, h, b, q_desc, k_desc, v_desc, do_desc, dq_desc, M2, Delta, Hq, Sq, Skv, Sq_pad,
               qk_scale, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ_i of query tile pid_m (counted from the last when causal: the longest rows first) of head h."""
    num_m = tl.cdiv(Sq, BLOCK_M)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    h_kv = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, D)
    do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, D)
    row_base = (b * Hq + h).to(tl.int64) * Sq_pad
    m2 = tl.load(M2 + row_base + offs_m)
    delta = tl.load(Delta + row_base + offs_m)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)

    off = Skv - Sq
    end_free, hi = causal_split_bounds(start_m, off, Skv, BLOCK_M, BLOCK_N, CAUSAL)   # as the forward's
    dq = dq_tiles(dq, q, do, m2, delta, k_desc, v_desc, b, h_kv, offs_m, 0, end_free, Skv, off, qk_scale,
                  BLOCK_N, D, False, CAUSAL)
    dq = dq_tiles(dq, q, do, m2, delta, k_desc, v_desc, b, h_kv, offs_m, end_free, hi, Skv, off, qk_scale,
                  BLOCK_N, D, True, CAUSAL)
    dq_desc.store([b, h, start_m, 0], (dq * scale).to(dq_desc.dtype).reshape(1, 1, BLOCK_M, D))


@triton.jit
def bwd_dq(q_desc, k_desc, v_desc, do_desc, dq_desc, M2, Delta, Hq, Sq, Skv, Sq_pad, qk_scale, scale,
           GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    dq_program(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_desc, k_desc, v_desc, do_desc,
               dq_desc, M2, Delta, Hq, Sq, Skv, Sq_pad, qk_scale, scale, GROUP, D, CAUSAL, BLOCK_M, BLOCK_N)


@triton.jit
def bwd_one_launch(qa_desc, ka_desc, va_desc, doa_desc, dk_desc, dv_desc,
                   qb_desc, kb_desc, vb_desc, dob_desc, dq_desc, M2, Delta, Hq, Hkv, Sq, Skv, Sq_pad,
                   qk_scale, scale, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr):
    """Both kernels in one grid: the dK/dV programs first, then the dQ programs, which fill the SMs
    that the dK/dV programs' tail leaves idle (the two write disjoint outputs: still deterministic)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    num_n = tl.cdiv(Skv, BLOCK_N1)
    if pid < num_n * Hkv:
        dkdv_program(pid % num_n, pid // num_n, b, qa_desc, ka_desc, va_desc, doa_desc, dk_desc, dv_desc,
                     M2, Delta, Delta, Hq, Sq, Skv, Sq_pad, qk_scale, scale,
                     GROUP, D, CAUSAL, BLOCK_M1, BLOCK_N1, False)
    else:
        pid2 = pid - num_n * Hkv
        num_m = tl.cdiv(Sq, BLOCK_M2)
        dq_program(pid2 % num_m, pid2 // num_m, b, qb_desc, kb_desc, vb_desc, dob_desc, dq_desc,
                   M2, Delta, Hq, Sq, Skv, Sq_pad, qk_scale, scale, GROUP, D, CAUSAL, BLOCK_M2, BLOCK_N2)


# ----------------------------------------------------------------------------- host wrapper
# Per kernel: (BLOCK_M, BLOCK_N, num_warps, num_stages). dK/dV's BLOCK_N is its key tile (kept on
# chip), BLOCK_M the query tile it streams; dQ's BLOCK_M is its query tile, BLOCK_N the key tile.
# Measured on an H100 by tune.py (fp16; one kernel at a time; `large` for causal_short, causal_8k
# for causal_long, noncausal_8k for full; two runs, the second's winners kept). Kernel times in ms,
# causal_short / causal_long / full:
#   dK/dV 64 x 128, 8 warps, 3 stages: 1.41 / 2.06 / 3.79;  4 stages 1.55 / 2.12 / 3.76;
#         2 stages 1.50 / 2.24 / 4.39;  64 x 64, 4 warps, 3 stages 1.51 / 2.27 / 4.39;
#         128 x 64 (128 query rows) 2.64 / 3.88 / 6.72;  128 x 128: out of shared memory (3 stages)
#         or 3-4x slower (2 stages: spills)
#   dQ    128 x 64, 8 warps, 3 stages: 0.87 / 1.40 / 2.55;  4 stages 0.88 / 1.37 / 2.50;
#         128 x 32, 4 warps 0.91 / 1.53 / 2.71;  128 x 128, 2 stages 0.93 / 1.50 / 2.72
#   fused atomic dQ (dK/dV 64 x 128, 8 warps, 3 stages): 2.86 / 4.25 / 6.88 against the two
#         kernels' 2.28 / 3.44 / 6.27: the atomics lose, so dQ keeps its own kernel.
# 3 and 4 stages are within 2% of each other; the table keeps the second run's picks.
#   one launch (bwd_one_launch, with dK/dV's warps and stages for both) against the two kernels
#         launched one after the other, full backward in fp16: 1.063x on `large`, 1.04-1.05x
#         causal 4k-8k, 1.005-1.02x at 16k and non-causal (tune.py --one-launch).
TILES = {
    "causal_short": {"dkdv": (64, 128, 8, 3), "dq": (128, 64, 8, 3), "fused_dq": False, "one_launch": True},
    "causal_long": {"dkdv": (64, 128, 8, 3), "dq": (128, 64, 8, 4), "fused_dq": False, "one_launch": True},
    "full": {"dkdv": (64, 128, 8, 4), "dq": (128, 64, 8, 4), "fused_dq": False, "one_launch": True},
}
PORTABLE_TILES = {"dkdv": (64, 64, 4, 2), "dq": (64, 64, 4, 2), "fused_dq": False, "one_launch": False}
INTERPRET_TILES = {"dkdv": (64, 64, 4, 1), "dq": (64, 64, 4, 1), "fused_dq": False, "one_launch": True}
FORCE_TILES = None                          # a dict like TILES' entries overrides the table (tune.py)
PARTS = ("dkdv", "dq")                      # tune.py times one kernel at a time by narrowing this


def pick_tiles(Sq, Skv, D, causal):
    if FORCE_TILES is not None:
        return FORCE_TILES
    if common.INTERPRET:
        return INTERPRET_TILES
    if torch.cuda.get_device_capability()[0] < 9:
        return PORTABLE_TILES
    if not causal:
        return TILES["full"]
    return TILES["causal_short" if Sq < 4096 else "causal_long"]


def _tma_ready(t):
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def _desc(t, rows, D):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D])


def preprocess(o, do, lse):
    """(delta, m2), fp32 [B, Hq, Sq_pad] with Sq_pad a multiple of PAD: rowsum(dO * O) and lse * log2(e)
    (padding: 0 and +inf). Sq > 0."""
    B, Hq, Sq, D = o.shape
    Sq_pad = triton.cdiv(Sq, PAD) * PAD
    delta = torch.empty((B, Hq, Sq_pad), dtype=torch.float32, device=o.device)
    m2 = torch.empty_like(delta)
    if B * Hq > 0:
        bwd_preprocess[(Sq_pad // PAD, B * Hq)](o, do, lse.contiguous(), delta, m2, *o.stride()[:3], *do.stride()[:3],
                                                Hq, Sq, Sq_pad, D=D, BLOCK_M=PAD)
    return delta, m2


def attention_backward(q, k, v, o, lse, do, causal=False, scale=None):
    """(dq, dk, dv) in the inputs' dtype. q, o, do [B,Hq,Sq,D]; k, v [B,Hkv,Skv,D] (any strides)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    assert k.shape == v.shape and Hq % Hkv == 0 and o.shape == do.shape == q.shape
    scale = default_scale(D, scale)
    q, k, v, do = (t if t.stride(-1) == 1 and _tma_ready(t) else t.contiguous() for t in (q, k, v, do))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if Sq == 0 or Skv == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    tiles = pick_tiles(Sq, Skv, D, causal)
    delta, m2 = preprocess(o, do, lse)
    Sq_pad = delta.shape[-1]
    qk_scale = scale * LOG2E
    common_meta = dict(GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal))

    def launch(cfg):
        return {} if common.INTERPRET else dict(num_warps=cfg[2], num_stages=cfg[3])

    if tiles.get("one_launch"):
        (bm1, bn1, nw, ns), (bm2, bn2) = tiles["dkdv"], tiles["dq"][:2]
        grid = (triton.cdiv(Skv, bn1) * Hkv + triton.cdiv(Sq, bm2) * Hq, B)
        bwd_one_launch[grid](
            _desc(q, bm1, D), _desc(k, bn1, D), _desc(v, bn1, D), _desc(do, bm1, D), _desc(dk, bn1, D),
            _desc(dv, bn1, D), _desc(q, bm2, D), _desc(k, bn2, D), _desc(v, bn2, D), _desc(do, bm2, D),
            _desc(dq, bm2, D), m2, delta, Hq, Hkv, Sq, Skv, Sq_pad, qk_scale, scale, **common_meta,
            BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2, **launch(tiles["dkdv"]))
        return dq, dk, dv
    fused = tiles["fused_dq"]
    dq_acc = torch.zeros((B, Hq, Sq_pad, D), dtype=torch.float32, device=q.device) if fused else delta
    if "dkdv" in PARTS:
        bm, bn = tiles["dkdv"][:2]
        bwd_dkdv[(triton.cdiv(Skv, bn), Hkv, B)](
            _desc(q, bm, D), _desc(k, bn, D), _desc(v, bn, D), _desc(do, bm, D), _desc(dk, bn, D),
            _desc(dv, bn, D), m2, delta, dq_acc, Hq, Sq, Skv, Sq_pad, qk_scale, scale,
            **common_meta, BLOCK_M=bm, BLOCK_N=bn, FUSED_DQ=fused, **launch(tiles["dkdv"]))
    if fused:
        dq.copy_(dq_acc[:, :, :Sq])
    elif "dq" in PARTS:
        bm, bn = tiles["dq"][:2]
        bwd_dq[(triton.cdiv(Sq, bm), Hq, B)](
            _desc(q, bm, D), _desc(k, bn, D), _desc(v, bn, D), _desc(do, bm, D), _desc(dq, bm, D),
            m2, delta, Hq, Sq, Skv, Sq_pad, qk_scale, scale,
            **common_meta, BLOCK_M=bm, BLOCK_N=bn, **launch(tiles["dq"]))
    return dq, dk, dv


flash_attention_train = common.make_train_fn(attention_backward, "FlashAttentionTrainV3")


# ----------------------------------------------------------------------------- test
if __name__ == "__main__":
    from facourse.backward import check_gradients
    for name in ("ragged", "empty_rows", "mqa", "decode", "ragged_noncausal"):
        check_gradients(flash_attention_train, name)
