"""v1: all-gather K and V, then attend locally: no ring at all (Llama 3's context parallelism).

v1 verdict: all-gather K and V, then one causal call per local query chunk against the keys before
it: 1.77x one GPU at 64k, 1.84x at 128k (2 x H200, causal, fp16), each rank waiting 2.5-5 ms for the
gather it cannot overlap.

Every rank gathers every rank's K and V shard (one all_gather of K and V stacked, each shard padded
to the longest: all_gather moves equal sizes), puts the rows back in global order, and attends its
own query rows to them. Causal: each local query chunk [a, b) sees exactly the keys [0, b), and
bottom-right causal masking of those b keys against the chunk's b - a rows is that visibility
(key j visible to the chunk's row i - a iff j <= (i - a) + b - (b - a) = i): one kernel call per
chunk, two on the zigzag layout (the rule's default, so the work is balanced).

What it costs: the whole sequence's K and V on every rank (memory grows with S, not S / P), and the
gather must finish before the first block starts: nothing overlaps it. Llama 3 accepts that for
GQA models, where K and V are a fraction of Q's size (Dubey et al., "The Llama 3 Herd of Models",
2024, on context parallelism). v2 passes shards around a ring instead.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from ring_common import attend, join_ring, mark, run_standalone  # noqa: E402


def gather_sequence(k, v, ring):
    """The global K and V [B, Hkv, S, D], in global order, from every rank's shard."""
    longest = max(ring.rows(r) for r in range(ring.world))
    mine = k.new_zeros(2, *k.shape[:2], longest, k.shape[3])
    mine[0, :, :, :k.shape[2]], mine[1, :, :, :k.shape[2]] = k, v
    parts = [torch.empty_like(mine) for _ in range(ring.world)]
    dist.all_gather(parts, mine, group=ring.group)
    kv = k.new_empty(2, *k.shape[:2], ring.S, k.shape[3])
    for r, part in enumerate(parts):
        row = 0
        for a, b in ring.chunks(r):
            kv[:, :, :, a:b] = part[:, :, :, row:row + b - a]
            row += b - a
    return kv[0], kv[1]


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    """This rank's rows of attention over the whole sequence: (o in q's dtype, lse float32)."""
    ring = join_ring(q, causal, group)
    K, V = gather_sequence(k, v, ring)
    mark("wait")
    if not causal:
        o, lse = attend(q, K, V, False, scale)
    else:
        parts, row = [], 0
        for a, b in ring.chunks(ring.rank):                 # Q chunk [a, b) sees keys [0, b)
            parts.append(attend(q[:, :, row:row + b - a], K[:, :, :b], V[:, :, :b], True, scale))
            row += b - a
        o, lse = (torch.cat(t, dim=2) for t in zip(*parts))
    mark("compute")
    return o, lse


if __name__ == "__main__":
    run_standalone(ring_attention)
