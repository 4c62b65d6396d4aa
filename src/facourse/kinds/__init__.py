"""One kind per step mode: the registry (docs/DESIGN.md, "Architecture").

A step's manifest names its kind (``[exercise] mode``; none: ``forward``). The kind owns what
differs between steps: the cases its rungs are checked on and the check, what a rung is timed on
and how (time, work, unit), the calibration reference the judge times itself, the results rows and
the perf verdict's numbers. The judge, ``autograder.perf``, ``retime``, ``facourse.results``,
``benchmarks/ladder.py`` and ``benchmarks/tables.py`` ask the kind and never test a mode string.

    >>> from facourse import kinds
    >>> kinds.get("decode").unit
    'GB/s'

A new kind is one module with a ``KIND`` and one line in ``REGISTRY``.
"""
from __future__ import annotations

import importlib

from .base import Kind

#: mode -> the module that defines its ``KIND`` (imported on first use: torch and Triton stay unloaded)
REGISTRY = {
    "forward": "facourse.kinds.forward",
    "backward": "facourse.kinds.backward",
    "decode": "facourse.kinds.decode",
    "variant": "facourse.kinds.variant",
    "fp8": "facourse.kinds.fp8",
    "ring": "facourse.kinds.ring",
    "varlen": "facourse.kinds.varlen",
    "paged_prefill": "facourse.kinds.paged_prefill",
}
#: A rung whose entry point is a kind of its own inside its step (step 10's FP8 forward, step 15's paged prefill).
ENTRY_POINTS = {"flash_attention_fp8": "fp8", "paged_prefill": "paged_prefill"}
DEFAULT = "forward"


def get(mode: str | None) -> Kind:
    """The kind of ``mode`` (``None``: the forward)."""
    name = mode or DEFAULT
    if name not in REGISTRY:
        raise KeyError(f"no step kind {name!r}; known: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name]).KIND


def of_step(m: dict) -> Kind:
    """The kind of a step's manifest (``facourse.steps.load_step``)."""
    return get(m["exercise"].get("mode"))


def of_rung(m: dict, r: dict) -> Kind:
    """The kind one rung is checked and timed as: its entry point's, else its step's."""
    return get(ENTRY_POINTS.get(r.get("entry_point")) or m["exercise"].get("mode"))


def of_results(d: dict) -> Kind:
    """The kind a results file was written for (its ``"mode"``; none: the forward)."""
    return get(d.get("mode"))


__all__ = ["Kind", "REGISTRY", "ENTRY_POINTS", "get", "of_step", "of_rung", "of_results"]
