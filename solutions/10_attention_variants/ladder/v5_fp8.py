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

The loads. Q, K, V^T and O go through host-side 4-D tensor descriptors (v4's TMA loads): the TMA
unit fetches whole tiles and fills rows and columns past Sq or Skv with zeros, so no load takes a
mask (the ragged tile's keys are still masked in S) and no address is computed per element. TMA
wants 16-byte strides: V^T's rows are Skv bytes, so a ragged Skv gets a padded copy (padded_for_tma).
Before Hopper, Triton turns the descriptor loads back into pointer loads. On an H100 (`long`, inputs
already in FP8, 64 x 128 tiles) this took the kernel from 801-803 to 876-880 TFLOP/s in the same
sweep (see TILES), and to 888-890 in the step-10 ladder run of 2026-11-24, 1.47x v6's fp16 605.

Needs a GPU with FP8 tensor cores (sm_89 or later); on a CPU the entry points raise. ``run_kernel``
launches the kernel without that check: the tests run it in Triton's interpreter.
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)
import variants_common as vc  # noqa: E402  (sets up the interpreter without a GPU, before triton)

sys.path.append(os.path.join(HERE, "..", "..", "05_triton_flash_attention", "ladder"))
from step05_kernel import causal_split_bounds  # noqa: E402  (key tiles [0, end_free) unmasked, to hi masked)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from facourse.triton_setup import validate_triton_inputs  # noqa: E402

E4M3_MAX = 448.0
INTERPRET = vc.interpret_without_gpu()
# (BLOCK_M, BLOCK_N, num_warps, num_stages), one tile for causal and not. Measured on an H100 (Triton 3.6, inputs
# already in FP8, facourse.bench.time_calls, all variants in interleaved rounds; 2026-11-24). `long`
# (non-causal, 8k): 64 x 128 with 4 warps 711 / 876-880 / 600 TFLOP/s (2 / 3 / 4 stages; the same tile
# through pointer loads 801-803 in the same runs); 128 x 128 with 8 warps 607 / 723 / 719; 128 x 64,
# 8 warps, 3 stages 580; 64 x 64, 3 stages 772; 64 x 256, 2 stages 547; 128 x 256, 2 stages 693. Tried
# on 64 x 128 and slower: ex2.approx.f16x2 (two exp2 per MUFU instruction, then fp16 -> e4m3) 769;
# S of the next tile issued before this tile's softmax 585 (255 registers); the loop unrolled twice
# 561; 2 stages capped at 168 registers (room for three programs per SM) 815; tl.range(warp_specialize=True)
# does not compile with 4 warps and changes nothing with 8. Causal 8k (B 2, H 16): 64 x 128 760-766,
# 64 x 64 718-719, 128 x 64 with 8 warps 540; `large` (causal 1k): 64 x 64 591-598, 64 x 128 559-567.
TILES = (64, 128, 4, 3)
INTERPRET_TILES = (64, 64, 4, 1)
FORCE_TILES = None                           # (BLOCK_M, BLOCK_N, num_warps, num_stages) for a sweep


@triton.jit
def masked_max(s, m_i, qk_scale, start_n, i, Skv, off, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               BLOCK_N: tl.constexpr, OFFSET: tl.constexpr = 0.0):
    """(S, new row max, the max to subtract): S's keys past Skv and, causal, past the diagonal at -inf
    on a MASKED tile; the row max in log2 units. OFFSET: s holds S + OFFSET (v7's INT8_QK = 2)."""
    if MASKED:
        j = start_n + tl.arange(0, BLOCK_N)[None, :]
        keep = j < Skv
        if CAUSAL:
            keep = keep & (j <= i + off)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, (tl.max(s, 1) - OFFSET) * qk_scale)
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)       # a row that has seen no key yet
    else:
        m_use = m_new                                               # finite: the tile's keys are all seen
    return s, m_new, m_use


@triton.jit
def fp8_tiles(acc, m_i, l_i, q, K, VT, b, h_kv, i, lo, hi, Skv, off, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles [lo, hi) of one query tile. MASKED tiles check the bounds and, causal, the diagonal."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = K.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)              # K_j [BLOCK_N, D]; rows past Skv: 0
        vT = VT.load([b, h_kv, 0, start_n]).reshape(D, BLOCK_N)            # V_j^T [D, BLOCK_N]; likewise
        s = tl.dot(q, k.T)                                          # FP8 x FP8 -> fp32
        s, m_new, m_use = masked_max(s, m_i, qk_scale, start_n, i, Skv, off, MASKED, CAUSAL, BLOCK_N)
        p = tl.math.exp2(s * qk_scale - m_use[:, None])             # one FMA; in [0, 1]: e4m3 needs no scale
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(vT.dtype), vT.T, acc * alpha[:, None])   # V_j: keys contiguous (K-major)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def fp8_fwd(Q, K, VT, O, LSE, DESCALE_Q, DESCALE_K, DESCALE_V, Hq, Hkv, Sq, Skv, scale,
            CAUSAL: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile of one (batch, head). Q, K, VT, O: 4-D descriptors, Q [B, Hq, Sq, D] and O with
    [1, 1, BLOCK_M, D] tiles, K [B, Hkv, Skv, D] with [1, 1, BLOCK_N, D], VT [B, Hkv, D, Skv] with
    [1, 1, D, BLOCK_N]."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m                    # longest query tiles first
    bh, b, h, h_kv, start_m, i = vc.query_tile(pid_m, Hq, GROUP, BLOCK_M)
    q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, D)              # rows past Sq: 0
    # S in log2 units = s8 * scale * descale_q * descale_k * log2(e): one factor
    qk_scale = scale * tl.load(DESCALE_Q + b * Hq + h) * tl.load(DESCALE_K + b * Hkv + h_kv) * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    off = Skv - Sq                                                  # bottom-right alignment
    end_free, hi = causal_split_bounds(start_m, off, Skv, BLOCK_M, BLOCK_N, CAUSAL)   # step 05's split
    acc, m_i, l_i = fp8_tiles(acc, m_i, l_i, q, K, VT, b, h_kv, i, 0, end_free, Skv, off, qk_scale,
                              False, CAUSAL, D, BLOCK_N)         # off-band tiles: no mask
    acc, m_i, l_i = fp8_tiles(acc, m_i, l_i, q, K, VT, b, h_kv, i, end_free, hi, Skv, off, qk_scale,
                              True, CAUSAL, D, BLOCK_N)          # the diagonal's and the ragged tile

    o, lse = vc.finish(acc, m_i, l_i)
    o = o * tl.load(DESCALE_V + b * Hkv + h_kv)                     # V's scale, once per row
    O.store([b, h, start_m, 0], o.to(O.dtype).reshape(1, 1, BLOCK_M, D))   # rows past Sq clipped
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


def quantize_fp8(x):
    """(x8, descale): x [B, H, S, D] in float8_e4m3fn with one scale per (batch, head), descale =
    amax / 448 fp32 [B, H] (x ~ x8 * descale). An all-zero head keeps a descale of 1."""
    amax = x.abs().amax(dim=(-2, -1)).float()
    descale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (x.float() / descale[..., None, None]).to(torch.float8_e4m3fn), descale


def require_fp8_gpu(t, rung="v5_fp8", hopper=False):
    """Refuse a tensor not on a GPU with FP8 tensor cores (hopper: on a Hopper GPU, for WGMMA)."""
    cap = torch.cuda.get_device_capability(t.device) if t.is_cuda else None
    if cap is None or (cap[0] != 9 if hopper else cap < (8, 9)):
        where = f"sm_{''.join(map(str, cap))}" if cap else "the CPU"
        need = "a Hopper GPU (sm_90: WGMMA)" if hopper else "a GPU with FP8 tensor cores (sm_89 or later: Ada, Hopper)"
        raise RuntimeError(f"{rung} needs {need}; the tensors are on {where}")


def padded_for_tma(t):
    """t when the TMA unit can read it (variants_common.tma_ready), else a copy with its rows padded to
    16 bytes (same shape): V^T's rows are Skv bytes long."""
    if vc.tma_ready(t):
        return t
    es, n = t.element_size(), t.shape[-1]
    padded = torch.empty((*t.shape[:-1], -(-n * es // 16) * 16 // es), dtype=t.dtype, device=t.device)[..., :n]
    return padded.copy_(t)


def outputs(q8, k8, v8t, scale, out_dtype):
    """(scale, o, lse) of a launch, its shapes checked: o zeros and lse -inf when a side is empty (no
    launch), else left unwritten: the kernel stores every row (a row that sees no key as 0 and -inf)."""
    B, Hq, Sq, D = q8.shape
    Hkv, Skv = k8.shape[1], k8.shape[2]
    assert v8t.shape == (B, Hkv, D, Skv) and q8.stride(-1) == k8.stride(-1) == v8t.stride(-1) == 1
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    o = torch.empty((B, Hq, Sq, D), device=q8.device, dtype=out_dtype)
    lse = torch.empty((B, Hq, Sq), device=q8.device, dtype=torch.float32)
    if Sq == 0 or Skv == 0:
        o.zero_(), lse.fill_(-math.inf)
    return scale, o, lse


def descriptors(q8, k8, v8t, o, BLOCK_M, BLOCK_N):
    """The host tensor descriptors of q8, k8 and v8t (padded for TMA) and of o, in the kernel's tiles."""
    D = q8.shape[-1]
    q8, k8, v8t = (padded_for_tma(t) for t in (q8, k8, v8t))
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), block)
            for t, block in ((q8, [1, 1, BLOCK_M, D]), (k8, [1, 1, BLOCK_N, D]), (v8t, [1, 1, D, BLOCK_N]),
                             (o, [1, 1, BLOCK_M, D]))]


def run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype):
    """The launch, with no device check. q8 [B, Hq, Sq, D], k8 [B, Hkv, Skv, D] (stride(-1) == 1),
    v8t [B, Hkv, D, Skv] (stride(-1) == 1), descales fp32 [B, Hq] and [B, Hkv]. Returns (o, lse)."""
    B, Hq, Sq, D = q8.shape
    Hkv, Skv = k8.shape[1], k8.shape[2]
    scale, o, lse = outputs(q8, k8, v8t, scale, out_dtype)
    if Sq == 0 or Skv == 0:
        return o, lse
    BLOCK_M, BLOCK_N, num_warps, num_stages = FORCE_TILES or (INTERPRET_TILES if INTERPRET else TILES)
    descs = descriptors(q8, k8, v8t, o, BLOCK_M, BLOCK_N)
    launch = {} if INTERPRET else dict(num_warps=num_warps, num_stages=num_stages)
    descales = (t.float().contiguous() for t in (descale_q, descale_k, descale_v))
    fp8_fwd[(triton.cdiv(Sq, BLOCK_M), B * Hq)](
        *descs, lse, *descales, Hq, Hkv, Sq, Skv, scale, bool(causal), Hq // Hkv, D, BLOCK_M, BLOCK_N, **launch)
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
