"""Step 07's CPU check (``facourse.cuda_host_check``), its products and consumers.

* ``gemm_qk`` and ``gemm_pv``: one warpgroup, the products read through the student's descriptors;
  S = Q K^T and O += P V against NumPy, the descriptors against the layout (panels, 32-byte k-steps,
  16-key-row steps, leading and stride offsets, accumulate flags, which p[kk]);
* ``consumer_mainloop``: the student's consumers with an oracle producer on three problems (fp16 and
  bf16, causal with the diagonal inside a warpgroup's rows, rows with no key, a tile skipped, ragged
  lengths, five key blocks): O and lse against NumPy, the ring protocol checked as it runs (waits before
  reads, releases after the wgmma_wait, parities, accumulators and P untouched while in flight, fences,
  commits, GEMM turns); a deadlock is reported with what each thread waits for.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .emu_build import FunctionResult, run_driver_full
from .emu_hopper import (BARS, CONSUMER_PROBLEMS, EMPTY_BARS, H_ROWS, LN2, LOG2E, REGIONS, Problem, deadlock,
                         from_bits, inputs, round_to, run_kernel, tiles, to_bits)
from .emu_sm80 import C_COLS, C_ROWS

__all__ = ["check_consumer", "check_gemm_pv", "check_gemm_qk", "deadlock_or", "wgmma_coords"]


# ----------------------------------------------------------------------------- gemm_qk, gemm_pv
def wgmma_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) [128 threads, n/2] of the accumulator of an m64nNk16 WGMMA: step 06's 16x8 C fragment
    (``c_coords``) stacked n/8 times along N, warp w of the warpgroup holding rows 16w..16w+15."""
    t, i = np.arange(128)[:, None], np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    return 16 * w + C_ROWS[lane, i % 4], 8 * (i // 4) + C_COLS[lane, i % 4]


def _desc(d: int) -> dict:
    d &= (1 << 64) - 1
    return dict(start=(d & 0x3FFF) << 4, lead=((d >> 16) & 0x3FFF) << 4, stride=((d >> 32) & 0x3FFF) << 4,
                swizzle=d >> 62)


def _gemm_log(buf: bytes, nhead: int) -> tuple[list[int], list[dict], bytes]:
    head = [int(x) for x in np.frombuffer(buf[:8 * nhead], np.int64)]
    n = int(np.frombuffer(buf[8 * nhead:8 * nhead + 8], np.int64)[0])
    rows = np.frombuffer(buf[8 * nhead + 8:8 * nhead + 8 + 56 * n], np.int64).reshape(-1, 7)
    ops = [dict(a=_desc(int(r[0])), b=_desc(int(r[1])), acc=bool(r[2]), rs=bool(r[3]), bf16=bool(r[4]), n=int(r[5]),
                kk=int(r[6])) for r in rows]
    return head, ops, buf[8 * nhead + 8 + 56 * n:]


GEMM_CASES = ((False, 128, 1), (False, 64, 0), (True, 128, 0))   # (bf16, D, the warpgroup of the rows)


def _offset_text(off: int, panel_bytes: int) -> str:
    panel, within = divmod(off, panel_bytes)
    return f"+ {off} bytes (panel {panel} + {within})"


def check_gemm_qk(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(76)
    for bf16, D, wg in GEMM_CASES:
        Q, K = to_bits(rng.standard_normal((128, D)), bf16), to_bits(rng.standard_normal((128, D)), bf16)
        prefill = np.full((128, 64), 1000.0, np.float32)
        rc, out, msg = run_driver_full(binary, ["qk", int(bf16), D, wg], Q.tobytes() + K.tobytes() + prefill.tobytes(), 20)
        where = f"[case: {'bf16' if bf16 else 'fp16'}, D = {D}, consumer warpgroup {wg}: its 64 rows of Q_i x 128 keys] "
        if rc != 0:
            return FunctionResult("gemm_qk", "fail", where + deadlock_or(msg))
        (base, q_addr, k_addr), ops, rest = _gemm_log(out, 3)
        S = np.zeros((64, 128))
        rows, cols = wgmma_coords(128)
        S[rows, cols] = np.frombuffer(rest, np.float32).reshape(128, 64)
        Qf, Kf = from_bits(Q, bf16), from_bits(K, bf16)
        ref = Qf[64 * wg:64 * wg + 64] @ Kf.T
        tol = 1e-3 * np.abs(ref).max() + 1e-3
        if np.abs(S - ref).max() <= tol:
            continue
        if not ops:
            return FunctionResult("gemm_qk", "fail", where + "it issues no WGMMA (S " + (
                "is all zero" if not S.any() else "is not computed") + "): D/16 calls of wgmma_ss_n128")
        expected = [(q_addr + (kk // 4) * H_ROWS * 128 + 32 * (kk % 4), k_addr + (kk // 4) * H_ROWS * 128 + 32 * (kk % 4))
                    for kk in range(D // 16)]
        if any(op["rs"] for op in ops):
            return FunctionResult("gemm_qk", "fail", where + "it calls wgmma_rs: both operands of S = Q K^T are in "
                                  "shared memory, wgmma_ss_n128")
        if any(op["bf16"] != bf16 for op in ops):
            return FunctionResult("gemm_qk", "fail", where + f"its WGMMAs multiply {'bf16' if not bf16 else 'fp16'} "
                                  "values on this type's data: wgmma_ss_n128<T>")
        if len(ops) != D // 16:
            return FunctionResult("gemm_qk", "fail", where + f"{len(ops)} WGMMAs for D = {D}: one per 16 columns of D "
                                  f"(D / 16 = {D // 16}), each a k16 step" + (
                                      "; 4 is the first panel only: a panel holds 64 columns" if len(ops) == 4 else ""))
        for kk, (op, (ea, eb)) in enumerate(zip(ops, expected)):
            for side, got, want, base_addr, what in (("A", op["a"], ea, q_addr, "Q"), ("B", op["b"], eb, k_addr, "K")):
                if got["start"] == want:
                    continue
                if side == "A" and k_addr <= got["start"] < k_addr + 128 * D * 2:
                    return FunctionResult("gemm_qk", "fail", where + "A reads K_j: A is Q_i (q_addr), B is K_j (k_addr)")
                off, want_off = got["start"] - base_addr, want - base_addr
                hint = ""
                if off == 32 * kk and kk >= 4:
                    hint = ("; past 64 columns the step is in the next panel: a 128-byte swizzled panel holds 64 "
                            "columns, so step kk starts in panel kk / 4 at byte 32 * (kk % 4)")
                elif side == "A" and off == (kk // 4) * 64 * 128 + 32 * (kk % 4):
                    hint = ("; Q_i's panels are BLOCK_M * 128 bytes apart: each holds all 128 rows of the tile "
                            "(this warpgroup's 64 start at q_addr)")
                elif off == (kk // 4) * H_ROWS * 128 + 16 * (kk % 4):
                    hint = "; a k16 step is 16 columns of 2 bytes: 32 bytes"
                elif off == 0:
                    hint = "; every step reads the same 16 columns: step kk starts at panel kk / 4, byte 32 * (kk % 4)"
                return FunctionResult("gemm_qk", "fail", where + (
                    f"k-step {kk}: the {side} descriptor ({what}) starts at {what.lower()}_addr "
                    f"{_offset_text(off, H_ROWS * 128)}, expected {_offset_text(want_off, H_ROWS * 128)}" + hint))
            for side, got in (("A", op["a"]), ("B", op["b"])):
                if got["stride"] != 1024:
                    return FunctionResult("gemm_qk", "fail", where + (
                        f"k-step {kk}: the {side} descriptor's stride offset is {got['stride']} bytes: 8-row groups of a "
                        "128-byte swizzled panel are 1024 bytes apart (smem_desc(addr, 16, 1024))"))
            if op["acc"] != (kk > 0):
                return FunctionResult("gemm_qk", "fail", where + (
                    "the first k-step accumulates (accumulate = 1) onto what s held (the previous block's P): it must "
                    "overwrite, accumulate = 0 for kk = 0" if kk == 0 else
                    f"k-step {kk} overwrites s (accumulate = 0): every step after the first adds, accumulate = 1"))
        bad = np.argwhere(np.abs(S - ref) > tol)[0]
        return FunctionResult("gemm_qk", "fail", where + f"S = Q K^T is wrong (first at row {bad[0]}, key {bad[1]}) "
                              "though its descriptors are the expected ones")
    return FunctionResult("gemm_qk", "pass", "S = Q K^T of 64 rows x 128 keys: fp16 and bf16, D = 64 and 128, "
                          "both warpgroups' rows")


def check_gemm_pv(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(77)
    for bf16, D, _ in GEMM_CASES:
        P = rng.uniform(0, 1, (64, 128)).astype(np.float32)
        V = to_bits(rng.standard_normal((128, D)), bf16)
        o0 = rng.standard_normal((128, 64)).astype(np.float32)
        rc, out, msg = run_driver_full(binary, ["pv", int(bf16), D], P.tobytes() + V.tobytes() + o0.tobytes(), 20)
        where = f"[case: {'bf16' if bf16 else 'fp16'}, D = {D}: 64 rows x 128 keys] "
        if rc != 0:
            return FunctionResult("gemm_pv", "fail", where + deadlock_or(msg))
        (base, v_addr), ops, rest = _gemm_log(out, 2)
        rows, cols = wgmma_coords(D)
        O = np.zeros((64, D))
        O[rows, cols] = np.frombuffer(rest, np.float32).reshape(128, 64)[:, :D // 2]
        O0 = np.zeros((64, D))
        O0[rows, cols] = o0[:, :D // 2]
        PV = round_to(P, bf16) @ from_bits(V, bf16)
        ref = O0 + PV
        tol = 1e-3 * np.abs(ref).max() + 1e-3
        if np.abs(O - ref).max() <= tol:
            continue
        if not ops:
            return FunctionResult("gemm_pv", "fail", where + "it issues no WGMMA (o comes back unchanged): BLOCK_N/16 "
                                  "calls of wgmma_rs, A = p[kk]")
        if np.abs(O - PV).max() <= tol:
            return FunctionResult("gemm_pv", "fail", where + "o is overwritten with P V: it must accumulate, O += P V "
                                  "(wgmma_rs adds into o; do not zero it)")
        if not all(op["rs"] for op in ops):
            return FunctionResult("gemm_pv", "fail", where + "it calls wgmma_ss_n128: P comes from registers, wgmma_rs")
        if any(op["bf16"] != bf16 for op in ops):
            return FunctionResult("gemm_pv", "fail", where + "its WGMMAs multiply the other 16-bit type: wgmma_rs<T, D>")
        if len(ops) != 128 // 16:
            return FunctionResult("gemm_pv", "fail", where + f"{len(ops)} WGMMAs: one per 16 keys, BLOCK_N / 16 = 8")
        for kk, op in enumerate(ops):
            off = op["b"]["start"] - v_addr
            if off != kk * 16 * 128:
                hint = ("; V is MN-major here (D contiguous): a k-step is 16 key rows of 128 bytes, 16 * 128"
                        if off == 32 * kk else "; every step reads keys 0-15" if off == 0 else "")
                return FunctionResult("gemm_pv", "fail", where + (
                    f"k-step {kk}: the V descriptor starts at v_addr + {off} bytes, expected + {kk * 16 * 128} (16 key "
                    "rows of 128 bytes per step)" + hint))
            if op["kk"] not in (kk, -1):
                return FunctionResult("gemm_pv", "fail", where + f"k-step {kk} multiplies p[{op['kk']}]: keys "
                                      f"16kk..16kk+15 are p[kk]")
            if op["b"]["stride"] != 1024:
                return FunctionResult("gemm_pv", "fail", where + (
                    f"the V descriptor's stride offset is {op['b']['stride']} bytes: groups of 8 key rows are 1024 "
                    "bytes apart"))
            if D == 128 and op["b"]["lead"] != H_ROWS * 128:
                return FunctionResult("gemm_pv", "fail", where + (
                    f"the V descriptor's leading offset is {op['b']['lead']} bytes: for MN-major V it is the distance "
                    f"between the D/64 panels of 64 columns, BLOCK_N * 128 = {H_ROWS * 128}"))
        bad = np.argwhere(np.abs(O - ref) > tol)[0]
        return FunctionResult("gemm_pv", "fail", where + f"O += P V is wrong (first at row {bad[0]}, column {bad[1]}) "
                              "though its descriptors are the expected ones")
    return FunctionResult("gemm_pv", "pass", "O += P V of 64 rows x 128 keys: fp16 and bf16, D = 64 and 128")


def deadlock_or(msg: str) -> str:
    dl = deadlock(msg)
    return ("deadlock: " + "; ".join(dl["lines"])) if dl else msg


# ----------------------------------------------------------------------------- consumer_mainloop
def _attention_model(P: Problem, q, k, v, *, mask="needed", wg1_shift=0, rescale_o=True, drop_last_pv=False):
    """The consumers' computation in float64, key blocks right to left, each warpgroup's 64 rows on their
    own (P rounded to the 16-bit type before O += P V, as convert_p does); keywords switch a mistake on."""
    O = np.zeros((P.B, P.Hq, P.Sq, P.D))
    lse = np.full((P.B, P.Hq, P.Sq), -np.inf)
    c, diag, group = P.scale * LOG2E, P.Skv - P.Sq, P.Hq // P.Hkv
    kpad = np.zeros((P.B, P.Hkv, -(-P.Skv // H_ROWS) * H_ROWS, P.D))
    vpad = kpad.copy()
    kpad[:, :, :P.Skv], vpad[:, :, :P.Skv] = k, v
    for _, mb, h, b, nb in tiles(P):
        for wg in range(2):
            m0 = mb * H_ROWS + 64 * wg
            rows = np.arange(m0, m0 + 64)
            qr = np.zeros((64, P.D))
            qr[rows < P.Sq] = q[b, h, rows[rows < P.Sq]]
            m, l, o = np.full(64, -np.inf), np.zeros(64), np.zeros((64, P.D))
            for j in range(nb - 1, -1, -1):
                n0 = j * H_ROWS
                cols = np.arange(n0, n0 + H_ROWS)
                s = qr @ kpad[b, h // group, n0:n0 + H_ROWS].T
                needs = {"needed": n0 + H_ROWS > P.Skv or (P.causal and n0 + H_ROWS - 1 > m0 + diag),
                         "rightmost": j == nb - 1, "none": False}.get(mask, True)
                if needs:
                    rr = rows - (wg1_shift if wg == 1 else 0)
                    bad = np.zeros(s.shape, bool)
                    if mask != "no_bound":
                        bad |= cols[None, :] >= P.Skv
                    if P.causal and mask != "no_causal":
                        bad |= cols[None, :] > rr[:, None] + diag
                    s = np.where(bad, -np.inf, s)
                with np.errstate(invalid="ignore", over="ignore"):
                    m_new = np.maximum(m, s.max(1) * c)
                    m_use = np.where(m_new == -np.inf, 0.0, m_new)
                    alpha = np.exp2(m - m_use)
                    p = np.exp2(s * c - m_use[:, None])
                l = alpha * l + p.sum(1)
                m = m_new
                if rescale_o:
                    o = o * alpha[:, None]
                if not (drop_last_pv and j == 0):
                    o = o + round_to(p, P.bf16) @ vpad[b, h // group, n0:n0 + H_ROWS]
            ok = rows < P.Sq
            with np.errstate(divide="ignore", invalid="ignore"):
                O[b, h, rows[ok]] = np.where(l[ok, None] > 0, o[ok] / l[ok, None], 0.0)
                lse[b, h, rows[ok]] = np.where(l[ok] > 0, (m[ok] + np.log2(l[ok])) * LN2, -np.inf)
    return O, lse


def _attention_close(P: Problem, O, lse, ref_O, ref_lse) -> np.ndarray:
    """[B, Hq, Sq]: rows whose O and lse match."""
    tol = 3e-2 if P.bf16 else 1e-2
    with np.errstate(invalid="ignore"):
        o_ok = (np.abs(O - ref_O) <= tol * (1 + np.abs(ref_O))).all(-1)
        lse_ok = (lse == ref_lse) | (np.abs(lse - ref_lse) <= 2e-3 * (1 + np.abs(np.nan_to_num(ref_lse))))
    return o_ok & lse_ok


_CONSUMER_MISTAKES = (   # (keywords of _attention_model, the cause)
    (dict(rescale_o=False), "O is not rescaled: when a row's running max grows, what O accumulated so far must shrink "
                            "by alpha. Call rescale_o(acc.o, alpha) after each online_softmax_update that follows a "
                            "product, once its wgmma_wait is done"),
    (dict(drop_last_pv=True), "the last O += P V (the leftmost key block, after the loop) is missing: after the loop, "
                              "wait for V of the last ring position and do one more gemm_pv"),
    (dict(mask="rightmost"), "apply_mask is applied to the rightmost key block only: where the causal diagonal of a "
                             "warpgroup's 64 rows reaches into the next block, that block needs it too. Mask every block "
                             "with n0 + BLOCK_N > Skv or (causal) n0 + BLOCK_N - 1 > (the warpgroup's first row) + "
                             "Skv - Sq"),
    (dict(mask="no_causal"), "no causal mask: keys past the diagonal are not masked (apply_mask where a block reaches "
                             "past the causal diagonal of the warpgroup's first row)"),
    (dict(mask="no_bound"), "keys past Skv are not masked: TMA fills them with zeros, so their score is 0, not -inf. "
                            "Mask the block that reaches past Skv (n0 + BLOCK_N > Skv)"),
    (dict(mask="none"), "apply_mask is never applied (keys past Skv and past the causal diagonal count)"),
    (dict(wg1_shift=64), "apply_mask gets the rows of the tile's first warpgroup: row0 = m_block * BLOCK_M + wg * 64 + "
                         "16 * warp + lane / 4, this warpgroup's own rows"),
    (dict(wg1_shift=-64), "apply_mask gets rows 64 further than this warpgroup's: row0 = m_block * BLOCK_M + wg * 64 + "
                          "16 * warp + lane / 4"),
)


def _consumer_deadlock_hint(dl: dict) -> str:
    groups = dl["groups"]
    if any(k[1] == "named" for k in groups):
        return ("the consumer warpgroups wait for each other's GEMM turn: every gemm_turn_begin(wg) needs a "
                "gemm_turn_end(wg) after its GEMMs, and both warpgroups must take the same number of turns")
    for (who, kind, bid, parity), g in groups.items():
        if who != "the producer" and kind == "mbar" and bid in (0, 2, 3, 6, 7) and g["uses"] >= 0 \
                and parity != (g["uses"] & 1):
            return (f"{who} waits on {BARS[bid]} with parity {parity}, but this is its use {g['uses']} of the slot, "
                    f"whose phase has parity {g['uses'] & 1}: wrong parity, or `it` off (full barriers are waited "
                    "with parity phase(it); `it` must advance by one per key block, nb per tile)")
    for (who, kind, bid, parity), g in groups.items():
        if who == "the producer" and bid in EMPTY_BARS:
            region = {1: "Q", 4: "K slot 0", 5: "K slot 1", 8: "V slot 0", 9: "V slot 1"}.get(bid, "")
            r = REGIONS.index(region) if region in REGIONS else -1
            held = sorted({w for (w, rr), (ph, _) in dl["holds"].items() if rr == r and ph >= 0})
            why = (f"consumer warps {held} still hold it (they waited on its full barrier and never arrived on "
                   f"{BARS[bid]})" if held else "the consumers did not release it")
            rel = "release(&bars.q_empty, lane) once every S of the tile is done" if bid == 1 else \
                f"release(&bars.{BARS[bid].split('[')[0]}[slot], lane) after the wgmma_wait that ends the GEMM reading it"
            return f"the producer waits for {region} to be released, and {why}: {rel}"
    return "every thread waits"


def check_consumer(binary: Path) -> FunctionResult:
    for P in CONSUMER_PROBLEMS:
        run = run_kernel(binary, P, oracle_producer=True, oracle_consumer=False)
        where = f"[case: {P.text()}] "
        if not run.stats:
            return FunctionResult("consumer_mainloop", "fail", where + f"the emulated CTA stopped: {run.message}")
        if run.stats["gemms"] == 0 and run.stats["waits"] == 0:
            return FunctionResult("consumer_mainloop", "fail", where + "the consumers wait for nothing and issue no "
                                  "GEMM: consumer_mainloop does nothing yet")
        if not run.ok:
            dl = deadlock(run.message)
            if dl is not None:
                return FunctionResult("consumer_mainloop", "fail", where + "deadlock: " + _consumer_deadlock_hint(dl)
                                      + ". (" + "; ".join(dl["lines"]) + ")")
            return FunctionResult("consumer_mainloop", "fail", where + run.message)
        (_, q), (_, k), (_, v) = inputs(P)
        ref_O, ref_lse = _attention_model(P, q, k, v)
        ok = _attention_close(P, run.o, run.lse, ref_O, ref_lse)
        if ok.all():
            continue
        for mistake, cause in _CONSUMER_MISTAKES:
            alt_O, alt_lse = _attention_model(P, q, k, v, **mistake)
            if not _attention_close(P, alt_O, alt_lse, ref_O, ref_lse).all() and \
                    _attention_close(P, run.o, run.lse, alt_O, alt_lse).all():
                return FunctionResult("consumer_mainloop", "fail", where + cause)
        b, h, r = np.argwhere(~ok)[0]
        with np.errstate(invalid="ignore"):
            o_bad = not np.allclose(run.o[b, h, r], ref_O[b, h, r], atol=3e-2, rtol=3e-2)
        part = ("O and lse are" if o_bad and not np.isclose(run.lse[b, h, r], ref_lse[b, h, r]) else
                "O is" if o_bad else "lse is")
        nan = " (NaN)" if np.isnan(run.o[b, h, r]).any() or np.isnan(run.lse[b, h, r]) else ""
        return FunctionResult("consumer_mainloop", "fail", where + (
            f"{part} wrong{nan} in {int((~ok).sum())} of {ok.size} rows; the first: batch {b}, head {h}, row {r} "
            f"(tile m_block {r // H_ROWS}, consumer warpgroup {(r % H_ROWS) // 64})"))
    return FunctionResult("consumer_mainloop", "pass", f"{len(CONSUMER_PROBLEMS)} problems (fp16, bf16, D = 64 and "
                          "128, causal diagonals, empty rows, five key blocks): O and lse right, the ring protocol kept")
