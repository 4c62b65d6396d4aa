"""Step 10's rung v9_gluon_fp8: v7's FP8 attention with FlashAttention-3's intra-warpgroup overlap, in Gluon.

CPU tier (Gluon has no interpreter; Triton's compiler and cuobjdump need no GPU): the kernel compiles for sm_90a,
fp16 and bf16 out, D 64 and 128, causal and not, without spilling and in shared memory for two programs an SM; its
key loop issues Q K^T, then P V, then waits with one group in flight before the softmax (the overlap), where v7's
Triton loop with S issued a tile ahead (AHEAD_S) still waits for everything right after the Q K^T; P reaches the P V
operand as a renaming of registers (no byte shuffles in the unmasked loop); v7's AHEAD_S loop computes what its
own loop does (Triton's interpreter). The entry points refuse a CPU tensor.
The GPU checks are the runner's (benchmarks.ladder 10 --only v9_gluon_fp8: the FP8 kind's checks) and
benchmarks/probes/fp8_gluon.py (against v7 on the same quantised inputs).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_module

ROOT = Path(__file__).resolve().parent.parent
LADDER = ROOT / "solutions" / "10_attention_variants" / "ladder"

COMPILE = r"""
import json, os, subprocess, sys, tempfile
os.environ["TRITON_INTERPRET"] = "0"            # the GPU path (no interpreter for Gluon)
sys.path[:0] = [sys.argv[1], "benchmarks/probes"]
import v7_fp8_fa3 as v7
import v9_gluon_fp8 as v9
from facourse.cuda_build import find_cuobjdump
from facourse.triton_setup import compile_for
from sass_loops import kernels, loops, opcode

def sass_of(kernel):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        run = lambda flag: subprocess.run([find_cuobjdump(), flag, f.name], capture_output=True, text=True,
                                          check=True).stdout
        return run("--dump-resource-usage"), run("--dump-sass")

def loop_of(sass):
    (ins,) = kernels(sass).values()
    s, e = max((se for se in loops(ins) if ins[se[1]][1].startswith("@")), key=lambda se: se[1] - se[0])
    return [t for _, t in ins[s:e + 1]]

def waits(loop):
    # the order of the loop's WGMMA issues and waits: "S" (Q K^T: B from shared memory), "PV" (A in registers)
    out = []
    for t in loop:
        if opcode(t) == "QGMMA" and "gsb0" in t:
            out.append("PV" if ", R" in t.split("gdesc")[0] else "S")
        elif "WARPGROUP.DEPBAR" in t:
            out.append("wait" + t.split("0x")[-1].strip())
    return out

report = {}
for D, causal, out in ((128, False, "fp16"), (128, True, "bf16"), (64, True, "fp16")):
    k = v9.compile_sass(D=D, causal=causal, out=out)
    usage, sass = sass_of(k)
    loop = loop_of(sass)
    report[f"{D} {causal} {out}"] = dict(
        regs=int(usage.split("REG:")[1].split()[0]), spill="STACK:0 " not in usage or "LOCAL:0 " not in usage,
        shared=k.metadata.shared, order=waits(loop), shuffles=sum(opcode(t) in ("SHFL", "PRMT") for t in loop))

# v7 (Triton) with tile j + 1's Q K^T issued before tile j's softmax: Triton still waits right after it
BM, BN, D = v7.TILES[0], v7.TILES[1], 128
desc = lambda dt, r, c: f"tensordesc<{dt}[1, 1, {r}, {c}]>"
types = {"Q": desc("fp8e4nv", BM, D), "K": desc("fp8e4nv", BN, D), "VT": desc("fp8e4nv", D, BN),
         "O": desc("fp16", BM, D), "LSE": "*fp32", "DQ": "*fp32", "DK": "*fp32", "DV": "*fp32", "scale": "fp32"}
const = {"CAUSAL": False, "GROUP": 1, "Q_PER": 2, "EXACT": False, "D": D, "BLOCK_M": BM, "BLOCK_N": BN,
         "FMA_EXP2": 0, "LAZY": False, "PAIRED": True, "ORDER": True, "AHEAD": True}
ahead = compile_for(v7.fp8_block_fwd, types, const, 90, num_warps=v7.TILES[2], num_stages=v7.TILES[3])
report["v7 AHEAD_S"] = dict(order=waits(loop_of(sass_of(ahead)[1])))
print("REPORT", json.dumps(report))
"""


@pytest.fixture(scope="module")
def compiled():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", COMPILE, str(LADDER)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "REPORT" in r.stdout, r.stderr[-3000:]
    import json
    return json.loads(r.stdout.split("REPORT", 1)[1])


def test_the_kernel_compiles_for_sm90a_and_fits_two_programs_an_sm(compiled):
    for build in ("128 False fp16", "128 True bf16", "64 True fp16"):
        k = compiled[build]
        assert not k["spill"] and 0 < k["regs"] <= 255, (build, k)
        assert 2 * 128 * -(-k["regs"] // 8) * 8 <= 65536, (build, k)         # two 4-warp programs' registers
        assert 2 * (k["shared"] + 1024) <= 228 * 1024, (build, k)            # and shared memory, 1 KiB each spare


def test_the_key_loop_waits_for_s_with_p_v_in_flight(compiled):
    """The overlap in the SASS: S of tile t issued, then P_{t-1} V_{t-1}, then a wait that leaves one group (P V)
    running while the softmax of S starts; P reaches the operand without shuffles (v7's operand order). ptxas
    serialising the WGMMAs (a wait after every issue) fails this too."""
    for build in ("128 False fp16", "128 True bf16", "64 True fp16"):
        k = compiled[build]
        assert k["order"][:4] == ["S", "PV", "wait1", "wait0"], (build, k["order"])
        assert k["shuffles"] <= 8 + 16, (build, k)        # the row max's 8 SHFL, 16 PRMT packing P's bytes
    # Triton: the same order written in v7 (AHEAD_S) still waits for everything right after Q K^T
    order = compiled["v7 AHEAD_S"]["order"]
    assert order[:2] == ["S", "wait0"] and "wait1" not in order, order


@pytest.fixture(scope="module")
def v9():
    sys.path.insert(0, str(LADDER))
    return load_module(LADDER / "v9_gluon_fp8.py", "ladder10_v9_gluon_fp8")


def test_v7_with_s_a_tile_ahead_computes_what_its_loop_does(v9, monkeypatch):
    """v7's AHEAD_S loop (the SASS test's Triton side) in the interpreter: bit for bit block_tiles' result."""
    v7 = v9.v7
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 320, 128) for _ in range(3))
    q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v)
    for causal in (False, True):
        runs = []
        for ahead in (False, True):
            monkeypatch.setattr(v7, "AHEAD_S", ahead)
            runs.append(v7.run_kernel(q8, k8, v8t, dq, dk, dv, causal, None, torch.float32))
        (o0, lse0), (o1, lse1) = runs
        assert torch.equal(o0, o1) and torch.equal(lse0, lse1), causal


def test_entry_points_refuse_a_cpu_tensor(v9):
    q = torch.zeros(1, 1, 4, 128, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="v9_gluon_fp8 needs a Hopper GPU"):
        v9.flash_attention_fp8(q, q, q)
    with pytest.raises(RuntimeError, match="v9_gluon_fp8 needs a Hopper GPU"):
        v9.flash_attention_fp8_prequantized(q, q, q, None, None, None)
    # what the FP8 kind reads from the rung's module: v7's quantiser and V^T layout
    assert v9.quantize_fp8 is v9.v7.quantize_fp8 and v9.transpose_v is v9.v7.transpose_v
