"""Step 11, interchangeable kernels: the TileLang FlashAttention forward (solutions/11_interchangeable_kernels/ladder/tilelang_fa.py) on a CPU.

* The kernel's tile schedule (tilelang_fa.tile_range: which K/V tiles a query tile loads, which it
  masks) covers every visible key and leaves the mask off only on tiles wholly visible and inside
  Skv, for ragged lengths, Sq > Skv and Sq < Skv, causal or not (plain Python, no tilelang).
* The kernel's algorithm, tile by tile in float64 PyTorch with that schedule (the loop, the mask, the
  exp2 with the folded scale, the -inf guard of rows that have seen no key, the epilogue's o = 0 and
  lse = -inf), equals the reference on the edge cases and two more ragged causal shapes (no tilelang).
* With tilelang installed (it is not a course dependency yet: `pip install tilelang==0.1.15`): the
  kernel lowers for sm_90a without a GPU, for D = 64 and 128, causal and not, fp16 and bf16, and the
  CUDA source is Hopper's: TMA loads and store, WGMMA (S = Q K^T from shared memory, P V with P from
  registers), mbarriers, a producer warpgroup handing registers to the consumers (setmaxnreg); where
  nvcc and cuobjdump are at hand, one kernel is built and its SASS read (HGMMA, UTMALDG, no spills).
  Skipped, with the reason, where tilelang is not importable.
"""
from __future__ import annotations

import glob
import importlib.util
import math
import random
import shutil
import subprocess

import pytest
import torch

from conftest import ROOT, load_module

LADDER = ROOT / "solutions" / "11_interchangeable_kernels" / "ladder"
fa = load_module(LADDER / "tilelang_fa.py", "step11_tilelang_fa")

from facourse.configs import EDGE_CASES, AttnConfig, make_inputs  # noqa: E402
from facourse.reference import reference_attention  # noqa: E402

HAVE_TILELANG = importlib.util.find_spec("tilelang") is not None
needs_tilelang = pytest.mark.skipif(
    not HAVE_TILELANG, reason="tilelang is not installed (not a course dependency yet): "
    "pip install tilelang==0.1.15, or put tools/carry_tilelang.py's unpacked archive on PYTHONPATH")


# ----------------------------------------------------------------------------- the tile schedule
def _visible(i: int, j: int, Sq: int, Skv: int, causal: bool) -> bool:
    return j < Skv and (not causal or j <= i + Skv - Sq)


@pytest.mark.parametrize("causal", [True, False])
def test_tile_range_covers_visible_keys_and_masks_what_it_must(causal):
    rng = random.Random(11)
    shapes = [(1, 1), (1, 515), (200, 333), (300, 100), (128, 128), (256, 128), (129, 1), (77, 333)]
    shapes += [(rng.randint(1, 600), rng.randint(1, 600)) for _ in range(25)]
    for Sq, Skv in shapes:
        for BM, BN in ((128, 128), (128, 64), (64, 128)):
            for row0 in range(0, Sq, BM):
                n_end, n_full = fa.tile_range(row0, Sq, Skv, causal, BM, BN)
                where = f"Sq={Sq} Skv={Skv} BM={BM} BN={BN} row0={row0}"
                assert 1 <= n_end <= math.ceil(Skv / BN), where
                i = min(row0 + BM, Sq) - 1            # the tile's last row sees the most keys
                last = max((j for j in range(Skv) if _visible(i, j, Sq, Skv, causal)), default=-1)
                assert last < n_end * BN, f"{where}: key {last} is visible but tile {last // BN} is not loaded"
                for t in range(max(n_full, 0)):       # unmasked tiles: every key visible to every row
                    assert (t + 1) * BN <= Skv, f"{where}: tile {t} is ragged but not masked"
                    if causal:                        # the tile's last key against the query tile's first row
                        assert (t + 1) * BN - 1 <= row0 + Skv - Sq, f"{where}: tile {t} crosses the diagonal unmasked"


def _tiled_forward(q, k, v, causal, scale, BM, BN):
    """The kernel's arithmetic, one program (query tile) at a time, in float64 with its schedule."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    c = scale * fa.LOG2E
    q, k, v = (t.double() for t in (q, k, v))
    o = torch.full((B, Hq, Sq, D), float("nan"), dtype=torch.float64)
    lse = torch.full((B, Hq, Sq), float("nan"), dtype=torch.float64)
    inf = float("inf")

    def tile(x, start, n):                  # TMA: rows past the end read as zeros
        out = torch.zeros(n, D, dtype=torch.float64)
        part = x[start:start + n]
        out[:part.shape[0]] = part
        return out

    for b in range(B):
        for h in range(Hq):
            kvh = h // (Hq // Hkv)
            for row0 in range(0, Sq, BM):
                n_end, n_full = fa.tile_range(row0, Sq, Skv, causal, BM, BN)
                qt = tile(q[b, h], row0, BM)
                m = torch.full((BM,), -inf, dtype=torch.float64)
                l = torch.zeros(BM, dtype=torch.float64)
                acc = torch.zeros(BM, D, dtype=torch.float64)
                rows = torch.arange(row0, row0 + BM)[:, None]
                for j in range(n_end):
                    s = qt @ tile(k[b, kvh], j * BN, BN).T
                    if j >= n_full:
                        keys = torch.arange(j * BN, j * BN + BN)[None, :]
                        ok = keys < Skv
                        if causal:
                            ok = ok & (keys <= rows + Skv - Sq)
                        s = s.masked_fill(~ok, -inf)
                    m_prev, m = m, torch.maximum(m, s.amax(dim=1))
                    m_c = torch.where(m == -inf, torch.zeros_like(m), m * c)
                    alpha = torch.exp2(m_prev * c - m_c)
                    p = torch.exp2(s * c - m_c[:, None])
                    l = l * alpha + p.sum(dim=1)
                    acc = acc * alpha[:, None] + p @ tile(v[b, kvh], j * BN, BN)
                safe_l = torch.where(l > 0, l, torch.ones_like(l))
                ot = torch.where(l[:, None] > 0, acc / safe_l[:, None], torch.zeros_like(acc))
                lt = torch.where(l > 0, m * c * fa.LN2 + torch.log(safe_l), torch.full_like(l, -inf))
                n = min(BM, Sq - row0)
                o[b, h, row0:row0 + n] = ot[:n]
                lse[b, h, row0:row0 + n] = lt[:n]
    return o, lse


CASES = {**EDGE_CASES, "short_q": AttnConfig("short_q", 1, 2, 1, 130, 300, 64, True),
         "long_q": AttnConfig("long_q", 1, 2, 2, 390, 129, 64, True)}


@pytest.mark.parametrize("tiles", [(128, 128), (128, 64)], ids=["128x128", "128x64"])
@pytest.mark.parametrize("name", list(CASES))
def test_tiled_algorithm_matches_reference(name, tiles):
    cfg = CASES[name]
    q, k, v = make_inputs(cfg, seed=3, device="cpu", dtype=torch.float16, layout="bhsd")
    scale = 1.0 / math.sqrt(cfg.D)
    o, lse = _tiled_forward(q, k, v, cfg.causal, scale, *tiles)
    ref, ref_lse = reference_attention(q, k, v, cfg.causal, dtype=torch.float64)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "a row was never written"
    torch.testing.assert_close(o, ref, rtol=1e-9, atol=1e-9)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse = -inf exactly on the rows that see no key"
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse.double()[fin], rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- the Hopper code
LOWERED = [("float16", 64, True), ("bfloat16", 64, False), ("bfloat16", 128, False)]   # (fp16, 128, causal): built below


def _assert_hopper_source(src: str, dtype: str, D: int, causal: bool) -> None:
    tiles = fa.TILES[D]
    kind = {"float16": "kFloat16", "bfloat16": "kBFloat16"}[dtype]
    # warp specialisation: consumer warpgroups plus one producer warpgroup, registers moved by setmaxnreg
    assert f"__launch_bounds__({tiles.threads + 128}, 1)" in src
    assert "tl::warpgroup_reg_dealloc<" in src and "tl::warpgroup_reg_alloc<" in src
    # TMA: Q, K and V loaded by the tensor-memory accelerator through mbarriers; O stored by it
    assert src.count("tl::tma_load(") >= 3 and "tl::tma_store(" in src
    assert "arrive_and_expect_tx" in src and ".wait(" in src
    # WGMMA: S = Q K^T with both operands in shared memory (m64 n=BLOCK_N k16); O += P V, P in registers (n=D)
    assert f"tl::wgmma_ss<tl::DataType::{kind}, tl::DataType::{kind}, tl::DataType::kFloat32, 64, {tiles.block_n}, 16" in src
    assert f"tl::wgmma_rs<tl::DataType::{kind}, tl::DataType::{kind}, tl::DataType::kFloat32, 64, {D}, 16" in src
    # the softmax in base 2 on the folded scale, a -inf guard, and the natural-log lse
    assert "exp2f(" in src and "qk_scale" in src and "logf(" in src and "-CUDART_INF_F" in src
    # the loop bound: causal stops at the diagonal (clamped to >= 1 tile), else every tile of K/V
    loop = src.split("for (int j")[1].split("{")[0]
    if causal:
        assert "max(" in loop and "Sq" in loop, f"the causal loop bound: {loop}"
    else:
        assert f"((Skv + {tiles.block_n - 1}) >> {tiles.block_n.bit_length() - 1})" in loop, loop


@needs_tilelang
@pytest.mark.parametrize("dtype,D,causal", LOWERED, ids=[f"{d}-D{D}-{'causal' if c else 'full'}" for d, D, c in LOWERED])
def test_lowers_for_hopper(dtype, D, causal):
    _assert_hopper_source(fa.hopper_source(dtype, D, causal), dtype, D, causal)


@needs_tilelang
def test_builds_with_nvcc_and_reads_as_hopper_sass(tmp_path, monkeypatch):
    """fp16, D = 128, causal: the source as above; then nvcc (TileLang's own build) for sm_90a and the
    SASS: HGMMA, TMA, setmaxnreg, one MUFU.EX2 per score, no spills."""
    from facourse.cuda_build import count_opcodes, find_cuobjdump

    if shutil.which("nvcc") is None:
        _assert_hopper_source(fa.hopper_source("float16", 128, True), "float16", 128, True)
        pytest.skip("nvcc is not installed here (TileLang builds the kernel with it): source checked only")
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    tiles = fa.TILES[128]
    fa.compile_kernel.cache_clear()
    kernel = fa.compile_kernel("float16", 128, True, tiles)
    _assert_hopper_source(kernel.get_kernel_source(), "float16", 128, True)
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed here (pip install nvidia-cuda-cuobjdump): built, SASS not read")
    (cubin,) = glob.glob(str(tmp_path / "**" / "kernel.cubin"), recursive=True)
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
    assert "LOCAL:0" in usage and "STACK:0" in usage, f"registers spill to local memory: {usage}"
    sass = subprocess.run([cuobjdump, "--dump-sass", cubin], capture_output=True, text=True).stdout
    ops = count_opcodes(sass)                 # the first token of each instruction: HGMMA, UTMALDG, ...
    assert ops["HGMMA"] == 128 // 16 * 2, f"expected 8 + 8 HGMMA (k16 steps of Q K^T over D and of P V over BLOCK_N): {ops}"
    assert ops["UTMALDG"] >= 3 and ops["UTMASTG"] >= 1, ops
    assert ops["USETMAXREG"] >= 2, ops
    # fast math: one MUFU.EX2 per score a thread holds (and one per row for alpha), no exp2f fix-ups
    assert sass.count("MUFU.EX2") >= tiles.block_m * tiles.block_n // tiles.threads, ops
