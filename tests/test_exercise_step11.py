"""Step 11, interchangeable kernels: the exercise as it is graded (CPU tier).

The exercise's solution, put into the released notebook, scores the 40 points of its CPU tests through
nbgrader (``GRADING``, graded by tests/test_exercise_grading.py in one autograde run with the other
steps'), and 0 of the 10 its GPU tests hold, each saying there is no GPU; the untouched stub scores 0
and the solution with one planted mistake loses its test (the demo's samples). Each mistake planted in the solution loses the points of a test
whose message names it: an axis of the wrong kind, a reference with PyTorch's top-left causal, tracing
that stops at a solution that does not build or skips it, a router that sends a shape to the fastest
solution although its trace failed, an unknown shape sent to the solution that wins most shapes, no
fallback; and in the TileLang program, run on the CPU stand-in: top-left causal, rows that see no key
divided by their zero sum, the LSE stored past Sq, O not rescaled when the row max grows, and keys
past Skv left unmasked in a non-causal call.
"""
from __future__ import annotations

from conftest import assert_planted_bugs_named, solution_and_stub

STEP = "11_interchangeable_kernels"

# through nbgrader, the solution scores the 40 points of the CPU tests (the GPU tests' 10: 0, no GPU here)
GPU_ONLY = {"test_tilelang_gpu", "perf_large", "perf_long"}

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
    "tilelang_top_left": ("tilelang_program", "off = Skv - Sq ", "off = 0 ", "test_tilelang_causal", "top-left"),
    "tilelang_empty_rows_nan": ("tilelang_program", "T.if_then_else(l[r] > 0, o[r, c] / l[r], 0)",
                                "o[r, c] / l[r]", "test_tilelang_causal", "NaN"),
    "tilelang_lse_past_sq": ("tilelang_program", "                if row0 + r < Sq:\n                    LSE",
                             "                if True:\n                    LSE", "test_tilelang_causal", "out of bounds"),
    "tilelang_no_rescale": ("tilelang_program", "o[r, c] *= alpha[r]", "o[r, c] *= 1.0", "test_tilelang_causal",
                            "rescale"),
    "tilelang_keys_past_skv": ("tilelang_program", "if causal else key < Skv", "if causal else True",
                               "test_tilelang_other", "[tilelang_noncausal"),
}

# the demo's samples, graded by tests/test_exercise_grading.py: the solution scores every CPU point, the
# untouched stub 0, the solution with the planted 'reference_top_left' loses its test's points
GRADING = solution_and_stub(STEP, 50, GPU_ONLY, 10, PLANTED["reference_top_left"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    assert_planted_bugs_named(tmp_path, STEP, ("setup", "solution_example"), PLANTED)
