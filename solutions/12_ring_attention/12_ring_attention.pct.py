# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import torch
import torch.distributed as dist

from facourse.ring import (RING_CASES, block_attention, check_merge_partials, check_ring, chunk_bounds,
                           merge_inputs, run_ring)

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 12 — ring attention: a sequence split across ranks
#
# You will write the ring of `course/12_ring_attention.ipynb`: a function that runs on **one rank** of a
# `torch.distributed` group, on that rank's shard of the sequence,
#
# `ring_attention(q, k, v, causal=False, scale=None, group=None) -> (o, lse)`
#
# and returns the rank's rows of the attention of the **whole** sequence, passing the K/V shards from
# rank to rank.
#
# **The contract.** Rank `r` of `P` (`dist.get_rank(group)`, `dist.get_world_size(group)`) holds
# `q [B, Hq, S_r, D]`, `k, v [B, Hkv, S_r, D]`: its rows of the global sequence of `S` rows (dimension 2).
# Query head `h` reads KV head `h // (Hq // Hkv)`; `scale` defaults to `1/sqrt(D)`; causal means that key
# `j` is visible to query `i` iff `j <= i`, in **global** positions. Return `o` (q's dtype, the rank's
# rows) and `lse` (float32 `[B, Hq, S_r]`, natural log, `-inf` for a row that sees no key).
#
# **The group.** The ring runs over the ranks of `group` (`None`: the whole world), which may be a part
# of the world while other rings run beside it: every collective and point-to-point call takes
# `group=group`, and a point-to-point call names its peer by its **global** rank: rank `j` of the group
# is `dist.get_global_rank(group, j)` (`j` itself when `group` is `None`).
#
# **The sharding rule** (the one the grader shards by; no padding). The sequence is cut as
# `torch.tensor_split` cuts it: `n` chunks whose lengths differ by at most one, the first `S mod n` one
# row longer (`chunk_bounds(S, n)` gives their `[start, end)`). Non-causal: `n = P`, rank `r` holds chunk
# `r`. Causal: **zigzag**, `n = 2P`, rank `r` holds chunk `r` followed by chunk `2P - 1 - r`, so that
# every rank has the same causal work. A rank knows only its own length; the global `S` is the sum of
# the lengths (one `dist.all_reduce` of a one-element tensor: the only collective allowed).
#
# **What is graded** (11 points, all on a CPU: each test starts the ranks as processes of this
# machine in a `gloo` group): the merge of two partial results (1); non-causal on 2 and 4 ranks, with a
# scale (2); causal on 2 and 4 ranks, also with logits in the hundreds and with a scale (3); lengths that
# do not divide, on 3 ranks (2); MQA, a sequence of 7 rows on 4 ranks (a chunk of 0 rows), and two rings
# at once in a world of 4 ranks, each over a `group` of 2 (2); bf16 (1). Results by the course's rule:
# no worse than twice PyTorch's own error in the same dtype (+1e-3), relative error below 1%. Every ring
# test also checks that K and V went **point to point**: no rank may move more than a few numbers
# through collectives (gathering K/V with `all_gather` is the lecture's other design, not this one), each
# exchanges K/V with its two neighbours on the ring only (sends to every rank are an all-gather too),
# every call runs on `group`, and each must receive the other ranks' shards. A ring whose ranks wait on
# each other fails its test after 30 s, and the notebook goes on.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_merge", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 1: merge two partial results
#
# Two partial attentions of the same rows over disjoint sets of keys, `(o_a, lse_a)` and `(o_b, lse_b)`
# (each `o` normalised over its own keys), merge into the attention over both sets (lecture 03's merge,
# written with `lse` instead of `(m, l)`):
#
# $$\text{lse} = \log\left(e^{\text{lse}_a} + e^{\text{lse}_b}\right), \qquad
# o = e^{\text{lse}_a - \text{lse}}\, o_a + e^{\text{lse}_b - \text{lse}}\, o_b .$$
#
# `o` tensors are `[B, H, S, D]` float32, `lse` tensors `[B, H, S]` float32. The `lse` can be in the
# hundreds (compute `lse` with `torch.logaddexp`, never `exp(lse_a)`), and a part in which a row saw no key
# has `lse = -inf` and `o = 0`; when neither part saw a key the merged row is `o = 0`, `lse = -inf`, not
# NaN. Return new tensors.

# %% nbgrader={"grade": false, "grade_id": "merge", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_partials(o_a, lse_a, o_b, lse_b):
    """Merge two partial attentions of the same rows over disjoint keys: (o, lse)."""
    # YOUR CODE HERE (about 4 lines)
    ### BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)   # rows that saw no key at all
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_merge", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_merge_partials(merge_partials)
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_merge", merge_partials)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_ring", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Your task, part 2: the ring
#
# 1. Learn `rank`, `P` and the global `S`; from the rule, the `[start, end)` of the chunks each rank holds.
# 2. Keep the rank's queries; start with its own K/V. For `P` steps: at step `t` the rank holds the K/V
#    shard of rank `(rank - t) mod P`. Before computing on it, post the pass to the next rank: send what
#    you hold to `(rank + 1) mod P` and receive into a new buffer from `(rank - 1) mod P` (its length is
#    known from the rule; both peers as global ranks, see the group above), with
#    `dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])`; wait on the
#    requests after computing (on a GPU the transfer then runs behind the compute).
#    Pass on every step but the last.
# 3. Compute on the shard in hand, chunk pair by chunk pair. With tensor_split chunks, a key chunk before
#    the query chunk is entirely visible (no mask), the same chunk is the causal diagonal (a square,
#    `causal=True`), and a key chunk after it is invisible: skip it. `block_attention(q, k, v, causal,
#    scale) -> (o, lse)` is the course's single-device kernel for one block on a CPU (on a GPU, your
#    step-05 kernel does the same); merge each block's result into the rank's rows with `merge_partials`,
#    starting from `o = 0`, `lse = -inf`.
# 4. Return `o` in q's dtype and `lse`.
#
# Deadlocks: a blocking `dist.send` waits for its `dist.recv`; if every rank sends (or receives) first,
# none proceeds. Every rank must also run the same number of steps. `run_ring(ring_attention, P, q, k, v,
# causal=...)` runs your function on `P` ranks of this machine and returns what each rank returned and
# printed (a print inside `ring_attention` comes back as `[rank r] ...`).

# %% nbgrader={"grade": false, "grade_id": "ring", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ring_attention(q, k, v, causal=False, scale=None, group=None):
    """This rank's rows (o, lse) of the attention of the whole sequence; K/V pass round the ring."""
    # YOUR CODE HERE (about 35 lines)
    ### BEGIN SOLUTION
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    total = torch.tensor([q.shape[2]])
    dist.all_reduce(total, group=group)
    n = 2 * P if causal else P
    bounds = chunk_bounds(int(total), n)

    def peer(r):                        # point-to-point calls take global ranks: rank r of the group's
        return r if group is None else dist.get_global_rank(group, r)

    def chunks(r):                      # [start, end) of rank r's chunks, in its local order
        return [bounds[c] for c in ((r, n - 1 - r) if causal else (r,))]

    B, Hq, S_r, D = q.shape
    o = torch.zeros(B, Hq, S_r, D, dtype=torch.float32)
    lse = torch.full((B, Hq, S_r), float("-inf"))
    kv = torch.stack([k, v])            # one buffer travels: K and V of one shard
    for t in range(P):
        src = (rank - t) % P
        pending = []
        if t < P - 1:
            rows = sum(e - s for s, e in chunks((src - 1) % P))
            incoming = kv.new_empty(2, B, k.shape[1], rows, D)
            pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, peer((rank + 1) % P), group),
                                              dist.P2POp(dist.irecv, incoming, peer((rank - 1) % P), group)])
        q0 = 0
        for qs, qe in chunks(rank):
            k0 = 0
            for ks, ke in chunks(src):
                diagonal = causal and (ks, ke) == (qs, qe)
                if qe > qs and ke > ks and (not causal or ke <= qs or diagonal):
                    rows_q = slice(q0, q0 + qe - qs)
                    ob, lb = block_attention(q[:, :, rows_q], kv[0][:, :, k0:k0 + ke - ks],
                                             kv[1][:, :, k0:k0 + ke - ks], diagonal, scale)
                    o[:, :, rows_q], lse[:, :, rows_q] = merge_partials(o[:, :, rows_q], lse[:, :, rows_q],
                                                                        ob.float(), lb)
                k0 += ke - ks
            q0 += qe - qs
        for req in pending:
            req.wait()
        if pending:
            kv = incoming
    return o.to(q.dtype), lse
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Test it
#
# `check_ring(fn, case)` draws the global inputs of one of `RING_CASES`, shards them by the rule, runs
# `fn` on the case's ranks and checks the gathered `(o, lse)` against a float64 reference. A failure
# names the ranks and chunks whose rows are wrong and, when it recognises one, the ring mistake: the last
# shard never used, the received K/V ignored, zigzag chunks read as contiguous, parts added without their
# weights, ranks waiting on each other. A case takes about a second.

# %% nbgrader={"grade": true, "grade_id": "test_causal", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_ring(ring_attention, "w2_causal", traffic=True)    # 2 ranks, zigzag: chunks 0 and 3, chunks 1 and 2
# hidden test: also on 4 ranks, with logits in the hundreds (q times 64) and with scale 0.05
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_causal", ring_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "hidden_md", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Hidden tests
#
# The cells below run with inputs you do not see. Try the same cases yourself: the keys of `RING_CASES`,
# e.g. `check_ring(ring_attention, "w3_ragged", traffic=True)`.

# %% nbgrader={"grade": true, "grade_id": "test_noncausal", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: non-causal on 2 ranks, and on 4 ranks with scale 0.05
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_noncausal", ring_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_ragged", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: 3 ranks, S = 500 causal (6 chunks of 83 or 84 rows) and S = 301 non-causal
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_ragged", ring_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_gqa_edges", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# hidden test: one KV head (MQA) on 2 ranks, 7 rows on 4 ranks (causal: 8 chunks, one of 0 rows), and two
# rings of 2 ranks at once in a world of 4 (group = ranks {0, 2} or {1, 3})
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_gqa_edges", ring_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_bf16", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# hidden test: causal on 2 ranks in bf16
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_bf16", ring_attention)
### END HIDDEN TESTS
