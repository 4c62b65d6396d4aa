"""Step 05, Triton FlashAttention-2: the ladder's solution, the exercise, the sm_90 compile.

CPU tier: the solution through the Triton interpreter (in a subprocess, so that TRITON_INTERPRET
is set before triton is imported, whatever other test modules imported first); the exercise's
solution scoring full marks on its correctness cells and its stub 0 (perf cells 0 without a GPU,
without crashing: ``GRADING``, graded by tests/test_exercise_grading.py); both kernels compiled for
sm_90 without a GPU.
GPU tier: full-size correctness in fp16 and bf16, and the perf cells' logic: full points for the
exercise's solution, 0 for a correct but naive kernel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import ROOT, assert_planted_bugs_named, load_module, solution_and_stub

STEP = "05_triton_flash_attention"
LADDER = ROOT / "solutions" / STEP / "ladder"
SOLUTION = __import__("facourse.steps").steps.solution_path(STEP)  # the rung step.toml names
NAMES = ["small", "medium", "large", "noncausal", "asymmetric",
         "ragged", "ragged_noncausal", "decode", "empty_rows", "d64", "mqa", "overflow"]
PERF_CELLS = {"perf_large", "perf_long"}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (sm_80+)")


def _python(code: str, interpret: bool, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _exercise_module(tmp_path: Path):
    """The exercise's solution (setup, kernel and wrapper cells) as an importable module."""
    nb = json.loads((ROOT / "solutions" / STEP / f"{STEP}.ipynb").read_text())
    parts = []
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in ("setup", "kernel", "wrapper"):
            src = "".join(cell["source"])
            parts.append("\n".join(ln for ln in src.splitlines() if "### " not in ln))
    path = tmp_path / "ex05_solution.py"
    path.write_text("\n\n".join(parts) + "\n")
    return load_module(path, "ex05_solution")


# ----------------------------------------------------------------------------- CPU tier
def test_solution_in_interpreter():
    """The ladder's last version passes the check on the CPU profile and every edge case."""
    r = _python(f"""
        import importlib.util, torch
        from facourse import check_entry_point
        spec = importlib.util.spec_from_file_location("sol", {str(SOLUTION)!r})
        sol = importlib.util.module_from_spec(spec); spec.loader.exec_module(sol)
        for name in {NAMES!r}:
            check_entry_point(sol.flash_attention_triton, name, device="cpu", dtype=torch.float32,
                              expect_lse=True, verbose=False)
            print("ok", name, flush=True)
        """, interpret=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("ok ") == len(NAMES)


def test_check_catches_a_wrong_kernel():
    """The test above can fail: a kernel with a top-left causal mask is caught by the same check."""
    r = _python(f"""
        import importlib.util, torch
        from facourse import check_entry_point, AttentionCheckError
        spec = importlib.util.spec_from_file_location("sol", {str(SOLUTION)!r})
        sol = importlib.util.module_from_spec(spec); spec.loader.exec_module(sol)
        def top_left(q, k, v, causal=False, scale=None):   # Sq = Skv - off, with no offset: wrong
            o, lse = sol.flash_attention_triton(q, k[:, :, :q.shape[2]], v[:, :, :q.shape[2]], causal, scale)
            return o, lse
        try:
            check_entry_point(top_left, "ragged", device="cpu", dtype=torch.float32, expect_lse=True)
        except AttentionCheckError:
            print("caught")
        """, interpret=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "caught" in r.stdout


# (the cell, the solution's text, the mistake, the test that loses its points, what its message names)
PLANTED = {"top_left_causal": ("kernel", "off = Skv - Sq ", "off = 0      ", "test_asymmetric", "top-left")}

# the demo's samples: the solution scores every correctness point and 0 for speed on CPU (4 points); the
# stub scores 0; the planted bug loses the tests whose rows it masks wrong
GRADING = solution_and_stub(STEP, 14, PERF_CELLS, 4, PLANTED["top_left_causal"])


def test_planted_bug_loses_the_points_that_name_it(tmp_path):
    """The demo's planted bug (CI grades carol in process: tests/test_exercise_grading.py)."""
    assert_planted_bugs_named(tmp_path, STEP, ("setup",), PLANTED)


def test_compiles_for_sm90_without_gpu():
    """Both kernels (ladder solution, exercise solution) compile to PTX and a cubin for sm_90."""
    r = _python(f"""
        import importlib.util, json
        import triton
        from triton.backends.compiler import GPUTarget

        def compile_fn(fn, dtype="*fp16", switches={{}}):
            names = fn.arg_names
            # the rung's constexpr switches (SWITCHES: EXP2, CAUSAL_SPLIT, DESC of ladder/step05_kernel.py)
            const = dict(GROUP=4, D=128, CAUSAL=True, BLOCK_M=128, BLOCK_N=64, **switches)
            # host-side tensor descriptors (v6, DESC=2): [1, 1, BLOCK, D] tiles of a 4-D [B, H, S, D]
            # tensor, passed as Q, K, V, O
            desc = lambda rows: "tensordesc<%s[1, 1, %d, 128]>" % (dtype[1:], rows)
            host_desc = const.get("DESC") == 2
            sig = {{n: ("constexpr" if n in const else
                       desc(const["BLOCK_M"]) if host_desc and n in ("Q", "O") else
                       desc(const["BLOCK_N"]) if host_desc and n in ("K", "V") else
                       dtype if n in "Q K V O".split() else
                       "*fp32" if n == "LSE" else "fp32" if n == "qk_scale" else "i32") for n in names}}
            # what the launcher specialises: pointers and strides divisible by 16
            attrs = {{(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                     if sig[n] not in ("constexpr", "fp32") and not sig[n].startswith("tensordesc")
                     and n not in ("Hq", "Sq", "Skv")}}
            src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                            constexprs={{(names.index(k),): v for k, v in const.items()}})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8, num_stages=3))
            ptx = k.asm["ptx"]
            return dict(cubin=len(k.asm.get("cubin", b"")), wgmma="wgmma.mma_async" in ptx,
                        tma="cp.async.bulk.tensor" in ptx, cp_async="cp.async" in ptx)

        spec = importlib.util.spec_from_file_location("sol", {str(SOLUTION)!r})
        sol = importlib.util.module_from_spec(spec); spec.loader.exec_module(sol)
        import json as _j
        nb = _j.load(open({str(ROOT / "solutions" / STEP / (STEP + ".ipynb"))!r}))
        src = "\\n\\n".join("\\n".join(l for l in "".join(c["source"]).splitlines() if "### " not in l)
                           for c in nb["cells"] if c["metadata"].get("nbgrader", {{}}).get("grade_id")
                           in ("kernel", "wrapper"))
        head = "import math, torch, triton\\nimport triton.language as tl\\nfrom facourse import validate_inputs\\nINTERPRET = False\\n"
        path = {str(Path("/tmp") / "_ex05_compile.py")!r}
        open(path, "w").write(head + src)
        spec = importlib.util.spec_from_file_location("ex05", path)
        ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)
        sw = dict(sol.SWITCHES)
        print(json.dumps(dict(solution=compile_fn(sol.attn_fwd, switches=sw),
                              solution_bf16=compile_fn(sol.attn_fwd, "*bf16", switches=sw),
                              exercise=compile_fn(ex.attn_fwd))))
        """, interpret=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name, info in got.items():
        assert info["cubin"] > 0 and info["wgmma"], (name, info)     # Hopper's tensor-core path
    assert got["solution"]["tma"], got                              # v5, v6 load through TMA
    assert got["exercise"]["cp_async"], got                         # pipelined pointer loads


# ----------------------------------------------------------------------------- GPU tier
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_full_size(dtype):
    from facourse import check_entry_point
    sol = load_module(SOLUTION, "sol_gpu")
    for name in NAMES:
        check_entry_point(sol.flash_attention_triton, name, dtype=dtype, expect_lse=True, verbose=False)


@pytest.mark.gpu
@gpu
def test_gpu_perf_cells(tmp_path):
    """Through the judge: the exercise's solution earns all its perf points, a naive kernel none."""
    from autograder.judge import run_inprocess
    ex = _exercise_module(tmp_path)
    v = run_inprocess(STEP, ex.flash_attention_triton, sorted(PERF_CELLS))
    assert all(x.points == 2 for x in v.values()), {t: (x.points, x.message) for t, x in v.items()}
    # correct but naive: 16 x 16 tiles, one warp, every key tile visited (masked) even when causal
    naive = load_module(LADDER / "v2_online_softmax.py", "naive_v2")
    naive.CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16}
    naive.LAUNCH = {"num_warps": 1, "num_stages": 1}
    v = run_inprocess(STEP, naive.flash_attention_triton, ["test_medium", "perf_large"])
    assert v["test_medium"].passed, v["test_medium"].message
    assert v["perf_large"].points == 0 and "0 of 2 points" in v["perf_large"].output[-1], v["perf_large"]
