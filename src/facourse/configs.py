"""The five test configurations, the CPU profile, the edge cases, and seeded inputs.

Every step of the course is checked on the same shapes. ``make_inputs`` draws q, k, v from a
seed; with ``layout="bshd"`` they are strided views of ``[B, S, H, D]`` storage, as the hidden
tests pass them, so kernels that assume contiguity fail where they should.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .hw import HardwareUnavailable


@dataclass(frozen=True)
class AttnConfig:
    name: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int
    causal: bool
    logit_scale: float = 1.0  # > 1 makes the logits large enough to overflow an unsafe softmax
    graded_perf: bool = False

    def __post_init__(self):
        if self.Hkv < 1:
            raise ValueError(f"configuration {self.name!r} has Hkv={self.Hkv}: it needs at least one KV head "
                             "(Hkv=1 is multi-query attention)")
        if self.Hq % self.Hkv:
            raise ValueError(f"configuration {self.name!r}: Hq={self.Hq} is not a multiple of Hkv={self.Hkv}; "
                             "every KV head must serve the same number of query heads")

    @property
    def group(self) -> int:
        return self.Hq // self.Hkv

    def visible_pairs(self) -> int:
        return visible_pairs(self.Sq, self.Skv, self.causal)

    def flops(self) -> int:
        """Forward FLOPs of attention: 2 matmuls of 2·D flops for every visible (query, key) pair."""
        return 4 * self.B * self.Hq * self.D * self.visible_pairs()

    def describe(self) -> str:
        c = "causal" if self.causal else "non-causal"
        return (f"{self.name} (B={self.B}, Hq={self.Hq}, Hkv={self.Hkv}, Sq={self.Sq}, "
                f"Skv={self.Skv}, D={self.D}, {c})")


def visible_pairs(Sq: int, Skv: int, causal: bool) -> int:
    """Number of (query, key) pairs that bottom-right causal masking leaves visible."""
    if not causal:
        return Sq * Skv
    off = Skv - Sq  # query i sees keys j <= i + off
    return sum(min(max(i + off + 1, 0), Skv) for i in range(Sq))


#: The five configurations (docs/DESIGN.md): name -> (causal, (B, Sq, Skv) on the GPU, (B, Sq, Skv) on a CPU).
#: The CPU sizes keep the names and the shapes' kinds (GQA group of 4, causal or not, asymmetric).
_FIVE = {
    "small": (True, (1, 128, 128), (1, 128, 128)),
    "medium": (True, (4, 512, 512), (2, 512, 512)),
    "large": (True, (8, 2048, 2048), (1, 1024, 1024)),
    "noncausal": (False, (4, 512, 512), (2, 512, 512)),
    "asymmetric": (True, (4, 128, 2048), (2, 128, 2048)),
}


def _five(cpu: bool, Hq: int, Hkv: int, D: int) -> dict[str, AttnConfig]:
    out = {}
    for name, (causal, on_gpu, on_cpu) in _FIVE.items():
        B, Sq, Skv = on_cpu if cpu else on_gpu
        out[name] = AttnConfig(name, B, Hq, Hkv, Sq, Skv, D, causal, graded_perf=(name == "large"))
    return out


#: At full size (GPU, fp16).
CONFIGS: dict[str, AttnConfig] = _five(False, Hq=32, Hkv=8, D=128)
#: At CPU sizes.
CPU_CONFIGS: dict[str, AttnConfig] = _five(True, Hq=8, Hkv=2, D=128)

#: The long configuration that performance is graded on besides ``large``.
LONG_CONFIG = AttnConfig("long", 2, 16, 16, 8192, 8192, 128, False, graded_perf=True)

#: The sequence-length sweep of the benchmarks: D = 128, Hq = Hkv = 16, B·S = 16k (every point
#: fills the GPU), S = 512 ... 16k, causal and not. Names: ``causal_4k``, ``noncausal_512``, ...
SWEEP_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)


def _length(S: int) -> str:
    return f"{S // 1024}k" if S >= 1024 and S % 1024 == 0 else str(S)   # 8448 stays 8448, not 8k


def sweep_config(S: int, causal: bool) -> AttnConfig:
    """One sweep point: ``sweep_config(4096, True)`` is ``causal_4k`` (B = 4, H = 16, 4096², D = 128)."""
    return AttnConfig(f"{'causal' if causal else 'noncausal'}_{_length(S)}", max(1, 16384 // S), 16, 16, S, S,
                      128, causal)


#: Every sweep point by name, non-causal first, short to long.
SWEEP: dict[str, AttnConfig] = {c.name: c for c in (sweep_config(S, causal) for causal in (False, True)
                                                    for S in SWEEP_LENGTHS)}

#: The long points (4k-16k): where a kernel's steady state shows; the solutions' bar is set there.
SWEEP_4K_16K: tuple[str, ...] = tuple(n for n, c in SWEEP.items() if c.Sq >= 4096)

#: Edge cases beyond the five. Sizes are small enough for the CPU; the GPU runs them as they are.
EDGE_CASES: dict[str, AttnConfig] = {
    # lengths that are no multiple of any block size
    "ragged": AttnConfig("ragged", 1, 4, 2, 200, 333, 128, True),
    "ragged_noncausal": AttnConfig("ragged_noncausal", 1, 4, 2, 77, 333, 128, False),
    # one query row against a KV cache: decode
    "decode": AttnConfig("decode", 2, 8, 2, 1, 515, 128, True),
    # more queries than keys with bottom-right causal: the first Sq - Skv rows see no key
    "empty_rows": AttnConfig("empty_rows", 1, 4, 1, 300, 100, 128, True),
    # the other head dimension
    "d64": AttnConfig("d64", 2, 8, 2, 256, 256, 64, True),
    # multi-query attention: one KV head for all query heads
    "mqa": AttnConfig("mqa", 1, 8, 1, 160, 160, 128, False),
    # logits in the hundreds: exp() overflows unless the row max is subtracted first
    "overflow": AttnConfig("overflow", 1, 4, 2, 128, 128, 128, False, logit_scale=64.0),
}


def profile(device: str | torch.device | None = None) -> dict[str, AttnConfig]:
    """The five configurations at the size that fits ``device``: full size on CUDA, CPU sizes else."""
    dev = torch.device(device) if device is not None else default_device()
    return CONFIGS if dev.type == "cuda" else CPU_CONFIGS


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a torch.device (None: the GPU when there is one, else the CPU).

    Asking for CUDA where PyTorch sees no GPU raises :class:`HardwareUnavailable` with the fix,
    instead of PyTorch's "Torch not compiled with CUDA enabled" from deep inside a call.
    """
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HardwareUnavailable(
            f"device={str(device)!r} asks for a CUDA GPU, but PyTorch sees none on this machine "
            "(torch.cuda.is_available() is False): pass device='cpu', or leave device=None, which "
            "picks the GPU only where there is one")
    return dev


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp16 on a GPU; fp32 on a CPU, where fp16 matmuls are slow and bf16 is mis-simulated."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.float32


def get_config(name: str, device: str | torch.device | None = None) -> AttnConfig:
    """A configuration by name: one of the five (sized for ``device``), an edge case, "long" or a sweep point."""
    five = profile(device)
    if name in five:
        return five[name]
    if name in EDGE_CASES:
        return EDGE_CASES[name]
    if name == "long":
        return LONG_CONFIG
    if name in SWEEP:
        return SWEEP[name]
    known = ", ".join([*five, *EDGE_CASES, "long", *SWEEP])
    raise KeyError(f"unknown configuration {name!r}; known: {known}")


def scaled(cfg: AttnConfig, **changes) -> AttnConfig:
    """A copy of ``cfg`` with some fields changed (e.g. a smaller B for a quick look)."""
    return replace(cfg, **changes)


def make_inputs(cfg: AttnConfig, seed: int = 0, device: str | torch.device | None = None,
                dtype: torch.dtype | None = None, layout: str = "bhsd"):
    """Draw ``q [B,Hq,Sq,D]``, ``k, v [B,Hkv,Skv,D]`` from ``seed``.

    ``layout="bshd"`` allocates ``[B, S, H, D]`` storage and returns its ``[B, H, S, D]`` view:
    the last stride is 1 but the tensors are not contiguous.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', not {layout!r}")
    device = resolve_device(device)
    dtype = dtype or default_dtype(device)
    g = torch.Generator(device="cpu").manual_seed(int(seed))

    def draw(H, S, s=1.0):
        x = torch.randn(cfg.B, S, H, cfg.D, generator=g, dtype=torch.float32) * s
        x = x.to(device=device, dtype=dtype)
        return x.permute(0, 2, 1, 3) if layout == "bshd" else x.permute(0, 2, 1, 3).contiguous()

    # logit_scale multiplies q and k by sqrt(logit_scale) each: logits grow by logit_scale
    s = cfg.logit_scale ** 0.5
    q = draw(cfg.Hq, cfg.Sq, s)
    k = draw(cfg.Hkv, cfg.Skv, s)
    v = draw(cfg.Hkv, cfg.Skv)
    return q, k, v
