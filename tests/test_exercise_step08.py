"""Step 08, the backward pass: the exercise as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores every point a CPU can give
(correctness through the judge; bf16 and speed need a GPU and score 0 here, saying why); the
untouched stub scores 0 (``GRADING``, graded by tests/test_exercise_grading.py in one autograde run
with the other steps'). Each classic mistake, planted in the solution's kernels, loses the points
of a test whose message names it (the hidden tests run the same checks through the judge,
``judge.run_inprocess``). The GPU tier (every test, perf included) is ``python -m
autograder.gpu_selftest 08`` on a GPU machine.
"""
from __future__ import annotations

from conftest import fill, release_notebook, solution_code

STEP = "08_backward"
GPU_ONLY = {"test_bf16", "perf_large", "perf_long"}
SOLUTION = solution_code(STEP)


def grading_submissions():
    """Graded by tests/test_exercise_grading.py, in one autograde run with the other steps'."""
    release = release_notebook(STEP)
    return {"solved": fill(release, SOLUTION), "stub": release}


def check_grading(res, workspace):
    """The solution scores every CPU point (16 minus bf16 and speed); the stub scores 0."""
    sol, stub = res["solved"], res["stub"]
    assert sol.status == "graded" and stub.status == "graded", (sol.status, stub.status)
    assert sol.auto_max_score == 16
    assert set(sol.failed) == GPU_ONLY, (sol.failed, sol.messages)
    assert all("No GPU here" in sol.messages[c] for c in GPU_ONLY), sol.messages
    assert sol.score == 16 - 5
    assert stub.score == 0, (stub.score, stub.failed)


GRADING = {STEP: (grading_submissions, check_grading)}


# (the cell, the solution's text, the mistake, the test that loses its point, what its message names)
PLANTED = {
    "no_D": ("dkdv", "ds = p * (dp - delta[:, None])", "ds = p * dp", "test_small", "the D term is missing"),
    "gqa_not_summed": ("dkdv", "for g in range(GROUP):", "for g in range(1):", "test_small",
                       "GQA: dK and dV hold only"),
    "dq_scaled_twice": ("dq", "(dq * scale).to(", "(dq * scale * scale).to(", "test_small", "dQ is scaled twice"),
    "no_causal_mask_backward": ("dkdv", "    if CAUSAL:\n        keep = keep &", "    if False:\n        keep = keep &",
                                "test_small", "the causal mask is missing in the backward"),
    "lse_wrong_row": ("dq", "lse = tl.load(LSE + row_base + offs_m,", "lse = tl.load(LSE + row_base + offs_m + 1,",
                      "test_edge_d64_mqa", "another row's lse"),
    "saves_p": ("autograd", "        ctx.save_for_backward(q, k, v, o, lse)",
                "        ctx.save_for_backward(q, k, v, o, lse)\n        ctx.p = q.new_zeros(q.shape[0], q.shape[1], "
                "q.shape[2], k.shape[2])", "test_medium", "kept"),
}


RUNNER = """
import json, sys
sys.path[:0] = [{src!r}, {root!r}]
code, planted = json.loads(open(sys.argv[1]).read())
from autograder.judge import run_inprocess
for bug, (cell, old, new, test, says) in planted.items():
    scope = {{}}
    exec(compile("\\n\\n".join(dict(code, **{{cell: code[cell].replace(old, new)}}).values()), "<planted " + bug + ">",
                 "exec"), scope)
    v = run_inprocess("{step}", scope["flash_attention_train"], [test])[test]
    print(json.dumps({{"bug": bug, "points": v.points, "message": v.message}}), flush=True)
"""


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names
    it. One subprocess for all of them (Triton's interpreter must be chosen before triton is imported)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT
    nb = json.loads((ROOT / "solutions" / STEP / f"{STEP}.ipynb").read_text())
    code = {}                                   # the exercise's code cells, given and solution, in order
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in ("setup", "forward") or gid in SOLUTION:
            code[gid] = SOLUTION.get(gid) or "".join(cell["source"])
    for bug, (cell, old, new, test, says) in PLANTED.items():
        assert old in code[cell], f"{bug}: the solution no longer holds {old!r}: update the planted bug"
    (tmp_path / "in.json").write_text(json.dumps([code, PLANTED]))
    runner = tmp_path / "run.py"
    runner.write_text(RUNNER.format(src=str(ROOT / "src"), root=str(ROOT), step=STEP))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.pop("FACOURSE_JUDGE", None)
    r = subprocess.run([sys.executable, str(runner), str(tmp_path / "in.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    got = {d["bug"]: d for d in map(json.loads, r.stdout.strip().splitlines())}
    assert set(got) == set(PLANTED), r.stdout
    for bug, (cell, old, new, test, says) in PLANTED.items():
        assert got[bug]["points"] == 0, f"{bug}: {test} still scored {got[bug]['points']}"
        assert says in got[bug]["message"], f"{bug}: {test}'s message does not name it:\n{got[bug]['message']}"
