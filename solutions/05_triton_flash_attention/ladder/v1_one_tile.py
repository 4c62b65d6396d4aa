"""v1: one program per query tile Q_i holds the whole key range as ONE tile: S, P, O in registers.
Only for Skv <= 256 (the tile must fit); the plain softmax, no online update yet. BLOCK_M = 64.

v1 verdict: correct, but one tile only (Skv <= 256): 50 TFLOP/s on 8x32/8 heads, 128^2, causal, fp16 (0.95x SDPA FA2 there), H100.
Measured: benchmarks/results/2026-11-23_h100_step05.json (python -m benchmarks.ladder 05; GPU time, L2 flushed, median of 25).

FlashAttention-2's tiling (Dao, 2023) reduced to its first step, in Triton with raw pointers and
masks. One program computes one query tile Q_i (BLOCK_M rows) of one query head against a single
key tile that holds every key: S = scale * Q_i K^T, the causal mask (bottom-right), the plain
softmax of each row, O_i = P V / l. No loop over key tiles yet, hence no online softmax (v2).

Run on its own:  python v1_one_tile.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import math
import os
import sys

import torch

from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before any kernel is defined

import triton
import triton.language as tl

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from step05_kernel import program_heads  # noqa: E402  (the grid's (batch, head) mapping, shared by every rung)




# ----------------------------------------------------------------------------- reference
def reference(q, k, v, causal=False, scale=None):
    """(o, lse) in float32 with bottom-right causal masking and GQA (facourse has the checked one)."""
    from facourse import reference_attention
    return reference_attention(q, k, v, causal, scale)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def attn_fwd(Q, K, V, O, LSE,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             Hq, Sq, Skv, scale,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # program ids: axis 0 = query tile, axis 1 = (batch, head)
    pid_m = tl.program_id(0)
    bh, b, h, h_kv = program_heads(Hq, GROUP)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    k_base = K + b.to(tl.int64) * skb + h_kv.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + h_kv.to(tl.int64) * svh
    q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < Sq, other=0.0)

    off = Skv - Sq                                            # bottom-right alignment
    offs_n = tl.arange(0, BLOCK_N)                            # BLOCK_N >= Skv: one tile holds every key
    kT = tl.load(k_base + offs_n[None, :] * sks + offs_d[:, None], mask=offs_n[None, :] < Skv, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * svs + offs_d[None, :], mask=offs_n[:, None] < Skv, other=0.0)
    s = tl.dot(q, kT) * scale                                 # S = scale * Q K^T
    keep = offs_n[None, :] < Skv
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + off)      # j <= i + (Skv - Sq)
    s = tl.where(keep, s, float("-inf"))
    m = tl.max(s, 1)                                          # row max
    m_use = tl.where(m == float("-inf"), 0.0, m)              # a row that sees no key
    p = tl.exp(s - m_use[:, None])                            # P = exp(S - m)
    l = tl.sum(p, 1)                                          # row sum
    acc = tl.dot(p.to(v.dtype), v)                            # O = P V, not yet divided by l
    l_safe = tl.where(l == 0.0, 1.0, l)
    o = acc / l_safe[:, None]
    lse = tl.where(l == 0.0, float("-inf"), m_use + tl.log(l_safe))
    o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    tl.store(o_base + offs_m[:, None] * sos + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=offs_m[:, None] < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)


# ----------------------------------------------------------------------------- host wrapper
CONFIG = {"BLOCK_M": 64}
LAUNCH = {"num_warps": 4, "num_stages": 2}


def flash_attention_triton(q, k, v, causal=False, scale=None):
    """FlashAttention-2 forward. q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (any strides). Returns (o, lse)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    assert k.shape == v.shape and Hq % Hkv == 0 and D in (16, 32, 64, 128, 256)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    if Sq == 0:
        return o, lse
    args = (q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            Hq, Sq, Skv, scale)
    meta = dict(GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal))
    if Skv > 256:
        raise ValueError(f"v1 holds all keys in one tile: Skv = {Skv} > 256 does not fit; see v2")
    meta["BLOCK_N"] = max(16, triton.next_power_of_2(Skv))
    grid = (triton.cdiv(Sq, CONFIG["BLOCK_M"]), B * Hq)
    launch = {} if os.environ.get("TRITON_INTERPRET") == "1" else LAUNCH
    attn_fwd[grid](*args, **meta, **CONFIG, **launch)
    return o, lse


# ----------------------------------------------------------------------------- test
def test():
    from facourse import check_entry_point
    names = ["small", "empty_rows", "mqa", "overflow"]               # the configs with Skv <= 256
    dtypes = [torch.float16, torch.bfloat16] if torch.cuda.is_available() else [torch.float16]
    for dt in dtypes:
        for name in names:
            check_entry_point(flash_attention_triton, name, dtype=dt, expect_lse=True)


# ----------------------------------------------------------------------------- benchmark
def bench():
    from facourse import bench_attention
    from facourse import AttnConfig
    cfg = AttnConfig("short", 8, 32, 8, 128, 128, 128, True)
    print(bench_attention(flash_attention_triton, cfg).summary())


if __name__ == "__main__":
    test()
    if torch.cuda.is_available() and "--no-bench" not in sys.argv:
        bench()
