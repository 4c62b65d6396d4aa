"""On a CPU (nvcc and cuobjdump, no GPU): the loops in the SASS of a CUDA source, kernel by kernel and build by build.

A loop is a backward branch, its body the instructions from the branch's target to the branch (nested loops are
listed too). Each build is the source as is, then with each argument's -D flags (several joined by ":"), compiled
for sm_90a as the course's extensions are (steps 07, 08 and 10: facourse.cuda_build.load_hopper_rung's flags and
include folders). For each kernel whose name contains --kernel: its instructions, its loops' sizes (largest
first), and for its --loops largest loops the count of each opcode of --ops (R2UR: a value copied from a thread's
registers to the warp's uniform ones, as a WGMMA descriptor that nvcc could not prove uniform is; HGMMA and
QGMMA: WGMMA in 16 and 8 bits) and the loop's commonest opcodes.

    PYTHONPATH=src python benchmarks/probes/sass_loops.py FILE.cu [FLAG=V[:FLAG=V...] ...] [--kernel SUBSTR]
"""
import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, "src")
from facourse.cuda_build import dump_sass  # noqa: E402
from facourse.steps import step_dir  # noqa: E402

FLAGS = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
# "/*5540*/   @!P0 BRA 0x5600 ;" -> (0x5540, "BRA 0x5600")
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\S+)?\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)")


def opcode(text: str) -> str:
    """The first dotted token of an instruction, its predicate dropped: "@P0 HGMMA.64x176x16.F32 ..." -> "HGMMA"."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def kernels(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Kernel name -> its instructions, (address, text)."""
    return {f.split("\n", 1)[0].strip(): [(int(m[1], 16), m[2].strip()) for m in LINE.finditer(f)]
            for f in re.split(r"\n\s*Function : ", sass)[1:]}


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) instruction index of each loop, the longest first."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = [(index[int(m[1], 16)], i) for i, (a, t) in enumerate(ins)
             if (m := BRANCH.match(t)) and int(m[1], 16) <= a and int(m[1], 16) in index]
    return sorted(found, key=lambda se: se[0] - se[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("builds", nargs="*", help="-D flags of a further build, several joined by ':' (HFA_BLOCK_N=176)")
    ap.add_argument("--kernel", default="", help="only the kernels whose (mangled) name contains this")
    ap.add_argument("--loops", type=int, default=2, help="how many of each kernel's largest loops to break down")
    ap.add_argument("--ops", default="R2UR,HGMMA,QGMMA,MUFU,SHFL", help="opcodes counted in each loop")
    args = ap.parse_args()
    s07 = step_dir("07")
    include = [args.source.resolve().parent, s07 / "ladder", s07, step_dir("06")]
    ops = args.ops.split(",")
    for build in ["", *args.builds]:
        sass = dump_sass(args.source, "sm_90a", include, FLAGS + [f"-D{f}" for f in build.split(":") if f])
        print(f"## {args.source.name}{', ' + build if build else ' as is'}")
        for name, ins in kernels(sass).items():
            if args.kernel not in name:
                continue
            found = loops(ins)
            print(f"{name[:110]}: {len(ins)} instructions; loops {[e - s + 1 for s, e in found[:8]]}")
            for s, e in found[:args.loops]:
                count = collections.Counter(opcode(t) for _, t in ins[s:e + 1])
                print(f"  loop of {e - s + 1} at {ins[s][0]:#x}-{ins[e][0]:#x}: "
                      + ", ".join(f"{op} {count[op]}" for op in ops)
                      + "; commonest " + ", ".join(f"{op} {n}" for op, n in count.most_common(8)))


if __name__ == "__main__":
    main()
