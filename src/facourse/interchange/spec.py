"""Step 11's operator as data: the spec of ``mini_flash_attention_prefill``, the layouts between it and
the course's ``[B, H, S, D]``, and flashinfer_bench, loaded where it is needed."""
from __future__ import annotations

import copy
from functools import cache

from ..check import AttentionCheckError
from ..errors import TeachingError

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

class InterchangeCheckError(TeachingError):
    """A definition, its reference or a deployment that breaks the step's contract; the message
    says which field or call, what it is, what the spec wants and why it matters."""


def load_fib():
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
        o = kernel(*to_course(q, k, v), causal=bool(causal))
        if isinstance(o, (tuple, list)):            # (o, lse): the definition has one output, out
            if len(o) != 2:
                raise AttentionCheckError(f"[run] the function returned {len(o)} values; expected (o, lse)")
            o = o[0]
        return from_course(o.to(q.dtype))

    run.__name__ = f"definition_run({getattr(kernel, '__name__', 'kernel')})"
    return run


def course_kernel(run):
    """The definition's ``run`` as a course-contract function (what ``bench_attention`` times)."""
    def kernel(q, k, v, causal=False):
        out = run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)   # [B, S, H, D] views
        return out.transpose(1, 2)                                                     # o [B, H, S, D]

    return kernel


def as_definition(defn):
    """A flashinfer_bench Definition from a Definition, its JSON text or its dict."""
    fib = load_fib()
    if isinstance(defn, fib.Definition):
        return defn
    try:
        if isinstance(defn, (str, bytes)):
            return fib.Definition.model_validate_json(defn)
        return fib.Definition.model_validate(defn)
    except Exception as e:  # pydantic's ValidationError: undefined axes, no run(), a bad dtype, ...
        raise InterchangeCheckError(
            f"the definition does not load as a flashinfer_bench Definition: {e}") from e


def python_solution(name: str, main: str, description: str, *, author: str = "facourse.interchange",
                    hardware=("cpu", "cuda"), files: dict | None = None):
    """A python ``Solution`` of the definition: ``main`` as its main.py (entry point ``main.py::run``), and
    ``files`` ({path: text}) beside it."""
    fib = load_fib()
    sources = [fib.SourceFile(path=p, content=text) for p, text in {"main.py": main, **(files or {})}.items()]
    return fib.Solution(name=name, definition=DEFINITION_NAME, author=author,
                        spec=fib.BuildSpec(language="python", target_hardware=list(hardware),
                                           entry_point="main.py::run", destination_passing_style=False),
                        sources=sources, description=description)


#: The element each synthetic solution overwrites with its tag, in the definition's layout: batch 0,
#: the last query row (it sees every key), head 0, channel 0.
TAG_INDEX = (0, -1, 0, 0)


def solution_source(doc: str, tag: float | None = None, align: str = "bottom_right") -> str:
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


@cache
def spec_definition():
    """The spec as a Definition, with a reference that calls the course's (the grader's own)."""
    return load_fib().Definition(**copy.deepcopy(SPEC), reference=solution_source(
        "The spec's reference: the course's reference attention, in the definition's layout."))
