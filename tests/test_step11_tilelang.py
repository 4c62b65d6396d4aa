"""Step 11, interchangeable kernels: the TileLang FlashAttention forward (solutions/11_interchangeable_kernels/ladder/tilelang_fa.py) on a CPU.

* The kernel's tile schedule (tilelang_fa.tile_range: which K/V tiles a query tile loads, which it
  masks) covers every visible key and leaves the mask off only on tiles wholly visible and inside
  Skv, for ragged lengths, Sq > Skv and Sq < Skv, causal or not (plain Python, no tilelang).
* The kernel's own program on the CPU stand-in of TileLang (facourse.tilelang_cpu), with the three CPU
  tile shapes, on exercise 11's CPU cases and two more (D = 64 and 128), fp16 and fp32, equals the
  reference; the same program with top-left causal fails the course's check, which names it.
* The stand-in itself: T.copy zero-fills a box past the tensor's end and clips a store there, an
  element write out of bounds raises, sizes bound from the shapes must agree, no bfloat16, and an
  operation it has not got says so.
* With tilelang installed (the `dev` extra has it, so CI does; students install it for step 11's GPU
  tests): the kernel, and exercise 11's solution program, lower for sm_90a without a GPU, for D = 64 and
  128, causal and not, fp16 and bf16, and the
  CUDA source is Hopper's: TMA loads and store, WGMMA (S = Q K^T from shared memory, P V with P from
  registers), mbarriers, a producer warpgroup handing registers to the consumers (setmaxnreg); where
  nvcc and cuobjdump are at hand, one kernel is built and its SASS read (HGMMA, UTMALDG, no spills).
  Skipped, with the reason, where tilelang is not importable.
"""

import functools
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

from facourse import tilelang_kernels as tk  # noqa: E402
from facourse.configs import AttnConfig, make_inputs  # noqa: E402
from facourse.reference import reference_attention  # noqa: E402

HAVE_TILELANG = importlib.util.find_spec("tilelang") is not None
needs_tilelang = pytest.mark.skipif(
    not HAVE_TILELANG, reason="tilelang is not installed (pyproject's `tilelang` extra, in `dev`): "
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


def _program(T, dtype, D, causal, tiles):
    return fa.fa_forward_program(T, dtype, D, causal, tiles)


CASES = [c for group in tk.CPU_CASES.values() for c in group]
CASES += [AttnConfig("d64_ragged", 1, 2, 1, 45, 70, 64, True), AttnConfig("d128_noncausal", 1, 2, 2, 20, 37, 128, False)]


@pytest.mark.parametrize("tiles", tk.CPU_TILES, ids=lambda t: f"{t.block_m}x{t.block_n}")
def test_program_runs_right_on_the_cpu_stand_in(tiles):
    """The kernel's own program (not a copy of its arithmetic) on facourse.tilelang_cpu, fp16 and fp32,
    against the reference in float64: every row written, lse -inf exactly on the rows with no key."""
    for i, cfg in enumerate(CASES):
        dtype = (torch.float16, torch.float32)[i % 2]
        q, k, v = make_inputs(cfg, seed=i, device="cpu", dtype=dtype, layout="bshd")
        o, lse = tk.run_attention(_program, q, k, v, cfg.causal, tiles=tiles)
        ref, ref_lse = reference_attention(q, k, v, cfg.causal, dtype=torch.float64)
        assert not torch.isnan(o).any() and not torch.isnan(lse).any(), f"{cfg.name}: a row was never written"
        # fp32: logits of magnitude L carry an absolute rounding of about L * 2^-24 into exp(), so the
        # overflow case (logits in the hundreds) gets a wider bound (measured: 2.9e-5 with torch 2.13's exp2)
        tol = 2e-3 if dtype == torch.float16 else 1e-5 * max(1.0, cfg.logit_scale / 8)
        torch.testing.assert_close(o.double(), ref, rtol=tol, atol=tol, msg=cfg.name)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), cfg.name
        fin = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse[fin].double(), ref_lse.double()[fin], rtol=1e-5, atol=1e-4, msg=cfg.name)


def test_a_planted_top_left_mask_is_caught_on_the_stand_in(monkeypatch):
    """The stand-in runs what the program says: the same program with top-left causal (the mask and the
    loop bound both lose Skv - Sq) is wrong where Sq != Skv, and the course's check names it."""
    import inspect

    from facourse.check import AttentionCheckError

    src = inspect.getsource(fa.fa_forward_program)
    assert "off = Skv - Sq" in src and "n_end, n_full = tile_range(row0, Sq, Skv," in src
    src = src.replace("off = Skv - Sq", "off = 0").replace("n_end, n_full = tile_range(row0, Sq, Skv,", "n_end, n_full = tile_range(row0 - (Skv - Sq), Sq, Skv,")
    scope = dict(vars(fa))
    exec(compile(src, "<top-left fa_forward_program>", "exec"), scope)
    with pytest.raises(AttentionCheckError, match="top-left"):
        tk.check_tilelang_cpu(functools.partial(tk.run_attention, lambda T, *a: scope["fa_forward_program"](T, *a)),
                              seed=5, cases="causal", verbose=False)


# ----------------------------------------------------------------------------- the CPU stand-in itself
def _copy_program(T, dtype, D, causal, tiles):
    S = T.dynamic("S")
    BM = tiles.block_m

    @T.prim_func
    def kernel(X: T.Tensor([S, D], dtype), Y: T.Tensor([S, D], dtype), Z: T.Tensor([S], "float32")):
        with T.Kernel(T.ceildiv(S, BM), threads=128) as bx:
            x = T.alloc_shared([BM, D], dtype)
            f = T.alloc_fragment([BM], "float32")
            T.copy(X[bx * BM:(bx + 1) * BM, :], x)          # zero-filled past S
            T.reduce_sum(x, f, dim=1)
            T.copy(x, Y[bx * BM:(bx + 1) * BM, :])          # clipped at S
            for r in T.Parallel(BM):
                if causal or bx * BM + r < S:                # causal=True here: unguarded (out of bounds past S)
                    Z[bx * BM + r] = f[r]

    return kernel


def test_stand_in_copies_like_tma_and_faults_out_of_bounds():
    from facourse import tilelang_cpu as T

    x = torch.randn(20, 8, dtype=torch.float16)
    y = torch.full_like(x, float("nan"))
    z = torch.zeros(16)
    prog = _copy_program(T, "float16", 8, False, tk.Tiles(16, 16, 1, 128))
    with pytest.raises(T.EmulationError, match="Z's dimension 0 is S, bound to 20"):
        prog(x, y, z)
    z = torch.zeros(20)
    with pytest.raises(T.EmulationError, match="out of bounds"):          # Z[16 + r] for r up to 15, S = 20
        _copy_program(T, "float16", 8, True, tk.Tiles(16, 16, 1, 128))(x, y, z)
    prog(x, y.fill_(float("nan")), z)
    assert torch.equal(y, x), "the copy back is clipped at S, and every row inside was written"
    torch.testing.assert_close(z, x.float().sum(dim=1), msg="the row sums of the zero-filled tile")
    with pytest.raises(T.EmulationError, match="bfloat16"):
        _copy_program(T, "bfloat16", 8, False, tk.Tiles(16, 16, 1, 128))(x.bfloat16(), y.bfloat16(), z)
    with pytest.raises(AttributeError, match="no T.atomic_add"):
        T.atomic_add


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
def test_exercise_solution_lowers_for_hopper():
    """Exercise 11's solution program (its notebook cells, as facourse.steps.exercise_module loads them)
    lowers for sm_90a with the GPU tiles, and the CUDA is Hopper's."""
    from facourse.steps import exercise_module

    program = exercise_module("11", ("setup", "tilelang_program")).flash_attention_program
    _assert_hopper_source(tk.hopper_source(program, "float16", 128, True), "float16", 128, True)


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
