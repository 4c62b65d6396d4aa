"""Step 11: one operator, interchangeable kernels — FlashInfer-Bench's definition, traces and apply().

FlashInfer-Bench (``flashinfer_bench``) describes an operator once, as a ``Definition`` (its axes,
its tensors, a PyTorch reference), and keeps any number of kernels for it as ``Solution``\\ s. A
``Workload`` is one concrete shape; a ``Trace`` records how one solution did on one workload
(PASSED or why not, its error, its time). ``enable_apply(root, config)`` reads a folder of these and
``apply(name, args=..., fallback=...)`` then sends each call to the fastest solution that PASSED on
the call's shape, or to the fallback when there is none.

The step's operator (the seed's spec, :data:`SPEC`): ``mini_flash_attention_prefill``, op_type
``gqa_ragged``, ``run(q, k, v, causal) -> out`` with

* ``q [batch, seq_q, num_heads, head_dim]``, ``k, v [batch, seq_kv, num_kv_heads, head_dim]``,
  float16; ``causal`` a scalar bool; ``out`` like q;
* batch, seq_q and seq_kv vary from call to call (var axes); num_heads = 32, num_kv_heads = 8 and
  head_dim = 128 are fixed (const axes).

Its layout ``[batch, seq, heads, dim]`` is the course's ``[B, H, S, D]`` transposed: a view, no copy
(:func:`to_course`, :func:`from_course`, :func:`definition_run`). The meaning is the course's
(``facourse.reference``): GQA (query head h reads KV head h // 4), causal aligned bottom-right, a row
that sees no key gives 0.

What this module gives the exercise and the grader:

* :func:`check_definition` and :func:`check_definition_reference`: a student's definition against
  the spec, and its reference against the course's one correctness rule;
* :func:`workloads` and :func:`make_workload_inputs`: the seed's shapes (and a CPU profile) as
  flashinfer_bench workloads, and their inputs drawn by ``facourse.configs.make_inputs``;
* :func:`trace`: one solution on one workload, checked by ``facourse.check.check_attention`` and timed
  by ``facourse.bench.bench_attention`` (on a GPU), as a flashinfer_bench ``Trace``;
* :func:`apply_config` and :func:`save_trace_set`: the tolerances and miss policy of a safe
  deployment, and a trace set on disk that ``enable_apply`` reads;
* :func:`routing_trace_set` and :func:`check_routing`: the grader's test of a deployment, from its
  outputs alone.

flashinfer_bench is imported inside the functions that need it, so that ``import facourse`` works
where it is not installed.
"""
from __future__ import annotations

import ast
import copy
import importlib.metadata
import platform
import random
import re
import traceback
import uuid as uuidlib
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import torch

from .check import REL_LIMIT, AttentionCheckError, _normalise, check_attention, nan_filled_allocations, verifying
from .configs import CONFIGS, LONG_CONFIG, AttnConfig, make_inputs, resolve_device
from .hw import gpu_name
from .reference import reference_attention

# ----------------------------------------------------------------------------- the spec
DEFINITION_NAME = "mini_flash_attention_prefill"
OP_TYPE = "gqa_ragged"

#: The axes: var ones change from call to call, const ones are fixed by the definition.
AXES = {
    "batch": {"type": "var"},
    "seq_q": {"type": "var"},
    "seq_kv": {"type": "var"},
    "num_heads": {"type": "const", "value": 32},
    "num_kv_heads": {"type": "const", "value": 8},
    "head_dim": {"type": "const", "value": 128},
}

#: The inputs, in the calling order of ``run(q, k, v, causal)``; ``shape: None`` is a scalar.
INPUTS = {
    "q": {"shape": ["batch", "seq_q", "num_heads", "head_dim"], "dtype": "float16"},
    "k": {"shape": ["batch", "seq_kv", "num_kv_heads", "head_dim"], "dtype": "float16"},
    "v": {"shape": ["batch", "seq_kv", "num_kv_heads", "head_dim"], "dtype": "float16"},
    "causal": {"shape": None, "dtype": "bool"},
}

OUTPUTS = {"out": {"shape": ["batch", "seq_q", "num_heads", "head_dim"], "dtype": "float16"}}

#: Everything of the definition but its reference: ``Definition(**SPEC, reference=source)``.
SPEC = {"name": DEFINITION_NAME, "op_type": OP_TYPE, "axes": AXES, "inputs": INPUTS, "outputs": OUTPUTS}

HQ, HKV, HEAD_DIM = (AXES[a]["value"] for a in ("num_heads", "num_kv_heads", "head_dim"))

#: The seed's workloads, (batch, seq_q, seq_kv, causal), for a GPU: the course's five configurations
#: and long (facourse.configs), with the definition's heads (long: 32/8 here, not 16/16). ``medium``
#: and ``noncausal`` share one shape: apply()'s key holds the var axes only, not ``causal``.
WORKLOADS = {name: (c.B, c.Sq, c.Skv, c.causal) for name, c in {**CONFIGS, "long": LONG_CONFIG}.items()}

#: The CPU profile: the same heads and head_dim, short sequences, every shape distinct. asymmetric
#: (seq_q < seq_kv, causal) tells a top-left causal mask from a bottom-right one; empty_rows
#: (seq_q > seq_kv, causal) has rows that see no key; decode has one query.
CPU_WORKLOADS = {
    "small": (1, 64, 64, True),
    "asymmetric": (1, 64, 256, True),
    "noncausal": (2, 128, 128, False),
    "ragged": (1, 200, 333, True),
    "empty_rows": (1, 160, 96, True),
    "decode": (1, 1, 333, True),
}

PROFILES = {"gpu": WORKLOADS, "cpu": CPU_WORKLOADS}

#: apply()'s tolerances (see :func:`apply_config`): the course's rule decides PASSED; these only
#: have to let every trace that passed through. Rule 3 bounds max|o - ref| < REL_LIMIT · max|ref|,
#: which is what :func:`trace` records as the relative error; and max|ref| <= max|v| (each output
#: row is a weighted mean of rows of v), with v drawn from N(0, 1) by make_inputs, below 10.
APPLY_MAX_RTOL = REL_LIMIT
APPLY_MAX_ATOL = 10 * REL_LIMIT


class InterchangeCheckError(AssertionError):
    """A definition, its reference or a deployment that breaks the step's contract; the message
    says which field or call, what it is, what the spec wants and why it matters."""


def _fib():
    """flashinfer_bench, or a plain error saying how to get it."""
    try:
        import flashinfer_bench
    except ImportError as e:  # pragma: no cover - the course's environment has it
        raise ImportError("step 11 needs FlashInfer-Bench: ./course.sh setup installs it, or "
                          "pip install --no-deps flashinfer-bench==0.1.2 pydantic safetensors docstring-parser "
                          "(without --no-deps pip also fetches flashinfer-python, about 2 GB, which the "
                          "course does not use)") from e
    return flashinfer_bench


# ----------------------------------------------------------------------------- layouts
def to_course(q, k, v):
    """Definition layout ``[batch, seq, heads, dim]`` -> the course's ``[B, H, S, D]``: views, no copy."""
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def from_course(o):
    """The course's ``o [B, Hq, Sq, D]`` -> the definition's ``out [batch, seq_q, num_heads, head_dim]``,
    a view."""
    return o.transpose(1, 2)


def definition_run(kernel):
    """A course kernel ``kernel(q, k, v, causal=...) -> (o, lse)`` (or ``-> o``) as the definition's
    ``run(q, k, v, causal) -> out``, in the definition's layout: views both ways, no copy. ``out``
    is in q's dtype, as the definition says (``.to`` is a no-op for a kernel that returns it; the
    references compute in float64 on a CPU)."""
    def run(q, k, v, causal):
        o, _ = _normalise(kernel(*to_course(q, k, v), causal=bool(causal)), False, "[run]")
        return from_course(o.to(q.dtype))

    run.__name__ = f"definition_run({getattr(kernel, '__name__', 'kernel')})"
    return run


def _course_kernel(run):
    """The definition's ``run`` as a course-contract function (what ``bench_attention`` times)."""
    def kernel(q, k, v, causal=False):
        out = run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)   # [B, S, H, D] views
        return out.transpose(1, 2)                                                     # o [B, H, S, D]

    return kernel


# ----------------------------------------------------------------------------- definitions
def _as_definition(defn):
    """A flashinfer_bench Definition from a Definition, its JSON text or its dict."""
    fib = _fib()
    if isinstance(defn, fib.Definition):
        return defn
    try:
        if isinstance(defn, (str, bytes)):
            return fib.Definition.model_validate_json(defn)
        return fib.Definition.model_validate(defn)
    except Exception as e:  # pydantic's ValidationError: undefined axes, no run(), a bad dtype, ...
        raise InterchangeCheckError(
            f"the definition does not load as a flashinfer_bench Definition: {e}") from e


_VAR_WHAT = {"batch": "the batch size", "seq_q": "the number of query tokens",
             "seq_kv": "the number of key/value tokens"}
_CONST_WHAT = {"num_heads": "query heads", "num_kv_heads": "key/value heads", "head_dim": "channels per head"}


def _axis_problem(name, axis) -> str | None:
    want = AXES[name]
    if want["type"] == "var" and axis.type == "const":
        return (f"axis {name!r} is const ({axis.value}); the spec makes it var: {_VAR_WHAT[name]} changes "
                "from call to call. A const axis has one value in every workload (flashinfer_bench draws "
                "inputs at that size) and is left out of apply()'s lookup key (apply/key.py: the key "
                f"holds the var axes only), so calls of every {name} would share one table entry, "
                "chosen from traces measured at one size")
    if want["type"] == "const" and axis.type == "var":
        return (f"axis {name!r} is var; the spec pins it to const {want['value']}: the kernels are written "
                f"and tuned for {want['value']} {_CONST_WHAT[name]} (tiles, the GQA group of "
                f"{HQ // HKV} query heads per KV head), and the const says so. As var it joins apply()'s "
                "lookup key (apply/key.py keys on the var axes only) and every workload must give its "
                "value. apply() never compares a const axis with the call's tensors "
                "(Definition.get_axes_values reads var axes only): a const is a promise the kernels "
                "rely on, not a check at call time")
    if want["type"] == "const" and axis.value != want["value"]:
        return (f"axis {name!r} is const {axis.value}; the spec pins it to {want['value']}: flashinfer_bench "
                "draws every workload's inputs at the const size (Definition.get_input_shapes), so the "
                "traces would measure another problem than the one the model calls")
    return None


def _names_problem(kind: str, got: list, want: list) -> str | None:
    if got == want:
        return None
    return (f"the {kind} are {got}; the spec's are {want}, in this order: the order is the calling "
            "convention. apply(args=(q, k, v, causal)) and every solution's run(q, k, v, causal) bind "
            "arguments by position (Definition.merge_kwargs_to_args), and the output is returned as is")


def _tensor_problems(name, spec) -> list[str]:
    want = {**INPUTS, **OUTPUTS}[name]
    out = []
    if name == "causal":
        if spec.shape is not None:
            out.append(f"input 'causal' has shape {spec.shape} (a tensor); the spec makes it a scalar "
                       "(shape null) of dtype bool: run() gets a Python bool that the host branches on "
                       "when it picks the kernel; a tensor would have to be read back from the device "
                       "on every call, and flashinfer_bench draws a tensor input at random unless each "
                       "workload gives its value")
    elif spec.shape != want["shape"]:
        why = ("the definition's layout is [batch, seq, heads, head_dim] (the course's [B, H, S, D] "
               "transposed, a view)")
        if name in ("k", "v") and "num_heads" in spec.shape:
            why = (f"K and V carry num_kv_heads = {HKV} heads, each read by {HQ // HKV} query heads "
                   "(GQA); with num_heads the definition describes multi-head attention, and inputs "
                   f"drawn from it have {HQ} KV heads, {HQ // HKV}x the K/V memory of the model")
        out.append(f"{'output' if name in OUTPUTS else 'input'} {name!r} has shape {spec.shape}; "
                   f"the spec wants {want['shape']}: {why}")
    if spec.dtype.value != want["dtype"]:
        why = ("causal is a flag" if name == "causal" else
               "the dtype is part of the contract: workload inputs are drawn in it, and a trace "
               "measured in another dtype says nothing about float16 calls; apply() does not look at "
               "dtypes (its key holds the var axes only), so it would route float16 calls on those traces")
        out.append(f"{name!r} has dtype {spec.dtype.value}; the spec wants {want['dtype']}: {why}")
    return out


def _reference_problem(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"the reference is not valid Python: {e}"
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs:
        return ("the reference defines no top-level run(q, k, v, causal): flashinfer_bench builds the "
                "reference like a solution whose entry point is main.py::run")
    args = runs[-1].args
    n = len(args.posonlyargs) + len(args.args)
    if n != len(INPUTS) or args.vararg:
        names = [a.arg for a in args.posonlyargs + args.args]
        return (f"the reference's run takes {names}; the spec's is run(q, k, v, causal): flashinfer_bench "
                "calls it with the inputs in order (bench/evaluators/default.py: ref_runnable(*inputs))")
    return None


def check_definition(defn) -> None:
    """Check a definition (a ``flashinfer_bench.Definition``, its JSON text or its dict) against the
    spec: name, op_type, each axis's kind and const value, each input's and output's shape and dtype,
    ``causal`` a scalar bool, a reference defining ``run(q, k, v, causal)``.

    Raises :class:`InterchangeCheckError` listing every difference, each with why it matters.
    """
    d = _as_definition(defn)
    problems = []
    if d.name != DEFINITION_NAME:
        problems.append(f"name is {d.name!r}; the spec names it {DEFINITION_NAME!r}: apply(name, ...) and "
                        "every Solution's `definition` find the definition by this exact name; under "
                        "another one every call falls back")
    if d.op_type != OP_TYPE:
        problems.append(f"op_type is {d.op_type!r}; the spec wants {OP_TYPE!r}: the op_type is the "
                        "operator's category (a trace set files traces under traces/<op_type>/) and picks "
                        "apply()'s key builder by name (apply/key.py)")
    for name in AXES:
        if name not in d.axes:
            problems.append(f"axis {name!r} is missing; the spec's axes are {list(AXES)}")
        else:
            problems.append(_axis_problem(name, d.axes[name]))
    for name in d.axes:
        if name not in AXES:
            problems.append(f"axis {name!r} is not in the spec (its axes are {list(AXES)}): a var axis "
                            "that no input uses can never be bound, and apply() then fails on every call "
                            "(Definition.get_axes_values: 'Missing values for variable axes')")
    problems.append(_names_problem("inputs", list(d.inputs), list(INPUTS)))
    problems.append(_names_problem("outputs", list(d.outputs), list(OUTPUTS)))
    for name, spec in {**d.inputs, **d.outputs}.items():
        if name in INPUTS or name in OUTPUTS:
            problems.extend(_tensor_problems(name, spec))
    problems.append(_reference_problem(d.reference))
    problems = [p for p in problems if p]
    if problems:
        raise InterchangeCheckError("the definition differs from the spec:\n" +
                                    "\n".join(f"  - {p}" for p in problems))


def definition_reference_run(defn):
    """The ``run`` of a definition's reference source, executed in a fresh namespace."""
    d = _as_definition(defn)
    namespace = {"__name__": f"definition_reference_{re.sub(r'[^0-9A-Za-z_]', '_', d.name)}"}
    exec(compile(d.reference, f"<reference of {d.name}>", "exec"), namespace)
    if not callable(namespace.get("run")):
        raise InterchangeCheckError("the definition's reference defines no function run(q, k, v, causal)")
    return namespace["run"]


_REFERENCE_HINTS = (
    ("top-left", "in PyTorch, is_causal=True (and torch.tril of a [seq_q, seq_kv] matrix) masks j > i, "
                 "top-left; the definition's causal keeps key j for query i iff j <= i + seq_kv - seq_q"),
    ("h % Hkv", f"expand K and V with repeat_interleave({HQ // HKV}, dim=2) (head h reads KV head "
                f"h // {HQ // HKV}); .repeat(1, 1, {HQ // HKV}, 1) tiles them, head h reading h % {HKV}"),
    ("scale", "scale the scores by 1 / sqrt(head_dim) once, before the softmax"),
)


def _reference_output_problem(out, q, name: str) -> str | None:
    B, Sq, H, D = q.shape
    if isinstance(out, (tuple, list)):
        return (f"the reference returned a {type(out).__name__} of {len(out)} on {name}; the definition "
                "has one output, out: return it alone")
    if not isinstance(out, torch.Tensor):
        return f"the reference returned {type(out).__name__} on {name}; it must return the tensor out"
    if tuple(out.shape) == (B, H, Sq, D) and H != Sq:
        return (f"the reference returned shape {tuple(out.shape)} on {name}: that is the course layout "
                f"[B, H, S, D]; the definition's out is [batch, seq_q, num_heads, head_dim] = "
                f"{(B, Sq, H, D)}: return o.transpose(1, 2)")
    if tuple(out.shape) != tuple(q.shape):
        return (f"the reference returned shape {tuple(out.shape)} on {name}; the definition's out is "
                f"[batch, seq_q, num_heads, head_dim] = {tuple(q.shape)}")
    return None


def check_definition_reference(run, *, seed: int = 0, device=None) -> None:
    """Call a definition's reference ``run(q, k, v, causal)`` on the CPU workloads (definition layout,
    float16, drawn from ``seed``) and apply the course's check to each output.

    The workloads include seq_q < seq_kv causal (a top-left causal mask shows there) and
    seq_q > seq_kv causal (rows with no key). Raises :class:`InterchangeCheckError` naming the workload
    and the likely cause.
    """
    for w in workloads("cpu"):
        name = describe_workload(w)
        q, k, v, causal = make_workload_inputs(w, seed=seed, device=device)
        try:
            out = run(q, k, v, causal)
        except Exception as e:
            raise InterchangeCheckError(
                f"the definition's reference raised on {name}: {type(e).__name__}: {e}. If the sizes "
                f"{HQ} and {HKV} clash: q has {HQ} heads, K and V {HKV}; expand K and V to {HQ} heads "
                f"with repeat_interleave({HQ // HKV}, dim=2) before Q Kᵀ") from e
        problem = _reference_output_problem(out, q, name)
        if problem:
            raise InterchangeCheckError(problem)
        try:
            check_attention(from_course(out), *to_course(q, k, v), causal, config=name, seed=seed)
        except AttentionCheckError as e:
            hints = [h for key, h in _REFERENCE_HINTS if key in str(e)]
            hint = f"\n  in the definition's terms: {hints[0]}" if hints else ""
            raise InterchangeCheckError(f"the definition's reference is wrong on {name}:\n{e}{hint}") from e


@cache
def _spec_definition():
    """The spec as a Definition, with a reference that calls the course's (the grader's own)."""
    return _fib().Definition(**copy.deepcopy(SPEC), reference=_solution_source(
        "The spec's reference: the course's reference attention, in the definition's layout."))


# ----------------------------------------------------------------------------- workloads
def _workload_uuid(profile: str, name: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"facourse/{DEFINITION_NAME}/{profile}/{name}"))


def _workload(profile: str, name: str, shape):
    fib = _fib()
    from flashinfer_bench.data.workload import ScalarInput

    batch, seq_q, seq_kv, causal = shape
    return fib.Workload(axes={"batch": batch, "seq_q": seq_q, "seq_kv": seq_kv},
                        inputs={"q": fib.RandomInput(), "k": fib.RandomInput(), "v": fib.RandomInput(),
                                "causal": ScalarInput(value=bool(causal))},
                        uuid=_workload_uuid(profile, name))


def workloads(profile: str = "gpu") -> list:
    """The seed's workloads (``"gpu"``) or the CPU profile (``"cpu"``) as flashinfer_bench ``Workload``\\ s.

    ``axes`` holds the var axes only: apply() keys a call on the var axes it reads from the tensors,
    and a workload whose axes also named a const axis would never match a call (apply/key.py:
    ``build_from_workload`` keys on every entry of ``workload.axes``). ``causal`` is a scalar input
    with its value; it is not part of apply()'s key, so two workloads that differ only in causal
    (``medium`` and ``noncausal``) are one table entry: a solution serves both if it is the fastest
    PASSED on either, so trace every solution on both.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {tuple(PROFILES)}, not {profile!r}")
    return [_workload(profile, name, shape) for name, shape in PROFILES[profile].items()]


def _shape(workload) -> tuple:
    try:
        c = workload.inputs["causal"]
        return (workload.axes["batch"], workload.axes["seq_q"], workload.axes["seq_kv"], bool(c.value))
    except (KeyError, AttributeError) as e:
        raise ValueError("a workload of this definition gives batch, seq_q and seq_kv in axes and causal "
                         f"as a scalar input; got axes {dict(workload.axes)}, inputs "
                         f"{list(workload.inputs)}") from e


def _names() -> dict:
    out = {_workload_uuid(p, n): n for p, table in PROFILES.items() for n in table}
    out.update({_workload_uuid("routing", n): f"workload {n}" for n in _ROUTING_WORKLOADS})
    out.update({_workload_uuid("traces", n): n for n in _TRACE_SHAPES})
    return out


def describe_workload(workload) -> str:
    """``small (batch 1, seq_q 64, seq_kv 64, causal)``: a workload's name (if it is one of this
    module's) and shape, for messages."""
    batch, seq_q, seq_kv, causal = _shape(workload)
    name = _names().get(workload.uuid, f"workload {workload.uuid}")
    return f"{name} (batch {batch}, seq_q {seq_q}, seq_kv {seq_kv}, {'causal' if causal else 'non-causal'})"


def workload_config(workload) -> AttnConfig:
    """The course's configuration of a workload (the spec's heads and head_dim)."""
    batch, seq_q, seq_kv, causal = _shape(workload)
    return AttnConfig(describe_workload(workload), batch, HQ, HKV, seq_q, seq_kv, HEAD_DIM, causal)


def make_workload_inputs(workload, *, seed: int = 0, device=None, dtype=torch.float16):
    """``(q, k, v, causal)`` of a workload in the definition's layout, drawn from ``seed`` by
    ``facourse.configs.make_inputs`` (its ``[B, S, H, D]`` storage, so these are contiguous and
    :func:`to_course` gives exactly the views the course's checks draw)."""
    cfg = workload_config(workload)
    q, k, v = make_inputs(cfg, seed, resolve_device(device), dtype, layout="bshd")
    return (*(t.transpose(1, 2) for t in (q, k, v)), cfg.causal)


# ----------------------------------------------------------------------------- traces
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
    return _fib().Environment(hardware=hardware or "unknown", libs={k: v for k, v in libs.items() if v})


def _evaluation(status: str, device, log: str = "", correctness=None, performance=None):
    fib = _fib()
    return fib.Evaluation(status=fib.EvaluationStatus(status), environment=_environment(device),
                          timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), log=log,
                          correctness=correctness, performance=performance)


def _errors(out_c, q, k, v, causal, report=None):
    """flashinfer_bench's Correctness: max|o - ref| and the course's relative error max|o - ref| / max|ref|."""
    fib = _fib()
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
    from .bench import bench_attention

    r = bench_attention(_course_kernel(run), workload_config(workload), backend=backend,
                        dtype=torch.float16, seed=seed, layout="bshd")
    return _fib().Performance(latency_ms=r.t_student_ms, reference_latency_ms=r.t_ref_ms,
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
    fib = _fib()
    d = _as_definition(definition)
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
#: The workloads of :func:`check_traces` (batch, seq_q, seq_kv, causal): small, since each candidate
#: runs on each; two causal with seq_q < seq_kv (top-left and bottom-right causal differ) and one
#: non-causal (where they agree).
_TRACE_SHAPES = {"asymmetric": (1, 24, 72, True), "ragged": (1, 37, 53, True), "noncausal": (1, 32, 32, False)}

#: The candidates of :func:`check_traces`, by role: what the candidate does, its causal alignment,
#: and the status it must be traced with on each workload.
_TRACE_ROLES = {
    "correct": ("computes the reference attention", "bottom_right", dict.fromkeys(_TRACE_SHAPES, "PASSED")),
    "top_left": ("aligns causal top-left (PyTorch's is_causal)", "top_left",
                 {"asymmetric": "INCORRECT_NUMERICAL", "ragged": "INCORRECT_NUMERICAL", "noncausal": "PASSED"}),
    "raises": ("raises at every call", None, dict.fromkeys(_TRACE_SHAPES, "RUNTIME_ERROR")),
    "unbuildable": ("has a syntax error (its build fails)", None, dict.fromkeys(_TRACE_SHAPES, "COMPILE_ERROR")),
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
    fib = _fib()
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
            source = _solution_source(doc, None, align)
        solutions.append(fib.Solution(
            name=name, definition=DEFINITION_NAME, author="facourse.interchange",
            spec=fib.BuildSpec(language="python", target_hardware=["cpu", "cuda"], entry_point="main.py::run",
                               destination_passing_style=False),
            sources=[fib.SourceFile(path="main.py", content=source)], description=doc))
    rng.shuffle(solutions)
    return solutions, roles


# ----------------------------------------------------------------------------- the student's own kernels
#: The exercises whose kernels exercise 11 registers as solutions: step -> (the exercise's folder, the
#: notebook cells (nbgrader grade_id) that define the kernel and what it imports, its entry point, the
#: files beside the notebook that the kernel is built from, the hardware it runs on).
STUDENT_KERNELS = {
    "05": ("05_triton_flash_attention", ("setup", "kernel", "wrapper"), "flash_attention_triton", (),
           ["cpu", "cuda"]),
    "06": ("06_cuda_flash_attention", ("imports", "entry_point"), "flash_attention_cuda",
           ("student_kernel.cu", "fa_binding.cpp", "fa_harness.cuh", "fa_params.h", "fa_primitives.cuh"), ["cuda"]),
}

# a kernel built from files beside its notebook finds them beside its main.py, where FlashInfer-Bench
# writes a solution's sources (exercise 06's cells read this notebook's folder, Path.cwd())
_BESIDE_MAIN = ("KERNEL_DIR = Path(__file__).resolve().parent   # the solution's sources (facourse.interchange)\n"
                'STUDENT_SOURCE = KERNEL_DIR / "student_kernel.cu"\n')


def notebook_cells(path, grade_ids) -> list[str]:
    """The sources of a notebook's code cells ``grade_ids`` (nbgrader's cell ids), in that order."""
    import json

    cells = {}
    for c in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if c["cell_type"] == "code" and gid in grade_ids:
            cells[gid] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    missing = [g for g in grade_ids if g not in cells]
    if missing:
        raise ValueError(f"{path}: no code cell {missing} (is it the course's notebook?)")
    return [cells[g] for g in grade_ids]


def student_solution(folder, step: str):
    """Your kernel of exercise ``step`` ("05": Triton, "06": CUDA) as a flashinfer_bench Solution of the
    definition: the notebook's cells that define it (and the files it is built from) in its sources, and a
    ``run`` in the definition's layout (:func:`definition_run`). ``folder`` is the exercise's folder, with
    the notebook as you saved it. The Triton kernel runs on a CPU in Triton's interpreter (its setup
    cell switches it on without a GPU); the CUDA one needs a GPU."""
    fib = _fib()
    name, cell_ids, entry, files, hardware = STUDENT_KERNELS[step]
    folder = Path(folder)
    cells = notebook_cells(folder / f"{name}.ipynb", cell_ids)
    if files:
        cells.insert(1, _BESIDE_MAIN)
    main = (f'"""Exercise {step}\'s kernel ({entry}), from {name}.ipynb, as a solution of the definition."""\n'
            + "\n\n".join(cells)
            + f"\n\n\nfrom facourse.interchange import definition_run\n\nrun = definition_run({entry})\n")
    sources = [fib.SourceFile(path="main.py", content=main)]
    sources += [fib.SourceFile(path=f, content=(folder / f).read_text(encoding="utf-8")) for f in files]
    return fib.Solution(name=f"your_{'triton' if step == '05' else 'cuda'}", definition=DEFINITION_NAME,
                        author="you", spec=fib.BuildSpec(language="python", target_hardware=hardware,
                                                         entry_point="main.py::run", destination_passing_style=False),
                        sources=sources, description=f"exercise {step}'s {entry}, from {folder / (name + '.ipynb')}")


def student_solutions(root) -> dict:
    """Your exercise 05 and 06 kernels found under ``root`` (the folder that holds your exercise folders):
    ``{step: Solution, or the reason there is none}``."""
    out = {}
    for step, (name, *_rest) in STUDENT_KERNELS.items():
        try:
            out[step] = student_solution(Path(root) / name, step)
        except (OSError, ValueError) as err:
            out[step] = f"{type(err).__name__}: {err}"
    return out


def _trace_workloads() -> list:
    return [_workload("traces", n, shape) for n, shape in _TRACE_SHAPES.items()]


def as_json(obj) -> str:
    """A flashinfer_bench model (or a dict, or JSON text) as JSON text: what a graded function's
    result is reduced to before it leaves the notebook's kernel."""
    import json

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
    fib = _fib()
    solutions, roles = trace_candidates(seed=seed)
    ws = _trace_workloads()
    try:
        got = trace_solutions(_spec_definition(), solutions, ws)
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
        key = (t.solution, _names().get(t.workload.uuid, t.workload.uuid))
        if key in traces:
            raise InterchangeCheckError(f"two traces of solution {key[0]} on workload {key[1]}: one per pair")
        traces[key] = t
    for sol in solutions:
        role = roles[sol.name]
        for w in ws:
            wname = _names()[w.uuid]
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
    extra = sorted({k for k in traces} - {(s.name, _names()[w.uuid]) for s in solutions for w in ws})
    if extra:
        raise InterchangeCheckError(f"traces of pairs that were not asked for: {extra}")


# ----------------------------------------------------------------------------- deployment
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
    return _fib().ApplyConfig(**{**fields, **changes})


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
    fib = _fib()
    d = _as_definition(definition)
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
#: The routing check's shapes (batch, seq_q, seq_kv, causal): A and B have traces, C has none.
_ROUTING_WORKLOADS = {"A": (1, 64, 192, True), "B": (2, 96, 96, True), "C": (1, 80, 240, True)}

#: Its traces: (workload, solution, status, speedup_factor). On A the fastest is fast_wrong, which
#: FAILED (top-left causal); the fastest PASSED is kernel_x. On B kernel_y wins (fast_wrong passes
#: there: on a square shape top-left and bottom-right causal agree).
_ROUTING_TRACES = (
    ("A", "fast_wrong", "INCORRECT_NUMERICAL", 3.2),
    ("A", "kernel_x", "PASSED", 1.6),
    ("A", "kernel_y", "PASSED", 1.2),
    ("B", "kernel_y", "PASSED", 1.7),
    ("B", "kernel_x", "PASSED", 1.3),
    ("B", "fast_wrong", "PASSED", 1.1),
)
_ROUTING_SOLUTIONS = ("kernel_x", "kernel_y", "fast_wrong")
_ROUTING_EXPECT = {"A": "kernel_x", "B": "kernel_y", "C": None}

#: The element each synthetic solution overwrites with its tag, in the definition's layout: batch 0,
#: the last query row (it sees every key), head 0, channel 0.
TAG_INDEX = (0, -1, 0, 0)


def _routing_tags(seed: int) -> dict:
    """Each synthetic solution's tag: a distinct integer in [512, 2048), drawn from ``seed`` (exact in
    float16). Attention outputs are weighted means of rows of v (|v| < 10), so none reaches it."""
    rng = random.Random(f"facourse.interchange.routing:{seed}")
    values = rng.sample(range(512, 2048), len(_ROUTING_SOLUTIONS))
    return dict(zip(_ROUTING_SOLUTIONS, map(float, values)))


def _solution_source(doc: str, tag: float | None = None, align: str = "bottom_right") -> str:
    """A small Python solution (or reference): the course's reference attention in the definition's
    layout, top-left causal if ``align`` says so, with out[TAG_INDEX] overwritten by ``tag``."""
    tag_line = "" if tag is None else f"    out[{', '.join(map(str, TAG_INDEX))}] = {tag!r}  # the tag\n"
    return (f'"""{doc}"""\n'
            "from facourse.reference import reference_attention\n\n\n"
            "def run(q, k, v, causal):\n"
            "    o, _ = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
            f"causal, align={align!r})\n"
            "    out = o.to(q.dtype).transpose(1, 2).contiguous()\n"
            f"{tag_line}"
            "    return out\n")


def _routing_solution(name: str, tag: float):
    fib = _fib()
    align = "top_left" if name == "fast_wrong" else "bottom_right"
    doc = (f"Synthetic solution {name} of facourse's routing check: the reference attention "
           f"({align.replace('_', '-')} causal), tagged with {tag!r} at out{list(TAG_INDEX)}.")
    return fib.Solution(name=name, definition=DEFINITION_NAME, author="facourse.interchange",
                        spec=fib.BuildSpec(language="python", target_hardware=["cpu", "cuda"],
                                           entry_point="main.py::run", destination_passing_style=False),
                        sources=[fib.SourceFile(path="main.py", content=_solution_source(doc, tag, align))],
                        description=doc)


def _routing_trace(workload, solution: str, status: str, speedup: float):
    fib = _fib()
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


def _routing_workloads() -> dict:
    return {n: _workload("routing", n, shape) for n, shape in _ROUTING_WORKLOADS.items()}


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
    ws = _routing_workloads()
    tags = _routing_tags(seed)
    solutions = [_routing_solution(name, tags[name]) for name in _ROUTING_SOLUTIONS]
    traces = [_routing_trace(ws[w], s, status, sp) for w, s, status, sp in _ROUTING_TRACES]
    return save_trace_set(root, _spec_definition(), solutions, [ws["A"], ws["B"]], traces)


def _served_by(out, tags: dict) -> str | None:
    value = float(out[TAG_INDEX])
    return next((name for name, tag in tags.items() if tag == value), None)


def _routing_verdict(w: str, served: str | None) -> str | None:
    """The teaching message when workload ``w`` was served by ``served`` (None: the fallback)."""
    want = _ROUTING_EXPECT[w]
    if served == want:
        return None
    where = f"workload {w} {_ROUTING_WORKLOADS[w][:3]}"
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
    tags = _routing_tags(seed)
    for w, workload in _routing_workloads().items():
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
        served = _served_by(out, tags)
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
    ``seed``: a function ``attn(q, k, v, causal)`` that writes the trace set to a new folder and calls
    ``deploy`` on it at its first call (so that an error in ``deploy`` is the call's error)."""
    import tempfile

    state = {}

    def attn(q, k, v, causal):
        if "attn" not in state:
            root = routing_trace_set(Path(tempfile.mkdtemp(prefix="facourse_routing_")), seed=seed)
            state["attn"] = deploy(root)
        return state["attn"](q, k, v, causal)

    return attn


def check_deployment(deploy, *, seed: int = 0, device=None, workloads=("A", "B", "C")) -> None:
    """:func:`check_routing` of ``deploy(root) -> attn`` on the routing trace set of ``seed``."""
    check_routing(deployed(deploy, seed=seed), seed=seed, device=device, workloads=workloads)
