# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 04 — Tiled attention (FlashAttention-2 in PyTorch)
#
# Cut $Q$ into $T_r$ tiles $Q_i$ of $B_r$ rows (`block_m`) and $K, V$ into $T_c$ tiles $K_j, V_j$ of $B_c$ rows
# (`block_n`). For one query tile, keep per row the running max $m_i$, the running sum $\ell_i$ and the
# unnormalised output $O_i$, and visit the key tiles one by one (FlashAttention-2, Dao 2023, Algorithm 1):
#
# $$\begin{aligned}
# S_{ij} &= \text{scale}\cdot Q_i K_j^\top \quad(\text{plus } -\infty \text{ where the causal mask hides a key}) \\
# m_i^{\text{new}} &= \max\big(m_i,\ \operatorname{rowmax}(S_{ij})\big),\qquad
# \tilde P_{ij} = e^{S_{ij} - m_i^{\text{new}}},\qquad \alpha = e^{m_i - m_i^{\text{new}}} \\
# \ell_i &\leftarrow \alpha\,\ell_i + \operatorname{rowsum}(\tilde P_{ij}),\qquad
# O_i \leftarrow \alpha\, O_i + \tilde P_{ij} V_j,\qquad m_i \leftarrow m_i^{\text{new}}
# \end{aligned}$$
#
# and after the last key tile $O_i \leftarrow O_i / \ell_i$ and $\text{lse}_i = m_i + \log \ell_i$. This is step 03's
# online softmax with the $PV$ product carried along: the $S_q \times S_{kv}$ matrices $S$ and $P$ are never
# formed, only one $B_r \times B_c$ tile at a time (on a GPU: in SRAM).
#
# ![S cut into tiles](../../diagrams/tiling_grid.png)
#
# **Loop order.** FlashAttention-1 loops over $K_j, V_j$ outside and $Q_i$ inside, so every inner step reads
# and writes $O_i, m_i, \ell_i$ in HBM. FlashAttention-2 swaps them (§3.1–3.2): the outer loop over $Q_i$ keeps
# $O_i, m_i, \ell_i$ on chip for the whole inner loop, writes $O_i$ once, and parallelises over query tiles.
# Write the FA2 order.
#
# ![FA1 vs FA2 loop order](../../diagrams/loop_order.png)
#
# **Causal tiles.** With bottom-right alignment, key $j$ is visible to query $i$ iff $j \le i + (S_{kv} - S_q)$.
# A key tile that lies entirely above that diagonal for every row of $Q_i$ contributes nothing: **do not
# compute it** (FA2 §3.1, "causal masking": about half the tiles of a square causal problem are skipped).
# Only tiles that the diagonal crosses need the element mask; tiles fully below it need none. A row with no
# visible key (possible when $S_q > S_{kv}$) gives $o = 0$, $\text{lse} = -\infty$.
#
# ![full, diagonal and skipped tiles](../../diagrams/causal_tiles.png)
#
# **GQA.** Query head $h$ reads KV head $h // (H_q / H_{kv})$. Vectorise over batch and heads inside each tile
# step (a loop over tiles only, never over heads): reshape $Q_i$ to `[B, Hkv, G, Br, D]` with $G = H_q/H_{kv}$
# and $K_j$ to `[B, Hkv, 1, Bc, D]`, and `torch.matmul` broadcasts.
#
# ![query heads sharing KV heads](../../diagrams/gqa_heads.png)
#
# **What you will learn**: the FA2 inner loop and its $\alpha$ rescale, tile-level causal skipping with
# bottom-right alignment, GQA without copying K/V, and the lse the backward pass (and split-KV merging) needs.
#
# **Paper**: Tri Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning*
# (2023), Algorithm 1 (forward pass) and §3.1 (fewer non-matmul FLOPs, causal masking), §3.2 (parallelism
# over the sequence, loop order). On a GPU, $B_c = \lceil M / 4d \rceil$, $B_r = \min(B_c, d)$ for an SRAM of $M$
# floats (FlashAttention, Dao et al. 2022, Algorithm 1, line 1).
#
# **The contract**: `tiled_attention(q, k, v, causal=False, scale=None, block_m=64, block_n=64) -> (o, lse)`
# with the course's tensor contract (exercise 01): `q [B, Hq, Sq, D]`, `k, v [B, Hkv, Skv, D]`, any strides with
# `stride(-1) == 1`, `o` in `q`'s dtype, `lse` float32 `[B, Hq, Sq]` natural log, bottom-right causal. Any
# `block_m`, `block_n` must give the same result (up to rounding); lengths need not be multiples of them.
#
# **What is graded** (15 points by the autograder, 2 by hand): the visible test on `small` below, then hidden
# tests on `medium`, `large`, `noncausal`, `asymmetric` and the edge cases `ragged`, `decode` ($S_q = 1$),
# `empty_rows` ($S_q > S_{kv}$), `d64`, `mqa`, `overflow` (logits in the hundreds) and unusual strides, on
# inputs drawn from seeds you do not see; a test that several (block_m, block_n) agree; and a test (2 points)
# that counts the FLOPs of your matmuls to check that causal tiles above the diagonal are skipped, not
# computed and masked. Without a GPU the configurations run at CPU sizes in float32; with one, at full size
# in float16.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import torch

from facourse import check_entry_point, check_visible, validate_inputs

# %% [markdown] nbgrader={"grade": false, "grade_id": "task", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task
#
# Implement `tiled_attention(q, k, v, causal=False, scale=None, block_m=64, block_n=64)`.
#
# Hints, in the order you will need them:
# 1. Allocate `o = torch.empty_like(q)` and `lse` (float32). Outer loop `for i0 in range(0, Sq, block_m)`; the
#    last tile may be shorter (`i1 = min(i0 + block_m, Sq)`). Work in float32 inside.
# 2. Start each query tile from the empty state: $m_i = -\infty$, $\ell_i = 0$, $O_i = 0$.
# 3. Causal: the last row of $Q_i$ is $i_1 - 1$ and sees keys $j \le i_1 - 1 + (S_{kv} - S_q)$, so the inner loop
#    stops at `min(Skv, i1 + Skv - Sq)` (which may be $\le 0$: no tile at all). A tile needs the element mask
#    only if its last key $j_1 - 1$ lies past the first row's diagonal, $i_0 + (S_{kv} - S_q)$.
# 4. Guard $-\infty$ as in step 03: where $m^{\text{new}}$ is $-\infty$, use 0 in the exponents; divide by $\ell$ only
#    where $\ell > 0$. Then empty rows give $O = 0$ and $\text{lse} = -\infty + \log 0 = -\infty$, not NaN.
# 5. Use `torch.matmul` (or `@`) for $Q_i K_j^\top$ and $\tilde P_{ij} V_j$: the tile-skipping test counts their FLOPs.

# %% nbgrader={"grade": false, "grade_id": "tiled_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tiled_attention(q, k, v, causal=False, scale=None, block_m=64, block_n=64):
    """FlashAttention-2's forward pass in PyTorch: returns (o like q, lse float32 [B, Hq, Sq])."""
    validate_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = Hq // Hkv                      # query head h = kv * G + g reads KV head kv = h // G
    off = Skv - Sq                     # bottom-right causal: key j is visible to query i iff j <= i + off
    # YOUR CODE HERE (about 30 lines)
    ### BEGIN SOLUTION
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)
    for i0 in range(0, Sq, block_m):                                       # outer loop over Q_i (FA2)
        i1 = min(i0 + block_m, Sq)
        Br = i1 - i0
        Q_i = q[:, :, i0:i1].float().reshape(B, Hkv, G, Br, D)
        m_i = torch.full((B, Hkv, G, Br), float("-inf"), device=q.device)
        l_i = torch.zeros_like(m_i)
        O_i = torch.zeros(B, Hkv, G, Br, D, device=q.device)
        n_end = min(Skv, i1 + off) if causal else Skv                      # key tiles past the diagonal: skipped
        for j0 in range(0, n_end, block_n):                                # inner loop over K_j, V_j
            j1 = min(j0 + block_n, Skv)
            K_j = k[:, :, None, j0:j1].float()                             # [B, Hkv, 1, Bc, D]: shared by G heads
            V_j = v[:, :, None, j0:j1].float()
            S_ij = torch.matmul(Q_i, K_j.transpose(-1, -2)) * scale        # S = scale * Q K^T
            if causal and j1 - 1 > i0 + off:                               # diagonal tile: element mask
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                S_ij = S_ij.masked_fill(cols > rows + off, float("-inf"))
            m_new = torch.maximum(m_i, S_ij.amax(dim=-1))                  # m_new = max(m, rowmax(S))
            m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            P_ij = torch.exp(S_ij - m_safe[..., None])                     # P = exp(S - m_new)
            alpha = torch.exp(m_i - m_safe)                                # alpha = exp(m_old - m_new)
            l_i = alpha * l_i + P_ij.sum(dim=-1)                           # l = alpha l + rowsum(P)
            O_i = alpha[..., None] * O_i + torch.matmul(P_ij, V_j)         # O = alpha O + P V
            m_i = m_new
        O_i = O_i / torch.where(l_i > 0, l_i, torch.ones_like(l_i))[..., None]   # O = O / l; empty rows stay 0
        o[:, :, i0:i1] = O_i.reshape(B, Hq, Br, D).to(q.dtype)
        lse[:, :, i0:i1] = (m_i + torch.log(l_i)).reshape(B, Hq, Br)            # lse = m + log(l)
    return o, lse
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# The same check as exercise 01, now also checking `lse` (`expect_lse=True`). It draws inputs for a
# configuration, calls your function on non-contiguous views and compares with a float64 reference; when it
# fails it names the wrong rows and heads and the likely cause. Try other block sizes yourself:
# `check_entry_point(lambda q, k, v, **kw: tiled_attention(q, k, v, block_m=16, block_n=32, **kw), "ragged", expect_lse=True)`.

# %% nbgrader={"grade": true, "grade_id": "test_small", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_entry_point(tiled_attention, "small", expect_lse=True)
check_entry_point(tiled_attention, "small", expect_lse=True, scale=0.05)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_small", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "visible_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The visible cases: each classic bug of a tiled attention fails one of them (a missing alpha
# rescale, top-left causal when Sq != Skv, a skipped last partial tile, rows that see no key, ...).
# It stops at the first failure with the check's message.
check_visible(tiled_attention, "04")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below are graded with inputs you do not see. Passing the visible cases is necessary, not sufficient: think
# about `Sq != Skv`, rows that see no key, GQA head mapping, lengths that are no multiple of a block, and
# which tiles you compute. Every configuration named here works with `check_entry_point` too.

# %% nbgrader={"grade": true, "grade_id": "test_medium", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "medium"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_medium", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_large", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "large"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_large", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "noncausal"
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_asymmetric", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: configuration "asymmetric" (Sq = 128 new queries against Skv = 2048 keys)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_asymmetric", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_ragged", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: ragged lengths (no multiple of any block)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_ragged", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_decode", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: decode (Sq = 1 against a KV cache)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_decode", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_empty_rows", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: Sq > Skv, causal: rows that see no key
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_empty_rows", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_d64", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: head dimension 64
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_d64", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_mqa", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: multi-query attention (one KV head)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_mqa", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_overflow", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: logits in the hundreds
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_overflow", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_edge_strides", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: contiguous inputs, and views whose rows are twice D apart
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_edge_strides", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_block_sizes", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: the result does not depend on (block_m, block_n)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_block_sizes", tiled_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_tile_skipping", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: causal tiles above the diagonal are skipped (counted with PyTorch's FLOP counter)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_tile_skipping", tiled_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "question_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Written answer (2 points, graded by your instructor)
#
# (a) For a causal problem with $S_q = S_{kv} = N$ and $B_r = B_c = B$ ($T = N/B$ tiles each way), how many tiles
# does your loop compute, how many need the element mask, and what fraction of the work of all $T^2$ tiles is
# that for $N = 1024$, $B = 64$? (b) Why does FlashAttention-2 put the loop over $Q_i$ outside: name two
# things that the FA1 order (outer loop over $K_j, V_j$) costs on a GPU. (c) With $S_q = 128$ new queries
# against a cache of $S_{kv} = 2048$ keys, what goes wrong with a top-left causal mask ($j \le i$)?

# %% [markdown] nbgrader={"grade": true, "grade_id": "written_tiled_attention", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# (a) Query tile $i$ (0-based) computes key tiles $0..i$: $T(T+1)/2$ tiles in all, of which the $T$ on the
# diagonal need the element mask and $T(T-1)/2$ need none. For $N = 1024$, $B = 64$: $T = 16$, 136 of 256 tiles,
# about 53% of the work (the exact causal count is $N(N+1)/2$ pairs, about 50%).
# (b) In the FA1 order each inner step updates a different $O_i, m_i, \ell_i$, so they must be read from and
# written back to HBM on every step ($T_c$ times each) instead of living in registers/SRAM and being
# written once; and the parallel work units are key tiles, whose contributions to the same $O_i$ collide
# (needing atomics or a second reduction), whereas FA2's query tiles are independent thread blocks that
# write disjoint outputs (more parallelism over the sequence when batch × heads is small). FA2 also
# rescales $O_i$ by $1/\ell_i$ once at the end instead of at every step (fewer non-matmul FLOPs).
# (c) Top-left would let query $i$ see only keys $0..i$, i.e. the first 128 keys of the cache: the new
# tokens (keys 1920..2047 in the bottom-right picture) would attend to stale prefix positions and never to
# themselves, and the last query, which should see all 2048 keys, would see 128. Bottom-right aligns the
# last query with the last key: query $i$ sees $j \le i + 1920$.
#
# === BEGIN MARK SCHEME ===
# 2 points in all:
# - 0.5: (a) T(T+1)/2 = 136 computed, T = 16 masked, ~53% (accept 136/256; 0.25 if only "about half").
# - 1.0: (b) any two of: O_i/m_i/l_i read and written to HBM on every inner step (vs once); parallel units
#   collide on the same O rows (atomics / synchronisation) vs independent query tiles; less parallelism over
#   the sequence for small batch*heads; per-step rescale by 1/l (extra non-matmul FLOPs). 0.5 each.
# - 0.5: (c) queries see the wrong (oldest) keys: query i must see j <= i + Skv - Sq; the last query must see
#   the whole cache. 0.25 for "it is the wrong mask" without saying which keys.
# === END MARK SCHEME ===
# ### END SOLUTION
