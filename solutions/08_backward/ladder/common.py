"""Shared by every rung of step 08 (a support file, no rung): the forward and the autograd.Function
factory. Gradients are checked with the course's one check, facourse.backward.

The forward is step 05's solution, loaded by path (it is no package): v6_host_tma on a Hopper GPU
and under Triton's interpreter (which runs its tensor descriptors on the CPU), v4_autotuned on an
older GPU. It returns (o, lse); the autograd.Function saves q, k, v, o and lse only: O(N) state,
nothing of size Sq x Skv.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import torch

from facourse.steps import exercise_source
from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before triton is imported anywhere

LADDER05 = Path(__file__).resolve().parents[2] / "05_triton_flash_attention" / "ladder"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step05_kernel():
    """Step 05's kernel module (its device helpers), imported by the name its rungs import it under,
    so the forward and the backward share one copy."""
    if str(LADDER05) not in sys.path:
        sys.path.append(str(LADDER05))
    import step05_kernel
    return step05_kernel


@functools.lru_cache(maxsize=None)
def forward_module():
    """Step 05's forward: v6 (host tensor descriptors) on sm_90+ and in the interpreter, else v4."""
    if INTERPRET or torch.cuda.get_device_capability()[0] >= 9:
        return _load(LADDER05 / "v6_host_tma.py", "step05_v6_host_tma")
    return _load(LADDER05 / "v4_autotuned.py", "step05_v4_autotuned")


def attention_forward(q, k, v, causal=False, scale=None):
    """(o, lse): o like q (contiguous), lse float32 [B, Hq, Sq], natural log, -inf on empty rows."""
    return forward_module().flash_attention_triton(q, k, v, causal=causal, scale=scale)


def make_train_fn(attention_backward, name="FlashAttentionTrain", forward=None):
    """``flash_attention_train(q, k, v, causal=False, scale=None) -> o`` backed by a rung's backward.

    The exercise's own autograd cell (its ``FlashAttentionTrain`` saves only q, k, v, o, lse), run with
    this forward (or ``forward``, with attention_forward's signature) and
    ``attention_backward(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv)``.
    """
    scope = {"INTERPRET": INTERPRET, "torch": torch}
    cell = compile(exercise_source("08", ("autograd",)), f"<exercise 08: cell autograd, {name}>", "exec")
    exec(cell, scope)  # noqa: S102
    scope.update(attention_forward=forward or attention_forward, attention_backward=attention_backward)
    fn = scope["FlashAttentionTrain"]
    fn.__name__ = fn.__qualname__ = name
    return scope["flash_attention_train"]
