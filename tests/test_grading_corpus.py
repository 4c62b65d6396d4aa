"""A corpus of bad submissions graded in ONE parallel run: each gets the score its name says.

Built from the step-01 release. Step 01 may use torch.softmax but not PyTorch's attention; its
hidden tests wrap the entry point in autograder.guards (SDPA forbidden, caching detected).
"""
import json
import time

import pytest

from conftest import fill, release_notebook, solution_code
from autograder import cli

A = "01_vanilla_attention"
SOL = solution_code(A)["vanilla_attention"]
HEAD = "def vanilla_attention(q, k, v, causal=False, scale=None):\n"


def _fn(body: str) -> str:
    return HEAD + "".join("    " + ln + "\n" for ln in body.strip("\n").splitlines())


def _wrap(before: str = "", after: str = "") -> str:
    """The solution renamed _solution, called by a vanilla_attention that adds ``before``/``after``."""
    return (SOL.replace("def vanilla_attention(", "def _solution(") + "\n\n"
            + _fn(f"{before}\no = _solution(q, k, v, causal, scale)\n{after}\nreturn o"))


TESTS = ["test_small", "test_medium", "test_large", "test_noncausal", "test_asymmetric",
         "test_edge_ragged", "test_edge_empty_rows"]
HIDDEN = TESTS[1:]

# student -> (code of the solution cell, or a whole notebook / raw text; expected score; what the
# status or a failed test's message must say)
CORPUS = {
    "ok": (SOL, 7, "graded"),
    "import_error": ("import not_a_real_module_42\n" + SOL, 0, "graded"),
    "infinite_loop": ("while True:\n    pass\n" + SOL, 0, "graded"),   # interrupted after 15 s
    "kills_itself": (_fn("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"), 0, "kernel died"),
    "segfault": (_fn("import ctypes\nctypes.memset(0, 1, 64)"), 0, "kernel died"),
    "sys_exit": (_fn("import sys\nsys.exit(3)"), 0, "graded"),
    "zeros": (_fn("return torch.zeros_like(q)"), 0, "graded"),
    "mean_of_v": (_fn("g = q.shape[1] // k.shape[1]\n"
                      "return v.repeat_interleave(g, 1).mean(2, keepdim=True).expand_as(q).clone()"), 0, "graded"),
    "calls_sdpa": (_fn("return torch.nn.functional.scaled_dot_product_attention(\n"
                       "    q, k, v, is_causal=causal, scale=scale, enable_gqa=True)"), 1, "graded"),
    "caches": ("_cache = {}\n" + _wrap("key = (tuple(q.shape), causal, scale)\n"
                                       "if key in _cache:\n    return _cache[key]",
                                       "_cache[key] = o"), 6, "graded"),
    "mutates_inputs": (_wrap(after="q.mul_(2)"), 0, "graded"),
    "half_output": (_wrap(after="h = q.shape[2] // 2\nout = torch.empty_like(o)\n"
                                "out[:, :, :h] = o[:, :, :h]\no = out"), 0, "graded"),
    "deleted_test": ("deleted", 7, "deleted cells restored: test_small"),
    "edited_tests": ("edited", 0, "graded"),
    "not_json": ("this is { not a notebook", 0, "not a notebook"),
    "wrong_name": ("wrong_name", 0, "missing notebook 01_vanilla_attention.ipynb"),
}

# the cause a failed test's message names, for the cheats the guards catch
MESSAGES = {
    "calls_sdpa": ("test_medium", "scaled_dot_product_attention"),
    "caches": ("test_medium", "cached or precomputed"),
    "mutates_inputs": ("test_small", "was modified by the call"),
    "half_output": ("test_small", "NaN or inf"),
    "zeros": ("test_small", "all zeros"),
    "mean_of_v": ("test_small", "mean of V"),
    "import_error": ("test_small", "NameError"),
    "infinite_loop": ("test_large", "NameError"),
    "sys_exit": ("test_small", "SystemExit"),
}


def _submissions(tmp_path):
    nb = release_notebook(A)
    subs = tmp_path / "submitted"
    for student, (code, _, _) in CORPUS.items():
        d = subs / student / A
        d.mkdir(parents=True)
        path = d / f"{A}.ipynb"
        if code == "deleted":
            full = fill(nb, {"vanilla_attention": SOL})
            full["cells"] = [c for c in full["cells"]
                             if c["metadata"].get("nbgrader", {}).get("grade_id") != "test_small"]
            path.write_text(json.dumps(full))
        elif code == "edited":     # a wrong answer whose every test cell was replaced by `pass`
            path.write_text(json.dumps(fill(nb, {"vanilla_attention": CORPUS["zeros"][0],
                                                 **{t: "pass" for t in TESTS}})))
        elif code == "wrong_name":
            (d / "my_attention.ipynb").write_text(json.dumps(fill(nb, {"vanilla_attention": SOL})))
        elif code.startswith("this is"):
            path.write_text(code)
        else:
            path.write_text(json.dumps(fill(nb, {"vanilla_attention": code})))
    return subs


@pytest.mark.slow
def test_bad_submission_corpus_in_one_parallel_run(tmp_path, capsys):
    subs = _submissions(tmp_path)
    ws = tmp_path / "ws"
    t0 = time.perf_counter()
    # 15 s per cell: the infinite loop is interrupted, the notebook goes on (and fails its tests);
    # the per-notebook limit (--timeout) is tested in test_autograder.py
    results = cli.autograde(subs, ws, timeout=300, cell_timeout=15, jobs=2, quiet=True)
    seconds = time.perf_counter() - t0
    res = {r.student: r for r in results}
    assert set(res) == set(CORPUS)
    wrong = {s: (res[s].score, res[s].status, res[s].failed) for s, (_, want, _) in CORPUS.items()
             if res[s].score != want}
    assert not wrong, f"unexpected scores: {wrong}"
    for s, (_, _, says) in CORPUS.items():
        assert says in res[s].status, (s, res[s].status)
        assert res[s].max_score == 7, (s, res[s].max_score)
    assert set(res["calls_sdpa"].failed) == set(HIDDEN)
    assert res["caches"].failed == ["test_medium"]
    for s, (gid, text) in MESSAGES.items():
        assert text in res[s].messages.get(gid, ""), (s, res[s].messages)
    assert set(res["infinite_loop"].failed) == set(TESTS)
    log = (ws / "autograded" / "infinite_loop" / A / f"{A}.ipynb").read_text()
    assert "CellTimeoutError" in log or "KeyboardInterrupt" in log

    # the shared gradebook holds every submission with the same scores, and nothing is left running
    exported = {r.student: r.score for r in cli.export(ws)}
    assert exported == {s: res[s].score for s in CORPUS}
    assert not list((ws / "work").glob("*__*")), "a private workspace was left behind"
    # the report: CSV row per submission, class page, one page per student, plots as files
    cli._report(results, ws / "grades.csv", workspace=ws, seconds=seconds)
    out = capsys.readouterr().out
    assert f"{len(CORPUS)} submission(s)" in out and "report written to" in out
    assert len((ws / "grades.csv").read_text().splitlines()) == len(CORPUS) + 1
    index = (ws / "report" / "index.html").read_text()
    assert "01_vanilla_attention_scores.png" in index and "base64" not in index
    assert (ws / "report" / "01_vanilla_attention_pass_rates.png").stat().st_size > 1000
    page = (ws / "report" / "students" / "caches.html").read_text()
    assert "cached or precomputed" in page and "BEGIN HIDDEN" not in page
    assert "check_no_caching" not in page and "forbid_framework_attention" not in page
    print(f"corpus of {len(CORPUS)} graded in {seconds:.0f} s with --jobs 2")
