"""Step 09, decode against a paged KV cache: the exercise as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores every point a CPU can give
(correctness and bad inputs through the judge; bf16 and speed need a GPU and score 0 here, saying
why); the untouched stub scores 0. Each classic mistake, planted in the solution's kernels, loses
the points of a test whose message names it (the hidden tests run the same checks through the
judge, ``judge.run_inprocess``). The GPU tier (every test, perf included) is ``python -m
autograder.gpu_selftest 09`` on a GPU machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, fill, grade_submissions, release_notebook, solution_code

STEP = "09_decode_paged_kv"
GPU_ONLY = {"test_bf16", "perf_b64_8k_p16", "perf_b16_32k_p64"}
SOLUTION = solution_code(STEP)


@pytest.mark.slow
def test_exercise_grading(tmp_path):
    """The solution scores every CPU point (15 minus bf16 and speed); the stub scores 0."""
    release = release_notebook(STEP)
    res = grade_submissions(tmp_path, STEP, {"solved": fill(release, SOLUTION), "stub": release})
    sol, stub = res["solved"], res["stub"]
    assert sol.status == "graded" and stub.status == "graded", (sol.status, stub.status)
    assert sol.auto_max_score == 15
    assert set(sol.failed) == GPU_ONLY, (sol.failed, sol.messages)
    assert all("No GPU here" in sol.messages[c] for c in GPU_ONLY), sol.messages
    assert sol.score == 15 - 6
    assert stub.score == 0, (stub.score, stub.failed)


# (the cell, the solution's text, the mistake, the test that loses its point, what its message names)
PLANTED = {
    "merge_without_rescale": ("merge_kernel", "w = tl.math.exp2(lse_s - big_use)",
                              "w = tl.where(lse_s == float('-inf'), 0.0, 1.0)", "test_mixed", "the merge of the splits"),
    "page_not_from_table": ("split_kernel",
                            "page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0)",
                            "page = (offs_n // page_size + 0 * b)", "test_mixed", "block_table[b, t // page_size]"),
    "gqa_mapping": ("split_kernel", "head = kvh * G + rows // SQ", "head = kvh + (rows // SQ) * (Hq // G)",
                    "test_mixed", "the query heads map to the wrong KV head"),
    "empty_sequence_nan": ("merge_kernel", "safe = tl.where(total == 0.0, 1.0, total)", "safe = total",
                           "test_mixed", "these rows see no key"),
    "last_page_dropped": ("split_kernel", "end = tl.minimum(start + split_len, L)",
                          "end = tl.minimum(start + split_len, (L // page_size) * page_size)", "test_mixed",
                          "the last, partial page is skipped"),
    "no_validation": ("launch", "    validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale)\n", "",
                      "test_bad_inputs", "validate_paged_inputs"),
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
    v = run_inprocess("{step}", scope["paged_decode"], [test])[test]
    print(json.dumps({{"bug": bug, "points": v.points, "message": v.message}}), flush=True)
"""


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names
    it. One subprocess for all of them (Triton's interpreter must be chosen before triton is imported)."""
    nb = json.loads((ROOT / "solutions" / STEP / f"{STEP}.ipynb").read_text())
    code = {}                                   # the exercise's code cells, given and solution, in order
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid == "setup" or gid in SOLUTION:
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
