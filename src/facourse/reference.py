"""Reference attention: the definition every kernel in the course is checked against.

    S = scale · Q Kᵀ,   P = softmax(S + mask),   O = P V,   lse_i = log Σ_j exp(S_ij)

Query head ``h`` reads KV head ``h // (Hq // Hkv)`` (GQA). ``causal`` is bottom-right aligned:
key ``j`` is visible to query ``i`` iff ``j <= i + (Skv - Sq)``. A row that sees no key gives
``o = 0`` and ``lse = -inf``.
"""
from __future__ import annotations

import math

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class AttentionInputError(ValueError):
    """q, k, v break the tensor contract; the message says which rule and how to fix it."""


def validate_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None, *,
                    unit_stride: bool = True, head_dims=None) -> None:
    """Raise :class:`AttentionInputError` with a plain explanation when q, k, v break the contract.

    Every message is one line that names the rule and the fix. ``unit_stride`` (the default, what
    every kernel of the course needs) refuses a last dimension that is not contiguous
    (``stride(-1) != 1``); the references pass ``unit_stride=False`` since they handle any layout.
    ``head_dims`` (a tuple) is the head dimensions a kernel supports, e.g. ``(64, 128)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise AttentionInputError(
                f"{name} must have 4 dimensions [B, H, S, D], got shape {tuple(t.shape)}; "
                "add a batch or head dimension with .unsqueeze()")
        if t.dtype not in SUPPORTED_DTYPES:
            raise AttentionInputError(
                f"{name} has dtype {t.dtype}; supported: fp16, bf16, fp32 (and fp64 for references)")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionInputError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise AttentionInputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, Hq, Sq, D = q.shape
    Bk, Hkv, Skv, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B:
        raise AttentionInputError(f"batch sizes differ: q has B={B}, k and v have B={Bk}")
    if Dk != D:
        raise AttentionInputError(f"head dims differ: q has D={D}, k and v have D={Dk}")
    if Hkv == 0:
        raise AttentionInputError(
            f"k and v have Hkv=0 heads (shape {tuple(k.shape)}): they need at least one KV head; "
            "for multi-query attention pass k and v of shape [B, 1, Skv, D]")
    if Hq % Hkv != 0:
        raise AttentionInputError(
            f"Hq={Hq} is not a multiple of Hkv={Hkv}: grouped-query attention needs every KV head "
            "to serve the same number of query heads")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale must be a positive finite number or None, got {scale!r}")
    if unit_stride:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.stride(-1) != 1 and t.shape[-1] > 1:
                raise AttentionInputError(
                    f"{name} has stride(-1) = {t.stride(-1)}: the kernels need the head dimension "
                    f"contiguous (stride(-1) == 1, any other strides are fine); pass {name}.contiguous()")
    if head_dims is not None and D not in head_dims:
        raise AttentionInputError(
            f"head dimension D={D} is not supported by this kernel: D must be one of "
            f"{', '.join(str(d) for d in head_dims)}; pad q, k, v with zeros to the next supported D "
            "(and pass scale=1/sqrt(original D))")


def default_scale(D: int, scale=None) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def kv_head_index(Hq: int, Hkv: int) -> torch.Tensor:
    """For each query head h, the KV head it reads: h // (Hq // Hkv)."""
    return torch.arange(Hq) // (Hq // Hkv)


def causal_mask(Sq: int, Skv: int, device=None, align: str = "bottom_right") -> torch.Tensor:
    """Boolean [Sq, Skv] mask, True where key j is visible to query i.

    ``align="bottom_right"`` (the course's rule, FlashAttention >= 2.1): j <= i + (Skv - Sq).
    ``align="top_left"`` (PyTorch's ``is_causal``): j <= i, the pitfall for prefill against a cache.
    """
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Skv, device=device)[None, :]
    if align == "bottom_right":
        return j <= i + (Skv - Sq)
    if align == "top_left":
        return j <= i
    raise ValueError(f"align must be 'bottom_right' or 'top_left', not {align!r}")


def reference_attention(q, k, v, causal: bool = False, scale=None, *, dtype=None,
                        align: str = "bottom_right", head_map=None):
    """Attention computed plainly in ``dtype`` (float64 on CPU, float32 on GPU), returning ``(o, lse)``.

    ``o`` is in ``dtype`` and ``lse`` in float32 ``[B, Hq, Sq]``. ``align`` and ``head_map`` exist
    so that the check can recognise common mistakes (top-left causal, ``h % Hkv`` heads).
    """
    validate_inputs(q, k, v, scale, unit_stride=False)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = default_scale(D, scale)
    if dtype is None:  # float64 on the CPU; fp32 upcast on a GPU, where float64 is slow
        dtype = torch.float32 if q.device.type == "cuda" else torch.float64
    idx = kv_head_index(Hq, Hkv) if head_map is None else head_map
    idx = idx.to(q.device)
    mask = causal_mask(Sq, Skv, q.device, align) if causal else None
    outs, lses = [], []
    for b in range(B):  # one batch at a time bounds the [Hq, Sq, Skv] score matrix's memory
        qd, kd, vd = (t[b].to(dtype) for t in (q, k, v))
        kd, vd = kd.index_select(0, idx), vd.index_select(0, idx)
        s = torch.matmul(qd, kd.transpose(-1, -2)) * scale       # S = scale · Q Kᵀ
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                          # -inf on empty rows
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)  # P = softmax(S); empty rows 0
        outs.append(torch.matmul(p, vd))                          # O = P V
        lses.append(lse)
        del s, p
    o, lse = torch.stack(outs), torch.stack(lses)
    return o, lse.float()


def torch_attention(q, k, v, causal: bool = False, scale=None):
    """PyTorch's own attention in the inputs' dtype (``F.scaled_dot_product_attention``).

    This is the rounding yardstick of the check (rule 2). Bottom-right causal goes in as an
    explicit boolean mask; rows with no visible key are set to zero, where SDPA gives NaN.
    """
    validate_inputs(q, k, v, scale, unit_stride=False)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    idx = kv_head_index(Hq, Hkv).to(q.device)
    k2, v2 = k.index_select(1, idx), v.index_select(1, idx)
    mask = causal_mask(Sq, Skv, q.device) if causal else None
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k2, v2, attn_mask=mask, scale=default_scale(D, scale))
    if causal and Sq > Skv:
        empty = ~mask.any(dim=-1)
        o = o.masked_fill(empty[None, None, :, None], 0.0)
    return torch.nan_to_num(o, nan=0.0)


def masked_attention(q, k, v, scale, mask):
    """Attention in float64 (fp32 on a GPU) with an arbitrary ``[Sq, Skv]`` mask (True = visible);
    rows with no visible key give 0. The checks form mistakes with it (masks off by one, a ring's
    missing block)."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    dt = torch.float32 if q.device.type == "cuda" else torch.float64
    idx = kv_head_index(Hq, Hkv).to(q.device)
    outs = []
    for b in range(B):
        s = torch.matmul(q[b].to(dt), k[b].to(dt).index_select(0, idx).transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
        outs.append(torch.matmul(p, v[b].to(dt).index_select(0, idx)))
    return torch.stack(outs)
