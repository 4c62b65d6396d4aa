"""Step 12: attention over a sequence split across ranks (ring attention), on ``torch.distributed``.

Each of P ranks holds a shard of the rows of q, k and v (the sequence axis, dim 2 of
[B, H, S, D]); a ring attention ``ring_attention(q, k, v, causal=False, scale=None, group=None)``
returns the rank's rows of the full attention, ``(o, lse)``, passing K/V shards from rank to rank
(Liu et al., "Ring Attention with Blockwise Transformers", 2023).

The sharding rule (what rank r holds), the one the exercise states:

* the sequence is cut as ``torch.tensor_split`` cuts it: S rows into n chunks whose lengths differ
  by at most one, the first ``S mod n`` one row longer. Nothing is padded: a padded key would be
  seen by every query of a non-causal call.
* non-causal: n = P chunks, rank r holds chunk r;
* causal: zigzag, n = 2P chunks, rank r holds chunk r followed by chunk 2P - 1 - r, so that every
  rank has as many causal (query, key) pairs to compute as every other (the balance Llama 3's
  context parallelism and the ring-flash-attention project get the same way).
* with ``group``, r and P are the rank in the group and the group's size: the ring runs over the
  group's ranks only, and point-to-point calls name a peer by its global rank
  (``dist.get_global_rank(group, r)``). A case with ``groups`` runs several disjoint rings at once in
  one world, ring g on batch element g.

What runs the ranks here: :func:`run_ring` forks one process per rank on this machine, joins them
in a ``gloo`` group, gives each its shards, and gathers the outputs into the global order; a rank
that raises or a world that does not finish within a time limit (one still using the CPU runs on a
while) is stopped and named, with the line where each rank waits, so that a deadlock costs its time
limit and never hangs a notebook or the grader; a world whose ranks never joined their group is the
machine's failure and starts again.
:func:`on_ring` turns a ring attention into an ordinary attention function of global q, k, v (what
the check calls), and :func:`check_ring` checks it with the course's one rule, naming the ranks and
chunks whose rows are wrong and, where it recognises one, the ring mistake that gives exactly this
output.
"""
from __future__ import annotations

import io
import os
import re
import time
from dataclasses import dataclass

import torch

from .configs import AttnConfig, make_inputs
from .reference import default_scale, masked_attention, reference_attention, torch_attention
from .rule import (AttentionCheckError, Mistake, check_lse, compare, describe_rows, diagnose, draw_seed,
                   expect_tensor, guarded_call, is_collecting, make_tag, max_abs, normalise_result, ranges, say)


# the sharding rule and the ranks (re-exported: the exercise and the tests import them from here)
from .ring_ranks import (chunk_bounds, LAYOUTS, layout_of, rank_chunks, n_chunks, shard_index, shard, unshard,
                        RingError, DEFAULT_TIMEOUT, OFF_RING, OUTSIDE, RingRun, EXTRA_SECONDS, SETUP_RETRIES,
                        check_groups, rings_of, ring_shards, run_ring, GROUP_IGNORED, GLOBAL_PEERS, on_ring,
                        traffic_table)  # noqa: F401

# ----------------------------------------------------------------------------- the cases
#: A rank may pass a few numbers through collectives (its length: S is their sum); more is K/V.
COLLECTIVE_ALLOWANCE = 1024


def check_group_use(table: torch.Tensor, world: int, tag: str, groups=None) -> None:
    """Every operation of a rank ran on its ring's process group (``group=``), not on the world's: checked
    before the rows, since ranks that ignored ``group`` mix the rings' data."""
    if is_collecting():
        return
    for ring in rings_of(world, groups):
        for r in ring:
            n = int(table[r][3]) if table.shape[1] > 3 else 0
            if n > 0:
                raise AttentionCheckError(
                    f"{tag} rank {r} ran {n} operation(s) on a process group other than the `group` it was given "
                    f"(ranks {', '.join(map(str, ring))} of a world of {world}).\n  likely cause: {GROUP_IGNORED}")


def check_traffic(table: torch.Tensor, k: torch.Tensor, world: int, causal: bool, tag: str, groups=None) -> None:
    """K and V went round the ring point to point: each rank sent and received (at least) the other
    ranks' shards, only to its neighbours on its ring, all on its ring's group, and no rank moved more
    than a few numbers through collectives. Nothing is checked while collecting (the judge checks the
    recorded table)."""
    if is_collecting():
        return
    check_group_use(table, world, tag, groups)
    rings = rings_of(world, groups)
    kv = 2 * k.element_size() * (k.shape[0] // len(rings)) * k.shape[1] * k.shape[3]   # bytes of K and V per row
    S = k.shape[2]
    for i, r, ring in ((i, r, ring) for ring in rings for i, r in enumerate(ring)):
        P = len(ring)
        p2p, coll, off = (float(x) for x in table[r][:3])
        if off > 0:
            cause = ("K and V were sent to every rank, an all-gather built of sends: the ring passes each shard to "
                     "the next rank only, world_size - 1 times, so that a rank holds two shards at a time")
            if groups is not None:
                cause = f"peers named by their rank in the group: {GLOBAL_PEERS}. Or {cause}"
            raise AttentionCheckError(
                f"{tag} rank {r} exchanged {off / 1e6:.3g} MB point to point with ranks that are not its neighbours "
                f"on the ring (ranks {ring[(i - 1) % P]} and {ring[(i + 1) % P]}).\n  likely cause: {cause}")
        if coll > COLLECTIVE_ALLOWANCE:
            raise AttentionCheckError(
                f"{tag} rank {r} moved {coll / 1e6:.3g} MB through collectives (all_gather, broadcast, ...).\n"
                "  likely cause: K and V were gathered; this step's ring passes each shard to the next rank "
                "with point-to-point operations (dist.isend / dist.irecv, or dist.batch_isend_irecv), so that "
                "a rank holds two shards at a time and never the whole sequence. Only the lengths (a few "
                "numbers) may go through a collective")
        others = S - len(shard_index(S, P, i, causal))
        if P > 1 and p2p < others * kv:
            raise AttentionCheckError(
                f"{tag} rank {r} passed {p2p / 1e6:.3g} MB point to point, less than the "
                f"{others * kv / 1e6:.3g} MB of the other ranks' K and V it must receive.\n"
                "  likely cause: the shards did not travel the whole ring (world_size - 1 transfers)")


@dataclass(frozen=True)
class RingCase:
    name: str
    cfg: AttnConfig
    world: int
    groups: tuple[tuple[int, ...], ...] | None = None      # rings over subgroups (run_ring), ring g on batch g

    @property
    def ring_size(self) -> int:
        return len(rings_of(self.world, self.groups)[0])

    def describe(self) -> str:
        if self.groups is None:
            return f"{self.name}: {self.world} ranks, {self.cfg.describe()}"
        rings = " and ".join("{" + ", ".join(map(str, g)) + "}" for g in self.groups)
        return (f"{self.name}: {len(self.groups)} rings at once in a world of {self.world} ranks, group = ranks "
                f"{rings} (ring g on batch element g), {self.cfg.describe()}")


def _case(name, world, B, Hq, Hkv, S, causal, D=128, groups=None):
    return RingCase(name, AttnConfig(name, B, Hq, Hkv, S, S, D, causal), world, check_groups(world, groups))


#: The graded cases (CPU sizes, gloo): two and four ranks, causal (zigzag) and not, GQA and MQA,
#: sequences that do not divide (three ranks), a sequence shorter than the chunks (empty chunks).
RING_CASES: dict[str, RingCase] = {c.name: c for c in (
    _case("w2_noncausal", 2, 1, 8, 2, 512, False),
    _case("w2_causal", 2, 1, 8, 2, 512, True),
    _case("w4_noncausal", 4, 1, 8, 2, 512, False),
    _case("w4_causal", 4, 1, 8, 2, 512, True),
    _case("w3_ragged", 3, 1, 4, 2, 500, True),
    _case("w3_ragged_noncausal", 3, 1, 4, 2, 301, False),
    _case("w2_mqa", 2, 2, 4, 1, 333, True),
    _case("w4_short", 4, 1, 4, 2, 7, True),
    # two rings at once: a rank that uses the world's ranks, or names peers by group rank, meets the other ring
    _case("w4_two_rings", 4, 2, 4, 2, 96, True, D=32, groups=((0, 2), (1, 3))),
)}


def get_ring_case(case) -> RingCase:
    if isinstance(case, RingCase):
        return case
    if case not in RING_CASES:
        raise KeyError(f"unknown ring case {case!r}; the cases: {', '.join(RING_CASES)}")
    return RING_CASES[case]


# ----------------------------------------------------------------------------- diagnosis
def _owners(S: int, world: int, causal: bool, layout: str | None = None):
    """For each global row: its rank, its chunk, and the position it would have if the rank's
    shard were read as one contiguous range."""
    n = n_chunks(world, causal, layout)
    owner, chunk, as_contiguous = (torch.empty(S, dtype=torch.long) for _ in range(3))
    for c, (a, b) in enumerate(chunk_bounds(S, n)):
        chunk[a:b] = c
    bounds = chunk_bounds(S, world)
    for r in range(world):
        idx = shard_index(S, world, r, causal, layout)
        owner[idx] = r
        as_contiguous[idx] = bounds[r][0] + torch.arange(len(idx))
    return owner, chunk, as_contiguous


def _unweighted_sum(q, k, v, scale, visible, groups):
    """Each row's attention over each group of keys, the partial outputs summed without weights."""
    idx = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    s = torch.matmul(q.to(torch.float64), k.to(torch.float64).index_select(1, idx).transpose(-1, -2)) * scale
    V = v.to(torch.float64).index_select(1, idx)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for g in groups.unique().tolist():
        sg = s.masked_fill(~(visible & (groups[None, :] == g)), float("-inf"))
        out += torch.matmul(torch.nan_to_num(torch.softmax(sg, dim=-1), nan=0.0), V)
    return out


def ring_mistakes(q, k, v, causal: bool, scale, world: int, layout: str | None = None) -> list[Mistake]:
    """The ring mistakes the check recognises, each with the output it gives on the global inputs."""
    S, Hq, Hkv = q.shape[2], q.shape[1], k.shape[1]
    s = default_scale(q.shape[-1], scale)
    owner, chunk, as_contig = _owners(S, world, causal, layout)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    visible = (j <= i) if causal else torch.ones(S, S, dtype=torch.bool)

    def seeing(mask):
        return lambda: {"o": masked_attention(q, k, v, s, mask)}

    last = (owner[:, None] + 1) % world         # the shard that reaches rank r on the last step
    out = [Mistake("the shard that arrives on the last step is never used: each rank must attend to all "
                   f"{world} shards (its own and {world - 1} received), so the loop runs world_size steps, "
                   "computing on the shard in hand before (or while) it is passed on, the last one too",
                   seeing(visible & (owner[None, :] != last))),
           Mistake("each rank attended only to its own shard: the K/V received from the ring never entered the "
                   "result", seeing(visible & (owner[None, :] == owner[:, None])))]
    if causal and layout_of(causal, layout) == "zigzag":
        # reading the shards as contiguous rows and the contiguous layout's skip rule by ranks (a lower
        # rank's shard wholly visible, a higher one's skipped, one's own causal) give the same output
        out.append(Mistake(
            "the zigzag shards were read as contiguous ones, with the contiguous layout's skip rule: a lower "
            "rank's shard taken as wholly visible and a higher rank's skipped, as if rank r held rows "
            "[r*S/P, (r+1)*S/P). With zigzag, rank r holds chunks r and 2P-1-r of 2P (torch.tensor_split's "
            "chunks), so every other rank's shard is partly before and partly after yours: decide chunk pair by "
            "chunk pair, in global positions (a key chunk before the query chunk is visible, the same chunk is "
            "the causal diagonal, a later one is skipped)", seeing(as_contig[None, :] <= as_contig[:, None])))
    merge = ("the partial results were added without their weights: merging (o_a, lse_a) with (o_b, lse_b) "
             "gives lse = logaddexp(lse_a, lse_b) and o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b "
             "(lecture 03's merge, in lse form); a block in which a row sees no key has lse = -inf, weight 0")
    out.append(Mistake(merge, lambda: {"o": _unweighted_sum(q, k, v, s, visible, owner)}))
    if causal:
        out.append(Mistake(merge, lambda: {"o": _unweighted_sum(q, k, v, s, visible, chunk)}))
        out.append(Mistake("the causal mask is missing: every query sees every key of every shard",
                           lambda: {"o": reference_attention(q, k, v, False, s)[0]}))
    if Hkv > 1 and Hq != Hkv:
        out.append(Mistake(f"query head h reads KV head h % Hkv; with GQA it must read h // (Hq // Hkv) = "
                           f"h // {Hq // Hkv}", lambda: {"o": reference_attention(
                               q, k, v, causal, s, head_map=torch.arange(Hq) % Hkv)[0]}))
    out.append(Mistake("the softmax scale is missing: multiply Q Kᵀ by scale (default 1/sqrt(D))",
                       lambda: {"o": reference_attention(q, k, v, causal, 1.0)[0]}))
    if scale is not None:
        out.append(Mistake("the scale argument was ignored: 1/sqrt(D) was used instead",
                           lambda: {"o": reference_attention(q, k, v, causal, None)[0]}))
    return out


def where_ranks(bad_rows: torch.Tensor, S: int, world: int, causal: bool, layout: str | None = None,
                groups=None) -> str:
    """The one describer of a ring's result: the wrong rows and heads, then the ranks that hold them with
    their chunks and rows ('the wrong rows are held by rank 1 (chunks 1, 2: rows 250-499, 500-749)').
    With ``groups`` (``world`` the size of one ring), the global ranks of the rings of the wrong batch elements."""
    bounds = chunk_bounds(S, n_chunks(world, causal, layout))
    owner = _owners(S, world, causal, layout)[0]
    bad = bad_rows.any(dim=(0, 1)) if bad_rows.dim() == 3 else bad_rows
    held = {(None, int(owner[r])) for r in torch.nonzero(bad.cpu()).flatten().tolist()}
    if groups is not None and bad_rows.dim() == 3:
        per = bad_rows.shape[0] // len(groups)          # batch elements per ring
        held = {(groups[int(b) // per], int(owner[r])) for b, _, r in torch.nonzero(bad_rows.cpu()).tolist()}
    parts = []
    for ring, r in sorted(held, key=lambda x: (x[0] or (), x[1])):
        chunks = rank_chunks(world, r, causal, layout)
        rows = ", ".join(f"{bounds[c][0]}-{bounds[c][1] - 1}" for c in chunks if bounds[c][1] > bounds[c][0])
        who = f"rank {r}" if ring is None else f"rank {ring[r]} (rank {r} of group {{{', '.join(map(str, ring))}}})"
        parts.append(f"{who} (chunk{'s' if len(chunks) > 1 else ''} {', '.join(map(str, chunks))}: rows {rows})")
    held = "; ".join(parts) if parts else "no rank"
    return (f"{describe_rows(bad_rows)}\n  the wrong rows are held by {held}" if bad_rows.dim() == 3
            else f"the wrong rows are held by {held}")


# ----------------------------------------------------------------------------- the check
NAN_CAUSE = ("a block in which a row sees no key has lse = -inf: its merge weight exp(lse_part - lse) must be 0, "
             "and a row whose merged lse is still -inf keeps o = 0 (-inf - (-inf) is NaN); with logits in the "
             "hundreds, exp(lse) itself overflows: merge with weights exp(lse_part - max), the larger lse "
             "subtracted; or some rows were never written (the check fills new allocations with NaN)")


def check_ring_result(o, lse, q, k, v, causal: bool, scale, world: int, *, layout: str | None = None,
                      tag: str = "", groups=None) -> str:
    """The course's rule on a ring's gathered ``(o, lse)`` of the global q, k, v: finite, within twice
    PyTorch's own rounding (+1e-3), 1% relative; lse close. Raises :class:`AttentionCheckError` naming the
    ranks that hold the wrong rows and the ring mistake that gives this output. Returns the summary.
    ``world`` is the size of one ring; with ``groups`` (rings of global ranks, ring g on batch element g)
    the ranks named are global."""
    if is_collecting():
        return ""
    expect_tensor(o, q, name="o", like_name="q", tag=tag, shape_note=" = [B, Hq, S, D]")      # lse: check_lse
    ref, ref_lse = reference_attention(q, k, v, causal, scale)
    cmp = compare(o, ref, lambda: max_abs(torch_attention(q, k, v, causal, scale).to(torch.float64) - ref),
                  name="o", tag=tag, empty=torch.isneginf(ref_lse)[..., None])
    S = q.shape[2]
    if not cmp.ok:
        found = diagnose({"o": o}, {"o"}, ring_mistakes(q, k, v, causal, scale, world, layout), cmp.allowed)
        if cmp.failure == "values":
            raise cmp.error(found.cause if found else "compare one wrong rank's rows with "
                            "facourse.ring.block_attention on each shard it received: the chunks each rank holds "
                            "(the sharding rule), the causal test in global positions, the merge's weights",
                            where=where_ranks(cmp.bad_rows, S, world, causal, layout, groups),
                            index_names=("b", "h", "row", "d"))
        bad = cmp.nonfinite_rows if cmp.failure == "nonfinite" else cmp.not_empty_rows
        what = "NaN or inf in o" if cmp.failure == "nonfinite" else "rows that see no key must be exactly 0"
        raise AttentionCheckError(f"{tag} {what} at {where_ranks(bad, S, world, causal, layout, groups)}\n  "
                                  f"likely cause: {found.cause if found else NAN_CAUSE}")
    if cmp.ref_max < 10 * cmp.allowed:
        raise AttentionCheckError(f"{tag} the inputs are degenerate (max|ref| = {cmp.ref_max:.3g}); draw them "
                                  "with facourse.make_inputs")
    lse_err = check_lse(lse, ref_lse, q, tag)
    return (f"{tag} passed: max|o-ref| {cmp.max_err:.2e} (allowed {cmp.allowed:.2e}), relative {cmp.rel:.2e}, "
            f"lse err {lse_err:.2e}")


def check_ring(fn, case="w2_causal", *, seed: int | None = None, dtype=None, timeout: float | None = None,
               distributed: bool = True, verbose: bool = True, layout: str | None = None,
               traffic: bool = False, scale=None, logit_scale: float = 1.0) -> RingRun | None:
    """Check a ring attention on one of :data:`RING_CASES` (CPU, gloo ranks), by the course's rule.

    ``fn`` is ``ring_attention(q, k, v, causal=False, scale=None, group=None)``, run on the case's
    ranks through :func:`on_ring`; with ``distributed=False`` it is already a function of the global
    q, k, v (the grader's recorded ring). Raises :class:`AttentionCheckError` (or :class:`RingError`)
    naming the ranks and rows that are wrong and the likely cause. Returns the :class:`RingRun`.
    A ``layout`` other than the rule's is for the solution ladder. With ``traffic`` the K/V must
    also have gone round the ring point to point, between neighbours (:func:`check_traffic`). ``logit_scale``
    multiplies q: logits in the hundreds, where a merge that does not subtract the larger lse overflows.
    A case with ``groups`` runs its rings at once, each rank given its ring's process group; with ``traffic``
    every operation must have run on that group (:func:`check_group_use`, checked before the rows).
    """
    c = get_ring_case(case)
    seed = draw_seed(seed)
    q, k, v = make_inputs(c.cfg, seed, "cpu", dtype)
    if logit_scale != 1.0:
        q = q * logit_scale
    call = on_ring(fn, c.world, timeout=timeout, layout=layout, traffic=traffic, groups=c.groups) if distributed else fn
    tag = make_tag(c.describe(), seed)
    result = guarded_call(call, q, k, v, device=q.device, tag=tag, inputs={"q": q, "k": k, "v": v},
                          causal=c.cfg.causal, scale=scale)
    if traffic:
        *result, table = result
        check_group_use(table, c.world, f"[{c.describe()}]", c.groups)
    o, lse = normalise_result(result, True, f"[{c.name}]")
    summary = check_ring_result(o, lse, q, k, v, c.cfg.causal, scale, c.ring_size, layout=layout, tag=tag,
                                groups=c.groups)
    if traffic:
        check_traffic(table, k, c.world, c.cfg.causal, f"[{c.describe()}]", c.groups)
    if verbose:
        say(summary)
    return getattr(call, "last_run", None)


def merge_inputs(seed: int = 0):
    """Two partial results of the same rows, (o_a, lse_a) and (o_b, lse_b), float32 [2, 4, 96, 64]:
    lse in the hundreds (exp(lse) overflows float32), and rows where one or both saw no key."""
    g = torch.Generator().manual_seed(int(seed))
    shape = (2, 4, 96)
    o_a, o_b = (torch.randn(*shape, 64, generator=g) for _ in range(2))
    lse_a, lse_b = (torch.randn(*shape, generator=g) * 60 for _ in range(2))
    lse_a[..., :16] = float("-inf")             # rows 0-15: a saw no key
    lse_b[..., 8:24] = float("-inf")            # rows 8-23: b saw no key (8-15: neither did)
    o_a[lse_a == float("-inf")] = 0.0
    o_b[lse_b == float("-inf")] = 0.0
    return o_a, lse_a, o_b, lse_b


def _merged(o_a, lse_a, o_b, lse_b, guard: bool = True):
    """The merge in float64; without ``guard``, the rows no part saw give -inf - (-inf) = NaN."""
    lse = torch.logaddexp(lse_a.double(), lse_b.double())
    safe = lse.masked_fill(torch.isneginf(lse), 0.0) if guard else lse
    return (torch.exp(lse_a.double() - safe)[..., None] * o_a.double()
            + torch.exp(lse_b.double() - safe)[..., None] * o_b.double()), lse


def check_merge_partials(fn, *, seed: int | None = None, verbose: bool = True) -> None:
    """Check ``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)``, the merge of two partial attentions of the
    same rows over disjoint keys, on :func:`merge_inputs`: o within 1e-4 of the float64 merge, lse
    within 2e-2 and -inf exactly where neither part saw a key."""
    seed = draw_seed(seed)
    parts = merge_inputs(seed)
    args = [t.clone() for t in parts]
    tag = f"[merge] (seed {seed})"
    result = guarded_call(fn, *args, tag=tag, inputs=dict(zip(("o_a", "lse_a", "o_b", "lse_b"), args)),
                          untouched="the merge must return new tensors")
    if is_collecting():
        return
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise AttentionCheckError(f"{tag} the merge returns the pair (o, lse)")
    o, lse = result
    o_ref, lse_ref = _merged(*parts)
    none = torch.isneginf(lse_ref)
    if tuple(o.shape) != tuple(o_ref.shape) or tuple(lse.shape) != tuple(lse_ref.shape):
        raise AttentionCheckError(f"{tag} o must have o_a's shape {tuple(o_ref.shape)} and lse lse_a's "
                                  f"{tuple(lse_ref.shape)}; got {tuple(o.shape)} and {tuple(lse.shape)}")
    cmp = {"o": compare(o, o_ref, 0.0, name="o", tag=tag, slack=1e-4, rel_limit=None),
           "lse": compare(lse, lse_ref, 0.0, name="lse", tag=tag, empty=none, empty_value=float("-inf"),
                          slack=2e-2, rel_limit=None, row_dim=None)}
    wrong = {n for n, c in cmp.items() if not c.ok}
    if not wrong:
        if verbose:
            print(f"{tag} passed: max|o - ref| {cmp['o'].max_err:.2e}")
        return
    o_a, lse_a, o_b, lse_b = parts
    unguarded = ("rows 8-15 saw no key in either part: their lse is -inf and their o must be 0; "
                 "-inf - (-inf) is NaN, so guard the subtraction where the merged lse is -inf")
    mistakes = [Mistake(unguarded, lambda: {"o": _merged(*parts, guard=False)[0]}),
                Mistake("o = o_a + o_b: the parts were added without their weights exp(lse_a - lse) and "
                        "exp(lse_b - lse)", lambda: {"o": o_a.double() + o_b.double()})]
    found = diagnose({"o": o, "lse": lse}, wrong, mistakes, {"o": 1e-4, "lse": 2e-2})
    if cmp["o"].failure == "nonfinite":
        rows = sorted({int(r) for r in torch.nonzero(cmp["o"].nonfinite_rows)[:, 2]})
        cause = (found.cause if found else unguarded if all(8 <= r < 16 for r in rows) else
                 "the merge exponentiates lse without subtracting the max: exp(lse) overflows float32 when lse is "
                 "in the hundreds (and underflows to 0 / 0 far below zero); weight each part by exp(lse_part - lse), "
                 "with lse = logaddexp(lse_a, lse_b), which is at most 1")
        raise AttentionCheckError(f"{tag} NaN or inf in o at rows {ranges(rows)}.\n  likely cause: {cause}")
    cause = (found.cause if found else
             "lse = logaddexp(lse_a, lse_b) and o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b"
             if "lse" in wrong else
             "o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b with lse = logaddexp(lse_a, lse_b)")
    raise AttentionCheckError(f"{tag} wrong merge: max|o - ref| = {cmp['o'].max_err:.3g}"
                              f"{'' if 'lse' not in wrong else ', and lse is wrong'}.\n  likely cause: {cause}")


def block_attention(q, k, v, causal: bool = False, scale=None):
    """The course's single-device kernel for one (query shard, key shard) block on a CPU: ``(o, lse)``
    with o in q's dtype and lse float32 [B, Hq, Sq]; causal is bottom-right aligned, and a row that
    sees no key gives o = 0, lse = -inf. On a GPU, use your own step-05 kernel instead."""
    o, lse = reference_attention(q, k, v, causal, scale, dtype=torch.float32)
    return o.to(q.dtype), lse
