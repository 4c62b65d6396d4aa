"""Step 13's slow ladder (solutions/13_profiling/ladder: the slow kernel of "a slow kernel made fast" and one
defect removed a rung), on the CPU: each rung is correct in Triton's interpreter, and its compile-time facts for
an H100 / H200 (Triton's compiler for sm_90, cuobjdump on the cubin; no GPU) are the ones its header names:
TF32 dots only in v0, spills in v0 and v1 and none after, shared memory within sm_90's limit and, for the rungs
that fix the tiles, within sm_80's. The method is checked first against the GPU: step 05's v2 and v3 compiled
here have the registers and shared memory Nsight Compute reported for them on an H200 (course/results/measured.json).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, computed_once, this_run
from facourse.cuda_build import find_cuobjdump

RUNGS = ("v0_slow", "v1_fp16_dots", "v2_eight_warps", "v3_pipelined", "v4_causal_split", "v5_two_programs")
SM90_SMEM, SM80_SMEM = 227 * 1024, 163 * 1024          # the per-block opt-in limits (tests/test_triton_targets.py)

_DRIVER = r"""
import json, os, re, sys
from pathlib import Path
os.environ["TRITON_INTERPRET"] = "0"                   # compiled, not interpreted
root = sys.argv[1]
sys.path[:0] = [os.path.join(root, "src"), root]
from benchmarks.rungs import load_py
from facourse.cuda_build import cubin_usage
from facourse.triton_setup import compile_for

def facts(path):
    mod = load_py(path)
    fa = mod.fa
    types = {n: "*fp16" for n in ("Q", "K", "V", "O")} | {"LSE": "*fp32", "qk_scale": "fp32"}
    # what a launch on `large` specialises: strides, lengths and heads all multiples of 16
    div = tuple(n for n in fa.attn_fwd.arg_names if re.fullmatch(r"s[a-z]{2}", n)) + ("Sq", "Skv", "Hq")
    const = dict(GROUP=4, D=128, CAUSAL=True, **mod.SWITCHES, **mod.CONFIG)
    k = compile_for(fa.attn_fwd, types, const, 90, divisible=div, **mod.LAUNCH)
    use = cubin_usage(k.asm["cubin"])
    return dict(registers=use["REG"], stack=use["STACK"], shared=k.metadata.shared, tf32="tf32" in k.asm["ptx"],
                wgmma="wgmma.mma_async" in k.asm["ptx"])

out = {name: facts(Path(root, "solutions", d, "ladder", name + ".py"))
       for d, name in json.loads(sys.argv[2])}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def facts():
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (the CUDA toolkit or the nvidia-cuda-cuobjdump wheel)")
    files = [("05_triton_flash_attention", "v2_online_softmax"), ("05_triton_flash_attention", "v3_causal_split"),
             *(("13_profiling", r) for r in RUNGS)]

    def compute():
        r = subprocess.run([sys.executable, "-c", _DRIVER, str(ROOT), json.dumps(files)], capture_output=True,
                           text=True, timeout=900, env={**os.environ, "PYTHONPATH": ""})
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])
    return computed_once(f"step13 ladder facts {this_run()}", compute)


def test_compiled_here_as_ncu_measured_on_a_gpu(facts):
    ncu = json.loads((ROOT / "course" / "results" / "measured.json").read_text())["13_ncu"]
    seen = {k["rung"]: k for k in ncu["kernels"] if k["step"] == "05"}
    for rung in ("v2_online_softmax", "v3_causal_split"):
        got, gpu = facts[rung], seen[rung]
        assert (got["registers"], got["shared"]) == (gpu["launch__registers_per_thread"],
                                                    gpu["launch__shared_mem_per_block_dynamic"]), (rung, got)


def test_each_rung_removes_its_defect(facts):
    f = [facts[r] for r in RUNGS]
    assert [x["tf32"] for x in f] == [True, False, False, False, False, False], f
    assert f[0]["stack"] > 0 and f[1]["stack"] > 0, "128 x 128 tiles on 4 warps spill (to the stack)"
    assert [x["stack"] for x in f[2:]] == [0, 0, 0, 0], f
    assert all(x["wgmma"] for x in f), "every rung runs its dots on Hopper's tensor cores"
    assert all(x["shared"] <= SM90_SMEM for x in f), f
    assert all(x["shared"] <= SM80_SMEM for x in f[3:]), "the solution's tiles fit an A100 too"
    one, two = f[4], f[5]                  # v4 holds an SM alone; v5 fits two programs of 4 warps an SM
    assert 2 * (two["shared"] + 1024) <= SM90_SMEM + 1024 < 2 * (one["shared"] + 1024), (one, two)
    assert 2 * 128 * two["registers"] <= 65536 < 2 * 256 * one["registers"], (one, two)


@pytest.mark.parametrize("rung", ["v0_slow", "v5_two_programs"])
def test_rung_is_correct_in_the_interpreter(rung):
    from benchmarks.rungs import entry_point
    from facourse import check_entry_point
    fn = entry_point("13", rung)
    for case in ("small", "ragged", "empty_rows"):
        check_entry_point(fn, case, expect_lse=True, verbose=False)
