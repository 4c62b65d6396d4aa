"""Shared by every rung of step 08 (a support file, no rung): the forward, the autograd.Function
factory, the reference gradients and a small gradient check.

The forward is step 05's solution, loaded by path (it is no package): v6_host_tma on a Hopper GPU
and under Triton's interpreter (which runs its tensor descriptors on the CPU), v4_autotuned on an
older GPU. It returns (o, lse); the autograd.Function saves q, k, v, o and lse only: O(N) state,
nothing of size Sq x Skv.
"""
from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import torch

from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before triton is imported anywhere

LADDER05 = Path(__file__).resolve().parents[2] / "05_triton_flash_attention" / "ladder"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def forward_module():
    """Step 05's forward: v6 (host tensor descriptors) on sm_90+ and in the interpreter, else v4."""
    if INTERPRET or torch.cuda.get_device_capability()[0] >= 9:
        return _load(LADDER05 / "v6_host_tma.py", "step05_v6_host_tma")
    return _load(LADDER05 / "v4_autotuned.py", "step05_v4_autotuned")


def attention_forward(q, k, v, causal=False, scale=None):
    """(o, lse): o like q (contiguous), lse float32 [B, Hq, Sq], natural log, -inf on empty rows."""
    return forward_module().flash_attention_triton(q, k, v, causal=causal, scale=scale)


def make_train_fn(attention_backward, name="FlashAttentionTrain"):
    """``flash_attention_train(q, k, v, causal=False, scale=None) -> o`` backed by a rung's backward.

    The autograd.Function's forward runs the Triton forward and saves only q, k, v, o, lse; its
    backward calls ``attention_backward(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv)``.
    """

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o, lse = attention_forward(q, k, v, causal, scale)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = attention_backward(q, k, v, o, lse, do, causal=ctx.causal, scale=ctx.scale)
            return dq, dk, dv, None, None

    Fn.__name__ = Fn.__qualname__ = name

    def flash_attention_train(q, k, v, causal=False, scale=None):
        """Attention with gradients: o = softmax(scale * q k^T + mask) v; call o.backward(...)."""
        return Fn.apply(q, k, v, bool(causal), scale)

    return flash_attention_train


def default_scale(D, scale=None):
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


# ----------------------------------------------------------------------------- checking
def reference_grads(q, k, v, do, causal=False, scale=None, dtype=torch.float64):
    """(o, dq, dk, dv) of facourse's reference attention, by autograd in ``dtype`` (float64 on CPU).

    Rows with no visible key: the reference's nan_to_num gives o = 0 there and zero gradients.
    """
    from facourse.reference import reference_attention
    dev = "cpu" if dtype == torch.float64 else q.device
    qd, kd, vd = (t.detach().to(dev, dtype).requires_grad_() for t in (q, k, v))
    o, _ = reference_attention(qd, kd, vd, causal, scale, dtype=dtype)
    dq, dk, dv = torch.autograd.grad(o, (qd, kd, vd), do.to(dev, dtype))
    return o.detach(), dq, dk, dv


def low_precision_grads(q, k, v, do, causal=False, scale=None):
    """The same gradients computed plainly in the inputs' own dtype (the rounding yardstick)."""
    from facourse.reference import reference_attention
    qd, kd, vd = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, _ = reference_attention(qd, kd, vd, causal, scale, dtype=q.dtype)
    return torch.autograd.grad(o, (qd, kd, vd), do)


def check_grads(got, ref, low=None, names=("dq", "dk", "dv"), rtol=1e-2):
    """The course's rule applied to gradients: finite, error <= 2x the framework's own rounding
    (``low``, when given) + 1e-3 absolute slack, and relative error < ``rtol``. Returns max errors."""
    errs = {}
    for i, (name, g, r) in enumerate(zip(names, got, ref)):
        assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)} != {tuple(r.shape)}"
        g64 = g.detach().to("cpu", torch.float64)
        r64 = r.detach().to("cpu", torch.float64)
        assert torch.isfinite(g64).all(), f"{name}: not finite at {(~torch.isfinite(g64)).nonzero()[:5].tolist()}"
        err = (g64 - r64).abs().max().item()
        top = r64.abs().max().item()
        if low is not None:          # rule 2: no worse than twice the framework's own rounding
            l64 = low[i].detach().to("cpu", torch.float64)
            bound = 2 * (l64 - r64).abs().max().item() + 1e-3
            assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e} (2x the dtype's own + 1e-3)"
        assert top == 0 and err == 0 or err / top < rtol, f"{name}: relative error {err / max(top, 1e-30):.3e}"
        errs[name] = err
    return errs


def empty_rows(Sq, Skv, causal):
    """Boolean [Sq]: rows that see no key (bottom-right causal with Sq > Skv)."""
    if not causal:
        return torch.zeros(Sq, dtype=torch.bool)
    return torch.arange(Sq) + (Skv - Sq) < 0
