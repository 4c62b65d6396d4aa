"""GPU-tier self-test of performance grading: `python -m autograder.gpu_selftest` on the GPU box.

Grades three stand-ins for a step-05 submission with ``perf_points`` on ``large``: PyTorch's
FLASH_ATTENTION itself (honest: ratio about 1, full points), a function that caches its output
by input address (timed as nearly free), and one that launches its work on a side CUDA stream
(invisible to the timing events). The two cheats must be flagged above the roofline and score 0.
Exit status 1 when any verdict is wrong. Also tests the SDPA guard and the cache detector on CUDA.

On an H100/H200 it also runs step 07's hidden-test functions on the exercise solution: the
structural check (HGMMA and UTMALDG in the SASS; step 06's kernel must fail it, which also proves
that cuobjdump works here), the cache and SDPA guards, and ``perf_points`` against cuDNN, which
must award points. On another GPU that part says it is skipped.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


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
    ok &= hopper_selftest()
    return 0 if ok else 1


def hopper_selftest() -> bool:
    """Step 07's hidden tests on the exercise solution (Hopper only). True when every verdict is right."""
    from facourse import check_entry_point, has_sm90a, validate_inputs
    from facourse.cuda_build import SassCheckError, check_sass, load_cuda_extension

    from . import guards, perf

    if not has_sm90a():
        print(f"step 07 self-test skipped: it needs an H100/H200 (sm_90a), this is {torch.cuda.get_device_name()}")
        return True
    step = ROOT / "solutions" / "07_hopper_flash_attention"
    step06 = ROOT / "solutions" / "06_cuda_flash_attention"
    solution = step / "ladder" / "student_kernel_solution.cu"
    ok = True
    check_sass(solution, include_dirs=[step])                     # the hidden structural check
    try:
        check_sass(step06 / "ladder" / "student_kernel_solution.cu", include_dirs=[step06], verbose=False)
        print("WRONG: step 06's kernel passed step 07's structural check")
        ok = False
    except SassCheckError as e:
        print("step 06's kernel fails the structural check, as it must:", str(e).splitlines()[0])
    ext = load_cuda_extension("fa07_selftest", [solution, step / "fa_binding.cpp"], arch="sm_90a",
                              include_dirs=[step])

    def flash_attention_hopper(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return tuple(ext.forward(q, k, v, bool(causal), float(scale)))

    guarded = guards.forbid_framework_attention(flash_attention_hopper)
    guards.check_no_caching(guarded, "medium", expect_lse=True)
    check_entry_point(guarded, "ragged", expect_lse=True, dtype=torch.bfloat16)
    got = perf.perf_points(flash_attention_hopper, "07_hopper_flash_attention", "large", 2, capability=(9, 0))
    print(f"== step 07 solution: {got:g} perf points, {'as expected' if got > 0 else 'WRONG'}\n", flush=True)
    return ok and got > 0


if __name__ == "__main__":
    sys.exit(main())
