"""Step 12's ranks: the sharding rule (what rank r holds) and a world of CPU ranks that runs a ring attention.

:func:`run_ring` forks one process per rank on this machine, joins them in a ``gloo`` group (and, for a case
of several rings, every rank in every subgroup, in one order), gives each its shards, counts the bytes each
rank sends (point-to-point, collectives, off its ring) and gathers the outputs into the global order. A rank
that raises or a world that does not finish within a time limit is stopped and named, with the line where
each rank waits. :func:`on_ring` turns a ring attention into a function of global q, k, v. The check that
uses them is :mod:`facourse.ring`.
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

from .errors import TeachingError


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
#: Frames that are not the ring's own code: PyTorch's, the standard library's, this module's and the check's.
_NOT_THE_RINGS = (os.path.dirname(torch.__file__), os.path.dirname(os.__file__), __file__,
                  os.path.join(os.path.dirname(__file__), "ring.py"))


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


def traffic_table(run: RingRun) -> torch.Tensor:
    """float64 [world, 4]: the bytes each rank gave point-to-point operations, collectives, and point-to-point
    operations with a rank that is no neighbour of it on its ring; the number of operations it ran on a
    process group whose ranks are not its ring's."""
    return torch.tensor([run.p2p_bytes(), run.collective_bytes(), run.off_ring_bytes(), run.outside_ops()],
                        dtype=torch.float64).T.contiguous()


