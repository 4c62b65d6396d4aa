"""A corpus of bad submissions graded in ONE parallel run: each gets the score its name says.

Built from the step-01 release. Step 01 may use torch.softmax but not PyTorch's attention; its
hidden tests wrap the entry point in autograder.guards (SDPA forbidden, caching detected) and go
through the judge (autograder/judge.py). The second half of the corpus is written from the
attacker's side, by someone who has read every line of the grader: each forgery scores 0 and the
report names why (TAMPER_REASONS).

Every submission costs a whole nbgrader process (Python, a kernel, PyTorch: about 13 CPU-seconds), so
the corpus holds one submission per way a submission can go wrong in the pipeline. What the judge
alone decides (the check's diagnosis of a wrong answer, the guards' findings) is asserted in-process
for the variants that add no pipeline path of their own (IN_PROCESS below), and what the scan alone
decides for the forgeries whose effect stays in the kernel (SCAN_ONLY); tests/test_judge.py has the
judge's rules one by one.
"""
import json
import time

import pytest

from conftest import fill, release_notebook, solution_code
from autograder import gradebook, report, workers
from autograder.judge import run_inprocess
from autograder.scan import scan_source

A = "01_vanilla_attention"
SOL = solution_code(A)["vanilla_attention"]
HEAD = "def vanilla_attention(q, k, v, causal=False, scale=None):\n"


def _fn(body: str) -> str:
    return HEAD + "".join("    " + ln + "\n" for ln in body.strip("\n").splitlines())


def _wrap(before: str = "", after: str = "") -> str:
    """The solution renamed _solution, called by a vanilla_attention that adds ``before``/``after``."""
    return (SOL.replace("def vanilla_attention(", "def _solution(") + "\n\n"
            + _fn(f"{before}\no = _solution(q, k, v, causal, scale)\n{after}\nreturn o"))


SDPA = _fn("return torch.nn.functional.scaled_dot_product_attention(\n"
           "    q, k, v, is_causal=causal, scale=scale, enable_gqa=True)")

TESTS = ["test_small", "test_medium", "test_large", "test_noncausal", "test_asymmetric",
         "test_edge_ragged", "test_edge_empty_rows"]
HIDDEN = TESTS[1:]

ZEROS = _fn("return torch.zeros_like(q)")

# student -> (code of the solution cell, or a whole notebook / raw text; expected score; what the
# status or a failed test's message must say)
CORPUS = {
    "ok": (SOL, 7, "graded"),
    "import_error": ("import not_a_real_module_42\n" + SOL, 0, "graded"),
    # interrupted after 30 s (a loop that sleeps: the interrupt is the same, and CI's CPU is not spent)
    "infinite_loop": ("import time\nwhile True:\n    time.sleep(0.1)\n" + SOL, 0, "graded"),
    # the kernel dies (a crash; forge_os_exit, in SCAN_ONLY, is the kernel leaving on purpose)
    "segfault": (_fn("import ctypes\nctypes.memset(0, 1, 64)"), 0, "kernel died"),
    "sys_exit": (_fn("import sys\nsys.exit(3)"), 0, "flagged"),
    # caught twice: by the caching check of test_medium, and by test_small, whose judged calls come
    # after the visible ones on the same shapes
    "caches": ("_cache = {}\n" + _wrap("key = (tuple(q.shape), causal, scale)\n"
                                       "if key in _cache:\n    return _cache[key]",
                                       "_cache[key] = o"), 5, "graded"),
    "deleted_test": ("deleted", 7, "deleted cells restored: test_small"),
    "edited_tests": ("edited", 0, "graded"),     # a wrong answer (zeros) whose test cells say `pass`
    "not_json": ("this is { not a notebook", 0, "not a notebook"),
    # a single notebook under another name is graded as the assignment's, and the status says so
    "wrong_name": ("wrong_name", 7, "my_attention.ipynb taken as 01_vanilla_attention.ipynb"),
    # --- forgeries (issue: grades that cannot be forged) -------------------------------------
    # the three that scored 6/7, 6/7 and 7/7 before the judge (the third, forge_check_sdpa, is in IN_PROCESS);
    # the forgeries that take no pipeline path of their own are in IN_PROCESS and SCAN_ONLY below
    "forge_check_zeros": (ZEROS + "\ncheck_entry_point = lambda *a, **k: None",
                          0, "flagged"),
    "forge_import": (ZEROS + """
import builtins, types
_real_import = builtins.__import__
def _fake_import(name, *args, **kwargs):
    if name.startswith("autograder"):
        m = types.ModuleType(name)
        m.judge = m.check_no_caching = lambda *a, **k: None
        m.forbid_framework_attention = lambda f, **k: f
        return m
    return _real_import(name, *args, **kwargs)
builtins.__import__ = _fake_import""", 0, "flagged"),
    "forge_sys_exit": (SOL + "\nimport sys\nsys.exit(0)", 0, "flagged"),
    "forge_atexit": (ZEROS + """
import atexit, json, glob
def _rewrite():
    for p in glob.glob("*.ipynb"):
        nb = json.load(open(p))
        for c in nb["cells"]:
            c["outputs"] = []
        json.dump(nb, open(p, "w"))
atexit.register(_rewrite)""", 0, "flagged"),
    # a forged judge record: the solution's own connection claims every test with SDPA's answers
    "forge_record": (SDPA + """
import os, socket, json, struct
_s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_s.connect(os.environ["FACOURSE_" + "JUDGE"])
_h = json.dumps({"op": "call", "test": "test_large", "check": 0, "n": 0, "result": {"v": None},
                 "blob_sizes": []}).encode()
_s.sendall(struct.pack("!IQ", len(_h), 0) + _h)""", 0, "flagged"),
}

# the reason the report must give for each forgery (in a failed test's message or in the status)
TAMPER_REASONS = {
    "forge_check_zeros": "rebinds check_entry_point",
    "forge_import": "builtins",
    "forge_sys_exit": "sys.exit",
    "forge_atexit": "imports atexit",
    "forge_record": "imports socket",
}

# the cause a failed test's message names, for the cheats the guards catch
MESSAGES = {
    "caches": ("test_medium", "cached or precomputed"),
    "import_error": ("test_small", "NameError"),
    "infinite_loop": ("test_large", "NameError"),
    "sys_exit": ("test_small", "SystemExit"),
}


# Variants that take no pipeline path of their own, asserted without nbgrader (test_variants_judged_in_process):
# wrong answers whose diagnosis the judge relays as it relays the corpus's caching (a judged test that
# fails with the check's message), and forgeries that combine two the corpus grades
# (forge_check_zeros's rebinding, a guard's finding).
# student -> (code of the solution cell, the hidden test, what its verdict's message must say)
IN_PROCESS = {
    "zeros": (ZEROS, "test_small", "all zeros"),
    "calls_sdpa": (SDPA, "test_medium", "scaled_dot_product_attention"),
    "mutates_inputs": (_wrap(after="q.mul_(2)"), "test_small", "was modified by the call"),
    "mean_of_v": (_fn("g = q.shape[1] // k.shape[1]\n"
                      "return v.repeat_interleave(g, 1).mean(2, keepdim=True).expand_as(q).clone()"),
                  "test_small", "mean of V"),
    "half_output": (_wrap(after="h = q.shape[2] // 2\nout = torch.empty_like(o)\n"
                                "out[:, :, :h] = o[:, :, :h]\no = out"), "test_small", "NaN or inf"),
    "forge_check_sdpa": (SDPA + "\ncheck_entry_point = lambda *a, **k: None", "test_small",
                         "scaled_dot_product_attention"),
}
#: the scan's tamper rule for an in-process forgery (a tamper flag scores the judged tests 0 in
#: autograde, as the corpus's forge_check_zeros shows end to end)
IN_PROCESS_FLAGS = {"forge_check_sdpa": "rebinds check_entry_point"}

# Forgeries whose effect stays in the student's kernel, which decides nothing (the judge checks in its
# own process, and the hidden cells' points are the judge's), or that only the scan sees (a thread):
# each is a tamper flag of the scan, which scores the judged tests 0 in autograde (forge_check_zeros
# in the corpus shows it end to end); a kernel that ends itself is the corpus's segfault.
# student -> (code of the solution cell, the scan's rule)
SCAN_ONLY = {
    # a library patch that returns plausible objects: the kernel-side client and check say "passed"
    "forge_library": (ZEROS + """
import autograder.judge_client as _jc, facourse.check as _fc
_jc.judge = lambda test, fn: print(f"judge: {test}: 1 of 1 point(s)")
_fc.check_attention = lambda o, *a, **k: _fc.CheckReport("small", 0.0, 1e-3, 0.0, 0.0)""", "monkeypatching"),
    # a torch function the check relies on, patched in the kernel
    "forge_torch": (ZEROS + "\ntorch.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)"
                    "\ntorch.Tensor.amax = lambda self, *a, **k: torch.tensor(0.0)", "monkeypatching"),
    "forge_os_exit": (SOL + "\nimport os\nos._exit(0)", "calls os._exit()"),
    # a thread fills the returned zeros with SDPA's answer before the call returns: the guard watches
    # the calling thread only, so the judge alone would accept this one; the scan is what catches it
    "forge_thread": (_fn("o = torch.zeros_like(q)\n"
                         "threading.Thread(target=lambda: o.copy_(torch.nn.functional.scaled_dot_product_attention(\n"
                         "    q, k, v, is_causal=causal, scale=scale, enable_gqa=True))).start()\n"
                         "import time; time.sleep(0.05)\nreturn o") + "\nimport threading", "imports threading"),
}


def test_variants_judged_in_process():
    for student, (code, test, says) in IN_PROCESS.items():
        scope = {}
        exec("import math, torch\nfrom facourse import *\n" + code, scope)
        v = run_inprocess(A, scope["vanilla_attention"], [test])[test]
        assert v.points == 0 and says in v.message, (student, v.points, v.message)
        tamper = [f.rule for f in scan_source(code, "cell vanilla_attention") if f.severity == "tamper"]
        if student in IN_PROCESS_FLAGS:
            assert any(IN_PROCESS_FLAGS[student] in r for r in tamper), (student, tamper)
        else:
            assert not tamper, (student, tamper)


def test_kernel_side_forgeries_are_flagged_by_the_scan():
    for student, (code, rule) in SCAN_ONLY.items():
        tamper = [f.rule for f in scan_source(code, "cell vanilla_attention") if f.severity == "tamper"]
        assert any(rule in r for r in tamper), (student, tamper)


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
            path.write_text(json.dumps(fill(nb, {"vanilla_attention": ZEROS,
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
    # 30 s per cell (15 s lost a correct cell once on a loaded 2-core machine): the infinite loop is
    # interrupted, the notebook goes on (and fails its tests);
    # the per-notebook limit (--timeout) is tested in test_autograder.py
    results = workers.autograde(subs, ws, timeout=300, cell_timeout=30, jobs=2, quiet=True)
    seconds = time.perf_counter() - t0
    res = {r.student: r for r in results}
    assert set(res) == set(CORPUS)
    wrong = {s: (res[s].score, res[s].status, res[s].failed) for s, (_, want, _) in CORPUS.items()
             if res[s].score != want}
    assert not wrong, f"unexpected scores: {wrong}"
    for s, (_, _, says) in CORPUS.items():
        assert says in res[s].status, (s, res[s].status)
        assert res[s].max_score == 7, (s, res[s].max_score)
    assert res["caches"].failed == ["test_small", "test_medium"]
    for s, (gid, text) in MESSAGES.items():
        assert text in res[s].messages.get(gid, ""), (s, res[s].messages)
    assert set(res["infinite_loop"].failed) == set(TESTS)
    log = (ws / "autograded" / "infinite_loop" / A / f"{A}.ipynb").read_text()
    assert "CellTimeoutError" in log or "KeyboardInterrupt" in log

    # the shared gradebook holds every submission with the same scores, and nothing is left running
    for s, why in TAMPER_REASONS.items():
        said = res[s].status + " " + " ".join(res[s].messages.values())
        assert why in said, (s, res[s].status, res[s].messages)
    # the judge rejected the forged record itself, besides the scan
    assert any(f["where"] == "judge" for f in res["forge_record"].flags), res["forge_record"].flags
    # the report shows each flag with its line, on the student's page and the class page
    exported = {r.student: r.score for r in gradebook.export(ws)}
    assert exported == {s: res[s].score for s in CORPUS}
    assert not list((ws / "work").glob("*__*")), "a private workspace was left behind"
    # the report: CSV row per submission, class page, one page per student, plots as files
    report.print_report(results, ws / "grades.csv", workspace=ws, seconds=seconds)
    out = capsys.readouterr().out
    assert f"{len(CORPUS)} submission(s)" in out and "report written to" in out
    assert len((ws / "grades.csv").read_text().splitlines()) == len(CORPUS) + 1
    index = (ws / "report" / "index.html").read_text()
    assert "01_vanilla_attention_scores.png" in index and "base64" not in index
    assert (ws / "report" / "01_vanilla_attention_pass_rates.png").stat().st_size > 1000
    page = (ws / "report" / "students" / "caches.html").read_text()
    assert "cached or precomputed" in page and "BEGIN HIDDEN" not in page
    assert "check_no_caching" not in page and "forbid_framework_attention" not in page
    page = (ws / "report" / "students" / "forge_check_zeros.html").read_text()
    assert "rebinds check_entry_point" in page and "check_entry_point = lambda" in page
    assert "forge_check_zeros" in index and "tamper" in index
    print(f"corpus of {len(CORPUS)} graded in {seconds:.0f} s with --jobs 2")
