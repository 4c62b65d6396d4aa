"""Step 10's rung v8_hopper_fp8: step 07's Hopper kernel in e4m3, v7's quantisers, v7's Triton kernel for
what it cannot do.

CPU tier: nvcc compiles the rung's kernel for sm_90a with no spills (its two e4m3 instances and the four of
step 07's solution it includes), with the e4m3 WGMMA in it; the routing: a tensor on the CPU, D 64 or an
output dtype the kernel does not write goes to v7's run_kernel, and the entry points refuse a CPU tensor.
GPU tier (marked gpu, H100/H200 only): the CUDA kernel (v7 made to fail if it is called) against v7's
Triton kernel on the same quantised inputs, and against float64 attention, over GQA, causal and not,
Sq < Skv and Sq > Skv, one query row, ragged lengths (V^T rows padded for TMA), empty causal rows, q
descales per 64 and per 128 rows, fp16 and bf16 out; twice per case (a moving error is a race).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import load_module
from facourse.cuda_build import nvcc_compile_check
from facourse.hw import has_nvcc

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "10_attention_variants" / "ladder"
STEP07 = ROOT / "solutions" / "07_hopper_flash_attention"
KERNEL = LADDER / "v8_hopper_fp8.cu"
needs_nvcc = pytest.mark.skipif(not has_nvcc(), reason="nvcc is not installed")


@pytest.fixture(scope="module")
def v8():
    sys.path.insert(0, str(LADDER))
    return load_module(LADDER / "v8_hopper_fp8.py", "ladder10_v8_hopper_fp8")


# ============================================================================ CPU tier
@needs_nvcc
def test_kernel_compiles_for_sm90a_without_spills():
    rep = nvcc_compile_check(KERNEL, "sm_90a", include_dirs=[LADDER, STEP07 / "ladder", STEP07], verbose=False)
    assert rep.ok, rep.summary()
    fp8 = [k for k in rep.kernels if "fp8_kernel" in k.name]
    assert len(fp8) == 2 and len(rep.kernels) == 6 and all(k.registers > 0 for k in rep.kernels), rep.log
    assert rep.spills == 0 and " spill" not in rep.log.replace("0 bytes spill", ""), rep.summary()
    assert not rep.wgmma_notes, rep.summary()
    text = KERNEL.read_text()
    assert "m64n128k32.f32.e4m3.e4m3" in text and '#include "student_kernel_solution.cu"' in text


def _inputs(B, Hq, Hkv, Sq, Skv, D, dtype):
    q = torch.randn(B, Hq, Sq, D, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Skv, D, dtype=dtype) for _ in range(2))
    return q, k, v


def test_routing_sends_what_the_kernel_cannot_do_to_v7(v8, monkeypatch):
    """CPU tensors, D 64 and an fp32 output go to v7's run_kernel with the same arguments, V^T's keys in order."""
    calls = []
    monkeypatch.setattr(v8.v7, "run_kernel", lambda *a, **kw: calls.append((a, kw)) or "v7")
    q8 = torch.zeros(1, 2, 8, 128, dtype=torch.float8_e4m3fn)
    args = (q8, q8, q8.transpose(-1, -2), torch.ones(1, 2, 1), torch.ones(1, 2, 1), torch.ones(1, 2, 1), True, None)
    assert not v8.runs_on_cuda_kernel(q8)
    assert v8.run_kernel(*args, torch.float16) == "v7" and calls[-1][0][:6] == args[:6]
    assert calls[-1][1] == {"operand_order": False}
    q64 = torch.zeros(1, 2, 8, 64, dtype=torch.float8_e4m3fn)
    assert not v8.runs_on_cuda_kernel(q64)
    assert v8.run_kernel(q64, q64, q64.transpose(-1, -2), *args[3:], torch.float32) == "v7"
    assert len(calls) == 2


def test_entry_points_refuse_a_cpu_tensor(v8):
    q = torch.zeros(1, 1, 4, 128, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="v8_hopper_fp8 needs a GPU with FP8"):
        v8.flash_attention_fp8(q, q, q)
    with pytest.raises(RuntimeError, match="v8_hopper_fp8 needs a GPU with FP8"):
        v8.flash_attention_fp8_prequantized(q, q, q, None, None, None)


# ============================================================================ GPU tier
SHAPES = [  # B, Hq, Hkv, Sq, Skv, causal
    (1, 2, 2, 256, 256, False), (1, 2, 2, 256, 256, True), (2, 4, 2, 1000, 1000, True), (1, 4, 2, 2048, 2048, False),
    (1, 8, 4, 300, 700, True), (1, 8, 4, 700, 300, True), (1, 2, 2, 1, 77, False), (2, 2, 2, 77, 333, False),
    (1, 1, 1, 129, 129, True), (1, 4, 1, 513, 1031, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_gpu_cuda_kernel_agrees_with_v7(v8, monkeypatch, out_dtype):
    from facourse import has_sm90a
    from facourse.reference import reference_attention
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    v7_run = v8.v7.run_kernel
    monkeypatch.setattr(v8.v7, "run_kernel", lambda *a: pytest.fail("v8 sent this call to v7's Triton kernel"))
    for B, Hq, Hkv, Sq, Skv, causal in SHAPES:
        q, k, v = (t.cuda() for t in _inputs(B, Hq, Hkv, Sq, Skv, 128, out_dtype))
        for per_128 in (False, True):        # the end-to-end path (rotated, q per 64 rows), or quantize_fp8 (per 128)
            q8, dq, k8, dk, v8t, dv = v8.v7.quantize_qkv(q, k, v, operand_order=False, paired=False)
            if per_128:                      # q and k alike: both unrotated
                (q8, dq), (k8, dk) = v8.quantize_fp8(q), v8.quantize_fp8(k)
            ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), causal)
            want, want_lse = v7_run(q8, k8, v8t, dq, dk, dv, causal, None, out_dtype, operand_order=False)
            for _ in range(2):
                o, lse = v8.flash_attention_fp8_prequantized(q8, k8, v8t, dq, dk, dv, causal=causal, out_dtype=out_dtype)
                tag = f"B{B} H{Hq}/{Hkv} {Sq}x{Skv} causal={causal} per_128={per_128} {out_dtype}"
                assert o.dtype == out_dtype and bool(torch.isfinite(o).all()), tag
                empty = torch.isneginf(ref_lse)
                assert torch.equal(torch.isneginf(lse), empty), tag
                if empty.any():
                    assert float(o[empty].abs().max()) == 0.0, tag
                rel = float((o.double() - ref).norm() / ref.norm())
                assert rel < 0.08, f"{tag}: relative error {rel:.3f}"
                assert float((o.float() - want.float()).abs().max()) < 0.05, tag
                assert float((lse - want_lse)[~empty].abs().max()) < 1e-3, tag
