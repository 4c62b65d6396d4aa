"""v3: v2's paged kernel with the page size a compile-time constant (one compiled kernel per page size in use).

In v2 the paged keys' rows are found with `offs_n // page_size` and `offs_n % page_size` on a runtime
integer: a 32-bit division is no GPU instruction but a sequence of them, for every key of every tile in every
program (v2's PTX at 128 x 128 tiles holds 129 divisions and remainders; with the constant, 1). With the page
size a `tl.constexpr` the compiler turns both into a shift and a mask (a power of two) or a multiply and a
shift (48). It pays with v2's paged tiles (128 x 128, 8 warps, 2 stages), not with 128 x 64 and 3 stages
(benchmarks/results/2026-12-04_h200_step15_paged_probes.txt). Packed prefill has no page size: it is v2's.

Run on its own:  python v3_page_constexpr.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import v2_split_tiles as v2  # noqa: E402 (sets up the interpreter without a GPU, before triton is imported)


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale=None):
    return v2.paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale,
                            page_const=True)


if __name__ == "__main__":
    from facourse.serving import PAGED_CASES, check_paged_prefill
    for case in PAGED_CASES:
        check_paged_prefill(paged_prefill, case, seed=0)
