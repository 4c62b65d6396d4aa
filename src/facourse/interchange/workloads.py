"""Step 11's workloads: the seed's shapes and the checks' own, as flashinfer_bench ``Workload``\\ s with stable
uuids, their names and their inputs."""
from __future__ import annotations

import uuid as uuidlib

import torch

from ..configs import CONFIGS, LONG_CONFIG, AttnConfig, make_inputs, resolve_device
from .spec import DEFINITION_NAME, HEAD_DIM, HKV, HQ, load_fib

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

#: The workloads of :func:`check_traces` (batch, seq_q, seq_kv, causal): small, since each candidate
#: runs on each; two causal with seq_q < seq_kv (top-left and bottom-right causal differ) and one
#: non-causal (where they agree).
TRACE_SHAPES = {"asymmetric": (1, 24, 72, True), "ragged": (1, 37, 53, True), "noncausal": (1, 32, 32, False)}

#: The routing check's shapes (batch, seq_q, seq_kv, causal): A and B have traces, C has none.
ROUTING_WORKLOADS = {"A": (1, 64, 192, True), "B": (2, 96, 96, True), "C": (1, 80, 240, True)}


def _workload_uuid(profile: str, name: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"facourse/{DEFINITION_NAME}/{profile}/{name}"))


def new_workload(profile: str, name: str, shape):
    """A ``Workload`` of ``shape`` (batch, seq_q, seq_kv, causal), its uuid fixed by ``profile`` and ``name``."""
    fib = load_fib()
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
    return [new_workload(profile, name, shape) for name, shape in PROFILES[profile].items()]


def workload_shape(workload) -> tuple:
    """(batch, seq_q, seq_kv, causal) of a workload of this definition."""
    try:
        c = workload.inputs["causal"]
        return (workload.axes["batch"], workload.axes["seq_q"], workload.axes["seq_kv"], bool(c.value))
    except (KeyError, AttributeError) as e:
        raise ValueError("a workload of this definition gives batch, seq_q and seq_kv in axes and causal "
                         f"as a scalar input; got axes {dict(workload.axes)}, inputs "
                         f"{list(workload.inputs)}") from e


def workload_names() -> dict:
    """{uuid: name} of every workload this package makes (the profiles', the routing check's, the traces')."""
    out = {_workload_uuid(p, n): n for p, table in PROFILES.items() for n in table}
    out.update({_workload_uuid("routing", n): f"workload {n}" for n in ROUTING_WORKLOADS})
    out.update({_workload_uuid("traces", n): n for n in TRACE_SHAPES})
    return out


def describe_workload(workload) -> str:
    """``small (batch 1, seq_q 64, seq_kv 64, causal)``: a workload's name (if it is one of this
    module's) and shape, for messages."""
    batch, seq_q, seq_kv, causal = workload_shape(workload)
    name = workload_names().get(workload.uuid, f"workload {workload.uuid}")
    return f"{name} (batch {batch}, seq_q {seq_q}, seq_kv {seq_kv}, {'causal' if causal else 'non-causal'})"


def workload_config(workload) -> AttnConfig:
    """The course's configuration of a workload (the spec's heads and head_dim)."""
    batch, seq_q, seq_kv, causal = workload_shape(workload)
    return AttnConfig(describe_workload(workload), batch, HQ, HKV, seq_q, seq_kv, HEAD_DIM, causal)


def make_workload_inputs(workload, *, seed: int = 0, device=None, dtype=torch.float16):
    """``(q, k, v, causal)`` of a workload in the definition's layout, drawn from ``seed`` by
    ``facourse.configs.make_inputs`` (its ``[B, S, H, D]`` storage, so these are contiguous and
    :func:`to_course` gives exactly the views the course's checks draw)."""
    cfg = workload_config(workload)
    q, k, v = make_inputs(cfg, seed, resolve_device(device), dtype, layout="bshd")
    return (*(t.transpose(1, 2) for t in (q, k, v)), cfg.causal)
