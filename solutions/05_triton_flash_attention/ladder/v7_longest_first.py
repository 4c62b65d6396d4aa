"""v7: causal query tiles scheduled longest first across heads, chunk by chunk; the solution.

v7 verdict: 1.44x FA2 on large fp16, 1.26x bf16; causal 4k 1.39x fp16, 1.22x bf16; causal 16k 1.60x; H100 (run 5).
Longest first pays at 4k (ladder section: 1.40x against v6's 1.28x); from 8k on v7 keeps v6's order.
Measured: benchmarks/results/2026-11-22_h100_step05.json (benchmarks/run_gpu.py: solution bench, sweep and ladder sections).

FlashAttention-2 forward (Dao, 2023, Algorithm 1) in Triton. One program computes one query tile
Q_i (BLOCK_M rows) of one query head against every K_j, V_j tile it can see. Causal attention runs
in two stages: the off-band tiles, fully visible, with no mask at all; then the few on-band tiles
that cross the diagonal (and the ragged last tile), with the mask. Tiles above the diagonal are
never visited. Query tiles are launched longest first.

What changed from v6, and why. v6 launched, head after head, each head's query tiles longest
first: the last heads' longest tiles then start late and run on while the other SMs have
nothing left to do, a tail as long as one of the longest tiles. v7 numbers the programs on one
axis and maps them so that, inside a chunk of (batch, head) pairs, the longest tile of every pair
runs first, then the next length, down to the shortest; chunk after chunk. The last programs to
start are short, so the SMs run out of work together (longest-processing-time-first, as
FlashAttention-3's tile scheduler does). A chunk holds about two programs per SM
(ceil(2 * SMs / query tiles) pairs, rounded up to whole GQA groups): enough for every SM to start
on a long tile, and few enough heads that the K and V the programs in flight read stay in L2
(on an H100 at D = 128 and 128-row tiles, about 17 MB / GROUP whatever the length). Non-causal tiles are all
equally long and keep v6's order, and so do causal rows longer than 4k (chunk = 1: one head at a
time), where v6's order measured faster (16k: 1.71x against 1.54x). Everything else is v6: host-side tensor
descriptors, the measured tile table.

Run on its own:  python v7_longest_first.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import functools
import math
import os
import sys

import torch

from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before any kernel is defined

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------- reference
def reference(q, k, v, causal=False, scale=None):
    """(o, lse) in float32 with bottom-right causal masking and GQA (facourse has the checked one)."""
    from facourse import reference_attention
    return reference_attention(q, k, v, causal, scale)


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def online_softmax_update(m_i, l_i, s, qk_scale):
    """One step of the online softmax in base 2. s = Q_i K_j^T (unscaled), m_i in log2 units.

    Returns the new running max m, the new running sum l, the factor alpha that rescales the
    accumulator, and P_ij = exp2(s * qk_scale - m).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet
    alpha = tl.math.exp2(m_i - m_use)                         # alpha = exp(m_old - m_new)
    p = tl.math.exp2(s * qk_scale - m_use[:, None])           # P_ij = exp(S_ij - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)                        # l = alpha * l + rowsum(P_ij)
    return m_new, l_new, alpha, p


@triton.jit
def attn_tiles(acc, m_i, l_i, q, k_desc, v_desc, b, h_kv, offs_m, lo, hi, Skv, qk_scale, off,
               BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Visit key tiles [lo, hi) of one query tile. MASKED tiles check bounds and the diagonal."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)   # K_j; rows past Skv read 0
        v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)   # V_j
        s = tl.dot(q, k.T)                                            # S_ij = Q_i K_j^T
        if MASKED:
            cols = start_n + offs_n
            keep = cols[None, :] < Skv
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + off)    # j <= i + (Skv - Sq)
            s = tl.where(keep, s, float("-inf"))
        m_i, l_i, alpha, p = online_softmax_update(m_i, l_i, s, qk_scale)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)                           # O_i += P_ij V_j
    return acc, m_i, l_i


# ----------------------------------------------------------------------------- kernel
@triton.jit
def attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, B, Hq, Sq, Skv, qk_scale, CHUNK,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # one axis of num_m * B * Hq programs -> (query tile pid_m, batch x head bh)
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid = tl.program_id(0)
    if CAUSAL:
        # longest first: chunk after chunk of CHUNK (batch, head) pairs; inside a chunk, the
        # longest tile of every pair, then the next length, ...; the last chunk may be smaller
        chunk = pid // (num_m * CHUNK)
        first = chunk * CHUNK
        size = tl.minimum(CHUNK, B * Hq - first)
        r = pid - chunk * (num_m * CHUNK)
        pid_m = num_m - 1 - r // size
        bh = first + r % size
    else:
        pid_m = pid % num_m
        bh = pid // num_m
    b = bh // Hq
    h = bh % Hq
    h_kv = h // GROUP                                         # GQA: head h reads KV head h // group

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, D)   # Q_i; rows past Sq read 0

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    off = Skv - Sq                                            # bottom-right alignment
    full_n = (Skv // BLOCK_N) * BLOCK_N                       # tiles with no ragged columns
    if CAUSAL:
        # keys every row of the tile sees: j <= start_m + off; the tile's last row sees up to hi
        end_free = tl.maximum(start_m + off + 1, 0) // BLOCK_N * BLOCK_N
        end_free = tl.minimum(end_free, full_n)
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), Skv)
    else:
        end_free = full_n
        hi = Skv
    # stage 1: off-band tiles, no mask
    acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_desc, v_desc, b, h_kv, offs_m, 0, end_free,
                               Skv, qk_scale, off, BLOCK_N, D, False, CAUSAL)
    # stage 2: on-band (diagonal) and ragged tiles, masked
    acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_desc, v_desc, b, h_kv, offs_m, end_free, hi,
                               Skv, qk_scale, off, BLOCK_N, D, True, CAUSAL)

    # epilogue: O_i = acc / l_i; lse_i = (m_i + log2 l_i) * ln 2; empty rows give 0 and -inf
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_desc.store([b, h, start_m, 0], o.to(o_desc.dtype).reshape(1, 1, BLOCK_M, D))  # rows past Sq clipped
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)


# ----------------------------------------------------------------------------- host wrapper
# (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg) by shape class, measured on an H100 by
# tile_sweep.py (results/2026-11-22_h100_step05_tiles.json: ten candidates, `large` and the 4k-16k
# points, fp16 and bf16). Programs per SM, from the compiler's report (shared memory, registers):
#   128 x 64, 8 warps, 2 stages, 128 registers:  98,320 B: 2 per SM (152 registers uncapped: 1)
#   128 x 64, 8 warps, 3 stages: 132,096 B, 152 registers: 1 per SM
#   128 x 128, 8 warps, 3 stages: 230,400 B, 192-203 registers: 1 per SM
#   64 x 64, 4 warps, 3 stages: 115,712 B: 1 per SM (v5's pick; v4's 114,688 B fit 2)
TILES = {
    "causal_short": (128, 64, 8, 2, 128),   # causal, Sq < 4096 (`large`): two programs per SM
    "causal_long": (128, 64, 8, 3, None),   # causal, Sq >= 4096
    "full": (128, 128, 8, 3, None),         # non-causal
}
PORTABLE_TILES = (64, 64, 4, 2, None)       # before Hopper (83 KB of shared memory)
INTERPRET_TILES = (128, 128, 4, 1, None)    # fewer, larger NumPy operations in the interpreter
FORCE_TILES = None                          # a 5-tuple here overrides the table (tile_sweep.py)


def pick_tiles(Sq, Skv, D, causal):
    """The table's entry for a shape (its keys are shape classes, not exact shapes)."""
    if FORCE_TILES is not None:
        return FORCE_TILES
    if INTERPRET:
        return INTERPRET_TILES
    if D > 128 or torch.cuda.get_device_capability()[0] < 9:
        return PORTABLE_TILES
    if not causal:
        return TILES["full"]
    return TILES["causal_short" if Sq < 4096 else "causal_long"]


@functools.lru_cache(maxsize=None)
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device):
    """SMs of the GPU (4 in the interpreter, so that its small tests still cut several chunks)."""
    return 4 if INTERPRET else _sm_count(torch.device(device).index or 0)


def _tma_ready(t):
    """TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last."""
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def flash_attention_triton(q, k, v, causal=False, scale=None):
    """FlashAttention-2 forward. q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (any strides). Returns (o, lse)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    assert k.shape == v.shape and Hq % Hkv == 0 and D in (16, 32, 64, 128, 256)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q, k, v = (t if _tma_ready(t) else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    if Sq == 0:
        return o, lse
    if Skv == 0:                                  # no key at all: every row is empty
        return o.zero_(), lse.fill_(float("-inf"))
    BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg = pick_tiles(Sq, Skv, D, causal)
    # one 4-D descriptor per tensor: [B, H, S, D] with the tensor's own strides; a tile is
    # [1, 1, BLOCK, D]. The kernel reshapes it to [BLOCK, D] (free: it stays in shared memory).
    q_desc = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, BLOCK_M, D])
    k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, BLOCK_N, D])
    v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, BLOCK_N, D])
    o_desc = TensorDescriptor(o, list(o.shape), list(o.stride()), [1, 1, BLOCK_M, D])
    launch = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg is not None:
        launch["maxnreg"] = maxnreg
    num_m = triton.cdiv(Sq, BLOCK_M)
    group = Hq // Hkv
    chunk = triton.cdiv(triton.cdiv(2 * sm_count(q.device), num_m), group) * group
    if Sq > 4096:    # long rows: one head at a time (v6's order) measured faster than chunks at 8k-16k
        chunk = 1
    grid = (num_m * B * Hq,)
    attn_fwd[grid](q_desc, k_desc, v_desc, o_desc, lse, B, Hq, Sq, Skv, scale * LOG2E, min(chunk, B * Hq),
                   GROUP=group, D=D, CAUSAL=bool(causal), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return o, lse


# ----------------------------------------------------------------------------- test
def test():
    from facourse import check_all
    check_all(flash_attention_triton, expect_lse=True)   # the five configurations, every edge case


# ----------------------------------------------------------------------------- benchmark
def bench():
    from facourse import bench_attention
    for name in ["large", "long"]:
        print(bench_attention(flash_attention_triton, name).summary())


if __name__ == "__main__":
    test()
    if torch.cuda.is_available() and "--no-bench" not in sys.argv:
        bench()
