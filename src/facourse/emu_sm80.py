"""Step 06's CPU check (``facourse.cuda_host_check``): its four device functions on one emulated warp
(``emu/driver_sm80.cpp``), each against a NumPy reference, a wrong output compared with the classic
mistakes to name the cause.

* ``load_tile_async``: tiles of 64 and 128 rows, D = 64 and 128, strided rows, rows past ``rows_valid``;
  read back through ``swizzle<D>``; what ``cp_async_16`` read and wrote is checked;
* ``qk_tile``: S = Q K^T of 16 query rows and 64 keys (the harness's Q fragments);
* ``online_softmax_update``: five calls that each isolate a step (the first tile, a growing max: alpha,
  a steady max, rows that have seen no key, a masked tile after keys);
* ``pv_tile``: O += P V, P rounded to fp16 as ``pack2`` does.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .emu_build import FunctionResult, RunError, run_driver

__all__ = ["CHECKS", "C_COLS", "C_ROWS", "c_coords", "gather_c", "scatter_c"]


# ----------------------------------------------------------------------------- fragment layout
def c_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of element c_i of a 16x8 C fragment held by ``lane`` (PTX ISA, mma.m16n8k16)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


C_ROWS = np.array([[c_coords(L, i)[0] for i in range(4)] for L in range(32)])   # [lane, i]
C_COLS = np.array([[c_coords(L, i)[1] for i in range(4)] for L in range(32)])


def gather_c(frags: np.ndarray) -> np.ndarray:
    """[32 lanes][nblocks][4] C fragments -> the 16 x (8 nblocks) matrix."""
    nb = frags.shape[1]
    out = np.zeros((16, 8 * nb))
    for n in range(nb):
        out[C_ROWS, 8 * n + C_COLS] = frags[:, n, :]
    return out


def scatter_c(mat: np.ndarray) -> np.ndarray:
    """The 16 x (8 nblocks) matrix -> [32][nblocks][4] C fragments."""
    nb = mat.shape[1] // 8
    return np.stack([mat[C_ROWS, 8 * n + C_COLS] for n in range(nb)], axis=1)


def _h(x) -> np.ndarray:
    return np.asarray(x, np.float16)



# ----------------------------------------------------------------------------- online_softmax_update
NB, DB = 8, 16            # the driver's instance: BLOCK_N = 64 keys, D = 128
SCALE_LOG2 = (1 / math.sqrt(128)) * math.log2(math.e)


def _softmax_reference(s, m, l, o, c, *, scale=True, scale_p=True, quad=True, guard=True, alpha_l=True,
                       alpha_o=True, exp="exp2", l_quad=False, o_rows_swapped=False):
    """FA2's update on one warp's fragments, float64; keywords switch one classic mistake on."""
    s, m, l, o = (np.array(x, np.float64) for x in (s, m, l, o))
    P, M, L, O = s.copy(), m.copy(), l.copy(), o.copy()
    alphas = []
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(2):
            cols = [2 * r, 2 * r + 1]
            lane_max = s[:, :, cols].max(axis=(1, 2))
            tile = lane_max.reshape(8, 4).max(1).repeat(4) if quad else lane_max
            m_new = np.maximum(m[:, r], tile * (c if scale else 1.0))
            m_use = np.where(m_new == -np.inf, 0.0, m_new) if guard else m_new
            alpha = np.where(m_new == m[:, r], 1.0, np.exp2(m[:, r] - m_use)) if guard else np.exp2(m[:, r] - m_use)
            x = s[:, :, cols] * (c if scale and scale_p else 1.0) - m_use[:, None, None]
            P[:, :, cols] = np.exp2(x) if exp == "exp2" else np.exp(x)
            rowsum = P[:, :, cols].sum(axis=(1, 2))
            if l_quad:
                rowsum = rowsum.reshape(8, 4).sum(1).repeat(4)
            L[:, r] = (alpha if alpha_l else 1.0) * l[:, r] + rowsum
            M[:, r] = m_new
            alphas.append(alpha if alpha_o else np.ones(32))
        for r in range(2):
            a = alphas[1 - r] if o_rows_swapped else alphas[r]
            O[:, :, 2 * r:2 * r + 2] *= a[:, None, None]
    return P, M, L, O


def _softmax_cases(rng) -> list[tuple[str, dict]]:
    """Five calls, each isolating a step of the update: (name, inputs)."""
    def scores(scale=3.0):
        return (rng.standard_normal((32, NB, 4)) * scale).astype(np.float32)

    def fresh():
        return (np.full((32, 2), -np.inf, np.float32), np.zeros((32, 2), np.float32), np.zeros((32, DB, 4), np.float32))

    cases = []
    s = scores()
    s[:, 5:, :] = np.where(rng.random((32, 3, 4)) < 0.5, -np.inf, s[:, 5:, :])     # some masked keys
    cases.append(("the first key tile (m_i = -inf, l_i = 0, o = 0)", dict(s=s, m=fresh()[0], l=fresh()[1], o=fresh()[2])))
    # a growing max: the previous tiles' max was lower than this tile's
    s = scores()
    prev = (gather_c(s.astype(np.float64)).max(1) * SCALE_LOG2 - rng.uniform(0.5, 3.0, 16))
    m = np.stack([prev[C_ROWS[:, 0]], prev[C_ROWS[:, 2]]], 1).astype(np.float32)
    l = rng.uniform(0.5, 4.0, (32, 2)).astype(np.float32)
    o = rng.standard_normal((32, DB, 4)).astype(np.float32)
    cases.append(("a tile whose max is larger than the running max (alpha < 1)", dict(s=s, m=m, l=l, o=o)))
    # a steady max: this tile's scores are all below the running max
    s = scores(1.0)
    m = np.full((32, 2), 5.0 * SCALE_LOG2 + 2.0, np.float32)
    cases.append(("a tile below the running max (alpha = 1)", dict(s=s, m=m, l=l.copy(), o=o.copy())))
    # rows that have seen no key yet: rows g = 0..3 (element 0, 1: row g) all masked, with m = -inf
    s = scores()
    s[C_ROWS[:, 0] < 4, :, 0:2] = -np.inf
    m0, l0, o0 = fresh()
    cases.append(("rows whose keys are all masked so far (m_i = -inf: exp2(-inf - (-inf)) is NaN)",
                  dict(s=s, m=m0, l=l0, o=o0)))
    # a fully masked tile after keys: rows g + 8 masked, running state finite
    s = scores()
    s[:, :, 2:4] = -np.inf
    m = rng.uniform(-1.0, 1.0, (32, 2)).astype(np.float32).reshape(8, 4, 2)[:, :1, :].repeat(4, 1).reshape(32, 2)
    cases.append(("a tile whose keys are all masked for rows g + 8, after earlier keys",
                  dict(s=s, m=m, l=l.copy(), o=o.copy())))
    return cases


def _close(got, ref, rtol=2e-5, atol=1e-6) -> np.ndarray:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    same_inf = np.isinf(ref) & (got == ref)
    with np.errstate(invalid="ignore"):
        return same_inf | (np.abs(got - ref) <= atol + rtol * np.abs(ref))


def _diagnose_softmax(case: str, inp: dict, got: tuple, c: float) -> str | None:
    """None when the outputs are right, else the likely cause."""
    ref = _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c)
    names = ("P (s on return)", "m_i", "l_i", "o")
    ok = [_close(g, r).all() for g, r in zip(got, ref)]
    if all(ok):
        return None
    where = f"[case: {case}] "
    unchanged = all(np.array_equal(g, inp[k], equal_nan=True) for g, k in zip(got, "smlo"))
    if unchanged:
        return where + "s, m_i, l_i and o come back unchanged: online_softmax_update does nothing yet"
    nan = [n for g, r, n in zip(got, ref, names) if (np.isnan(g) & ~np.isnan(r)).any()]
    if nan:
        empty = ref[1] == -np.inf                                  # [lane, r]: rows that have seen no key
        nan_rows = np.zeros((32, 2), bool)
        for r in range(2):
            nan_rows[:, r] |= np.isnan(got[0][:, :, 2 * r:2 * r + 2]).any(axis=(1, 2)) | np.isnan(got[2][:, r])
            nan_rows[:, r] |= np.isnan(got[3][:, :, 2 * r:2 * r + 2]).any(axis=(1, 2)) | np.isnan(got[1][:, r])
        if empty.any() and not (nan_rows & ~empty).any():
            return where + (f"NaN in {', '.join(nan)}: no -inf guard. A row whose keys were all masked so far has "
                            "m_i = -inf and exp2(s - m_i) = exp2(-inf - (-inf)) = NaN: offset the exponents by "
                            "fa::finite_max(m_new) and take alpha from fa::rescale_factor(m_old, m_new)")
        return where + f"NaN in {', '.join(nan)} where the reference is finite (a -inf - (-inf) or 0 * inf somewhere?)"
    M = np.asarray(got[1], np.float64)
    if not ok[1]:
        if _close(M, _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c, scale=False)[1]).all():
            return where + ("m_i is the raw scores' max: the scale is missing. m_i is in log2 units, "
                            "max(m_i, rowmax(s) * scale_log2), and P = exp2(s * scale_log2 - m_new)")
        quads = M.reshape(8, 4, 2)
        if (quads != quads[:, :1, :]).any() or _close(M, _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c,
                                                                             quad=False)[1]).all():
            return where + ("m_i differs among the four lanes of a quad: wrong quad reduction. A row's scores are "
                            "spread over lanes 4g..4g+3 (columns 2t, 2t+1 of each 8-key block): reduce the tile's row "
                            "max over them with quad_max (shuffles with xor 1 and 2) before comparing with m_i")
        if (M > ref[1] + 1e-6 * np.abs(ref[1])).any():
            return where + ("m_i is larger than the max of its own row: wrong quad reduction, or the rows mixed "
                            "(elements 0, 1 of s[n] are row g, elements 2, 3 row g + 8; reduce over xor 1 and 2 only)")
        return where + "m_i (the running max, in log2 units: max(m_old, rowmax(s) * scale_log2)) is wrong"
    if not ok[0]:
        if _softmax_matches(got, inp, c, scale_p=False, only=0):
            return where + "P = exp2(s - m_i): the scores are not multiplied by scale_log2 (the scale is missing)"
        if _softmax_matches(got, inp, c, exp="exp", only=0, m=M):
            return where + "P uses exp (base e): m_i is in log2 units, so P = exp2(s * scale_log2 - m_new)"
        return where + "P (what s holds on return) is wrong: P = exp2(s * scale_log2 - m_new), 0 for masked keys"
    if not ok[2]:
        if _softmax_matches(got, inp, c, alpha_l=False, only=2):
            o_too = _softmax_matches(got, inp, c, alpha_o=False, only=3) and not ok[3]
            return where + (("neither l_i nor o is" if o_too else "l_i is") + " rescaled by alpha: no alpha rescale "
                            "of " + ("l and O" if o_too else "l") + ". When the running max of a row grows, what was "
                            "accumulated so far shrinks by alpha = exp2(m_old - m_new): l_i = alpha * l_i + rowsum(P)"
                            + (", o *= alpha" if o_too else ""))
        if _softmax_matches(got, inp, c, l_quad=True, only=2):
            return where + ("l_i holds the quad's whole row sum (quad_sum): it must stay this lane's partial sum, "
                            "the harness adds the four partials at the end")
        return where + "l_i is wrong: l_i = alpha * l_i + (this lane's part of) rowsum(P)"
    if _softmax_matches(got, inp, c, alpha_o=False, only=3):
        return where + ("o is not rescaled: no alpha rescale of O_i. When the running max of a row grows, the "
                        "output accumulated so far must shrink by alpha = exp2(m_old - m_new): o[d][0..1] *= alpha "
                        "of row g, o[d][2..3] *= alpha of row g + 8")
    if _softmax_matches(got, inp, c, o_rows_swapped=True, only=3):
        return where + "o's rows are rescaled by the other row's alpha: o[d][0..1] are row g, o[d][2..3] row g + 8"
    return where + "o is wrong: o *= alpha (per row) and nothing else here (P V is pv_tile's)"


def _softmax_matches(got, inp, c, only: int, **mistake) -> bool:
    """Does the student's output number ``only`` (P, m, l, o) match that of ``mistake``?"""
    ref = _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c, **mistake)
    return bool(_close(np.asarray(got[only], np.float64), ref[only]).all())


def _check_softmax(binary: Path) -> FunctionResult:
    cases = _softmax_cases(np.random.default_rng(6))
    data = b"".join(b"".join(np.ascontiguousarray(inp[k], np.float32).tobytes() for k in "smlo")
                    + np.float32(SCALE_LOG2).tobytes() for _, inp in cases)
    out = run_driver(binary, ["softmax", len(cases)], data)
    sizes = [32 * NB * 4, 32 * 2, 32 * 2, 32 * DB * 4]
    arr = np.frombuffer(out, np.float32)
    if arr.size != sum(sizes) * len(cases):
        raise RunError("it wrote no complete result")
    pos = 0
    for name, inp in cases:
        got = []
        for k, n in zip("smlo", sizes):
            got.append(arr[pos:pos + n].reshape(inp[k].shape))
            pos += n
        if (msg := _diagnose_softmax(name, inp, tuple(got), np.float32(SCALE_LOG2))) is not None:
            return FunctionResult("online_softmax_update", "fail", msg)
    return FunctionResult("online_softmax_update", "pass", f"{len(cases)} calls: the first tile, a growing max "
                          "(alpha), a steady max, rows with no key yet, a masked tile")


# ----------------------------------------------------------------------------- load_tile_async
LOAD_CASES = [   # (ROWS, D, rows_valid, row_stride, what)
    (64, 128, 64, 128, "a full K tile, contiguous rows"),
    (128, 128, 128, 3 * 128 + 64, "a Q tile of strided rows ([B, S, H, D] storage)"),
    (64, 128, 37, 2 * 128, "the last K tile: rows past rows_valid = 37"),
    (64, 64, 1000, 64, "D = 64, rows_valid past the tile"),
]
_NAN16 = np.uint16(0x7E00)      # shared memory no copy wrote
_PAD16 = np.uint16(0x7C01)      # global memory the tile may not read (a signalling NaN)


def _swz(D: int, r, c):
    return r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7)


def _check_load(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(7)
    synchronous = False
    for rows, D, rv, stride, what in LOAD_CASES:
        tile = _h(rng.standard_normal((rows, D)))
        g = np.full((rows, stride), _PAD16, np.uint16)
        nvalid = min(rv, rows)
        g[:nvalid, :D] = tile[:nvalid].view(np.uint16)
        out = run_driver(binary, ["load", rows, D, rv, stride], g.tobytes())
        guard = 2 * D
        smem = np.frombuffer(out[:2 * (rows * D + guard)], np.uint16)
        calls, bad_src, bad_dst, misaligned = np.frombuffer(out[2 * (rows * D + guard):], np.int64)
        want = np.zeros((rows, D), np.uint16)
        want[:nvalid] = tile[:nvalid].view(np.uint16)
        r, c = np.meshgrid(np.arange(rows), np.arange(D), indexing="ij")
        back = smem[_swz(D, r, c)]
        where = f"[case: {what}; ROWS = {rows}, D = {D}, rows_valid = {rv}, row_stride = {stride}] "
        if calls == 0 and (smem[:rows * D] == _NAN16).all():
            return FunctionResult("load_tile_async", "fail", where + "nothing reaches shared memory: load_tile_async "
                                  "does nothing yet (cp_async_16 is never called)")
        if bad_dst:
            return FunctionResult("load_tile_async", "fail", where + f"{bad_dst} cp_async_16 call(s) write past the "
                                  "tile's ROWS x D elements in shared memory")
        if (smem[rows * D:] != _NAN16).any():
            return FunctionResult("load_tile_async", "fail", where + "writes past the tile's ROWS x D elements")
        if bad_src:
            return FunctionResult("load_tile_async", "fail", where + (
                f"{bad_src} copies read global memory the tile may not read (rows r >= rows_valid, or past a row's D "
                "columns): call cp_async_16 with valid = false for rows r >= rows_valid (nothing is read, 16 zero "
                "bytes are written) and give row r's address as gmem + r * row_stride + c"))
        if misaligned:
            return FunctionResult("load_tile_async", "fail", where + "a 16-byte copy starts at no multiple of 8 "
                                  "elements: each thread copies whole chunks c = 0, 8, 16, ... of a row")
        if np.array_equal(back, want):
            synchronous = synchronous or calls == 0
            continue
        if np.array_equal(smem[:rows * D].reshape(rows, D), want):
            return FunctionResult("load_tile_async", "fail", where + "the tile is stored row-major (element (r, c) at "
                                  "r * D + c): no swizzle. Element (r, c) goes to smem[swizzle<D>(r, c)]")
        never = back == _NAN16
        if np.array_equal(back[:nvalid], want[:nvalid]) and nvalid < rows and (back[nvalid:] != 0).any():
            return FunctionResult("load_tile_async", "fail", where + "rows r >= rows_valid are not zero-filled: "
                                  "call cp_async_16 with valid = false for them (it writes 16 zero bytes)")
        if never.any():
            rr = sorted(set(np.nonzero(never)[0].tolist()))
            return FunctionResult("load_tile_async", "fail", where + (
                f"{int(never.sum()) // 8} chunks of 8 elements are never written (rows {_ranges(rr)}): the tile is "
                f"ROWS x D/8 chunks; thread tid copies chunks tid, tid + NTHREADS, ... "
                f"({rows * D // 8 // 256} each here)"))
        if stride != D:
            g2 = np.full((rows, D), 0, np.uint16)
            flat = g.reshape(-1)
            g2[:nvalid] = flat[:nvalid * D].reshape(nvalid, D)
            if np.array_equal(back[:nvalid], g2[:nvalid]):
                return FunctionResult("load_tile_async", "fail", where + "row r is read at gmem + r * D: use "
                                      "row_stride (rows of q, k, v are row_stride elements apart, not D)")
        bad = np.argwhere(back != want)[0]
        return FunctionResult("load_tile_async", "fail", where + (
            f"element ({bad[0]}, {bad[1]}) of the tile, read back at swizzle<D>(r, c), is wrong "
            f"({int((back != want).sum())} elements wrong): each 16-byte chunk (r, c) of the tile goes to "
            "smem + swizzle<D>(r, c), from gmem + r * row_stride + c"))
    how = ("; but no cp_async_16 call: the copy goes through registers and the pipeline overlaps nothing"
           if synchronous else ", 16-byte cp.async copies")
    return FunctionResult("load_tile_async", "pass", f"{len(LOAD_CASES)} tiles: swizzled, strided rows, zero-filled "
                          "past rows_valid" + how)


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out[:6]) + (" ..." if len(out) > 6 else "")


# ----------------------------------------------------------------------------- qk_tile, pv_tile
def _unswizzled_view(mat: np.ndarray) -> np.ndarray:
    """What reading a swizzled [R][D] tile at r * D + c (without the swizzle) gives."""
    R, D = mat.shape
    smem = np.zeros(R * D, mat.dtype)
    r, c = np.meshgrid(np.arange(R), np.arange(D), indexing="ij")
    smem[_swz(D, r, c)] = mat
    return smem.reshape(R, D)


def _blocks_wrong(got: np.ndarray, ref: np.ndarray, tol: float) -> list[int]:
    return [n for n in range(got.shape[1] // 8) if np.abs(got[:, 8 * n:8 * n + 8] - ref[:, 8 * n:8 * n + 8]).max() > tol]


def _check_qk(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(8)
    for D in (64, 128):
        Q, K = _h(rng.standard_normal((16, D))), _h(rng.standard_normal((64, D)))
        out = run_driver(binary, ["qk", D], Q.view(np.uint16).tobytes() + K.view(np.uint16).tobytes())
        S = gather_c(np.frombuffer(out, np.float32).reshape(32, 8, 4).astype(np.float64))
        ref = Q.astype(np.float64) @ K.astype(np.float64).T
        tol = 1e-4 * np.abs(ref).max() + 1e-4
        where = f"[case: 16 query rows x 64 keys, D = {D}] "
        if np.abs(S - ref).max() <= tol:
            continue
        if not np.abs(S).any():
            return FunctionResult("qk_tile", "fail", where + "S is all zero: qk_tile computes nothing yet")
        if np.abs(S - Q.astype(np.float64) @ _unswizzled_view(K).astype(np.float64).T).max() <= tol:
            return FunctionResult("qk_tile", "fail", where + "K is read from shared memory without the swizzle: "
                                  "row r, column c of the tile is at sK + swizzle<D>(r, c)")
        part = [kk for kk in range(1, D // 16) if np.abs(S - Q[:, :16 * kk].astype(np.float64)
                                                           @ K[:, :16 * kk].astype(np.float64).T).max() <= tol]
        if part:
            return FunctionResult("qk_tile", "fail", where + f"S sums over only the first {16 * part[0]} of D = {D} "
                                  "columns: loop kk over D / 16 (one ldmatrix_x4 per 16 keys and 16 columns)")
        wrong = _blocks_wrong(S, ref, tol)
        moved = {n: m for n in wrong for m in range(8) if np.abs(S[:, 8 * n:8 * n + 8] - ref[:, 8 * m:8 * m + 8]).max() <= tol}
        if moved:
            n, m = next(iter(moved.items()))
            return FunctionResult("qk_tile", "fail", where + f"s[{n}] holds keys {8 * m}..{8 * m + 7} instead of "
                                  f"{8 * n}..{8 * n + 7}: s[n] is the C fragment of keys 8n..8n+7; with one ldmatrix_x4 "
                                  "per 16 keys, b[0], b[1] feed keys 0-7 and b[2], b[3] keys 8-15")
        return FunctionResult("qk_tile", "fail", where + (
            f"S = Q K^T is wrong in key blocks {wrong} (s[n] = keys 8n..8n+7). Check which lanes address which 8x8 "
            "matrix (lanes 8i..8i+7 give the rows of matrix i: keys np*16 + (lane & 7) + (lane >> 4) * 8, columns "
            "kk*16 + ((lane >> 3) & 1) * 8) and which registers feed each mma_16816 (no .trans for K)"))
    return FunctionResult("qk_tile", "pass", "S = Q K^T for 16 rows x 64 keys, D = 64 and 128")


def _check_pv(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(9)
    for D in (64, 128):
        P = rng.uniform(0, 1, (16, 64))
        V = _h(rng.standard_normal((64, D)))
        O0 = rng.standard_normal((16, D))
        p, o0 = scatter_c(P).astype(np.float32), scatter_c(O0).astype(np.float32)
        out = run_driver(binary, ["pv", D], p.tobytes() + V.view(np.uint16).tobytes() + o0.tobytes())
        O = gather_c(np.frombuffer(out, np.float32).reshape(32, D // 8, 4).astype(np.float64))
        Ph = _h(P).astype(np.float64)
        Vd = V.astype(np.float64)
        ref = O0 + Ph @ Vd
        tol = 1e-4 * np.abs(ref).max() + 1e-4
        where = f"[case: 16 rows x 64 keys, D = {D}] "
        if np.abs(O - ref).max() <= tol:
            continue
        if np.abs(O - O0).max() <= 1e-6:
            return FunctionResult("pv_tile", "fail", where + "o comes back unchanged: pv_tile computes nothing yet")
        if np.abs(O - Ph @ Vd).max() <= tol:
            return FunctionResult("pv_tile", "fail", where + "o is overwritten with P V: it must accumulate, "
                                  "O_i += P V_j (mma_16816 adds into its C fragment; do not zero o)")
        if np.abs(O - O0 - Ph @ _unswizzled_view(V).astype(np.float64)).max() <= tol:
            return FunctionResult("pv_tile", "fail", where + "V is read from shared memory without the swizzle: "
                                  "row r, column c of the tile is at sV + swizzle<D>(r, c)")
        wrong = _blocks_wrong(O, ref, tol)
        return FunctionResult("pv_tile", "fail", where + (
            f"O += P V is wrong in column blocks {wrong} (o[d] = columns 8d..8d+7). The A fragment of P for "
            "keys 16kk..16kk+15 is pack2 of p[2kk][0,1], p[2kk][2,3], p[2kk+1][0,1], p[2kk+1][2,3]; V is [key][d], "
            "so ldmatrix_x4_trans, rows kk*16 + (lane & 15), columns dp*16 + (lane >> 4) * 8; b[0], b[1] feed "
            "columns 0-7 of the 16, b[2], b[3] columns 8-15"))
    return FunctionResult("pv_tile", "pass", "O += P V for 16 rows x 64 keys, D = 64 and 128")


CHECKS = {"load_tile_async": _check_load, "qk_tile": _check_qk, "online_softmax_update": _check_softmax,
          "pv_tile": _check_pv}
