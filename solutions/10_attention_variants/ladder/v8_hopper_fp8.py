"""v8: v7's FP8 quantisation feeding step 07's Hopper kernel in e4m3 (CUDA, sm_90a), for the speed Triton
could not reach.

When this rung was written, v7's Triton kernel topped out near 870 TFLOP/s on inputs already in FP8; the
tensor cores' e4m3 peak is twice their fp16 one, and step 07's kernel runs fp16 at 588-605 TFLOP/s. This
rung keeps v7's numbers (the same quantisers, descales and P times 2^8) and moves the kernel to step
07's structure (v8_hopper_fp8.cu): TMA loads of Q, K and V^T, WGMMA for both products with P from
registers, two consumer warpgroups taking turns, persistent CTAs. What e4m3 changes there: V^T, because
Hopper's 8-bit WGMMA reads shared memory K-major only; k = 32 per instruction; and P's registers, which
the S accumulator lays out differently from the e4m3 A operand (two shuffles within each quad of lanes
and a few byte permutes per 16 columns).

It does not pay (the verdict has the figures; benchmarks/results/2026-11-27_h200_step10_v8_probes.txt the
probes): in e4m3 the two GEMMs of a key block take half their fp16 time while the softmax costs the same
instructions, and in ping-pong one warp per scheduler runs that softmax at about half an instruction per
cycle. The Triton rungs, with two or three independent programs per SM, stay ahead.

Routing, call by call: the CUDA kernel on an sm_90 GPU for D 128; v7's Triton kernel for the rest (D 64,
other GPUs); on a CPU the entry points raise (v7's check). ``quantize_fp8`` and the end-to-end quantisers
are v7's, with V^T in key order and separate descales (v7's operand order and descale records are its
Triton kernel's): the kernel takes one q descale per 64 or per 128 rows, one k and v descale per 128 keys.
"""
import os
import sys
from pathlib import Path

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import v7_fp8_fa3 as v7  # noqa: E402  (sets up the interpreter without a GPU, before triton)

import torch  # noqa: E402

from facourse.triton_setup import validate_triton_inputs  # noqa: E402

v5 = v7.v5
KERNEL = Path(__file__).resolve().with_suffix(".cu")
BINDING = KERNEL.with_name("v8_hopper_fp8_binding.cpp")
quantize_fp8 = v7.quantize_fp8
_extension = None


def extension():
    """The torch extension of v8_hopper_fp8.cu + its binding (built once, for sm_90a)."""
    global _extension
    if _extension is None:
        from facourse.cuda_build import load_hopper_rung
        _extension = load_hopper_rung("fa10_v8_hopper_fp8", [KERNEL, BINDING], [KERNEL.parent])
    return _extension


def runs_on_cuda_kernel(q8) -> bool:
    return q8.is_cuda and torch.cuda.get_device_capability(q8.device) == (9, 0) and q8.shape[-1] == 128


def run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype):
    """v7.run_kernel's contract with V^T's keys in order (q8 [B, Hq, Sq, D], k8 [B, Hkv, Skv, D], v8t [B, Hkv, D,
    Skv], descale_q one per 64 or 128 query rows, descale_k and descale_v one per 128 keys); the CUDA kernel where
    it runs."""
    if not runs_on_cuda_kernel(q8) or out_dtype not in (torch.float16, torch.bfloat16):
        return v7.run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype,
                             operand_order=False)
    scale = q8.shape[-1] ** -0.5 if scale is None else float(scale)
    q8, k8, v8t = (v5.padded_for_tma(t) for t in (q8, k8, v8t))
    return tuple(extension().forward(q8, k8, v8t, descale_q, descale_k, descale_v, bool(causal), scale,
                                     out_dtype == torch.bfloat16))


def flash_attention_fp8_prequantized(q8, k8, v8t, descale_q, descale_k, descale_v, causal=True, scale=None,
                                     out_dtype=torch.float16):
    """The FP8 kernel on inputs already quantised (quantize_fp8 or v7.quantize_qkv): see run_kernel."""
    v5.require_fp8_gpu(q8, "v8_hopper_fp8")
    return run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype)


def flash_attention_fp8(q, k, v, causal=True, scale=None):
    """FP8 attention: q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] in fp16 or bf16, quantised by v7's fused
    kernels (rotation, per-block scales, V transposed). Returns (o in q's dtype, lse fp32)."""
    v5.require_fp8_gpu(q, "v8_hopper_fp8")
    validate_triton_inputs(q, k, v, scale)
    q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v, operand_order=False, paired=False)
    return run_kernel(q8, k8, v8t, dq, dk, dv, causal, scale, q.dtype)
