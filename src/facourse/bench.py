"""The one benchmark of the course (DESIGN.md, "Performance rule").

Student and reference run in the same process on the same inputs, in interleaved A/B rounds,
timed with CUDA events, with L2 flushed before every call, after a warm-up; each side reports
the median of at least 20 calls. TFLOP/s counts 4·B·Hq·D·(visible query-key pairs).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from .configs import AttnConfig, get_config, make_inputs
from .hw import gpu_name, require_gpu
from .reference import kv_head_index

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass
class BenchResult:
    config: str
    gpu: str
    dtype: str
    backend: str
    t_student_ms: float
    t_ref_ms: float
    tflops_student: float
    tflops_ref: float
    ratio: float  # t_ref / t_student: > 1 means faster than the reference

    def summary(self) -> str:
        return (f"{self.config} on {self.gpu}, {self.dtype}: student {self.tflops_student:.0f} TFLOP/s "
                f"({self.t_student_ms:.3f} ms), SDPA {self.backend} {self.tflops_ref:.0f} TFLOP/s "
                f"({self.t_ref_ms:.3f} ms): {self.ratio:.2f}x the reference")

    def as_dict(self) -> dict:
        return asdict(self)


def sdpa_reference(backend: str = "FLASH_ATTENTION"):
    """PyTorch SDPA restricted to one backend, as a function of the course signature.

    GQA goes through ``enable_gqa``; causal with Sq == Skv through ``is_causal`` (top-left and
    bottom-right coincide there); causal with Sq != Skv through PyTorch's lower-right causal bias,
    which only the memory-efficient backend runs (``fn.last_backend`` names what ran last).
    Returns ``(fn, backend)``: falls back from cuDNN to FLASH_ATTENTION when cuDNN is absent.
    Graded configurations have Sq == Skv, so their reference is the named backend.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    used = backend
    if backend == "CUDNN_ATTENTION" and not torch.backends.cudnn.is_available():
        used = "FLASH_ATTENTION"
    kind = getattr(SDPBackend, used)

    def fn(q, k, v, causal=False, scale=None):
        Sq, Skv = q.shape[2], k.shape[2]
        gqa = q.shape[1] != k.shape[1]
        if causal and Sq != Skv:
            # Bottom-right causal with Sq != Skv: the flash and cuDNN backends take no arbitrary
            # mask, so this case runs PyTorch's lower-right causal bias (memory-efficient backend).
            from torch.nn.attention.bias import causal_lower_right

            idx = kv_head_index(q.shape[1], k.shape[1]).to(q.device)
            fn.last_backend = "EFFICIENT_ATTENTION (lower-right causal bias)"
            return torch.nn.functional.scaled_dot_product_attention(
                q, k.index_select(1, idx), v.index_select(1, idx),
                attn_mask=causal_lower_right(Sq, Skv), scale=scale)
        fn.last_backend = used
        with sdpa_kernel([kind]):
            try:
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
            except RuntimeError:
                if not gqa:
                    raise
                idx = kv_head_index(q.shape[1], k.shape[1]).to(q.device)
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k.index_select(1, idx), v.index_select(1, idx), is_causal=causal, scale=scale)

    fn.last_backend = used
    return fn, used


def bench_attention(fn, config: str | AttnConfig = "large", *, backend: str = "FLASH_ATTENTION",
                    dtype=torch.float16, rounds: int = 25, warmup: int = 5, seed: int = 0,
                    layout: str = "bhsd") -> BenchResult:
    """Time ``fn`` against SDPA's ``backend`` on ``config`` (GPU only; raises with a reason on CPU)."""
    require_gpu(what="benchmarking")
    cfg = config if isinstance(config, AttnConfig) else get_config(config, "cuda")
    q, k, v = make_inputs(cfg, seed, "cuda", dtype, layout)
    ref, _ = sdpa_reference(backend)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")  # > L2 of any GPU we meet

    def call(f):
        return f(q, k, v, causal=cfg.causal)

    for _ in range(warmup):
        call(fn), call(ref)
    torch.cuda.synchronize()
    times = {"s": [], "r": []}
    for r in range(max(rounds, 20)):
        order = (("s", fn), ("r", ref)) if r % 2 == 0 else (("r", ref), ("s", fn))
        for key, f in order:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(f)
            end.record()
            end.synchronize()
            times[key].append(start.elapsed_time(end))
    ts, tr = statistics.median(times["s"]), statistics.median(times["r"])
    flops = cfg.flops()
    return BenchResult(cfg.describe(), gpu_name(), str(dtype).replace("torch.", ""), ref.last_backend, ts, tr,
                       flops / ts / 1e9, flops / tr / 1e9, tr / ts)
