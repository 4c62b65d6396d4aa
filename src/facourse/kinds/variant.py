"""The variant kind (step 10): ``flex_attention_triton(q, k, v, mask=, score_mod=, scale=, block_mask=)``,
checked on facourse.variants.VARIANT_CASES and timed on its perf cases (a 1024 window at 8k and 16k
against compiled FlexAttention, causal 8k against SDPA; both sides given their block mask built once)
and on plain configurations (`long`: no mask, against SDPA), in TFLOP/s of visible pairs."""
from __future__ import annotations

from .base import Bench, Kind, row_of


class Variant(Kind):
    name = "variant"
    label = " (variant)"
    table = "variant_table"

    check_default, checker = "window", ("facourse.variants", "check_variant")

    def all_cases(self):
        from ..variants import VARIANT_CASES
        return list(VARIANT_CASES)

    def bench_cases(self, m, r, solution, quick, dtypes):
        from ..variants import PERF_CASES
        cases = list(PERF_CASES) + ["long"] if solution else r.get("bench", [])
        return [Bench(c, "float16", be) for c in cases for be in self.backends(c, solution)]

    @staticmethod
    def backends(case: str, solution: bool) -> list[str]:
        if case.startswith("window"):          # SDPA has no sliding window
            return ["FLEX"]
        return ["FLASH_ATTENTION", "CUDNN_ATTENTION"] if solution else ["FLASH_ATTENTION"]

    def bench(self, fn, b, ctx):
        from ..bench import bench_attention
        from ..variants import PERF_CASES, bench_variant, causal
        if b.case in PERF_CASES:
            res = bench_variant(fn, b.case, backend=b.backend)
        else:                                  # a plain configuration: the course's signature, no mask
            res = bench_attention(_plain(fn, causal), b.case, backend=b.backend)
        return row_of(res)

    # ------------------------------------------------------------------ grading
    def perf_bench(self, fn, config, backend):
        from ..variants import bench_variant
        return bench_variant(fn, config, backend=backend)

    def perf_work(self, config, device):
        from ..variants import perf_flops
        return perf_flops(config)

    def calibration_fn(self, config, backend, device):
        from ..variants import flex_reference, perf_case
        cfg, mask = perf_case(config)
        return flex_reference(mask, cfg.B, cfg.Hq, cfg.Sq, cfg.Skv, device=device)

    def timed_call(self, fn, config):
        import torch

        from ..configs import make_inputs
        from ..variants import PERF_TILES, perf_case, reference_block_mask
        cfg, mask = perf_case(config)
        q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout="bhsd")
        bm = reference_block_mask(mask, 1, 1, cfg.Sq, cfg.Skv, *PERF_TILES, device="cuda")
        return lambda: fn(q, k, v, mask=mask, block_mask=bm)


def _plain(fn, causal_mod):
    """``fn`` with the course's signature fn(q, k, v, causal, scale): causal as a mask."""
    def plain(q, k, v, causal=False, scale=None):
        return fn(q, k, v, mask=causal_mod(q.shape[2], k.shape[2]) if causal else None, scale=scale)
    return plain


KIND = Variant()
