"""The forward kind (steps 05, 06, 07, 11): ``fn(q, k, v, causal, scale) -> (o, lse)``, checked by the
one rule (``facourse.check_entry_point``) and timed by ``facourse.bench_attention`` in TFLOP/s."""
from __future__ import annotations

from ..configs import CONFIGS, EDGE_CASES, SWEEP, AttnConfig, get_config
from .base import Bench, Kind, row_of

#: Configurations a rung may name besides facourse.configs': v1 of step 05 holds one tile (Skv <= 256).
EXTRA_CONFIGS = {"one_tile": AttnConfig("one_tile", 8, 32, 8, 128, 128, 128, True)}
#: A rung's `bench` entries that stand for several sweep points.
SWEEP_GROUPS = {"sweep_4k_16k": dict(quick=True), "sweep_4k_16k_causal": dict(quick=True, causal=True)}


def config(name: str) -> AttnConfig:
    return EXTRA_CONFIGS[name] if name in EXTRA_CONFIGS else get_config(name, "cuda")


def sweep_names(m: dict, quick: bool = False, causal: bool | None = None) -> list[str]:
    lo = 4096 if quick or m["ladder"].get("sweep", "4k-16k") == "4k-16k" else 512
    return [n for n, c in SWEEP.items() if c.Sq >= lo and (causal is None or c.causal == causal)]


def bench_configs(m: dict, r: dict, quick: bool = False) -> list[AttnConfig]:
    """What the runner times a rung on (the solution: the five, `long`, the sweep)."""
    if r["name"] == m["ladder"]["solution"]:
        names = [*CONFIGS, "long", *sweep_names(m, quick)]
    else:
        names = []
        for n in r.get("bench", ["large", "long"]):
            names += sweep_names(m, **SWEEP_GROUPS[n]) if n in SWEEP_GROUPS else [n]
    return [config(n) for n in names]


class Forward(Kind):
    name = "forward"
    #: bench_attention's pass (facourse.bench.MODES)
    passes = "forward"
    #: whether a solution is also timed against FlashInfer's prefill (a forward kernel; fp16, where installed)
    flashinfer = True
    warmups = 2

    check_default = "large"

    def all_cases(self):
        return [*CONFIGS, *EDGE_CASES]

    def check(self, fn, case, device, dtype):
        from ..check import check_entry_point
        check_entry_point(fn, config(case) if case in EXTRA_CONFIGS else case, device=device, dtype=dtype,
                          expect_lse=True, verbose=False)

    def backends(self, m: dict, solution: bool, dtype: str) -> list[str]:
        """The step's reference and FA2; a solution: FA2 and cuDNN, and FlashInfer's prefill kernel where
        flashinfer is installed (its carried modules are fp16's; tools/carry_tilelang.py --flashinfer)."""
        from ..bench import FLASHINFER, flashinfer_available
        if not solution:
            return list(dict.fromkeys([m["reference"]["backend"], "FLASH_ATTENTION"]))
        return ["FLASH_ATTENTION", "CUDNN_ATTENTION"] + (
            [FLASHINFER] if self.flashinfer and dtype == "float16" and flashinfer_available() else [])

    def bench_cases(self, m, r, solution, quick, dtypes):
        return [Bench(cfg, dt, be) for dt in (dtypes if solution else dtypes[:1])
                for cfg in bench_configs(m, r, quick) for be in self.backends(m, solution, dt)]

    def bench(self, fn, b, ctx):
        import torch

        from ..bench import bench_attention
        res = bench_attention(fn, b.case, backend=b.backend, dtype=getattr(torch, b.dtype),
                              mode=b.extra.get("mode", self.passes))
        return row_of(res)

    def bench_line(self, rung, row):
        cname = row["config"] + (" f+b" if row.get("mode") else "")
        return (f"  {rung:>20} {cname:>14} {row['dtype']:>8} {row['tflops']:6.0f} vs {row['ref_backend'][:15]:<15} "
                f"{row['tflops_ref']:6.0f} TFLOP/s  x{row['ratio']:.2f}")

    # ------------------------------------------------------------------ grading
    def perf_bench(self, fn, config, backend):
        import torch

        import facourse            # the package's name, looked up now: what a student's kernel sees and may replace
        return facourse.bench_attention(fn, config, backend=backend, dtype=torch.float16, mode=self.passes)

    def perf_work(self, config, device):
        from ..bench import MODES
        return get_config(config, device).flops() * MODES[self.passes]

    def timed_call(self, fn, config):
        import torch

        from ..bench import timed_call
        from ..configs import make_inputs
        cfg = get_config(config, "cuda")
        q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, "bshd")
        return timed_call(fn, q, k, v, torch.randn_like(q), cfg.causal, self.passes)


KIND = Forward()
