"""v2: split-KV (flash-decoding): the keys of a sequence are cut into num_splits chunks, one program
per (split, sequence, query head) reduces its chunk to a partial state, and a second kernel merges
the partial states of each row. No GQA packing yet: every query head reads its K and V itself.

v2 verdict: 360 GB/s on 1 x 128k (6.6x v1), 371 GB/s on 64 x 8k p16 (0.12x cuDNN)
(H100, fp16, benchmarks/results/2026-11-23_h100_step09.json).

What it adds to v1. The grid grows from B * Hq to num_splits * B * Hq programs, with num_splits
chosen from the SM count (common.split_plan: about 2 * SMs programs in all, never more splits
than key blocks): at B = 1, Hq = 32 on 132 SMs, 8 splits give 256 programs instead of 32, every SM
busy and 8x the loads in flight. The split count is taken from shapes only (the block table's
width times the page size), never from seq_lens, so the host never waits for the GPU; a split past
a short sequence's end sees no key and says so (lse = -inf).

What it teaches. A split program runs v1's loop (common.attend_one_head) over keys
[split * split_len, min((split + 1) * split_len, L)) and stores the *normalised* partial output
O_s = acc / l and LSE_s = m + log2(l) (base 2; -inf for a split that saw no key) in float32. The
merge (the exercise's merge_kernel, shared with v3 and v4) takes per row M = max_s LSE_s,
w_s = 2^(LSE_s - M), o = sum_s w_s O_s / sum_s w_s, lse = (M + log2 sum_s w_s) * ln 2: the same
rescaling as the online softmax, applied once across splits. A row all of whose splits saw nothing
gets o = 0, lse = -inf.

What it leaves to v3. The G query heads of a GQA group (G = 4 at 32/8) are G programs that read the
same K and V: 4x the bytes a decode needs, and the scores are vector products on CUDA cores, not
tl.dot on the tensor cores.

Measured (the verdict above): 6.6x v1 on one sequence of 128k tokens, but no faster than v1 on
64 x 8k: where v1's grid already fills the GPU, both are bound by their instructions (vector products
and cross-thread sums per key), not by memory; v3's tl.dot and GQA packing remove that.

Run on its own:  python v2_split_kv.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_common as common  # noqa: E402 (sets up the interpreter without a GPU, before triton is imported)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

attend_one_head = common.attend_one_head
BLOCK_N, LAUNCH = (128, {}) if common.INTERPRET else (32, {"num_warps": 8})
WAVES = 2                      # programs launched per SM


@triton.jit
def split_kv_kernel(Q, K, V, TABLE, LENS, O_PART, LSE_PART,
                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb,
                    Hq, Sq, page_size, split_len, num_splits, qk_scale,
                    G: tl.constexpr, SQ_P: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    split = tl.program_id(0)
    b = tl.program_id(1) // Hq
    h = tl.program_id(1) % Hq
    L = tl.load(LENS + b).to(tl.int32)
    start = split * split_len
    end = tl.minimum(start + split_len, L)                   # start >= end: no key, lse = -inf
    m_i, l_i, acc = attend_one_head(Q, K, V, TABLE, b, h, h // G, L, start, end,
                                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb,
                                    Sq, page_size, qk_scale, SQ_P=SQ_P, D=D, BLOCK_N=BLOCK_N)
    tok = tl.arange(0, SQ_P)
    offs_d = tl.arange(0, D)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))       # base 2, as merge wants
    part = ((b * Hq + h).to(tl.int64) * Sq + tok) * num_splits + split           # [B, Hq, Sq, splits]
    tl.store(O_PART + part[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=(tok < Sq)[:, None])
    tl.store(LSE_PART + part, lse, mask=tok < Sq)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """(o, lse) of the last Sq tokens of each sequence against its paged keys and values: each sequence's
    keys cut into splits, one program per (split, sequence, query head), then the merge."""
    o, lse, scale = common.prepare(q, k_cache, v_cache, block_table, seq_lens, scale)
    B, Hq, Sq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    if B * Hq * Sq == 0:
        return o, lse
    num_splits, split_len = common.split_plan(block_table.shape[1] * page_size, B * Hq,
                                              WAVES * common.sm_count(q.device), BLOCK_N)
    o_part = torch.empty((B, Hq, Sq, num_splits, D), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, Hq, Sq, num_splits), device=q.device, dtype=torch.float32)
    split_kv_kernel[(num_splits, B * Hq)](
        q, k_cache, v_cache, block_table, seq_lens, o_part, lse_part, *q.stride()[:3], *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_table.stride(0), Hq, Sq, page_size, split_len, num_splits,
        scale * common.LOG2E, G=Hq // Hkv, SQ_P=triton.next_power_of_2(Sq), D=D, BLOCK_N=BLOCK_N, **LAUNCH)
    common.merge(o_part, lse_part, o, lse, num_splits)
    return o, lse


if __name__ == "__main__":
    from facourse.decode import check_paged_decode
    for case in ("mixed", "page64", "page48", "prefix", "mqa", "spec", "d64"):
        check_paged_decode(paged_decode, case, seed=0)
