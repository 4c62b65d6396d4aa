"""Step 11's deployment: apply()'s configuration, a trace set on disk, and the grader's routing check of a
deployment from its outputs alone."""
from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

import torch

from ..check import REL_LIMIT, AttentionCheckError, check_attention
from ..reference import reference_attention
from .spec import (DEFINITION_NAME, TAG_INDEX, InterchangeCheckError, as_definition, from_course, load_fib,
                   python_solution, solution_source, spec_definition, to_course)
from .workloads import ROUTING_WORKLOADS, describe_workload, make_workload_inputs, new_workload

#: apply()'s tolerances (see :func:`apply_config`): the course's rule decides PASSED; these only
#: have to let every trace that passed through. Rule 3 bounds max|o - ref| < REL_LIMIT · max|ref| in the
#: workloads' fp16 (rule.rel_limit_of: 8x in bf16), which is what :func:`trace` records as the relative
#: error; and max|ref| <= max|v| (each output row is a weighted mean of rows of v), with v drawn from
#: N(0, 1) by make_inputs, below 10.
APPLY_MAX_RTOL = REL_LIMIT
APPLY_MAX_ATOL = 10 * REL_LIMIT


def apply_config(**changes):
    """The ``ApplyConfig`` of a safe deployment (keyword arguments override fields).

    Tolerances: a trace's status is the course's verdict; max_rtol = REL_LIMIT is rule 3 itself
    (the relative error :func:`trace` records is rule 3's, which a PASSED trace keeps strictly below
    it; ``filter_traces`` keeps ``<=``), and max_atol = 10 · REL_LIMIT lies above any error a passed
    trace can have (rule 3 and max|ref| <= max|v| < 10), so every PASSED trace stays in apply()'s
    table and nothing that failed enters it (filter_traces keeps status PASSED only). flashinfer_bench's
    own default (max_rtol = 1e-5) would drop nearly every fp16 trace, sending every call to the
    fallback. Traces from flashinfer_bench's own benchmark record the elementwise relative error
    |x - y| / (|y| + 1e-8) (bench/utils.py), large wherever the reference is near 0: these
    tolerances drop them; trace with :func:`trace`.

    on_miss_policy "fallback_only": a shape with no PASSED trace goes to the fallback. "use_def_best"
    would send it to the solution that wins most shapes (apply/table.py), which was never checked on
    this one (a kernel that assumes seq_q == seq_kv, or a multiple of its tile, fails exactly there).
    """
    fields = {"max_atol": APPLY_MAX_ATOL, "max_rtol": APPLY_MAX_RTOL, "on_miss_policy": "fallback_only"}
    return load_fib().ApplyConfig(**{**fields, **changes})


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)


def _write_json(path: Path, model) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=2), encoding="utf-8")  # every field, defaults included


def _write_jsonl(path: Path, models) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(m.model_dump_json() + "\n" for m in models), encoding="utf-8")


def _check_set(d, solutions, traces) -> None:
    names = [s.name for s in solutions]
    if len(set(names)) != len(names):
        raise ValueError(f"solution names must be unique (apply() finds a solution by name): {names}")
    for s in solutions:
        if s.definition != d.name:
            raise ValueError(f"solution {s.name!r} names definition {s.definition!r}, not {d.name!r}")
    for t in traces:
        if t.definition != d.name:
            raise ValueError(f"a trace of {t.solution!r} names definition {t.definition!r}, not {d.name!r}")
        if t.solution not in names:
            raise ValueError(f"a trace names solution {t.solution!r}, which is not in the set: apply() would "
                             "route its shape to a solution it cannot find and fall back without a word")


def save_trace_set(root, definition, solutions, workloads, traces) -> Path:
    """Write flashinfer_bench's on-disk layout under ``root`` (a new or empty folder) and return it::

        definitions/<op_type>/<name>.json
        solutions/<op_type>/<name>/<solution>.json
        workloads/<op_type>/<name>.jsonl     (one workload-only trace a line)
        traces/<op_type>/<name>.jsonl        (one trace a line)

    ``TraceSet.from_path(root)`` and ``enable_apply(root, ...)`` read it back. A folder that already
    holds files is refused: from_path reads every file under it, and stale traces would route calls.
    """
    fib = load_fib()
    d = as_definition(definition)
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} is not empty: save a trace set into a new folder (TraceSet.from_path reads "
                         "every file under it, stale ones included)")
    _check_set(d, solutions, traces)
    _write_json(root / "definitions" / d.op_type / f"{_safe(d.name)}.json", d)
    for s in solutions:
        _write_json(root / "solutions" / d.op_type / _safe(d.name) / f"{_safe(s.name)}.json", s)
    if workloads:
        _write_jsonl(root / "workloads" / d.op_type / f"{_safe(d.name)}.jsonl",
                     [fib.Trace(definition=d.name, workload=w) for w in workloads])
    if traces:
        _write_jsonl(root / "traces" / d.op_type / f"{_safe(d.name)}.jsonl", traces)
    return root


# ----------------------------------------------------------------------------- the routing check
#: The routing check's traces (its shapes: ROUTING_WORKLOADS): (workload, solution, status, speedup_factor).
#: On A the fastest is fast_wrong, which FAILED (top-left causal); the fastest PASSED is kernel_x. On B
#: kernel_y wins (fast_wrong passes there: on a square shape top-left and bottom-right causal agree).
_ROUTING_TRACES = (
    ("A", "fast_wrong", "INCORRECT_NUMERICAL", 3.2),
    ("A", "kernel_x", "PASSED", 1.6),
    ("A", "kernel_y", "PASSED", 1.2),
    ("B", "kernel_y", "PASSED", 1.7),
    ("B", "kernel_x", "PASSED", 1.3),
    ("B", "fast_wrong", "PASSED", 1.1),
)
ROUTING_SOLUTIONS = ("kernel_x", "kernel_y", "fast_wrong")
_ROUTING_EXPECT = {"A": "kernel_x", "B": "kernel_y", "C": None}


def routing_tags(seed: int) -> dict:
    """Each synthetic solution's tag: a distinct integer in [512, 2048), drawn from ``seed`` (exact in
    float16). Attention outputs are weighted means of rows of v (|v| < 10), so none reaches it."""
    rng = random.Random(f"facourse.interchange.routing:{seed}")
    values = rng.sample(range(512, 2048), len(ROUTING_SOLUTIONS))
    return dict(zip(ROUTING_SOLUTIONS, map(float, values)))


def routing_solution(name: str, tag: float):
    """Synthetic solution ``name``: the reference attention (top-left causal for fast_wrong), tagged."""
    align = "top_left" if name == "fast_wrong" else "bottom_right"
    doc = (f"Synthetic solution {name} of facourse's routing check: the reference attention "
           f"({align.replace('_', '-')} causal), tagged with {tag!r} at out{list(TAG_INDEX)}.")
    return python_solution(name, solution_source(doc, tag, align), doc)


def routing_trace(workload, solution: str, status: str, speedup: float):
    """A synthetic trace of ``solution`` on ``workload``, of ``status`` and ``speedup`` (a failed one keeps its
    time in ``correctness.extra``)."""
    fib = load_fib()
    env = fib.Environment(hardware="synthetic (facourse.interchange.routing_trace_set)")
    stamp = "2026-01-01T00:00:00+00:00"
    if status == "PASSED":
        ev = fib.Evaluation(status=status, environment=env, timestamp=stamp, log="synthetic trace",
                            correctness=fib.Correctness(max_absolute_error=2.0e-3, max_relative_error=4.0e-4),
                            performance=fib.Performance(latency_ms=1.0 / speedup, reference_latency_ms=1.0,
                                                        speedup_factor=speedup))
    else:  # flashinfer_bench keeps performance for PASSED traces only: the time it ran in goes in extra
        ev = fib.Evaluation(status=status, environment=env, timestamp=stamp,
                            log="synthetic trace: timed, then failed its check (top-left causal)",
                            correctness=fib.Correctness(max_absolute_error=1.9, max_relative_error=0.45,
                                                        extra={"latency_ms": 1.0 / speedup,
                                                               "speedup_factor": speedup}))
    return fib.Trace(definition=DEFINITION_NAME, workload=workload, solution=solution, evaluation=ev)


def routing_workloads() -> dict:
    """{"A": Workload, "B": ..., "C": ...}: the routing check's workloads."""
    return {n: new_workload("routing", n, shape) for n, shape in ROUTING_WORKLOADS.items()}


def routing_trace_set(root, *, seed: int) -> Path:
    """Write the grader's trace set for the routing check under ``root`` (new or empty) and return it.

    The definition is the spec's (with a reference that calls the course's). Three synthetic python
    solutions compute the reference attention and then overwrite ``out[0, -1, 0, 0]`` (batch 0, last
    query row, head 0, channel 0) with a tag, an integer in [512, 2048) drawn from ``seed``: no
    attention output holds such a value (it is a weighted mean of rows of v), so the output alone
    says which solution served a call. Their traces:

    * workload A: ``fast_wrong`` is the fastest (3.2x, its time in ``correctness.extra``: flashinfer_bench
      allows no performance on a failed trace) but FAILED (INCORRECT_NUMERICAL); the fastest PASSED
      is ``kernel_x`` (1.6x, then kernel_y 1.2x);
    * workload B: ``kernel_y`` wins (1.7x; kernel_x 1.3x, fast_wrong 1.1x, both PASSED);
    * workload C: no trace at all, an unknown shape: it must go to the fallback.

    Different seeds give different sources, hence different apply-table digests: two routing sets
    never share a cached table (apply/table.py caches it under FIB_CACHE_PATH by a digest of the
    definitions, solutions and traces). Speedups are distinct, so the table does not depend on the
    order of the traces either (ties are broken by order, which the digest leaves out).
    """
    ws = routing_workloads()
    tags = routing_tags(seed)
    solutions = [routing_solution(name, tags[name]) for name in ROUTING_SOLUTIONS]
    traces = [routing_trace(ws[w], s, status, sp) for w, s, status, sp in _ROUTING_TRACES]
    return save_trace_set(root, spec_definition(), solutions, [ws["A"], ws["B"]], traces)


def served_by(out, tags: dict) -> str | None:
    """The synthetic solution whose tag ``out`` holds, or None (the fallback served it)."""
    value = float(out[TAG_INDEX])
    return next((name for name, tag in tags.items() if tag == value), None)


def _routing_verdict(w: str, served: str | None) -> str | None:
    """The teaching message when workload ``w`` was served by ``served`` (None: the fallback)."""
    want = _ROUTING_EXPECT[w]
    if served == want:
        return None
    where = f"workload {w} {ROUTING_WORKLOADS[w][:3]}"
    if w == "C":
        return (f"{where}, a shape with no trace at all, was served by `{served}`, which was never checked "
                "on it: an unknown shape must go to the fallback: use on_miss_policy='fallback_only' "
                "(facourse.interchange.apply_config()); 'use_def_best' sends every miss to the solution "
                "that wins most shapes")
    if served == "fast_wrong" and w == "A":
        return (f"{where} was served by `fast_wrong`, whose trace FAILED its check (INCORRECT_NUMERICAL), "
                f"though it was the fastest: route only to PASSED traces (apply() does: "
                f"TraceSet.filter_traces keeps status PASSED), and among them the highest speedup_factor, "
                f"here `{want}`")
    if served is None:
        return (f"{where} went to the fallback, though `{want}` PASSED on this shape and is the fastest "
                "there: is apply() enabled on this trace set (enable_apply(root, apply_config())) and "
                "called with DEFINITION_NAME? Tolerances below the traces' errors drop every trace "
                "(flashinfer_bench's default ApplyConfig has max_rtol=1e-5; apply_config() has the course's)")
    return (f"{where} was served by `{served}`, but `{want}` has the highest speedup_factor among the PASSED "
            "traces of this shape: route each shape to its fastest PASSED solution")


def check_routing(attn, *, seed: int, device=None, workloads=("A", "B", "C")) -> None:
    """Check a deployment ``attn(q, k, v, causal)`` (definition layout) built on
    :func:`routing_trace_set` ``(root, seed=seed)``, from its outputs only: workload A must be served
    by kernel_x (not the faster fast_wrong, whose trace failed), B by kernel_y, C (no trace) by the
    fallback, and every output must otherwise pass the course's check (the tag element excepted).
    ``workloads``: the ones to call (the grader checks A and B, the routing, apart from C, the fallback).

    Raises :class:`InterchangeCheckError` with what went where and what to change.
    """
    tags = routing_tags(seed)
    for w, workload in routing_workloads().items():
        if w not in workloads:
            continue
        name = describe_workload(workload)
        q, k, v, causal = make_workload_inputs(workload, seed=seed, device=device)
        try:
            out = attn(q, k, v, causal)
        except Exception as e:
            extra = (": a shape with no trace must go to the fallback: pass fallback=... to apply() "
                     "(e.g. definition_run(your_kernel))" if w == "C" else "")
            raise InterchangeCheckError(f"the call on {name} raised {type(e).__name__}: {e}{extra}") from e
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
            got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InterchangeCheckError(f"the call on {name} returned {got}; the definition's out is "
                                        f"{tuple(q.shape)} float16 [batch, seq_q, num_heads, head_dim]")
        served = served_by(out, tags)
        verdict = _routing_verdict(w, served)
        if verdict:
            raise InterchangeCheckError(verdict)
        qc, kc, vc = to_course(q, k, v)
        o = from_course(out).clone()
        if served is not None:  # put the reference's value back where the tag is
            o[0, 0, -1, 0] = _reference_at_tag(qc, kc, vc, causal).to(o.dtype)
        try:
            check_attention(o, qc, kc, vc, causal, config=name, seed=seed)
        except AttentionCheckError as e:
            who = "the fallback" if served is None else f"`{served}`"
            raise InterchangeCheckError(f"{name} was served by {who} (as it should be), but the output is "
                                        f"wrong:\n{e}") from e


def _reference_at_tag(q, k, v, causal) -> torch.Tensor:
    """The reference's value at the tag's place (course layout: batch 0, head 0, last row, channel 0)."""
    return reference_attention(q, k, v, causal)[0][0, 0, -1, 0]


def deployed(deploy, *, seed: int):
    """The attention a student's ``deploy(root) -> attn`` gives on :func:`routing_trace_set` of
    ``seed``: a function ``attn(q, k, v, causal)`` that writes the trace set to a new temporary folder
    (removed with ``attn``) and calls ``deploy`` on it at its first call (so that an error in ``deploy``
    is the call's error)."""
    state = {}

    def attn(q, k, v, causal):
        if "attn" not in state:
            state["folder"] = tempfile.TemporaryDirectory(prefix="facourse_routing_")  # removed with attn
            root = routing_trace_set(Path(state["folder"].name), seed=seed)
            state["attn"] = deploy(root)
        return state["attn"](q, k, v, causal)

    return attn


def check_deployment(deploy, *, seed: int = 0, device=None, workloads=("A", "B", "C")) -> None:
    """:func:`check_routing` of ``deploy(root) -> attn`` on the routing trace set of ``seed``."""
    check_routing(deployed(deploy, seed=seed), seed=seed, device=device, workloads=workloads)
