"""Step 11, interchangeable kernels: the exercise's FlashInfer-Bench half as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores all 30 points through nbgrader
(``GRADING``, graded by tests/test_exercise_grading.py in one autograde run with the other steps'); the
untouched stub scores 0 (through the judge, in one process). Each mistake planted in the solution loses
the points of a test whose message names it: an axis of the wrong kind, a reference with PyTorch's
top-left causal, tracing that stops at a solution that does not build or skips it, a router that sends
a shape to the fastest solution although its trace failed, an unknown shape sent to the solution that
wins most shapes, and no fallback.
"""
from __future__ import annotations

from conftest import assert_planted_bugs_named, assert_stub_scores_nothing, solution_and_stub

STEP = "11_interchangeable_kernels"

# through nbgrader, the solution scores all 30 points (every test runs on a CPU); the stub, in process, 0
GRADING = solution_and_stub(STEP, 30, set(), 0, stub=False)

_BUILD = """        try:
            run = registry.build(definition, solution)
        except Exception as err:        # no toolchain, a syntax error: COMPILE_ERROR on every workload
            run = err
"""
_ROUTE = """    def attn(q, k, v, causal):
        return apply(fx.DEFINITION_NAME, args=(q, k, v, causal), fallback=fallback)
"""
# A router of one's own that ranks every trace by its time, whatever its status (a failed trace keeps
# the time it ran in, in correctness.extra, as routing_trace_set writes it).
_FASTEST_ANY_STATUS = """    from flashinfer_bench import TraceSet
    best = {}
    for t in TraceSet.from_path(str(root)).traces[fx.DEFINITION_NAME]:
        ev = t.evaluation
        speed = ev.performance.speedup_factor if ev.performance else ev.correctness.extra["speedup_factor"]
        key = tuple(t.workload.axes[a] for a in ("batch", "seq_q", "seq_kv"))
        if speed > best.get(key, (0, None))[0]:
            best[key] = (speed, t.solution)
    registry, ts = BuilderRegistry.get_instance(), TraceSet.from_path(str(root))

    def attn(q, k, v, causal):
        hit = best.get((q.shape[0], q.shape[1], k.shape[1]))
        if hit is None:
            return fallback(q, k, v, causal)
        return registry.build(ts.definitions[fx.DEFINITION_NAME], ts.get_solution(hit[1]))(q, k, v, causal)
"""

# (the cell, the solution's text, the mistake, the test that loses its points, what its message names)
PLANTED = {
    "num_heads_var": ("definition", '"num_heads": AxisConst(value=32)', '"num_heads": AxisVar()',
                      "test_definition", "axis 'num_heads' is var; the spec pins it to const 32"),
    "reference_top_left": ("definition", "j > i + (seq_kv - seq_q)", "j > i", "test_definition_reference",
                           "top-left causal alignment"),
    "build_error_stops_tracing": ("trace_solutions", _BUILD, "        run = registry.build(definition, solution)\n",
                                  "test_traces", "not a stop"),
    "unbuilt_solution_skipped": ("trace_solutions", _BUILD,
                                 "        try:\n            run = registry.build(definition, solution)\n"
                                 "        except Exception:\n            continue\n",
                                 "test_traces", "record COMPILE_ERROR on each of its workloads"),
    "routes_to_a_failed_solution": ("deploy", _ROUTE, _FASTEST_ANY_STATUS, "test_routing",
                                    "whose trace FAILED its check"),
    "miss_to_def_best": ("deploy", "fx.apply_config()", 'fx.apply_config(on_miss_policy="use_def_best")',
                         "test_fallback", "an unknown shape must go to the fallback"),
    "no_fallback": ("deploy", "fallback=fallback)", ")", "test_fallback", "pass fallback=... to apply()"),
}


def test_stub_scores_nothing(tmp_path):
    assert_stub_scores_nothing(tmp_path, STEP, ("setup", "solution_example"), solution_points=30)


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    assert_planted_bugs_named(tmp_path, STEP, ("setup", "solution_example"), PLANTED)
