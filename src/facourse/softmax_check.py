"""The one check of the softmax steps (02 safe softmax, 03 online softmax and the (m, l) merge).

    softmax(x)_j = exp(x_j - m) / l,   m = max_j x_j,   l = sum_j exp(x_j - m)

A result passes when it has x's shape, dtype and device, leaves x untouched, is finite, and is
within ``2 * (PyTorch's own rounding in that dtype) + slack(dtype)`` of a float64 reference,
element by element. A row whose entries are all ``-inf`` (a query that sees no key) has, by this
course's definition, softmax **zeros** (the same convention as an empty attention row: o = 0).

Inputs come from named cases drawn from a fresh seed (``SOFTMAX_CASES``, ``MERGE_CASES``). A
failure raises :class:`SoftmaxCheckError` (an ``AssertionError``) naming the case, the rows,
and the likely cause ("no max subtraction: exp overflowed", "alpha rescale missing", ...).
Like ``check_entry_point``, these functions print one line on success and return nothing.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import replace

import torch

from .configs import default_dtype, get_config, make_inputs, resolve_device
from .reference import causal_mask, default_scale
from .rule import (CheckError, Mistake, compare, describe_rows, draw_seed, expect_tensor, guarded_call,
                   is_collecting, say)
from .rule import diagnose as find_mistake

#: Extra absolute slack over twice PyTorch's own error, per dtype (softmax values lie in [0, 1]).
SLACK = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}

#: The cases of check_softmax_fn: name -> what it draws.
SOFTMAX_CASES = {
    "small": "attention scores of the 'small' configuration (causal, so rows hold -inf entries)",
    "medium": "attention scores of 'medium' (causal)",
    "large": "attention scores of 'large' (causal, long rows)",
    "noncausal": "attention scores of 'noncausal' (no -inf entries)",
    "asymmetric": "attention scores of 'asymmetric' (Sq=128 rows of Skv=2048 keys, bottom-right causal)",
    "ragged": "rows of many lengths (1, 2, 31, 33, 100, 333, 1000, ...), no multiple of a block size",
    "overflow": "logits in the hundreds (fp32) and tens (fp16): exp() overflows without max subtraction",
    "masked": "rows containing -inf entries, some starting with long runs of -inf (left padding)",
    "all_masked": "fully -inf rows (queries that see no key) among ordinary rows: softmax must give 0",
    "half": "float16 inputs of moderate size",
    "other_dims": "softmax over dim 0, 1 and -2 of a 3-d tensor (safe_softmax only)",
}

#: The cases of check_merge_fn.
MERGE_CASES = {
    "random": "two states of random rows split at random points",
    "empty": "states of empty blocks (m = -inf, l = 0) on one side or on both",
    "large": "maxima in the thousands: exp(m) itself overflows, only differences of maxima may be exponentiated",
    "chain": "many blocks merged left to right and as a tree: the merge must be associative",
}


class SoftmaxCheckError(CheckError):
    """A softmax result that breaks the rule. The message teaches what went wrong."""


# ----------------------------------------------------------------------------- references
def reference_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax in float64; fully -inf rows give zeros (the course's convention)."""
    x = x.detach().to(torch.float64)
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    l = e.sum(dim=dim, keepdim=True)
    return e.div_(torch.where(l > 0, l, torch.ones_like(l))).masked_fill_(~(l > 0), 0.0)


def reference_state(x: torch.Tensor):
    """(m, l) of the rows of x over the last dim, in float64: m = max, l = sum exp(x - m)."""
    x = x.detach().to(torch.float64)
    m = x.amax(dim=-1)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    l = torch.exp(x - m_safe[..., None]).sum(dim=-1)
    return m, l


def course_merge(m_a, l_a, m_b, l_b):
    """The merge of two states as exercise 03 asks for it: m = max(m_a, m_b), l = l_a e^(m_a - m) + l_b e^(m_b - m),
    0 in place of m where it is -inf (two empty states stay empty)."""
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)


@contextlib.contextmanager
def _course_merge_in(fn, name):
    """While the block runs, ``name`` in the module globals of ``fn`` (unwrapped) is :func:`course_merge`;
    nothing changes where there is no such function (the judge's stand-in, a loop with its merge inline)."""
    scope = getattr(inspect.unwrap(fn), "__globals__", None) if name else None
    if scope is None or not callable(scope.get(name)):
        yield
        return
    own = scope[name]
    scope[name] = course_merge
    try:
        yield
    finally:
        scope[name] = own


def _torch_softmax(x, dim):
    """PyTorch's softmax in x's dtype, fully -inf rows set to 0: the rounding yardstick."""
    return torch.nan_to_num(torch.softmax(x, dim=dim), nan=0.0).to(torch.float64)


# ----------------------------------------------------------------------------- case inputs
def _scores(name, seed, device, dtype):
    """scale * Q K^T of one attention configuration (causal mask as -inf), as [B, Hq, Sq, Skv].

    The rows are those of the configuration (Sq rows of Skv keys, its mask); on a GPU at most 2 batches
    and 8 query heads of them are drawn (full-size 'large' would be 10^9 scores, 8 GB in float64).
    """
    cfg = get_config(name, device)
    cfg = replace(cfg, B=min(cfg.B, 2), Hq=min(cfg.Hq, 8), Hkv=min(cfg.Hkv, 2))
    q, k, _ = make_inputs(cfg, seed, device, torch.float32)
    idx = torch.arange(cfg.Hq, device=q.device) // cfg.group
    s = torch.matmul(q, k.index_select(1, idx).transpose(-1, -2)) * default_scale(cfg.D)
    if cfg.causal:
        s = s.masked_fill(~causal_mask(cfg.Sq, cfg.Skv, q.device), float("-inf"))
    return s.to(dtype)


def case_inputs(case: str, seed: int, device=None, dtype=None):
    """The inputs of a case: a list of (label, x, dim)."""
    if case not in SOFTMAX_CASES:
        raise KeyError(f"unknown softmax case {case!r}; known: {', '.join(SOFTMAX_CASES)}")
    device = resolve_device(device)
    dtype = dtype or default_dtype(device)
    g = torch.Generator().manual_seed(int(seed))

    def randn(*shape, s=1.0, dt=None):
        return (torch.randn(*shape, generator=g) * s).to(device=device, dtype=dt or dtype)

    if case in ("small", "medium", "large", "noncausal", "asymmetric"):
        return [(f"scores of {case}", _scores(case, seed, device, dtype), -1)]
    if case == "ragged":
        lengths = (1, 2, 3, 31, 33, 63, 65, 100, 127, 129, 200, 333, 1000)
        return [(f"rows of length {n}", randn(3, 5, n, s=3.0), -1) for n in lengths]
    if case == "overflow":
        x32 = randn(64, 256, s=200.0, dt=torch.float32)        # exp(500) = inf in fp32 (max ~ exp(88.7))
        x32[::7, 5] = 3.0e4                                   # one dominant logit in some rows
        x16 = randn(64, 256, s=30.0, dt=torch.float16)        # exp(20) = inf in fp16 (max ~ exp(11.1))
        x16[::5, 17] = 6.0e4
        big = _scores("small", seed, device, torch.float32) * 64.0   # attention logits of 'overflow' size
        return [("fp32 logits of std 200", x32, -1), ("fp16 logits of std 30", x16, -1),
                ("attention scores times 64 (causal)", big.to(dtype), -1)]
    if case == "masked":
        x = randn(48, 700, s=3.0)
        cols = torch.arange(700, device=device)
        lead = (torch.arange(48, device=device) * 37) % 690       # left padding: -inf before column lead[r]
        x = x.masked_fill(cols[None, :] < lead[:, None], float("-inf"))
        holes = torch.rand(48, 700, generator=g).to(device) < 0.3   # and scattered holes
        holes[:, -1] = False                                      # every row keeps one finite entry
        x = x.masked_fill(holes, float("-inf"))
        return [("rows with leading runs and holes of -inf", x, -1)]
    if case == "all_masked":
        x = randn(40, 257, s=3.0)
        x[::3] = float("-inf")                                    # every third row sees nothing
        x[1::6, :128] = float("-inf")                             # others start with 128 masked columns
        empty = _scores("empty_rows", seed, device, dtype)        # Sq > Skv causal: first rows empty
        return [("every third row fully -inf", x, -1), ("scores of empty_rows (Sq > Skv, causal)", empty, -1)]
    if case == "half":
        return [("fp16 rows", randn(64, 777, s=2.0, dt=torch.float16), -1),
                ("fp16 scores of small", _scores("small", seed, device, torch.float16), -1)]
    # other_dims
    x = randn(300, 6, 7, s=3.0)
    return [("dim 0 of [300, 6, 7]", x, 0), ("dim 1 of [300, 6, 7]", x, 1), ("dim -2 of [300, 6, 7]", x, -2)]


# ----------------------------------------------------------------------------- buggy variants
def _online_variant(x, block_size, bug):
    """Online softmax over the last dim in float64 with a deliberate bug, to recognise it."""
    x = x.detach().to(torch.float64)
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], float("-inf"), dtype=torch.float64, device=x.device)
    l = torch.zeros_like(m)
    for j0 in range(0, n, block_size):
        blk = x[..., j0:j0 + block_size]
        m_new = torch.maximum(m, blk.amax(dim=-1))
        safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(blk - safe[..., None]).sum(dim=-1)
        if bug == "no_alpha":
            l = l + p
        elif bug == "no_alpha_own_max":     # a merge without alpha: each block's sum relative to its own max
            bm = blk.amax(dim=-1)
            bm = torch.where(torch.isneginf(bm), torch.zeros_like(bm), bm)
            l = l + torch.exp(blk - bm[..., None]).sum(dim=-1)
        elif bug == "alpha_sign":
            l = l * torch.exp(safe - torch.where(torch.isneginf(m), safe, m)) + p
        m = m_new
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(x - safe[..., None])
    return torch.where(l[..., None] > 0, e / torch.where(l > 0, l, torch.ones_like(l))[..., None],
                       torch.zeros_like(e))


def _row_desc(bad: torch.Tensor) -> str:
    """Which rows are wrong: by query row, head and batch for attention scores, else flattened."""
    if bad.dim() == 3:
        return describe_rows(bad)
    return describe_rows(bad.reshape(-1), ("rows",))


def _softmax_mistakes(x64, xd, x, dim, block_size, after_overflow: bool) -> list[Mistake]:
    """The classic mistakes of a softmax whose output is finite (x64: x in float64, dim moved last): those
    told before the overflow of large logits, or (``after_overflow``) after it, whose outputs (zeros) an
    overflow also gives."""
    def mistake(cause, fn):
        return Mistake(cause, lambda: {"out": fn()}, frozenset({"out"}))

    out = []
    if block_size is not None and not after_overflow:
        out += [
            mistake("alpha rescale missing: when a block raises the running max from m_old to m_new, the "
                    "sum so far was taken relative to m_old and must be rescaled, l = l * exp(m_old - "
                    "m_new) + sum(exp(x_block - m_new)). Rows whose max comes after their first block "
                    "are the wrong ones", lambda: _online_variant(x64, block_size, "no_alpha")),
            mistake("alpha rescale missing in the merge: each block's sum l_j is relative to the block's own "
                    "max m_j, and the running sum l to m_old; both must be brought to the new max before they "
                    "are added, l = l * exp(m_old - m_new) + l_j * exp(m_j - m_new) (your merge_softmax_states)",
                    lambda: _online_variant(x64, block_size, "no_alpha_own_max")),
            mistake("the rescale has the wrong sign: alpha = exp(m_old - m_new) (<= 1), not exp(m_new - m_old)",
                    lambda: _online_variant(x64, block_size, "alpha_sign")),
        ]
    naive = ("no max subtraction: the output matches exp(x) / sum(exp(x)) computed without subtracting the "
             "row max, which loses precision here and overflows for large logits (exp(x) is inf above 88.7 "
             "in float32 and above 11.1 in float16). Subtract the row max first: softmax(x) = softmax(x - max x)")
    xm = x.detach().movedim(dim, -1)
    if not after_overflow:
        for dt in dict.fromkeys((torch.float32, xm.dtype)):     # computed in float32, or in x's own dtype
            out.append(mistake(naive, lambda dt=dt: (lambda e: e / e.sum(dim=-1, keepdim=True))(torch.exp(xm.to(dt)))))
        return out
    out.append(mistake("the output is all zeros: was the result written back?", lambda: torch.zeros_like(x64)))
    for other in range(x.dim()):
        if other != dim % x.dim() and x.shape[other] > 1:
            out.append(mistake(f"this is the softmax over dim {other}, not over dim {dim % x.dim()}: use the dim "
                               "argument (max, sum and the division all along it)",
                               lambda other=other: reference_softmax(xd, other).movedim(dim, -1)))
    m = x64.amax(dim=-1, keepdim=True)
    out.append(mistake("the output is exp(x - m), not divided by the row sum l: normalise, softmax = exp(x - m) / l",
                       lambda: torch.exp(x64 - torch.where(torch.isneginf(m), torch.zeros_like(m), m))))
    return out


def _diagnose(x, out, dim, block_size, bad, tol):
    """The likely cause of a wrong result. ``bad`` marks wrong elements (NaN/inf or off by > tol)."""
    x64 = x.detach().to(torch.float64).movedim(dim, -1)
    o64 = out.detach().to(torch.float64).movedim(dim, -1)
    bad = bad.movedim(dim, -1)
    n = x64.shape[-1]
    bad_rows = bad.any(dim=-1)
    all_inf = torch.isneginf(x64).all(dim=-1)
    nonfinite = bool((~torch.isfinite(o64)).any())
    if bool((bad_rows & all_inf).any()) and not bool((bad_rows & ~all_inf).any()):
        got = "NaN" if nonfinite else "nonzero values"
        return (f"only the rows whose entries are all -inf are wrong ({got}): their max m is -inf and "
                "x - m = -inf - (-inf) = NaN. This course defines the softmax of a fully -inf row as "
                "zeros (a query that sees no key contributes nothing): when m is -inf, subtract 0 "
                "instead, and output 0 where l == 0")
    if block_size is not None:
        tail = (n // block_size) * block_size
        # columns with NaN/inf when there are any (an unwritten tail), else columns with wrong values
        cols = (~torch.isfinite(o64)) if nonfinite else bad
        bad_cols = cols.reshape(-1, n).any(dim=0)
        if tail < n and bool(bad_cols[tail:].any()) and not bool(bad_cols[:tail].any()):
            return (f"only columns {tail}-{n - 1}, the last partial block, are wrong: the loop over blocks "
                    f"stops before the last, shorter block (n = {n} is no multiple of block_size = "
                    f"{block_size}); use range(0, n, block_size) and slice x[..., j:j + block_size]")
        lead_inf = torch.isneginf(x64[..., :block_size]).all(dim=-1) & ~all_inf
        # both diagnoses below explain a NaN in (m, l): such a row comes out NaN, or 0 where l is guarded; a row
        # of finite, nonzero wrong values is another mistake
        lost = (~torch.isfinite(o64)).any(dim=-1) | (o64.nan_to_num(1.0).abs().amax(dim=-1) == 0)
        if (bool((bad_rows & lead_inf).any()) and not bool((bad_rows & ~lead_inf & ~all_inf).any())
                and not bool((bad_rows & ~lost).any())):
            return ("only rows whose first block is all -inf are wrong: there the max is -inf (the block's own "
                    "max, and the running max m before any finite entry is seen), so exp(-inf - (-inf)) = NaN "
                    "(in alpha = exp(m_old - m_new) or in the block's own sum) and the NaN poisons l. Guard it: "
                    "where a max is -inf, use 0 in its place in the exponents "
                    "(the merge of two empty states is empty)")
        nb = -(-n // block_size)
        pad = torch.full((*x64.shape[:-1], nb * block_size - n), float("-inf"), dtype=x64.dtype, device=x64.device)
        blocks = torch.cat([x64, pad], dim=-1).reshape(*x64.shape[:-1], nb, block_size)
        inf_block = torch.isneginf(blocks).all(dim=-1).any(dim=-1) & ~all_inf     # some block is all -inf
        n_bad = int((bad_rows & ~all_inf).sum())
        if n_bad and int((bad_rows & inf_block & lost).sum()) >= 0.9 * n_bad:   # (nearly) only those rows
            return ("the wrong rows are those that contain a block whose entries are all -inf: that block's own max "
                    "is -inf, so exp(x_block - max) = exp(-inf - (-inf)) = NaN and its sum is NaN, which poisons "
                    "(m, l) when it is merged. Guard the block's max as well: where it is -inf, subtract 0, "
                    "so the block's state is the empty state (m = -inf, l = 0)")

    xd = x.detach().to(torch.float64)
    student = {"out": out.detach().movedim(dim, -1)}
    found = None if nonfinite else find_mistake(student, {"out"}, _softmax_mistakes(x64, xd, x, dim, block_size, False), tol)
    if found is not None:
        return found.cause
    finmax = torch.where(torch.isfinite(x64), x64.abs(), torch.zeros_like(x64)).amax(dim=-1)
    big = finmax > 80.0                 # exp(80) is inf in fp16 and near fp32's limit (exp(88.7))
    # exp overflowed: the wrong rows hold NaN/inf, or nothing (0 after nan_to_num), or the unsafe formula
    lost = (~torch.isfinite(o64)).any(dim=-1) | (o64.abs().amax(dim=-1) <= tol)
    with torch.no_grad():
        e = torch.exp(x.detach().movedim(dim, -1).float())
        naive = (e / e.sum(dim=-1, keepdim=True)).to(torch.float64)
    lost |= ((o64 - naive).abs() <= tol).all(dim=-1)
    if (bool(big.any()) and bool((bad_rows & big).any()) and not bool((bad_rows & ~big & ~all_inf).any())
            and bool(lost[bad_rows].all())):
        return ("no max subtraction: exp overflowed. Only the rows with logits in the hundreds are wrong; "
                "exp(x) is inf above 88.7 in float32 and above 11.1 in float16, and inf/inf = NaN (or 0 "
                "after nan_to_num). Subtract the row max first: softmax(x) = softmax(x - max x)")
    if nonfinite:
        return ("NaN or inf in the output: an element never written (new allocations are NaN-filled "
                "here), a division 0/0, or exp() of a large number")
    found = find_mistake(student, {"out"}, _softmax_mistakes(x64, xd, x, dim, block_size, True), tol)
    if found is not None:
        return found.cause
    sums = o64.sum(dim=-1)
    if bool((((sums - 1).abs() > 1e-2) & ~all_inf).any()):
        return ("rows do not sum to 1: the normaliser l must be the sum of exp(x - m) over the whole row, "
                "with the same m as the numerator")
    return ("the values are off by more than rounding: compute m, exp and the sums in float32 (or better) "
            "even when x is float16, and cast the result back to x.dtype at the end")


# ----------------------------------------------------------------------------- the softmax check
def check_softmax_result(out, x, dim=-1, *, label="custom", block_size=None, tag="[custom]"):
    """Check ``out`` against the float64 softmax of ``x`` along ``dim``; raise SoftmaxCheckError.

    Returns (max error, tolerance) when it passes (zeros while collecting).
    """
    where = f"{tag} {label}:"
    expect_tensor(out, x, name="the result", like_name="x", tag=where, error=SoftmaxCheckError,
                  dtype_note=" (compute in float32 if you like, then cast back)")
    if x.numel() == 0:
        return 0.0, 0.0
    ref = functools.cache(lambda: reference_softmax(x, dim))
    cmp = compare(out, ref, lambda: float((_torch_softmax(x, dim) - ref()).abs().max()),
                  name="out", tag=where, slack=SLACK.get(x.dtype, 0.0), rel_limit=None, row_dim=dim)
    if cmp.ok:
        return cmp.max_err, cmp.allowed
    rows = cmp.bad_rows
    cause = _diagnose(x, out, dim, block_size, cmp.bad, cmp.allowed)
    if cmp.failure == "nonfinite":
        raise SoftmaxCheckError(f"{where} NaN or inf in {_row_desc(cmp.nonfinite_rows)}\n  likely cause: {cause}")
    raise cmp.error(cause, what="wrong values", where=_row_desc(rows), error=SoftmaxCheckError)


def _call(fn, x, dim, block_size, where):
    args = (x, block_size) if block_size is not None else (x,)
    kwargs = {} if block_size is not None else {"dim": dim}
    return guarded_call(fn, *args, device=x.device, tag=where, inputs={"x": x}, error=SoftmaxCheckError,
                        untouched="a softmax must leave its input untouched (no in-place sub_/exp_/div_ on x)",
                        **kwargs)


def check_softmax_fn(fn, case: str = "small", *, block_size: int | None = None, seed: int | None = None,
                     device=None, dtype=None, verbose: bool = True, course_merge_for: str | None = None) -> None:
    """Draw the inputs of ``case`` and check ``fn`` on each.

    Without ``block_size`` the call is ``fn(x, dim=dim)`` (safe_softmax); with it, ``fn(x, block_size)``
    over the last dim (online_softmax). ``dtype`` overrides the case's default (fp16 on a GPU, fp32 on
    a CPU; some cases fix their own). ``course_merge_for`` names the merge ``fn`` looks up in its module's
    globals (``"merge_softmax_states"``): during the calls :func:`course_merge` stands in for it, so the check
    judges ``fn``'s own loop and a merge mistake costs the merge's tests only. Prints one line on
    success, raises SoftmaxCheckError otherwise.
    """
    seed = draw_seed(seed)
    tag = (f"[{case}" + (f", block_size={block_size}" if block_size is not None else "")
           + (f", the course's {course_merge_for}" if course_merge_for else "") + f"] (seed {seed})")
    inputs = case_inputs(case, seed, device, dtype)
    if block_size is not None:
        if any(d not in (-1,) for _, _, d in inputs):
            raise ValueError(f"case {case!r} checks other dims; online softmax works over the last dim only")
        if not (isinstance(block_size, int) and block_size >= 1):
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    worst = 0.0
    for label, x, dim in inputs:
        with _course_merge_in(fn, course_merge_for):
            out = _call(fn, x, dim, block_size, f"{tag} {label}:")
        err, _ = check_softmax_result(out, x, dim, label=label, block_size=block_size, tag=tag)
        worst = max(worst, err)
    if verbose:
        say(f"{tag} passed: {len(inputs)} input(s), max|out - ref| {worst:.2e}")


# ----------------------------------------------------------------------------- the merge check
def _merge_inputs(case, seed, device):
    g = torch.Generator().manual_seed(int(seed))
    dev = resolve_device(device)

    def randn(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(dev)

    if case not in MERGE_CASES:
        raise KeyError(f"unknown merge case {case!r}; known: {', '.join(MERGE_CASES)}")
    if case == "random":
        return randn(4, 8, 300, s=3.0), 1 + int(torch.randint(1, 298, (1,), generator=g))
    if case == "large":
        x = randn(4, 8, 300, s=3.0) + randn(4, 8, 1, s=3000.0)      # maxima in the thousands
        x[0, :, 200:] += 500.0                                        # the second half wins in some rows
        return x, 150
    if case == "empty":
        x = randn(6, 200, s=3.0)
        x[0:2, :100] = float("-inf")                                  # first state empty
        x[2:4, 100:] = float("-inf")                                  # second state empty
        x[4:6, :] = float("-inf")                                     # both empty
        return x, 100
    return randn(3, 4, 257, s=5.0), None                             # chain


def check_merge_fn(fn, case: str = "random", *, seed: int | None = None, device=None,
                   verbose: bool = True) -> None:
    """Check ``fn(m_a, l_a, m_b, l_b) -> (m, l)``, the merge of two softmax states.

    A state (m, l) of a block of logits is its max m and l = sum exp(x - m); an empty block has
    m = -inf, l = 0. The merge of the states of two blocks must be the state of their union.
    """
    seed = draw_seed(seed)
    tag = f"[merge {case}] (seed {seed})"
    x, split = _merge_inputs(case, seed, device)
    x32 = x.float()

    def state(t):
        m, l = reference_state(t)
        return m.float(), l.float()

    def merge(a, b, what):
        res = guarded_call(fn, a[0], a[1], b[0], b[1], tag=f"{tag} {what}:", nan_fill=False,
                           inputs={"m_a": a[0], "l_a": a[1], "m_b": b[0], "l_b": b[1]}, error=SoftmaxCheckError,
                           untouched="a merge must leave its inputs untouched")
        if not (isinstance(res, (tuple, list)) and len(res) == 2 and all(isinstance(t, torch.Tensor) for t in res)):
            raise SoftmaxCheckError(f"{tag} {what}: the merge must return a pair of tensors (m, l)")
        m, l = res
        if tuple(m.shape) != tuple(a[0].shape) or tuple(l.shape) != tuple(a[1].shape):
            raise SoftmaxCheckError(f"{tag} {what}: (m, l) have shapes {tuple(m.shape)}, {tuple(l.shape)}; "
                                    f"they must have the inputs' shape {tuple(a[0].shape)}")
        return m, l

    def judge_state(got, want, parts, what):
        if is_collecting():     # (m, l) are judged from the recorded results, by the judge
            return
        m, l = (t.detach().to(torch.float64) for t in got)
        m_ref, l_ref = want
        a, b = parts
        bad_nan = torch.isnan(m) | torch.isnan(l) | torch.isinf(l)
        if bad_nan.any():
            both_empty = torch.isneginf(a[0].double()) & torch.isneginf(b[0].double())
            if bool((bad_nan & both_empty).any()):
                cause = ("merging two empty states (m_a = m_b = -inf): m = -inf and exp(m_a - m) = exp(-inf - "
                         "(-inf)) = NaN. The merge of two empty states is empty: return m = -inf, l = 0 "
                         "(use 0 in place of m in the exponents when m is -inf)")
            elif bool((torch.isinf(l) | torch.isnan(l)).any()) and float(m_ref[torch.isfinite(m_ref)].abs().max()) > 80:
                cause = ("exp of a maximum itself overflowed: with maxima in the thousands, exp(m_a) is inf. "
                         "Only exponentiate differences: l = l_a * exp(m_a - m) + l_b * exp(m_b - m), m = max")
            else:
                cause = "NaN or inf in (m, l): look at exp(m_a - m) and exp(m_b - m) where m is -inf"
            raise SoftmaxCheckError(f"{tag} {what}: NaN or inf in {_row_desc(bad_nan)}.\n  likely cause: {cause}")
        m_err = (m - m_ref).abs().masked_fill(torch.isneginf(m) & torch.isneginf(m_ref), 0.0)
        m_bad = (m_err > 1e-6 * (1 + m_ref.abs().nan_to_num(posinf=0.0, neginf=0.0))) | torch.isnan(m_err)
        if m_bad.any():
            raise SoftmaxCheckError(
                f"{tag} {what}: m is wrong in {_row_desc(m_bad)}.\n  likely cause: the merged max is "
                "m = max(m_a, m_b) (torch.maximum), and -inf for two empty states")
        l_bad = (l - l_ref).abs() > 2e-5 * l_ref.abs() + 1e-30
        if l_bad.any():
            no_alpha = Mistake("alpha rescale missing: l_a and l_b are sums relative to their own maxima; bring "
                               "both to the common max first, l = l_a * exp(m_a - m) + l_b * exp(m_b - m)",
                               lambda: {"l": a[1].double() + b[1].double()}, frozenset({"l"}))
            found = find_mistake({"m": got[0], "l": got[1]}, {"l"}, [no_alpha], 2e-5 * float(l_ref.abs().max()))
            cause = found.cause if found else ("l must be l_a * exp(m_a - m) + l_b * exp(m_b - m) with m = "
                                               "max(m_a, m_b); an empty state (m = -inf, l = 0) contributes 0")
            raise SoftmaxCheckError(f"{tag} {what}: l is wrong in {_row_desc(l_bad)}.\n  likely cause: {cause}")

    if case != "chain":
        a = state(x32[..., :split])
        b = state(x32[..., split:])
        want = reference_state(x32)
        judge_state(merge(a, b, "merge(a, b)"), want, (a, b), "merge(a, b)")
        judge_state(merge(b, a, "merge(b, a)"), want, (b, a), "merge(b, a) (the merge must be symmetric)")
        n = int(a[0].numel())
    else:
        want = reference_state(x32)
        bounds = list(range(0, x32.shape[-1], 37)) + [x32.shape[-1]]
        states = [state(x32[..., j0:j1]) for j0, j1 in zip(bounds[:-1], bounds[1:])]
        acc = (torch.full_like(states[0][0], float("-inf")), torch.zeros_like(states[0][1]))  # empty state
        for s, j1 in zip(states, bounds[1:]):
            prev = acc
            acc = merge(acc, s, "left-to-right fold from the empty state")
            judge_state(acc, reference_state(x32[..., :j1]), (prev, s),
                    f"left-to-right fold from the empty state, after column {j1}")
        level = states
        while len(level) > 1:
            nxt = [merge(level[i], level[i + 1], "tree merge") for i in range(0, len(level) - 1, 2)]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        judge_state(level[0], want, (level[0], level[0]), f"tree merge of {len(states)} blocks (associativity)")
        n = int(want[0].numel())
    if verbose:
        say(f"{tag} passed: {n} rows")
