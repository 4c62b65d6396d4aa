"""Hardware guards: say plainly what a cell needs and what this machine has."""
from __future__ import annotations

import shutil

import torch


class HardwareUnavailable(RuntimeError):
    """This cell needs hardware the machine does not have. The message says what and why."""


def has_gpu() -> bool:
    return torch.cuda.is_available()


def gpu_name() -> str:
    return torch.cuda.get_device_name() if has_gpu() else "no GPU"


def capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if has_gpu() else None


def has_sm90a() -> bool:
    return capability() == (9, 0)


def has_nvcc() -> bool:
    return shutil.which("nvcc") is not None


def require_gpu(min_capability: tuple[int, int] = (8, 0), what: str = "this cell") -> None:
    """Raise :class:`HardwareUnavailable` unless an NVIDIA GPU of ``min_capability`` is present."""
    if not has_gpu():
        raise HardwareUnavailable(
            f"{what} needs an NVIDIA GPU (compute capability {min_capability[0]}.{min_capability[1]} "
            "or newer) and this machine has none that PyTorch can see. Everything else in the "
            "notebook runs on the CPU; run this cell on a GPU machine.")
    cap = capability()
    if cap < min_capability:
        raise HardwareUnavailable(
            f"{what} needs compute capability {min_capability[0]}.{min_capability[1]}+; "
            f"{gpu_name()} has {cap[0]}.{cap[1]}.")


def require_sm90a(what: str = "this cell") -> None:
    """Raise unless the GPU is a Hopper (sm_90: H100, H200, GH200), which TMA and WGMMA need."""
    require_gpu((9, 0), what)
    if capability() != (9, 0):
        cap = capability()
        raise HardwareUnavailable(
            f"{what} uses Hopper-only instructions (TMA, WGMMA), compiled for sm_90a, which run on "
            f"H100/H200 only; {gpu_name()} is sm_{cap[0]}{cap[1]}.")


def gpu_or_skip(what: str = "this cell", min_capability=(8, 0)) -> bool:
    """For notebook cells: True when the GPU is there; otherwise print one sentence and return False."""
    try:
        require_gpu(min_capability, what)
        return True
    except HardwareUnavailable as e:
        print(f"Skipped: {e}")
        return False
