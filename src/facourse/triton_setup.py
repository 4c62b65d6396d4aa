"""Triton on any machine: without a GPU, its interpreter runs kernels on the CPU (in NumPy).

Call :func:`interpret_without_gpu` before any ``@triton.jit`` kernel is defined (Triton decides
at decoration time whether a kernel is compiled or interpreted).
"""
from __future__ import annotations

import os

import torch


def interpret_without_gpu() -> bool:
    """Switch Triton to its interpreter when no GPU is present; True when kernels will be interpreted."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    _index_scalars_by_element()
    return True


def _index_scalars_by_element() -> None:
    """Triton 3.6's interpreter keeps a scalar as a 1-element array, and NumPy >= 2.4 refuses
    ``int()`` of one, so a loop bound computed from ``tl.program_id`` crashes it. Read the element."""
    import triton.runtime.interpreter as interp

    orig = interp._patch_lang_tensor
    if getattr(orig, "fixed", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.fixed = True
    interp._patch_lang_tensor = patched
