"""Exercises 02 (safe softmax), 03 (online softmax), 04 (tiled attention) and their shared softmax check.

Grading: the solution (full autograded marks, written answers left to the instructor) and the
untouched stub (0, and the run goes on), through nbgrader (``GRADING``, the demo's samples:
tests/test_exercise_grading.py grades them, with every other kernel step's, in ONE autograde run);
and planted bugs through the judge,
in one process per exercise (``conftest.planted_verdicts``), each of which must lose the test that
names it while the tests unrelated to it still pass. Planted bugs are made from the solution by text
substitution, so they follow the solution when it changes (the substitution asserts that its text is
still there).

Unit tests: facourse.softmax_check accepts correct results and rejects each planted fault with its cause.
"""
import json

import pytest
import torch

from conftest import ROOT, planted_cells, planted_verdicts, solution_and_stub, solution_code
from facourse import SoftmaxCheckError, check_merge_fn, check_softmax_fn
from facourse.softmax_check import MERGE_CASES, SOFTMAX_CASES

ANSWER = "The max is subtracted so that exp never overflows; see the lecture."   # a written answer


def mutate(code: str, *subs) -> str:
    """``code`` with each (old, new) substituted; fails when ``old`` is no longer in the solution."""
    for old, new in subs:
        assert old in code, f"planted bug out of date: {old!r} is not in the solution"
        code = code.replace(old, new)
    return code


def written_ids(assignment):
    (path,) = (ROOT / "solutions" / assignment).glob("*.ipynb")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c["metadata"]["nbgrader"]["grade_id"] for c in cells
            if c["cell_type"] == "markdown" and c["metadata"].get("nbgrader", {}).get("grade")]


def assert_bugs_graded(tmp_path, assignment, bugs, expect, says):
    """Each bug ({name: {grade_id: code}}), put into the solution, graded through the judge on every
    hidden test: it fails the test ``expect`` names first, passes the ones it lists after, keeps some
    points, and the failing test's message says ``says[name]`` where given."""
    got = planted_verdicts(tmp_path, assignment, ("imports",), bugs)
    for bug, (fails, passes) in expect.items():
        v = got[bug]
        assert v[fails]["points"] == 0, f"{bug}: expected {fails} to fail: {v[fails]}"
        wrong = [t for t in passes if v[t]["points"] != v[t]["max"]]
        assert not wrong, f"{bug}: {wrong} should pass: {[v[t]['message'][:300] for t in wrong]}"
        assert 0 < sum(x["points"] for x in v.values()) < sum(x["max"] for x in v.values()), bug
        if bug in says:
            test, text = says[bug]
            assert text in v[test]["message"], f"{bug}: {test}'s message does not say {text!r}:\n{v[test]['message']}"
    return got


# ----------------------------------------------------------------------------- exercise 02
A2 = "02_safe_softmax"
A3 = "03_online_softmax"
A4 = "04_tiled_attention"

#: The planted bug of each exercise's demo sample ``carol`` (``GRADING`` below), one of the planted
#: bugs of its test here: (the cell, the solution's text, the mistake, the test that loses its
#: points, what its message names).
PLANTED = {
    A2: ("safe_softmax", "torch.exp(xf - m)", "torch.exp(xf)", "test_overflow", "no max subtraction"),
    A3: ("online_softmax", "m, l = merge_softmax_states(m, l, m_j, l_j)",
         "m_new = torch.maximum(m, m_j); l = l + torch.exp(x_j - torch.where(torch.isneginf(m_new), 0.0, "
         "m_new)[..., None]).sum(dim=-1); m = m_new", "test_small", "alpha rescale missing"),
    A4: ("tiled_attention", "off = Skv - Sq ", "off = 0      ", "test_asymmetric", "top-left"),
}


def test_planted_bugs_02(tmp_path):
    sol = solution_code(A2)["safe_softmax"]
    basics = ["test_small", "test_configs", "test_ragged", "test_masked"]
    assert_bugs_graded(tmp_path, A2, {
        "no_max_subtraction": planted_cells(A2, PLANTED[A2]),
        "nan_on_empty_rows": {"safe_softmax": mutate(
            sol, ("m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)", "pass"))},
        "last_dim_only": {"safe_softmax": mutate(sol, ("dim=dim", "dim=-1"))},
    }, {
        "no_max_subtraction": ("test_overflow", basics + ["test_all_masked", "test_other_dims"]),
        "nan_on_empty_rows": ("test_all_masked", basics + ["test_overflow", "test_other_dims"]),
        "last_dim_only": ("test_other_dims", basics + ["test_overflow", "test_all_masked", "test_half"]),
    }, {"no_max_subtraction": PLANTED[A2][3:]})


# ----------------------------------------------------------------------------- exercise 03


def test_planted_bugs_03(tmp_path):
    code = solution_code(A3)
    online, merge = code["online_softmax"], code["merge_softmax_states"]
    merges = ["test_merge_random", "test_merge_empty", "test_merge_large", "test_merge_chain"]
    got = assert_bugs_graded(tmp_path, A3, {
        "no_alpha_rescale": planted_cells(A3, PLANTED[A3]),
        "drops_last_block": {"online_softmax": mutate(
            online, ("range(0, n, block_size)", "range(0, n - block_size + 1, block_size)"))},
        "merge_nan_on_empty": {"merge_softmax_states": mutate(
            merge, ("m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)", "m_safe = m"))},
        "merge_unsafe_exp": {"merge_softmax_states": mutate(
            merge, ("l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)",
                    "l = (l_a * torch.exp(m_a) + l_b * torch.exp(m_b)) / torch.exp(m_safe)"))},
    }, {
        "no_alpha_rescale": ("test_ragged", merges),
        "drops_last_block": ("test_ragged", merges + ["test_small", "test_configs", "test_overflow"]),
        # test_masked's fully -inf rows merge empty states, but with the course's merge: only the merge's test loses
        "merge_nan_on_empty": ("test_merge_empty", ["test_merge_random", "test_merge_large", "test_merge_chain",
                                                    "test_small", "test_configs", "test_masked"]),
        # exp(m) without the max subtracted: test_merge_large's maxima in the thousands overflow; test_overflow
        # runs the online softmax with the course's merge in place of the student's, so it keeps its points
        "merge_unsafe_exp": ("test_merge_large", ["test_merge_random", "test_merge_empty", "test_merge_chain",
                                                  "test_small", "test_configs", "test_ragged", "test_overflow",
                                                  "test_masked", "test_half"]),
    }, {"no_alpha_rescale": PLANTED[A3][3:],
        "merge_unsafe_exp": ("test_merge_large", "exp of a maximum itself overflowed")})
    assert got["no_alpha_rescale"]["test_configs"]["points"] == 0


# ----------------------------------------------------------------------------- exercise 04


def test_planted_bugs_04(tmp_path):
    sol = solution_code(A4)["tiled_attention"]
    got = assert_bugs_graded(tmp_path, A4, {
        "top_left_causal": planted_cells(A4, PLANTED[A4]),
        "head_h_mod_hkv": {"tiled_attention": mutate(
            sol,
            ("q[:, :, i0:i1].float().reshape(B, Hkv, G, Br, D)",
             "q[:, :, i0:i1].float().reshape(B, G, Hkv, Br, D).transpose(1, 2)"),   # head g*Hkv + kv
            ("O_i.reshape(B, Hq, Br, D)", "O_i.transpose(1, 2).reshape(B, Hq, Br, D)"),
            ("(m_i + torch.log(l_i)).reshape(B, Hq, Br)", "(m_i + torch.log(l_i)).transpose(1, 2).reshape(B, Hq, Br)"))},
        "no_tile_skipping": {"tiled_attention": mutate(
            sol, ("n_end = min(Skv, i1 + off) if causal else Skv", "n_end = Skv"))},
    }, {
        "top_left_causal": ("test_asymmetric", ["test_small", "test_medium", "test_large", "test_noncausal",
                                                "test_edge_mqa", "test_edge_d64"]),
        "head_h_mod_hkv": ("test_medium", ["test_edge_mqa"]),
        "no_tile_skipping": ("test_tile_skipping", ["test_small", "test_medium", "test_asymmetric",
                                                    "test_edge_ragged", "test_edge_empty_rows",
                                                    "test_block_sizes"]),
    }, {"top_left_causal": PLANTED[A4][3:], "head_h_mod_hkv": ("test_medium", "h % Hkv")})
    assert [t for t, v in got["no_tile_skipping"].items() if v["points"] < v["max"]] == ["test_tile_skipping"]


#: What tests/test_exercise_grading.py grades (in its one autograde run) and checks, the demo's samples
#: (``python -m autograder demo``): each exercise's solution with its written answers (left to the
#: instructor), its untouched stub, and its solution with the planted bug of ``PLANTED``.
GRADING = {a: solution_and_stub(a, points, set(), 0, PLANTED[a], {gid: ANSWER for gid in written_ids(a)})[a]
           for a, points in ((A2, 8), (A3, 10), (A4, 15))}


# ----------------------------------------------------------------------------- the softmax check itself
def _ok_softmax(x, dim=-1):
    xf = x.float()
    m = xf.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(xf - m)
    l = e.sum(dim=dim, keepdim=True)
    return (e / torch.where(l > 0, l, torch.ones_like(l))).to(x.dtype)


def _ok_merge(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    s = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(m_a - s) + l_b * torch.exp(m_b - s)


def _online(x, block_size, bug=None):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])
    stop = n - block_size + 1 if bug == "tail" else n
    for j in range(0, stop, block_size):
        b = x[..., j:j + block_size].float()
        m_new = torch.maximum(m, b.amax(dim=-1))
        if bug == "no_guard":
            l = l * torch.exp(m - m_new) + torch.exp(b - m_new[..., None]).sum(dim=-1)
        else:
            s = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(b - s[..., None]).sum(dim=-1)
            l = l + p if bug == "no_alpha" else l * torch.exp(m - s) + p
        m = m_new
    s = torch.where(torch.isneginf(m), torch.zeros_like(m), m)[..., None]
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[..., None]
    y = torch.empty_like(x)
    for j in range(0, stop, block_size):
        y[..., j:j + block_size] = (torch.exp(x[..., j:j + block_size].float() - s) * inv).to(x.dtype)
    return y


CHEAP = ["small", "ragged", "overflow", "masked", "all_masked", "half", "other_dims"]


def test_softmax_check_accepts_correct_results():
    assert set(CHEAP) < set(SOFTMAX_CASES)
    for case in CHEAP:
        check_softmax_fn(_ok_softmax, case, seed=1, verbose=False)
        if case != "other_dims":
            for bs in (1, 32, 100):
                check_softmax_fn(_online, case, block_size=bs, seed=2, verbose=False)
    for case in MERGE_CASES:
        check_merge_fn(_ok_merge, case, seed=3, verbose=False)


def test_softmax_check_cases_are_what_they_say():
    from facourse.softmax_check import case_inputs
    for label, x, _ in case_inputs("overflow", 0, "cpu"):
        assert x.float().abs().max() > 89, label              # exp() overflows fp32 (and fp16)
    rows = [x for _, x, _ in case_inputs("all_masked", 0, "cpu")]
    assert all(bool(torch.isneginf(x).all(dim=-1).any()) for x in rows)
    lengths = {x.shape[-1] for _, x, _ in case_inputs("ragged", 0, "cpu")}
    assert any(n % 64 for n in lengths) and 1 in lengths


FAULTS = [
    ("no max subtraction", lambda x, dim=-1: torch.nan_to_num(
        torch.exp(x.float()) / torch.exp(x.float()).sum(dim, keepdim=True), nan=0.0).to(x.dtype), "overflow", None),
    ("all -inf", lambda x, dim=-1: torch.softmax(x.float(), dim).to(x.dtype), "all_masked", None),
    ("softmax over dim", lambda x, dim=-1: _ok_softmax(x, -1), "other_dims", None),
    ("dtype", lambda x, dim=-1: _ok_softmax(x, dim).float(), "half", None),
    ("was modified", lambda x, dim=-1: _ok_softmax(x.sub_(0.5), dim), "small", None),
    ("alpha rescale missing", lambda x, bs: _online(x, bs, "no_alpha"), "small", 32),
    ("last partial block", lambda x, bs: _online(x, bs, "tail"), "ragged", 64),
    ("first block is all -inf", lambda x, bs: _online(x, bs, "no_guard"), "masked", 64),
]


@pytest.mark.parametrize("cause, fn, case, block_size", FAULTS, ids=[f[0] for f in FAULTS])
def test_softmax_check_rejects_each_fault(cause, fn, case, block_size):
    with pytest.raises(SoftmaxCheckError) as err:
        check_softmax_fn(fn, case, block_size=block_size, seed=4, verbose=False)
    assert cause in str(err.value), str(err.value)
    assert f"[{case}" in str(err.value)          # names the case


MERGE_FAULTS = [
    ("alpha rescale missing", lambda ma, la, mb, lb: (torch.maximum(ma, mb), la + lb), "random"),
    ("exp of a maximum itself overflowed", lambda ma, la, mb, lb: (
        torch.maximum(ma, mb), (la * torch.exp(ma) + lb * torch.exp(mb)) / torch.exp(torch.maximum(ma, mb))), "large"),
    ("two empty states", lambda ma, la, mb, lb: (
        torch.maximum(ma, mb), la * torch.exp(ma - torch.maximum(ma, mb)) + lb * torch.exp(mb - torch.maximum(ma, mb))),
     "empty"),
    ("m is wrong", lambda ma, la, mb, lb: (torch.minimum(ma, mb), _ok_merge(ma, la, mb, lb)[1]), "random"),
    ("pair of tensors", lambda ma, la, mb, lb: _ok_merge(ma, la, mb, lb)[1], "random"),
]


@pytest.mark.parametrize("cause, fn, case", MERGE_FAULTS, ids=[f[0] for f in MERGE_FAULTS])
def test_merge_check_rejects_each_fault(cause, fn, case):
    with pytest.raises(SoftmaxCheckError) as err:
        check_merge_fn(fn, case, seed=5, verbose=False)
    assert cause in str(err.value), str(err.value)


def test_softmax_check_puts_the_course_merge_in_for_the_named_one():
    """With course_merge_for, an online softmax is judged with the course's merge in place of the one it
    calls from its module, and gets its own back afterwards."""
    scope = {"torch": torch}
    exec("def merge_softmax_states(m_a, l_a, m_b, l_b):\n"
         "    m = torch.maximum(m_a, m_b)\n"
         "    return m, (l_a * torch.exp(m_a) + l_b * torch.exp(m_b)) / torch.exp(m)\n"
         "def online_softmax(x, block_size):\n"
         "    m = torch.full(x.shape[:-1], float('-inf'))\n"
         "    l = torch.zeros(x.shape[:-1])\n"
         "    for j in range(0, x.shape[-1], block_size):\n"
         "        b = x[..., j:j + block_size].float()\n"
         "        m_j = b.amax(dim=-1)\n"
         "        s = torch.where(torch.isneginf(m_j), torch.zeros_like(m_j), m_j)\n"
         "        m, l = merge_softmax_states(m, l, m_j, torch.exp(b - s[..., None]).sum(dim=-1))\n"
         "    return (torch.exp(x.float() - m[..., None]) / l[..., None]).to(x.dtype)\n", scope)
    own = scope["merge_softmax_states"]
    with pytest.raises(SoftmaxCheckError):
        check_softmax_fn(scope["online_softmax"], "overflow", block_size=64, seed=7, verbose=False)
    check_softmax_fn(scope["online_softmax"], "overflow", block_size=64, seed=7, verbose=False,
                     course_merge_for="merge_softmax_states")
    assert scope["merge_softmax_states"] is own


def test_softmax_check_prints_and_returns_nothing(capsys):
    assert check_softmax_fn(_ok_softmax, "small", seed=6) is None
    assert check_merge_fn(_ok_merge, "chain", seed=6) is None
    out = capsys.readouterr()
    assert "passed" in out.out and out.err == ""


def test_release_has_no_rubric_or_model_answer():
    for a, phrase in (("02_safe_softmax", "Three passes"), ("03_online_softmax", "represented sum"),
                      ("04_tiled_attention", "T(T+1)/2")):
        (path,) = (ROOT / "exercises" / a).glob("*.ipynb")
        text = path.read_text(encoding="utf-8")
        assert "MARK SCHEME" not in text and "BEGIN SOLUTION" not in text and phrase not in text, a
        (src,) = (ROOT / "solutions" / a).glob("*.ipynb")
        assert phrase in src.read_text(encoding="utf-8"), f"{a}: the check above looks for a phrase that moved"
