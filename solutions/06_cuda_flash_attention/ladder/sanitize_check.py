"""Run one step-06 kernel on a few small configurations, for compute-sanitizer.

    compute-sanitizer --tool memcheck --kernel-regex kns=v5 \
        python solutions/06_cuda_flash_attention/ladder/sanitize_check.py v6_fa2_tiles_lazy small ragged empty_rows decode

Builds (or reuses, from $OUT/build) the version as gpu_check.py does, then checks it on each named
configuration (or `all`: the five and the edge cases) in fp16 and bf16, one line each; each
check draws fresh inputs, so running it again is a stress test. Build once without the sanitizer first:
the build is slow under it.
"""
import importlib.util
import sys
from pathlib import Path

import torch

from facourse import CONFIGS, EDGE_CASES, check_entry_point

spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parent / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

if __name__ == "__main__":
    version, *configs = sys.argv[1:]
    if configs == ["all"]:                  # the five configurations and every edge case
        configs = list(CONFIGS) + list(EDGE_CASES)
    fn = gpu_check.entry_point(version)
    for dtype in (torch.float16, torch.bfloat16):
        for name in configs or ["small", "ragged", "empty_rows", "decode"]:
            check_entry_point(fn, name, device="cuda", dtype=dtype, expect_lse=True, verbose=True)
    torch.cuda.synchronize()
