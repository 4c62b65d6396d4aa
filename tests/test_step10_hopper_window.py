"""Step 10's rung v6_hopper_window: step 07's Hopper kernel with a sliding window (HFA_WINDOW), v4's
Triton kernel for what it cannot do.

CPU tier: nvcc compiles the rung's kernel (v6_hopper_window.cu: step 07's solution with HFA_WINDOW) for
sm_90a, all four instances, with no spills; the routing: which masks go to the CUDA kernel (none, causal,
a window of W >= 1, recognised by the Mod's Triton function), which block masks count as the mask's own
(the reference one; a changed one, or one of other lengths, does not); on a CPU the rung is v4 in
Triton's interpreter.
GPU tier (marked gpu, H100/H200 only): beyond facourse.variants.VARIANT_CASES (which the ladder checks),
windows of 1, 128, 129, 1000 and wider than the sequence, D 64, GQA and MQA, Sq < Skv, Sq > Skv, one
query row and ragged lengths, fp16 and bf16, every one through the CUDA kernel (v4 made to fail if it is
called); a changed block mask goes to v4 and is followed (check_tile_lists); the perf cases' windows at
full length (check_perf_variant).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_module
from facourse.cuda_build import nvcc_compile_check
from facourse.hw import has_nvcc

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "10_attention_variants" / "ladder"
STEP07 = ROOT / "solutions" / "07_hopper_flash_attention"
KERNEL = LADDER / "v6_hopper_window.cu"
needs_nvcc = pytest.mark.skipif(not has_nvcc(), reason="nvcc is not installed")


@pytest.fixture(scope="module")
def v6():
    return load_module(LADDER / "v6_hopper_window.py", "ladder10_v6_hopper_window")


# ============================================================================ CPU tier
@needs_nvcc
def test_kernel_compiles_for_sm90a_without_spills():
    """fp16/bf16 x D 64/128, 0 bytes spilled, the window compiled in (step 07's ladder builds without it)."""
    rep = nvcc_compile_check(KERNEL, "sm_90a", include_dirs=[STEP07 / "ladder", STEP07], verbose=False)
    assert rep.ok, rep.summary()
    assert len(rep.kernels) == 4 and all(k.registers > 0 for k in rep.kernels), rep.log
    assert rep.spills == 0 and " spill" not in rep.log.replace("0 bytes spill", ""), rep.summary()
    assert not rep.wgmma_notes, rep.summary()
    assert "#define HFA_WINDOW 1" in KERNEL.read_text()
    assert '#include "student_kernel_solution.cu"' in KERNEL.read_text()


def test_masks_the_cuda_kernel_computes(v6):
    import facourse.variants as V
    assert v6.cuda_mask(None) == (False, 0)
    assert v6.cuda_mask(V.no_mask()) == (False, 0)
    assert v6.cuda_mask(V.causal(70, 90)) == (True, 0)
    assert v6.cuda_mask(V.sliding_window(1, 70, 90)) == (True, 1)
    assert v6.cuda_mask(V.sliding_window(1024, 8192, 8192)) == (True, 1024)
    assert v6.cuda_mask(V.sliding_window(0, 70, 70)) is None          # sees nothing: v4's
    assert v6.cuda_mask(V.documents(torch.zeros(1, 70, dtype=torch.long))) is None
    assert v6.cuda_mask(V.prefix_lm(torch.tensor([3]), 70, 70)) is None


def test_own_block_mask_only(v6):
    """The reference block mask of the mask is its own (at any tiles, any batch/head extent); a changed
    one, or one made for other lengths, is not: those go to v4, which follows the lists."""
    import facourse.variants as V
    Sq = Skv = 300
    mask = V.sliding_window(100, Sq, Skv)
    for bm, bn in ((128, 64), (64, 64)):
        assert v6.is_own_block_mask(V.reference_block_mask(mask, 1, 1, Sq, Skv, bm, bn), mask, Sq, Skv)
    assert v6.is_own_block_mask(V.reference_block_mask(mask, 2, 3, Sq, Skv, 64, 64), mask, Sq, Skv)
    assert v6.is_own_block_mask(V.reference_block_mask(None, 1, 1, Sq, Skv, 64, 64), None, Sq, Skv)
    changed = V.perturbed_block_mask(mask, 1, 1, Sq, Skv, 64, 64, 7, "cpu")
    assert not v6.is_own_block_mask(changed, mask, Sq, Skv)
    assert not v6.is_own_block_mask(V.reference_block_mask(V.causal(Sq, Skv), 1, 1, Sq, Skv, 64, 64), mask, Sq, Skv)
    assert not v6.is_own_block_mask(V.reference_block_mask(mask, 1, 1, Sq, 256, 64, 64), mask, Sq, Skv)
    bm = V.reference_block_mask(mask, 1, 1, Sq, Skv, 64, 64)           # asked again: the verdict kept
    assert v6.is_own_block_mask(bm, mask, Sq, Skv) and v6.is_own_block_mask(bm, mask, Sq, Skv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: Triton's interpreter")
def test_cpu_call_is_v4s(v6):
    import facourse.variants as V
    g = torch.Generator().manual_seed(10)
    q = torch.randn(1, 2, 70, 64, generator=g)
    k, v = (torch.randn(1, 1, 90, 64, generator=g) for _ in range(2))
    mask = V.sliding_window(16, 70, 90)
    o, lse = v6.flex_attention_triton(q, k, v, mask)
    o_ref, lse_ref = V.variant_reference(q, k, v, mask)
    assert (o.double() - o_ref).abs().max() < 2e-5 and (lse - lse_ref).abs().max() < 2e-5


# ============================================================================ GPU tier
def _cases():
    from facourse.variants import VariantCase
    return [VariantCase(f"v6_{cfg}_{mask}{w}", cfg, mask, window=w) for cfg, mask, w in (
        ("large", "window", 1000), ("large", "window", 128), ("large", "window", 129), ("large", "window", 1),
        ("large", "causal", 0), ("large", "none", 0), ("noncausal", "none", 0), ("causal_2k", "window", 1024),
        ("d64", "window", 77), ("d64", "window", 1), ("d64", "window", 4096), ("d64", "causal", 0),
        ("d64", "none", 0), ("asymmetric", "window", 300), ("asymmetric", "window", 1),
        ("empty_rows", "window", 1), ("empty_rows", "window", 100), ("empty_rows", "window", 1000),
        ("ragged", "window", 129), ("ragged", "window", 400), ("ragged_noncausal", "none", 0),
        ("decode", "window", 100), ("decode", "window", 1), ("mqa", "window", 33), ("mqa", "none", 0),
        ("small", "window", 1), ("medium", "window", 512))]


def _no_v4(v6, monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("v6 sent this call to v4's Triton kernel, not to the CUDA kernel")
    monkeypatch.setattr(v6.v4_tuned, "flex_attention_triton", refuse)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_cuda_path_on_windows_and_edges(v6, monkeypatch, dtype):
    from facourse import has_sm90a
    from facourse.variants import check_variant
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    _no_v4(v6, monkeypatch)
    for case in _cases():
        for _ in range(2):                   # two seeds: a moving error is a race
            check_variant(v6.flex_attention_triton, case, device="cuda", dtype=dtype, verbose=False)


@pytest.mark.gpu
def test_gpu_block_masks(v6, monkeypatch):
    """The mask's own block mask: the CUDA kernel; a changed one: v4, which follows its lists."""
    from facourse import has_sm90a
    from facourse.variants import PERF_TILES, check_perf_variant, check_tile_lists, perf_case, reference_block_mask
    if not has_sm90a():
        pytest.skip("the CUDA path runs on an H100/H200 (sm_90a) only")
    check_tile_lists(v6.flex_attention_triton, "window", device="cuda", verbose=False)
    check_tile_lists(v6.flex_attention_triton, "window_ragged", device="cuda", verbose=False)
    _no_v4(v6, monkeypatch)
    for name in ("window1024_8k", "window1024_16k", "causal_8k"):
        cfg, mask = perf_case(name)
        q = torch.randn(1, 2, cfg.Sq, 128, device="cuda", dtype=torch.float16)
        bm = reference_block_mask(mask, 1, 1, cfg.Sq, cfg.Skv, *PERF_TILES, device="cuda")
        v6.flex_attention_triton(q, q, q, mask=mask, block_mask=bm)   # not v4's (it would raise)
        check_perf_variant(v6.flex_attention_triton, name, device="cuda")
