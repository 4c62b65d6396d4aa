"""Write the student's student_kernel.cu from the solution (student_kernel_solution.cu, next to this file).

nbgrader clears solution regions in notebooks only, and its Python stub would not compile as CUDA.
Every region between `// BEGIN SOLUTION` and `// END SOLUTION` becomes a body that compiles (the
outputs zeroed) and a `// YOUR CODE HERE (about N lines)` line. Grading-only: not released.

    python solutions/06_cuda_flash_attention/ladder/make_stub.py          # rewrite student_kernel.cu
    python solutions/06_cuda_flash_attention/ladder/make_stub.py --check  # exit 1 when out of date
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent          # solutions/06_cuda_flash_attention/ladder (not released)
SOLUTION = HERE / "student_kernel_solution.cu"
STUB = HERE.parent / "student_kernel.cu"

# The body each function gets in the stub: it compiles and leaves the outputs in a defined state
# (so a partly written kernel fails the tests, never hangs or reads garbage).
STUB_BODIES = {
    "load_tile_async": ["(void)smem; (void)gmem; (void)row_stride; (void)rows_valid; (void)tid;"],
    "qk_tile": ["for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;",
                "(void)q_frag; (void)sK; (void)lane;"],
    "online_softmax_update": ["(void)s; (void)m_i; (void)l_i; (void)o; (void)scale_log2;"],
    "pv_tile": ["(void)o; (void)p; (void)sV; (void)lane;"],
}
_FUNC = re.compile(r"FA_DEVICE\s+void\s+(\w+)\s*\(")


def make_stub(text: str) -> str:
    out, region, func, indent = [], None, None, ""
    for line in text.splitlines(keepends=True):
        if m := _FUNC.search(line):
            func = m[1]
        if "BEGIN SOLUTION" in line:
            if region is not None:
                raise ValueError("nested BEGIN SOLUTION")
            region, indent = [], line[: len(line) - len(line.lstrip())]
            continue
        if "END SOLUTION" in line:
            if region is None:
                raise ValueError("END SOLUTION without BEGIN SOLUTION")
            if func not in STUB_BODIES:
                raise ValueError(f"no stub body for function {func!r}")
            n = sum(1 for ln in region if ln.strip() and not ln.strip().startswith(("//", "#pragma")))
            out.append(f"{indent}// YOUR CODE HERE (about {n} lines)\n")
            out += [f"{indent}{ln}\n" for ln in STUB_BODIES[func]]
            region = None
            continue
        if region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise ValueError("BEGIN SOLUTION without END SOLUTION")
    return "".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stub = make_stub(SOLUTION.read_text())
    if "--check" in argv:
        ok = STUB.exists() and STUB.read_text() == stub
        print("student_kernel.cu is up to date" if ok else "student_kernel.cu is out of date: run make_stub.py")
        return 0 if ok else 1
    STUB.write_text(stub)
    print(f"wrote {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
