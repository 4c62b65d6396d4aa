"""v5: FP8 (e4m3) attention on Hopper: both products in FP8 on the tensor cores, fp32 accumulation.

Lecture 10, section 7. On the host, q, k and v (fp16 or bf16) are quantised to ``float8_e4m3fn``
with one scale per (batch, head): x8 = x / descale with descale = amax / 448, so the largest
magnitude lands on e4m3's largest value. The kernel is step 05's causal-split FlashAttention-2
forward with both products in FP8: S = Q8 K8^T accumulates in fp32, and the descales are folded into
the softmax's scale (scale * descale_q * descale_k * log2(e), one factor); P = exp2(...) lies in
[0, 1] and is cast to e4m3 without a scale, multiplied by V8, and the output takes descale_v once at
the end, where it is divided by l (the row sum of the fp32 P). o comes back in the input's dtype.

The layout of V. Hopper's FP8 tensor-core instruction (wgmma) reads both operands from shared memory
K-major: the reduction dimension contiguous. For S = Q K^T that is D, which K's rows [S, D] already
have. For O = P V the reduction runs over the keys, so V must be stored [B, H, D, S] (V transposed,
contiguous): the kernel loads V^T tiles [D, BLOCK_N] and hands tl.dot their transpose, a view whose
keys are contiguous. (Triton's fused-attention tutorial does the same for its FP8 path.)

Needs a GPU with FP8 tensor cores (sm_89 or later); on a CPU the entry points raise. ``run_kernel``
launches the kernel without that check: the tests run it in Triton's interpreter.
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

E4M3_MAX = 448.0
INTERPRET = vc.interpret_without_gpu()
# (BLOCK_M, BLOCK_N, num_warps, num_stages) by causal or not. Non-causal measured on an H100 (`long`,
# inputs already in FP8, 2026-11-23): 64 x 128 with 4 warps, 3 stages 809 TFLOP/s; 128 x 128 with 8
# warps 627 / 716 / 725 (2 / 3 / 4 stages); 128 x 64, 3 stages 628; 128 x 256, 2 stages 682. Causal:
# step 05's tile, not swept in FP8.
TILES = {True: (128, 64, 8, 3), False: (64, 128, 4, 3)}
INTERPRET_TILES = (64, 64, 4, 1)
FORCE_TILES = None                           # (BLOCK_M, BLOCK_N, num_warps, num_stages) for a sweep


@triton.jit
def fp8_tiles(acc, m_i, l_i, q, k_base, vt_base, sks, svd, i, lo, hi, Skv, off, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles [lo, hi) of one query tile. MASKED tiles check the bounds and, causal, the diagonal."""
    d = tl.arange(0, D)
    for start_n in tl.range(lo, hi, BLOCK_N):
        j = start_n + tl.arange(0, BLOCK_N)[None, :]
        if MASKED:
            kT = tl.load(k_base + j * sks + d[:, None], mask=j < Skv, other=0.0)     # K_j^T [D, BLOCK_N]
            vT = tl.load(vt_base + d[:, None] * svd + j, mask=j < Skv, other=0.0)    # V_j^T [D, BLOCK_N]
        else:
            kT = tl.load(k_base + j * sks + d[:, None])
            vT = tl.load(vt_base + d[:, None] * svd + j)
        s = tl.dot(q, kT)                                           # FP8 x FP8 -> fp32
        if MASKED:
            keep = j < Skv
            if CAUSAL:
                keep = keep & (j <= i + off)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_use[:, None])             # in [0, 1]: e4m3 needs no scale
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(vT.dtype), tl.trans(vT), acc * alpha[:, None])   # V_j: keys contiguous (K-major)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def fp8_fwd(Q, K, VT, O, LSE, DESCALE_Q, DESCALE_K, DESCALE_V,
            sqb, sqh, sqs, skb, skh, sks, svb, svh, svd, sob, soh, sos,
            Hq, Hkv, Sq, Skv, scale, CAUSAL: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile of one (batch, head). Q [B, Hq, Sq, D], K [B, Hkv, Skv, D], VT [B, Hkv, D, Skv]."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m                    # longest query tiles first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    h_kv = h // GROUP
    start_m = pid_m * BLOCK_M
    i = start_m + tl.arange(0, BLOCK_M)[:, None]
    d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i * sqs + d[None, :], mask=i < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + h_kv.to(tl.int64) * skh
    vt_base = VT + b.to(tl.int64) * svb + h_kv.to(tl.int64) * svh
    # S in log2 units = s8 * scale * descale_q * descale_k * log2(e): one factor
    qk_scale = scale * tl.load(DESCALE_Q + b * Hq + h) * tl.load(DESCALE_K + b * Hkv + h_kv) * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    off = Skv - Sq                                                  # bottom-right alignment
    full_n = (Skv // BLOCK_N) * BLOCK_N                             # tiles with no ragged column
    if CAUSAL:
        end_free = tl.minimum(tl.maximum(start_m + off + 1, 0) // BLOCK_N * BLOCK_N, full_n)
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), Skv)
    else:
        end_free = full_n
        hi = Skv
    acc, m_i, l_i = fp8_tiles(acc, m_i, l_i, q, k_base, vt_base, sks, svd, i, 0, end_free, Skv, off, qk_scale,
                              False, CAUSAL, D, BLOCK_N)          # off-band tiles: no mask
    acc, m_i, l_i = fp8_tiles(acc, m_i, l_i, q, k_base, vt_base, sks, svd, i, end_free, hi, Skv, off, qk_scale,
                              True, CAUSAL, D, BLOCK_N)           # the diagonal's and the ragged tile

    o, lse = vc.finish(acc, m_i, l_i)
    o = o * tl.load(DESCALE_V + b * Hkv + h_kv)                     # V's scale, once per row
    tl.store(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i * sos + d[None, :], o.to(O.dtype.element_ty),
             mask=i < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


def quantize_fp8(x):
    """(x8, descale): x [B, H, S, D] in float8_e4m3fn with one scale per (batch, head), descale =
    amax / 448 fp32 [B, H] (x ~ x8 * descale). An all-zero head keeps a descale of 1."""
    amax = x.abs().amax(dim=(-2, -1)).float()
    descale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (x.float() / descale[..., None, None]).to(torch.float8_e4m3fn), descale


def require_fp8_gpu(t):
    if not (t.is_cuda and torch.cuda.get_device_capability(t.device) >= (8, 9)):
        where = f"sm_{''.join(map(str, torch.cuda.get_device_capability(t.device)))}" if t.is_cuda else "the CPU"
        raise RuntimeError(f"v5_fp8 needs a GPU with FP8 tensor cores (sm_89 or later: Ada, Hopper); the "
                           f"tensors are on {where}")


def run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype):
    """The launch, with no device check. q8 [B, Hq, Sq, D], k8 [B, Hkv, Skv, D] (stride(-1) == 1),
    v8t [B, Hkv, D, Skv] (stride(-1) == 1), descales fp32 [B, Hq] and [B, Hkv]. Returns (o, lse)."""
    B, Hq, Sq, D = q8.shape
    Hkv, Skv = k8.shape[1], k8.shape[2]
    assert v8t.shape == (B, Hkv, D, Skv) and q8.stride(-1) == k8.stride(-1) == v8t.stride(-1) == 1
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    o = torch.zeros((B, Hq, Sq, D), device=q8.device, dtype=out_dtype)
    lse = torch.full((B, Hq, Sq), -math.inf, device=q8.device, dtype=torch.float32)
    if Sq == 0 or Skv == 0:
        return o, lse
    BLOCK_M, BLOCK_N, num_warps, num_stages = FORCE_TILES or (INTERPRET_TILES if INTERPRET else TILES[bool(causal)])
    launch = {} if INTERPRET else dict(num_warps=num_warps, num_stages=num_stages)
    descales = (t.float().contiguous() for t in (descale_q, descale_k, descale_v))
    fp8_fwd[(triton.cdiv(Sq, BLOCK_M), B * Hq)](
        q8, k8, v8t, o, lse, *descales, *q8.stride()[:3], *k8.stride()[:3], *v8t.stride()[:3], *o.stride()[:3],
        Hq, Hkv, Sq, Skv, scale, bool(causal), Hq // Hkv, D, BLOCK_M, BLOCK_N, **launch)
    return o, lse


def flash_attention_fp8_prequantized(q8, k8, v8t, descale_q, descale_k, descale_v, causal=True, scale=None,
                                     out_dtype=torch.float16):
    """The FP8 kernel on inputs already quantised (timing without the quantisation): see run_kernel."""
    require_fp8_gpu(q8)
    return run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype)


def flash_attention_fp8(q, k, v, causal=True, scale=None):
    """FP8 attention: q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] in fp16 or bf16, quantised to e4m3
    per (batch, head). Returns (o in q's dtype, lse fp32 natural log)."""
    require_fp8_gpu(q)
    validate_triton_inputs(q, k, v, scale)
    (q8, dq), (k8, dk), (v8, dv) = (quantize_fp8(t) for t in (q, k, v))
    return run_kernel(q8, k8, v8.transpose(-1, -2).contiguous(), dq, dk, dv, causal, scale, q.dtype)
