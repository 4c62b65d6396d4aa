"""Visible feedback that finds the classic bugs before grading (issue 20), exercises 02-05, 11 and 14.

For each exercise, one test plants each classic bug in a copy of the solution and runs the notebook's
visible cells as a student's Run All does (set-up and solution cells, then the visible part of
`test_small` and the `visible_checks` cell, with no judge): the first failure must name the bug's
cause. The untouched solution passes them, within the time the exercise promises. The variants of an
exercise run one after another in one process (a fresh namespace each), and every missed bug is listed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT, solution_code

VISIBLE = ("test_small", "visible_checks")
# One process per exercise runs every variant (the solution first, then each planted bug) in a fresh
# namespace: one interpreter start and one torch/Triton import instead of one per bug.
RUNNER = textwrap.dedent("""
    import json, os, sys, time
    nb_path, variants_path, visible = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    nb = json.load(open(nb_path))
    for name, code in json.load(open(variants_path)):
        print("START", name, flush=True)
        cells = os.path.join(os.path.dirname(variants_path), name)
        os.makedirs(cells)
        ns = {"__name__": "__main__"}
        visible_s, line = 0.0, None
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            meta = cell["metadata"].get("nbgrader", {})
            gid = meta.get("grade_id")
            src = "".join(cell["source"])
            if meta.get("solution"):
                src = code[gid]
            elif meta.get("grade") and gid not in visible:
                continue                                   # hidden tests: the judge's, not visible
            src = src.split("### BEGIN HIDDEN TESTS")[0]
            path = os.path.join(cells, f"cell_{len(os.listdir(cells))}.py")
            open(path, "w").write(src)                     # Triton reads a kernel's source from its file
            t0 = time.perf_counter()
            try:
                exec(compile(src, path, "exec"), ns)
            except Exception as err:
                line = "FAILED " + str(gid) + " " + type(err).__name__ + ": " + str(err).replace("\\n", " | ")
                break
            if gid in visible:
                visible_s += time.perf_counter() - t0
        print("RESULT", name, line or f"PASSED {round(visible_s, 1)}", flush=True)
""")


def mutate(code: str, *subs) -> str:
    for old, new in subs:
        assert old in code, f"planted bug out of date: {old!r} is not in the solution"
        code = code.replace(old, new)
    return code


def run_visible(tmp_path, assignment: str, bugs: dict[str, dict[str, list]], visible=VISIBLE) -> dict[str, str]:
    """Each variant's visible run, ``{name: 'PASSED <seconds>' or 'FAILED <cell> <Error>: <message>'}``:
    "solution" (untouched) and one per entry of ``bugs`` (``{name: {cell: substitutions}}``); ``visible``:
    the graded cells whose visible part runs (the part before their hidden tests)."""
    base = solution_code(assignment)
    variants = [("solution", base)]
    for name, cells in bugs.items():
        code = dict(base)
        for gid, subs in cells.items():
            code[gid] = mutate(code[gid], *subs)
        variants.append((name, code))
    (path,) = (ROOT / "solutions" / assignment).glob("*.ipynb")
    vp = tmp_path / "variants.json"
    vp.write_text(json.dumps(variants))
    runner = tmp_path / "run_visible.py"
    runner.write_text(RUNNER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               FIB_CACHE_PATH=str(tmp_path / "fib_cache"))
    env.pop("FACOURSE_JUDGE", None)
    env.pop("TRITON_INTERPRET", None)            # the notebook's set-up decides, as in JupyterLab
    r = subprocess.run([sys.executable, str(runner), str(path), str(vp), json.dumps(list(visible))],
                       cwd=ROOT / "solutions" / assignment,
                       env=env, capture_output=True, text=True, timeout=900)
    got = dict(ln.split(" ", 2)[1:] for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    started = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("START ")]
    assert r.returncode == 0 and len(got) == len(variants), (
        f"the visible run stopped in variant {started[-1] if started else '?'}:\n" + r.stdout[-2000:] + r.stderr[-3000:])
    return got


def assert_visible_feedback(tmp_path, assignment: str, bugs: dict, limit_s: float, visible=VISIBLE) -> None:
    """The solution passes the visible cells within ``limit_s``; each planted bug's first visible
    failure names its cause (``bugs``: ``{name: (cell substitutions, words)}``). All bugs are reported."""
    got = run_visible(tmp_path, assignment, {name: cells for name, (cells, _) in bugs.items()}, visible)
    sol = got["solution"]
    assert sol.startswith("PASSED") and float(sol.split()[1]) < limit_s, sol
    missed = []
    for name, (_, words) in bugs.items():
        out = got[name]
        absent = [w for w in words if w not in out]
        if not out.startswith("FAILED") or absent:
            missed.append(f"{name}: {absent or 'passed'} not in the first visible failure: {out}")
    assert not missed, "\n".join(missed)


# ----------------------------------------------------------------------------- exercise 02
A2 = "02_safe_softmax"
BUGS_02 = {
    "no_max_subtraction": ([("torch.exp(xf - m)", "torch.exp(xf)")], ["no max subtraction"]),
    "no_inf_guard": ([("m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)", "pass")],
                     ["visible_checks", "all_masked", "entries are all -inf"]),
    "ignores_dim": ([("dim=dim", "dim=-1")], ["other_dims", "not over dim"]),
}


def test_02_visible_cells(tmp_path):
    assert_visible_feedback(tmp_path, A2, {name: ({"safe_softmax": subs}, words) for name, (subs, words) in BUGS_02.items()}, limit_s=30)


# ----------------------------------------------------------------------------- exercise 03
A3 = "03_online_softmax"
BUGS_03 = {
    "no_alpha_rescale": ("online_softmax", [(
        "m, l = merge_softmax_states(m, l, m_j, l_j)",
        "m_new = torch.maximum(m, m_j); l = l + torch.exp(x_j - torch.where(torch.isneginf(m_new), 0.0, "
        "m_new)[..., None]).sum(dim=-1); m = m_new")], ["alpha rescale missing"]),
    "merge_without_alpha": ("merge_softmax_states", [(
        "l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)", "l = l_a + l_b")],
        ["merge", "alpha rescale missing"]),
    "drops_last_block": ("online_softmax", [("range(0, n, block_size)", "range(0, n - block_size + 1, block_size)")],
                         ["the last partial block"]),
    "merge_nan_on_empty": ("merge_softmax_states", [(
        "m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)", "m_safe = m")],
        ["merge empty", "two empty states"]),
    "block_max_unguarded": ("online_softmax", [(
        "m_j_safe = torch.where(torch.isneginf(m_j), torch.zeros_like(m_j), m_j)", "m_j_safe = m_j")],
        ["all -inf"]),
}


def test_03_visible_cells(tmp_path):
    assert_visible_feedback(tmp_path, A3, {name: ({gid: subs}, words) for name, (gid, subs, words) in BUGS_03.items()}, limit_s=30)


# ----------------------------------------------------------------------------- exercise 04
A4 = "04_tiled_attention"
BUGS_04 = {
    "no_alpha_rescale": ([("l_i = alpha * l_i + P_ij.sum(dim=-1)", "l_i = l_i + P_ij.sum(dim=-1)"),
                          ("O_i = alpha[..., None] * O_i + torch.matmul(P_ij, V_j)", "O_i = O_i + torch.matmul(P_ij, V_j)")],
                         ["alpha"]),
    "top_left_causal": ([("off = Skv - Sq ", "off = 0      ")], ["visible_checks", "asymmetric", "top-left"]),
    "skips_last_query_tile": ([("range(0, Sq, block_m)", "range(0, Sq - block_m + 1, block_m)")],
                              ["visible_checks", "ragged", "never written", "last, partial"]),
    "diagonal_masked": ([("cols > rows + off", "cols >= rows + off")], ["diagonal"]),
    "head_h_mod_hkv": ([("q[:, :, i0:i1].float().reshape(B, Hkv, G, Br, D)",
                         "q[:, :, i0:i1].float().reshape(B, G, Hkv, Br, D).transpose(1, 2)"),
                        ("O_i.reshape(B, Hq, Br, D)", "O_i.transpose(1, 2).reshape(B, Hq, Br, D)"),
                        ("(m_i + torch.log(l_i)).reshape(B, Hq, Br)",
                         "(m_i + torch.log(l_i)).transpose(1, 2).reshape(B, Hq, Br)")], ["h % Hkv"]),
}


def test_04_visible_cells(tmp_path):
    assert_visible_feedback(tmp_path, A4, {name: ({"tiled_attention": subs}, words) for name, (subs, words) in BUGS_04.items()}, limit_s=30)


# ----------------------------------------------------------------------------- exercise 05
A5 = "05_triton_flash_attention"
BUGS_05 = {
    "no_alpha_rescale": ("kernel", [("acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                                     "acc = tl.dot(p.to(v.dtype), v, acc)")],
                         ["visible_checks", "ragged", "does not rescale the accumulator", "alpha"]),
    "causal_offset_zero": ("kernel", [("off = Skv - Sq ", "off = 0 ")], ["visible_checks", "ragged", "top-left"]),
    "grid_floor": ("wrapper", [("grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)", "grid = (Sq // BLOCK_M, B * Hq)")],
                   ["visible_checks", "ragged", "never written", "cdiv(Sq, BLOCK_M)"]),
    "no_qk_scale": ("kernel", [("m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)", "m_new = tl.maximum(m_i, tl.max(s, 1))"),
                               ("p = tl.math.exp2(s * qk_scale - m_use[:, None])", "p = tl.math.exp2(s - m_use[:, None])")],
                    ["qk_scale"]),
}


def test_05_visible_cells(tmp_path):
    assert_visible_feedback(tmp_path, A5, {name: ({gid: subs}, words) for name, (gid, subs, words) in BUGS_05.items()}, limit_s=45)    # about 20 s on 2 cores


# ----------------------------------------------------------------------------- exercise 11
def test_11_visible_cells(tmp_path):
    """Exercise 11's visible cells run the checks its hidden tests run (fixed seeds): each mistake the
    grading test plants (tests/test_exercise_step11.py) fails a visible cell that names it."""
    from test_exercise_step11 import PLANTED, STEP
    visible = ("test_definition", "test_definition_reference", "test_traces", "test_routing", "test_fallback",
               "test_tilelang_causal", "test_tilelang_other")
    bugs = {name: ({cell: [(old, new)]}, [test, says]) for name, (cell, old, new, test, says) in PLANTED.items()}
    assert_visible_feedback(tmp_path, STEP, bugs, limit_s=30, visible=visible)


# ----------------------------------------------------------------------------- exercise 14
A14 = "14_after_hopper"
BUGS_14 = {
    "trunc": ({"exp2_poly": [("n = torch.floor(x)", "n = torch.trunc(x)")]}, ["rounds toward zero"]),
    "no_clamp": ({"exp2_poly": [("x = x.clamp(min=-127.0)", "pass")]}, ["x = -inf"]),
    "eager": ({"lazy_rescale_update": [("rowmax > m + threshold", "rowmax > m")]}, ["follows every growth"]),
    "at_threshold": ({"lazy_rescale_update": [("rowmax > m + threshold", "rowmax >= m + threshold")]},
                     ["visible_checks", "strictly greater"]),
    "nan_on_empty": ({"lazy_rescale_update": [("base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), "
                                               "m_new)", "base = m_new")]}, ["no finite score"]),
}


def test_14_visible_cells(tmp_path):
    assert_visible_feedback(tmp_path, A14, BUGS_14, limit_s=20,
                            visible=("test_exp2_softmax", "test_rescale_random", "visible_checks"))
