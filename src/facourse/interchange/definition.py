"""Step 11's definition check: a student's ``Definition`` against the spec, field by field, and its
reference against the course's correctness rule on the CPU workloads."""
from __future__ import annotations

import ast
import re

import torch

from ..check import AttentionCheckError, check_attention
from .spec import (AXES, DEFINITION_NAME, HKV, HQ, INPUTS, OP_TYPE, OUTPUTS, InterchangeCheckError, as_definition,
                   from_course, to_course)
from .workloads import describe_workload, make_workload_inputs, workloads

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
    d = as_definition(defn)
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
    d = as_definition(defn)
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
