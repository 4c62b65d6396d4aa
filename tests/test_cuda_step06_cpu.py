"""Step 06 on a CPU (issue 20): what a student without a GPU sees.

* nvcc's error count (its closing "N errors detected" line is no error of its own);
* the stub's marker: a function whose body is still the stub is reported as not implemented, and
  no longer once written;
* the CPU check (facourse.cuda_host_check): the solution's four device functions pass it; planted
  bugs fail it with a message naming the cause;
* the notebook's visible cells as a student's Run All runs them, in a subprocess: the solution passes
  (the CPU check well under 30 s), the stub is reported as not implemented, the GPU test prints one
  sentence and does not stop the run, and each bug of the corpus fails the CPU check cell naming its
  cause.

Needs g++ (and nvcc for the compile check); each test that needs one says so when it is absent.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_cuda_visible

ROOT = Path(__file__).resolve().parent.parent
STEP = ROOT / "solutions" / "06_cuda_flash_attention"
LADDER = STEP / "ladder"
SOLUTION = (LADDER / "student_kernel_solution.cu").read_text()
STUB = (STEP / "student_kernel.cu").read_text()

from facourse import cuda_host_check as hc  # noqa: E402
from facourse.cuda_build import nvcc_compile_check, nvcc_errors  # noqa: E402
from facourse.emu_build import EMU, defined_names, split_header  # noqa: E402

GIVEN = ("fa_harness.cuh", "fa_primitives.cuh", "fa_params.h", "fa_binding.cpp")

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed: the CPU check builds with it")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

# ----------------------------------------------------------------------------- the planted bugs
# name -> (substitutions in the solution, words the CPU check's failure must contain)
BUGS = {
    "no_alpha_rescale": ([("if (!Rescale::kLazy || __any_sync", "if (false && __any_sync"),
                          ("l_i[r] = alpha[r] * l_i[r] + row_sum;", "l_i[r] = l_i[r] + row_sum;")],
                         ["online_softmax_update", "no alpha rescale", "l and O"]),
    "no_alpha_rescale_of_o": ([("if (!Rescale::kLazy || __any_sync", "if (false && __any_sync")],
                              ["online_softmax_update", "no alpha rescale of O"]),
    "no_inf_guard": ([("const float m_use = fa::finite_max(m_new);", "const float m_use = m_new;")],
                     ["online_softmax_update", "NaN", "no -inf guard", "all masked"]),
    "no_scale": ([("quad_max(row_max) * scale_log2", "quad_max(row_max)"),
                  ("fmaf(s[n][2 * r], scale_log2, -m_use)", "s[n][2 * r] - m_use"),
                  ("fmaf(s[n][2 * r + 1], scale_log2, -m_use)", "s[n][2 * r + 1] - m_use")],
                 ["online_softmax_update", "the scale is missing"]),
    "no_quad_reduction": ([("quad_max(row_max)", "row_max")],
                          ["online_softmax_update", "wrong quad reduction", "quad_max"]),
    "load_no_zero_fill": ([("cp_async_16(smem_addr(smem + swizzle<D>(r, c)), src, valid);",
                            "if (valid) cp_async_16(smem_addr(smem + swizzle<D>(r, c)), src, valid);")],
                          ["load_tile_async", "rows_valid", "not zero-filled"]),
    "qk_no_swizzle": ([("ldmatrix_x4(b, smem_addr(sK + swizzle<D>(row, col)));",
                        "ldmatrix_x4(b, smem_addr(sK + row * D + col));")],
                      ["qk_tile", "without the swizzle"]),
    "pv_overwrites_o": ([("for (int kk = 0; kk < BLOCK_N / 16; ++kk) {\n    uint32_t a[4];",
                          "for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;\n"
                          "  for (int kk = 0; kk < BLOCK_N / 16; ++kk) {\n    uint32_t a[4];")],
                        ["pv_tile", "overwritten", "accumulate"]),
}


def planted(name: str) -> str:
    code = SOLUTION
    for old, new in BUGS[name][0]:
        assert old in code, f"planted bug {name} out of date: {old!r} is not in the solution"
        code = code.replace(old, new)
    return code


# ----------------------------------------------------------------------------- nvcc's error count
NVCC_LOG = """\
a.cu(1): error: operand of "*" must be a pointer but has type "int"
  __attribute__((global)) void k(float* x){ x[0] = +* 1; int error = ; }
                                                      ^

a.cu(1): error: expected an expression
  __attribute__((global)) void k(float* x){ x[0] = +* 1; int error = ; }
                                                                 ^

2 errors detected in the compilation of "a.cu".
"""


def test_nvcc_errors_are_counted_without_the_summary_line():
    errs = nvcc_errors(NVCC_LOG)
    assert len(errs) == 2 and all(e.startswith("a.cu(1): error:") for e in errs), errs
    assert nvcc_errors("1 error detected in the compilation of \"b.cu\".\n") == []
    assert nvcc_errors("nvcc fatal   : Unsupported gpu architecture 'compute_10'\n") == [
        "nvcc fatal   : Unsupported gpu architecture 'compute_10'"]
    assert len(nvcc_errors("ptxas error   : Entry function 'k' uses too much shared data\n")) == 1


@needs_nvcc
def test_nvcc_error_count_matches_nvcc(tmp_path):
    src = tmp_path / "two_errors.cu"
    src.write_text("__global__ void k(float* x) { x[0] = +* 1; int y = ; }\n")
    rep = nvcc_compile_check(src, "sm_80", verbose=False)
    assert not rep.ok and "2 errors detected" in rep.log
    assert rep.summary().splitlines()[0] == "nvcc FAILED for sm_80: 2 error(s)", rep.summary()


# ----------------------------------------------------------------------------- the stub's marker
def test_stub_functions_are_reported_not_implemented_until_written():
    assert hc.unwritten_functions(STUB) == list(hc.FUNCTIONS)
    assert hc.unwritten_functions(SOLUTION) == []
    assert 'define FA_TODO(name)' in (STEP / "fa_primitives.cuh").read_text()
    # a student who wrote online_softmax_update (its solution body in place of the stub's)
    body = re.search(r"online_softmax_update\(.*?// BEGIN SOLUTION\n(.*?)  // END SOLUTION", SOLUTION, re.S)[1]
    one = re.sub(r'  // YOUR CODE HERE \(about 24 lines\)\n  FA_TODO\("online_softmax_update"\);[^\n]*\n[^\n]*\n',
                 lambda _: body, STUB)
    assert one != STUB
    assert hc.unwritten_functions(one) == ["load_tile_async", "qk_tile", "pv_tile"]
    # the marker in a comment does not count
    assert hc.unwritten_functions('// FA_TODO("qk_tile");\n/* FA_TODO("pv_tile") */\n') == []


# ----------------------------------------------------------------------------- the CPU check in-process
def student_folder(tmp_path: Path, code: str) -> Path:
    """``code`` as student_kernel.cu in a folder with the exercise's given files, as a student has it."""
    for f in GIVEN:
        shutil.copy(STEP / f, tmp_path / f)
    (tmp_path / "student_kernel.cu").write_text(code)
    return tmp_path / "student_kernel.cu"


def test_the_emulator_stands_in_for_the_instructions_only():
    """The CPU check compiles fa_primitives.cuh itself: the emulator (emu/emu_sm80.h) defines every
    instruction the header leaves out under FA_CPU_EMULATION, and restates nothing the header keeps."""
    emulated, kept = split_header((STEP / "fa_primitives.cuh").read_text())
    assert {"cp_async_16", "ldmatrix_x4", "ldmatrix_x4_trans", "Mma", "exp2_approx"} <= emulated, emulated
    assert {"smem_addr", "mma_16816", "pack2", "quad_max", "quad_sum", "swizzle", "finite_max"} <= kept, kept
    emu = defined_names((EMU / "emu_sm80.h").read_text() + (EMU / "emu_warp.h").read_text())
    assert not emulated - emu, f"the emulator lacks {sorted(emulated - emu)}"
    assert not kept & emu, f"the emulator restates {sorted(kept & emu)} of fa_primitives.cuh"


def test_c_fragment_layout_matches_the_course():
    sys.path.insert(0, str(ROOT / "diagrams"))
    import fragments as fr
    assert all(hc.c_coords(L, i) == fr.c_coords(L, i) for L in range(32) for i in range(4))


@needs_gxx
def test_solution_passes_the_cpu_check(capsys):
    rep = hc.check_device_functions(LADDER / "student_kernel_solution.cu")
    assert rep.ok and [r.status for r in rep.results] == ["pass"] * 4, rep.results
    out = capsys.readouterr().out
    assert "What only a GPU checks" in out and "FAILED" not in out


@needs_gxx
def test_stub_fails_the_cpu_check_as_not_implemented(tmp_path):
    with pytest.raises(hc.HostCheckError, match="not implemented yet") as err:
        hc.check_device_functions(student_folder(tmp_path, STUB), verbose=False)
    for f in hc.FUNCTIONS:
        assert f"{f}: not implemented yet" in str(err.value)


@needs_gxx
def test_a_marker_left_in_a_written_function_does_not_fail_it(tmp_path):
    code = SOLUTION.replace("  // BEGIN SOLUTION\n  float alpha[2];", '  FA_TODO("online_softmax_update");\n  float alpha[2];')
    assert code != SOLUTION
    rep = hc.check_device_functions(student_folder(tmp_path, code), verbose=False)
    (res,) = [r for r in rep.results if r.name == "online_softmax_update"]
    assert res.status == "pass" and "delete that line" in res.message


@needs_gxx
def test_a_file_g_plus_plus_cannot_build_is_not_checked_and_not_failed(tmp_path, capsys):
    """Inline PTX of the student's own (the stand-in has no PTX): the CPU check says so and checks nothing."""
    code = SOLUTION.replace("    const float m_use = fa::finite_max(m_new);",
                            '    float m_use;\n    asm("mov.f32 %0, %1;" : "=f"(m_use) : "f"(fa::finite_max(m_new)));')
    assert code != SOLUTION
    rep = hc.check_device_functions(student_folder(tmp_path, code))
    out = capsys.readouterr().out
    assert not rep.build.ok and {r.status for r in rep.results} == {"skipped"}, rep.results
    assert "not checked: g++ could not compile your file" in out and "What only a GPU checks" in out
    # g++'s error names the student's own file and line, not a copy of it
    line = code[:code.index('asm("mov.f32')].count("\n") + 1
    assert f"{tmp_path / 'student_kernel.cu'}:{line}:" in out, out


# ----------------------------------------------------------------------------- the visible cells
def run_visible(tmp_path, kernels: dict[str, str], skip=()) -> dict[str, dict]:
    return run_cuda_visible(tmp_path, STEP, "06_cuda_flash_attention.ipynb", GIVEN, kernels, skip)


@pytest.mark.slow
@needs_gxx
@needs_nvcc
def test_visible_cells_on_cpu_solution_and_stub(tmp_path):
    runs = run_visible(tmp_path, {"solution": SOLUTION, "stub": STUB})
    sol, stub = runs["solution"], runs["stub"]
    # the solution: every visible cell runs; the compile check ends with its success line; the CPU check
    # passes all four functions well under 30 s (its first build, g++ included)
    assert all(c["error"] is None for c in sol.values()), {g: c["error"] for g, c in sol.items()}
    assert "nvcc OK for sm_80" in sol["compile_check"]["out"] and "Compiles without spills" in sol["compile_check"]["out"]
    assert "Not implemented" not in sol["compile_check"]["out"]
    assert sol["cpu_checks"]["out"].count(" ok: ") == 4 and "What only a GPU checks" in sol["cpu_checks"]["out"]
    # the work, in CPU seconds (its own and g++'s): the wall time moves with the suite's load beside it
    # (30.8 s once in CI, for about 14 s of CPU on an idle machine)
    assert sol["cpu_checks"]["cpu"] < 30, (sol["cpu_checks"]["cpu"], sol["cpu_checks"]["s"])
    # the visible cells (set-up cells aside, as in test_visible_feedback.py): nvcc and g++ side by side,
    # 11-15 s measured on 2 cores under a load of 5; the bound leaves room for nvcc on a busier machine
    visible = sum(sol[g]["s"] for g in ("compile_check", "cpu_checks", "test_small"))
    assert visible < 45, {g: c["s"] for g, c in sol.items()}
    # the GPU test says so in one sentence and does not stop Run All
    assert sol["test_small"]["out"].startswith("Skipped: this test (your kernel on the configuration `small`) needs "
                                               "an NVIDIA GPU"), sol["test_small"]["out"]
    assert sol["test_small"]["out"].count("\n") == 1
    # the stub: compiles, every function reported as not implemented, no success line
    cc = stub["compile_check"]
    assert cc["error"] is None and "nvcc OK for sm_80" in cc["out"], cc
    assert "Not implemented yet (4 of 4): load_tile_async, qk_tile, online_softmax_update, pv_tile" in cc["out"], cc
    assert "Compiles without spills" not in cc["out"]
    assert stub["cpu_checks"]["error"].startswith("HostCheckError"), stub["cpu_checks"]
    assert stub["cpu_checks"]["out"].count("not implemented yet") == 4, stub["cpu_checks"]["out"]
    assert stub["test_small"]["error"] is None and stub["test_small"]["out"].startswith("Skipped:")
    print("visible cells, solution:", {g: c["s"] for g, c in sol.items()})


@pytest.mark.slow
@needs_gxx
def test_visible_cells_name_each_planted_bug(tmp_path):
    """The corpus through the visible cells (nvcc's compile check left out: each bug compiles, and its
    report is the solution's); the CPU check cell fails naming the cause, and only that cell fails."""
    runs = run_visible(tmp_path, {name: planted(name) for name in BUGS}, skip=("compile_check",))
    wrong = {}
    for name, cells in runs.items():
        err = cells["cpu_checks"]["error"] or ""
        missing = [w for w in BUGS[name][1] if w not in err]
        others = [g for g, c in cells.items() if c["error"] and g != "cpu_checks"]
        if not err.startswith("HostCheckError") or missing or others:
            wrong[name] = f"missing {missing}, other failing cells {others}: {err or 'no failure'}"
        print(f"{name}: {err}")
    assert not wrong, "\n".join(f"{name}: {why}" for name, why in wrong.items())
