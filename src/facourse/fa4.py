"""The one check of step 14: FlashAttention-4's two changes to the softmax, each a function.

* ``exp2_poly(x) -> y``: 2^x of a float32 tensor on the FMA pipes, as FA4 computes part of its
  exponentials: x = n + f with n = floor(x) and f in [0, 1), a polynomial for 2^f, and n added into the
  float's exponent bits. It passes when every y is within ``EXP2_BOUND`` (relative) of 2^x where 2^x is a
  normal float32, lies in [0, 2^-126] (to within the bound) below that (flushing to 0 is allowed, as the GPU's ex2.approx.ftz
  does), and is exactly 0 at x = -inf (a masked score).
* ``lazy_rescale_update(m, l, acc, s, v, threshold) -> (m, l, acc)``: one key tile of the online
  softmax with FA4's conditional rescale, scores in base 2. The running maximum m moves only when the
  tile's row maximum passes it by more than ``threshold``; then l and acc are rescaled by
  alpha = 2^(m_old - m_new). The check drives it over a row's tiles from the empty state
  (m = -inf, l = 0, acc = 0) and judges each step from the state before it: m exactly, l and acc within
  ``RESCALE_BOUND`` of their size (room for a polynomial exp2 inside), and at the end O = acc / l against
  float64 attention.

Why not ``rule.compare``: these functions are not attention, and their contract states its own bounds (a relative
error for an approximation of 2^x, a share of the size of l and acc), not twice PyTorch's rounding; the rest of the
rule is the same: ``guarded_call`` (NaN-filled allocations, inputs untouched), ``Mistake`` and ``diagnose``, and
nothing decided while collecting.

A failure raises :class:`FA4CheckError` (an ``AssertionError``) naming the case, the elements or rows
and tiles, and the likely cause. Under ``rule.collecting()`` (the grading kernel) the checks call the
function and verify nothing; the judge replays the recorded results through the same code.
"""
from __future__ import annotations

import math

import torch

from .configs import resolve_device
from .rule import (CheckError, Mistake, describe_rows, draw_seed, expect_tensor, guarded_call, is_collecting,
                   say)
from .rule import diagnose as find_mistake

#: Relative error allowed of exp2_poly where 2^x is a normal float: a sixteenth of bf16's unit roundoff (2^-8)
#: and half of fp16's (2^-11), the formats in which FA4 feeds P to the tensor cores.
EXP2_BOUND = 2.0 ** -12
#: Smallest normal float32: below it exp2_poly may return anything in [0, TINY].
TINY = 2.0 ** -126
#: Relative error allowed of one update's l and acc (of l, and of alpha |acc| + sum_j p_j |v_j|).
RESCALE_BOUND = 2.0 ** -11

EXP2_CASES = {
    "softmax": "x = S - m of attention scores in base 2 (x <= 0; -inf where the causal mask hides a key)",
    "grid": "f over [0, 1) at 2^-12 steps, shifted by every whole number n from -24 to 8 (FA4's P reaches 2^8)",
    "edges": "-inf, whole numbers from -126 to 127, values just below whole numbers and up to 128, -0.0, and x below "
             "-126",
}

RESCALE_CASES = {
    "random": "attention scores in base 2: 96 rows against 1024 keys in 8 tiles of 128, threshold 8",
    "growing": "rows whose maximum grows tile by tile: by less than the threshold, by exactly it, by far "
               "more, and falls; thresholds 8 and 2",
    "eager": "threshold 0: every growth of the maximum rescales (the online softmax of steps 03-05)",
    "masked": "rows whose first tiles are all -inf, rows with no finite score, and -inf holes",
}


class FA4CheckError(CheckError):
    """A result of step 14's functions that breaks the rule. The message teaches what went wrong."""


# ----------------------------------------------------------------------------- exp2_poly
def exp2_inputs(case: str, seed: int, device=None) -> torch.Tensor:
    """The float32 x of an exp2 case, drawn from ``seed``."""
    if case not in EXP2_CASES:
        raise KeyError(f"unknown exp2 case {case!r}; known: {', '.join(EXP2_CASES)}")
    dev = resolve_device(device)
    g = torch.Generator().manual_seed(int(seed))
    if case == "softmax":
        s = torch.randn(4, 96, 64, generator=g) @ torch.randn(4, 64, 300, generator=g) / 8.0 * math.log2(math.e)
        s = s * (1 + 3 * torch.rand(4, 96, 1, generator=g))                  # some rows peaked, some flat
        s = s.masked_fill(torch.ones(96, 300, dtype=torch.bool).triu(205), float("-inf"))   # causal, Skv > Sq
        x = s - s.amax(-1, keepdim=True)
    elif case == "grid":
        f = torch.arange(0, 4096) / 4096.0 + torch.rand(4096, generator=g) / 4096.0
        x = torch.arange(-24, 9, dtype=torch.float32)[:, None] + f[None, :]
    else:
        whole = torch.arange(-126, 128, dtype=torch.float32)
        below = whole - torch.rand(whole.shape, generator=g) * 1e-4 - 2e-7              # f just under 1
        under = -126.0 - 60.0 * torch.rand(64, generator=g)                              # 2^x under TINY
        top = 127.0 + 0.99 * torch.rand(8, generator=g)                                   # the largest normals
        x = torch.cat([whole, below, under, top, torch.tensor([float("-inf")] * 8 + [-0.0, -1e-30, -300.0, -1e4])])
        x = x[torch.randperm(x.numel(), generator=g)]
    return x.to(torch.float32).to(dev)


def reference_exp2(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(x.detach().to(torch.float64))


def _exp2_where(x: torch.Tensor, bad: torch.Tensor) -> str:
    xs = x[bad].double()
    n = int(bad.sum())
    lo, hi = float(xs.min()), float(xs.max())
    return f"{n} of {x.numel()} elements, x from {lo:.6g} to {hi:.6g}"


def _exp2_cause(x: torch.Tensor, y: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor) -> str:
    """Why exp2_poly is wrong where ``bad``: judged from where and how (x, y and 2^x in float64)."""
    neg_inf = torch.isneginf(x)
    tiny = ~neg_inf & (ref < TINY)
    normal = ~neg_inf & ~tiny
    at_inf = y[bad & neg_inf]
    if (bool((bad & neg_inf).any()) and not bool((bad & ~neg_inf).any()) and bool(torch.isfinite(at_inf).all())
            and bool((at_inf > 0).all())):
        floor = math.log2(float(at_inf.max()))
        return (f"x = -inf gives {float(at_inf.max()):.6g} = 2^{floor:.4g}, not 0: the clamp from below keeps 2^x "
                "at the clamp's value. A masked score must give exactly 0: clamp to -127 when your polynomial gives "
                "exactly 1 at f = 0 (the exponent bits then come out 0), or set the result to 0 where x < -126")
    if bool((bad & neg_inf).any()) and not bool((bad & ~neg_inf).any()):
        return (f"x = -inf (a masked score) must give 0, and gave {float(at_inf[0]):.6g}: unclamped, floor(-inf) is "
                "-inf and converting it to an integer is undefined (NaN or garbage in the exponent bits); clamped "
                "below -127, n + 127 < 0 wraps the exponent field. Clamp x from below first: to -127 when "
                "your polynomial gives exactly 1 at f = 0 (then the bits come out 0), else to -126 (a p(0) just "
                "under 1 has exponent field 126, and n = -127 takes it below zero)")
    if bool((bad & tiny).any()) and not bool((bad & normal).any()):
        return ("only x below -126 is wrong: there n + 127 < 1, and adding n << 23 to the bits of 2^f takes the "
                "exponent field below zero, which wraps into the sign bit (negative or huge results). Clamp x "
                "to at least -127 before the range reduction (2^x is below float32's smallest normal there, "
                "and 0 is an accepted answer), and take n = floor(x): with trunc, x in (-127, -126) still wraps")
    rel = torch.where(normal, (y - ref).abs() / ref, torch.zeros_like(ref))
    ratio = torch.where(normal & (ref > 0), y / ref, torch.ones_like(ref))
    inner = normal & (x >= -125) & (x < 127)    # an exponent off by one wraps in the lowest and the highest binade
    for k, word in ((2.0, "twice"), (0.5, "half")):
        if bool((bad & inner).any()) and bool(((ratio[inner] - k).abs() <= 2 * EXP2_BOUND * k).all()):
            return (f"every result is {word} 2^x: the exponent is off by one. The polynomial gives 2^f in [1, 2), "
                    "whose exponent field already holds the bias 127; add n << 23 to its bits, no more")
    over = bad & normal & torch.isposinf(y)
    if bool(over.any()) and float(x[over].min()) >= 127:      # (inf lower down is no overflow of 2^n alone)
        return (f"x = {float(x[over].min()):.6g} gives inf although 2^x is below 2^128 there: the result overflows. "
                "A 2^n made on its own and multiplied by p(f) overflows once n reaches 128 (n = round(x) does for x "
                ">= 127.5); adding n << 23 to the bits of p(f), with n = floor(x) <= 127, stays finite up to x < 128")
    f = x - torch.floor(x)
    finite_bad = bad & normal
    good = normal & ~bad
    if bool(finite_bad.any()) and bool(good.any()):
        x0, ys = float(x[good].max()), y[finite_bad]
        if (float(x[finite_bad].min()) > x0 and float(ys.max()) == float(ys.min())
                and math.isfinite(float(ys[0]))):
            return (f"every x above {x0:.6g} gives the same {float(ys[0]):.6g}: x is clamped from above. 2^x must be "
                    "right wherever it is a normal float32 (up to x < 128): clamp x from below only")
        def rel_at(lo, hi):     # the largest relative error at f in [lo, hi)
            r = rel[normal & (f >= lo) & (f < hi)]
            return float(r.max()) if r.numel() else 0.0
        if (not bool((finite_bad & (f < 0.5)).any()) and bool((good & (f < 0.5)).any())
                and rel_at(0.5, 0.5625) > rel_at(0.9375, 1.0)):
            return ("wrong exactly where x - floor(x) >= 1/2: n = round(x) makes f = x - n negative there, in "
                    "[-1/2, 0), outside the interval [0, 1) your polynomial was fitted on. Fit it on [-1/2, 1/2] "
                    "(then keep round), or take n = floor(x)")
    pos, negf = normal & (x > 0) & (f > 0), normal & (x < 0) & (f > 0)
    if bool(pos.any()) and bool((finite_bad & negf).any()) and not bool((finite_bad & pos).any()):
        return ("wrong only for negative x that are no whole number: the range reduction rounds toward zero "
                "(trunc, int(), .to(torch.int32)) instead of down, so for x < 0 the fraction f = x - n lies in "
                "(-1, 0], where the polynomial was not made to work. Take n = floor(x) (f in [0, 1)), or round "
                "to nearest and fit the polynomial on [-1/2, 1/2]")
    fb = (f * 16).floor().clamp(max=15)

    def by_f(where):    # the largest relative error in each sixteenth of f's range
        return [float(rel[where & (fb == b)].max()) if bool((where & (fb == b)).any()) else 0.0 for b in range(16)]

    neg = by_f(negf)
    if (not bool((finite_bad & ~negf).any()) and neg[15] <= EXP2_BOUND
            and max(range(16), key=lambda b: neg[b]) < 8 and neg[0] >= max(neg) / 2):
        return ("wrong for negative x, most at f = x - floor(x) near 0 and right near 1: the range reduction rounds "
                "toward zero (trunc, int(), .to(torch.int32)) or up (ceil) instead of down, so for x < 0 the "
                "polynomial is evaluated at x - trunc(x) in (-1, 0], where it was not made to work. Take n = floor(x) "
                "(f in [0, 1)), or round to nearest and fit the polynomial on [-1/2, 1/2]")
    varies = _varies_with_n(x, ratio, inner & (f > 0))
    if varies:
        return varies
    errs = by_f(normal)
    worst = max(range(16), key=lambda b: errs[b])
    if (bool((finite_bad & (x > 0)).any()) and errs[15] <= EXP2_BOUND and errs[0] >= errs[worst] / 2
            and not bool((finite_bad & (f == 0)).any())):      # (a rounding up jumps at f = 0+; a polynomial does not)
        return ("wrong most at f = x - floor(x) near 0 and right near 1, for positive x as for negative, and right "
                "at whole numbers: n = ceil(x) makes f = x - n lie in (-1, 0], where the polynomial was not made to "
                "work. Take n = floor(x) (f in [0, 1))")
    # the same relative error at the same f for every n: the polynomial is what is off
    if errs[worst] > EXP2_BOUND:
        where = f"f = x - floor(x) in [{worst / 16:.4g}, {(worst + 1) / 16:.4g})"
        ends = ("it grows towards f = 1: a Taylor polynomial about 0 is exact at 0 and worst at the far end"
                if worst >= 12 and errs[0] < errs[worst] / 8 else "")
        told = _told_polynomial(x, y, inner & torch.isfinite(y))
        return (f"the polynomial for 2^f is not accurate enough: its relative error reaches {errs[worst]:.3g} at "
                f"{where} (allowed {EXP2_BOUND:.3g} = 2^-12){'; ' + ends if ends else ''}. "
                + (told or "Fit its coefficients over the whole interval (least squares on a grid of f, or "
                   "minimax), centre it (n = round(x), |f| <= 1/2), or raise its degree; and evaluate it in float32 "
                   "with Horner's rule"))
    return ("the values are off although the polynomial's error at each f is small: check how n enters the "
            "exponent bits (y_bits = p_bits + (n << 23), in int32) and that the result is viewed back as float32")


#: (c1, c2, c3) of a cubic fitted to 2^f over [0, 1] (least squares on the relative error) and Taylor's at 0
_FITTED = (0.69504, 0.22831, 0.07633)
_TAYLOR = (math.log(2), math.log(2) ** 2 / 2, math.log(2) ** 3 / 6)


def _varies_with_n(x, ratio, where) -> str | None:
    """Why, when y / 2^x at about the same fraction f differs from one whole part n = floor(x) to another: the
    polynomial's error depends on f alone, so n enters the result wrongly."""
    if int(where.sum()) < 2:
        return None
    r = ratio[where].nan_to_num(nan=1e30, posinf=1e30, neginf=-1e30)
    f = x[where].double() - torch.floor(x[where].double())
    bins = (f * 256).long().clamp(max=255)
    hi = torch.full((256,), -math.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, bins, r, "amax")
    lo = torch.full((256,), math.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, bins, r, "amin")
    seen = torch.isfinite(hi) & torch.isfinite(lo)
    spread, off = (hi - lo)[seen], torch.maximum((hi - 1).abs(), (lo - 1).abs())[seen]
    if not bool(((spread > 0.05) & (spread > off / 2)).any()):
        return None
    n, good = torch.floor(x[where]), ((r - 1).abs() <= EXP2_BOUND)
    wrong = sorted(set(n[~good].tolist()))
    right = sorted(set(n[good].tolist()) - set(wrong))
    which = f"wrong for n = {_wholes(wrong)}" + (f", right for n = {_wholes(right)}" if right else ": every n seen")
    return (f"at the same fraction f = x - floor(x) the error differs from one whole part n = floor(x) to the next "
            f"({which}): the polynomial's error would be the same for every n, so n enters the result wrongly. "
            "2^n multiplies p(f) when n << 23 (the exponent field starts at bit 23) is added to the int32 bits of "
            "p(f): check the shift, the cast of n to int32 (an int8 or int16 field wraps), and that the polynomial "
            "is evaluated at f, not at x")


def _wholes(vals: list) -> str:
    """Whole numbers for a message: a few listed, a run as 'a to b', else how many and their span."""
    if len(vals) <= 4:
        return ", ".join(f"{v:g}" for v in vals)
    run = vals[-1] - vals[0] + 1 == len(vals)
    return f"{vals[0]:g} to {vals[-1]:g}" if run else f"{len(vals)} values from {vals[0]:g} to {vals[-1]:g}"


def _told_polynomial(x, y, where) -> str | None:
    """What is wrong with the student's polynomial, from its values: p(f) = y / 2^n is recovered where ``where``
    and, when it is a cubic in f, its coefficients are compared with a fit's and Taylor's."""
    xs, ys = x[where].detach().double().cpu(), y[where].detach().double().cpu()
    n = torch.floor(xs)
    f = xs - n
    if (f * 16).floor().unique().numel() < 8:
        return None                                      # too few fractions to tell one cubic from another
    w = torch.exp2(-f)                                   # weights: the relative error
    A = torch.stack([torch.ones_like(f), f, f * f, f * f * f], 1) * w[:, None]
    c = torch.linalg.lstsq(A, (ys * torch.exp2(-n) * w)[:, None]).solution[:, 0]
    if float((A @ c - ys * torch.exp2(-n) * w).abs().max()) > 1e-5:
        return None                                      # not a cubic in f: nothing more to say from its values
    c0, *cs = c.tolist()
    said = f"Your function evaluates p(f) = {c0:.4g} + {cs[0]:.4g} f + {cs[1]:.4g} f^2 + {cs[2]:.4g} f^3"
    near = lambda a, b, tol: all(abs(u - v) <= tol for u, v in zip(a, b))    # noqa: E731
    fit = ", ".join(f"{v:.4g}" for v in _FITTED)
    if abs(c0 - 1) > 1e-3:
        return f"{said}: its constant term must be 1 (p(0) = 2^0; then whole numbers come out exact)"
    if near(cs[::-1], _FITTED, 0.01):
        return (f"{said}: the coefficients of a fit (about {fit} for c1, c2, c3) in reverse order. Horner's rule "
                "starts from the highest degree: p = ((c3 f + c2) f + c1) f + 1")
    if near(cs, _TAYLOR, 0.005):
        return (f"{said}: Taylor's coefficients at 0 (or a fit on [-1/2, 1/2], which is close to them), exact at "
                f"f = 0 and worst at f = 1. Fit over [0, 1] (about {fit}), or take n = round(x) for a centred fit")
    return f"{said}; a least-squares fit of 2^f over [0, 1] gives about c = ({fit}): refit, or raise the degree"


def check_exp2_result(y, x, *, tag: str) -> float:
    """Judge ``y`` = exp2_poly(x); returns the largest relative error where 2^x is normal."""
    expect_tensor(y, x, name="the result", like_name="x", tag=tag, error=FA4CheckError,
                  dtype_note=" (float32: the bits of 2^f are a float32's)")
    if is_collecting():
        return 0.0
    ref = reference_exp2(x)
    y64 = y.detach().to(torch.float64)
    neg_inf = torch.isneginf(x)
    tiny = ~neg_inf & (ref < TINY)
    normal = ~neg_inf & ~tiny
    rel = torch.where(normal, (y64 - ref).abs() / ref.clamp(min=TINY), torch.zeros_like(ref))
    bad = (normal & ~(rel <= EXP2_BOUND)) | (tiny & ~((y64 >= 0) & (y64 <= TINY * (1 + EXP2_BOUND)))) | (neg_inf & ~(y64 == 0))
    if not bool(bad.any()):
        return float(rel.max()) if rel.numel() else 0.0
    i = int(torch.nonzero(bad.reshape(-1))[0])
    xi, yi, ri = float(x.reshape(-1)[i]), float(y64.reshape(-1)[i]), float(ref.reshape(-1)[i])
    nonfinite = bool((~torch.isfinite(y64) & bad).any())
    what = "NaN or inf" if nonfinite else "wrong values"
    raise FA4CheckError(f"{tag} {what} at {_exp2_where(x, bad)}; allowed: relative error {EXP2_BOUND:.3g} where "
                        f"2^x >= 2^-126, a value in [0, 2^-126] below, exactly 0 at x = -inf.\n"
                        f"  first wrong element: x = {xi!r}, got {yi:.9g}, 2^x = {ri:.9g}\n"
                        f"  likely cause: {_exp2_cause(x, y64, ref, bad)}")


def check_exp2_fn(fn, case: str = "softmax", *, seed: int | None = None, device=None, verbose: bool = True) -> None:
    """Check ``fn(x) -> 2^x`` (exp2_poly) on the inputs of ``case`` (EXP2_CASES). Prints one line on
    success, raises FA4CheckError otherwise."""
    seed = draw_seed(seed)
    tag = f"[exp2 {case}] (seed {seed})"
    x = exp2_inputs(case, seed, device)
    y = guarded_call(fn, x, device=x.device, tag=tag, inputs={"x": x}, error=FA4CheckError,
                     untouched="exp2_poly must leave x untouched (no in-place floor_/sub_ on it)")
    worst = check_exp2_result(y, x, tag=tag)
    if verbose:
        say(f"{tag} passed: {x.numel()} values, max relative error {worst:.2e} (allowed {EXP2_BOUND:.2e})")


# ----------------------------------------------------------------------------- lazy_rescale_update
#: A threshold converted as if it were in natural-log units: the bug's name -> the factor it picked up
_UNIT_SLIPS = {"threshold_ln2": math.log(2), "threshold_log2e": math.log2(math.e)}


def lazy_step(m, l, acc, s, v, threshold: float, bug: str | None = None):
    """One tile of the conditional-rescale update in float64 from a state (the reference), or with a
    classic ``bug``: "eager" (m follows every growth), "at_threshold" (moves when the growth equals the
    threshold), "threshold_ln2" and "threshold_log2e" (the threshold converted between bases), "natural"
    (exp instead of exp2), "no_alpha_l", "no_alpha_acc", "no_alpha" (neither rescaled), "alpha_sign",
    "p_old_m" (P from the maximum before the update)."""
    m, l, acc, s, v = (t.detach().to(torch.float64) for t in (m, l, acc, s, v))
    rowmax = s.amax(-1)
    grows = rowmax > m + threshold * _UNIT_SLIPS.get(bug, 1.0)
    if bug == "eager":
        grows = rowmax > m
    elif bug == "at_threshold":
        grows = rowmax >= m + threshold
    m_new = torch.where(grows, rowmax, m)
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)       # a row with no score yet
    exp = torch.exp if bug == "natural" else torch.exp2
    before = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = exp(s - (before if bug == "p_old_m" else base)[:, None])
    old = torch.where(torch.isneginf(m), torch.full_like(m, -math.inf), m - base)
    alpha = exp(-old if bug == "alpha_sign" else old)
    l_new = (l if bug in ("no_alpha_l", "no_alpha") else alpha * l) + p.sum(-1)
    acc_new = (acc if bug in ("no_alpha_acc", "no_alpha") else alpha[:, None] * acc) + p @ v
    return m_new, l_new, acc_new, alpha[:, None] * acc.abs() + p @ v.abs()


def _clear_of_ties(s: torch.Tensor, N: int, threshold: float, ulps: int = 8) -> None:
    """Raise (in place) each tile's row maximum that lies within ``ulps`` float32 ulps of an earlier tile's maximum
    plus ``threshold``: m is always an earlier tile's maximum, and at such a tie whether the maximum passes m + tau
    depends on rounding (m + tau in float32 may round onto it, while the rule is judged in float64), so the
    update's >, a >= and a float64 comparison would part there by luck. A tie is the growing case's to test."""
    R, T = s.shape[0], s.shape[1] // N
    for j in range(1, T):
        tile = s[:, j * N:(j + 1) * N]                       # a view: written into s
        earlier = s[:, :j * N].reshape(R, j, N).amax(-1).double() + threshold
        for _ in range(4 * j + 4):
            r = tile.amax(-1).double()
            gap = ulps * 2.0 ** -23 * torch.maximum(earlier.abs(), r.abs()[:, None]).clamp(min=1.0)
            near = (torch.isfinite(r)[:, None] & torch.isfinite(earlier) & ((r[:, None] - earlier).abs() <= gap)).any(-1)
            if not bool(near.any()):
                break
            rows = torch.nonzero(near).flatten()
            tile[rows, tile[rows].argmax(-1)] = (r[rows] + 2 * gap[rows].amax(-1)).float()


def rescale_inputs(case: str, seed: int, device=None):
    """(tiles, D, thresholds): the score tiles s_j [R, N] (base 2) and value tiles v_j [N, D] of a case, and the
    thresholds it runs with."""
    if case not in RESCALE_CASES:
        raise KeyError(f"unknown rescale case {case!r}; known: {', '.join(RESCALE_CASES)}")
    dev = resolve_device(device)
    g = torch.Generator().manual_seed(int(seed))
    D = 32
    if case in ("random", "eager"):
        R, N, T = 96, 128, 8
        q, k = torch.randn(R, 64, generator=g), torch.randn(N * T, 64, generator=g)
        s = q @ k.T / 8.0 * math.log2(math.e) * (1 + 3 * torch.rand(R, 1, generator=g))
        s[::5] += torch.linspace(0, 40, N * T)                 # rows whose maximum keeps growing
        thresholds = (8.0,) if case == "random" else (0.0,)
    elif case == "growing":
        R, N, T = 48, 64, 10
        s = torch.randn(R, N * T, generator=g) - 30.0
        # each tile's row maximum (plus a quarter per row class): at threshold 8 it stays, stays at exactly
        # m + 8, moves, moves, moves, falls, stays, stays at exactly m + 8, moves; at threshold 2 as the rule says.
        # Tile 1 grows the rows of six classes by 1, 4, 6, 8, 9 and 12: each misreading of the rule (every
        # growth, >=, tau times ln 2 or log2 e, never) moves another set of rows there
        top = torch.tensor([2.0, 3.0, 10.0, 10.5, 19.5, 60.0, 57.0, 62.0, 68.0, 68.25])
        cols = torch.randint(0, N, (R, T), generator=g)
        rows = torch.arange(R)
        for t in range(T):
            tops = 2.0 + torch.tensor([1.0, 4.0, 6.0, 8.0, 9.0, 12.0])[rows % 6] if t == 1 else top[t]
            s[rows, t * N + cols[:, t]] = tops + (rows % 4) * 0.25
        thresholds = (8.0, 2.0)
    else:
        R, N, T = 64, 96, 6
        s = torch.randn(R, N * T, generator=g) * 4.0
        s[0:16, :3 * N] = -math.inf                             # first tiles all -inf
        s[16:24] = -math.inf                                    # no finite score at all
        s[24:48] = s[24:48].masked_fill(torch.rand(24, N * T, generator=g) < 0.5, -math.inf)
        s[48:56, -N:] = -math.inf                               # the last tile all -inf
        thresholds = (8.0,)
    if case != "growing":       # its ties are exact and placed; elsewhere none is left to float32's rounding
        for threshold in thresholds:
            _clear_of_ties(s, N, threshold)
    v = torch.randn(N * T, D, generator=g)
    tiles = [(s[:, j:j + N].contiguous().to(dev), v[j:j + N].contiguous().to(dev)) for j in range(0, N * T, N)]
    return tiles, D, thresholds


_M_BUGS = {   # the more specific first: where the maximum grows by exactly the threshold, both move m
    "at_threshold": "m moved where the tile's row maximum is exactly m + threshold: the rule is strictly "
                    "greater (P may reach exactly 2^threshold)",
    "eager": "m moved although the tile's row maximum passed it by no more than the threshold: the update keeps the "
             "old maximum unless max_j s_ij > m_i + threshold (FA4 skips the rescale while P stays below "
             "2^threshold); here m follows every growth, as the online softmax of steps 03-05 does",
    **{bug: f"m moves as if the threshold were threshold x {name}: it was converted as if it were in natural-log "
            "units. It is in base 2, like the scores (log2(e) and the scale are folded into s): compare "
            "max_j s_ij > m_i + threshold as given"
       for bug, name in (("threshold_ln2", "ln 2"), ("threshold_log2e", "log2(e)"))},
}
_STATE_BUGS = {   # bug -> (cause, the outputs it breaks)
    "natural": ("the scores are in base 2 (log2(e) is folded into them): P = 2^(s - m) and alpha = 2^(m_old - "
                "m_new), with torch.exp2; torch.exp gives another softmax", {"l", "acc"}),
    "no_alpha_l": ("l was not rescaled when m moved: l = alpha * l + sum_j P_ij with alpha = 2^(m_old - m_new)",
                   {"l"}),
    "no_alpha_acc": ("acc was not rescaled when m moved: acc = alpha * acc + P V with alpha = 2^(m_old - m_new)",
                     {"acc"}),
    "alpha_sign": ("the rescale has the wrong sign: alpha = 2^(m_old - m_new) (<= 1 when m grows)", {"l", "acc"}),
    "no_alpha": ("neither l nor acc was rescaled when m moved: l = alpha * l + sum_j P_ij and acc = alpha * acc + "
                 "P V, with alpha = 2^(m_old - m_new)", {"l", "acc"}),
    "p_old_m": ("P was computed from the old m: P = 2^(s - m_new), from the maximum after this tile's update (the "
                "old one enters only alpha = 2^(m_old - m_new))", {"l", "acc"}),
}


def _rows(mask: torch.Tensor) -> str:
    return describe_rows(mask.reshape(-1), ("rows",))


def _same_m(a: torch.Tensor, b: torch.Tensor, before: torch.Tensor) -> bool:
    """Every row's m the same, and some seen row moved (a mistake must explain the rows kept too, and one that
    moves no row here cannot be told from an update that never moves m)."""
    moved = bool(((a != before) & torch.isfinite(before)).any())
    return moved and bool(((a == b) | (torch.isneginf(a) & torch.isneginf(b))).all())


def _judge_step(state, got, s, v, threshold, tag):
    """One update judged from the state before it (``state``: the check's float64 copy of it)."""
    m0, l0, acc0 = state
    m_ref, l_ref, acc_ref, size = lazy_step(m0, l0, acc0, s, v, threshold)
    m, l, acc = (t.detach().to(torch.float64) for t in got)
    m_bad = ~((m == m_ref) | (torch.isneginf(m) & torch.isneginf(m_ref)))
    if bool(m_bad.any()):
        rowmax = s.double().amax(-1)
        if bool(torch.isnan(m).any()):
            cause = ("NaN in m: a row with no finite score yet has m = -inf, and m + threshold or a max with NaN "
                     "poisons it; keep m = -inf until a finite score comes")
        else:
            cause = next((text for bug, text in _M_BUGS.items() if _same_m(lazy_step(m0, l0, acc0, s, v, threshold,
                                                                                     bug)[0], m, m0)), None)
            if cause is None and bool((m[m_bad] == m0.double()[m_bad]).all()):
                cause = ("m stayed where the tile's row maximum passed it by more than the threshold: then the "
                         "rescale is due, m = max_j s_ij (else P = 2^(s - m) grows past 2^threshold and overflows)")
            cause = cause or ("m must be the tile's row maximum where it passes m by more than the threshold, and "
                              "stay as it was everywhere else (never lower)")
        i = int(torch.nonzero(m_bad)[0])
        raise FA4CheckError(f"{tag}: m is wrong in {_rows(m_bad)}; row {i}: m before {float(m0[i])!r}, tile's max "
                            f"{float(rowmax[i])!r}, threshold {threshold:g}: got {float(m[i])!r}, expected "
                            f"{float(m_ref[i])!r}.\n  likely cause: {cause}")
    empty = torch.isneginf(m_ref)
    tol_l = RESCALE_BOUND * l_ref
    tol_acc = RESCALE_BOUND * size
    l_bad = ~((l - l_ref).abs() <= tol_l) | (empty & (l != 0))
    acc_bad = ~((acc - acc_ref).abs() <= tol_acc) | (empty[:, None] & (acc != 0))
    if not bool(l_bad.any() or acc_bad.any()):
        return
    wrong = {name for name, bad in (("l", l_bad), ("acc", acc_bad)) if bool(bad.any())}
    nonfinite = not bool(torch.isfinite(l).all() and torch.isfinite(acc).all())
    bad_rows = l_bad | acc_bad.any(-1)
    if nonfinite and bool((bad_rows & empty).any()):
        cause = ("NaN in a row that has seen no finite score: m = -inf there, and s - m = -inf - (-inf) = NaN. "
                 "Use 0 in place of m while it is -inf (P = 0, l and acc stay 0)")
    else:
        def tol(name, alt):     # at the reference's size or, where a mistake makes them larger, at the mistake's
            return max(float((tol_l if name == "l" else tol_acc).max()), RESCALE_BOUND * float(alt.abs().max()))
        mistakes = [Mistake(text, lambda bug=bug: dict(zip(("m", "l", "acc"),
                                                            lazy_step(m0, l0, acc0, s, v, threshold, bug)[:3])),
                            frozenset(breaks))
                    for bug, (text, breaks) in _STATE_BUGS.items()]
        found = None if nonfinite else find_mistake({"m": m, "l": l, "acc": acc}, wrong, mistakes, tol)
        cause = found.cause if found else (
            "with m right, l = alpha * l + sum_j P_ij and acc = alpha * acc + P V, where P = 2^(s - m_new) and "
            "alpha = 2^(m_old - m_new); a NaN or inf points at -inf - (-inf) or an unwritten element")
    which = " and ".join(sorted(wrong))
    raise FA4CheckError(f"{tag}: {which} wrong in {_rows(bad_rows)} (allowed: {RESCALE_BOUND:.3g} of their size).\n"
                        f"  likely cause: {cause}")


def _judge_output(m, l, acc, tiles, tag):
    """O = acc / l after the last tile against float64 attention of the whole row (base-2 scores)."""
    s = torch.cat([t[0] for t in tiles], -1).double()
    v = torch.cat([t[1] for t in tiles], 0).double()
    mx = s.amax(-1, keepdim=True)
    p = torch.exp2(s - torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx))
    den = p.sum(-1, keepdim=True)
    ref = torch.where(den > 0, (p @ v) / den.clamp(min=1e-300), torch.zeros_like(den))
    l64, acc64 = l.detach().double()[:, None], acc.detach().double()
    o = torch.where(l64 > 0, acc64 / l64.clamp(min=1e-300), torch.zeros_like(acc64))
    size = (p @ v.abs()) / den.clamp(min=1e-300)
    bad = ~((o - ref).abs() <= 4 * RESCALE_BOUND * size + 1e-12)
    if bool(bad.any()):
        raise FA4CheckError(f"{tag}: O = acc / l after the last tile differs from attention of the whole row in "
                            f"{_rows(bad.any(-1))}.\n  likely cause: each step was right from the state it was "
                            "given, so the state passed from tile to tile drifts: return new m, l and acc every "
                            "call, in float32")


def check_rescale_fn(fn, case: str = "random", *, seed: int | None = None, device=None, verbose: bool = True) -> None:
    """Check ``fn(m, l, acc, s, v, threshold) -> (m, l, acc)`` (lazy_rescale_update) over the tiles of ``case``
    (RESCALE_CASES), from the empty state, for each of the case's thresholds."""
    seed = draw_seed(seed)
    tiles, D, thresholds = rescale_inputs(case, seed, device)
    R, dev = tiles[0][0].shape[0], tiles[0][0].device
    rescales = []
    for threshold in thresholds:
        tag = f"[rescale {case}, threshold {threshold:g}] (seed {seed})"
        m = torch.full((R,), -math.inf, device=dev)
        l, acc = torch.zeros(R, device=dev), torch.zeros(R, D, device=dev)
        moves = 0
        for j, (s, v) in enumerate(tiles):
            where = f"{tag} tile {j} (keys {j * s.shape[1]}-{(j + 1) * s.shape[1] - 1})"
            got = guarded_call(fn, m, l, acc, s, v, threshold, device=dev, tag=where, error=FA4CheckError,
                               inputs={"m": m, "l": l, "acc": acc, "s": s, "v": v},
                               untouched="return new tensors (m, l, acc); leave the state and the tile untouched")
            if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
                raise FA4CheckError(f"{where}: the update must return a tuple of three tensors (m, l, acc)")
            for t, like, name in zip(got, (m, l, acc), ("m", "l", "acc")):
                expect_tensor(t, like, name=f"the new {name}", like_name=name, tag=where, error=FA4CheckError)
            if not is_collecting():
                _judge_step((m, l, acc), got, s, v, threshold, where)
                moves += int((got[0] != m).sum()) - int((torch.isneginf(m) & ~torch.isneginf(got[0])).sum())
            m, l, acc = got
        if not is_collecting():
            _judge_output(m, l, acc, tiles, tag)
        rescales.append(moves)
    if verbose:
        counts = ", ".join(f"threshold {t:g}: {n}" for t, n in zip(thresholds, rescales))
        say(f"[rescale {case}] (seed {seed}) passed: {R} rows, {len(tiles)} tiles; rescales of a seen row ({counts})")


__all__ = ["EXP2_BOUND", "EXP2_CASES", "RESCALE_BOUND", "RESCALE_CASES", "FA4CheckError", "check_exp2_fn",
           "check_rescale_fn", "exp2_inputs", "lazy_step", "reference_exp2", "rescale_inputs"]
