"""The FP8 kind (step 10's FP8 rung, ``flash_attention_fp8(q, k, v, causal, scale)``): checked by its error
bound (``facourse.variants.check_fp8``) on the course's configurations, timed on inputs already in FP8
(``bench_fp8``: the rung's ``flash_attention_fp8_prequantized`` and ``quantize_fp8``, as a model hands
them over quantised) against SDPA in fp16."""
from __future__ import annotations

from ..configs import CONFIGS, EDGE_CASES
from .base import Bench, Kind, row_of


class FP8(Kind):
    name = "fp8"
    label = " (fp8)"

    checker = ("facourse.variants", "check_fp8")

    def check_cases(self, m, r, solution):      # every rung: the FP8 rung is its own solution
        from ..variants import FP8_UNFIT
        return [c for c in [*CONFIGS, *EDGE_CASES] if c not in FP8_UNFIT]

    def bench_cases(self, m, r, solution, quick, dtypes):
        return [Bench(c, "float8_e4m3fn", be) for c in ("long", "large")
                for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION")]

    def bench(self, fn, b, ctx):
        from ..variants import bench_fp8
        mod = fn.__globals__               # the rung's module: its prequantised entry and its quantiser
        return row_of(bench_fp8(mod["flash_attention_fp8_prequantized"], mod["quantize_fp8"], b.case,
                                backend=b.backend))


KIND = FP8()
