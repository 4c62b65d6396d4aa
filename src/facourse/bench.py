"""The one benchmark of the course (docs/DESIGN.md, "Performance rule").

Student and reference run in the same process on the same inputs, in interleaved A/B rounds,
timed with CUDA events, with L2 flushed before every call, after a warm-up; each side reports
the median of at least 20 calls. TFLOP/s counts 4·B·Hq·D·(visible query-key pairs) for a forward,
2.5 times that for a backward (``mode``).

The events time the GPU's work, not Python's. Before each call the GPU is kept busy (the L2
flush, then a spin kernel) for longer than the host takes to enqueue the call, so the call's
kernels are already queued when the start event fires. Without the spin, a wrapper whose host
side outlasts the flush left the GPU idle inside the timed window, and that idle time counted
as the kernel's: on an H100 (benchmarks/results/2026-11-22_h100_timing_probe.json) the step-05
Triton wrapper took 145-219 us to enqueue against a 94-107 us flush, and its ratio to FA2 read
1.18-1.40x without the spin, 1.43-1.48x with it (the same kernels, the same inputs). The host
time per call is reported separately (``host_student_us``, ``host_ref_us``).
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from .configs import AttnConfig, get_config, make_inputs
from .hw import gpu_name, require_gpu
from .reference import kv_head_index

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
#: The reference backend beside SDPA's, where flashinfer is installed: FlashInfer's prefill kernel.
FLASHINFER = "FLASHINFER"

#: How ``bench_attention`` times, in one line: every result file names it.
TIMING = ("facourse.bench.time_calls: CUDA events around each call, GPU time only (the L2 flushed, then a spin "
          "kernel hides Python's enqueue), interleaved rounds against the reference, median of >= 20 after warm-up")

#: Set by the runner's ``--methods``: each ``time_calls`` then times its calls two more ways and leaves
#: their medians in ``last_cross`` ({method: {name: ms}}), so a ratio near its bar is read more than once.
CROSS_CHECK = False
last_cross: dict = {}


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
    host_student_us: float = float("nan")  # median time Python took to enqueue one call
    host_ref_us: float = float("nan")

    def summary(self) -> str:
        return (f"{self.config} on {self.gpu}, {self.dtype}: student {self.tflops_student:.0f} TFLOP/s "
                f"({self.t_student_ms:.3f} ms), {'' if self.backend.startswith(FLASHINFER) else 'SDPA '}{self.backend} "
                f"{self.tflops_ref:.0f} TFLOP/s "
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


def flashinfer_available() -> bool:
    """Whether FlashInfer can be imported here (the ``FLASHINFER`` reference backend)."""
    import importlib.util
    return importlib.util.find_spec("flashinfer") is not None


def flashinfer_reference():
    """FlashInfer's prefill kernel (``flashinfer.single_prefill_with_kv_cache``) as a function of the
    course signature; ``(fn, "FLASHINFER")`` like ``sdpa_reference``.

    On the course's contiguous [B, H, S, D] tensors (the bench's inputs) one call serves the whole
    batch, on views, without a copy: the batch goes into the heads. q is [S, B*Hq, D], K and V
    [S, B*Hkv, D] (FlashInfer's NHD layout, through their strides), and FlashInfer's grouping
    (query head i reads KV head i // (Hq/Hkv)) keeps each sequence with its own keys, since every
    sequence of a configuration has the same lengths; the output, [S, B*Hq, D] as FlashInfer writes
    it, comes back as a [B, Hq, S, D] view. Other strides (the check's [B, S, H, D] memory) take one
    call per sequence and a stacked copy of the outputs. FlashInfer's causal mask is aligned
    bottom-right, like the course's. Its FA3 kernel on Hopper, its FA2 kernel elsewhere
    (``fn.last_backend`` says which ran). K and V go in as NHD views, not in FlashInfer's HND layout:
    its FA3 single prefill 0.7.2 stops the process (a floating-point exception) on HND input, on an
    H100 (2026-11-23)."""
    import flashinfer

    version = getattr(flashinfer, "__version__", "?")

    def fn(q, k, v, causal=False, scale=None):
        B, Hq, Sq, D = q.shape
        kernel = "fa3" if q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0) else "fa2"
        kw = dict(causal=causal, kv_layout="NHD", sm_scale=D ** -0.5 if scale is None else scale, backend=kernel)
        fn.last_backend = f"FLASHINFER {version} single_prefill ({kernel})"
        if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():
            o = flashinfer.single_prefill_with_kv_cache(
                *(t.view(-1, t.shape[2], D).transpose(0, 1) for t in (q, k, v)), **kw)
            return o.view(Sq, B, Hq, D).permute(1, 2, 0, 3)
        outs = [flashinfer.single_prefill_with_kv_cache(*(t[b].transpose(0, 1) for t in (q, k, v)), **kw)
                for b in range(B)]
        return torch.stack(outs).permute(0, 2, 1, 3)

    fn.last_backend = FLASHINFER
    return fn, FLASHINFER


def reference(backend: str = "FLASH_ATTENTION"):
    """A reference backend by name, ``(fn, backend used)``: one of SDPA's (``BACKENDS``) or
    ``FLASHINFER`` (FlashInfer's prefill kernel, where installed)."""
    if backend == FLASHINFER:
        return flashinfer_reference()
    return sdpa_reference(backend)


@functools.lru_cache(maxsize=None)
def spin_cycles_per_us(device_index: int) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per microsecond, measured once per GPU."""
    cycles = 1 << 21
    torch.cuda._sleep(1000)                                   # load the kernel first
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / (a.elapsed_time(b) * 1000.0)


def time_calls(calls: dict, rounds: int, flush: torch.Tensor, warmup: int = 5,
               hide_host: bool = True) -> tuple[dict, dict]:
    """GPU milliseconds and host microseconds of each call in ``calls`` (name -> no-argument callable).

    Every round calls each once, in an order that rotates from round to round (A/B, B/A for
    two), with L2 flushed and the GPU kept busy before each (see the module's docstring;
    ``hide_host=False`` drops the spin, to show what it changes: benchmarks/timing_probe.py).
    Returns ``(gpu_ms, host_us)``: for each name, the list of its ``rounds`` times.
    """
    names = list(calls)
    host_max = 0.0
    for w in range(warmup):
        for name in names:
            t0 = time.perf_counter()
            calls[name]()
            if w > 0:                                          # the first call may compile
                host_max = max(host_max, (time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
    # spin for twice the slowest enqueue seen, at least 200 us, at most 20 ms
    spin_us = min(max(200.0, 2.0 * host_max), 20_000.0)
    spin = int(spin_us * spin_cycles_per_us(torch.cuda.current_device()))
    gpu = {name: [] for name in names}
    host = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            flush.zero_()
            if hide_host:
                torch.cuda._sleep(spin)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            calls[name]()
            host[name].append((time.perf_counter() - t0) * 1e6)
            end.record()
            end.synchronize()
            gpu[name].append(start.elapsed_time(end))
    if CROSS_CHECK and hide_host:
        last_cross.clear()
        last_cross.update(cross_times(calls, flush))
    return gpu, host


def cross_times(calls: dict, flush: torch.Tensor) -> dict:
    """{method: {name: median ms}} of ``calls`` timed two other sound ways: Triton's ``do_bench`` on each
    call back to back (its own L2 clear between calls, no interleaving) and synced CUDA events around
    each call without the spin (what most write by hand)."""
    from triton.testing import do_bench
    out = {"do_bench": {n: float(do_bench(f, warmup=25, rep=200, return_mode="median")) for n, f in calls.items()}}
    gpu, _ = time_calls(calls, 20, flush, 2, hide_host=False)
    out["events"] = {n: statistics.median(t) for n, t in gpu.items()}
    return out


def new_flush_buffer() -> torch.Tensor:
    """A buffer larger than the L2 of any GPU we meet; ``.zero_()`` on it evicts the inputs."""
    return torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")


def _forward_call(fn, q, k, v, do, causal):
    return lambda: fn(q, k, v, causal=causal)


def _grad_leaves(fn, q, k, v, causal):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def forward():
        r = fn(*leaves, causal=causal)
        return r[0] if isinstance(r, (tuple, list)) else r

    return leaves, forward


def _backward_call(fn, q, k, v, do, causal):
    leaves, forward = _grad_leaves(fn, q, k, v, causal)
    o = forward()               # once here, its graph kept: each call is one torch.autograd.grad
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def _train_call(fn, q, k, v, do, causal):
    leaves, forward = _grad_leaves(fn, q, k, v, causal)
    return lambda: torch.autograd.grad(forward(), leaves, do)


#: What ``bench_attention`` times per ``mode``: the call it builds, and the FLOPs it counts as multiples of
#: the forward's (the backward's five matmuls against the forward's two).
PASSES = {"forward": (_forward_call, 1.0), "backward": (_backward_call, 2.5), "train": (_train_call, 3.5)}
MODES = {mode: flops for mode, (_, flops) in PASSES.items()}
#: The passes that run autograd (they need a ``dO``, and a reference with a backward).
GRAD_MODES = ("backward", "train")


def timed_call(fn, q, k, v, do, causal: bool, mode: str):
    """A no-argument call that does ``mode``'s work: the forward; the backward alone (the forward runs
    once here, its graph kept: each call is one ``torch.autograd.grad``); or both."""
    return PASSES[mode][0](fn, q, k, v, do, causal)


def bench_attention(fn, config: str | AttnConfig = "large", *, backend: str = "FLASH_ATTENTION",
                    dtype=torch.float16, rounds: int = 25, warmup: int = 5, seed: int = 0,
                    layout: str = "bhsd", mode: str = "forward") -> BenchResult:
    """Time ``fn`` against the reference ``backend`` (SDPA's, or ``FLASHINFER``) on ``config`` (GPU only;
    raises with a reason on CPU).

    ``mode``: ``"forward"``; ``"backward"`` (``fn`` is a training entry point; the time of
    ``torch.autograd.grad`` through it against SDPA's own backward, FLOPs 2.5x the forward's: the
    backward's five matmuls against the forward's two); ``"train"`` (forward and backward, 3.5x)."""
    require_gpu(what="benchmarking")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}, not {mode!r}")
    if backend == FLASHINFER and (mode in GRAD_MODES or layout != "bhsd"):
        raise ValueError("the FLASHINFER reference times a forward on contiguous [B, H, S, D] inputs "
                         "(mode='forward', layout='bhsd'): it has no backward, and other layouts would "
                         "time a copy of its outputs")
    cfg = config if isinstance(config, AttnConfig) else get_config(config, "cuda")
    q, k, v = make_inputs(cfg, seed, "cuda", dtype, layout)
    do = torch.randn_like(q) if mode in GRAD_MODES else None
    ref, _ = reference(backend)
    calls = {"s": timed_call(fn, q, k, v, do, cfg.causal, mode), "r": timed_call(ref, q, k, v, do, cfg.causal, mode)}
    gpu, host = time_calls(calls, max(rounds, 20), new_flush_buffer(), warmup)
    ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
    flops = cfg.flops() * MODES[mode]
    label = f"{cfg.describe()}, {mode}" if mode in GRAD_MODES else cfg.describe()
    return BenchResult(label, gpu_name(), str(dtype).replace("torch.", ""), ref.last_backend, ts, tr,
                       flops / ts / 1e9, flops / tr / 1e9, tr / ts,
                       statistics.median(host["s"]), statistics.median(host["r"]))
