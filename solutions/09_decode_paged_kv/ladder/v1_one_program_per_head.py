"""v1: the naive decode: one program per (sequence, query head) walks all of the sequence's keys,
BLOCK_N at a time, and writes o and lse itself. No split, no merge, no GQA packing, no tl.dot.

v1 verdict: 368 GB/s of K/V on 64 x 8k p16 (12% of a copy, 0.12x cuDNN), 54 GB/s on 1 x 128k
(H100, fp16, benchmarks/results/2026-11-23_h100_step09.json).

What it teaches. Decode is FlashAttention with a handful of query rows: the Sq new tokens of one
head (Sq = 1 in plain decode). Their q is a [Sq, D] block held in registers; each step loads a
K tile [BLOCK_N, D] and a V tile, multiplies q by K elementwise and sums over D (tl.sum: tl.dot
needs at least 16 rows), and updates the online softmax (m, l, acc) of lecture 03, in base 2. The
paging is in the addresses only: key t of sequence b is row t % page_size of page
block_table[b, t // page_size], and every key of a tile looks its page up (a gather per row, which
works for any page size, 48 included). Every load is masked by ``key < seq_len``: the rows past it,
the block table's padding entries and the pages no sequence owns hold NaN in the tests. Causal is
bottom-right: token i sees keys j <= i + seq_len - Sq. A row that sees no key (seq_len 0) keeps
l = 0 and is written as o = 0, lse = -inf. The key loop is common.attend_one_head, shared with v2.

Why it leaves the GPU idle. The grid is B * Hq programs, and a program's work is one sequential
walk over L keys. At B = 1 and Hq = 32 that is 32 programs on an H100's 132 SMs: 100 SMs do
nothing, and the 32 that work have one CTA each, too few loads in flight to approach the memory
bandwidth (a memory-bound kernel needs many warps per SM to hide ~1 us of DRAM latency). The time
is that of one program reading 2 * L * D elements alone, however large the GPU. With many long
sequences (B = 64) the grid is big enough, but then the second fault shows: the G = Hq / Hkv query
heads of a group each read the same K and V, G times the bytes a decode must read (v3 fixes that),
and the vector products on CUDA cores (a multiply and a reduction across threads per key and
element) cost more instructions per byte than the memory system needs. v2 fixes the first fault by
cutting each sequence's keys into splits.

Run on its own:  python v1_one_program_per_head.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_common as common  # noqa: E402 (sets up the interpreter without a GPU, before triton is imported)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

attend_one_head = common.attend_one_head
# The interpreter runs each tile op as NumPy calls: fewer, larger tiles are faster there.
BLOCK_N, LAUNCH = (128, {}) if common.INTERPRET else (32, {"num_warps": 8})


@triton.jit
def decode_kernel(Q, K, V, TABLE, LENS, O, LSE,
                  sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb, sob, soh, sos,
                  Hq, Sq, page_size, qk_scale,
                  G: tl.constexpr, SQ_P: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0) // Hq
    h = tl.program_id(0) % Hq
    L = tl.load(LENS + b).to(tl.int32)
    m_i, l_i, acc = attend_one_head(Q, K, V, TABLE, b, h, h // G, L, 0, L,
                                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb,
                                    Sq, page_size, qk_scale, SQ_P=SQ_P, D=D, BLOCK_N=BLOCK_N)
    tok = tl.arange(0, SQ_P)
    offs_d = tl.arange(0, D)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                    # no key seen: o = 0, lse = -inf
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o = acc / l_safe[:, None]
    tl.store(O + b.to(tl.int64) * sob + h * soh + tok[:, None] * sos + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=(tok < Sq)[:, None])
    tl.store(LSE + (b * Hq + h).to(tl.int64) * Sq + tok, lse, mask=tok < Sq)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """(o, lse) of the last Sq tokens of each sequence against its paged keys and values: one program
    per (sequence, query head), no split."""
    o, lse, scale = common.prepare(q, k_cache, v_cache, block_table, seq_lens, scale)
    B, Hq, Sq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    if B * Hq * Sq == 0:
        return o, lse
    decode_kernel[(B * Hq,)](
        q, k_cache, v_cache, block_table, seq_lens, o, lse, *q.stride()[:3], *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_table.stride(0), *o.stride()[:3], Hq, Sq, page_size, scale * common.LOG2E,
        G=Hq // Hkv, SQ_P=triton.next_power_of_2(Sq), D=D, BLOCK_N=BLOCK_N, **LAUNCH)
    return o, lse


if __name__ == "__main__":
    from facourse.decode import check_paged_decode
    for case in ("mixed", "page64", "page48", "prefix", "mqa", "spec", "d64"):
        check_paged_decode(paged_decode, case, seed=0)
