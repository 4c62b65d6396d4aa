"""Step 11's traces: one solution on one workload, checked by the course's rule and timed by its bench, as a
flashinfer_bench ``Trace``; and the check of a student's own tracing function."""
from __future__ import annotations

import importlib.metadata
import json
import platform
import random
import traceback
from datetime import datetime, timezone

import torch

from ..check import AttentionCheckError, check_attention, nan_filled_allocations, verifying
from ..configs import resolve_device
from ..hw import gpu_name
from ..reference import reference_attention
from .definition import check_definition
from .spec import (DEFINITION_NAME, InterchangeCheckError, as_definition, course_kernel, from_course, load_fib,
                   python_solution, solution_source, spec_definition, to_course)
from .workloads import (TRACE_SHAPES, describe_workload, make_workload_inputs, new_workload, workload_config,
                        workload_names)

def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment(device: torch.device):
    hardware = gpu_name() if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    libs = {name: _version(dist) for name, dist in (("torch", "torch"), ("flashinfer_bench", "flashinfer-bench"),
                                                    ("facourse", "facourse"), ("triton", "triton"),
                                                    ("tilelang", "tilelang"))}
    libs["cuda"] = torch.version.cuda
    return load_fib().Environment(hardware=hardware or "unknown", libs={k: v for k, v in libs.items() if v})


def _evaluation(status: str, device, log: str = "", correctness=None, performance=None):
    fib = load_fib()
    return fib.Evaluation(status=fib.EvaluationStatus(status), environment=_environment(device),
                          timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), log=log,
                          correctness=correctness, performance=performance)


def _errors(out_c, q, k, v, causal, report=None):
    """flashinfer_bench's Correctness: max|o - ref| and the course's relative error max|o - ref| / max|ref|."""
    fib = load_fib()
    if report is not None:
        return fib.Correctness(max_absolute_error=report.max_abs_err, max_relative_error=report.rel_err,
                               extra={"allowed_abs_err": report.allowed_abs_err,
                                      "torch_abs_err": report.torch_abs_err,
                                      "rule": "facourse.check.check_attention"})
    ref, _ = reference_attention(q, k, v, causal)
    err = float((out_c.detach().to(ref.dtype) - ref).abs().max()) if ref.numel() else 0.0
    ref_max = max(float(ref.abs().max()) if ref.numel() else 0.0, 1e-30)
    return fib.Correctness(max_absolute_error=err, max_relative_error=err / ref_max if err == err else err)


def _performance(run, workload, seed, backend):
    """bench_attention's times of ``run`` on the workload's shape (GPU)."""
    from ..bench import bench_attention

    r = bench_attention(course_kernel(run), workload_config(workload), backend=backend,
                        dtype=torch.float16, seed=seed, layout="bshd")
    return load_fib().Performance(latency_ms=r.t_student_ms, reference_latency_ms=r.t_ref_ms,
                              speedup_factor=r.ratio), r.summary()


def _call_and_check(run, workload, seed, device):
    """Draw, call, check. Returns (status, log, correctness)."""
    name = describe_workload(workload)
    q, k, v, causal = make_workload_inputs(workload, seed=seed, device=device)
    copies = [t.clone() for t in (q, k, v)]
    try:
        with nan_filled_allocations(device):
            out = run(q, k, v, causal)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:
        return "RUNTIME_ERROR", f"[{name}] the call raised:\n{''.join(traceback.format_exception(e))}", None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return "INCORRECT_SHAPE", (f"[{name}] out is {got}; the definition's out is [batch, seq_q, "
                                   f"num_heads, head_dim] = {tuple(q.shape)}"), None
    if out.dtype != q.dtype:
        return "INCORRECT_DTYPE", f"[{name}] out has dtype {out.dtype}; the definition's out is {q.dtype}", None
    qc, kc, vc = to_course(*copies)
    for t_name, t, c in zip("qkv", (q, k, v), copies):
        if not torch.equal(t, c):
            return ("INCORRECT_NUMERICAL", f"[{name}] {t_name} was modified by the call: a kernel must leave "
                    "its inputs untouched", _errors(from_course(out), qc, kc, vc, causal))
    try:
        report = check_attention(from_course(out), qc, kc, vc, causal, config=name, seed=seed)
    except AttentionCheckError as e:
        return "INCORRECT_NUMERICAL", str(e), _errors(from_course(out), qc, kc, vc, causal)
    return "PASSED", report.summary(), _errors(None, qc, kc, vc, causal, report)


def trace(definition, solution, run, workload, *, seed: int = 0, device=None,
          backend: str = "FLASH_ATTENTION"):
    """One solution on one workload, as a ``flashinfer_bench.Trace`` (the definition must pass
    :func:`check_definition`: the layout and dtypes below are the spec's).

    Draws the workload's inputs (definition layout, float16, from ``seed``), calls
    ``run(q, k, v, causal)`` (the solution's callable, definition convention; new allocations are
    NaN-filled as in every course check) and checks ``out`` with ``check_attention``. ``run`` may
    instead be the exception that building the solution raised (``BuilderRegistry.build``: a CUDA
    or TileLang solution on a machine without their toolchain): the trace is then COMPILE_ERROR
    with that error in its log, and nothing runs.

    * PASSED, with correctness (max absolute error, the course's relative error max|o-ref|/max|ref|,
      and the check's allowance in ``extra``) and performance;
    * INCORRECT_NUMERICAL with the check's message in ``log`` (also when an input was modified);
      INCORRECT_SHAPE, INCORRECT_DTYPE; RUNTIME_ERROR with the traceback (also when timing raises).

    Performance on a GPU: ``bench_attention`` against SDPA's ``backend`` on the same shape and seed
    (latency_ms, reference_latency_ms, speedup_factor = t_ref / t_solution). On a CPU nothing can be
    timed, yet flashinfer_bench requires performance on a PASSED trace (data/trace.py): it holds
    zeros, and the log says "not timed". Zero is the lowest speedup_factor the model allows, and
    apply() keeps, for each shape, the trace of highest speedup_factor (strictly higher replaces):
    any timed PASSED trace is preferred to an untimed one.
    """
    fib = load_fib()
    d = as_definition(definition)
    check_definition(d)
    device = resolve_device(device)
    if isinstance(run, BaseException):
        status, correctness = "COMPILE_ERROR", None
        log = f"[{describe_workload(workload)}] the build failed:\n{''.join(traceback.format_exception(run))}"
    else:   # verifying(): a trace's status is the check's verdict, also inside a grader's collecting()
        with verifying():
            status, log, correctness = _call_and_check(run, workload, seed, device)
    performance = None
    if status == "PASSED":
        if device.type == "cuda":
            try:
                performance, summary = _performance(run, workload, seed, backend)
                log += "\n" + summary
            except Exception as e:
                status, correctness = "RUNTIME_ERROR", None
                log += "\ntiming raised:\n" + "".join(traceback.format_exception(e))
        else:
            performance = fib.Performance()
            log += "\nnot timed (no GPU): performance holds zeros, below any timed trace"
    sol_name = solution if isinstance(solution, str) else solution.name
    return fib.Trace(definition=d.name, workload=workload, solution=sol_name,
                     evaluation=_evaluation(status, device, log, correctness, performance))


# ----------------------------------------------------------------------------- tracing, checked
#: The candidates of :func:`check_traces`, by role: what the candidate does, its causal alignment,
#: and the status it must be traced with on each workload.
_TRACE_ROLES = {
    "correct": ("computes the reference attention", "bottom_right", dict.fromkeys(TRACE_SHAPES, "PASSED")),
    "top_left": ("aligns causal top-left (PyTorch's is_causal)", "top_left",
                 {"asymmetric": "INCORRECT_NUMERICAL", "ragged": "INCORRECT_NUMERICAL", "noncausal": "PASSED"}),
    "raises": ("raises at every call", None, dict.fromkeys(TRACE_SHAPES, "RUNTIME_ERROR")),
    "unbuildable": ("has a syntax error (its build fails)", None, dict.fromkeys(TRACE_SHAPES, "COMPILE_ERROR")),
}
_TRACE_HINTS = {
    "PASSED": "its output passes the course's check on this shape",
    "INCORRECT_NUMERICAL": "its output fails the course's check here (run the check: trace() does)",
    "RUNTIME_ERROR": "the call raises: catch it and record RUNTIME_ERROR (trace() does)",
    "COMPILE_ERROR": ("BuilderRegistry.build raises for it: record COMPILE_ERROR on each of its workloads "
                      "(pass the exception to trace() in place of run) and go on with the other solutions"),
}


def trace_candidates(*, seed: int):
    """The solutions :func:`check_traces` hands to a student's tracing function: ``(solutions, roles)``
    with ``roles`` ``{solution name: role}`` (names drawn from ``seed``, and one description for all, so
    that neither says which candidate is which: only building and running them does)."""
    rng = random.Random(f"facourse.interchange.traces:{seed}")
    solutions, roles = [], {}
    doc = "A candidate of facourse's tracing check."
    for role, (_, align, _) in _TRACE_ROLES.items():
        name = f"sol_{rng.getrandbits(32):08x}"
        roles[name] = role
        if role == "raises":
            source = f'"""{doc}"""\n\n\ndef run(q, k, v, causal):\n    raise RuntimeError("launch failed: out of resources")\n'
        elif role == "unbuildable":
            source = f'"""{doc}"""\n\n\ndef run(q, k, v, causal)\n    return q\n'
        else:
            source = solution_source(doc, None, align)
        solutions.append(python_solution(name, source, doc))
    rng.shuffle(solutions)
    return solutions, roles


def _trace_workloads() -> list:
    return [new_workload("traces", n, shape) for n, shape in TRACE_SHAPES.items()]


def as_json(obj) -> str:
    """A flashinfer_bench model (or a dict, or JSON text) as JSON text: what a graded function's
    result is reduced to before it leaves the notebook's kernel."""
    if hasattr(obj, "model_dump_json"):
        return obj.model_dump_json()
    return obj if isinstance(obj, str) else json.dumps(obj)


def check_traces(trace_solutions, *, seed: int = 0) -> None:
    """Check a student's ``trace_solutions(definition, solutions, workloads) -> list of Trace`` (or of
    their JSON) on the grader's candidates (:func:`trace_candidates`): one that is correct, one with
    top-left causal, one that raises and one whose build fails, on three CPU workloads (two causal
    with seq_q < seq_kv, one non-causal). Every (solution, workload) must have exactly one trace, of
    this definition, with the right status; a PASSED one holds correctness and performance.

    Raises :class:`InterchangeCheckError` naming the solution's role, the workload and the fix.
    """
    fib = load_fib()
    solutions, roles = trace_candidates(seed=seed)
    ws = _trace_workloads()
    try:
        got = trace_solutions(spec_definition(), solutions, ws)
    except Exception as e:
        raise InterchangeCheckError(
            f"trace_solutions raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n  "
            "a candidate that fails to build or to run is a trace with that status, not a stop: "
            + _TRACE_HINTS["COMPILE_ERROR"]) from e
    if not isinstance(got, (list, tuple)):
        raise InterchangeCheckError(f"trace_solutions returned {type(got).__name__}; it must return a list of "
                                    "flashinfer_bench Trace, one per (solution, workload)")
    traces = {}
    for i, t in enumerate(got):
        try:
            t = fib.Trace.model_validate_json(as_json(t))
        except Exception as e:
            raise InterchangeCheckError(f"item {i} of the returned list is not a flashinfer_bench Trace: "
                                        f"{str(e).splitlines()[0]}") from e
        key = (t.solution, workload_names().get(t.workload.uuid, t.workload.uuid))
        if key in traces:
            raise InterchangeCheckError(f"two traces of solution {key[0]} on workload {key[1]}: one per pair")
        traces[key] = t
    for sol in solutions:
        role = roles[sol.name]
        for w in ws:
            wname = workload_names()[w.uuid]
            want = _TRACE_ROLES[role][2][wname]
            where = f"the candidate that {_TRACE_ROLES[role][0]} ({sol.name}) on workload {describe_workload(w)}"
            t = traces.get((sol.name, wname))
            if t is None:
                raise InterchangeCheckError(f"no trace of {where}: trace every solution on every workload"
                                            + (f"; {_TRACE_HINTS[want]}" if want == "COMPILE_ERROR" else ""))
            if t.definition != DEFINITION_NAME:
                raise InterchangeCheckError(f"the trace of {where} names definition {t.definition!r}, "
                                            f"not {DEFINITION_NAME!r}")
            status = t.evaluation.status.value
            if status != want:
                raise InterchangeCheckError(f"{where} was traced {status}; it must be {want}: {_TRACE_HINTS[want]}")
            if status == "PASSED" and (t.evaluation.correctness is None or t.evaluation.performance is None):
                raise InterchangeCheckError(f"the PASSED trace of {where} lacks correctness or performance: "
                                            "apply() ranks PASSED traces by performance.speedup_factor")
    extra = sorted({k for k in traces} - {(s.name, workload_names()[w.uuid]) for s in solutions for w in ws})
    if extra:
        raise InterchangeCheckError(f"traces of pairs that were not asked for: {extra}")
