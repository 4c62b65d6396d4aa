"""Step 07 (Hopper FlashAttention, sm_90a), CPU tier and GPU tier.

CPU tier: nvcc compiles every ladder rung, the exercise solution and the stub for sm_90a with no
spills; the SASS of the solution has HGMMA and UTMALDG, step 06's kernel and the stub have neither
(the hidden structural check, facourse.cuda_build.check_sass, is the one function tested here); the
stub is the one make_stub.py writes; the release ships the stub, the given headers and the binding,
never the ladder or the solution; grading on a CPU gives the solution the structural check's points
and the stub nothing, with the GPU cells at 0 and saying why, the compile check listing the stub's
functions as not implemented and the CPU check passing the solution's (``GRADING``, graded by
tests/test_exercise_grading.py in one autograde run with the other steps').
tests/test_hopper_step07_cpu.py: the CPU check (facourse.cuda_host_check) and the planted bugs.
GPU tier (marked gpu, H100/H200 only): every rung and the solution on the five configurations and
the edge cases, fp16 and bf16.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import ROOT, Files, release_notebook
from facourse.cuda_build import (HOPPER_OPCODES, SassCheckError, check_sass, count_opcodes, find_cuobjdump,
                                 nvcc_compile_check)
from facourse.hw import has_nvcc
from facourse.steps import load_step

ASSIGNMENT = "07_hopper_flash_attention"
STEP = ROOT / "solutions" / ASSIGNMENT
LADDER = STEP / "ladder"
STEP06 = ROOT / "solutions" / "06_cuda_flash_attention"
RELEASE = ROOT / "exercises" / ASSIGNMENT
HAVE_NVCC = has_nvcc()
HAVE_SASS = HAVE_NVCC and find_cuobjdump() is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")
needs_sass = pytest.mark.skipif(not HAVE_SASS, reason="nvcc or cuobjdump is not installed "
                                "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")

LADDER_FILES = sorted(p.name for p in LADDER.glob("v*.cu"))
KERNELS = [LADDER / n for n in LADDER_FILES] + [LADDER / "student_kernel_solution.cu", STEP / "student_kernel.cu"]
GPU_CELLS = {"test_small", "test_medium", "test_large", "test_noncausal", "test_asymmetric", "test_edge_ragged",
             "test_edge_empty_rows", "test_edge_other", "test_bf16", "perf_large", "perf_long"}
PERF_CELLS = {"perf_large", "perf_long"}


# ============================================================================ nvcc, SASS
@needs_nvcc
def test_every_kernel_compiles_for_sm90a_without_spills():
    """The ladder's solution, the exercise's solution and the stub: all four instances (fp16/bf16 x D 64/128); the
    other rungs, timed in fp16 at D 128 only: that instance (HFA_FP16_D128_ONLY, about half the CPU time). Each with
    0 bytes spilled and no C75xx note (ptxas serialising WGMMAs or inserting its own waits). The rungs' device code
    alone: their host code is the solution's harness, compiled with the solution and the stub."""
    every_instance = {load_step("07")["ladder"]["solution"] + ".cu", "student_kernel_solution.cu", "student_kernel.cu"}

    def compile_one(path):
        return path.name, nvcc_compile_check(path, "sm_90a", include_dirs=[LADDER, STEP], verbose=False,
                                             host=path.name.startswith("student_kernel"),
                                             extra=() if path.name in every_instance else ("-DHFA_FP16_D128_ONLY",))

    assert len(LADDER_FILES) >= 4 and every_instance <= {p.name for p in KERNELS}, LADDER_FILES
    with ThreadPoolExecutor(4) as pool:
        reports = dict(pool.map(compile_one, KERNELS))
    for name, rep in reports.items():
        assert rep.ok, f"{name}: {rep.summary()}"
        instances = 4 if name in every_instance else 1
        assert len(rep.kernels) == instances and all(k.registers > 0 for k in rep.kernels), f"{name}: {rep.log}"
        assert rep.spills == 0 and "0 bytes spill stores, 0 bytes spill loads" in rep.log, f"{name}: {rep.summary()}"
        assert " spill" not in rep.log.replace("0 bytes spill", ""), f"{name}: {rep.log}"
        assert not rep.wgmma_notes, f"{name}: {rep.summary()}"


def test_count_opcodes_reads_cuobjdump_lines():
    sass = """
        /*0230*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT ;   /* 0x00e0... */
                                                                                     /* 0x000fe2... */
        /*0240*/               @P0 UTMALDG.4D [UR8], [UR14] ;
        /*0250*/              @!UP1 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+URZ], R3 ;
        /*0260*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;
    """
    assert count_opcodes(sass) == {"HGMMA": 2, "UTMALDG": 1, "SYNCS": 1}


@needs_sass
def test_structural_check_passes_hopper_and_fails_step06(capsys):
    """The hidden structural check: HGMMA + UTMALDG in the solution's SASS; step 06's kernel (mma.sync,
    cp.async) compiled for sm_90a and the untouched stub fail it, and the message names what is missing."""
    counts = check_sass(LADDER / "student_kernel_solution.cu", include_dirs=[STEP])
    assert all(counts[op] > 0 for op in HOPPER_OPCODES) and counts["SYNCS"] > 0
    assert counts["HMMA"] == 0 and counts["LDGSTS"] == 0
    assert "HGMMA" in capsys.readouterr().out
    with pytest.raises(SassCheckError) as err:
        check_sass(STEP06 / "ladder" / "student_kernel_solution.cu", include_dirs=[STEP06 / "ladder", STEP06])
    msg = str(err.value)
    assert "no HGMMA" in msg and "no UTMALDG" in msg and "HMMA x" in msg and "LDGSTS x" in msg, msg
    with pytest.raises(SassCheckError, match="no HGMMA"):
        check_sass(STEP / "student_kernel.cu", include_dirs=[STEP], verbose=False)


@needs_sass
def test_the_sass_after_a_compile_check_is_read_from_its_object(tmp_path, monkeypatch):
    """The notebook compiles the student's file (nvcc_compile_check) and then reads its SASS (check_sass): the
    second reads the object the first made from the same files for the same target, instead of compiling again,
    and counts what a compile of its own counts; a changed header is compiled again."""
    import facourse.cuda_build as cb

    (tmp_path / "scale.cuh").write_text("#define SCALE 3.0f\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "scale.cuh"\n__global__ void k(float* x) { x[threadIdx.x] *= SCALE; }\n')
    fresh = cb.sass_opcodes(src, include_dirs=[tmp_path])
    cb._MADE.clear()
    assert cb.nvcc_compile_check(src, "sm_90a", include_dirs=[tmp_path], verbose=False).ok
    runs = []
    real = subprocess.run
    monkeypatch.setattr(cb.subprocess, "run", lambda cmd, *a, **kw: runs.append(cmd[0]) or real(cmd, *a, **kw))
    assert cb.sass_opcodes(src, include_dirs=[tmp_path]) == fresh and fresh["FMUL"] > 0
    assert runs == [cb.find_cuobjdump()], runs
    (tmp_path / "scale.cuh").write_text("#define SCALE 3.0f + x[0]\n")
    cb.sass_opcodes(src, include_dirs=[tmp_path])
    assert any("nvcc" in r for r in runs[1:]), runs


# ============================================================================ stub, release
def test_stub_is_generated_from_solution_and_in_sync():
    r = subprocess.run([sys.executable, str(LADDER / "make_stub.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    stub, sol = (STEP / "student_kernel.cu").read_text(), (LADDER / "student_kernel_solution.cu").read_text()
    assert "BEGIN SOLUTION" not in stub and "END SOLUTION" not in stub
    assert stub.count("YOUR CODE HERE") == sol.count("BEGIN SOLUTION") == 4
    for fn in ("producer", "gemm_qk", "gemm_pv", "consumer_mainloop"):
        assert f" {fn}(" in stub, fn
    for rung in LADDER_FILES:
        assert '#include "student_kernel_solution.cu"' in (LADDER / rung).read_text(), rung


def test_binding_is_step06s():
    """The C ABI and the torch binding are step 06's, kept once: step 07's folder links to them, and the
    release (which copies what a link points to) ships them in both exercises' folders."""
    for name in ("fa_params.h", "fa_binding.cpp"):
        assert (STEP / name).is_symlink() and (STEP / name).resolve() == (STEP06 / name).resolve(), name
        assert (RELEASE / name).read_bytes() == (STEP06 / name).read_bytes(), f"{name}: the release's is stale"


def test_release_ships_stub_not_solution():
    assert (RELEASE / "student_kernel.cu").read_text() == (STEP / "student_kernel.cu").read_text()
    for name in ("hopper_primitives.cuh", "hopper_common.cuh", "hopper_harness.cuh", "fa_params.h", "fa_binding.cpp"):
        assert (RELEASE / name).read_bytes() == (STEP / name).read_bytes(), f"{name} missing or stale in the release"
    shipped = sorted(p.name for p in RELEASE.rglob("*"))
    assert shipped == sorted(["07_hopper_flash_attention.ipynb", "student_kernel.cu", "hopper_primitives.cuh",
                              "hopper_common.cuh", "hopper_harness.cuh", "fa_params.h", "fa_binding.cpp"]), shipped
    for path in RELEASE.iterdir():
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, path.name
    assert "wgmma_ss_n128<T>(s, da, db" not in (RELEASE / "student_kernel.cu").read_text()


def test_release_notebook_builds_the_student_file_for_sm90a():
    nb = release_notebook(ASSIGNMENT)
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "def flash_attention_hopper(q, k, v, causal=False, scale=None)" in code
    assert 'STUDENT_SOURCE, KERNEL_DIR / "fa_binding.cpp"' in code and 'arch="sm_90a"' in code
    graded = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"] for c in nb["cells"]
              if c["metadata"].get("nbgrader", {}).get("grade")}
    assert graded.keys() == GPU_CELLS | {"test_structure"} and sum(graded.values()) == 15, graded


# ============================================================================ grading
def grading_submissions():
    """Graded by tests/test_exercise_grading.py, in one autograde run with the other steps': the
    released notebook with the solution kernel or the stub as the student's student_kernel.cu."""
    release = release_notebook(ASSIGNMENT)
    return {student: Files({f"{ASSIGNMENT}.ipynb": release, "student_kernel.cu": kernel})
            for student, kernel in (("solved", LADDER / "student_kernel_solution.cu"),
                                    ("stub", STEP / "student_kernel.cu"))}


def check_grading(results, workspace):
    """On a CPU: the solution kernel earns the structural check's 2 points (when nvcc and cuobjdump are
    here) and nothing else; the stub earns 0. GPU cells score 0 and say why; the visible test and the
    perf cells without an error; the compile-feedback cell reports the SASS; the student's .cu is the
    one graded (autograde does not put the stub back over it)."""
    sol, stub = results["solved"], results["stub"]
    assert sol.status == "graded" and stub.status == "graded", (sol, stub)
    assert sol.auto_max_score == stub.auto_max_score == 15
    structure = 2 if HAVE_SASS else 0
    assert sol.score == structure, (sol.score, sol.failed, sol.messages)
    assert set(sol.failed) == GPU_CELLS | ({"test_structure"} if not HAVE_SASS else set()), sol.failed
    assert stub.score == 0, (stub.score, stub.failed)
    assert "test_structure" in stub.failed
    if HAVE_SASS:
        assert "SassCheckError" in stub.messages["test_structure"] and "HGMMA" in stub.messages["test_structure"]
    if not torch.cuda.is_available():
        # the judge scores every GPU cell 0 and says why
        assert all("No GPU here" in sol.messages[c] for c in GPU_CELLS), sol.messages
    def outputs(student):
        nb = json.loads(next((workspace / "autograded" / student / ASSIGNMENT).glob("*.ipynb")).read_text())
        return nb, {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(
            "".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
            for c in nb["cells"]}

    nb, out = outputs("solved")
    _, stub_out = outputs("stub")
    # the compile check lists the stub's functions as not implemented; the CPU check passes the solution's
    # four functions and reports the stub's as not implemented (where g++ is here)
    assert "Not implemented yet (4 of 4): producer, gemm_qk, gemm_pv, consumer_mainloop" in stub_out["compile_check"]
    assert "Not implemented yet" not in out["compile_check"]
    if shutil.which("g++"):
        assert out["cpu_checks"].count(" ok: ") == 4 and "What only an H100/H200 checks" in out["cpu_checks"]
        assert stub_out["cpu_checks"].count("not implemented yet") == 4, stub_out["cpu_checks"]
    if HAVE_NVCC:
        assert "nvcc OK for sm_90a" in out["compile_check"], out["compile_check"]
    if HAVE_SASS:
        assert "HGMMA" in out["compile_check"] and "structural check will pass" in out["compile_check"]
    if not torch.cuda.is_available():
        assert "Skipped, 0 points on this machine" in out["test_small"]
    # a graded cell's value is its partial credit: the structural check must not end with one
    (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_structure"]
    assert not [o for o in cell["outputs"] if o["output_type"] == "execute_result"], cell["outputs"]


GRADING = {ASSIGNMENT: (grading_submissions, check_grading)}


# ============================================================================ GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("version", [p.removesuffix(".cu") for p in LADDER_FILES])
def test_gpu_correct_on_configs_and_edge_cases(version):
    from facourse import check_all, has_sm90a
    if not has_sm90a():
        pytest.skip("step 07 runs on an H100/H200 (sm_90a) only")
    from benchmarks.rungs import entry_point
    check_all(entry_point("07", version), dtypes=(torch.float16, torch.bfloat16), expect_lse=True)
