"""The one correctness rule of the course (docs/DESIGN.md, "Correctness rule"), written once.

Every step's check is its cases, its inputs, its reference and its list of mistakes; the rule is here:

* :func:`guarded_call` calls the function under test: new allocations filled with NaN (an element
  never written shows), warnings printed on stdout (nbgrader scores a cell 0 on stderr), CUDA
  synchronised, and a :class:`CheckError` when an input tensor was modified;
* :func:`compare` applies rules 1-3 to one output: finite where the reference is defined and
  exactly the empty value (0 or -inf) where it is empty; ``max|out - ref| <= 2 * own_rounding +
  slack``; ``max|out - ref| / max|ref| < rel_limit_of(dtype)`` (REL_LIMIT in fp16). Under
  :func:`collecting` (the grading kernel, whose judge replays the outputs elsewhere) it computes
  nothing and passes;
* a :class:`Mistake` is a classic bug: its cause, the outputs it produces and the outputs it breaks.
  :func:`diagnose` names one only when it explains every wrong output and breaks none that is right,
  with the one match criterion :func:`matches`;
* :func:`describe_rows` says where a result is wrong (query rows, heads, batches, or a step's own
  axes: sequences, ranks).

Usage, as a step's check writes it (``facourse.check`` is the full example)::

    o = guarded_call(fn, q, k, v, device=q.device, tag="[small]", inputs={"q": q, "k": k, "v": v},
                     causal=True)
    ref = reference_attention(q, k, v, True)[0]
    cmp = compare(o, ref, lambda: max_abs(torch_attention(q, k, v, True).double() - ref),
                  name="o", tag="[small]")
    if not cmp.ok:
        twice = Mistake("the scale is applied twice",
                        lambda: {"o": reference_attention(q, k, v, True, 1 / q.shape[-1])[0]})
        found = diagnose({"o": o}, {"o"}, [twice], cmp.allowed)
        raise cmp.error(found.cause if found else "wrong at " + describe_rows(cmp.bad_rows))
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import math
import os
import secrets
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from .errors import TeachingError

from .reference import masked_attention

__all__ = ["ABS_SLACK", "REL_LIMIT", "rel_limit_of", "CheckError", "AttentionCheckError", "collecting", "verifying", "is_collecting", "say",
           "draw_seed", "make_tag", "nan_filled_allocations", "guarded_call", "expect_tensor", "Comparison", "compare",
           "Mistake", "matches", "diagnose", "describe_rows", "ranges", "max_abs", "check_lse",
           "normalise_result", "masked_attention"]

ABS_SLACK = 1e-3
REL_LIMIT = 1e-2


def rel_limit_of(dtype) -> float:
    """Rule 3's limit for results in ``dtype``: REL_LIMIT (the seed's fp16 threshold) scaled by the dtype's
    rounding unit against fp16's, never below it: 8x for bfloat16, whose 8 significant bits to fp16's 11
    put PyTorch's own gradients at up to 1.16e-2 of max|ref| on the course's cases, where fp16's stay
    below 1.6e-3 (benchmarks/results/2026-11-28_cpu_rule3_dtypes.txt): at REL_LIMIT every bf16 kernel,
    PyTorch's included, failed fresh seeds at random."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return REL_LIMIT
    return REL_LIMIT * max(1.0, torch.finfo(dtype).eps / torch.finfo(torch.float16).eps)


class AttentionCheckError(TeachingError):
    """A result that breaks the correctness rule. The message teaches what went wrong."""


# One class under two names: the judge and the grading reports name an error by its class's name,
# which the course's notebooks and reports have always shown as AttentionCheckError.
CheckError = AttentionCheckError


# ----------------------------------------------------------------------------- record/replay switch
_COLLECTING = contextvars.ContextVar("facourse_collecting", default=False)


@contextlib.contextmanager
def collecting():
    """Inside this block the checks draw their inputs and call the function exactly as usual but
    verify nothing (no reference is computed): the grading judge runs in another process, replays
    the recorded outputs through the same check and decides there (autograder/README.md)."""
    token = _COLLECTING.set(True)
    try:
        yield
    finally:
        _COLLECTING.reset(token)


def is_collecting() -> bool:
    return _COLLECTING.get()


@contextlib.contextmanager
def verifying():
    """Checks verify inside this block even within ``collecting()``: for library code whose result
    is a verdict a student's function returns (``facourse.interchange.trace``: a Trace's status), so
    that the graded function behaves in the grading kernel as it does anywhere else."""
    token = _COLLECTING.set(False)
    try:
        yield
    finally:
        _COLLECTING.reset(token)


def say(*lines: str) -> None:
    """Print a check's summary lines, except while collecting (the judge reports the verdict)."""
    if not is_collecting():
        for line in lines:
            print(line)


#: While a submission is graded, its visible checks draw their seeds from this key (hex), one after another in the
#: notebook's order, so that a regrade replays them (the grader sets it from the submission's seed key; the judge's
#: own seeds are derived apart). A student's own run has none: a fresh seed each time.
VISIBLE_SEEDS_ENV = "FACOURSE_VISIBLE_SEEDS"
_VISIBLE_DRAWS = itertools.count()


def draw_seed(seed=None) -> int:
    """The seed of a check's inputs: the one given, or one the student never chose (fresh, or while graded the
    next of the submission's own sequence)."""
    if seed is not None:
        return int(seed)
    key = os.environ.get(VISIBLE_SEEDS_ENV)
    if key:
        digest = hashlib.sha256(f"{key}:{next(_VISIBLE_DRAWS)}".encode()).digest()
        return int.from_bytes(digest[:4], "big") >> 1
    return secrets.randbits(31)


def make_tag(config: str, seed=None) -> str:
    return f"[{config}]" + ("" if seed is None else f" (seed {seed})")


# ----------------------------------------------------------------------------- the guarded call
_EMPTY_FNS = ("empty", "empty_like", "empty_strided")
# torch's allocators are patched once for every block in progress, in any thread (the judge decides
# verdicts side by side): the first block in patches, the last one out restores the originals.
_PATCH_LOCK = threading.Lock()
_PATCHED: dict = {"depth": 0, "originals": {}}


def _poisoned(fn):
    def inner(*args, **kwargs):
        t = fn(*args, **kwargs)
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            t.fill_(float("nan"))
        return t
    return inner


@contextlib.contextmanager
def nan_filled_allocations(device=None):
    """Inside this block, ``torch.empty*`` and ``Tensor.new_empty`` return NaN-filled tensors and
    the CUDA caching allocator hands out NaN-filled memory, so an element a kernel forgets to
    write reads NaN instead of a lucky zero."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        # a large free block filled with NaN goes back to the caching allocator for the kernel to reuse
        free = torch.cuda.mem_get_info(dev)[0]
        n = int(min(free * 0.25, 1 << 30)) // 2
        if n > 0:
            blob = torch.empty(n, dtype=torch.float16, device=dev)
            blob.fill_(float("nan"))
            del blob
    with _PATCH_LOCK:
        if _PATCHED["depth"] == 0:
            originals = {name: getattr(torch, name) for name in _EMPTY_FNS}
            originals["new_empty"] = torch.Tensor.new_empty
            _PATCHED["originals"] = originals
            for name in _EMPTY_FNS:
                setattr(torch, name, _poisoned(originals[name]))
            torch.Tensor.new_empty = _poisoned(originals["new_empty"])
        _PATCHED["depth"] += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _PATCHED["depth"] -= 1
            if _PATCHED["depth"] == 0:
                originals = _PATCHED["originals"]
                for name in _EMPTY_FNS:
                    setattr(torch, name, originals[name])
                torch.Tensor.new_empty = originals["new_empty"]


def _same(t: torch.Tensor, c: torch.Tensor) -> bool:
    if t.is_floating_point():      # NaN and -inf entries of an input (masked scores) compare equal
        return torch.equal(t.isnan(), c.isnan()) and torch.equal(torch.nan_to_num(t), torch.nan_to_num(c))
    return torch.equal(t, c)


def guarded_call(fn, *args, device=None, tag: str = "", inputs: Mapping[str, torch.Tensor] | None = None,
                 untouched: str = "the function must leave its inputs untouched", nan_fill: bool = True,
                 error: type = CheckError, **kwargs):
    """``fn(*args, **kwargs)`` under the rule's guards; returns its result.

    New allocations are NaN-filled (``nan_fill``), warnings are printed on stdout, a CUDA device is
    synchronised, and ``error`` (a :class:`CheckError`) is raised when a tensor of ``inputs`` (name ->
    tensor; by default every tensor argument) differs afterwards: "{tag} {name} was modified by the
    call: {untouched}".
    """
    if inputs is None:
        inputs = {f"argument {i}": a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    if device is None:
        device = next((t.device for t in inputs.values()), None)
    copies = {name: t.clone() for name, t in inputs.items()}
    guard = nan_filled_allocations(device) if nan_fill else contextlib.nullcontext()
    with guard, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    for w in {str(w.message) for w in caught}:
        print(f"note: the call raised a warning: {w}")
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    for name, t in inputs.items():
        if not _same(t, copies[name]):
            raise error(f"{tag} {name} was modified by the call: {untouched}")
    return result


# ----------------------------------------------------------------------------- describing
def ranges(idx: Iterable[int], limit: int = 6) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (at most ``limit`` ranges, then a count)."""
    idx = list(idx)
    if not idx:
        return "none"
    out, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    more = "" if len(out) <= limit else f", … ({len(out) - limit} more ranges)"
    return ", ".join(out[:limit]) + more


def describe_rows(bad: torch.Tensor, labels=("batches", "heads", "query rows")) -> str:
    """Where a boolean mask is True, axis by axis, last axis first: 'query rows 3-9 (7 of 128);
    heads all 8; batches 0'. ``labels`` names the mask's axes (a step passes its own: sequences,
    ranks); a mask with more axes than labels has its leading axes folded into the first label."""
    bad = bad.detach().to("cpu", torch.bool)
    if bad.dim() == 0:
        bad = bad.reshape(1)
    labels = tuple(labels)[-bad.dim():] if bad.dim() < len(labels) else tuple(labels)
    if bad.dim() > len(labels):
        bad = bad.reshape(-1, *bad.shape[bad.dim() - len(labels) + 1:])
    parts = []
    for axis in reversed(range(bad.dim())):
        others = tuple(a for a in range(bad.dim()) if a != axis)
        hit = bad.any(dim=others) if others else bad
        idx = torch.nonzero(hit).flatten().tolist()
        n = bad.shape[axis]
        if axis == bad.dim() - 1:
            parts.append(f"{labels[axis]} {ranges(idx)} ({len(idx)} of {n})")
        elif axis > 0 and len(idx) == n and n > 1:
            parts.append(f"{labels[axis]} all {n}")
        else:
            parts.append(f"{labels[axis]} {ranges(idx)}")
    return "; ".join(parts)


def max_abs(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def expect_tensor(x, like, *, name: str, like_name: str, tag: str, shape=None, shape_note: str = "",
                  dtype_note: str = "", error: type = CheckError) -> None:
    """``x`` is a tensor with ``like``'s shape (or ``shape``), dtype and device; else ``error`` says which
    and how to fix it. Nothing is checked while collecting (the judge checks the recorded result)."""
    if is_collecting():
        return
    if not isinstance(x, torch.Tensor):
        raise error(f"{tag} {name} must be a torch.Tensor, got {type(x).__name__}")
    shape = tuple(like.shape) if shape is None else tuple(shape)
    if tuple(x.shape) != shape:
        raise error(f"{tag} {name} has shape {tuple(x.shape)}; it must have {like_name}'s shape {shape}{shape_note}")
    if x.dtype != like.dtype:
        raise error(f"{tag} {name} has dtype {x.dtype}; it must have {like_name}'s dtype {like.dtype}{dtype_note}")
    if x.device != like.device:
        raise error(f"{tag} {name} is on {x.device}; it must stay on {like.device}")


# ----------------------------------------------------------------------------- compare
@dataclass
class Comparison:
    """The figures of one output against its reference. ``bad`` marks wrong elements (NaN/inf, a
    non-empty value in an empty row, or off by more than ``allowed``); ``bad_rows`` the same reduced
    over the row axis. ``collected`` is True under :func:`collecting`, where nothing was compared."""
    name: str
    tag: str
    dtype: object = None
    ok: bool = True
    collected: bool = False
    max_err: float = 0.0
    allowed: float = 0.0
    rel: float = 0.0
    own: float = 0.0
    ref_max: float = 0.0
    slack: float = ABS_SLACK
    rel_slack: float = 0.0
    rel_limit: float | None = REL_LIMIT
    failure: str | None = None          # None, "nonfinite", "not_empty" or "values"
    bad: torch.Tensor | None = None
    bad_rows: torch.Tensor | None = None
    nonfinite_rows: torch.Tensor | None = None
    not_empty_rows: torch.Tensor | None = None
    worst: tuple | None = None          # (index, got, expected)

    def tolerance_text(self) -> str:
        extra = [f"{self.slack:g}"] if self.slack else []
        if self.rel_slack:
            extra.append(f"{self.rel_slack:g} of max|ref| = {self.ref_max:.3g}")
        return (f"twice PyTorch's own {_dtype_name(self.dtype)} error {self.own:.2g}"
                + (f", plus {' and '.join(extra)}" if extra else ""))

    def error(self, cause: str, *, where: str | None = None, labels=("batches", "heads", "query rows"),
              what: str | None = None, index_names=None, error: type = CheckError) -> CheckError:
        """The rule's message for wrong values: the figures, where, the worst element, the cause."""
        what = what or f"wrong values in {self.name}"
        rel = "" if self.rel_limit is None else f"; relative {self.rel:.3g} (must be < {self.rel_limit:g})"
        where = where if where is not None else describe_rows(self.bad_rows, labels)
        worst = ""
        if self.worst is not None:
            idx, got, want = self.worst
            at = (f": {', '.join(f'{n}={i}' for n, i in zip(index_names, idx))}" if index_names
                  else f" at index {idx}")
            worst = f"\n  worst element{at}: got {got:.4g}, expected {want:.4g}"
        return error(f"{self.tag} {what}: max|{self.name} - ref| = {self.max_err:.3g}, allowed "
                     f"{self.allowed:.3g} ({self.tolerance_text()}){rel}.\n  wrong at {where}{worst}\n"
                     f"  likely cause: {cause}")


def _value(x):
    return x() if callable(x) else x


def _clean_pass(o64, ref, empty, own, slack, rel_slack, rel_limit):
    """The common case in five passes over the data instead of about thirty: nothing empty, everything finite,
    within both limits. Returns (max_err, allowed, rel, ref_max, an all-False mask), or None when the
    full rule must look (a failure, or empty rows)."""
    if not o64.numel() or (empty is not None and bool(torch.as_tensor(empty).any())):
        return None
    lo, hi = torch.aminmax(ref)
    ref_max = max(-float(lo), float(hi))
    err = (o64 - ref).abs_()
    max_err = float(err.max())
    allowed = 2.0 * own + slack + rel_slack * ref_max
    rel = max_err / max(ref_max, 1e-30)
    if not (math.isfinite(ref_max) and max_err <= allowed
            and (rel_limit is None or rel < rel_limit)):
        return None
    return max_err, allowed, rel, ref_max, torch.zeros(err.shape, dtype=torch.bool, device=err.device)


def compare(out, ref, own_rounding, *, name: str = "o", tag: str = "", empty=None, empty_value: float = 0.0,
            slack: float = ABS_SLACK, rel_slack: float = 0.0, rel_limit: float | str | None = "dtype",
            row_dim: int | None = -1, dtype=None) -> Comparison:
    """Rules 1-3 of the correctness rule for one output ``out`` against ``ref`` (float64 or float32).

    ``ref`` and ``own_rounding`` (max|framework's own result - ref|) may be callables, evaluated only
    when verifying. ``empty`` (broadcastable to out) marks where the reference is empty: there ``out``
    must equal ``empty_value`` exactly (0 for an output, -inf for an lse). Allowed error:
    ``2 * own_rounding + slack + rel_slack * max|ref|``; and ``max_err / max|ref| < rel_limit``
    ("dtype": :func:`rel_limit_of` out's dtype; None: no relative rule). ``row_dim`` is the axis a row
    spans (None: elements are rows).
    """
    if is_collecting():
        return Comparison(name, tag, dtype=getattr(out, "dtype", dtype), collected=True)
    if rel_limit == "dtype":
        rel_limit = rel_limit_of(getattr(out, "dtype", dtype))
    ref = _value(ref).detach().to(torch.float64)
    o64 = out.detach().to(torch.float64)
    own = float(_value(own_rounding))

    def rows(m):
        return m.any(dim=row_dim) if row_dim is not None and m.dim() > 0 else m

    passed = _clean_pass(o64, ref, empty, own, slack, rel_slack, rel_limit)
    if passed is not None:
        max_err, allowed, rel, ref_max, none = passed
        return Comparison(name, tag, dtype=out.dtype, max_err=max_err, allowed=allowed, rel=rel, own=own,
                          ref_max=ref_max, slack=slack, rel_slack=rel_slack, rel_limit=rel_limit, bad=none,
                          bad_rows=rows(none), nonfinite_rows=rows(none), not_empty_rows=rows(none))
    if empty is None:
        empty_mask = torch.zeros((), dtype=torch.bool, device=o64.device)
    else:
        empty_mask = torch.as_tensor(empty, device=o64.device).to(torch.bool)
    is_empty_value = (o64 == empty_value) & empty_mask
    nonfinite = ~torch.isfinite(o64) & ~is_empty_value
    not_empty = empty_mask & ~is_empty_value & ~nonfinite
    defined = ~empty_mask & torch.isfinite(ref)
    ref_def = torch.where(defined, ref, torch.zeros_like(ref))
    ref_max = max_abs(ref_def)
    allowed = 2.0 * own + slack + rel_slack * ref_max
    err = torch.where(defined & ~nonfinite, (o64 - ref_def).abs(), torch.zeros_like(o64))
    max_err = max_abs(err)
    rel = max_err / max(ref_max, 1e-30)
    bad = nonfinite | not_empty | (err > allowed)
    cmp = Comparison(name, tag, dtype=out.dtype, max_err=max_err, allowed=allowed, rel=rel, own=own,
                     ref_max=ref_max, slack=slack, rel_slack=rel_slack, rel_limit=rel_limit, bad=bad,
                     bad_rows=rows(bad), nonfinite_rows=rows(nonfinite), not_empty_rows=rows(not_empty))
    if bool(nonfinite.any()):
        cmp.failure = "nonfinite"
    elif bool(not_empty.any()):
        cmp.failure = "not_empty"
    elif max_err > allowed or (rel_limit is not None and rel >= rel_limit):
        cmp.failure = "values"
        if rel_limit is not None and rel >= rel_limit and not bool(bad.any()):
            bad = err >= rel_limit * ref_max       # within the absolute limit, past the relative one
            cmp.bad, cmp.bad_rows = bad, rows(bad)
        flat = int(torch.argmax(err))
        at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
        cmp.worst = (at, float(o64[at]), float(ref[at]))
    cmp.ok = cmp.failure is None
    return cmp


# ----------------------------------------------------------------------------- mistakes
@dataclass(frozen=True)
class Mistake:
    """A classic bug: ``cause`` (the sentence a student reads), ``produce()`` (the outputs the bug
    yields on the check's inputs, as name -> tensor) and ``breaks`` (the output names it changes)."""
    cause: str
    produce: Callable[[], Mapping[str, torch.Tensor]]
    breaks: frozenset = frozenset({"o"})


def matches(out: torch.Tensor, alt: torch.Tensor, tol: float) -> bool:
    """THE match criterion: every element of ``out`` within ``tol`` plus one ulp of out's dtype (at
    the element's size) of ``alt``; NaN and infinities must sit where ``alt`` has the same."""
    if not isinstance(out, torch.Tensor) or not isinstance(alt, torch.Tensor) or out.shape != alt.shape:
        return False
    o = out.detach().to(torch.float64)
    a = alt.detach().to(o.device, torch.float64)
    ulp = torch.finfo(out.dtype).eps if out.dtype.is_floating_point else 0.0
    fo, fa = torch.isfinite(o), torch.isfinite(a)
    if not torch.equal(fo, fa):
        return False
    if not bool(((o == a) | fo | (o.isnan() & a.isnan())).all()):      # the same NaN or the same inf
        return False
    if not bool(fo.any()):
        return True
    gap = ((o - a).abs() - ulp * a.abs())[fo]
    return float(gap.max()) <= tol


def diagnose(outputs: Mapping[str, torch.Tensor], wrong: Iterable[str], mistakes: Iterable[Mistake],
             tol) -> Mistake | None:
    """The first mistake that explains the result, or None.

    A mistake is named only when it breaks every output in ``wrong`` and no output of ``outputs``
    that is right, and its produced output :func:`matches` the student's for every wrong name.
    ``tol`` is a float, a mapping name -> float, or a function (name, the mistake's output) -> float
    (a tolerance that scales with the data scales with the mistake's output, which may be far larger).
    """
    wrong = frozenset(wrong)
    right = frozenset(outputs) - wrong
    for m in mistakes:
        if not wrong <= m.breaks or m.breaks & right:
            continue
        try:
            alt = m.produce()
        except Exception:     # a mistake that cannot be formed on these inputs says nothing
            continue
        if all(n in alt and matches(outputs[n], alt[n], tol(n, alt[n]) if callable(tol) else
                                    tol[n] if isinstance(tol, Mapping) else tol) for n in wrong):
            return m
    return None


# ----------------------------------------------------------------------------- lse and results
def check_lse(lse, ref_lse, q, tag: str, labels=("batches", "heads", "query rows"), where=None) -> float:
    """An lse of q's rows: float32 ``[B, Hq, Sq]``, -inf exactly where a row sees no key, close to the
    natural-log reference (relative 2e-2 in fp16/bf16, 1e-4 otherwise). Returns the max error. ``where``
    (a mask -> text) names wrong rows, by default ``describe_rows`` with ``labels``."""
    if is_collecting():
        return 0.0
    where = where or (lambda rows: describe_rows(rows, labels))
    B, Hq, Sq = q.shape[:3]
    if not isinstance(lse, torch.Tensor):
        raise CheckError(f"{tag} lse must be a torch.Tensor, got {type(lse).__name__}")
    if tuple(lse.shape) != (B, Hq, Sq):
        raise CheckError(f"{tag} lse has shape {tuple(lse.shape)}; it must be [B, Hq, Sq] = {(B, Hq, Sq)}")
    if lse.dtype != torch.float32:
        raise CheckError(f"{tag} lse has dtype {lse.dtype}; it must be float32")
    lse64 = lse.detach().to(torch.float64)
    ref64 = ref_lse.to(torch.float64).to(lse64.device)
    empty = torch.isneginf(ref64)
    wrong_inf = torch.isneginf(lse64) != empty
    if wrong_inf.any() or torch.isnan(lse64).any() or torch.isposinf(lse64).any():
        bad = wrong_inf | torch.isnan(lse64) | torch.isposinf(lse64)
        parts = [f"{what}: {where(rows)}" for what, rows in (
            ("rows that see at least one key, where it must be finite", bad & ~empty),
            ("rows that see no key, where it must be -inf (l = 0)", bad & empty)) if bool(rows.any())]
        raise CheckError(
            f"{tag} lse is wrong at {'; and at '.join(parts)}.\n  likely cause: lse = m + log(l) must be -inf only "
            "for rows with no visible key (written there too), and never NaN")
    fin = ~empty
    diff = (lse64 - ref64).abs().masked_fill(~fin, 0.0)
    rel = 2e-2 if q.dtype in (torch.float16, torch.bfloat16) else 1e-4
    tol = rel * (1 + ref64.abs().masked_fill(~fin, 0.0))
    if (diff > tol).any():
        worst = float(diff.max())
        in_log2 = ""
        d2 = (lse64 * 0.6931471805599453 - ref64).abs().masked_fill(~fin, 0.0)
        if float(d2.max()) < worst / 10:
            in_log2 = (" It matches the reference divided by ln 2: lse must be a natural log; "
                       "convert from base 2 (multiply by ln 2)")
        raise CheckError(
            f"{tag} lse is off by up to {worst:.3g} at {where(diff > tol)}.\n  likely cause: "
            f"lse_i = m_i + log(l_i) with m_i the scaled row max and l_i the row sum of exp(S - m_i).{in_log2}")
    return float(diff.max()) if diff.numel() else 0.0


def normalise_result(result, expect_lse: bool, tag: str):
    """``(o, lse)`` from what an entry point returned: a pair, or o alone where no lse is expected."""
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise CheckError(f"{tag} the function returned {len(result)} values; expected (o, lse)")
        o, lse = result
        return o, (lse if expect_lse else None)
    if expect_lse:
        raise CheckError(f"{tag} the function returned one tensor; this step's entry point returns a pair "
                         "(o, lse)")
    return result, None
