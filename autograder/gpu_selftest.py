"""GPU-tier self-test of performance grading: `python -m autograder.gpu_selftest` on the GPU box.

Grades three stand-ins for a step-05 submission with ``perf_points`` on ``large``: PyTorch's
FLASH_ATTENTION itself (honest: ratio about 1, full points), a function that caches its output
by input address (timed as nearly free), and one that launches its work on a side CUDA stream
(invisible to the timing events). The two cheats must be flagged above the roofline and score 0.
Exit status 1 when any verdict is wrong. Also tests the SDPA guard and the cache detector on CUDA.
"""
from __future__ import annotations

import sys

import torch


def main() -> int:
    from facourse import check_entry_point, sdpa_reference

    from . import guards, perf

    if not torch.cuda.is_available():
        print("No GPU here: this self-test runs on the GPU grading machine.")
        return 0
    fn, used = sdpa_reference("FLASH_ATTENTION")

    def honest(q, k, v, causal=False, scale=None):
        return fn(q, k, v, causal, scale)

    cache = {}

    def cached(q, k, v, causal=False, scale=None):
        if q.data_ptr() not in cache:
            cache[q.data_ptr()] = fn(q, k, v, causal, scale)
        return cache[q.data_ptr()]

    side = torch.cuda.Stream()

    def side_stream(q, k, v, causal=False, scale=None):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return fn(q, k, v, causal, scale)

    ok = True
    for f, want in ((honest, lambda p: p > 0), (cached, lambda p: p == 0), (side_stream, lambda p: p == 0)):
        got = perf.perf_points(f, "05_triton_flash_attention", "large", 2, expect_lse=False)
        verdict = "as expected" if want(got) else "WRONG"
        ok &= want(got)
        print(f"== {f.__name__}: {got:g} points, {verdict}\n", flush=True)
    try:
        check_entry_point(guards.forbid_framework_attention(honest), "medium")
        print("WRONG: SDPA on CUDA was not caught")
        ok = False
    except guards.CheatDetected as e:
        print("SDPA on CUDA caught:", str(e).splitlines()[0])
    try:
        guards.check_no_caching(cached, "medium")
        print("WRONG: the address-keyed cache was not caught")
        ok = False
    except guards.CheatDetected as e:
        print("cache on CUDA caught:", str(e).splitlines()[0])
    print(f"dense fp16 GEMM measured here: {guards.measured_gemm_tflops():.0f} TFLOP/s "
          f"(data sheet: {guards.peak_tflops(torch.cuda.get_device_name())})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
