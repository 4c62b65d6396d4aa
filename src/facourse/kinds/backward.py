"""The backward kind (step 08): a training entry point ``fn(q, k, v, causal, scale) -> o`` (autograd),
checked by its gradients (``facourse.backward.check_gradients``) and timed by its backward alone
(FLOPs 2.5x the forward's); the solution also forward + backward (rows marked "mode": "train")."""
from __future__ import annotations

from .base import Bench
from .forward import Forward, sweep_names


class Backward(Forward):
    name = "backward"
    label = " (backward)"
    passes = "backward"
    flashinfer = False
    note = "; the backward timed (FLOPs: 2.5x the forward's)"

    def check(self, fn, case, device, dtype):
        from ..backward import check_gradients
        from .forward import EXTRA_CONFIGS, config
        check_gradients(fn, config(case) if case in EXTRA_CONFIGS else case, device=device, dtype=dtype,
                        verbose=False)

    def bench_cases(self, m, r, solution, quick, dtypes):
        bds = super().bench_cases(m, r, solution, quick, dtypes)
        if solution:       # forward + backward too, against FA2
            bds += [Bench(b.case, b.dtype, "FLASH_ATTENTION", {"mode": "train"}) for b in bds
                    if b.backend == "FLASH_ATTENTION" and b.case.name in ("large", "long", *sweep_names(m, True))]
        return bds


KIND = Backward()
