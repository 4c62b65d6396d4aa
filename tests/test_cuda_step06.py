"""Step 06 (CUDA FlashAttention), CPU tier and GPU tier.

CPU tier: (1) a lane-by-lane emulation of ldmatrix / mma.sync m16n8k16 / the XOR swizzle with the
index expressions of the CUDA sources, checked against plain matmuls; (2) an emulation of the whole
kernel (harness + solution device functions, same tiles, masks, online softmax and epilogue) checked
against the float64 reference on ragged, causal, GQA and empty-row problems; (3) nvcc compiles of
every ladder kernel, the exercise solution and the stub for sm_80 and sm_90 (no spills in any
rung or the solution); (4) the make_stub round trip and the exercise's compile-feedback function.
GPU tier (marked gpu): every kernel on the five configurations and the edge cases, fp16 and bf16.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
STEP = ROOT / "solutions" / "06_cuda_flash_attention"
LADDER = STEP / "ladder"
sys.path.insert(0, str(ROOT / "diagrams"))
import fragments as fr  # noqa: E402

from conftest import load_module  # noqa: E402
from facourse import reference_attention  # noqa: E402
from facourse.cuda_build import nvcc_compile_check, parse_ptxas  # noqa: E402
from facourse.hw import has_nvcc  # noqa: E402

needs_nvcc = pytest.mark.skipif(not has_nvcc(), reason="nvcc is not installed")


# ============================================================================ warp emulation
def ldmatrix_x4(smem: np.ndarray, lane_addr, trans=False) -> np.ndarray:
    """regs[lane, i, j]: lanes 8i..8i+7 give the element address of row 0..7 of matrix i."""
    mats = np.stack([np.stack([smem[lane_addr(8 * i + r) + np.arange(8)] for r in range(8)]) for i in range(4)])
    regs = np.zeros((32, 4, 2), smem.dtype)
    for lane in range(32):
        for i in range(4):
            for j in range(2):
                regs[lane, i, j] = mats[i][fr.ldmatrix_coords(lane, j, trans)]
    return regs


def mma(c, a, b):
    """c[lane, 4] += A B with A from a[lane, 4 regs, 2], B from b[lane, 2 regs, 2] (PTX layouts)."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        for i in range(8):
            A[fr.a_coords(lane, i)] = a[lane, i // 2, i % 2]
        for i in range(4):
            B[fr.b_coords(lane, i)] = b[lane, i // 2, i % 2]
    C = A @ B
    for lane in range(32):
        for i in range(4):
            c[lane, i] += C[fr.c_coords(lane, i)]


def swizzle(D, row, col):           # fa_primitives.cuh: swizzle<D>
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7)


def store_tile(tile: np.ndarray, rows_valid: int, nthreads=256) -> np.ndarray:
    """load_tile_async of the solution: every thread's 16-byte chunks, swizzled, zero-filled."""
    ROWS, D = tile.shape
    smem = np.full(ROWS * D, np.nan)
    chunks = D // 8
    for i in range(ROWS * chunks // nthreads):
        for tid in range(nthreads):
            idx = tid + i * nthreads
            r, c = idx // chunks, (idx % chunks) * 8
            dst = swizzle(D, r, c)
            smem[dst:dst + 8] = tile[r, c:c + 8] if r < rows_valid else 0.0
    return smem


def gather_c(acc: np.ndarray) -> np.ndarray:
    """[nblocks][lane][4] C fragments -> the 16 x (8 nblocks) matrix."""
    out = np.zeros((16, 8 * acc.shape[0]))
    for n in range(acc.shape[0]):
        for lane in range(32):
            for i in range(4):
                r, c = fr.c_coords(lane, i)
                out[r, 8 * n + c] = acc[n, lane, i]
    return out


def q_fragments(sQ, D, warp):       # the harness: ldmatrix_x4(q_frag[kk], sQ + swizzle(row, col))
    return [ldmatrix_x4(sQ, lambda L: swizzle(D, warp * 16 + (L & 15), kk * 16 + (L >> 4) * 8)) for kk in range(D // 16)]


def qk_tile(qf, sK, D, BN):         # student_kernel: qk_tile
    s = np.zeros((BN // 8, 32, 4))
    for kk in range(D // 16):
        for np_ in range(BN // 16):
            b = ldmatrix_x4(sK, lambda L: swizzle(D, np_ * 16 + (L & 7) + (L >> 4) * 8, kk * 16 + ((L >> 3) & 1) * 8))
            mma(s[2 * np_], qf[kk], b[:, 0:2])
            mma(s[2 * np_ + 1], qf[kk], b[:, 2:4])
    return s


def pv_tile(o, p, sV, D, BN, rnd):  # student_kernel: pv_tile (P rounded to the input dtype: pack2)
    for kk in range(BN // 16):
        a = np.stack([np.stack([p[2 * kk][:, 0:2], p[2 * kk][:, 2:4], p[2 * kk + 1][:, 0:2], p[2 * kk + 1][:, 2:4]], 1)], 0)[0]
        a = rnd(a)
        for dp in range(D // 16):
            b = ldmatrix_x4(sV, lambda L: swizzle(D, kk * 16 + (L & 15), dp * 16 + (L >> 4) * 8), trans=True)
            mma(o[2 * dp], a, b[:, 0:2])
            mma(o[2 * dp + 1], a, b[:, 2:4])


def online_softmax_update(s, m_i, l_i, o, scale_log2):   # student_kernel, vectorised over lanes
    for r in range(2):
        cols = [2 * r, 2 * r + 1]
        row_max = s[:, :, cols].max(axis=(0, 2))                       # per lane
        row_max = row_max.reshape(8, 4).max(1).repeat(4)               # quad_max
        m_new = np.maximum(m_i[r], row_max * scale_log2)
        m_use = np.where(m_new == -np.inf, 0.0, m_new)
        alpha = np.where(m_new == m_i[r], 1.0, np.exp2(m_i[r] - m_use))   # fa::rescale_factor
        s[:, :, cols] = np.exp2(s[:, :, cols] * scale_log2 - m_use[None, :, None])
        l_i[r] = alpha * l_i[r] + s[:, :, cols].sum(axis=(0, 2))
        m_i[r] = m_new
        o[:, :, cols] *= alpha[None, :, None]


def emulate_attention(q, k, v, causal, scale, BM=128, BN=64, nwarps=8, round_p=True):
    """The harness of fa_harness.cuh, warp by warp, lane by lane (one batch)."""
    Hq, Sq, D = q.shape
    Hkv, Skv, _ = k.shape
    rnd = (lambda x: x.astype(np.float16).astype(np.float64)) if round_p else (lambda x: x)
    o_out, lse_out = np.full((Hq, Sq, D), np.nan), np.full((Hq, Sq), np.nan)
    diag = Skv - Sq
    scale_log2 = scale * math.log2(math.e)
    for h in range(Hq):
        hk = h // (Hq // Hkv)
        for mb in range((Sq + BM - 1) // BM):
            m0 = mb * BM
            Tc = (Skv + BN - 1) // BN
            if causal:
                last = m0 + BM - 1 + diag
                Tc = 0 if last < 0 else min(Tc, last // BN + 1)
            sQ = store_tile(np.pad(q[h, m0:m0 + BM], ((0, max(0, BM - (Sq - m0))), (0, 0))), Sq - m0)
            for w in range(nwarps):
                qf = q_fragments(sQ, D, w)
                o = np.zeros((D // 8, 32, 4))
                m_i = [np.full(32, -np.inf), np.full(32, -np.inf)]
                l_i = [np.zeros(32), np.zeros(32)]
                lane = np.arange(32)
                row_g = m0 + w * 16 + lane // 4
                for j in range(Tc):
                    n0 = j * BN
                    pad = lambda x: np.pad(x[n0:n0 + BN], ((0, BN - len(x[n0:n0 + BN])), (0, 0)))  # noqa: E731
                    sK, sV = store_tile(pad(k[hk]), Skv - n0), store_tile(pad(v[hk]), Skv - n0)
                    s = qk_tile(qf, sK, D, BN)
                    if n0 + BN > Skv or (causal and n0 + BN - 1 > m0 + diag):      # apply_mask
                        for n in range(BN // 8):
                            for e in range(4):
                                col = n0 + n * 8 + 2 * (lane & 3) + (e & 1)
                                row = row_g + (e >> 1) * 8
                                bad = (col >= Skv) | (causal & (col > row + diag))
                                s[n, bad, e] = -np.inf
                    online_softmax_update(s, m_i, l_i, o, scale_log2)
                    pv_tile(o, s, sV, D, BN, rnd)
                full = gather_c(o)
                for r in range(2):
                    l = l_i[r].reshape(8, 4).sum(1).repeat(4)                 # quad_sum
                    inv = np.where(l > 0, 1 / np.where(l > 0, l, 1), 0.0)
                    lse = np.where(l > 0, (m_i[r] + np.log2(np.where(l > 0, l, 1))) * math.log(2), -np.inf)
                    for g in range(8):
                        row = m0 + w * 16 + g + 8 * r
                        if row < Sq:
                            o_out[h, row] = full[g + 8 * r] * inv[4 * g]
                            lse_out[h, row] = lse[4 * g]
    return o_out, lse_out


# ---------------------------------------------------------------------------------- the tests
def test_fragment_tables_cover_every_element_once():
    for fn, n, shape in ((fr.a_coords, 8, (16, 16)), (fr.b_coords, 4, (16, 8)), (fr.c_coords, 4, (16, 8))):
        seen = {fn(lane, i) for lane in range(32) for i in range(n)}
        assert len(seen) == shape[0] * shape[1] and max(seen) == (shape[0] - 1, shape[1] - 1)
    for trans in (False, True):
        assert len({fr.ldmatrix_coords(L, j, trans) for L in range(32) for j in range(2)}) == 64


def test_c_fragment_of_s_is_a_fragment_of_p():
    """The register trick of FA2 on mma.sync: C fragments of two n-blocks = A fragment of P."""
    for lane in range(32):
        for i in range(8):
            reg, half = i // 2, i % 2
            nb = reg // 2               # a[0], a[1] from n-block 2kk; a[2], a[3] from 2kk + 1
            ci = (reg % 2) * 2 + half   # a[0]/a[2] <- c0,c1 ; a[1]/a[3] <- c2,c3
            r, c = fr.c_coords(lane, ci)
            assert fr.a_coords(lane, i) == (r, c + 8 * nb)


def test_warp_tile_products_match_matmul():
    rng = np.random.default_rng(0)
    for D in (64, 128):
        Q, K, V = rng.standard_normal((128, D)), rng.standard_normal((64, D)), rng.standard_normal((64, D))
        sQ, sK, sV = store_tile(Q, 128), store_tile(K, 64), store_tile(V, 64)
        for w in (0, 5):
            qf = q_fragments(sQ, D, w)
            S = gather_c(qk_tile(qf, sK, D, 64))
            np.testing.assert_allclose(S, Q[16 * w:16 * w + 16] @ K.T, rtol=1e-12, atol=1e-9)
            P = rng.standard_normal((64 // 8, 32, 4))
            o = np.zeros((D // 8, 32, 4))
            pv_tile(o, P, sV, D, 64, lambda x: x)
            np.testing.assert_allclose(gather_c(o), gather_c(P) @ V, rtol=1e-12, atol=1e-9)


def test_swizzle_is_a_bijection_and_conflict_free():
    for D in (64, 128):
        addrs = {swizzle(D, r, c) for r in range(64) for c in range(D)}
        assert addrs == set(range(64 * D))
        # an ldmatrix phase: 8 rows, one logical 16-byte chunk each -> 8 distinct 4-bank groups
        for chunk in range(D // 8):
            for r0 in range(0, 64, 8):
                banks = {(swizzle(D, r0 + r, chunk * 8) * 2 // 4) % 32 // 4 for r in range(8)}
                assert len(banks) == 8, (D, chunk, r0)
        # without the swizzle, the same phase is an 8-way conflict
        assert len({((r * D + 0) * 2 // 4) % 32 // 4 for r in range(8)}) == 1


def test_v5_lane_offsets_and_copies_follow_the_swizzle():
    """v5's LaneOffsets (one XOR per ldmatrix) and copy_tile (no divisions) hit swizzle<D>'s addresses."""
    for D in (64, 128):
        for base in (0, 256 * 7):                 # any tile that starts on a 256-byte boundary
            for lane in range(32):
                x = lane & 7
                k0 = (((lane & 7) + (lane >> 4) * 8) * D + ((((lane >> 3) & 1) ^ x) << 3)) * 2
                a0 = ((lane & 15) * D + (((lane >> 4) ^ x) << 3)) * 2
                for kk in range(D // 16):
                    for i in range(4):
                        k_row, k_col = i * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8
                        a_row, a_col = i * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8
                        assert ((base + k0) ^ (kk << 5)) + i * 16 * D * 2 == base + 2 * swizzle(D, k_row, k_col)
                        assert ((base + a0) ^ (kk << 5)) + i * 16 * D * 2 == base + 2 * swizzle(D, a_row, a_col)
        for nt in (32, 128, 256):                 # copy_tile: thread t, chunk t % (D/8), every RPI-th row
            cpr = D // 8
            rpi, seen = nt // cpr, set()
            for t in range(nt):
                c, r0 = t % cpr, t // cpr
                for i in range(64 // rpi):
                    row = r0 + i * rpi
                    assert row * D * 2 + ((c ^ (row & 7)) << 4) == 2 * swizzle(D, row, c * 8)
                    seen.add((row, c))
            assert len(seen) == 64 * cpr


@pytest.mark.parametrize("threshold", [0.0, 8.0])
def test_v5_conditional_rescale_is_exact(threshold):
    """online_softmax_update with ladder::LazyRescale (harness.cuh) in float64: with a stale max (behind by at most `threshold`),
    O and l carry the same factor, so O / l is the softmax; P stays <= 2^threshold; the O rescale
    (one warp vote per 16 rows) is skipped on most tiles."""
    rng = np.random.default_rng(1)
    S, V = rng.standard_normal((16, 2048)) * 3, rng.standard_normal((2048, 32))
    m, l, o, rescales = np.full(16, -np.inf), np.zeros(16), np.zeros((16, 32)), 0
    for n0 in range(0, S.shape[1], 64):
        s = S[:, n0:n0 + 64] * math.log2(math.e)
        m_new = np.maximum(m, s.max(1))
        m_new = np.where(m_new - m > threshold, m_new, m)
        alpha = np.where(m_new == m, 1.0, np.exp2(m - m_new))
        p = np.exp2(s - m_new[:, None])
        assert p.max() <= 2.0 ** threshold
        l = alpha * l + p.sum(1)
        if (alpha != 1.0).any():
            o *= alpha[:, None]
            rescales += 1
        o += p @ V[n0:n0 + 64]
        m = m_new
    P = np.exp(S - S.max(1, keepdims=True))
    np.testing.assert_allclose(o / l[:, None], (P / P.sum(1, keepdims=True)) @ V, rtol=1e-10, atol=1e-12)
    assert rescales < (8 if threshold else 20) < S.shape[1] // 64


@pytest.mark.parametrize("Sq,Skv,causal,Hq,Hkv,D", [
    (200, 333, True, 2, 1, 64),     # ragged, causal, bottom-right, GQA
    (150, 70, True, 1, 1, 64),      # Sq > Skv: empty rows
    (77, 130, False, 2, 2, 128),    # non-causal, ragged, D = 128
])
def test_kernel_emulation_matches_reference(Sq, Skv, causal, Hq, Hkv, D):
    g = torch.Generator().manual_seed(Sq)
    q = torch.randn(1, Hq, Sq, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, Hkv, Skv, D, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, Hkv, Skv, D, generator=g, dtype=torch.float64)
    scale = 1 / math.sqrt(D)
    o, lse = emulate_attention(q[0].numpy(), k[0].numpy(), v[0].numpy(), causal, scale)
    ref_o, ref_lse = reference_attention(q, k, v, causal, scale)
    ref_o, ref_lse = ref_o[0].numpy(), ref_lse[0].numpy()
    assert not np.isnan(o).any() and not np.isnan(lse).any(), "a row was not written or is NaN"
    np.testing.assert_allclose(o, ref_o, atol=5e-3)            # P is rounded to fp16, like pack2<half>
    fin = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), fin)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=1e-9)
    if Sq > Skv and causal:
        assert (o[:, :Sq - Skv] == 0).all()


# ============================================================================ nvcc
LADDER_FILES = sorted(p.name for p in LADDER.glob("v*.cu"))


def test_ladder_is_numbered_and_has_verdicts():
    assert len(LADDER_FILES) >= 4, LADDER_FILES
    for name in LADDER_FILES:
        head = (LADDER / name).read_text().splitlines()[:6]
        text = "\n".join(head)
        assert "verdict:" in text and "figure:" in text, f"{name}: header needs a verdict and a figure line"
        assert "to be measured" not in text


def test_rungs_are_traits_over_one_harness():
    """Every device helper, the mask and the online softmax are written once: apply_mask, key_masked,
    the epilogue and the key-tile count in fa_harness.cuh; exp2_approx and the online softmax's scalar
    steps in fa_primitives.cuh; the one online_softmax_update is the exercise's solution, which v2..v4
    and the exercise build with the exercise harness and v5/v6 call from ladder/harness.cuh (the lazy
    rescale enters as its Rescale). v2..v4 are the exercise harness with named traits, v5 and v6
    ladder/harness.cuh's kernel with named traits; v1 takes the mask and the scalar steps too."""
    import re
    files = [STEP / "fa_harness.cuh", STEP / "fa_primitives.cuh", *sorted(LADDER.glob("*.cu*"))]
    text = {f.name: f.read_text() for f in files}
    for fn, home in (("apply_mask", "fa_harness.cuh"), ("key_masked", "fa_harness.cuh"), ("epilogue", "fa_harness.cuh"),
                     ("num_key_tiles", "fa_harness.cuh"), ("exp2_approx", "fa_primitives.cuh"),
                     ("finite_max", "fa_primitives.cuh"), ("rescale_factor", "fa_primitives.cuh"),
                     ("online_softmax_update", "student_kernel_solution.cu")):
        defs = [n for n, t in text.items() if re.search(rf"^\s*(static )?FA_DEVICE \w+ {fn}\(", t, re.M)]
        assert defs == [home], (fn, defs)
    # no second softmax, running max or mask predicate anywhere (the ladder's lazy rescale reuses EagerRescale's max)
    softmaxes = [n for n, t in text.items() if re.search(r"^FA_DEVICE void \w*softmax\w*\(", t, re.M)]
    assert softmaxes == ["student_kernel_solution.cu"], softmaxes
    for n, t in text.items():
        assert n == "fa_primitives.cuh" or ("exp2f(" not in t and "ex2.approx" not in t), n
        assert not re.search(r"(key|col) (>=|<) (p\.)?Skv", t) or n == "fa_harness.cuh", n
        assert "fmaxf(m_old" not in t or n == "fa_primitives.cuh", n
    assert '#include "student_kernel_solution.cu"' in text["harness.cuh"]
    assert "online_softmax_update<BN / 8, D / 8, Rescale>" in text["harness.cuh"]
    assert "fa::key_masked(" in text["v1_scalar.cu"] and "fa::rescale_factor(" in text["v1_scalar.cu"]
    for rung, harness in (("v2_mma.cu", "student_kernel_solution.cu"), ("v3_cp_async.cu", "student_kernel_solution.cu"),
                          ("v4_swizzle.cu", "student_kernel_solution.cu"), ("v5_warp_specialized.cu", "harness.cuh"),
                          ("v6_fa2_tiles_lazy.cu", "harness.cuh")):
        assert f'#include "{harness}"' in text[rung] and "__global__" not in text[rung], rung
        assert re.search(r"struct V\dTraits \{", text[rung]) or rung == "v4_swizzle.cu", rung


# No rung spills, nor the exercise's solution. v6 (4 warps x 32 rows x D = 128 of O in registers)
# sits at 255 registers: it holds no per-thread value through its loops that it can recompute
# (ladder/harness.cuh: load_kv's per-thread pointers, Consumer::reload_addresses, row0_again).


# The rungs are measured on an H100: each is compiled for sm_90; the exercise's solution, which
# students also run on an A100, for sm_80 too (one ptxas run per pair: about 8 CPU-seconds each).
@needs_nvcc
@pytest.mark.parametrize("name, arch", [(n, "sm_90") for n in LADDER_FILES]
                         + [("student_kernel_solution.cu", a) for a in ("sm_80", "sm_90")])
def test_compiles_with_nvcc(name, arch):
    rep = nvcc_compile_check(LADDER / name, arch, include_dirs=[LADDER, STEP], verbose=False)
    assert rep.ok, rep.summary()
    assert rep.kernels and all(k.registers > 0 for k in rep.kernels), rep.log
    assert max(k.spills for k in rep.kernels) == 0, rep.summary()


def test_stub_is_generated_from_solution_and_in_sync():
    from autograder.cuda_stub import make_stub

    bodies = load_module(LADDER / "make_stub.py").STUB_BODIES
    sol = (LADDER / "student_kernel_solution.cu").read_text()
    stub = make_stub(sol, bodies)
    assert "BEGIN SOLUTION" not in stub and "END SOLUTION" not in stub
    assert stub.count("YOUR CODE HERE") == sol.count("BEGIN SOLUTION") == 4
    assert (STEP / "student_kernel.cu").read_text() == stub, "run solutions/06_cuda_flash_attention/ladder/make_stub.py"
    with pytest.raises(ValueError):
        make_stub("// BEGIN SOLUTION\nint x;\n", bodies)
    # a ladder rung's variant inside a region is not counted among the lines a student writes
    fenced = ("FA_DEVICE void f() {\n  // BEGIN SOLUTION\n  int a = 0;\n  // LADDER ONLY { a variant\n  int b = 1;\n"
              "  int c = 2;\n  // } LADDER ONLY\n  a += 1;\n  // END SOLUTION\n}\n")
    assert "about 2 lines" in make_stub(fenced, {"f": []})


@needs_nvcc
def test_stub_compiles_and_release_ships_stub_not_solution():
    rep = nvcc_compile_check(STEP / "student_kernel.cu", "sm_80", verbose=False)
    assert rep.ok, rep.summary()
    rel = ROOT / "exercises" / "06_cuda_flash_attention"
    assert (rel / "student_kernel.cu").read_text() == (STEP / "student_kernel.cu").read_text()
    for must in ("fa_harness.cuh", "fa_primitives.cuh", "fa_params.h", "fa_binding.cpp"):
        assert (rel / must).exists(), must
    shipped = " ".join(p.name for p in rel.rglob("*"))
    assert "solution" not in shipped and "make_stub" not in shipped and "gpu_check" not in shipped, shipped


@needs_nvcc
def test_compile_feedback_reports_errors_and_resources(tmp_path, capsys):
    good = nvcc_compile_check(LADDER / "student_kernel_solution.cu", "sm_80", include_dirs=[STEP])
    out = capsys.readouterr().out
    assert good.ok and "nvcc OK for sm_80" in out and "fa_forward_kernel" in out and "regs" in out
    assert {k.registers for k in good.kernels} and good.spills == 0
    broken = (LADDER / "student_kernel_solution.cu").read_text().replace("row_sum += ", "row_sum +=* ", 1)
    (tmp_path / "student_kernel.cu").write_text(broken)
    bad = nvcc_compile_check(tmp_path / "student_kernel.cu", "sm_80", include_dirs=[STEP])
    assert not bad.ok and bad.errors and "error" in capsys.readouterr().out


def test_parse_ptxas_formats():
    log = ("ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'\n"
           "ptxas info    : Function properties for _Z1kPf\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 360 bytes cmem[0]\n")
    (k,) = parse_ptxas(log)
    assert (k.registers, k.spill_stores, k.spill_loads, k.stack, k.smem, k.barriers) == (40, 4, 12, 8, 2048, 1)


def test_compile_report_lists_ptxas_wgmma_notes():
    """ptxas's C75xx notes (lines seen building step 08's kernel) are listed and make summary() warn; a
    clean log has none."""
    from facourse.cuda_build import CompileReport
    notes = ["ptxas info    : (C7519) warpgroup.arrive is injected in around line 31893 by compiler to allow use "
             "of registers in GMMA in function '_Z1kv'",
             "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
             "to non wgmma instructions defining accumulator registers of a wgmma between start and end of the "
             "pipeline stage in the function '_Z1kv'"]
    clean = "ptxas info    : Compiling entry function '_Z1kv' for 'sm_90a'\nptxas info    : Used 168 registers\n"
    rep = CompileReport(True, "sm_90a", [], clean + "\n".join(notes))
    assert rep.wgmma_notes == notes and "C7515" in rep.summary() and "WGMMA" in rep.summary()
    assert CompileReport(True, "sm_90a", [], clean).wgmma_notes == []


# ============================================================================ GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("version", [p.removesuffix(".cu") for p in LADDER_FILES] + ["solution"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_correct_on_configs_and_edge_cases(version, dtype):
    from facourse import CONFIGS, EDGE_CASES, check_entry_point
    from benchmarks.rungs import entry_point
    fn = entry_point("06", "exercise" if version == "solution" else version)
    for name in list(CONFIGS) + list(EDGE_CASES):
        check_entry_point(fn, name, device="cuda", dtype=getattr(torch, dtype), expect_lse=True)
