"""The FP8 kind (step 10's FP8 rung, ``flash_attention_fp8(q, k, v, causal, scale)``): checked by its error
bound (``facourse.fp8.check_fp8``) on the course's configurations, timed against SDPA in fp16 two
ways: on inputs already in FP8 (``bench_fp8``: the rung's ``flash_attention_fp8_prequantized`` and
``quantize_fp8``, as a model hands them over quantised), and end to end (mode "e2e": fp16 in, the
rung's own quantisation timed with its kernel, through the course's bench)."""
from __future__ import annotations

from ..configs import CONFIGS, EDGE_CASES
from .base import Bench, Kind, row_of


class FP8(Kind):
    name = "fp8"
    label = " (fp8)"

    checker = ("facourse.fp8", "check_fp8")

    def check_cases(self, m, r, solution):      # every rung: the FP8 rung is its own solution
        from ..fp8 import FP8_OUTLIER_CASES, FP8_UNFIT
        return [c for c in [*CONFIGS, *EDGE_CASES] if c not in FP8_UNFIT] + list(FP8_OUTLIER_CASES)

    def bench_cases(self, m, r, solution, quick, dtypes):
        backends = ("FLASH_ATTENTION", "CUDNN_ATTENTION")
        return ([Bench(c, "float8_e4m3fn", be) for c in ("long", "large", "noncausal_16k") for be in backends]
                + [Bench(c, "float16", be, {"mode": "e2e"}) for c in ("long", "large") for be in backends])

    def bench(self, fn, b, ctx):
        from ..bench import bench_attention
        from ..fp8 import bench_fp8
        if b.extra.get("mode") == "e2e":
            return row_of(bench_attention(fn, b.case, backend=b.backend))
        mod = fn.__globals__               # the rung's module: its prequantised entry, its quantiser, its V^T
        return row_of(bench_fp8(mod["flash_attention_fp8_prequantized"], mod["quantize_fp8"], b.case,
                                backend=b.backend, transpose_v=mod.get("transpose_v")))


KIND = FP8()
