"""Step 09, paged decode: every rung of solutions/09_decode_paged_kv/ladder, in Triton's interpreter.

One subprocess (TRITON_INTERPRET=1 set before triton is imported; one import of torch and triton for
the whole file) loads the rungs by path and runs the course's check (facourse.decode.check_paged_decode:
every sequence against a float64 reference, NaN in every row no sequence owns) on a subset of the CPU
cases per rung, so that together they cover every case and every code path, in float32 and in fp16:

* v1 (one program per query head) and v3 (the exercise's cells; its notebook has tests of its own) as
  they launch on a CPU;
* v2 and v4 also as if on an H100 (common.sm_count patched to 132 SMs), so that sequences are cut
  into several splits and the merge runs; v4 also with its default 4 pretend SMs (one split: the
  DIRECT path, no merge) and with BLOCK_N = 32 (a tile inside one page of 64) besides the
  interpreter's 128 (tiles of several pages of 16 or 64; the per-key gather for pages of 48);
* v1, v2 and v4 also on test_spec's third check (8 new tokens, seq_lens int64).

The check can fail: v4 with its merge replaced by one that averages the splits' outputs without the
2^(lse_s - M) rescaling must be caught. v3 must be the exercise's own code, loaded from the .pct.py.
"""
from __future__ import annotations

import pytest

from conftest import ROOT
from ladder_helpers import run_in_interpreter

LADDER = ROOT / "solutions" / "09_decode_paged_kv" / "ladder"
TWIN = ROOT / "solutions" / "09_decode_paged_kv" / "09_decode_paged_kv.pct.py"
RUNGS = ["v1_one_program_per_head", "v2_split_kv", "v3_gqa_packed", "v4_tuned"]

#: test_spec's third check: Sq = 8 new tokens, seq_lens int64
SPEC8 = {"Sq": 8, "lens_dtype": "int64"}
# rung: [(case, dtype, pretend SM count or None for the interpreter's default, v4's BLOCK_N or None[, the
# check's other arguments])]
CHECKS = {
    "v1_one_program_per_head": [("page48", "float32", None, None), ("spec", "float32", None, None),
                                ("mqa", "float16", None, None), ("spec", "float32", None, None, SPEC8)],
    "v2_split_kv": [("page48", "float32", 132, None), ("spec", "float32", None, None),
                    ("spec", "float32", 132, None, SPEC8)],
    "v3_gqa_packed": [("mixed", "float16", None, None)],
    "v4_tuned": [("mixed", "float16", 132, None), ("spec", "float32", 132, None), ("page48", "float32", 132, None),
                 ("page64", "float32", 132, 32), ("mixed", "float32", None, None), ("prefix", "float32", None, None),
                 ("mqa", "float32", None, None), ("d64", "float32", None, None), ("spec", "float32", 132, None, SPEC8),
                 ("spec", "float16", None, None, SPEC8)],
}

SCRIPT = f"""
    from facourse.check import AttentionCheckError
    from facourse.decode import check_paged_decode
    rungs = {{name: load(name) for name in {RUNGS!r}}}
    common = sys.modules["decode_common"]
    default_sm_count = common.sm_count
    v4 = rungs["v4_tuned"]
    default_config = dict(v4.INTERPRET_CONFIG)

    for name, checks in {CHECKS!r}.items():
        for case, dtype, sms, block_n, *more in checks:
            common.sm_count = default_sm_count if sms is None else (lambda device, n=sms: n)
            v4.INTERPRET_CONFIG = default_config if block_n is None else {{"BLOCK_N": block_n}}
            t0 = time.time()
            try:
                check_paged_decode(rungs[name].paged_decode, case, seed=5, device="cpu",
                                   dtype=getattr(torch, dtype), verbose=False, **(more[0] if more else {{}}))
                err = None
            except Exception:
                err = traceback.format_exc()[-2000:]
            report(kind="check", rung=name, case=case, dtype=dtype, sms=sms, block_n=block_n, more=more, error=err,
                   seconds=round(time.time() - t0, 2))
    common.sm_count, v4.INTERPRET_CONFIG = default_sm_count, default_config

    # v3 is the exercise's code: its kernels and its launch were compiled from the .pct.py's cells
    v3 = rungs["v3_gqa_packed"]
    report(kind="origin", files={{"split_kv_kernel": v3.split_kv_kernel.fn.__code__.co_filename,
                                  "merge_kernel": v3.merge_kernel.fn.__code__.co_filename,
                                  "paged_decode": v3.paged_decode.__code__.co_filename,
                                  "common.merge": common.exercise_module().merge_kernel.fn.__code__.co_filename}},
           same_merge=common.exercise_module().merge_kernel is v3.merge_kernel and v4.merge_partials is common.merge,
           split_source=common.exercise_source(("split_kernel",)))

    # a planted bug: v4's merge without the rescaling (the splits' outputs averaged) must fail the check
    def merge_without_rescale(o_part, lse_part, o, lse, num_splits):
        seen = torch.isfinite(lse_part)
        n = seen.sum(-1, keepdim=True).clamp(min=1)
        o.copy_((o_part * seen[..., None]).sum(-2) / n)
        lse.copy_(lse_part.amax(-1) * 0.6931471805599453)

    common.sm_count = lambda device: 132
    v4.merge_partials = merge_without_rescale
    try:
        check_paged_decode(v4.paged_decode, "page64", seed=5, device="cpu", dtype=torch.float32, verbose=False)
        report(kind="planted", caught=False, message="")
    except AttentionCheckError as e:
        report(kind="planted", caught=True, message=str(e))
"""


@pytest.fixture(scope="module")
def results():
    return run_in_interpreter(LADDER, "ladder09_", SCRIPT)


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_passes_the_check_in_interpreter(results, rung):
    """The rung's paged_decode passes check_paged_decode on its share of the CPU cases."""
    done = [r for r in results if r["kind"] == "check" and r["rung"] == rung]
    assert len(done) == len(CHECKS[rung]), done
    failed = [r for r in done if r["error"]]
    assert not failed, "\n\n".join(f"{r['case']} {r['dtype']} sms={r['sms']} {r['more']}:\n{r['error']}"
                                     for r in failed)


def test_the_checks_cover_every_cpu_case():
    from facourse.decode import CPU_DECODE_CASES
    covered = {case for checks in CHECKS.values() for case, *_ in checks}
    assert covered == set(CPU_DECODE_CASES)
    assert {case for case, *_ in CHECKS["v4_tuned"]} == set(CPU_DECODE_CASES)    # the fast rung: every case
    # and test_spec's Sq = 8 check (int64 seq_lens) on every rung with a kernel of its own
    assert all(any(c[4:] == (SPEC8,) for c in CHECKS[r]) for r in RUNGS if r != "v3_gqa_packed")


def test_v3_is_the_exercise_solution(results):
    """v3's kernels and launch come from the exercise's .pct.py cells (one source), and v2/v4 merge with
    the exercise's merge kernel."""
    (origin,) = [r for r in results if r["kind"] == "origin"]
    for what, filename in origin["files"].items():
        assert TWIN.name in filename, (what, filename)
    assert origin["same_merge"]
    twin = TWIN.read_text(encoding="utf-8")
    assert "def split_kv_kernel" in origin["split_source"] and "### BEGIN SOLUTION" not in origin["split_source"]
    assert all(line in twin for line in origin["split_source"].splitlines())
    v3 = (LADDER / "v3_gqa_packed.py").read_text(encoding="utf-8")
    assert "@triton.jit" not in v3 and "tl.load" not in v3     # loaded, not copied


def test_planted_merge_bug_is_caught(results):
    """v4 with a merge that averages the splits without rescaling them by 2^(lse_s - M) fails the check,
    on the long sequences (the ones cut into several splits)."""
    (planted,) = [r for r in results if r["kind"] == "planted"]
    assert planted["caught"], "a merge without rescaling passed the check"
    assert "o is off by" in planted["message"] and "merge" in planted["message"], planted["message"]
