# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Without a GPU, Triton's interpreter runs the kernels on the CPU (in NumPy). It must be switched
# on BEFORE triton is imported, so this cell comes first.
import os

import torch

from facourse.triton_setup import interpret_without_gpu

interpret_without_gpu()

import math

import triton
import triton.language as tl

from facourse.serving import (check_paged_prefill, check_varlen, validate_paged_prefill_inputs,
                              validate_varlen_inputs)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 15 — serving: packed variable-length prefill and chunked prefill on a paged cache
#
# A server attends many requests of different lengths at once. Padding them to the longest wastes the
# work of the padding; packing them end to end wastes nothing, if the kernel knows where each one starts.
# You will write one Triton kernel with two entry points (lecture 15 explains both):
#
# `varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None) -> (o, lse)`
#
# `paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale=None) -> (o, lse)`
#
# **The contract.** `q` is `[total_q, Hq, D]`: sequence `b`'s queries are rows `cu_seqlens_q[b]` to
# `cu_seqlens_q[b + 1] - 1` (`cu_seqlens_q` is int32 `[B + 1]`, 0 first, `total_q` last; a sequence may be
# empty). For `varlen_attention`, `k` and `v` are `[total_k, Hkv, D]`, packed the same way by
# `cu_seqlens_k`. For `paged_prefill`, the keys and values are step 09's paged cache: `k_cache`,
# `v_cache` `[num_pages, page_size, Hkv, D]`, token `t` of sequence `b` in row `t % page_size` of page
# `block_table[b, t // page_size]`, `seq_lens[b]` tokens in all, the new ones (its queries) included and
# already written. Any strides with `stride(-1) == 1` (the tests pass views of one fused projection).
# `max_seqlen_q` and `max_seqlen_k` are the longest lengths: they size the grid without reading
# `cu_seqlens` on the host. Query head `h` reads KV head `h // (Hq // Hkv)`. Causal is bottom-right per
# sequence: query `i` of a sequence of `Lq` queries and `Lk` keys sees key `j` iff `j <= i + Lk - Lq`
# (`paged_prefill` is always causal: a chunk of new tokens sees the cached prefix and itself). A row that
# sees no key gives `o = 0` and `lse = -inf`, never NaN. `o` is `[total_q, Hq, D]` in `q`'s dtype; `lse` is
# float32 `[Hq, total_q]` (natural log; FlashAttention-2's varlen layout).
#
# **The kernel.** One program per (query tile, sequence, query head): grid
# `(cdiv(max_seqlen_q, BLOCK_M), B, Hq)`. A program reads its sequence's offsets and lengths, does nothing
# if its tile starts past the sequence's end, and otherwise runs the FlashAttention-2 loop of step 05
# over its sequence's keys only, with the causal offset `Lk - Lq`. Where a key tile's rows live is the only
# difference between the two entry points: rows `cu_seqlens_k[b] + j` of `k`, or the pages of the block
# table. You write that lookup as a function of its own (part 1), the kernel (part 2) and the two launches
# (part 3).
#
# **What is graded** (13 points): the visible `packed` (with logits in the hundreds too) and `chunks`
# cases; hidden: non-causal, fewer queries than keys (a cached prefix), rows that see no key and empty
# sequences, MQA, D = 64, pages of 48 tokens, pages shared by a common prefix, paged D = 64, bf16 (GPU).
# Every result by the course's rule, sequence by sequence: no worse than twice PyTorch's own error in the
# same dtype, relative error below 1%. While graded your functions may not call PyTorch's attention or its
# matrix products. Without a GPU the kernel runs in Triton's interpreter on small sizes (float32).
#
# **Speed** is measured, not graded yet (its thresholds wait for the course's solution to be timed on an
# H100 as well as an H200): on a GPU, `facourse.serving.bench_serving(varlen_attention, "prefill_mix")` times
# a prefill batch of 16 prompts (17 to 7919 tokens, 32.5k in all, causal) and `bench_serving(paged_prefill,
# "chunked_p16")` a continuous batch (8 chunks of 2048 new tokens over caches of 2k to 18k, and 32 one-token
# decodes, pages of 16), GQA 32/8, D = 128, fp16, against FlashAttention-2's varlen kernel through PyTorch
# (`torch.nn.attention.varlen`) on the same batch, in TFLOP/s of the visible query-key pairs.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_rows", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: where a key tile lives
#
# `kv_offsets` returns, for the key positions `offs_n` (0 is the sequence's first key) of sequence `b`,
# the offset of each key's row in elements, as int64 (the kernel adds the head's offset and `offs_d`).
# Packed (`PAGED` false): row `k_start + j`, `row_stride` elements apart. Paged: the row `j % page_size` of
# page `block_table[b, j // page_size]`, with `page_stride` and `row_stride` the cache's strides. Read the
# block table only where `inside` holds: past a sequence's last page its entries are padding.

# %% nbgrader={"grade": false, "grade_id": "kv_offsets", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def kv_offsets(TABLE, b, offs_n, inside, k_start, stb, page_size, page_stride, row_stride,
               PAGED: tl.constexpr):
    # YOUR CODE HERE (about 5 lines)
    ### BEGIN SOLUTION
    if PAGED:
        page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0).to(tl.int64)
        return page * page_stride + (offs_n % page_size).to(tl.int64) * row_stride
    else:
        return (k_start + offs_n).to(tl.int64) * row_stride
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: the kernel
#
# Program `(m_block, b, h)` owns queries `m_block * BLOCK_M` to `m_block * BLOCK_M + BLOCK_M - 1` of
# sequence `b` and query head `h`. Read `q_start` and `Lq` from `CU_Q`; `Lk` (and `k_start`) from `CU_K`, or
# `Lk = LENS[b]` and `k_start = 0` when `PAGED`. A tile that starts at or past `Lq` does no work: give it an
# empty key range (its loads and stores are masked off by `offs_m < Lq` anyway). Load the tile of
# `q` (masked), walk the key tiles `BLOCK_N` at a time up to `Lk` (causal: up to where the tile's last row
# can see, `(m_block + 1) * BLOCK_M + Lk - Lq`, no further), with every load masked by `offs_n < Lk`, the
# scores masked by the causal rule, and the online softmax in base 2 (`qk_scale` is `scale * log2(e)`).
# Store `o` (zero where a row saw no key) and `lse` (natural log, `-inf` where a row saw no key) at
# `LSE + h * total_q + q_start + i`.

# %% nbgrader={"grade": false, "grade_id": "kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def serving_kernel(Q, K, V, O, LSE, CU_Q, CU_K, LENS, TABLE,
                   sqt, sqh, skp, skr, skh, svp, svr, svh, sot, soh, stb, page_size,
                   total_q, qk_scale, G,
                   CAUSAL: tl.constexpr, PAGED: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m_block = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // G
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    # YOUR CODE HERE (about 40 lines)
    ### BEGIN SOLUTION
    q_start = tl.load(CU_Q + b)
    Lq = tl.load(CU_Q + b + 1) - q_start
    if PAGED:
        k_start = 0
        Lk = tl.load(LENS + b).to(tl.int32)
    else:
        k_start = tl.load(CU_K + b)
        Lk = tl.load(CU_K + b + 1) - k_start
    live = offs_m < Lq
    q = tl.load(Q + (q_start + offs_m).to(tl.int64)[:, None] * sqt + h * sqh + offs_d[None, :],
                mask=live[:, None], other=0.0)
    hi = Lk
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Lk, (m_block + 1) * BLOCK_M + Lk - Lq), 0)
    hi = tl.where(m_block * BLOCK_M < Lq, hi, 0)           # a tile past its sequence: no work, no store
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < Lk
        rows = kv_offsets(TABLE, b, offs_n, inside, k_start, stb, page_size, skp, skr, PAGED)
        k = tl.load(K + rows[:, None] + kvh * skh + offs_d[None, :], mask=inside[:, None], other=0.0)
        keep = inside[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + Lk - Lq)
        s = tl.where(keep, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        rows_v = kv_offsets(TABLE, b, offs_n, inside, k_start, stb, page_size, svp, svr, PAGED)
        v = tl.load(V + rows_v[:, None] + kvh * svh + offs_d[None, :], mask=inside[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(O + (q_start + offs_m).to(tl.int64)[:, None] * sot + h * soh + offs_d[None, :],
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=live[:, None])
    tl.store(LSE + h.to(tl.int64) * total_q + q_start + offs_m, lse, mask=live)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_launch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 3: the two launches
#
# Both functions validate their inputs (given: `validate_varlen_inputs` and `validate_paged_prefill_inputs`
# raise `AttentionInputError` with a message), allocate `o` and `lse`, and launch `serving_kernel` on the
# grid `(cdiv(max_seqlen_q, BLOCK_M), B, Hq)`, with the strides of the packed tensors (the token's, then the
# head's) or of the cache (the page's, the row's, the head's; pass 0 for a packed tensor's page stride).
# Neither reads `cu_seqlens` or `seq_lens` on the host (past the validation, which does it once per batch).

# %% nbgrader={"grade": false, "grade_id": "launch", "locked": false, "schema_version": 3, "solution": true, "task": false}
LOG2E = 1.4426950408889634
# Tiles: 128 x 64 and 8 warps on a GPU (step 05's); 64 x 64 in the interpreter, where smaller tiles waste less
# on the short sequences of the CPU cases.
BLOCK_M, BLOCK_N, LAUNCH = (64, 64, {}) if INTERPRET else (128, 64, {"num_warps": 8, "num_stages": 3})


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None):
    """(o, lse) of packed sequences of different lengths: sequence b's queries and keys by cu_seqlens."""
    validate_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
    total_q, Hq, D = q.shape
    B = cu_seqlens_q.shape[0] - 1
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # YOUR CODE HERE (about 7 lines)
    ### BEGIN SOLUTION
    o = torch.empty_like(q)
    lse = torch.empty((Hq, total_q), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(max(max_seqlen_q, 1), BLOCK_M), B, Hq)
    serving_kernel[grid](q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k, cu_seqlens_k,
                         q.stride(0), q.stride(1), 0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1),
                         o.stride(0), o.stride(1), 0, 1, total_q, scale * LOG2E, Hq // k.shape[1],
                         CAUSAL=causal, PAGED=False, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **LAUNCH)
    ### END SOLUTION
    return o, lse


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale=None):
    """(o, lse) of each sequence's new tokens (packed in q) against its paged cache, causal bottom-right."""
    validate_paged_prefill_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale)
    total_q, Hq, D = q.shape
    B = cu_seqlens_q.shape[0] - 1
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # YOUR CODE HERE (about 8 lines)
    ### BEGIN SOLUTION
    o = torch.empty_like(q)
    lse = torch.empty((Hq, total_q), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(max(max_seqlen_q, 1), BLOCK_M), B, Hq)
    serving_kernel[grid](q, k_cache, v_cache, o, lse, cu_seqlens_q, cu_seqlens_q, seq_lens, block_table,
                         q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
                         o.stride(0), o.stride(1), block_table.stride(0), k_cache.shape[1], total_q, scale * LOG2E,
                         Hq // k_cache.shape[2],
                         CAUSAL=True, PAGED=True, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **LAUNCH)
    ### END SOLUTION
    return o, lse

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_varlen` and `check_paged_prefill` draw a batch (the packed buffers end in rows of NaN; the cache is
# step 09's: pages shuffled and shared, NaN in every row no sequence owns), call your function and check
# every sequence against a float64 reference. A failure names the sequences (with their lengths), heads and
# rows that are wrong and the likely cause (sequences that see each other, the causal offset, a load that is
# not masked, the block table, the GQA mapping). In the interpreter each case takes a few seconds.

# %% nbgrader={"grade": true, "grade_id": "test_packed", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_varlen(varlen_attention, "packed")    # lengths 1 to 200 (CPU) or 4097 (GPU), causal, packed end to end
# hidden test: also with logits in the hundreds, and with a scale argument
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_packed", varlen_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_chunks", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_paged_prefill(paged_prefill, "chunks")   # decodes (1 new token), chunks and a whole prompt in one batch
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_chunks", paged_prefill)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same names yourself: `check_varlen` takes
# `packed`, `noncausal`, `prefix`, `empty_rows`, `mqa` and `d64`; `check_paged_prefill` takes `chunks`,
# `page48`, `shared_prefix` and `paged_d64`; `check_varlen(varlen_attention, "packed", logit_scale=64)`
# puts the logits in the hundreds.

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: non-causal: every query sees its whole sequence, and no other
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", varlen_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_prefix", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: fewer queries than keys (a cached prefix): the causal offset kv_len - q_len
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_prefix", varlen_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: more queries than keys (rows that see no key) and empty sequences
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_empty_rows", varlen_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_gqa_d64", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: MQA (one KV head), and D = 64 without causal
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_gqa_d64", varlen_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_page48", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: pages of 48 tokens (no power of two)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_page48", paged_prefill)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_shared_prefix", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: sequences that share the pages of a common prefix
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_shared_prefix", paged_prefill)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_paged_d64", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: the chunks case with D = 64
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_paged_d64", paged_prefill)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: bf16 on "packed" and "prefix" (GPU only)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", varlen_attention)
### END HIDDEN TESTS


# %% nbgrader={"grade": true, "grade_id": "test_paged_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: bf16 on "chunks" and "page48" (GPU only)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_paged_bf16", paged_prefill)
### END HIDDEN TESTS
