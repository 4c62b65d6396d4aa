"""The decode kind (step 09): ``paged_decode(q, k_cache, v_cache, block_table, seq_lens)``, checked on
facourse.decode's cases and timed by ``bench_decode`` in GB/s of K and V read, against SDPA on the same
K/V stored contiguously; rows add the fraction of a device-to-device copy's rate."""
from __future__ import annotations

from .base import Bench, Kind


class Decode(Kind):
    name = "decode"
    label = " (decode)"
    rate_key, unit, per_second = "gbps", "GB/s", 1e9
    work_unit = "GB/s of K/V"
    bound = "memory"
    table = "decode_table"
    bench_keys = ("ref_backend", "gbps", "gbps_ref", "ratio", "copy_fraction", "ms", "ms_ref")
    note = "; a decode's rate is the bytes of K and V it must read over its time"

    check_default, checker = "mixed", ("facourse.decode", "check_paged_decode")

    def all_cases(self):
        from ..decode import DECODE_CASES
        return list(DECODE_CASES)

    def bench_cases(self, m, r, solution, quick, dtypes):
        from ..decode import DECODE_BACKENDS, PERF_DECODE_CASES
        cases = list(PERF_DECODE_CASES) if solution else r.get("bench", [])
        bes = list(DECODE_BACKENDS) if solution else [m["reference"]["backend"]]
        return [Bench(PERF_DECODE_CASES[c], "float16", be) for c in cases for be in bes]

    def prepare(self):
        from ..decode import copy_rate_gbps
        return {"copy_gbps": copy_rate_gbps()}

    def bench(self, fn, b, ctx):
        from ..decode import bench_decode
        res = bench_decode(fn, b.case, backend=b.backend)
        return {"ref_backend": res.backend, "gbps": res.gbps_student, "gbps_ref": res.gbps_ref, "ratio": res.ratio,
                "copy_fraction": res.gbps_student / ctx["copy_gbps"], "ms": res.t_student_ms, "ms_ref": res.t_ref_ms,
                "host_us": res.host_student_us, "host_ref_us": res.host_ref_us}

    def bench_line(self, rung, row):
        return (f"  {rung:>24} {row['config']:>12} {row['gbps']:6.0f} GB/s ({row['copy_fraction']:.0%} of a copy) vs "
                f"{row['ref_backend'][:15]:<15} {row['gbps_ref']:6.0f} GB/s  x{row['ratio']:.2f}")

    # ------------------------------------------------------------------ grading
    def perf_bench(self, fn, config, backend):
        import torch

        from ..decode import bench_decode
        return bench_decode(fn, config, backend=backend, dtype=torch.float16)

    def perf_work(self, config, device):
        import torch

        from ..decode import get_decode_case
        return get_decode_case(config, "cuda").kv_bytes(torch.float16)

    def rates_text(self, rate_s, rate_r, reference, rec):
        ref = reference if reference != "FASTEST" else f"fastest ({rec.get('backend', '?')})"
        return f"{rate_s:.0f} GB/s of K/V against SDPA {ref} {rate_r:.0f}"

    def calibration_fn(self, config, backend, device):
        return lambda *a, **k: None          # the reference's time alone: a student side that does nothing

    def timed_call(self, fn, config):
        import torch

        from ..decode import get_decode_case, make_paged_inputs
        inputs = make_paged_inputs(get_decode_case(config, "cuda"), 0, "cuda", torch.float16)
        return lambda: fn(*inputs)

    def result_rate(self, res):
        return res.gbps_student


KIND = Decode()
