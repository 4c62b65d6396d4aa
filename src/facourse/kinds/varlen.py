"""The varlen kind (step 15): ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
causal)``, packed sequences of different lengths, checked on facourse.serving's cases and timed by
``bench_serving`` in TFLOP/s of visible pairs against FlashAttention-2's varlen kernel through PyTorch on
the same batch. Its sibling kind ``paged_prefill`` (the step's second entry point) differs in its cases only.
No perf test grades it yet (its thresholds wait for an H100 self-test of the solution: tests/test_thresholds.py),
so the grading half of a kind (perf_bench, perf_work, calibration_fn, timed_call) is the base's."""
from __future__ import annotations

from .base import Bench, Kind, row_of


class Varlen(Kind):
    name = "varlen"
    label = " (varlen)"
    table = "variant_table"
    note = "; TFLOP/s of the visible query-key pairs of each sequence"

    check_default, checker = "packed", ("facourse.serving", "check_varlen")
    #: facourse.serving's case names of this kind, and the perf case its solution is timed on
    cases_attr, perf_case = "VARLEN_CASES", "prefill_mix"

    def all_cases(self):
        from .. import serving
        return list(getattr(serving, self.cases_attr))

    def bench_cases(self, m, r, solution, quick, dtypes):
        cases = [self.perf_case] if solution or r.get("entry_point") else r.get("bench", [])
        return [Bench(c, dt, "FLASH_ATTENTION") for c in cases for dt in (dtypes if solution else dtypes[:1])]

    def bench(self, fn, b, ctx):
        import torch

        from ..serving import bench_serving
        return row_of(bench_serving(fn, b.case, backend=b.backend, dtype=getattr(torch, b.dtype)))


KIND = Varlen()
