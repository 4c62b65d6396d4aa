"""v3: the exercise's solution: split-KV with GQA packing, then the merge. Its code is the exercise's
(solutions/09_decode_paged_kv/09_decode_paged_kv.pct.py, the cells `setup`, `split_kernel`,
`merge_kernel` and `launch`); this file loads those cells (common.exercise_module), so the rung and
the exercise's solution are one source.

v3 verdict: 2427 GB/s on 64 x 8k p16 (0.82x cuDNN), 2961 on 16 x 32k p64 (0.98x), 2578 on
1 x 128k p16 (1.00x FA2) (H100, fp16, benchmarks/results/2026-11-23_h100_step09.json).

What it adds to v2. v2 runs one program per (split, sequence, query head): the G = Hq // Hkv query
heads of a group each read the same keys and values, G times the bytes (4x at GQA 32/8). v3 runs
one program per (split, sequence * KV head) that owns all G * Sq query rows of the group (row r is
query head kvh * G + r // Sq, token r % Sq; padded to ROWS >= 16 for tl.dot): K and V are read
once per KV head, which is all a decode has to read, and the scores of the group are one tl.dot of
[ROWS, D] by [D, BLOCK_N] on the tensor cores instead of G vector products. The online softmax runs
in base 2 with scale * log2(e) folded into one multiply. The split count targets 2 * SMs programs
over B * Hkv groups, from shapes only (the block table's width times the page size), so the host
never waits for seq_lens.

What it leaves to v4. One tile and launch for every shape (64 keys, 4 warps, 3 stages), which
turns out to be the costly part; each key looks its page up in the block table (a division per
key), even when 16 or 64 consecutive keys share a page; every tile masked; a merge even when there
is one split; 2 * SMs programs, one wave.

Run on its own:  python v3_gqa_packed.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_common as common  # noqa: E402 (sets up the interpreter without a GPU, before triton is imported)

_exercise = common.exercise_module()
split_kv_kernel = _exercise.split_kv_kernel
merge_kernel = _exercise.merge_kernel
paged_decode = _exercise.paged_decode
BLOCK_N = _exercise.BLOCK_N


if __name__ == "__main__":
    from facourse.decode import check_paged_decode
    for case in ("mixed", "page64", "page48", "prefix", "mqa", "spec", "d64"):
        check_paged_decode(paged_decode, case, seed=0)
