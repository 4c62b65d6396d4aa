"""v3: the ring with the next shard's transfer posted before the compute on the current one.

v3 verdict: the next shard's isend/irecv posted before the compute, waited on after: no wait left
(0.00 ms), but contiguous chunks leave rank 1 three times rank 0's causal work: 1.28-1.32x one GPU
(2 x H200, causal 64k and 128k).

v2's ring, with each step's send and receive posted together (dist.batch_isend_irecv) before the
blocks of that step start, and waited on after them: the transfer of shard t + 1 runs while shard t
is computed, so a step costs max(compute, transfer) rather than their sum. On a GPU the NCCL kernels
run on their own stream beside the attention kernels; waiting makes the compute stream wait for the
received shard, which costs nothing when it arrived during the compute. The received shard needs its
own buffer (the one being sent is still read by the compute): two shards per rank.

Still the contiguous layout: causal work is unbalanced. Rank r computes r full blocks and one
diagonal block (half the work of a full one), so on 2 ranks the last one has 3 of the 4 half-blocks
of work and the first waits for it: v4 balances it.
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from ring_common import Accumulator, attend, join_ring, mark, post_exchange, run_standalone  # noqa: E402

LAYOUT = "contiguous"


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    """This rank's rows of attention over the whole sequence: (o in q's dtype, lse float32)."""
    ring = join_ring(q, causal, group, LAYOUT)
    k, v = k.contiguous(), v.contiguous()
    for step in range(ring.world):
        src = ring.source(step)
        last = step == ring.world - 1
        if not last:                                        # shard t + 1 travels during step t
            incoming = post_exchange(ring, k, v, ring.rows(ring.source(step + 1)))
        if src == ring.rank:                                # own shard, first: the diagonal block
            acc = Accumulator(attend(q, k, v, causal, scale))
        elif not causal or src < ring.rank:                 # keys before every query: no mask
            acc.add(slice(None), attend(q, k, v, False, scale))
        mark("compute")                                     # (a later rank's keys: nothing to do)
        if not last:
            k, v = incoming()
            mark("wait")
    return acc.result(q.dtype)


if __name__ == "__main__":
    run_standalone(ring_attention, layout=LAYOUT)
