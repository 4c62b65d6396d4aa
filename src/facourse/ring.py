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

import faulthandler
import io
import multiprocessing
import os
import pickle
import re
import signal
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait as wait_any

import torch

from .configs import AttnConfig, make_inputs
from .errors import TeachingError
from .reference import default_scale, masked_attention, reference_attention, torch_attention
from .rule import (AttentionCheckError, Mistake, check_lse, compare, describe_rows, diagnose, draw_seed,
                   expect_tensor, guarded_call, is_collecting, make_tag, max_abs, normalise_result, ranges, say)


# ----------------------------------------------------------------------------- the sharding rule
def chunk_bounds(S: int, n: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``torch.tensor_split``'s n chunks of S rows (the first S mod n one longer)."""
    base, extra = divmod(S, n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


LAYOUTS = ("contiguous", "zigzag")


def layout_of(causal: bool, layout: str | None = None) -> str:
    """The rule's layout (zigzag for causal calls, contiguous otherwise) unless one is named; the
    solution ladder names ``contiguous`` for causal calls to show the imbalance zigzag removes."""
    if layout is None:
        return "zigzag" if causal else "contiguous"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    return layout


def rank_chunks(world: int, rank: int, causal: bool, layout: str | None = None) -> tuple[int, ...]:
    """The chunk indices rank ``rank`` holds, in its local order: (r,) of P chunks, or zigzag
    (r, 2P - 1 - r) of 2P chunks."""
    return (rank, 2 * world - 1 - rank) if layout_of(causal, layout) == "zigzag" else (rank,)


def n_chunks(world: int, causal: bool, layout: str | None = None) -> int:
    return 2 * world if layout_of(causal, layout) == "zigzag" else world


def shard_index(S: int, world: int, rank: int, causal: bool, layout: str | None = None) -> torch.Tensor:
    """The global row numbers of rank ``rank``'s local rows, in local order."""
    bounds = chunk_bounds(S, n_chunks(world, causal, layout))
    return torch.cat([torch.arange(*bounds[c]) for c in rank_chunks(world, rank, causal, layout)])


def shard(x: torch.Tensor, world: int, causal: bool, dim: int = 2, layout: str | None = None) -> list[torch.Tensor]:
    """The P local shards of a global tensor, cut along ``dim`` by the rule (each contiguous)."""
    S = x.shape[dim]
    return [x.index_select(dim, shard_index(S, world, r, causal, layout).to(x.device)).contiguous()
            for r in range(world)]


def unshard(parts: list[torch.Tensor], causal: bool, dim: int = 2, layout: str | None = None) -> torch.Tensor:
    """The global tensor back from the P shards :func:`shard` cut (their rows put back in order)."""
    world = len(parts)
    S = sum(p.shape[dim] for p in parts)
    order = torch.cat([shard_index(S, world, r, causal, layout) for r in range(world)])
    cat = torch.cat(list(parts), dim=dim)
    return cat.index_select(dim, torch.argsort(order).to(cat.device))


# ----------------------------------------------------------------------------- a world of ranks
class RingError(TeachingError):
    """A rank raised, or the ranks did not finish in time; the message names them and the cause."""


#: The wall-clock limit of one ring call (seconds) when none is given: the CPU cases take about one.
DEFAULT_TIMEOUT = 30.0

#: Collective operations of a process group, counted in every rank by :func:`run_ring`.
_COLLECTIVES = ("allgather", "allgather_into_tensor_coalesced", "_allgather_base", "allreduce",
                "allreduce_coalesced", "broadcast", "alltoall", "alltoall_base", "gather", "scatter",
                "reduce", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced")
_P2P = ("send", "recv", "recv_anysource")
#: Counted only as operations on a process group other than the rank's ring (they move no data).
_OTHER_OPS = ("barrier", "monitored_barrier")


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(x) for x in obj)
    return 0


#: The traffic entry of point-to-point bytes exchanged with a rank that is no neighbour on the ring (nor any peer,
#: for recv_anysource): an all-gather made of sends.
OFF_RING = "off_ring"
#: The traffic entry of operations (count, bytes) run on a process group whose ranks are not the rank's ring:
#: the world's group where the ring was given a subgroup (``group`` ignored).
OUTSIDE = "outside_group"


def _count_traffic(traffic: dict, rank: int, ring: list[int]) -> None:
    """Count every operation of every process group of this (forked) process: its kind and the bytes
    of the tensors it was given, the point-to-point bytes exchanged with a rank other than the two
    neighbours on ``ring`` (``OFF_RING``; peers in global ranks), and the operations on a process group
    whose ranks are not ``ring``'s (``OUTSIDE``). Patched on the class, so that however the rank's code
    reached torch.distributed (``dist.isend``, ``batch_isend_irecv``, a function imported early), it counts."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup

    i, P = ring.index(rank), len(ring)
    neighbours = {ring[(i + 1) % P], ring[(i - 1) % P]}

    def ranks_of(pg) -> list[int] | None:
        try:
            return dist.get_process_group_ranks(pg)
        except Exception:                       # a group torch.distributed does not know
            return None

    def counted(name, kind, method):
        def op(self, *args, **kwargs):
            members = ranks_of(self)
            nbytes = _nbytes(args[0]) if args and kind != "other" else 0
            if members != ring:
                out = traffic.setdefault(OUTSIDE, [0, 0])
                out[0] += 1
                out[1] += nbytes
            if kind != "other":
                entry = traffic.setdefault(name, [0, 0])
                entry[0] += 1
                entry[1] += nbytes
            if kind == "p2p":
                peer = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
                # the op takes the peer's rank in its group: compare global ranks
                if isinstance(peer, int) and members is not None and 0 <= peer < len(members):
                    peer = members[peer]
                if not isinstance(peer, int) or peer not in neighbours:
                    off = traffic.setdefault(OFF_RING, [0, 0])
                    off[0] += 1
                    off[1] += nbytes
            return method(self, *args, **kwargs)
        op.kind = kind
        return op

    for kind, names in (("collective", _COLLECTIVES), ("p2p", _P2P), ("other", _OTHER_OPS)):
        for name in names:
            method = getattr(ProcessGroup, name, None)
            if method is not None:
                setattr(ProcessGroup, name, counted(name, kind, method))


def _rank_main(fn, rank, world, store_path, q, k, v, causal, scale, conn, timeout, stage, stack_path, groups=None):
    """One rank, in a forked process: join the group, run ``fn`` on the shards, send the result.
    With ``groups``, every rank makes every ring's group and a member runs ``fn`` with its ring's
    (``group=``); a rank of no ring returns None at once. ``stage[rank]`` says how far it got (0 joining
    the group, 1 in ``fn``); SIGUSR1 writes its Python stack to ``stack_path`` (what :func:`run_ring`
    shows of a rank that does not return)."""
    import torch.distributed as dist

    stack_file = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    torch.set_num_threads(1)
    out = io.StringIO()
    traffic: dict = {}
    t0 = time.perf_counter()
    try:
        with redirect_stdout(out), redirect_stderr(out):
            store = dist.FileStore(store_path, world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout + EXTRA_SECONDS + 5))  # run_ring decides first
            group, ring = None, list(range(world))
            if groups is not None:
                # every rank makes every group, in one order: groups made by their members alone get the
                # same name, share their keys in the store and hang in new_group
                made = [dist.new_group(list(g)) for g in groups]
                mine = [j for j, g in enumerate(groups) if rank in g]
                group, ring = (made[mine[0]], list(groups[mine[0]])) if mine else (None, None)
            if ring is not None:
                _count_traffic(traffic, rank, ring)
            stage[rank] = 1
            result = fn(q, k, v, causal=causal, scale=scale, group=group) if ring is not None else None
        payload = {"ok": True, "result": result}
    except BaseException:                       # noqa: BLE001 -- any failure is the rank's report
        payload = {"ok": False, "error": traceback.format_exc(limit=8)}
    payload.update(out=out.getvalue(), traffic=traffic, seconds=time.perf_counter() - t0)
    try:
        data = pickle.dumps(payload)
    except Exception as err:                    # a result that cannot travel back
        data = pickle.dumps({"ok": False, "error": f"the result could not be sent back: {err}",
                             "out": payload["out"], "traffic": traffic, "seconds": payload["seconds"]})
    conn.send_bytes(data)
    conn.close()
    if payload["ok"]:
        try:                                    # leave only when every rank is done with the others
            dist.barrier()
        except Exception:
            pass
    os._exit(0)


@dataclass
class RingRun:
    """What :func:`run_ring` gathered: each rank's result, its output lines, its operations."""
    results: list
    out: list[str]
    traffic: list[dict]
    seconds: list[float]

    def p2p_bytes(self) -> list[int]:
        return [sum(b for name, (_, b) in t.items() if name in _P2P) for t in self.traffic]

    def collective_bytes(self) -> list[int]:
        return [sum(b for name, (_, b) in t.items() if name in _COLLECTIVES) for t in self.traffic]

    def off_ring_bytes(self) -> list[int]:
        return [t.get(OFF_RING, (0, 0))[1] for t in self.traffic]

    def outside_ops(self) -> list[int]:
        return [t.get(OUTSIDE, (0, 0))[0] for t in self.traffic]


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)


def _receive(conn, r: int, procs) -> dict:
    """Rank ``r``'s payload, or a failure saying that its process died without one."""
    try:
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return {"ok": False, "died": True, "out": "", "traffic": {}, "seconds": 0.0,
                "error": f"the process of rank {r} died without a result (exit code {procs[r].exitcode}, a "
                         "crash or a kill)"}


#: A world still using the CPU at its time limit is slow (a loaded machine), not stuck: it runs on, second by
#: second, from this many seconds per process (a notebook's kernel, a grading run), so that a loop without end
#: costs its notebook at most this much more. One whose ranks used less than _IDLE_CPU seconds in the last
#: second is stuck.
EXTRA_SECONDS = 60.0
_IDLE_CPU = 0.05
_extra_spent = 0.0


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux's /proc); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: A world whose ranks had not all joined their group by the time limit is started this many times more:
#: nothing of the ring had run in them, so the machine failed (forking, the store, gloo's set-up), not the ring.
SETUP_RETRIES = 1


class _GroupNotFormed(RingError):
    pass


def check_groups(world: int, groups) -> tuple[tuple[int, ...], ...] | None:
    """``groups`` as a tuple of rings, each the ascending global ranks of one process group (the order
    ``dist.new_group`` gives them): disjoint, of one size, ranks of the world; None stays None."""
    if groups is None:
        return None
    rings = tuple(tuple(sorted(int(r) for r in g)) for g in groups)
    flat = [r for g in rings for r in g]
    if not rings or len(set(map(len, rings))) != 1 or not rings[0] or len(set(flat)) != len(flat) \
            or not all(0 <= r < world for r in flat):
        raise ValueError(f"groups must be disjoint, non-empty rings of one size over ranks 0-{world - 1}, "
                         f"not {groups!r}")
    return rings


def rings_of(world: int, groups=None) -> tuple[tuple[int, ...], ...]:
    """The rings of a world: its groups, or one ring of every rank."""
    return check_groups(world, groups) or (tuple(range(world)),)


def ring_shards(x: torch.Tensor, world: int, causal: bool, groups=None, layout: str | None = None) -> list:
    """Each global rank's shard of ``x``: ring g of ``groups`` takes batch element(s) g of ``x`` (B split
    evenly) and shards them by the rule over its ranks; a rank of no ring gets None."""
    rings = rings_of(world, groups)
    if x.shape[0] % len(rings):
        raise ValueError(f"a batch of {x.shape[0]} cannot be split over {len(rings)} rings")
    b, out = x.shape[0] // len(rings), [None] * world
    for g, ring in enumerate(rings):
        part = x[g * b:(g + 1) * b] if groups is not None else x
        for i, piece in enumerate(shard(part, len(ring), causal, layout=layout)):
            out[ring[i]] = piece
    return out


def run_ring(fn, world: int, q, k, v, *, causal: bool = False, scale=None,
             timeout: float | None = None, layout: str | None = None, groups=None) -> RingRun:
    """Run ``fn(q_r, k_r, v_r, causal=, scale=, group=None)`` on ``world`` ranks (forked processes,
    a ``gloo`` group), each on its shards of the global q, k, v; gather what each returned. With
    ``groups`` (disjoint rings of global ranks, :func:`check_groups`), ring g runs on batch element g
    of q, k, v with ``group=`` its process group, all rings at once; a rank of no ring returns None.

    Raises :class:`RingError` naming the rank when one raises (its traceback and output shown),
    and naming the ranks still running, and where each waits, when the world is not done within
    ``timeout`` seconds (a world still using the CPU then runs on from :data:`EXTRA_SECONDS`). A world
    that had not formed its group by then is the machine's failure: it is started again
    (:data:`SETUP_RETRIES`), and if it never forms the error says so, not that the ring is wrong.
    """
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    groups = check_groups(world, groups)
    shards = [ring_shards(t.detach(), world, causal, groups, layout) for t in (q, k, v)]
    for attempt in range(SETUP_RETRIES + 1):
        try:
            return _run_world(fn, world, shards, causal, scale, timeout, groups)
        except _GroupNotFormed as err:
            if attempt == SETUP_RETRIES:
                raise RingError(f"{err} (started {SETUP_RETRIES + 1} times)") from None


def _run_world(fn, world, shards, causal, scale, timeout, groups=None) -> RingRun:
    global _extra_spent
    ctx = multiprocessing.get_context("fork")
    stage = ctx.RawArray("b", world)
    with tempfile.TemporaryDirectory(prefix="ring_") as tmp:
        store_path = os.path.join(tmp, "store")
        stacks = [os.path.join(tmp, f"stack{r}") for r in range(world)]
        procs, conns = [], {}
        try:
            for r in range(world):
                recv_end, send_end = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_rank_main, daemon=True,
                                args=(fn, r, world, store_path, shards[0][r], shards[1][r], shards[2][r],
                                      causal, scale, send_end, timeout, stage, stacks[r], groups))
                p.start()
                send_end.close()
                procs.append(p)
                conns[recv_end] = r
            payloads: dict[int, dict] = {}
            t0 = time.monotonic()
            deadline, cpu, checked = t0 + timeout, None, None
            while conns:
                left = deadline - time.monotonic()
                ready = wait_any(list(conns), timeout=max(left, 0)) if left > 0 else []
                if not ready:
                    running = sorted(conns.values())
                    # past the limit, a world whose ranks still use the CPU is slow, not stuck: look again
                    # each second, while the process's EXTRA_SECONDS last
                    now, last, cpu = time.monotonic(), cpu, {r: _cpu_seconds(procs[r].pid) for r in running}
                    busy = last is not None and any(cpu[r] is not None and last.get(r) is not None
                                                    and cpu[r] - last[r] > _IDLE_CPU for r in running)
                    if busy:
                        _extra_spent += now - checked
                    checked = now
                    if last is None or (busy and _extra_spent < EXTRA_SECONDS):     # one second tells which
                        deadline = now + 1.0
                        continue
                    spent = f"{timeout:g} s" if not busy else f"{now - t0:.0f} s (still busy after {timeout:g} s)"
                    unjoined = [r for r in running if stage[r] == 0]
                    if unjoined:
                        raise _GroupNotFormed(f"rank(s) {unjoined} of {world} had not joined the process group "
                                              f"after {spent}: the machine failed to start the world "
                                              "(nothing of the ring had run in them), not the ring")
                    done = sorted(payloads)
                    where = _where_they_wait(procs, running, stacks)
                    cause = (("ranks still computing: a loop that does not end, or far more work than the "
                              "ring's (every rank computing the whole attention?)") if busy else
                             ("ranks waiting on each other. A blocking dist.send waits for its matching recv: if "
                              "every rank sends first (or receives first), none gets to its other half. Post both "
                              "with dist.batch_isend_irecv([P2POp(dist.isend, ...), P2POp(dist.irecv, ...)]) and "
                              "wait on the requests, or order them by rank parity; and every rank must run the "
                              "same number of steps"))
                    raise RingError(f"rank(s) {running} had not returned after {spent}"
                                    + (f" (rank(s) {done} had)" if done else "") + "."
                                    + (f"\n  where: {where}" if where else "") + f"\n  likely cause: {cause}")
                for c in ready:
                    r = conns.pop(c)
                    payloads[r] = _receive(c, r, procs)
                    if not payloads[r]["ok"]:
                        # the others' failures, for a second: one that died, else one whose error names a
                        # known cause, explains its neighbours' connection errors
                        failed, end = [r], time.monotonic() + 1.0
                        while conns and not payloads[r].get("died") and time.monotonic() < end:
                            for c2 in wait_any(list(conns), timeout=max(end - time.monotonic(), 0)):
                                r2 = conns.pop(c2)
                                payloads[r2] = _receive(c2, r2, procs)
                                if not payloads[r2]["ok"]:
                                    failed.append(r2)
                            if any(payloads[f].get("died") for f in failed):
                                break
                        r = next((f for f in failed if payloads[f].get("died")),
                                 next((f for f in failed if _cause_of(payloads[f], groups)), r))
                        out = payloads[r]["out"].strip()
                        cause = _cause_of(payloads[r], groups)
                        raise RingError(f"rank {r} of {world} failed:\n{payloads[r]['error'].rstrip()}"
                                        + (f"\n  its output:\n{out}" if out else "")
                                        + (f"\n  likely cause: {cause}" if cause else ""))
        finally:
            _stop(procs)
            for c in conns:
                c.close()
    ranks = [payloads[r] for r in range(world)]
    return RingRun([p["result"] for p in ranks], [p["out"] for p in ranks],
                   [p["traffic"] for p in ranks], [p["seconds"] for p in ranks])


GROUP_IGNORED = ("`group` was ignored: the ring runs over the ranks of `group`, not the world's: rank and P are "
                 "dist.get_rank(group) and dist.get_world_size(group), every collective and point-to-point call "
                 "takes group=group, and a peer is named by its global rank, dist.get_global_rank(group, j)")
GLOBAL_PEERS = ("point-to-point calls (dist.isend, dist.irecv, dist.P2POp) take global ranks: rank j of the group is "
                "dist.get_global_rank(group, j) (or pass group_peer=j)")
#: What a rank's error says -> the likely cause named with it.
_KNOWN_CAUSES = (
    ("is not part of group", f"a peer outside the ring's group: {GLOBAL_PEERS}; rank and P are dist.get_rank(group) "
     "and dist.get_world_size(group)"),
)


def _cause_of(payload: dict, groups) -> str | None:
    """The likely cause of a rank's failure: from its error's text, else from what it ran before failing
    (an operation on another group than its ring's; with rings of a world, a peer that is no neighbour)."""
    said = next((cause for says, cause in _KNOWN_CAUSES if says in payload.get("error", "")), None)
    traffic = payload.get("traffic", {})
    if said or traffic.get(OUTSIDE, (0, 0))[0]:
        return said or GROUP_IGNORED
    if groups is not None and traffic.get(OFF_RING, (0, 0))[0]:
        return f"a peer that is not a neighbour on the ring: {GLOBAL_PEERS}"
    return None


# One frame of faulthandler's dump: '  File "/path/x.py", line 12 in recv'
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (\S+)')
#: Frames that are not the ring's own code: PyTorch's, the standard library's, this module's.
_NOT_THE_RINGS = (os.path.dirname(torch.__file__), os.path.dirname(os.__file__), __file__)


def _where_they_wait(procs, running: list[int], stacks: list[str]) -> str:
    """'rank 0 in send, from line 12 of pass_on; ...': each running rank's innermost call and the
    innermost line of the ring's own code under it, from the stack it writes on SIGUSR1."""
    for r in running:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except OSError:
            pass
    said, t0 = [], time.monotonic()
    for r in running:
        frames = []
        while not frames and time.monotonic() - t0 < 2.0:
            with open(stacks[r]) as f:
                frames = [m.groups() for ln in f if (m := _FRAME.match(ln))]
            if not frames:
                time.sleep(0.05)
        if not frames:
            continue
        inner = frames[0][2]                    # most recent call first
        own = next(((line, func) for path, line, func in frames if not path.startswith(_NOT_THE_RINGS)), None)
        said.append(f"rank {r} in {inner}" + (f", from line {own[0]} of {own[1]}" if own and own[1] != inner else ""))
    return "; ".join(said)


def on_ring(fn, world: int, *, timeout: float | None = None, layout: str | None = None, traffic: bool = False,
            groups=None):
    """``fn`` (a ring attention) as an attention function of global q, k, v: the inputs are sharded
    by the rule, ``fn`` runs on ``world`` ranks (with ``groups``: on each ring of them, ring g on batch
    element g, :func:`run_ring`), and their ``(o, lse)`` come back in global order.
    The last run's :class:`RingRun` is kept as ``.last_run`` (output lines, operations, seconds).
    With ``traffic``, a third value: :func:`traffic_table` of the run (what the grader records)."""
    rings = rings_of(world, groups)

    def ring_call(q, k, v, causal=False, scale=None):
        run = run_ring(fn, world, q, k, v, causal=causal, scale=scale, timeout=timeout, layout=layout,
                       groups=groups)
        ring_call.last_run = run
        for r, text in enumerate(run.out):
            for line in text.splitlines():
                print(f"[rank {r}] {line}")
        o_parts, lse_parts = [], []
        for ring in rings:
            os_, lses = [], []
            for i, r in enumerate(ring):
                res, rows = run.results[r], len(shard_index(q.shape[2], len(ring), i, causal, layout))
                if not (isinstance(res, (tuple, list)) and len(res) == 2):
                    raise RingError(f"rank {r} returned {type(res).__name__}; ring_attention returns its rows' "
                                    "(o, lse): o [B, Hq, S_local, D] in q's dtype, lse [B, Hq, S_local] float32")
                for name, t, want in (("o", res[0], 4), ("lse", res[1], 3)):
                    if not isinstance(t, torch.Tensor) or t.dim() != want or t.shape[2] != rows:
                        raise RingError(f"rank {r} returned {name} of shape "
                                        f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}; "
                                        f"it must cover the rank's {rows} rows on dim 2")
                os_.append(res[0])
                lses.append(res[1])
            o_parts.append(unshard(os_, causal, layout=layout))
            lse_parts.append(unshard(lses, causal, layout=layout))
        out = (o_parts[0], lse_parts[0]) if len(rings) == 1 else (torch.cat(o_parts), torch.cat(lse_parts))
        return (*out, traffic_table(run)) if traffic else out

    ring_call.world, ring_call.last_run = world, None
    ring_call.__name__ = getattr(fn, "__name__", "ring_attention")
    return ring_call


# ----------------------------------------------------------------------------- the cases
def traffic_table(run: RingRun) -> torch.Tensor:
    """float64 [world, 4]: the bytes each rank gave point-to-point operations, collectives, and point-to-point
    operations with a rank that is no neighbour of it on its ring; the number of operations it ran on a
    process group whose ranks are not its ring's."""
    return torch.tensor([run.p2p_bytes(), run.collective_bytes(), run.off_ring_bytes(), run.outside_ops()],
                        dtype=torch.float64).T.contiguous()


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
