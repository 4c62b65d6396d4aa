"""What every step kind answers (``facourse.kinds``): the base class, with the forward's defaults
where a default makes sense, and what a rung's bench row is made of."""
from __future__ import annotations

import importlib
from typing import Any, NamedTuple

#: dtypes a ladder checks and times in on a GPU (the first alone: --quick, a CPU, a rung not the solution)
DTYPES = ("float16", "bfloat16")


#: how the printed table marks a row timed as another pass than its step's (step 08's forward + backward)
PASS_MARK = {"train": " f+b", "e2e": " e2e"}


class Bench(NamedTuple):
    """One timing the runner does: a case (a name or the kind's case object), the dtype, the reference
    backend, and what the row says besides (step 08's forward + backward rows: {"mode": "train"})."""
    case: Any
    dtype: str
    backend: str
    extra: dict = {}

    @property
    def config(self) -> str:
        return self.case if isinstance(self.case, str) else self.case.name


class Kind:
    """A step mode. Subclasses set the attributes and override what differs from the forward's."""
    name = "forward"
    #: the figure of merit: key of the rows (``tflops``, ``gbps``), its unit, and units per (work / s)
    rate_key, unit, per_second = "tflops", "TFLOP/s", 1e12
    #: what the work of a perf call is, in the re-time's words
    work_unit = "TFLOP/s"
    #: "compute" (TFLOP/s against the roofline) or "memory" (GB/s against HBM): the judge's plausibility test
    bound = "compute"
    #: timings of the first bench discarded before the recorded ones (clocks rising, autotuning)
    warmups = 1
    #: ranks one rung runs on (None: one process, one device)
    world: int | None = None
    #: the results header's words on what a row's rate means
    note = ""
    #: what a verdict or a re-time line adds after the configuration's name
    label = ""
    #: what a timed bench row must hold (facourse.schema.Run.check)
    bench_keys: tuple[str, ...] = ("ref_backend", "tflops", "tflops_ref", "ratio", "ms", "ms_ref")
    #: the facourse.results function that renders a run of this kind for the README and the lectures
    table = "solution_table"
    #: row keys the lectures keep besides the common ones (facourse.results.compact)
    extra_row_keys: tuple[str, ...] = ()


    # ------------------------------------------------------------------ the ladder: checks
    #: the case a rung other than the solution is checked on, unless its manifest names one (``check``)
    check_default = ""
    #: the library's check of one case, (module, function), called ``f(fn, case, device=, dtype=, verbose=False)``
    checker: tuple[str, str] = ("", "")

    def all_cases(self) -> list[str]:
        """Every case the step's solution is checked on."""
        raise NotImplementedError

    def check_cases(self, m: dict, r: dict, solution: bool) -> list[str]:
        return self.all_cases() if solution else [r.get("check", self.check_default)]

    def check(self, fn, case: str, device, dtype) -> dict | None:
        """Raise when ``fn`` fails ``case``; what the row records besides "ok" (or None)."""
        module, name = self.checker
        return getattr(importlib.import_module(module), name)(fn, case, device=device, dtype=dtype, verbose=False)

    # ------------------------------------------------------------------ the ladder: timings
    def bench_cases(self, m: dict, r: dict, solution: bool, quick: bool, dtypes: tuple) -> list[Bench]:
        return []

    def prepare(self) -> dict:
        """Measured once per rung before its timings; goes into the rung's results (and the run's env)."""
        return {}

    def bench(self, fn, b: Bench, ctx: dict) -> dict:
        """One timing's row fields (ref_backend, the rate, its reference's, ratio, ms, ...)."""
        raise NotImplementedError

    def bench_line(self, rung: str, row: dict) -> str:
        return (f"  {rung:>20} {row['config']:>16} {row[self.rate_key]:6.0f} vs {row['ref_backend'][:15]:<15} "
                f"{row[self.rate_key + '_ref']:6.0f} {self.unit}  x{row['ratio']:.2f}")

    def summary_lines(self, d: dict) -> list[str]:
        """The runner's printed table of bench rows (after the check counts)."""
        by: dict = {}
        for r in d["rows"]:
            if r["kind"] == "bench" and "ratio" in r:
                cname = r["config"] + PASS_MARK.get(r.get("mode"), "")
                by.setdefault((r["rung"], cname, r["dtype"]), {})[r["ref_backend"][:15]] = r
        key, unit = self.rate_key, self.unit
        lines = [f"{'rung':>22} {'config':>14} {'dtype':>8} {unit:>7}  vs reference: ratio (ref {unit})"] if by else []
        for (name, cname, dt), d2 in by.items():
            first = next(iter(d2.values()))
            refs = "  ".join(f"{be}: {r['ratio']:.2f}x ({r[key + '_ref']:.0f})" + _methods(r) for be, r in d2.items())
            copy = f" ({first['copy_fraction']:.0%} of a copy)" if "copy_fraction" in first else ""
            lines.append(f"{name:>22} {cname:>14} {dt:>8} {first[key]:7.0f}{copy}  {refs}")
        return lines

    # ------------------------------------------------------------------ grading: perf, judge, retime
    def perf_bench(self, fn, config: str, backend: str):
        """The perf cell's timing of ``fn`` on ``config`` against ``backend`` (fp16): a BenchResult."""
        raise NotImplementedError(f"a {self.name} step has no perf test")

    def perf_work(self, config: str, device) -> float:
        """The work of one call on a perf configuration (FLOPs or bytes), as the judge counts it."""
        raise NotImplementedError(f"a {self.name} step has no perf test")

    def rate(self, work: float, ms: float) -> float:
        return work / (ms * 1e-3) / self.per_second

    def rates_text(self, rate_s: float, rate_r: float, reference: str, rec: dict) -> str:
        ref = "compiled FlexAttention" if reference == "FLEX" else f"SDPA {reference}"
        return f"{rate_s:.0f} {self.unit} against {ref} {rate_r:.0f}"

    def calibration_fn(self, config: str, backend: str, device):
        """What the judge times in the student's place to measure the reference on its own GPU."""
        from ..bench import reference
        return reference(backend)[0]

    def timed_call(self, fn, config: str):
        """A no-argument call doing what the perf bench times (the re-time's profiler runs it)."""
        raise NotImplementedError(f"a {self.name} step has no perf test")

    def result_rate(self, res) -> float:
        """The student's rate in a perf bench's result."""
        return res.tflops_student



def _methods(row: dict) -> str:
    """The ratio under the other timing methods, when measured: " [do_bench 1.24x, events 1.27x]"."""
    m = row.get("ratio_methods")
    return f" [{', '.join(f'{k} {v:.2f}x' for k, v in m.items())}]" if m else ""


def row_of(res) -> dict:
    """A bench row's fields from a facourse.bench.BenchResult (TFLOP/s), with the ratio under the other
    timing methods when the runner asked for them (``--methods``)."""
    from .. import bench
    row = {"ref_backend": res.backend, "tflops": res.tflops_student, "tflops_ref": res.tflops_ref, "ratio": res.ratio,
           "ms": res.t_student_ms, "ms_ref": res.t_ref_ms, "host_us": res.host_student_us,
           "host_ref_us": res.host_ref_us}
    if bench.CROSS_CHECK and bench.last_cross:
        row["ratio_methods"] = {m: t["r"] / t["s"] for m, t in bench.last_cross.items()}
        bench.last_cross.clear()
    return row
