"""Write the student's student_kernel.cu of step 07 from the solution (student_kernel_solution.cu).

    python solutions/07_hopper_flash_attention/ladder/make_stub.py          # rewrite student_kernel.cu
    python solutions/07_hopper_flash_attention/ladder/make_stub.py --check  # exit 1 when out of date

The stub's bodies wait on nothing and load nothing, so a stub or a half-written kernel finishes (with
wrong values) instead of hanging on an mbarrier. Grading-only: not released.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent          # solutions/07_hopper_flash_attention/ladder (not released)
sys.path.insert(0, str(HERE.parents[2]))        # the repository root, for autograder.cuda_stub
from autograder.cuda_stub import with_todo, write_or_check  # noqa: E402

# Each body follows its FA_TODO marker (hopper_common.cuh defines it as nothing).
STUB_BODIES = with_todo({
    "producer": ["(void)tm_q; (void)tm_k; (void)tm_v; (void)smem; (void)bars; (void)p; (void)sched;"],
    "gemm_qk": ["for (int i = 0; i < BLOCK_N / 2; ++i) s[i] = 0.f;", "(void)q_addr; (void)k_addr;"],
    "gemm_pv": ["(void)o; (void)p; (void)v_addr;"],
    "consumer_mainloop": ["(void)acc; (void)smem; (void)bars; (void)p; (void)tile; (void)q_parity; (void)wg;",
                          "(void)scale_log2;", "it += nb;"],
})

if __name__ == "__main__":
    sys.exit(write_or_check(HERE, STUB_BODIES, sys.argv[1:]))
