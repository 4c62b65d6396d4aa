"""Write the student's student_kernel.cu from the solution (student_kernel_solution.cu, next to this file).

autograder/cuda_stub.py replaces every `// BEGIN SOLUTION` ... `// END SOLUTION` region with the
body below (it compiles, the outputs zeroed) and a `// YOUR CODE HERE (about N lines)` line.
Grading-only: not released.

    python solutions/06_cuda_flash_attention/ladder/make_stub.py          # rewrite student_kernel.cu
    python solutions/06_cuda_flash_attention/ladder/make_stub.py --check  # exit 1 when out of date
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent          # solutions/06_cuda_flash_attention/ladder (not released)
sys.path.insert(0, str(HERE.parents[2]))        # the repository root, for autograder.cuda_stub
from autograder.cuda_stub import write_or_check  # noqa: E402

SOLUTION = HERE / "student_kernel_solution.cu"
STUB = HERE.parent / "student_kernel.cu"

# The body each function gets in the stub: it compiles and leaves the outputs in a defined state
# (so a partly written kernel fails the tests, never hangs or reads garbage).
# Each starts with FA_TODO("name") (fa_primitives.cuh defines it as nothing): the notebook's compile
# check and CPU check report a function as not implemented while its body carries it.
TODO = "FA_TODO(\"{}\");  // the stub's marker: delete this line when you write the body"
STUB_BODIES = {
    "load_tile_async": [TODO.format("load_tile_async"),
                        "(void)smem; (void)gmem; (void)row_stride; (void)rows_valid; (void)tid;"],
    "qk_tile": [TODO.format("qk_tile"),
                "for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;",
                "(void)q_frag; (void)sK; (void)lane;"],
    "online_softmax_update": [TODO.format("online_softmax_update"),
                              "(void)s; (void)m_i; (void)l_i; (void)o; (void)scale_log2;"],
    "pv_tile": [TODO.format("pv_tile"), "(void)o; (void)p; (void)sV; (void)lane;"],
}

if __name__ == "__main__":
    sys.exit(write_or_check(SOLUTION, STUB, STUB_BODIES, sys.argv[1:]))
