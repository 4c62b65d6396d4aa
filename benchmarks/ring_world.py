"""Step 12's rungs, each in a world of spawned ranks (``facourse.kinds.ring``: its cases, configurations
and rows): one GPU per rank, NCCL (NVLink multicast off in every rank), the rung loaded by path in each;
checked on the shapes of facourse.ring.RING_CASES (rank 0 checks the gathered rows with
facourse.check_attention), then timed: each call after a barrier, CUDA events on every rank, the slower
rank's time. The reference is the same block kernel (the rung's ring_common.block_kernel) over the whole
sequence on one GPU, timed once in the first world. With ``smoke`` the same path runs on CPU ranks
(gloo, tiny shapes): the runner's own test.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .rungs import env_info, gpu_tag, load_py  # noqa: I001 (first: it puts src/ on the path)

from facourse.kinds import ring
from facourse.schema import SCHEMA, validate
from facourse.steps import rung


class _Clock:
    """Time stamps on the device's stream (CUDA events) or the host's clock (CPU ranks)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def stamp(self):
        import torch
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def sync(self) -> None:
        import torch
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


class _Probe:
    """ring_common.PROBE: a stamp at each of the rung's marks; ``phases`` pairs each label with the
    time since the stamp before it."""

    def __init__(self, clock: _Clock):
        self.clock, self.marks = clock, []

    def __call__(self, label: str) -> None:
        self.marks.append((label, self.clock.stamp()))

    def phases(self) -> list[tuple[str, float]]:
        return [(b[0], self.clock.ms(a[1], b[1])) for a, b in zip(self.marks, self.marks[1:])]


def _median(xs):
    import statistics
    return statistics.median(xs)


def _timed(call, clock: _Clock, n: int, ranks: bool = True) -> list[float]:
    """Milliseconds of ``n`` calls, each started together on every rank (``ranks``: a barrier first)."""
    import torch.distributed as dist
    out = []
    for _ in range(n):
        if ranks:
            dist.barrier()
        clock.sync()
        a = clock.stamp()
        call()
        b = clock.stamp()
        clock.sync()
        out.append(clock.ms(a, b))
    return out


def _probed(call, clock: _Clock, common, n: int) -> dict:
    """Per ring step, the median over ``n`` calls of the time it computed and the time it then waited
    for the next shard (ring_common's marks; ≈ 0 when the transfer hid behind the compute)."""
    import torch.distributed as dist
    probe = common.PROBE = _Probe(clock)
    runs = []
    try:
        for _ in range(n):
            probe.marks = []
            dist.barrier()
            clock.sync()
            probe("start")
            call()
            clock.sync()
            runs.append(probe.phases())
    finally:
        common.PROBE = None
    per = {what: [[ms for label, ms in run if label == what] for run in runs] for what in ("compute", "wait")}
    return {what: [_median(step) for step in zip(*lists)] for what, lists in per.items()}


def _transfer_alone(k, v, clock: _Clock, warmup: int, n: int) -> list[float]:
    """Milliseconds of one ring step's exchange with nothing else running: this rank's (k, v) to the
    next rank, the previous rank's received (the timed configurations' shards are of equal size)."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()

    def exchange():
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        ops = [dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
               dist.P2POp(dist.irecv, k_in, (rank - 1) % world), dist.P2POp(dist.irecv, v_in, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    _timed(exchange, clock, warmup)
    return _timed(exchange, clock, n)


def _ring_worker(rank: int, job: dict) -> None:
    """One rank of a ring rung's world (spawned; module-level so that spawn can find it): join the
    group (NCCL, one GPU per rank; gloo on CPU ranks), check the rung, time it, and, on rank 0, write
    the rows to job["out"] after each one. A rank whose ring_attention raises ends the world."""
    import torch
    import torch.distributed as dist

    from facourse import AttentionCheckError, check_attention, make_inputs
    from facourse.ring import RING_CASES, shard, shard_index, unshard

    cuda, world = not job["smoke"], job["world"]
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(job["store"], world), rank=rank,
                            world_size=world, **({"device_id": dev} if cuda else {}))
    fn = load_py(Path(job["path"])).ring_attention
    common = sys.modules["ring_common"]        # the rung's support module, as the rung imported it
    layout, clock = job["layout"], _Clock(cuda)
    warmup, timed, probed = ring.ITERS["gpu" if cuda else "cpu"]
    res: dict = {"rows": [], "one_gpu": {}}

    def save():
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(res))

    for i, (cname, dt) in enumerate(job["checks"]):
        c, seed = RING_CASES[cname].cfg, job["seed"] + i
        row = {"rung": job["rung"], "config": cname, "dtype": dt, "kind": "check", "world": world, "seed": seed}
        t0 = time.time()
        q, k, v = make_inputs(c, seed, dev, getattr(torch, dt))
        o, lse = fn(*(shard(t, world, c.causal, layout=layout)[rank] for t in (q, k, v)), causal=c.causal)
        parts = [None] * world if rank == 0 else None
        dist.gather_object((o.cpu(), lse.cpu()), parts, dst=0)
        if rank == 0:                          # the check on rank 0, of the rows in global order
            try:
                check_attention(unshard([p[0] for p in parts], c.causal, layout=layout).to(dev), q, k, v,
                                c.causal, lse=unshard([p[1] for p in parts], c.causal, layout=layout).to(dev),
                                config=f"{c.describe()} on {world} ranks", seed=seed)
                row["check"] = "ok"
            except AttentionCheckError as e:
                row.update(check="error", error=str(e)[:1500])
                print(f"  FAIL {job['rung']} {cname} {dt}: {row['error'][:300]}", flush=True)
            row["seconds"] = round(time.time() - t0, 2)
            res["rows"].append(row)
            save()
    go = [job["bench"] and all(r["check"] == "ok" for r in res["rows"])]
    dist.broadcast_object_list(go, src=0)
    if not go[0]:
        dist.destroy_process_group()
        return

    configs = ring.SMOKE_CONFIGS if job["smoke"] else ring.CONFIGS
    for name in job["configs"]:
        cfg = configs[name]
        t0 = time.time()
        rows = len(shard_index(cfg.Sq, world, rank, cfg.causal, layout))
        q = torch.randn(cfg.B, cfg.Hq, rows, cfg.D, device=dev, dtype=torch.float16)
        k, v = (torch.randn(cfg.B, cfg.Hkv, rows, cfg.D, device=dev, dtype=torch.float16) for _ in range(2))
        call = lambda: fn(q, k, v, causal=cfg.causal)  # noqa: E731
        _timed(call, clock, warmup)
        mine = {"ms": _timed(call, clock, timed), **_probed(call, clock, common, probed),
                "transfer": _transfer_alone(k, v, clock, warmup, timed)}
        every = [None] * world
        dist.all_gather_object(every, mine)
        if rank == 0:
            r3 = lambda x: round(x, 4)  # noqa: E731
            res["rows"].append({
                "rung": job["rung"], "config": name, "dtype": "float16", "kind": "bench", "world": world,
                "ms": r3(_median([max(ts) for ts in zip(*(e["ms"] for e in every))])),
                "rank_ms": [r3(_median(e["ms"])) for e in every],
                "compute_ms": [r3(sum(e["compute"])) for e in every],
                "wait_ms": [r3(sum(e["wait"])) for e in every],
                "step_compute_ms": [[r3(x) for x in e["compute"]] for e in every],
                "step_wait_ms": [[r3(x) for x in e["wait"]] for e in every],
                "transfer_ms": r3(_median([max(ts) for ts in zip(*(e["transfer"] for e in every))])),
                "shard_mb": r3((k.numel() + v.numel()) * k.element_size() / 1e6),
                "seconds": round(time.time() - t0, 2)})
        del q, k, v, call
        if job["baseline"]:
            if rank == 0:                      # the same block kernel, one device, the whole sequence
                Q = torch.randn(cfg.B, cfg.Hq, cfg.Sq, cfg.D, device=dev, dtype=torch.float16)
                K, V = (torch.randn(cfg.B, cfg.Hkv, cfg.Skv, cfg.D, device=dev, dtype=torch.float16)
                        for _ in range(2))
                kernel = common.block_kernel(dev)
                one = lambda: kernel(Q, K, V, causal=cfg.causal)  # noqa: E731
                _timed(one, clock, warmup, ranks=False)
                res["one_gpu"][name] = {"ms": round(_median(_timed(one, clock, timed, ranks=False)), 4)}
                del Q, K, V, one
            dist.barrier()
        save()
    dist.destroy_process_group()


def _spawn_world(job: dict, timeout: float) -> str | None:
    """Run ``_ring_worker`` on job["world"] spawned ranks; None when all finished, else what went wrong
    (a rank's traceback, or the time limit: the ranks are then killed)."""
    import torch.multiprocessing as tmp
    ctx = tmp.start_processes(_ring_worker, args=(job,), nprocs=job["world"], join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                return f"timed out after {timeout:g} s (ranks waiting on each other?)"
    except Exception as e:  # noqa: BLE001 (ProcessRaisedException, ProcessExitedException: a rank failed)
        return f"{type(e).__name__}: {e}"[-3000:]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return None


def run(m: dict, names: list[str], out: Path, quick: bool = False, smoke: bool = False,
        checks: list[str] | None = None, bench: bool = True, timeout: float = 300) -> tuple[dict, Path] | None:
    """Each rung in a world of ``ring.KIND.world`` spawned ranks (one GPU each, NCCL; gloo CPU ranks with
    ``smoke``), checked and timed there; the first world also times the one-GPU reference. Writes the
    results file after every rung; returns it and its path (None when the GPUs are missing)."""
    import secrets

    import torch
    if not smoke and torch.cuda.device_count() < ring.KIND.world:
        print(f"step {m['step']['id']} runs on {ring.KIND.world} GPUs; this machine has {torch.cuda.device_count()} "
              "(--cpu-smoke runs the same path on CPU ranks)")
        return None
    os.environ.update(ring.ENV)
    env = env_info()
    if smoke:
        env.update(gpu="cpu", capability=None, sm_count=None)
    warmup, timed, probed = ring.ITERS["cpu" if smoke else "gpu"]
    cks, configs = ring.KIND.plan(quick, smoke, checks)
    sid = m["step"]["id"]
    d = {"schema": SCHEMA, "step": sid, "env": env,
         "timing": ring.TIMING.format(warmup=warmup, timed=timed, probed=probed),
         "reference": m["reference"]["backend"], "mode": ring.KIND.name, "world": ring.KIND.world, "ring_env": ring.ENV,
         "solution": m["ladder"]["solution"], "one_gpu": {},
         "rungs": {n: {"file": rung(m, n)["file"], "verdict": rung(m, n)["verdict"],
                       "layout": rung(m, n).get("layout", "the rule's")} for n in names}, "rows": []}
    path = out / f"{env['date']}_{gpu_tag(env['gpu'])}_step{sid}.json"

    def save():
        validate(d)
        path.write_text(json.dumps(d, indent=1))

    print(json.dumps(env), flush=True)
    seed = secrets.randbits(30)
    with tempfile.TemporaryDirectory(prefix="ring_world_") as tmp:
        for i, n in enumerate(names):
            job = {"rung": n, "path": str(m["ladder_dir"] / rung(m, n)["file"]), "layout": rung(m, n).get("layout"),
                   "checks": cks, "configs": configs, "bench": bench, "baseline": bench and not d["one_gpu"],
                   "smoke": smoke, "world": ring.KIND.world, "seed": seed, "store": str(Path(tmp) / f"store_{i}"),
                   "out": str(Path(tmp) / f"{n}.json")}
            print(f"== {n}", flush=True)
            t0 = time.time()
            err = _spawn_world(job, timeout)
            if err:
                d["rungs"][n]["error"] = err
                print(f"  {n}: {err[-500:]}", flush=True)
            d["rungs"][n]["seconds"] = round(time.time() - t0, 1)
            if Path(job["out"]).exists():
                w = json.loads(Path(job["out"]).read_text())
                d["one_gpu"].update(w["one_gpu"])
                d["rows"] += w["rows"]
            ring.KIND.ratios(d)
            save()
    return d, path
