"""Hardware guards and the bench explain what is missing instead of failing deep inside."""
import pytest
import torch

from facourse import HardwareUnavailable, bench_attention, gpu_or_skip, require_gpu, require_sm90a
from facourse.configs import CONFIGS, LONG_CONFIG

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@no_gpu
def test_guards_say_what_is_missing(capsys):
    with pytest.raises(HardwareUnavailable, match="needs an NVIDIA GPU"):
        require_gpu(what="timing")
    with pytest.raises(HardwareUnavailable, match="compute capability 9.0"):
        require_sm90a()
    assert gpu_or_skip("the plot") is False
    assert capsys.readouterr().out.startswith("Skipped: the plot needs an NVIDIA GPU")


@no_gpu
def test_bench_is_importable_and_refuses_cleanly_on_cpu():
    with pytest.raises(HardwareUnavailable, match="benchmarking needs an NVIDIA GPU"):
        bench_attention(lambda *a, **k: None, "large")


def test_flop_count_of_the_graded_configs():
    # 4 * B * Hq * D * visible pairs; causal 2048^2 sees 2048 * 2049 / 2 pairs
    assert CONFIGS["large"].flops() == 4 * 8 * 32 * 128 * (2048 * 2049 // 2)
    assert LONG_CONFIG.flops() == 4 * 2 * 16 * 128 * 8192 * 8192
