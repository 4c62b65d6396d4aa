"""The results schema as code: what ``benchmarks/ladder.py`` writes and ``facourse.results`` reads.

A ladder run (``"schema": 1``) is a ``Run``: the machine (``Env``), the timing method, the reference
backend, the step's kind (``mode``; none: the forward), its rungs and its rows, each a ``CheckRow`` or
a ``BenchRow``. A bench row that timed carries its kind's figures (``Kind.rate_key``: TFLOP/s or GB/s
of K/V; a ring row the step, per-rank and transfer times). Other committed results have their own
dataclasses below (step 11's traces, the TileLang and FlashInfer runs, step 05's tile sweep, the timing
probe, step 06's v5 variants). ``validate(d)`` builds the dataclasses from a file's dict and raises
``SchemaError`` on a missing or unknown key or a value of the wrong type.

    >>> from facourse import schema
    >>> schema.validate(json.loads(path.read_text()))      # -> a Run (or another file's dataclass)
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

SCHEMA = 1
Num = typing.Union[int, float]


class SchemaError(ValueError):
    pass


@dataclass
class Env:
    gpu: str
    date: str
    torch: str
    cuda: typing.Optional[str]
    triton: typing.Optional[str] = None
    cudnn: typing.Optional[int] = None
    capability: typing.Optional[list] = None
    sm_count: typing.Optional[int] = None
    copy_gbps: typing.Optional[Num] = None          # a decode run: a device-to-device copy's rate
    # the TileLang and FlashInfer runs' machine
    python: typing.Optional[str] = None
    nvcc: typing.Optional[str] = None
    tilelang: typing.Optional[str] = None
    tilelang_cache_dir: typing.Optional[str] = None
    tvm_ffi: typing.Optional[str] = None
    flashinfer: typing.Optional[str] = None


@dataclass
class RungInfo:
    file: str
    verdict: str
    seconds: typing.Optional[Num] = None
    build_s: typing.Optional[Num] = None
    error: typing.Optional[str] = None
    autotune: typing.Optional[dict] = None        # key -> the autotuner's pick
    layout: typing.Optional[str] = None           # a ring rung's sharding


@dataclass
class CheckRow:
    rung: str
    config: str
    dtype: str
    kind: str
    check: str                                    # "ok" or "error"
    seconds: typing.Optional[Num] = None
    error: typing.Optional[str] = None
    world: typing.Optional[int] = None            # a ring check: its ranks and seed
    seed: typing.Optional[int] = None
    rel_err: typing.Optional[Num] = None          # an FP8 check: its errors
    lse_err: typing.Optional[Num] = None
    rmse: typing.Optional[Num] = None             # an FP8 check on FA3's outlier inputs


@dataclass
class BenchRow:
    rung: str
    config: str
    dtype: str
    kind: str
    ref_backend: typing.Optional[str] = None
    seconds: typing.Optional[Num] = None
    error: typing.Optional[str] = None
    mode: typing.Optional[str] = None             # another pass than the step's (step 08: "train"; FP8: "e2e")
    ratio: typing.Optional[Num] = None            # t_ref / t_rung
    ratio_methods: typing.Optional[dict] = None   # the ratio timed other ways (--methods): {"do_bench": r, "events": r}
    ms: typing.Optional[Num] = None
    ms_ref: typing.Optional[Num] = None
    host_us: typing.Optional[Num] = None
    host_ref_us: typing.Optional[Num] = None
    tflops: typing.Optional[Num] = None
    tflops_ref: typing.Optional[Num] = None
    gbps: typing.Optional[Num] = None
    gbps_ref: typing.Optional[Num] = None
    copy_fraction: typing.Optional[Num] = None
    world: typing.Optional[int] = None
    rank_ms: typing.Optional[list] = None
    compute_ms: typing.Optional[list] = None
    wait_ms: typing.Optional[list] = None
    step_compute_ms: typing.Optional[list] = None
    step_wait_ms: typing.Optional[list] = None
    transfer_ms: typing.Optional[Num] = None
    shard_mb: typing.Optional[Num] = None
    efficiency: typing.Optional[Num] = None


@dataclass
class Run:
    schema: int
    step: str
    env: Env
    timing: str
    reference: str
    solution: str
    rungs: dict[str, RungInfo]
    rows: list[typing.Union[CheckRow, BenchRow]]
    mode: typing.Optional[str] = None
    world: typing.Optional[int] = None            # a ring run: its ranks, their environment, the one-GPU times
    ring_env: typing.Optional[dict] = None
    one_gpu: typing.Optional[dict] = None

    def check(self) -> None:
        """What a run's kind requires: a step of the course, rows of its rungs, a timed row's figures."""
        from . import kinds
        kind = kinds.get(self.mode)
        for i, r in enumerate(self.rows):
            if r.rung not in self.rungs:
                raise SchemaError(f"rows[{i}]: rung {r.rung!r} is not among the run's rungs")
            if isinstance(r, CheckRow) and r.check not in ("ok", "error"):
                raise SchemaError(f"rows[{i}]: check is {r.check!r}, not 'ok' or 'error'")
            if isinstance(r, BenchRow) and r.error is None:
                missing = [k for k in kind.bench_keys if getattr(r, k) is None]
                if missing:
                    raise SchemaError(f"rows[{i}]: a timed {kind.name} row without {', '.join(missing)}")


@dataclass
class TracesRun:
    """benchmarks/traces.py: step 11's solutions traced over the seed's workloads, and apply()'s choices."""
    schema: str
    step: str
    env: Env
    timing: str
    reference: str
    builds: dict
    traces: list[dict]
    dispatch: list[dict]


@dataclass
class ScriptRun:
    """A GPU script's run in its own rows (step 11's TileLang rung, with FlashInfer's prefill)."""
    script: str
    env: Env
    timing: str
    reference: str
    tiles: dict
    builds: list
    rows: list[dict]
    build_wall_s: Num


@dataclass
class TileSweep:
    """Step 05's tile configurations (tile_sweep.py)."""
    env: Env
    reference: str
    rounds: int
    candidates: list
    rows: list[dict]


@dataclass
class TimingProbe:
    """benchmarks/timing_probe.py: the step-05 solution and FA2 timed without and with the spin."""
    env: Env
    solution: str
    reference: str
    rounds: int
    rows: list[dict]


@dataclass
class V5Variants:
    """Step 06's v5 configurations (ladder/v5_variants.py)."""
    gpu: str
    torch: str
    variants: dict[str, dict]


@dataclass
class ProfileRun:
    """benchmarks/counters.py: the course's kernels under Nsight Compute (step 13), one target per process."""
    profile: dict                                 # the tool, its sections, clock control, NVTX range, builds
    env: Env
    device: dict                                  # ncu's device attributes (occupancy's limits)
    units: dict                                   # metric -> ncu's base unit
    targets: list[dict]                           # target, step, rung, config, work, unit, flops, kernels


@dataclass
class ProtonRun:
    """benchmarks/counters.py --proton: Triton's profiler on the same targets (kernel times, PC-sampled stalls)."""
    proton: dict                                  # backend, calls a target, what the scopes and the sampling hold
    env: Env
    targets: list[dict]                           # target, flops (of all its calls), kernels: name, count, time_ns
    pc_sampling: dict                             # target -> kernel, samples, stalled, by_reason


#: (a file's kind, how to recognise it): the first that matches is validated
FAMILIES = ((ProtonRun, lambda d: "proton" in d), (ProfileRun, lambda d: "targets" in d), (TracesRun, lambda d: "traces" in d), (ScriptRun, lambda d: "script" in d),
            (TileSweep, lambda d: "candidates" in d), (V5Variants, lambda d: "variants" in d),
            (Run, lambda d: "rungs" in d), (TimingProbe, lambda d: "rows" in d))


def validate(d: dict):
    """The dataclass of a results file's content; raises SchemaError where it departs from the schema."""
    for cls, match in FAMILIES:
        if match(d):
            out = _build(cls, d, cls.__name__)
            if isinstance(out, Run):
                if out.schema != SCHEMA:
                    raise SchemaError(f"Run: schema {out.schema}, this code reads {SCHEMA}")
                out.check()
            return out
    raise SchemaError(f"no results schema has the keys {sorted(d)}")


def _build(cls, d, where: str):
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected an object for {cls.__name__}, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise SchemaError(f"{where}: unknown key(s) {unknown} for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    kw = {}
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{where}: missing key {name!r} of {cls.__name__}")
            continue
        kw[name] = _value(hints[name], d[name], f"{where}.{name}")
    return cls(**kw)


def _value(t, v, where: str):
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union:
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if any(dataclasses.is_dataclass(a) for a in options) and isinstance(v, dict):
            row = BenchRow if v.get("kind") == "bench" else CheckRow       # a row says what it is
            if row in options:
                return _build(row, v, where)
        errors = []
        for a in options:
            try:
                return _value(a, v, where)
            except SchemaError as e:
                errors.append(str(e))
        raise SchemaError(errors[-1] if errors else f"{where}: {v!r}")
    if dataclasses.is_dataclass(t):
        return _build(t, v, where)
    if origin is list:
        if not isinstance(v, list):
            raise SchemaError(f"{where}: expected a list, got {type(v).__name__}")
        return [_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(v)] if args else v
    if origin is dict:
        if not isinstance(v, dict):
            raise SchemaError(f"{where}: expected an object, got {type(v).__name__}")
        return {k: _value(args[1], x, f"{where}[{k!r}]") for k, x in v.items()} if args else v
    if t is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    elif t is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    else:
        ok = isinstance(v, t)
    if not ok:
        raise SchemaError(f"{where}: expected {getattr(t, '__name__', t)}, got {type(v).__name__} {v!r:.60}")
    return v
