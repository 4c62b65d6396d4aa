"""Step 07 on a CPU (issue 20): what a student without a Hopper GPU sees.

* the stub's marker: the untouched stub's four functions are reported as not implemented (compile
  check and CPU check), and a written one no longer is;
* the emulator (emu/emu_hopper.h) defines every instruction hopper_primitives.cuh leaves out on the
  CPU and restates nothing the header keeps; the emulated WGMMA accumulator is the lecture's layout (step 06's C fragment stacked along N);
* the notebook's visible cells as a student's Run All runs them (nvcc's compile check left out: the
  grading test runs it), in subprocesses: the solution passes the CPU check (well under 30 s with its
  first build), the stub is reported as not implemented, the GPU test prints one sentence and does not
  stop the run; each planted bug of the corpus fails the CPU check cell, naming its cause.

The corpus: 22 classic bugs, planted in the solution. The CPU check runs the producer against correct
consumers and the consumers against a correct producer, and gemm_qk and gemm_pv on their own, so a
producer bug and a consumer bug (or a gemm_qk and a gemm_pv bug) are planted in one file: each must
be named, and the two functions without a bug must still pass. That halves the g++ builds (about 3 s
each on 2 cores, the standard headers precompiled once).

Needs g++; each test that needs it says so when it is absent.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_cuda_visible

ROOT = Path(__file__).resolve().parent.parent
STEP = ROOT / "solutions" / "07_hopper_flash_attention"
SOLUTION = (STEP / "ladder" / "student_kernel_solution.cu").read_text()
STUB = (STEP / "student_kernel.cu").read_text()
GIVEN = ("hopper_common.cuh", "hopper_harness.cuh", "hopper_primitives.cuh", "fa_params.h", "fa_binding.cpp")

from facourse import cuda_host_check as hc  # noqa: E402
from facourse import emu_hopper  # noqa: E402
from facourse.emu_build import EMU, defined_names, split_header  # noqa: E402
from facourse.emu_hopper_gemm import wgmma_coords  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed: the CPU check builds with it")

# ----------------------------------------------------------------------------- the planted bugs
# name -> (the function it is in, substitutions in the solution, words its failure must contain)
BUGS = {
    # ---- producer
    "producer_gqa": ("producer", [("const int h_kv = tile.h / group;", "const int h_kv = tile.h;")],
                     ["producer", "GQA", "h / (Hq / Hkv)"]),
    "producer_left_to_right": ("producer", [("for (int j = nb - 1; j >= lo; --j, ++it) {",
                                             "for (int j = lo; j < nb; ++j, ++it) {")],
                               ["producer", "left to right"]),
    "producer_no_skip": ("producer", [("    if (nb == 0) continue;\n    // LADDER ONLY {", "    // LADDER ONLY {")],
                         ["producer", "no key block (nb = 0)"]),
    "producer_block_coords": ("producer", [("c * PANEL, tile.m_block * BLOCK_M, tile.h", "c * PANEL, tile.m_block, tile.h"),
                                           ("c * PANEL, j * BLOCK_N,", "c * PANEL, j,")],
                              ["producer", "block number", "elements"]),
    "producer_it_reset": ("producer", [("    if (nb == 0) continue;\n", "    if (nb == 0) continue;\n    it = 0;\n")],
                          ["producer", "restarts at 0 for every tile"]),
    "producer_empty_parity": ("producer", [("mbar_wait(&bars.k_empty[s], phase(it) ^ 1);",
                                            "mbar_wait(&bars.k_empty[s], phase(it));")],
                              ["producer", "k_empty", "parity 0", "waits forever"]),
    "producer_no_v_empty_wait": ("producer", [("      mbar_wait(&bars.v_empty[s], phase(it) ^ 1);\n", "")],
                                 ["producer", "without waiting on v_empty"]),
    "producer_bytes": ("producer", [("mbar_expect_tx(&bars.k_full[s], L::kKVBytes);",
                                     "mbar_expect_tx(&bars.k_full[s], L::kKVBytes / L::kPanels);")],
                       ["producer", "announces", "k_full"]),
    # ---- gemm_qk
    "qk_no_panel": ("gemm_qk", [("q_addr + (kk / 4) * BLOCK_M * 128 + off", "q_addr + kk * 32"),
                                ("k_addr + (kk / 4) * BLOCK_N * 128 + off", "k_addr + kk * 32")],
                    ["gemm_qk", "k-step 4", "panel kk / 4"]),
    "qk_accumulate_first": ("gemm_qk", [("wgmma_ss<T, BLOCK_N, 0, 0>(s, da, db, kk > 0);", "wgmma_ss<T, BLOCK_N, 0, 0>(s, da, db, 1);")],
                            ["gemm_qk", "first k-step accumulates", "accumulate = 0"]),
    "qk_no_commit": ("gemm_qk", [("(s, da, db, kk > 0);  // wgmma_ss_n128 at BLOCK_N = 128\n  }\n  wgmma_commit();\n",
                                  "(s, da, db, kk > 0);  // wgmma_ss_n128 at BLOCK_N = 128\n  }\n")],
                     ["gemm_qk", "wgmma_commit"]),
    # ---- gemm_pv
    "pv_no_kstep": ("gemm_pv", [("smem_desc(v_addr + kk * 16 * 128, BLOCK_N * 128, 1024)",
                                 "smem_desc(v_addr, BLOCK_N * 128, 1024)")],
                    ["gemm_pv", "every step reads keys 0-15"]),
    "pv_leading_offset": ("gemm_pv", [("smem_desc(v_addr + kk * 16 * 128, BLOCK_N * 128, 1024)",
                                       "smem_desc(v_addr + kk * 16 * 128, 16, 1024)")],
                          ["gemm_pv", "leading offset", "panels"]),
    # ---- consumer_mainloop
    "no_rescale_o": ("consumer_mainloop", [("    if constexpr (!kRescaleInTurn) rescale_o<D>(acc.o, alpha);\n", "")],
                     ["consumer_mainloop", "O is not rescaled", "rescale_o"]),
    "convert_p_in_flight": ("consumer_mainloop", [
        ("    online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);\n    wgmma_wait<0>();",
         "    online_softmax_update(s, acc.m, acc.l, alpha, scale_log2);\n    convert_p<T>(s, p_frag);\n"
         "    wgmma_wait<0>();"),
        ("    convert_p<T>(s, p_frag);  // only now: the registers of P_{j+1} were an operand in flight\n", "")],
                            ["consumer_mainloop", "A registers", "operand in flight"]),
    "mask_in_flight": ("consumer_mainloop", [
        ("    gemm_turn_end(wg);\n    if constexpr (kOverlap)",
         "    gemm_turn_end(wg);\n    if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);\n"
         "    if constexpr (kOverlap)"),
        ("    release(&bars.k_empty[sk], lane);\n    if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);\n",
         "    release(&bars.k_empty[sk], lane);\n")],
                       ["consumer_mainloop", "accumulator", "changed between the WGMMA and the wgmma_wait"]),
    "release_k_early": ("consumer_mainloop", [
        ("    gemm_turn_end(wg);\n    if constexpr (kOverlap)", "    gemm_turn_end(wg);\n    release(&bars.k_empty[sk], lane);\n"
                                                                "    if constexpr (kOverlap)"),
        ("    pin_registers(s);\n    release(&bars.k_empty[sk], lane);\n", "    pin_registers(s);\n")],
                        ["consumer_mainloop", "K slot", "still in flight"]),
    "no_release_k": ("consumer_mainloop", [("    pin_registers(s);\n    release(&bars.k_empty[sk], lane);\n",
                                            "    pin_registers(s);\n")],
                     ["consumer_mainloop", "never released", "k_empty"]),
    "mask_rightmost_only": ("consumer_mainloop", [
        ("    if (needs_mask(j * BLOCK_N)) apply_mask(s, j * BLOCK_N, row0, p, lane);\n", "")],
                            ["consumer_mainloop", "rightmost key block only"]),
    "no_last_pv": ("consumer_mainloop", [("  else gemm_pv<T, D>(acc.o, p_frag, v_addr + slot(it) * L::kKVBytes);\n",
                                          "  else {}\n")],
                   ["consumer_mainloop", "last O += P V"]),
    "full_parity": ("consumer_mainloop", [("mbar_wait(&bars.k_full[sk], phase(it + 1));",
                                           "mbar_wait(&bars.k_full[sk], phase(it));")],
                    ["consumer_mainloop", "parity"]),
    "turns_unbalanced": ("consumer_mainloop", [
        ("    gemm_qk<T, D>(s, q_addr, k_addr + slot(it) * L::kKVBytes);\n    gemm_turn_end(wg);\n",
         "    gemm_qk<T, D>(s, q_addr, k_addr + slot(it) * L::kKVBytes);\n")],
                         ["consumer_mainloop", "deadlock", "GEMM turn"]),
}


def planted(*names: str) -> str:
    code = SOLUTION
    for name in names:
        for old, new in BUGS[name][1]:
            assert old in code, f"planted bug {name} out of date: {old!r} is not in the solution"
            code = code.replace(old, new)
    return code


def combos() -> list[tuple[str, ...]]:
    """The corpus in files of one or two bugs: a producer bug with a consumer bug, gemm_qk's with gemm_pv's."""
    by = {f: [n for n, (g, _, _) in BUGS.items() if g == f] for f in hc.HOPPER_FUNCTIONS}
    out = []
    for a, b in (("producer", "consumer_mainloop"), ("gemm_qk", "gemm_pv")):
        for i in range(max(len(by[a]), len(by[b]))):
            out.append(tuple(x[i] for x in (by[a], by[b]) if i < len(x)))
    return out


# ----------------------------------------------------------------------------- the stub's marker, the emulator
def test_stub_functions_are_reported_not_implemented_until_written():
    assert hc.step_of(STUB) == hc.step_of(SOLUTION) == "07"
    assert hc.step_of((ROOT / "solutions" / "06_cuda_flash_attention" / "student_kernel.cu").read_text()) == "06"
    assert hc.unwritten_functions(STUB) == list(hc.HOPPER_FUNCTIONS)
    assert hc.unwritten_functions(SOLUTION) == []
    assert "#define FA_TODO(name)" in (STEP / "hopper_common.cuh").read_text()
    # a student who wrote gemm_pv (its solution body in place of the stub's)
    body = re.search(r"gemm_pv\(.*?// BEGIN SOLUTION\n(.*?)  // END SOLUTION", SOLUTION, re.S)[1]
    one = re.sub(r'  // YOUR CODE HERE \(about 4 lines\)\n  FA_TODO\("gemm_pv"\);[^\n]*\n[^\n]*\n', lambda _: body, STUB)
    assert one != STUB
    assert hc.unwritten_functions(one) == ["producer", "gemm_qk", "consumer_mainloop"]


def test_the_emulator_stands_in_for_the_hopper_instructions_only():
    """The CPU check compiles hopper_primitives.cuh itself: the emulator (emu/emu_hopper.h) defines every
    instruction the header leaves out under FA_CPU_EMULATION, and restates nothing the header keeps."""
    emulated, kept = split_header((STEP / "hopper_primitives.cuh").read_text())
    assert {"mbar_wait", "tma_load_4d", "wgmma_rs", "wgmma_ss_n128", "named_bar_sync", "exp2_approx"} <= emulated
    assert {"smem_u32", "smem_desc", "pack2", "quad_max", "quad_sum", "WgmmaType"} <= kept, kept
    emu = defined_names((EMU / "emu_hopper.h").read_text() + (EMU / "emu_warp.h").read_text())
    assert not emulated - emu, f"the emulator lacks {sorted(emulated - emu)}"
    assert not kept & emu, f"the emulator restates {sorted(kept & emu)} of hopper_primitives.cuh"


def test_accumulator_layout_is_the_lectures():
    """The emulated WGMMA accumulator: step 06's C fragment stacked along N, one 16-row slice per warp
    (the lecture's statement, checked with step 06's index function)."""
    sys.path.insert(0, str(ROOT / "diagrams"))
    import fragments as fr
    for n in (64, 128):
        rows, cols = wgmma_coords(n)
        for t in range(128):
            w, lane = divmod(t, 32)
            for i in range(n // 2):
                r, c = fr.c_coords(lane, i % 4)
                assert (rows[t, i], cols[t, i]) == (16 * w + r, 8 * (i // 4) + c)
        assert len({(int(r), int(c)) for r, c in zip(rows.ravel(), cols.ravel())}) == 64 * n


def test_schedule_is_the_kernels_protocol():
    """The schedule the check runs the oracles from: every ring position filled once per tile's key
    block, waits with the parities of the lecture's ring (full: phase(it), empty: phase(it) ^ 1)."""
    P = emu_hopper.PRODUCER_PROBLEMS[0]
    pops, cops, what = emu_hopper.schedule(P)
    nbs = [nb for *_, nb in emu_hopper.tiles(P)]
    assert sum(nbs) == sum(1 for w in what if w["map"] == "K") // (P.D // 64) == 20
    empties = [o for o in pops if o[1] == emu_hopper.WAIT and o[2] in (4, 5)]
    fulls = [o for o in cops if o[1] == emu_hopper.WAIT and o[2] in (2, 3)]
    assert [o[3] for o in empties] == [((it // 2) & 1) ^ 1 for it in range(20)]
    assert [o[3] for o in fulls] == [(it // 2) & 1 for it in range(20)]


# ----------------------------------------------------------------------------- the visible cells
def run_visible(tmp_path, kernels: dict[str, str], skip=("compile_check",), processes: int = 1) -> dict[str, dict]:
    return run_cuda_visible(tmp_path, STEP, "07_hopper_flash_attention.ipynb", GIVEN, kernels, skip, processes)


@needs_gxx
def test_visible_cells_on_cpu_solution_and_stub(tmp_path):
    runs = run_visible(tmp_path, {"solution": SOLUTION, "stub": STUB})
    sol, stub = runs["solution"], runs["stub"]
    # the solution: every visible cell runs; the CPU check passes all four functions well under 30 s (its
    # first build, g++ and the precompiled standard headers included), and says what only an H100 checks
    assert all(c["error"] is None for c in sol.values()), {g: c["error"] for g, c in sol.items()}
    out = sol["cpu_checks"]["out"]
    assert out.count(" ok: ") == 4 and "What only an H100/H200 checks" in out and "FAILED" not in out, out
    # the work, in CPU seconds (its own and g++'s): the wall time moves with the suite's load beside it
    # (30.8 s once in CI, for about 14 s of CPU on an idle machine)
    assert sol["cpu_checks"]["cpu"] < 30, (sol["cpu_checks"]["cpu"], sol["cpu_checks"]["s"])
    # the GPU test says so in one sentence and does not stop Run All
    assert sol["test_small"]["out"].startswith("Skipped, 0 points on this machine:"), sol["test_small"]["out"]
    assert sol["test_small"]["out"].count("\n") == 1
    # the stub: every function reported as not implemented, the GPU test skipped without an error
    assert stub["cpu_checks"]["error"].startswith("HostCheckError"), stub["cpu_checks"]
    assert stub["cpu_checks"]["out"].count("not implemented yet") == 4, stub["cpu_checks"]["out"]
    for f in hc.HOPPER_FUNCTIONS:
        assert f"{f}: not implemented yet" in stub["cpu_checks"]["error"]
    assert stub["test_small"]["error"] is None and stub["test_small"]["out"].startswith("Skipped")
    print("visible cells, solution:", {g: c["s"] for g, c in sol.items()})


@needs_gxx
def test_visible_cells_name_each_planted_bug(tmp_path):
    """The corpus through the visible cells: the CPU check cell fails naming each planted bug's cause,
    the functions without a bug pass, and no other cell fails."""
    files = {"+".join(c): planted(*c) for c in combos()}
    assert sorted(n for c in combos() for n in c) == sorted(BUGS)
    runs = run_visible(tmp_path, files, processes=2)
    wrong = {}
    for case, cells in runs.items():
        err, out = cells["cpu_checks"]["error"] or "", cells["cpu_checks"]["out"]
        bugged = {BUGS[n][0] for n in case.split("+")}
        problems = []
        for name in case.split("+"):
            f = BUGS[name][0]
            line = next((ln for ln in err.splitlines() if ln.startswith(f + ": ")), "")
            missing = [w for w in BUGS[name][2] if w not in line]
            if missing:
                problems.append(f"{name}: missing {missing} in {line or 'no failure of ' + f}")
        # the others pass; consumer_mainloop calls gemm_qk and gemm_pv, so it waits for them
        skipped = {"consumer_mainloop"} if bugged & {"gemm_qk", "gemm_pv"} else set()
        passed = re.findall(r"^  (\w+) +ok: ", out, re.M)
        if sorted(passed) != sorted(set(hc.HOPPER_FUNCTIONS) - bugged - skipped):
            problems.append(f"passed {passed}, expected all but {sorted(bugged | skipped)}")
        if skipped and not re.search(r"^  consumer_mainloop +not checked: it calls gemm_", out, re.M):
            problems.append("consumer_mainloop is not reported as waiting for the GEMMs")
        others = [g for g, c in cells.items() if c["error"] and g != "cpu_checks"]
        if not err.startswith("HostCheckError") or others:
            problems.append(f"other failing cells {others}: {err or 'no failure'}")
        if problems:
            wrong[case] = "; ".join(problems)
        print(f"{case} ({cells['cpu_checks']['s']} s):\n  " + "\n  ".join(err.splitlines()[1:]))
    assert not wrong, "\n".join(f"{case}: {why}" for case, why in wrong.items())


# ----------------------------------------------------------------------------- the ladder's switches
# v9-v11's, v13's and v14's switches, which the exercise's build leaves off; HFA_LPT_MB 1: sections of 1 MB of K and V, so that
# the first problem's 3 heads (Skv 1024, D 128: 512 KB a head) make two sections, the second one short
SWITCHES = "".join(f"#define {d} 1\n" for d in ("HFA_PREFETCH_Q", "HFA_EARLY_K", "HFA_WIDE_STORES", "HFA_LPT", "HFA_LPT_MB",
                                                "HFA_UNIFORM_WG", "HFA_DESC_ADD"))
SWITCH_PROBLEMS = (
    emu_hopper.Problem("lpt_sections", D=128, B=3, Hq=2, Hkv=1, Sq=300, Skv=1024, causal=True, seed=8),
    emu_hopper.Problem("causal_offset", D=64, B=1, Hq=2, Hkv=1, Sq=200, Skv=520, causal=True, seed=2),
    emu_hopper.Problem("ragged_bf16", D=128, B=1, Hq=1, Hkv=1, Sq=130, Skv=400, causal=False, bf16=True, seed=3, amp=2.0),
)
# a bug planted in each switch's code: (file, text, replacement)
SWITCH_BUGS = {
    "wide_stores_transpose": ("hopper_harness.cuh", "make_uint4(m[0], m[1], m[2], m[3])", "make_uint4(m[1], m[0], m[2], m[3])"),
    "lpt_sections_overlap": ("hopper_common.cuh", "bh = s0 + r % width", "bh = r % width"),
    "early_k_next_slot": ("student_kernel.cu", "mbar_expect_tx(&bars.k_full[slot(it)], L::kKVBytes);",
                          "mbar_expect_tx(&bars.k_full[slot(it + 1)], L::kKVBytes);"),
    "desc_add_v_step": ("student_kernel.cu", "smem_desc_add(dv0, kk * 16 * 128)", "smem_desc_add(dv0, kk * 16 * 64)"),
}


def _switch_build(folder: Path, bug: str | None = None, switches: str = SWITCHES, bugs: dict = SWITCH_BUGS):
    folder.mkdir()
    files = {n: (STEP / n).read_text() for n in GIVEN} | {"student_kernel.cu": switches + SOLUTION}
    files["overlap_tiles.cuh"] = (STEP / "ladder" / "overlap_tiles.cuh").read_text()
    if bug:
        name, old, new = bugs[bug]
        assert files[name].count(old) == 1, (bug, old)
        files[name] = files[name].replace(old, new)
    for n, text in files.items():
        (folder / n).write_text(text)
    return hc.build_host_driver(folder / "student_kernel.cu", timeout=300)


def _switch_failures(build, problems=SWITCH_PROBLEMS) -> list[str]:
    """The problems the build gets wrong (or whose run fails), stopping at the first."""
    from facourse.emu_hopper_gemm import _attention_close, _attention_model
    assert build.ok, build.log[:2000]
    for P in problems:
        run = emu_hopper.run_kernel(build.binary, P, oracle_producer=False, oracle_consumer=False)
        if not run.ok:
            return [f"{P.name}: {run.message[:200]}"]
        (_, q), (_, k), (_, v) = emu_hopper.inputs(P)
        ref_o, ref_lse = _attention_model(P, q, k, v)
        if not _attention_close(P, run.o, run.lse, ref_o, ref_lse).all():
            return [f"{P.name}: wrong rows"]
    return []


@needs_gxx
def test_ladder_switches_compute_the_same_attention(tmp_path):
    """The switches of v9_prefetch_q, v10_wide_stores, v11_lpt_sections, v13_uniform_wg and v14_desc_add, all on at 128-key
    blocks, run the whole kernel on the emulated CTA (which takes every tile, in the scheduler's order) to the model's
    attention; a bug planted in each switch's code fails."""
    assert _switch_failures(_switch_build(tmp_path / "switches")) == []
    for bug in SWITCH_BUGS:
        assert _switch_failures(_switch_build(tmp_path / bug, bug)), f"{bug} passed"


# v12_overlap_tiles: the producer and the consumers' loop of ladder/overlap_tiles.cuh (two Q slots, the next tile's first S
# issued before this tile's epilogue) with v9-v11's switches; and a problem whose first row blocks see no key, so the loop
# writes their O and goes on to the next tile that has keys. A bug planted in each of its parts fails.
OVERLAP = SWITCHES + "#define HFA_OVERLAP_TILES 1\n"
OVERLAP_PROBLEMS = SWITCH_PROBLEMS + (
    emu_hopper.Problem("empty_rows", D=64, B=1, Hq=2, Hkv=1, Sq=300, Skv=130, causal=True, seed=4),)
OVERLAP_BUGS = {
    "next_tile_reads_this_q": ("overlap_tiles.cuh", "gemm_qk<T, D>(s, q_addr(q_round + 1)", "gemm_qk<T, D>(s, q_addr(q_round)"),
    "last_pv_not_waited": ("overlap_tiles.cuh", "    wgmma_wait<1>();  // P V is done", "    // P V is done"),
    "rows_without_keys_unwritten": ("overlap_tiles.cuh", "      epilogue<T, D>(none, p, sched(t), wg);", ""),
    "q_phase_of_the_round": ("overlap_tiles.cuh", "return (r >> 1) & 1;", "return r & 1;"),
}


@needs_gxx
def test_overlap_tiles_computes_the_same_attention(tmp_path):
    assert _switch_failures(_switch_build(tmp_path / "overlap", None, OVERLAP), OVERLAP_PROBLEMS) == []
    for bug in OVERLAP_BUGS:
        build = _switch_build(tmp_path / bug, bug, OVERLAP, OVERLAP_BUGS)
        assert _switch_failures(build, OVERLAP_PROBLEMS), f"{bug} passed"
