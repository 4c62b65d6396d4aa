"""Exercise 14 (FlashAttention-4's software exp2 and conditional rescale) and its check, facourse.fa4.

Grading: the solution (every autograded point, the written answer left to the instructor) and the
untouched stub (0) through nbgrader (``GRADING``, the demo's samples, graded in
tests/test_exercise_grading.py's one run); planted bugs through the judge, each losing the test that
names it while the others pass; the guard that keeps PyTorch's exponentials out of ``exp2_poly``, and
with them NumPy's, Python's and a table of powers made beforehand.
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_planted, planted_verdicts, solution_and_stub, solution_code
from autograder.guards import CheatDetected, forbid_exponentials
from facourse import FA4CheckError, check_exp2_fn, check_rescale_fn
from facourse.fa4 import EXP2_CASES, RESCALE_CASES, rescale_inputs

A14 = "14_after_hopper"
GIVEN = ("imports", "exp2_fit")
ANSWER = "P~ stays below 2^tau; the two units run in parallel."   # a written answer

#: The demo's planted bug (carol): trunc for floor.
PLANTED = ("exp2_poly", "n = torch.floor(x)", "n = torch.trunc(x)", "test_exp2_grid", "rounds toward zero")
GRADING = solution_and_stub(A14, 7, set(), 0, PLANTED, {"written_after_hopper": ANSWER})

EXP2 = ["test_exp2_softmax", "test_exp2_grid", "test_exp2_edges"]
RESCALE = ["test_rescale_random", "test_rescale_growing", "test_rescale_eager", "test_rescale_masked"]


def _mutate(code: str, old: str, new: str) -> str:
    assert old in code, f"planted bug out of date: {old!r} is not in the solution"
    return code.replace(old, new)


def test_planted_bugs_14(tmp_path):
    code = solution_code(A14)
    exp2, fit, upd = code["exp2_poly"], code["exp2_coefficients"], code["lazy_rescale_update"]
    bugs = {
        "trunc": {"exp2_poly": _mutate(exp2, *PLANTED[1:3])},
        "no_clamp": {"exp2_poly": _mutate(exp2, "x = x.clamp(min=-127.0)", "pass")},
        "taylor": {"exp2_coefficients": _mutate(fit, "    f = torch.linspace",
                                                "    return math.log(2), math.log(2) ** 2 / 2, math.log(2) ** 3 / 6\n"
                                                "    f = torch.linspace")},
        "calls_exp2": {"exp2_poly": _mutate(exp2, "    x = x.clamp(min=-127.0)", "    return torch.exp2(x)")},
        "eager": {"lazy_rescale_update": _mutate(upd, "rowmax > m + threshold", "rowmax > m")},
        "at_threshold": {"lazy_rescale_update": _mutate(upd, "rowmax > m + threshold", "rowmax >= m + threshold")},
        "threshold_8": {"lazy_rescale_update": _mutate(upd, "rowmax > m + threshold", "rowmax > m + 8.0")},
        "nan_on_empty": {"lazy_rescale_update": _mutate(
            upd, "base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)", "base = m_new")},
        "no_alpha_l": {"lazy_rescale_update": _mutate(upd, "alpha * l + p.sum(-1)", "l + p.sum(-1)")},
        # exponentials the dispatcher never sees: NumPy, Python's ** on the values, a table made before grading
        "numpy": {"exp2_poly": _mutate(exp2, "    x = x.clamp(min=-127.0)", "    import numpy as np\n"
                                       "    return torch.from_numpy(np.exp2(x.numpy()))")},
        "python_pow": {"exp2_poly": _mutate(exp2, "    x = x.clamp(min=-127.0)",
                                            "    return torch.tensor([2.0 ** t for t in x.reshape(-1).tolist()]).view(x.shape)")},
        "table": {"exp2_poly": _mutate(_mutate(exp2, "def exp2_poly(x):", "TABLE = torch.exp2(torch.arange(4097.0) / 4096)"
                                               "\n\n\ndef exp2_poly(x):"),
                                       "((C3 * f + C2) * f + C1) * f + 1.0", "TABLE[(f * 4096).round().long()]")},
        # the range reduction's and the exponent's classic slips
        "horner_reversed": {"exp2_poly": _mutate(exp2, "((C3 * f + C2) * f + C1)", "((C1 * f + C2) * f + C3)")},
        "bias_126": {"exp2_poly": _mutate(exp2, "(p.view(torch.int32) + (n.to(torch.int32) << 23))",
                                          "(((n + 126).to(torch.int32) << 23) | (p.view(torch.int32) & 0x7FFFFF))")},
        "shift_22": {"exp2_poly": _mutate(exp2, "<< 23", "<< 22")},
        "ceil": {"exp2_poly": _mutate(exp2, "torch.floor(x)", "torch.ceil(x)")},
        # the update: tau converted as if it were in natural-log units, P from the old m, no rescale at all
        "threshold_ln2": {"lazy_rescale_update": _mutate(upd, "rowmax > m + threshold",
                                                        "rowmax > m + threshold * math.log(2)")},
        "p_old_m": {"lazy_rescale_update": _mutate(upd, "p = torch.exp2(s - base[:, None])",
                                                   "p = torch.exp2(s - torch.where(torch.isneginf(m), 0.0, m)[:, None])")},
        "no_alpha": {"lazy_rescale_update": _mutate(upd, "alpha = torch.exp2(m - base)", "alpha = torch.ones_like(m)")},
    }
    expect = {   # bug: (the test it fails, what its message says, the tests it passes)
        "trunc": ("test_exp2_grid", "rounds toward zero", RESCALE),   # (edges: x in (-127, -126) may wrap too)
        "no_clamp": ("test_exp2_edges", "x below -126", ["test_exp2_grid"] + RESCALE),
        "taylor": ("test_exp2_grid", "grows towards f = 1", RESCALE),
        "calls_exp2": ("test_exp2_softmax", "[anti-cheat]", RESCALE),
        "eager": ("test_rescale_growing", "m follows every growth", EXP2 + ["test_rescale_eager"]),
        "at_threshold": ("test_rescale_growing", "strictly greater", EXP2 + ["test_rescale_random",
                                                                               "test_rescale_masked"]),
        "threshold_8": ("test_rescale_growing", "threshold 2", EXP2 + ["test_rescale_random", "test_rescale_masked"]),
        "nan_on_empty": ("test_rescale_masked", "no finite score", EXP2 + ["test_rescale_random",
                                                                            "test_rescale_growing"]),
        "no_alpha_l": ("test_rescale_growing", "l was not rescaled", EXP2),
        "numpy": ("test_exp2_softmax", "out of PyTorch", RESCALE),
        "python_pow": ("test_exp2_grid", "out of PyTorch", RESCALE),
        "table": ("test_exp2_edges", "did not compute from its input", RESCALE),
        "horner_reversed": ("test_exp2_grid", "reverse order", RESCALE),
        "bias_126": ("test_exp2_edges", "every result is half 2^x", RESCALE),
        "shift_22": ("test_exp2_grid", "n << 23", RESCALE),
        "ceil": ("test_exp2_grid", "n = ceil(x)", RESCALE),
        "threshold_ln2": ("test_rescale_growing", "natural-log units", EXP2 + ["test_rescale_eager"]),
        "p_old_m": ("test_rescale_random", "P was computed from the old m", EXP2),
        "no_alpha": ("test_rescale_growing", "neither l nor acc was rescaled", EXP2),
    }
    assert_planted(planted_verdicts(tmp_path, A14, GIVEN, bugs), expect)


# ----------------------------------------------------------------------------- the check, in process
def _solution():
    code = solution_code(A14)
    scope = {"torch": torch, "math": math}
    for cell in ("exp2_coefficients", "exp2_poly", "lazy_rescale_update"):
        exec(code[cell], scope)   # noqa: S102
    scope["C1"], scope["C2"], scope["C3"] = scope["exp2_coefficients"]()
    return scope


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_solution_passes_every_case(seed):
    sol = _solution()
    for case in EXP2_CASES:
        check_exp2_fn(sol["exp2_poly"], case, seed=seed, verbose=False)
    for case in RESCALE_CASES:
        check_rescale_fn(sol["lazy_rescale_update"], case, seed=seed, verbose=False)


def test_wrong_results_are_told_apart():
    sol = _solution()
    exp2, update = sol["exp2_poly"], sol["lazy_rescale_update"]

    def says(check, fn, case, text):
        with pytest.raises(FA4CheckError) as err:
            check(fn, case, seed=5, verbose=False)
        assert text in str(err.value), str(err.value)

    says(check_exp2_fn, lambda x: exp2(x) * 2, "grid", "every result is twice 2^x")
    says(check_exp2_fn, lambda x: torch.where(torch.isneginf(x), torch.nan, exp2(x)), "edges", "x = -inf")
    says(check_exp2_fn, lambda x: exp2(x).double(), "softmax", "dtype")

    def natural(m, l, acc, s, v, threshold):
        return update(m, l, acc, s * math.log2(math.e), v, threshold * math.log2(math.e))

    def in_place(m, l, acc, s, v, threshold):
        m2, l2, acc2 = update(m, l, acc, s, v, threshold)
        return m2, l2, acc.copy_(acc2)

    says(check_rescale_fn, lambda *a: update(*a)[:2], "random", "tuple of three tensors")
    says(check_rescale_fn, in_place, "random", "acc was modified")
    says(check_rescale_fn, lambda m, l, acc, s, v, t: (lambda r: (r[0], r[1], r[2] * 1.01))(update(m, l, acc, s, v, t)),
         "eager", "acc wrong")
    # scores read as natural-log units: both the threshold and P are off, and m is what shows it first
    says(check_rescale_fn, natural, "growing", "m is wrong in rows 0-47")

    # the range reduction's variants, each told by what it does (a fit on [0, 1) evaluated on round's [-1/2, 0),
    # a clamp from above, a clamp from below that leaves -inf at the clamp's value)
    coeffs = sol["exp2_coefficients"]()

    def poly(f):
        p = torch.zeros_like(f)
        for c in reversed(coeffs):
            p = (p + c) * f
        return p + 1.0

    def rounded(x):
        x = x.clamp(min=-127.0)
        n = torch.round(x)
        return (poly(x - n).view(torch.int32) + (n.to(torch.int32) << 23)).view(torch.float32)

    says(check_exp2_fn, rounded, "grid", "n = round(x) makes f = x - n negative")

    def scaled(x):      # 2^n made apart and multiplied in: n = round(x) reaches 128 below x = 128, and 2^128 is inf
        n = torch.round(x.clamp(min=-127.0))
        return poly(x.clamp(min=-127.0) - n) * ((n.clamp(min=-126) + 127).to(torch.int32) << 23).view(torch.float32)

    says(check_exp2_fn, scaled, "edges", "overflows")
    says(check_exp2_fn, lambda x: exp2(x.clamp(max=64.0)), "edges", "x is clamped from above")
    says(check_exp2_fn, lambda x: exp2(x.clamp(min=-126.0)), "softmax", "the clamp from below keeps 2^x")


def _update_with(old: str, new: str):
    code = solution_code(A14)
    scope = {"torch": torch, "math": math}
    exec(_mutate(code["lazy_rescale_update"], old, new), scope)   # noqa: S102
    return scope["lazy_rescale_update"]


def test_the_random_cases_hold_no_tie_at_the_threshold():
    """Seed 189 once drew, in the random case, a row whose m (11.165078) plus 8 rounds in float32 onto the next
    tile's maximum (19.165077, half an ulp below the exact sum): ``rowmax >= m + threshold`` moved m there and lost
    test_rescale_random, no cause named, though a tie is test_rescale_growing's to test (and a sum that rounds
    the other way would fail a right float32 update against the float64 rule). The random, eager and masked cases
    keep every tile's row maximum clear of an earlier tile's plus the threshold, in float32 and float64 alike."""
    at_threshold = _update_with("rowmax > m + threshold", "rowmax >= m + threshold")
    for case in ("random", "eager", "masked"):
        check_rescale_fn(at_threshold, case, seed=189, verbose=False)
        tiles, _, thresholds = rescale_inputs(case, 189)
        maxima = torch.stack([s.amax(-1) for s, _ in tiles], 1)                   # [R, T], float32
        for t in thresholds:
            for j in range(1, maxima.shape[1]):
                r, m = maxima[:, j:j + 1], maxima[:, :j]
                seen = torch.isfinite(r) & torch.isfinite(m)
                assert not bool(((r == m + t) & seen).any()), (case, t, j)          # float32
                assert not bool(((r.double() == m.double() + t) & seen).any()), (case, t, j)
                assert bool(((r > m + t) == (r.double() > m.double() + t))[seen].all()), (case, t, j)
    with pytest.raises(FA4CheckError, match="strictly greater"):
        check_rescale_fn(at_threshold, "growing", seed=189, verbose=False)


# ----------------------------------------------------------------------------- the guard
@pytest.mark.parametrize("route", [
    lambda x: torch.exp2(x), lambda x: x.exp(), lambda x: torch.pow(2.0, x), lambda x: 2.0 ** x,
    lambda x: torch.ldexp(torch.ones_like(x), x), lambda x: torch.special.exp2(x), lambda x: x.clone().exp2_(),
    lambda x: torch.ops.aten.exp2.default(x), lambda x: torch.sigmoid(x), lambda x: torch.pow(torch.full_like(x, 2.0), x),
    # exponentials in disguise: glu's sigmoid, log_softmax's backward (e^y), the masked softmax
    lambda x: torch.nn.functional.glu(torch.stack([torch.ones_like(x), x], -1), -1),
    lambda x: torch.ops.aten._log_softmax_backward_data(torch.stack([torch.zeros_like(x), -torch.ones_like(x)], -1),
                                                         torch.stack([x, torch.zeros_like(x)], -1), -1, torch.float32),
    lambda x: torch.ops.aten._masked_softmax(torch.stack([x, torch.zeros_like(x)], -1),
                                             torch.zeros(x.numel(), 2, dtype=torch.bool)),
    lambda x: torch.nn.functional.poisson_nll_loss(x, torch.zeros_like(x), log_input=True, reduction="none"),
    # e^x by other names: a 1x1 matrix exponential, Q(1, t) = e^-t, elu's and softplus's gradients, the foreach
    # form, K0's scaled form over K0, cos of an imaginary number (cosh), an LSTM's fused gates (sigmoid)
    lambda x: torch.linalg.matrix_exp(x[:, None, None])[:, 0, 0],
    lambda x: torch.special.gammaincc(torch.ones_like(x), -x),
    lambda x: torch.ops.aten.elu_backward(torch.ones_like(x), 1.0, 1, 1, False, x),
    lambda x: torch.ops.aten.softplus_backward(torch.ones_like(x), x, 1.0, 20.0),
    lambda x: torch._foreach_exp([x])[0],
    lambda x: torch.special.scaled_modified_bessel_k0(1 - x) / torch.special.modified_bessel_k0(1 - x),
    lambda x: torch.cos(x * 1j).real,
    lambda x: torch.nn.LSTM(1, 1)(x[:, None, None])[0],
], ids=["exp2", "Tensor.exp", "pow(2, x)", "2 ** x", "ldexp", "special.exp2", "exp2_", "aten", "sigmoid",
        "pow(tensor, x)", "glu", "log_softmax backward", "masked softmax", "poisson_nll_loss", "matrix_exp",
        "gammaincc", "elu_backward", "softplus_backward", "foreach", "bessel k0", "complex cos", "lstm"])
def test_the_guard_refuses_pytorchs_exponentials(route):
    x = torch.linspace(-3, 0, 7)
    with pytest.raises(CheatDetected, match="exponential"):
        forbid_exponentials(route)(x)

    def hides(x):                         # caught inside: still reported
        try:
            return route(x)
        except CheatDetected:
            return x
    with pytest.raises(CheatDetected, match="caught inside"):
        forbid_exponentials(hides)(x)


def test_the_guard_lets_the_polynomial_and_the_bits_through():
    exp2 = _solution()["exp2_poly"]
    x = torch.linspace(-30, 8, 1001)
    y = forbid_exponentials(exp2)(x)
    assert torch.allclose(y.double(), torch.exp2(x.double()), rtol=2.0 ** -12, atol=0)
    assert torch.equal(forbid_exponentials(lambda t: t ** 3 + t.floor() * 2)(x), x ** 3 + x.floor() * 2)
    coefficients = torch.tensor([1.0, 0.5, 0.25, 0.125])       # a few coefficients in a tensor, a test or two

    def polynomial(t):
        if bool((t < -126).any()) or float(t.max()) > 128:
            raise ValueError("out of range")
        return (coefficients[2] * t + coefficients[1]) * t + coefficients[0]
    assert torch.equal(forbid_exponentials(polynomial)(x), (0.25 * x + 0.5) * x + 1.0)


def test_a_table_of_powers_built_in_the_call_is_refused():
    """Powers computed by Python inside the call (no value of x taken out) still reach PyTorch as a table."""
    def inner_table(x):
        table = torch.tensor([2.0 ** (i / 4096) for i in range(4097)])
        n = torch.floor(x)
        return (table[((x - n) * 4096).round().long()].view(torch.int32) + (n.to(torch.int32) << 23)).view(torch.float32)
    with pytest.raises(CheatDetected, match="4097 values that it did not compute"):
        forbid_exponentials(inner_table)(torch.linspace(-3, 3, 101))


@pytest.mark.gpu
def test_the_solution_and_the_guard_on_a_gpu():
    """The contract says any device: the checks draw their inputs on the GPU, the solution passes there, and
    the guard sees PyTorch's exponentials on CUDA tensors too."""
    sol = _solution()
    for case in EXP2_CASES:
        check_exp2_fn(forbid_exponentials(sol["exp2_poly"]), case, seed=7, device="cuda", verbose=False)
    for case in RESCALE_CASES:
        check_rescale_fn(sol["lazy_rescale_update"], case, seed=7, device="cuda", verbose=False)
    with pytest.raises(CheatDetected):
        forbid_exponentials(torch.exp2)(torch.zeros(4, device="cuda"))
