"""Reproducible grades (issue 34): every exercise's solution passes its hidden tests on 50 seeds.

The rule: a correct solution passes on every seed with margin: on each of 50 seed keys derived as
the grading judge derives them (``autograder.seeds.seed_key_for`` of a fixed workspace secret, one
student per key; then the judge's own ``Judge._seed`` per test and check), the exercise's solution
cells, graded through ``autograder.judge.run_inprocess`` (the kernel side, the wire, the replay and
the step's own checks, as a hidden cell is graded), score every point of each test run here, and
no output comes nearer than a factor MIN_MARGIN to what the course's rule allows (``compare``:
``allowed / max|out - ref|`` and ``rel_limit / relative error``; ``check_lse``: its tolerance over
the error, element by element). A regrade draws new inputs only when the workspace secret changes,
and then a correct solution still passes.

CPU time (about two CPU-minutes in all): each CPU-gradable step (01-05, 08-12, 14; 06 and 07 need
their GPU or emulator) runs its cheapest hidden tests (edge cases and ``small``, never ``large``;
the Triton interpreter only on small shapes) for all 50 seed keys in one subprocess (Triton's
interpreter must be chosen before triton is imported): one pytest test per step, so pytest-xdist
spreads the steps over its workers. Step 11 runs its TileLang program on the CPU stand-in.

The margins come from wrapping ``compare`` and ``check_lse`` where the checks import them; step 03's
merge checks and step 09's bad-input check compare inline or expect an error (no margin: their pass
still counts). No check draws anything beyond its seed: every input comes from the seed, and step
10's prefix-LM lengths from the case's name. Each step prints its smallest margin (``pytest -s``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

N_SEEDS = 50
#: The smallest margin (allowed error / actual error) a solution must keep on every seed.
MIN_MARGIN = 2.0
#: The fixed workspace secret of these seeds (the grading workspace's is random and private).
SECRET = bytes(range(32))

# step: (the given cells the solution needs, the hidden tests run on every seed)
STEPS = {
    "01_vanilla_attention": (("imports",), ("test_edge_ragged", "test_edge_empty_rows")),
    "02_safe_softmax": (("imports",), ("test_small", "test_ragged", "test_overflow", "test_masked",
                                       "test_all_masked", "test_half", "test_other_dims")),
    "03_online_softmax": (("imports",), ("test_merge_random", "test_small", "test_merge_empty", "test_merge_large",
                                         "test_merge_chain", "test_ragged", "test_overflow", "test_masked",
                                         "test_half")),
    "04_tiled_attention": (("imports",), ("test_edge_ragged", "test_edge_decode", "test_edge_empty_rows",
                                          "test_edge_mqa", "test_edge_overflow", "test_edge_strides",
                                          "test_tile_skipping")),
    "05_triton_flash_attention": (("setup",), ("test_edge_empty_rows", "test_edge_overflow")),
    "08_backward": (("setup", "forward"), ("test_edge_empty_rows", "test_edge_overflow")),
    "09_decode_paged_kv": (("setup",), ("test_page48", "test_page64", "test_bad_inputs")),
    "10_attention_variants": (("setup", "builder"), ("test_alibi",)),
    "11_interchangeable_kernels": (("setup", "solution_example"), ("test_tilelang_other", "test_fallback")),
    "12_ring_attention": (("setup",), ("test_merge", "test_gqa_edges")),
    "13_profiling": (("imports",), ("test_occupancy_random", "test_occupancy_edges", "test_roofline_random",
                                    "test_roofline_edges")),
    "14_after_hopper": (("imports", "exp2_fit"), ("test_exp2_softmax", "test_exp2_grid", "test_exp2_edges",
                                                  "test_rescale_random", "test_rescale_growing", "test_rescale_eager",
                                                  "test_rescale_masked")),
    "15_serving": (("setup",), ("test_empty_rows",)),
}

_RUNNER = r'''
import json, math, sys, time
sys.path[:0] = [{src!r}, {root!r}, {tests!r}]
step, given, tests, n_seeds, workspace = json.loads(open(sys.argv[1]).read())
from conftest import hidden_entries, solution_code, ROOT
import torch
from facourse import rule, check, backward, decode, ring, softmax_check, variants
from autograder.judge import Judge, run_inprocess
from autograder.seeds import seed_key_for

MARGINS = []          # the margins of the outputs compared since the last reset


def margin_compare(orig):
    def compare(*a, **kw):
        cmp = orig(*a, **kw)
        if not cmp.collected and cmp.failure is None and math.isfinite(cmp.allowed):
            m = cmp.allowed / cmp.max_err if cmp.max_err > 0 else math.inf
            if cmp.rel_limit is not None and cmp.rel > 0:
                m = min(m, cmp.rel_limit / cmp.rel)
            MARGINS.append((m, cmp.tag + " " + cmp.name))
        return cmp
    return compare


def margin_lse(orig):
    def check_lse(lse, ref_lse, q, tag, *a, **kw):
        err = orig(lse, ref_lse, q, tag, *a, **kw)
        if not rule.is_collecting():
            lse64, ref64 = lse.detach().double(), ref_lse.double().to(lse.device)
            fin = ~torch.isneginf(ref64)
            rel = 2e-2 if q.dtype in (torch.float16, torch.bfloat16) else 1e-4
            diff = (lse64 - ref64).abs()[fin]
            tol = rel * (1 + ref64.abs()[fin])
            if diff.numel() and float(diff.max()) > 0:
                MARGINS.append((float((tol / diff).min()), tag + " lse"))
        return err
    return check_lse


wrapped = margin_compare(rule.compare)
for mod in (rule, check, backward, decode, ring, softmax_check, variants):
    mod.compare = wrapped
for mod in (check, decode, ring, variants):
    mod.check_lse = margin_lse(mod.check_lse)

solution = solution_code(step)
(path,) = (ROOT / "solutions" / step).glob("*.ipynb")
scope = {{"__name__": "__main__"}}
for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
    gid = cell["metadata"].get("nbgrader", {{}}).get("grade_id")
    if gid in given or gid in solution:
        exec(compile(solution.get(gid) or "".join(cell["source"]), "<" + step + ": " + gid + ">", "exec"), scope)
entries = hidden_entries(step)
for i in range(n_seeds):
    student = "student%02d" % i
    key = seed_key_for(workspace, student, step)
    for test in tests:
        del MARGINS[:]
        t0 = time.process_time()
        v = run_inprocess(step, scope[entries[test]], [test], seed_key=key)[test]
        row = {{"student": student, "test": test, "points": v.points, "max": v.max_points, "message": v.message,
               "cpu": time.process_time() - t0, "margin": min(MARGINS, default=None)}}
        if v.points < v.max_points or not v.max_points:
            j = Judge(step, {{}}, seed_key=key)
            try:
                row["seeds"] = [j._seed(test, c) for c in range(len(j.plan[test].checks))]
            finally:
                j.close()
        print("ROW " + json.dumps(row), flush=True)
'''


def run_seeds(tmp_path, step: str, given, tests, n_seeds: int = N_SEEDS) -> list[dict]:
    """One row per (seed key, test): the verdict, the smallest margin seen and the CPU seconds."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".seed_secret").write_bytes(SECRET)
    (tmp_path / "in.json").write_text(json.dumps([step, list(given), list(tests), n_seeds, str(ws)]))
    runner = tmp_path / "run.py"
    runner.write_text(_RUNNER.format(src=str(ROOT / "src"), root=str(ROOT), tests=str(ROOT / "tests")))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", FIB_CACHE_PATH=str(tmp_path / "fib_cache"))
    env.pop("FACOURSE_JUDGE", None)
    r = subprocess.run([sys.executable, str(runner), str(tmp_path / "in.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [json.loads(ln[4:]) for ln in r.stdout.splitlines() if ln.startswith("ROW {")]
    assert len(rows) == n_seeds * len(tests), r.stdout[-2000:] + r.stderr[-3000:]
    return rows


@pytest.mark.parametrize("step", list(STEPS))
def test_solution_passes_on_50_seeds_with_margin(tmp_path, step):
    given, tests = STEPS[step]
    rows = run_seeds(tmp_path, step, given, tests)
    failed = [r for r in rows if not r["max"] or r["points"] < r["max"]]
    assert not failed, f"{len(failed)} of {len(rows)} verdicts failed; the first:\n\n" + "\n\n".join(
        f"{r['student']} (seeds {r.get('seeds')}), {r['test']}: {r['points']}/{r['max']}\n{r['message']}"
        for r in failed[:3])
    margins = [(r["margin"][0], r["student"], r["test"], r["margin"][1]) for r in rows if r["margin"]]
    cpu = sum(r["cpu"] for r in rows)
    if margins:
        m, student, test, where = min(margins)
        print(f"{step}: {len(rows)} verdicts, all passed; smallest margin {m:.3g} ({student}, {test}: {where}); "
              f"{cpu:.1f} CPU-s")
        assert m >= MIN_MARGIN, f"{student}, {test}: {where} passes with margin {m:.3g} < {MIN_MARGIN}"
    else:
        print(f"{step}: {len(rows)} verdicts, all passed; no margin reported; {cpu:.1f} CPU-s")
