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

from facourse.decode import check_paged_decode, validate_paged_inputs

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 09 — decode against a paged KV cache: split-KV and merge in Triton
#
# You will write the decode kernel of `course/09_decode_paged_kv.ipynb`: a function
#
# `paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None) -> (o, lse)`
#
# that attends the newest `Sq` tokens of each sequence in a batch to that sequence's keys and
# values, which live in a shared pool of fixed-size pages.
#
# **The contract.** `q` is `[B, Hq, Sq, D]` (any strides with `stride(-1) == 1`; `Sq` from 1 to 8);
# `k_cache` and `v_cache` are `[num_pages, page_size, Hkv, D]`; token `t` of sequence `b` is row
# `t % page_size` of page `block_table[b, t // page_size]` (`block_table` is `[B, max_pages]`,
# int32); `seq_lens[b]` (`seq_lens` int32 or int64) counts the tokens of sequence `b`, the `Sq` new
# ones included, and may be 0. Query head `h` reads KV head `h // (Hq // Hkv)`. Causal is
# bottom-right per sequence: query `i` sees keys `j <= i + seq_lens[b] - Sq`. A row that sees no key
# (an empty sequence) gives `o = 0` and `lse = -inf`, never NaN. `o` has `q`'s dtype, `lse` is
# float32 `[B, Hq, Sq]` (natural log).
# `page_size` is any positive number (the tests use 16, 64 and 48). Entries of `block_table` past
# a sequence's last page are padding: never follow them. Pages may be shared between sequences
# (a common prompt prefix) and come in any order.
#
# **The algorithm** (flash-decoding: Dao, Haziza, Massa and Sizov, 2023). A decode has one query
# row per head: one program per row leaves most of the GPU idle, so the keys of a sequence are cut
# into `num_splits` chunks and one program reduces one chunk to a partial state: for the rows it
# owns, the running max `m`, the sum `l` and the normalised output `O` of lecture 03. A second kernel
# merges the partial states of a row:
#
# $$M = \max_s \mathrm{lse}_s,\quad w_s = e^{\mathrm{lse}_s - M},\quad o = \frac{\sum_s w_s O_s}{\sum_s w_s},
# \quad \mathrm{lse} = M + \log\sum_s w_s ,$$
#
# where a split that saw no key has `lse_s = -inf` and weight 0. One program of the split kernel
# serves all `G = Hq // Hkv` query heads of one KV head (and all `Sq` tokens): the `G * Sq` rows
# of a group read their keys and values once (GQA packing), as one `tl.dot` of `[ROWS, D]` by
# `[D, BLOCK_N]`.
#
# **What is graded** (15 points): the visible `mixed` case (lengths 0 to 32k in one batch on a GPU,
# page size 16); hidden: page size 64, a page size that is no power of two (48), pages shared by a
# common prefix, MQA, `Sq = 4` and `Sq = 8` with bottom-right causal (int64 `seq_lens` with 8),
# D = 64, bf16 (GPU), and bad inputs (a block table too short for `seq_lens`, page ids out of range,
# an int64 block table: each must raise `AttentionInputError`, which `validate_paged_inputs` does
# for you). Every result by the course's rule, sequence by sequence: no worse than twice PyTorch's
# own error in the same dtype, relative error below 1%. Speed (4 points, GPU only): your decode's
# time on two long batches (64 sequences of 8k tokens with pages of 16; 16 of 32k with pages of 64;
# GQA 32/8, D = 128, fp16) against SDPA on the same keys and values stored contiguously (its fastest
# backend on the grading GPU), half the points at a `min` fraction of its speed, all at a `target`
# (the instructor's thresholds file sets both). While graded your functions may not call PyTorch's
# attention or its matrix products. Without a GPU the kernels run in Triton's interpreter on small
# sizes (float32), and the speed cells score 0.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_split", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: the split kernel
#
# Program `(split, b * Hkv + kvh)` owns keys `[split * SPLIT_LEN, min((split + 1) * SPLIT_LEN, L))` of
# sequence `b` (`L = seq_lens[b]`) and the `G * SQ` query rows of KV head `kvh`: row `r` is query
# head `kvh * G + r // SQ`, token `r % SQ` (rows `r >= G * SQ` are padding up to `ROWS`, a power of
# two of at least 16 that `tl.dot` needs). Walk the chunk `BLOCK_N` keys at a time: find each key's
# page in the block table, load K and V rows (masked: rows past the chunk's end are never read),
# and keep the online-softmax state in base 2 (`qk_scale` is `scale * log2(e)`). Store, per row and
# split, the normalised partial output `O_part[b, h, i, split, :]` and `LSE_part[b, h, i, split]`
# (base 2: `m + log2(l)`, `-inf` when the split saw no key for that row).

# %% nbgrader={"grade": false, "grade_id": "split_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def split_kv_kernel(Q, K, V, TABLE, LENS, O_PART, LSE_PART,
                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb,
                    Hq, Sq, page_size, split_len, num_splits, qk_scale,
                    G: tl.constexpr, SQ: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    split = tl.program_id(0)
    b = tl.program_id(1) // (Hq // G)
    kvh = tl.program_id(1) % (Hq // G)
    L = tl.load(LENS + b)
    rows = tl.arange(0, ROWS)
    head = kvh * G + rows // SQ                  # the query head of each row
    tok = rows % SQ                              # its token among the Sq new ones
    live = rows < G * SQ
    offs_d = tl.arange(0, D)
    # YOUR CODE HERE
    ### BEGIN SOLUTION
    q = tl.load(Q + b.to(tl.int64) * sqb + head[:, None] * sqh + tok[:, None] * sqs + offs_d[None, :],
                mask=live[:, None], other=0.0)
    start = split * split_len
    end = tl.minimum(start + split_len, L)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < end
        page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0).to(tl.int64)
        row = offs_n % page_size
        k = tl.load(K + page[:, None] * skp + row[:, None] * skr + kvh * skh + offs_d[None, :],
                    mask=inside[:, None], other=0.0)
        v = tl.load(V + page[:, None] * svp + row[:, None] * svr + kvh * svh + offs_d[None, :],
                    mask=inside[:, None], other=0.0)
        keep = inside[None, :] & (offs_n[None, :] <= tok[:, None] + L - SQ)
        s = tl.where(keep, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
    part = ((b * Hq + head).to(tl.int64) * Sq + tok) * num_splits + split
    tl.store(O_PART + part[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=live[:, None])
    tl.store(LSE_PART + part, lse, mask=live)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_merge", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: the merge kernel
#
# Program `r` merges the `num_splits` partial states of row `r` (rows are `(b, h, i)` flattened,
# the layout of `O_PART` and `LSE_PART` above) with the formula of the introduction, in base 2,
# and writes `o` (in `O`'s dtype, through its strides) and `lse` (natural log). A row all of whose
# splits saw no key gets `o = 0`, `lse = -inf`.

# %% nbgrader={"grade": false, "grade_id": "merge_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def merge_kernel(O_PART, LSE_PART, O, LSE, sob, soh, sos, Hq, Sq, num_splits,
                 D: tl.constexpr, SPLITS: tl.constexpr):
    r = tl.program_id(0)
    b = r // (Hq * Sq)
    h = (r // Sq) % Hq
    i = r % Sq
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, D)
    # YOUR CODE HERE
    ### BEGIN SOLUTION
    base = r.to(tl.int64) * num_splits
    lse_s = tl.load(LSE_PART + base + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    big = tl.max(lse_s, 0)
    big_use = tl.where(big == float("-inf"), 0.0, big)
    w = tl.math.exp2(lse_s - big_use)                                     # 0 for empty splits
    o_s = tl.load(O_PART + (base + offs_s)[:, None] * D + offs_d[None, :], mask=(offs_s < num_splits)[:, None],
                  other=0.0)
    total = tl.sum(w, 0)
    safe = tl.where(total == 0.0, 1.0, total)
    o = tl.sum(w[:, None] * o_s, 0) / safe
    lse = tl.where(total == 0.0, float("-inf"), (big_use + tl.math.log2(safe)) * 0.6931471805599453)
    tl.store(O + b.to(tl.int64) * sob + h * soh + i * sos + offs_d, o.to(O.dtype.element_ty))
    tl.store(LSE + r, lse)
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_launch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 3: the launch
#
# `paged_decode` validates its inputs (given), picks the split length, allocates the partial
# states and the outputs, and launches both kernels. Choose `num_splits` so that the split kernel
# has enough programs to fill the GPU: about `2 * SMs` programs in all over `B * Hkv` groups, never
# more splits than `BLOCK_N`-key blocks, and `split_len` a multiple of `BLOCK_N`. The number of
# keys to cover is known from shapes alone (`max_pages * page_size`): reading `seq_lens` on the
# host would stop the CPU until the GPU is done. In the interpreter `sm_count` says 64, so that the
# small CPU cases are split too and your merge runs on the CPU.

# %% nbgrader={"grade": false, "grade_id": "launch", "locked": false, "schema_version": 3, "solution": true, "task": false}
LOG2E = 1.4426950408889634
# Tiles: bigger in the interpreter, where fewer and larger NumPy operations run faster.
BLOCK_N, LAUNCH = (64, {}) if INTERPRET else (64, {"num_warps": 4, "num_stages": 3})


def sm_count(device) -> int:
    return 64 if device.type != "cuda" else torch.cuda.get_device_properties(device).multi_processor_count


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """(o, lse) of the last Sq tokens of each sequence against its paged keys and values."""
    validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale)
    B, Hq, Sq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = Hq // Hkv
    rows = max(16, triton.next_power_of_2(G * Sq))
    blocks = max(1, triton.cdiv(block_table.shape[1] * page_size, BLOCK_N))   # BLOCK_N-key blocks to cover
    # YOUR CODE HERE: num_splits, split_len, the partial states, o and lse, the two launches
    ### BEGIN SOLUTION
    num_splits = max(1, min(blocks, triton.cdiv(2 * sm_count(q.device), B * Hkv)))
    split_len = triton.cdiv(blocks, num_splits) * BLOCK_N
    num_splits = triton.cdiv(blocks * BLOCK_N, split_len)
    o_part = torch.empty((B, Hq, Sq, num_splits, D), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, Hq, Sq, num_splits), device=q.device, dtype=torch.float32)
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    split_kv_kernel[(num_splits, B * Hkv)](
        q, k_cache, v_cache, block_table, seq_lens, o_part, lse_part, *q.stride()[:3], *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_table.stride(0), Hq, Sq, page_size, split_len, num_splits, scale * LOG2E,
        G=G, SQ=Sq, ROWS=rows, D=D, BLOCK_N=BLOCK_N, **LAUNCH)
    merge_kernel[(B * Hq * Sq,)](o_part, lse_part, o, lse, *o.stride()[:3], Hq, Sq, num_splits, D=D,
                                 SPLITS=triton.next_power_of_2(num_splits))
    ### END SOLUTION
    return o, lse

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_paged_decode` draws a batch (pages shuffled, NaN in every row no sequence owns, in the
# padding entries' pages and past each sequence's last token), calls your function and checks
# every sequence against a float64 reference. A failure names the sequences and heads that are
# wrong and the likely cause (a load that is not masked, the last partial page, the GQA mapping, the
# causal offset, the merge). In the interpreter each case takes a few seconds.

# %% nbgrader={"grade": true, "grade_id": "test_mixed", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_paged_decode(paged_decode, "mixed")   # lengths 0, 1, one page, one past a page, long ones
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_mixed", paged_decode)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same names yourself, for instance
# `check_paged_decode(paged_decode, "page48")`: the cases are `mixed`, `page64`, `page48`, `prefix`,
# `mqa`, `spec` and `d64`; `check_paged_decode(paged_decode, "page64", logit_scale=64)` puts the logits
# in the hundreds, where a merge of partial results that does not subtract the max overflows, and
# `check_paged_decode(paged_decode, "spec", Sq=8, lens_dtype=torch.int64)` draws 8 new tokens per
# sequence with int64 `seq_lens`.

# %% nbgrader={"grade": true, "grade_id": "test_page64", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: pages of 64 tokens, also with logits in the hundreds (the split-KV merge)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_page64", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_page48", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: pages of 48 tokens (no power of two)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_page48", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_prefix", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: sequences that share the pages of a common prefix
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_prefix", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_mqa", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: one KV head for all query heads
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_mqa", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_spec", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_paged_decode(paged_decode, "spec")    # Sq = 4 new tokens per sequence, bottom-right causal
# hidden test: lengths 8 to 4096, also with Sq = 8 new tokens and int64 seq_lens
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_spec", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_d64", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: D = 64
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_d64", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: bf16 on "mixed", "spec" and "page48" (GPU only)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", paged_decode)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "perf_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Speed (graded on a GPU)
#
# Decode reads every key and value once and does little arithmetic with them: its speed is the rate
# at which it reads K and V. The two cells below time your decode against SDPA on the same keys and
# values stored contiguously (the `G` query heads of a KV head passed as `G` rows of it, so SDPA too
# reads them once), same process, interleaved rounds, L2 flushed, median of 25, GPU time. Try it on
# a GPU: `facourse.decode.bench_decode(paged_decode, "b64_8k_p16").summary()`.

# %% nbgrader={"grade": true, "grade_id": "perf_b64_8k_p16", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: 64 sequences of 8192 tokens, pages of 16
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_b64_8k_p16", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "perf_b16_32k_p64", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: 16 sequences of 32768 tokens, pages of 64
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("perf_b16_32k_p64", paged_decode)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bad_inputs", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: a block table too short for seq_lens, page ids out of range, an int64 block table
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bad_inputs", paged_decode)
### END HIDDEN TESTS
