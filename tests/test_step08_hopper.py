"""Step 08's rung v4_hopper: the backward on Hopper (CUDA, sm_90a) with step 07's forward, and its deterministic mode.

CPU tier: nvcc compiles the rung for sm_90a with no spills and no C75xx note from ptxas (WGMMAs serialised, as a
trap in the consumers' waits once caused with C7512, or a wait or fence ptxas inserted) in its six backward
kernels, six dQ conversions and the four of step 07's forward it includes; its SASS has HGMMA and UTMALDG; the
routing: a CPU tensor, fp32 or a head dimension the kernel does not take goes to v3's backward and step 05's
forward, with the same arguments; with the Hopper path forced and the extension faked, the deterministic flag
reaches the binding's backward, with v3's preprocess.
GPU tier (marked gpu, H100/H200 only): the course's gradient check on ragged, GQA, MQA, causal Sq > Skv and
Sq < Skv, D 64, empty rows, fp16 and bf16, in both modes; the deterministic mode gives the same bits twice where
the default's dQ (added in any order) may not.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import load_module
from facourse.cuda_build import HOPPER_OPCODES, check_sass, find_cuobjdump, nvcc_compile_check
from facourse.hw import has_nvcc

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "08_backward" / "ladder"
STEP07 = ROOT / "solutions" / "07_hopper_flash_attention"
KERNEL = LADDER / "v4_hopper.cu"
INCLUDES = [LADDER, STEP07 / "ladder", STEP07]
needs_nvcc = pytest.mark.skipif(not has_nvcc(), reason="nvcc is not installed")
needs_sass = pytest.mark.skipif(not has_nvcc() or find_cuobjdump() is None, reason="nvcc or cuobjdump is not installed")


@pytest.fixture(scope="module")
def v4():
    sys.path.insert(0, str(LADDER))
    return load_module(LADDER / "v4_hopper.py", "ladder08_v4_hopper")


# ============================================================================ CPU tier
@needs_nvcc
def test_kernel_compiles_for_sm90a_without_spills_or_serialised_wgmma():
    rep = nvcc_compile_check(KERNEL, "sm_90a", include_dirs=INCLUDES, verbose=False)
    assert rep.ok, rep.summary()
    names = [k.name for k in rep.kernels]
    # fp16 and bf16 x (D 64, BM 64), (D 128, BM 64), (D 128, BM 80)
    assert sum("bwd_kernel" in n for n in names) == 6 and sum("dq_convert" in n for n in names) == 6, names
    assert len(names) == 16 and all(k.registers > 0 for k in rep.kernels), rep.log
    assert rep.spills == 0 and " spill" not in rep.log.replace("0 bytes spill", ""), rep.summary()
    assert not rep.wgmma_notes, rep.summary()   # C7512 (a trap in the consumers' waits) once, C7515, C7519
    assert '#include "student_kernel_solution.cu"' in KERNEL.read_text()


@needs_sass
def test_sass_has_hgmma_and_tma(capsys):
    counts = check_sass(KERNEL, include_dirs=INCLUDES, verbose=False)
    assert all(counts[op] > 0 for op in HOPPER_OPCODES), counts


def _qkv(D=64, dtype=torch.float16):
    q = torch.randn(1, 4, 33, D, dtype=dtype)
    k, v = (torch.randn(1, 2, 45, D, dtype=dtype) for _ in range(2))
    return q, k, v


def test_routing_sends_what_the_kernels_cannot_do_to_v3_and_step05(v4, monkeypatch):
    """CPU tensors, fp32 and D 96 go to v3's backward and step 05's forward with the same arguments; the CUDA
    extension is never built for them."""
    back, fwd = [], []
    monkeypatch.setattr(v4.v3, "attention_backward", lambda *a: back.append(a) or "v3")
    monkeypatch.setattr(v4.common, "attention_forward", lambda *a, **kw: fwd.append((a, kw)) or "step05")
    monkeypatch.setattr(v4, "extension", lambda: pytest.fail("the CUDA extension was asked for"))
    for D, dtype in ((64, torch.float16), (128, torch.bfloat16), (64, torch.float32), (96, torch.float16)):
        q, k, v = _qkv(D, dtype)
        assert not v4.runs_on_hopper_kernel(q)
        assert v4.attention_forward(q, k, v, True, 0.3) == "step05"
        assert fwd[-1] == ((q, k, v), {"causal": True, "scale": 0.3})
        args = (q, k, v, q, torch.zeros(1, 4, 33), q, True, 0.3)
        assert v4.attention_backward(*args, deterministic=True) == "v3" and back[-1] == args
    assert len(back) == len(fwd) == 4


def test_deterministic_flag_reaches_the_kernel(v4, monkeypatch):
    """Through the exercise's autograd cell, on a CPU with the Hopper path forced and the CUDA extension
    faked: flash_attention_train(..., deterministic=True) and flash_attention_train_deterministic hand
    deterministic=True to the binding's backward, the default hands False; the binding gets v3's
    preprocess (delta, m2) and step 07's forward is the one called."""
    calls = []

    class FakeExtension:
        @staticmethod
        def forward(q, k, v, causal, scale):
            calls.append(("forward", causal))
            return v4.common.attention_forward(q, k, v, causal=causal, scale=scale)

        @staticmethod
        def backward(q, k, v, do, m2, delta, causal, scale, deterministic, section, order):
            calls.append(("backward", deterministic, tuple(m2.shape), tuple(delta.shape)))
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(v4, "runs_on_hopper_kernel", lambda q: True)
    monkeypatch.setattr(v4, "extension", lambda: FakeExtension)
    q, k, v = (t.requires_grad_() for t in _qkv())
    for fn, det in ((lambda *a: v4.flash_attention_train(*a), False),
                    (lambda *a: v4.flash_attention_train(*a, deterministic=True), True),
                    (v4.flash_attention_train_deterministic, True)):
        calls.clear()
        o = fn(q, k, v, True, None)
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        assert calls == [("forward", True), ("backward", det, (1, 4, 128), (1, 4, 128))], calls


# ============================================================================ GPU tier
CASES = ["ragged", "ragged_noncausal", "decode", "empty_rows", "d64", "mqa", "overflow", "medium"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_gradients_in_both_modes(v4, monkeypatch, dtype):
    from facourse import has_sm90a
    from facourse.backward import check_gradients
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    monkeypatch.setattr(v4.v3, "attention_backward", lambda *a: pytest.fail("v4 sent this call to v3"))
    for name in CASES:
        for fn in (v4.flash_attention_train, v4.flash_attention_train_deterministic):
            check_gradients(fn, name, device="cuda", dtype=dtype, verbose=False)


@pytest.mark.gpu
def test_gpu_deterministic_mode_repeats_its_bits(v4):
    from facourse import has_sm90a
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    torch.manual_seed(0)
    for causal in (False, True):
        q = torch.randn(2, 8, 2048, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(2, 2, 2048, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        do = torch.randn_like(q)
        runs = []
        for _ in range(3):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            o = v4.flash_attention_train(qq, kk, vv, causal, None, True)
            runs.append(torch.autograd.grad(o, (qq, kk, vv), do))
        for r in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(runs[0], r)), f"causal={causal}: the bits moved"


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", [(0, 0), (1, 0), (3, 0), (3, 1)])
def test_gpu_every_schedule_does_all_the_work(v4, monkeypatch, schedule):
    """Sections of one pair, of all pairs, and of 3 (the last one short: medium has 32 (b, h_kv) pairs), each
    query-block order: a ticket mapping that drops or repeats a key block, or a walk that skips a query
    block, fails a gradient check; the deterministic mode's turns hold under each (no trap)."""
    from facourse import has_sm90a
    from facourse.backward import check_gradients
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    monkeypatch.setattr(v4, "SCHEDULE", schedule)
    for name in ("medium", "noncausal", "asymmetric", "ragged", "mqa"):
        for fn in (v4.flash_attention_train, v4.flash_attention_train_deterministic):
            check_gradients(fn, name, device="cuda", dtype=torch.float16, verbose=False)
