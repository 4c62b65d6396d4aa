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
from autograder.cuda_stub import with_todo, write_or_check  # noqa: E402

# The body each function gets in the stub after its FA_TODO marker (fa_primitives.cuh defines it as
# nothing): it compiles and leaves the outputs in a defined state (so a partly written kernel fails the
# tests, never hangs or reads garbage).
STUB_BODIES = with_todo({
    "load_tile_async": ["(void)smem; (void)gmem; (void)row_stride; (void)rows_valid; (void)tid;"],
    "qk_tile": ["for (int n = 0; n < BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;",
                "(void)q_frag; (void)sK; (void)lane;"],
    "online_softmax_update": ["(void)s; (void)m_i; (void)l_i; (void)o; (void)scale_log2;"],
    "pv_tile": ["(void)o; (void)p; (void)sV; (void)lane;"],
})

if __name__ == "__main__":
    sys.exit(write_or_check(HERE, STUB_BODIES, sys.argv[1:]))
