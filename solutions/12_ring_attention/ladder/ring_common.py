"""Step 12's support file (no rung): what the four ring attentions share.

- ``join_ring``: the rank's place in the ring (its rank, its neighbours) and the global sequence
  length, learnt with one all_reduce of the local lengths; from it, where every rank's chunks lie
  (facourse.ring's sharding rule: ``tensor_split`` chunks, zigzag for causal calls unless a rung
  names the contiguous layout).
- ``attend``: one (query rows, key rows) block through the course's single-device kernel: on a GPU
  step 05's solution (the Triton FlashAttention-2 forward, solutions/05_triton_flash_attention/
  step.toml), on a CPU facourse.ring.block_attention. Both return (o, lse) with bottom-right causal
  masking, so a block of queries against a prefix of keys ending where they end is one call.
- ``Accumulator``: partial results of the same rows merged in lse form (lecture 03's merge):
  lse = logaddexp(lse_a, lse_b), o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b, in float32.
- ``post_exchange``: the next shard's send and receive posted as one batch (v3, v4).
- ``mark``: where a ring step's phases end, for the probe benchmarks/ladder.py installs to show
  how long each step computes and how long it then waits for the next shard.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch
import torch.distributed as dist

from facourse.ring import block_attention, chunk_bounds, layout_of, n_chunks, rank_chunks

#: Set by benchmarks/ladder.py to a function of one label; None (nothing recorded) otherwise.
PROBE = None


def mark(what: str) -> None:
    """The end of a phase of a ring step: "compute" (the step's blocks) or "wait" (the next shard)."""
    if PROBE is not None:
        PROBE(what)


# ----------------------------------------------------------------------------- the ring
@dataclass(frozen=True)
class Ring:
    """One rank's view of the ring: ``prev`` and ``next`` are global ranks (what P2P calls take)."""
    rank: int
    world: int
    prev: int
    next: int
    group: object
    S: int
    causal: bool
    layout: str

    def chunks(self, r: int) -> list[tuple[int, int]]:
        """The global [start, end) rows of rank r's chunks, in its local order."""
        bounds = chunk_bounds(self.S, n_chunks(self.world, self.causal, self.layout))
        return [bounds[c] for c in rank_chunks(self.world, r, self.causal, self.layout)]

    def lengths(self, r: int) -> list[int]:
        """The row counts of rank r's chunks, in its local order."""
        return [b - a for a, b in self.chunks(r)]

    def rows(self, r: int) -> int:
        return sum(self.lengths(r))

    def source(self, step: int) -> int:
        """Whose K/V a rank holds at ``step``: shards travel from rank r to rank r + 1."""
        return (self.rank - step) % self.world


def join_ring(q: torch.Tensor, causal: bool, group=None, layout: str | None = None) -> Ring:
    """The rank's ring; the global length is the sum of the local ones (one tiny all_reduce)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    n = torch.tensor([q.shape[2]], dtype=torch.int64, device=q.device)
    dist.all_reduce(n, group=group)

    def global_rank(r):
        return r if group is None else dist.get_global_rank(group, r)

    return Ring(rank, world, global_rank((rank - 1) % world), global_rank((rank + 1) % world), group,
                int(n.item()), causal, layout_of(causal, layout))


def post_exchange(ring: Ring, k: torch.Tensor, v: torch.Tensor, rows: int):
    """Post the send of (k, v) to the next rank and the receive of the previous rank's shard
    (``rows`` rows) as one batch, without waiting; returns ``wait() -> (k, v)`` of the received."""
    k_in = k.new_empty(*k.shape[:2], rows, k.shape[3])
    v_in = v.new_empty(*v.shape[:2], rows, v.shape[3])
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, ring.next, ring.group),
                                   dist.P2POp(dist.isend, v, ring.next, ring.group),
                                   dist.P2POp(dist.irecv, k_in, ring.prev, ring.group),
                                   dist.P2POp(dist.irecv, v_in, ring.prev, ring.group)])

    def wait():
        for r in reqs:
            r.wait()
        return k_in, v_in

    return wait


# ----------------------------------------------------------------------------- one block
@functools.cache
def _step05_kernel():
    """Step 05's solution, ``flash_attention_triton(q, k, v, causal, scale) -> (o, lse)``, loaded by path."""
    from facourse.steps import solution_path
    path = solution_path("05")
    spec = importlib.util.spec_from_file_location("ring_block_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.flash_attention_triton


def block_kernel(device: torch.device):
    """The single-device kernel of this device: step 05's Triton kernel on a GPU, the CPU's block_attention."""
    return _step05_kernel() if device.type == "cuda" else block_attention


def attend(q, k, v, causal: bool, scale):
    """(o, lse) of query rows q against key rows k, v, bottom-right causal when ``causal`` (both
    kernels give a block with no query or no key its rows' o = 0, lse = -inf)."""
    return block_kernel(q.device)(q, k, v, causal=causal, scale=scale)


# ----------------------------------------------------------------------------- merging partials
class Accumulator:
    """The running (o, lse) of the rank's rows, in float32. The first partial covers every row (a
    rank's first step is its own shard, whose keys every row attends to); ``add`` merges the others."""

    def __init__(self, part):
        self.o, self.lse = part[0].float(), part[1]

    def add(self, rows: slice, part) -> None:
        o_b, lse_b = part
        o_a, lse_a = self.o[:, :, rows], self.lse[:, :, rows]
        lse = torch.logaddexp(lse_a, lse_b)                     # lse = log(e^lse_a + e^lse_b)
        safe = lse.masked_fill(torch.isneginf(lse), 0.0)        # rows that have seen no key: weights 0
        w_a, w_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
        o_a.mul_(w_a.unsqueeze(-1)).add_(o_b * w_b.unsqueeze(-1))   # o = w_a o_a + w_b o_b
        lse_a.copy_(lse)

    def result(self, dtype: torch.dtype):
        """(o in ``dtype``, lse float32)."""
        return self.o.to(dtype), self.lse


# ----------------------------------------------------------------------------- run on its own
def run_standalone(ring_attention, **check) -> None:
    """``python vN_....py``: every ring case, on CPU ranks (gloo), through facourse.ring.check_ring."""
    from facourse.ring import RING_CASES, check_ring
    for case in RING_CASES:
        check_ring(ring_attention, case, **check)
