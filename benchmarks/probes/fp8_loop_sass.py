"""On a CPU (Triton's compiler, ptxas and cuobjdump; no GPU): v7_fp8_fa3's key loop in SASS, as committed and with
its module switches set as each argument says (NAME=VALUE, several joined by ":", a build each; INT8_QK=1 or 2
builds it for int8 Q and K): fp8_block_fwd
compiled for sm_90 at v7's tiles, non-causal, fp16 out. For each build: the kernel's instructions, its loops' sizes
(a loop: a predicated branch back), and for the first loop (the key tiles without a mask, the one a long sequence
spends its time in) its instructions and the count of the opcodes the softmax and the switches move.

    PYTHONPATH=src:. python benchmarks/probes/fp8_loop_sass.py [NAME=VALUE[:NAME=VALUE] ...]
"""
import collections
import os
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"              # the GPU path: real e4m3 casts and fp8 dots
sys.path[:0] = ["src", ".", "solutions/10_attention_variants/ladder", "benchmarks/probes"]
import triton  # noqa: E402

import v7_fp8_fa3 as v7  # noqa: E402
from facourse.cuda_build import find_cuobjdump  # noqa: E402
from facourse.triton_setup import compile_for  # noqa: E402
from sass_loops import kernels, loops, opcode  # noqa: E402

OPS = ("MUFU", "FADD", "FFMA", "FMUL", "FMNMX", "F2FP", "PRMT", "SHFL", "SEL", "LOP3", "QGMMA", "IGMMA", "I2F", "IADD3",
       "STS", "BAR", "LDS", "LDGSTS", "LDG", "DEPBAR")
# a module switch of v7 -> the kernel's constexpr it sets
SWITCHES = {"EXP2_FMA": "FMA_EXP2", "LAZY_RESCALE": "LAZY", "PAIRED_DESCALES": "PAIRED", "OPERAND_ORDER": "ORDER", "AHEAD_S": "AHEAD",
            "INT8_QK": "INT8"}
CUOBJDUMP = find_cuobjdump() or os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def build(switches):
    BM, BN, warps, stages = v7.TILES
    desc = lambda dt, r, c: f"tensordesc<{dt}[1, 1, {r}, {c}]>"  # noqa: E731
    qk = "i8" if switches.get("INT8_QK", v7.INT8_QK) else "fp8e4nv"
    types = {"Q": desc(qk, BM, 128), "K": desc(qk, BN, 128), "VT": desc("fp8e4nv", 128, BN),
             "O": desc("fp16", BM, 128), "LSE": "*fp32", "DQ": "*fp32", "DK": "*fp32", "DV": "*fp32", "scale": "fp32"}
    const = {"CAUSAL": False, "GROUP": 1, "Q_PER": max(1, BN // BM), "EXACT": False, "D": 128, "BLOCK_M": BM,
             "BLOCK_N": BN}
    const.update({arg: switches.get(name, getattr(v7, name)) for name, arg in SWITCHES.items()})
    kernel = compile_for(v7.fp8_block_fwd, types, const, 90, num_warps=warps, num_stages=stages)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([CUOBJDUMP, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout


def main():
    print(f"# v7_fp8_fa3's fp8_block_fwd for sm_90, tiles {v7.TILES}, non-causal; Triton {triton.__version__}")
    for arg in ["", *sys.argv[1:]]:
        switches = {n: int(v) for n, v in (a.split("=") for a in arg.split(":") if a)}
        for name, ins in kernels(build(switches)).items():
            # a loop ends in a predicated branch back; an unconditional one is an mbarrier retry's way back in
            found = [(a, b) for a, b in loops(ins) if ins[b][1].startswith("@")]
            s, e = min((a, b) for a, b in found if b - a > 8)    # the first: key tiles without a mask
            count = collections.Counter(opcode(t) for _, t in ins[s:e + 1])
            print(f"{arg or 'as committed':>16s}: {len(ins)} instructions; loops {[b - a + 1 for a, b in found[:4]]}; "
                  f"unmasked key loop {e - s + 1}: " + ", ".join(f"{op} {count[op]}" for op in OPS))


if __name__ == "__main__":
    main()
