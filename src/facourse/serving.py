"""Step 15: serving — packed variable-length prefill and chunked prefill on a paged cache: the cases,
inputs, reference, checks and bench of both entry points.

* ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
  scale=None) -> (o, lse)``: ``q [total_q, Hq, D]``, ``k, v [total_k, Hkv, D]`` packed (sequence ``b``'s
  queries are rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``, its keys rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``),
  any strides with ``stride(-1) == 1`` (the check passes views of one fused projection's output);
  ``cu_seqlens_*`` int32 ``[B + 1]``; ``max_seqlen_*`` the longest lengths, given so that a grid is sized
  without reading ``cu_seqlens`` on the host.
* ``paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, scale=None)
  -> (o, lse)``: the same packed ``q``, each sequence's new tokens (a chunk of a prompt, or one token of a
  decode: one batch mixes both), against step 09's paged cache (``facourse.decode``), the new tokens'
  keys and values already in it; always causal.

Both return ``o [total_q, Hq, D]`` in q's dtype and ``lse`` float32 ``[Hq, total_q]`` (FlashAttention-2's
varlen layout). Causal is bottom-right per sequence: query ``i`` of a sequence of ``Lq`` queries and
``Lk`` keys sees key ``j`` iff ``j <= i + Lk - Lq``; a row that sees no key gives ``o = 0``, ``lse = -inf``.

The check applies the course's rule (``facourse.rule.compare``) to each sequence, PyTorch's own rounding
of that sequence its yardstick. The packed buffers end in rows of NaN, and the paged cache is step 09's
(shuffled, shared pages, NaN in every row no sequence owns), so a load that is not masked shows.
"""
from __future__ import annotations

import functools
import inspect
import math
import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .bench import BenchResult
from .configs import default_dtype, resolve_device
from .decode import DecodeCase, attend_sequence, gather_kv, make_paged_inputs, pages_needed
from .hw import gpu_name, require_gpu
from .reference import AttentionInputError, default_scale, kv_head_index
from .rule import (ABS_SLACK, AttentionCheckError, Mistake, check_lse, compare, describe_rows, diagnose, draw_seed,
                   expect_tensor, guarded_call, is_collecting, make_tag, max_abs, rel_limit_of, say)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: rows of NaN after the last token of every packed buffer: a load past the end reads them
TAIL = 16


# ----------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class ServingCase:
    """A batch of sequences: ``q_lens`` new queries and ``kv_lens`` keys each (paged: ``kv_lens`` are
    the cache's ``seq_lens``, the new tokens included). ``page_size`` 0: packed K/V (``varlen_attention``)."""
    name: str
    q_lens: tuple
    kv_lens: tuple
    Hq: int
    Hkv: int
    D: int
    causal: bool = True
    page_size: int = 0
    shared_prefix: int = 0       # paged: tokens at the start of sequences 1, 2, ... stored in sequence 0's pages
    logit_scale: float = 1.0
    graded_perf: bool = False

    def __post_init__(self):
        if len(self.q_lens) != len(self.kv_lens):
            raise ValueError(f"{self.name}: one q_len and one kv_len per sequence")
        if self.paged and any(q > k for q, k in zip(self.q_lens, self.kv_lens)):
            raise ValueError(f"{self.name}: a paged sequence's new tokens are in its cache (q_len <= seq_len)")

    @property
    def B(self) -> int:
        return len(self.q_lens)

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    def pairs(self) -> int:
        """Visible query-key pairs of the batch."""
        if not self.causal:
            return sum(a * b for a, b in zip(self.q_lens, self.kv_lens))
        return sum(sum(max(0, min(Lk, i + Lk - Lq + 1)) for i in range(Lq)) for Lq, Lk in zip(self.q_lens, self.kv_lens))

    def flops(self) -> int:
        return 4 * self.Hq * self.D * self.pairs()

    def describe(self) -> str:
        lens = ",".join(f"{a}/{b}" for a, b in zip(self.q_lens, self.kv_lens))
        if len(lens) > 60:
            lens = f"{self.B} sequences, {sum(self.q_lens)} queries, {sum(self.kv_lens)} keys"
        what = f"page {self.page_size}" if self.paged else ("causal" if self.causal else "non-causal")
        extra = f", shared prefix {self.shared_prefix}" if self.shared_prefix else ""
        extra += f", logits x{self.logit_scale:g}" if self.logit_scale != 1.0 else ""
        return f"{self.name} (q_len/kv_len {lens}, Hq={self.Hq}, Hkv={self.Hkv}, D={self.D}, {what}{extra})"


def _cases(L: dict, Hq: int, Hkv: int) -> dict[str, ServingCase]:
    S = functools.partial(ServingCase, Hq=Hq, Hkv=Hkv, D=128)
    return {
        # varlen_attention: self-attention prefills of every awkward length, packed
        "packed": S("packed", L["packed"], L["packed"]),
        "noncausal": S("noncausal", L["packed"], L["packed"], causal=False),
        # fewer queries than keys (a prefix already cached) and the reverse (rows that see no key), empty sequences
        "prefix": S("prefix", *L["prefix"]),
        "empty_rows": S("empty_rows", *L["empty"]),
        "mqa": S("mqa", L["packed"], L["packed"], Hkv=1),
        "d64": S("d64", *L["prefix"], D=64, causal=False),
        # paged_prefill: decodes (one new token), chunks of prompts and whole prompts in one batch
        "chunks": S("chunks", *L["chunks"], page_size=16),
        "page48": S("page48", *L["page48"], page_size=48),
        "shared_prefix": S("shared_prefix", *L["shared"], page_size=16, shared_prefix=L["prefix_tokens"]),
        "paged_d64": S("paged_d64", *L["chunks"], D=64, page_size=16),
    }


#: On a GPU: fp16/bf16, GQA 32/8, D 128 (the contract's shapes).
SERVING_CASES = _cases({
    "packed": (1, 17, 128, 129, 1000, 2048, 333, 4097),
    "prefix": ((1, 100, 512, 200, 64, 3000), (1000, 100, 2048, 4096, 64, 3000)),
    "empty": ((0, 700, 7, 500, 0, 129), (5, 100, 0, 500, 3, 1024)),
    "chunks": ((1, 1, 512, 1000, 7, 1, 2048), (1, 4097, 512, 5000, 135, 40, 8192)),
    "page48": ((48, 1, 49, 200), (48, 49, 2000, 3000)),
    "shared": ((512, 1, 30, 100), (2048, 1100, 1500, 1124)), "prefix_tokens": 1024}, 32, 8)

#: On a CPU (Triton's interpreter): the same character at sizes it gets through in seconds.
CPU_SERVING_CASES = _cases({
    "packed": (1, 17, 64, 65, 200, 129),
    "prefix": ((1, 30, 100, 64), (200, 30, 333, 64)),
    "empty": ((0, 70, 7, 50, 0), (5, 10, 0, 50, 3)),
    "chunks": ((1, 1, 64, 100, 7, 0), (1, 300, 64, 250, 135, 40)),
    "page48": ((48, 1, 49, 20), (48, 49, 200, 97)),
    "shared": ((64, 1, 30, 100), (200, 129, 160, 228)), "prefix_tokens": 128}, 8, 2)

VARLEN_CASES = tuple(n for n, c in SERVING_CASES.items() if not c.paged)
PAGED_CASES = tuple(n for n, c in SERVING_CASES.items() if c.paged)


def _perf_cases() -> dict[str, ServingCase]:
    mix = (7919, 4801, 3967, 3001, 2503, 2048, 1777, 1500, 1201, 1024, 999, 777, 512, 333, 129, 17)
    chunk_q = (2048,) * 8 + (1,) * 32
    chunk_k = (2048, 3072, 4096, 6144, 8192, 10240, 14336, 18432) + (4096,) * 32
    return {
        # a prefill batch of 16 prompts, 32.6k tokens in all, causal
        "prefill_mix": ServingCase("prefill_mix", mix, mix, 32, 8, 128, graded_perf=True),
        # continuous batching with chunked prefill: 8 chunks of 2048 over caches of 2k-18k, and 32 decodes at 4k
        "chunked_p16": ServingCase("chunked_p16", chunk_q, chunk_k, 32, 8, 128, page_size=16, graded_perf=True),
    }


#: GPU only: the timed cases (thresholds in autograder/thresholds.toml).
PERF_SERVING_CASES = _perf_cases()


def serving_profile(device=None) -> dict[str, ServingCase]:
    return SERVING_CASES if resolve_device(device).type == "cuda" else CPU_SERVING_CASES


def get_serving_case(name: str | ServingCase, device=None) -> ServingCase:
    """A case by name, sized for ``device`` (full size on a GPU, the CPU profile otherwise)."""
    if isinstance(name, ServingCase):
        return name
    if name in PERF_SERVING_CASES:
        return PERF_SERVING_CASES[name]
    cases = serving_profile(device)
    if name not in cases:
        raise KeyError(f"no serving case {name!r}; known: {', '.join([*cases, *PERF_SERVING_CASES])}")
    return cases[name]


# ----------------------------------------------------------------------------- inputs
class VarlenInputs(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


class PagedPrefillInputs(NamedTuple):
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    max_seqlen_q: int


def cu_seqlens(lens, device=None) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32: where each packed sequence starts, and the total last."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(torch.int32)
    return out.to(device)


def _draw(shape, g, device, scale_heads=None):
    """A buffer of ``shape`` whose last TAIL rows are NaN; ``scale_heads`` (heads, factor) multiplies those heads."""
    x = torch.randn(shape, generator=g, device=device)
    if scale_heads is not None:
        x[:, :scale_heads[0]] *= scale_heads[1]
    x[shape[0] - TAIL:] = float("nan")
    return x


def make_serving_inputs(case: str | ServingCase, seed: int = 0, device=None, dtype=None):
    """Seeded inputs of a case (:class:`VarlenInputs` or :class:`PagedPrefillInputs`). ``q`` (and packed
    ``k``, ``v``) are views of one buffer of the heads side by side, as a fused projection writes them,
    followed by TAIL rows of NaN; with queries and keys of different lengths, q's heads lie beside another
    output's and k's beside v's (head strides of 2 D); a paged case's cache is step 09's
    (``facourse.decode.make_paged_inputs``), page48's K and V views of one ``[P, ps, 2, Hkv, D]`` buffer."""
    device = resolve_device(device)
    c = get_serving_case(case, device)
    dtype = dtype or default_dtype(device)
    g = torch.Generator().manual_seed(seed)
    gd = g if device.type == "cpu" else torch.Generator(device).manual_seed(seed)
    Tq, Tk = sum(c.q_lens), sum(c.kv_lens)
    cu_q = cu_seqlens(c.q_lens, device)
    if c.paged:
        kc, vc, table, lens = make_paged_inputs(DecodeCase(c.name, c.kv_lens, c.Hq, c.Hkv, c.D, 1, c.page_size,
                                                           c.shared_prefix), seed, device, dtype)[1:]
        if c.name == "page48":                              # K and V of a page side by side: [P, ps, 2, Hkv, D]
            both = torch.stack([kc, vc], 2)
            kc, vc = both[:, :, 0], both[:, :, 1]
        buf = _draw((Tq + TAIL, 2 * c.Hq, c.D), gd, device, (c.Hq, c.logit_scale)).to(dtype)
        return PagedPrefillInputs(buf[:Tq, :c.Hq], kc, vc, table, cu_q, lens, max(c.q_lens, default=0))
    if c.q_lens == c.kv_lens:                               # one QKV projection: [T, Hq + 2 Hkv, D]
        buf = _draw((Tq + TAIL, c.Hq + 2 * c.Hkv, c.D), gd, device, (c.Hq, c.logit_scale)).to(dtype)
        q, k, v = buf[:Tq, :c.Hq], buf[:Tk, c.Hq:c.Hq + c.Hkv], buf[:Tk, c.Hq + c.Hkv:]
    else:            # a Q projection (each head beside another output's: head stride 2 D) and a KV one (per head)
        q = _draw((Tq + TAIL, c.Hq, 2, c.D), gd, device, (c.Hq, c.logit_scale)).to(dtype)[:Tq, :, 0]
        kv = _draw((Tk + TAIL, c.Hkv, 2, c.D), gd, device).to(dtype)
        k, v = kv[:Tk, :, 0], kv[:Tk, :, 1]
    return VarlenInputs(q, k, v, cu_q, cu_seqlens(c.kv_lens, device), max(c.q_lens, default=0),
                        max(c.kv_lens, default=0))


# ----------------------------------------------------------------------------- the reference
def _lens(cu: torch.Tensor) -> list[int]:
    c = cu.tolist()
    return [b - a for a, b in zip(c[:-1], c[1:])]


def _keys(inp, b: int, *, table=None, lens=None, k_starts=None):
    """Sequence ``b``'s keys and values as loaded, ``[Hkv, n, D]`` each: packed rows from ``k_starts[b]``
    (default cu_seqlens_k's), or the paged cache's through ``table`` (default the block table)."""
    if isinstance(inp, PagedPrefillInputs):
        return gather_kv(inp.k_cache, inp.v_cache, inp.block_table if table is None else table,
                         inp.seq_lens if lens is None else lens, b)
    cu = inp.cu_seqlens_k.tolist()
    start = cu[b] if k_starts is None else k_starts[b]
    n = (cu[b + 1] - cu[b]) if lens is None else int(lens[b])
    T = inp.k.shape[0]
    pad = max(0, start + n - T)                     # rows past the buffer read as NaN (its tail)
    k, v = (torch.cat([t[start:start + n], torch.full((pad, *t.shape[1:]), float("nan"), dtype=t.dtype,
                                                      device=t.device)]) for t in (inp.k, inp.v))
    return k.transpose(0, 1), v.transpose(0, 1)


def serving_reference(inp, causal: bool, scale=None, *, dtype=None, head_map=None, align="rule", one_sequence=False,
                      k_starts=None, table=None, lens=None, keys_to=None, chunk_only=False):
    """The batch computed plainly, one sequence at a time: ``(o [total_q, Hq, D], lse [Hq, total_q])``,
    o in ``dtype`` (float64 on a CPU, float32 on a GPU), lse float32.

    The keyword arguments replace what the rule prescribes by a classic mistake (the check names the one a
    wrong result matches): ``head_map``, ``align`` ("bottom_right", "top_left" or None), ``one_sequence``
    (the pack as one sequence), ``k_starts`` (where each sequence's keys are read from), ``table`` and
    ``lens`` (the block table and lengths loaded), ``keys_to`` (keys past it masked), ``chunk_only`` (only
    the last q_len keys, the new tokens, visible)."""
    q = inp.q
    if dtype is None:
        dtype = torch.float32 if q.device.type == "cuda" else torch.float64
    scale = default_scale(q.shape[-1], scale)
    align = ("bottom_right" if causal else None) if align == "rule" else align
    Tq, Hq, D = q.shape
    o = torch.zeros(Tq, Hq, D, dtype=dtype, device=q.device)
    lse = torch.full((Hq, Tq), float("-inf"), dtype=torch.float32, device=q.device)
    if one_sequence:
        kb, vb = inp.k.transpose(0, 1), inp.v.transpose(0, 1)
        ob, lb = attend_sequence(q.transpose(0, 1), kb, vb, scale, dtype, head_map, align)
        return ob.transpose(0, 1), lb.float()
    cu = inp.cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        if cu[b + 1] == cu[b]:
            continue
        kb, vb = _keys(inp, b, table=table, lens=lens, k_starts=k_starts)
        Lq = cu[b + 1] - cu[b]
        hi = None if keys_to is None else int(keys_to[b])
        n = kb.shape[1] if hi is None else hi
        ob, lb = attend_sequence(q[cu[b]:cu[b + 1]].transpose(0, 1), kb, vb, scale, dtype, head_map, align, hi,
                                 lo=max(0, n - Lq) if chunk_only else 0)
        o[cu[b]:cu[b + 1]] = ob.transpose(0, 1)
        lse[:, cu[b]:cu[b + 1]] = lb.float()
    return o, lse


def _torch_rounding(inp, causal: bool, scale: float, b: int):
    """PyTorch's SDPA on sequence ``b`` in the inputs' dtype: the rounding yardstick of rule 2."""
    cu = inp.cu_seqlens_q.tolist()
    qb = inp.q[cu[b]:cu[b + 1]].transpose(0, 1)
    kb, vb = _keys(inp, b)
    Hq, Lq, D = qb.shape
    Lk = kb.shape[1]
    if Lk == 0:
        return torch.zeros(Hq, Lq, D, dtype=qb.dtype, device=qb.device)
    idx = kv_head_index(Hq, kb.shape[0]).to(qb.device)
    i = torch.arange(Lq, device=qb.device)[:, None]
    mask = (torch.arange(Lk, device=qb.device)[None, :] <= i + (Lk - Lq)) if causal else \
        torch.ones(Lq, Lk, dtype=torch.bool, device=qb.device)
    o = torch.nn.functional.scaled_dot_product_attention(qb, kb.index_select(0, idx), vb.index_select(0, idx),
                                                         attn_mask=mask, scale=scale)
    return torch.nan_to_num(o.masked_fill(~mask.any(-1)[None, :, None], 0.0), nan=0.0)


# ----------------------------------------------------------------------------- input errors
_VALIDATED: dict = {}


def _check_tensors(named: dict, *, floats: tuple) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name in floats:
        t = named[name]
        if t.dtype not in DTYPES:
            raise AttentionInputError(f"{name} has dtype {t.dtype}; supported: fp16, bf16, fp32")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise AttentionInputError(f"{name} has stride(-1) = {t.stride(-1)}: the head dimension must be "
                                      f"contiguous; pass {name}.contiguous()")
    if len({named[n].dtype for n in floats}) != 1:
        raise AttentionInputError(f"{', '.join(floats)} must share a dtype, got "
                                  f"{', '.join(str(named[n].dtype) for n in floats)}")
    devices = {t.device for t in named.values()}
    if len(devices) != 1:
        raise AttentionInputError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def _check_cu(name: str, cu: torch.Tensor, total: int, max_len, max_name: str, B: int | None = None) -> list[int]:
    """cu_seqlens: int32 [B + 1], 0 first, non-decreasing, ``total`` last, no length above ``max_len``."""
    if cu.dtype != torch.int32:
        raise AttentionInputError(f"{name} must be int32, got {cu.dtype}; pass {name}.to(torch.int32)")
    if cu.dim() != 1 or cu.numel() < 1 or (B is not None and cu.numel() != B + 1):
        want = "[B + 1]" if B is None else f"[B + 1] = [{B + 1}]"
        raise AttentionInputError(f"{name} must be {want} (offsets, the total last), got shape {tuple(cu.shape)}")
    c = cu.tolist()
    if c[0] != 0 or c[-1] != total:
        raise AttentionInputError(f"{name} must start at 0 and end at the packed length {total}, got {c[0]} ... {c[-1]}")
    lens = [b - a for a, b in zip(c[:-1], c[1:])]
    if any(n < 0 for n in lens):
        b = next(i for i, n in enumerate(lens) if n < 0)
        raise AttentionInputError(f"{name} must not decrease: sequence {b} would have length {lens[b]}")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < max(lens, default=0):
        raise AttentionInputError(f"{max_name} must be an int >= the longest sequence ({max(lens, default=0)}), "
                                  f"got {max_len!r}")
    return lens


def _check_common(q, Hkv: int, D: int, scale, head_dims) -> None:
    if q.dim() != 3:
        raise AttentionInputError(f"q must be [total_q, Hq, D], got shape {tuple(q.shape)}")
    Hq = q.shape[1]
    if q.shape[2] != D:
        raise AttentionInputError(f"head dims differ: q has D={q.shape[2]}, the keys D={D}")
    if Hkv == 0 or Hq % Hkv:
        raise AttentionInputError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (grouped-query attention)")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale must be a positive finite number or None, got {scale!r}")
    if head_dims is not None and D not in head_dims:
        raise AttentionInputError(f"head dimension D={D} is not supported: one of {', '.join(map(str, head_dims))}")


def _once(key, tensors, check) -> None:
    """Run the value checks (host reads, one synchronisation) once for these tensors, while none changes."""
    key = key + tuple((id(t), t._version, t.data_ptr()) for t in tensors)
    if key in _VALIDATED and all(a is b for a, b in zip(_VALIDATED[key], tensors)):
        return
    check()
    if len(_VALIDATED) > 16:
        _VALIDATED.clear()
    _VALIDATED[key] = tuple(tensors)


def validate_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=None, *,
                           head_dims=None) -> None:
    """Raise :class:`AttentionInputError` with a one-line explanation when ``varlen_attention``'s inputs
    break the contract (shapes, dtypes, devices, offsets). The offsets are read on the host once for a
    given pair of tensors, as long as neither changes (an engine validates a batch once for all layers)."""
    _check_tensors({"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k},
                   floats=("q", "k", "v"))
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3:
            raise AttentionInputError(f"{name} must be [total_k, Hkv, D], got shape {tuple(t.shape)}")
    if tuple(k.shape) != tuple(v.shape):
        raise AttentionInputError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    _check_common(q, k.shape[1], k.shape[2], scale, head_dims)

    def values():
        lq = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
        _check_cu("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", B=len(lq))

    _once(("varlen", tuple(q.shape), tuple(k.shape), max_seqlen_q, max_seqlen_k), (cu_seqlens_q, cu_seqlens_k), values)


def validate_paged_prefill_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, max_seqlen_q,
                                  scale=None, *, head_dims=None) -> None:
    """Raise :class:`AttentionInputError` when ``paged_prefill``'s inputs break the contract: shapes, dtypes,
    devices, offsets, a sequence with more new tokens than its seq_len, a block table too short for
    ``seq_lens``, page ids out of range (read on the host once per batch, as ``validate_varlen_inputs``)."""
    _check_tensors({"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                    "cu_seqlens_q": cu_seqlens_q, "seq_lens": seq_lens}, floats=("q", "k_cache", "v_cache"))
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must be [num_pages, page_size, Hkv, D], got shape {tuple(t.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise AttentionInputError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                                  f"{tuple(v_cache.shape)}")
    num_pages, page_size, Hkv, D = k_cache.shape
    _check_common(q, Hkv, D, scale, head_dims)
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise AttentionInputError(f"block_table must be int32 [B, max_pages], got {block_table.dtype} "
                                  f"{tuple(block_table.shape)}")
    if seq_lens.dtype not in (torch.int32, torch.int64) or seq_lens.dim() != 1:
        raise AttentionInputError(f"seq_lens must be int32 or int64 [B], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    B = block_table.shape[0]
    if seq_lens.shape[0] != B:
        raise AttentionInputError(f"seq_lens has {seq_lens.shape[0]} sequences, block_table {B}")

    def values():
        lq = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", B=B)
        lens = seq_lens.tolist()
        for b, (n, L) in enumerate(zip(lq, lens)):
            if L < n:
                raise AttentionInputError(f"sequence {b} has {n} new tokens but seq_len {L}: seq_lens counts the "
                                          "tokens in the cache, the new ones included")
        need = [pages_needed(L, page_size) for L in lens]
        if max(need, default=0) > block_table.shape[1]:
            b = need.index(max(need))
            raise AttentionInputError(f"sequence {b} has seq_len {lens[b]}, {need[b]} pages of {page_size}, but the "
                                      f"block table has room for {block_table.shape[1]} pages per sequence")
        cols = torch.arange(block_table.shape[1], device=block_table.device)[None, :]
        used = cols < torch.tensor(need, device=block_table.device)[:, None]
        ids = block_table[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
            b, p = torch.nonzero(used & ((block_table < 0) | (block_table >= num_pages)))[0].tolist()
            raise AttentionInputError(f"block_table[{b}, {p}] = {int(block_table[b, p])} is not a page id: the "
                                      f"caches hold pages 0..{num_pages - 1}")

    _once(("paged", tuple(q.shape), tuple(k_cache.shape), max_seqlen_q), (block_table, cu_seqlens_q, seq_lens), values)


# ----------------------------------------------------------------------------- the check
LABELS = ("sequences", "query heads", "rows of the sequence")


def _padded(rows: list, B: int, Hq: int, width: int) -> torch.Tensor:
    """Per-sequence row masks ``[Hq, Lq_b]`` as one ``[B, Hq, width]`` mask (False past each sequence)."""
    out = torch.zeros(B, Hq, max(width, 1), dtype=torch.bool)
    for b, r in enumerate(rows):
        if r is not None and r.numel():
            out[b, :, :r.shape[-1]] = r.detach().cpu()
    return out


def _where(bad: torch.Tensor, q_lens: list, k_lens: list) -> str:
    """Where ``bad [B, Hq, max_q]`` holds, with the wrong sequences' lengths."""
    seqs = torch.nonzero(bad.any(dim=(1, 2))).flatten().tolist()
    shown = ", ".join(f"{b}: {q_lens[b]}/{k_lens[b]}" for b in seqs[:6]) + \
        (f" and {len(seqs) - 6} more" if len(seqs) > 6 else "")
    return f"{describe_rows(bad, LABELS)} (q_len/kv_len of each: {shown})"


def _mistakes(inp, causal: bool, scale, ref_dtype, q_lens: list, k_lens: list) -> list[Mistake]:
    """The classic mistakes of a varlen or paged prefill, each with the output it gives on these inputs."""
    Hq = inp.q.shape[1]
    paged = isinstance(inp, PagedPrefillInputs)
    Hkv = (inp.k_cache if paged else inp.k).shape[-2]

    def ref(**kw):
        s = kw.pop("scale", scale)
        return lambda: {"o": serving_reference(inp, causal, s, dtype=ref_dtype, **kw)[0]}

    out = []
    if paged:
        ps = inp.k_cache.shape[1]
        lens = inp.seq_lens
        partial = (lens % ps != 0) & (lens > 0)
        if bool(partial.any()):
            out.append(Mistake(
                "a last page is read past seq_len: its rows after the sequence's last token hold NaN here (as any "
                "stale data in a real cache), and a key loaded unmasked spoils the row even where its score is "
                "masked (0 * NaN in P V). Load K and V with the mask (key index < seq_len) and other=0.0",
                ref(lens=-(-lens // ps) * ps, keys_to=lens)))
        table = inp.block_table
        out.append(Mistake(
            "the block table is ignored: logical page p of a sequence was read from physical page p. Token t of "
            "sequence b lives in row t % page_size of page block_table[b, t // page_size]",
            ref(table=torch.arange(table.shape[1], dtype=table.dtype, device=table.device).expand_as(table))))
        out.append(Mistake(
            "a sequence's new tokens see only each other: the cache's earlier tokens are its context. Query i of a "
            "sequence with q_len new tokens and seq_len tokens in all sees keys 0 .. i + seq_len - q_len",
            ref(chunk_only=True)))
    else:
        out.append(Mistake(
            "the sequences see each other: the pack was attended as one sequence. Sequence b's queries are rows "
            "cu_seqlens_q[b]:cu_seqlens_q[b+1] and its keys rows cu_seqlens_k[b]:cu_seqlens_k[b+1]; mask keys "
            "past its own length", ref(one_sequence=True)))
        if q_lens != k_lens:
            cu = inp.cu_seqlens_q.tolist()
            out.append(Mistake(
                "the keys are found through cu_seqlens_q: sequence b's keys are rows cu_seqlens_k[b] to "
                "cu_seqlens_k[b+1] - 1 of k (their own start and length), not its queries' rows",
                ref(k_starts=cu[:-1], lens=q_lens)))
    if causal and q_lens != k_lens:
        out.append(Mistake(
            "the causal mask is aligned top-left (j <= i): a sequence's queries are its *last* q_len tokens, so "
            "query i sees keys j <= i + kv_len - q_len (bottom-right, per sequence)", ref(align="top_left")))
    if causal:
        out.append(Mistake("the causal mask is missing: with causal=True, query i sees keys j <= i + kv_len - q_len",
                           ref(align=None)))
    else:
        out.append(Mistake("a causal mask is applied with causal=False: every query sees all its sequence's keys",
                           ref(align="bottom_right")))
    if 1 < Hkv < Hq:
        out.append(Mistake("the query heads map to the wrong KV head: query head h reads KV head h // (Hq // Hkv) "
                           "(the heads of a group are consecutive), not h % Hkv", ref(head_map=torch.arange(Hq) % Hkv)))
    out.append(Mistake("the scores are not scaled: S = scale * q k^T with scale = 1/sqrt(D) by default",
                       ref(scale=1.0)))
    if scale is not None:
        out.append(Mistake(f"the scale given ({scale:g}) is ignored: 1/sqrt(D) is only the default, for scale=None",
                           ref(scale=None)))
    return out


NAN_CAUSE = ("the rows after the packed buffers' last token, the K/V rows past a sequence's seq_len, the padding "
             "entries of a block table and the pages no sequence owns all hold NaN here: a load that is not masked "
             "reads them. Mask every load with the sequence's own length (other=0.0)")
EXP_LIMIT = math.log(torch.finfo(torch.float32).max)
OVERFLOW_CAUSE = ("these rows' logits reach the hundreds (lse up to {top:.0f}) and an exponential of a score that is "
                  "not reduced by the running max overflows float32 past {limit:.1f}: subtract the row max m before "
                  "exp (exp(s - m)), and rescale by exp(m_old - m_new)")
EMPTY_CAUSE = ("these rows see no key (an empty key sequence, or a query i < q_len - kv_len): o must be 0 and lse "
               "-inf. Guard the division by l when l == 0, and exp(m_old - m_new) while m is -inf")


def _nan_cause(nonfinite: torch.Tensor, q_lens: list, inp) -> str:
    """Why o is NaN where ``nonfinite`` ([B, Hq, width]) says: the query heads of a wrong group size, rows no
    program wrote, or a load that is not masked."""
    Hq, Hkv = inp.q.shape[1], inp.k_cache.shape[-2] if isinstance(inp, PagedPrefillInputs) else inp.k.shape[1]
    heads = nonfinite.any(2).any(0).tolist()
    past = [h // Hkv >= Hkv for h in range(Hq)]
    if Hkv < Hq and heads == past:
        return (f"only query heads {past.index(True)}-{Hq - 1} are NaN, those with h // Hkv >= Hkv: query head h reads "
                f"KV head h // (Hq // Hkv), the group size being Hq // Hkv = {Hq // Hkv}; divided by Hkv, these heads "
                "read past the last KV head")
    tails = []
    for b, n in enumerate(q_lens):
        bad = nonfinite[b, :, :n]
        if bad.any():
            first = int(bad.any(0).nonzero()[0])
            tails.append(first > 0 and bool(bad[:, first:].all()) and not bool(bad[:, :first].any()))
    if tails and all(tails):
        return ("in each sequence it touches, every row from some row to the sequence's end is NaN in every head, as "
                "left by the NaN-filled allocator: no program wrote them. The grid must cover cdiv(max_seqlen_q, "
                "BLOCK_M) query tiles of every sequence (max_seqlen_q, not max_seqlen_k; rounded up), and each "
                "sequence's last, partial tile")
    return NAN_CAUSE


def check_serving_result(o, lse, inp, causal: bool, scale=None, *, config: str = "custom",
                         seed: int | None = None) -> dict:
    """Check ``(o, lse)`` of a varlen or paged prefill against the reference, sequence by sequence, with
    the course's rule. Raises :class:`AttentionCheckError` with a teaching message; returns error figures."""
    tag = make_tag(config, seed)
    if is_collecting():
        return {}
    q = inp.q
    Tq, Hq, D = q.shape
    expect_tensor(o, q, name="o", like_name="q", tag=tag, shape_note=" = [total_q, Hq, D]")
    scale_v = default_scale(D, scale)
    ref, ref_lse = serving_reference(inp, causal, scale)
    cu = inp.cu_seqlens_q.tolist()
    q_lens = _lens(inp.cu_seqlens_q)
    k_lens = inp.seq_lens.tolist() if isinstance(inp, PagedPrefillInputs) else _lens(inp.cu_seqlens_k)
    B, width = len(q_lens), max(q_lens, default=0)
    cmps = {}
    for b in range(B):
        if q_lens[b]:
            s = slice(cu[b], cu[b + 1])
            cmps[b] = compare(o[s].transpose(0, 1), ref[s].transpose(0, 1),
                              lambda b=b, s=s: max_abs(_torch_rounding(inp, causal, scale_v, b).to(ref.dtype)
                                                       - ref[s].transpose(0, 1)),
                              name="o", tag=tag, empty=torch.isneginf(ref_lse[:, s])[..., None], rel_limit=None)

    def rows(attr):
        return _padded([getattr(cmps[b], attr) if b in cmps else None for b in range(B)], B, Hq, width)

    top = max(max_abs(ref), 1e-30)
    nonfinite, bad, not_empty = rows("nonfinite_rows"), rows("bad_rows"), rows("not_empty_rows")
    allowed = max((c.allowed for c in cmps.values()), default=ABS_SLACK)
    worst = max((c.max_err for c in cmps.values()), default=0.0)
    rel_limit = rel_limit_of(o.dtype)            # of the batch's largest reference value (1% in fp16)
    if worst / top >= rel_limit:
        err = (o.detach().to(ref.dtype) - ref).abs().amax(-1).nan_to_num(0.0).t()      # [Hq, Tq]
        bad = bad | _padded([err[:, cu[b]:cu[b + 1]] >= rel_limit * top for b in range(B)], B, Hq, width)
    if not bad.any():
        lse_err = _check_packed_lse(lse, ref_lse, inp, tag, q_lens, k_lens, width)
        b = max(cmps, key=lambda b: cmps[b].max_err / cmps[b].allowed) if cmps else 0
        return {"max_abs_err": cmps[b].max_err if cmps else 0.0, "allowed": cmps[b].allowed if cmps else 0.0,
                "seq": b, "lse_err": lse_err}
    found = diagnose({"o": o}, {"o"}, _mistakes(inp, causal, scale, ref.dtype, q_lens, k_lens), allowed)
    where = {"nonfinite": _where(nonfinite, q_lens, k_lens), "bad": _where(bad, q_lens, k_lens)}
    if nonfinite.any():
        empty = _padded([torch.isneginf(ref_lse[:, cu[b]:cu[b + 1]]) for b in range(B)], B, Hq, width)
        big = _padded([ref_lse[:, cu[b]:cu[b + 1]] > EXP_LIMIT - 8.0 for b in range(B)], B, Hq, width)
        cause = (found.cause if found else EMPTY_CAUSE if not (nonfinite & ~empty).any()
                 else OVERFLOW_CAUSE.format(top=float(ref_lse.max()), limit=EXP_LIMIT) if not (nonfinite & ~big).any()
                 else _nan_cause(nonfinite, q_lens, inp))
        raise AttentionCheckError(f"{tag} o has NaN or inf at {where['nonfinite']}.\n  likely cause: {cause}")
    if not_empty.any():
        raise AttentionCheckError(
            f"{tag} rows that see no key must be exactly 0 (lse -inf), at {_where(not_empty, q_lens, k_lens)}. "
            "Causal is bottom-right per sequence: query i sees keys j <= i + kv_len - q_len, so rows "
            "i < q_len - kv_len see none" + (f"\n  likely cause: {found.cause}" if found else ""))
    cause = (found.cause if found else
             "compare one wrong sequence with facourse.serving.serving_reference: check each sequence's offsets "
             "(cu_seqlens), its causal offset kv_len - q_len and the mask j <= i + kv_len - q_len (<=, not <), the "
             "masks at its own length, the GQA head mapping, the scale, exp2 with log2(e) folded into the scale "
             "(not exp), and, where only rows that see more than one key tile are wrong, the rescale of acc by "
             "alpha = exp(m_old - m_new) at every tile")
    raise AttentionCheckError(f"{tag} o is off by up to {worst:.3g} (allowed {allowed:.3g}: twice PyTorch's own "
                              f"error in each sequence, plus {ABS_SLACK:g}; relative {worst / top:.3g}, must be < "
                              f"{rel_limit:g}) at {where['bad']}.\n  likely cause: {cause}")


def _check_packed_lse(lse, ref_lse, inp, tag: str, q_lens: list, k_lens: list, width: int) -> float:
    """lse: float32 ``[Hq, total_q]``, judged by the rule's lse check sequence by sequence (the wrong ones named
    with their lengths)."""
    Tq, Hq, _ = inp.q.shape
    if not isinstance(lse, torch.Tensor):
        raise AttentionCheckError(f"{tag} lse must be a torch.Tensor, got {type(lse).__name__}")
    if tuple(lse.shape) != (Hq, Tq):
        raise AttentionCheckError(f"{tag} lse has shape {tuple(lse.shape)}; it must be [Hq, total_q] = {(Hq, Tq)} "
                                  "(FlashAttention-2's varlen layout: head first, then the packed rows)")
    B = len(q_lens)

    def pad(x):
        out = torch.full((B, Hq, max(width, 1)), float("-inf"), dtype=x.dtype, device=x.device)
        start = 0
        for b, n in enumerate(q_lens):
            out[b, :, :n] = x[:, start:start + n]
            start += n
        return out

    shape_of = torch.empty(B, Hq, max(width, 1), 0, dtype=inp.q.dtype)
    return check_lse(pad(lse), pad(ref_lse.to(lse.device)), shape_of, tag,
                     where=lambda rows: _where(rows, q_lens, k_lens))


def _call(fn, inp, causal: bool, scale, tag: str, device):
    kw = {} if scale is None else {"scale": scale}
    if isinstance(inp, VarlenInputs):
        kw["causal"] = causal
    result = guarded_call(fn, *inp, device=device, tag=tag,
                          inputs={k: v for k, v in inp._asdict().items() if isinstance(v, torch.Tensor)},
                          untouched="attention must leave its inputs untouched", **kw)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AttentionCheckError(f"{tag} the function must return a pair (o, lse), got {type(result).__name__}")
    return result


def _check(fn, case, seed, device, dtype, scale, logit_scale, verbose, paged: bool) -> None:
    device = resolve_device(device)
    c = get_serving_case(case, device)
    if c.paged != paged:
        raise KeyError(f"{c.name} is a {'paged' if c.paged else 'varlen'} case: use "
                       f"{'check_paged_prefill' if c.paged else 'check_varlen'}")
    if logit_scale != 1.0:
        c = replace(c, logit_scale=float(logit_scale))
    seed = draw_seed(seed)
    inp = make_serving_inputs(c, seed, device, dtype)
    tag = f"[{c.name}]"
    o, lse = _call(fn, inp, c.causal, scale, tag, device)
    rep = check_serving_result(o, lse, inp, c.causal, scale, config=c.describe(), seed=seed)
    if rep and verbose:
        b = rep["seq"]
        say(f"[{c.name}] passed: closest to its limit, sequence {b} (q_len {c.q_lens[b]}, kv_len {c.kv_lens[b]}): "
            f"max|o-ref| {rep['max_abs_err']:.2e}, allowed {rep['allowed']:.2e} (twice PyTorch's own error + 1e-3); "
            f"lse err {rep['lse_err']:.2e}")


def check_varlen(fn, case: str | ServingCase = "packed", *, seed: int | None = None, device=None, dtype=None,
                 scale=None, logit_scale: float = 1.0, verbose: bool = True) -> None:
    """Draw the inputs of ``case``, call ``fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    causal=[, scale=])`` and check ``(o, lse)`` with the course's rule, sequence by sequence. Raises
    :class:`AttentionCheckError` on failure (also when ``fn`` changes an input); prints one line on success.
    ``logit_scale`` > 1 multiplies q: logits in the hundreds, which overflow an exp that skips the max."""
    _check(fn, case, seed, device, dtype, scale, logit_scale, verbose, paged=False)


def check_paged_prefill(fn, case: str | ServingCase = "chunks", *, seed: int | None = None, device=None, dtype=None,
                        scale=None, logit_scale: float = 1.0, verbose: bool = True) -> None:
    """As :func:`check_varlen`, for ``fn(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
    max_seqlen_q[, scale=])`` on a paged case."""
    _check(fn, case, seed, device, dtype, scale, logit_scale, verbose, paged=True)


# ----------------------------------------------------------------------------- the bench
def _varlen_api():
    """PyTorch's varlen attention (FlashAttention-2's varlen kernel), or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_reference(causal: bool = True):
    """FlashAttention-2's varlen kernel through PyTorch (``torch.nn.attention.varlen.varlen_attn``), as a
    function of ``varlen_attention``'s arguments returning o. Where it takes no GQA, K and V are given with
    their heads repeated (built once, outside any timing: ``fn.prepare``)."""
    api = _varlen_api()
    if api is None:
        raise RuntimeError("this PyTorch has no torch.nn.attention.varlen.varlen_attn: the varlen reference "
                           "needs PyTorch >= 2.10")
    params = inspect.signature(api).parameters
    causal_kw = {"window_size": (-1, 0) if causal else (-1, -1)} if "window_size" in params else {"is_causal": causal}
    gqa = "enable_gqa" in params

    def prepare(k, v, Hq):
        if gqa or k.shape[1] == Hq:
            return k, v
        g = Hq // k.shape[1]
        return k.repeat_interleave(g, dim=1).contiguous(), v.repeat_interleave(g, dim=1).contiguous()

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, scale=None):
        return api(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **causal_kw, **({"enable_gqa": True} if gqa else {}))

    fn.prepare, fn.backend = prepare, "FLASH_ATTENTION"
    return fn


def packed_kv(inp: PagedPrefillInputs):
    """A paged batch's K/V as packed ``[total_k, Hkv, D]`` tensors and their offsets (the reference's input)."""
    ks, vs = zip(*(gather_kv(inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens, b)
                   for b in range(inp.seq_lens.shape[0])))
    k = torch.cat([t.transpose(0, 1) for t in ks]).contiguous()
    v = torch.cat([t.transpose(0, 1) for t in vs]).contiguous()
    return k, v, cu_seqlens(inp.seq_lens.tolist(), k.device), int(inp.seq_lens.max())


@dataclass(kw_only=True)
class ServingBenchResult(BenchResult):
    """facourse.bench's result; the reference ran on packed K/V (a paged case's gathered once, untimed)."""
    reference_input: str = "packed"


def bench_serving(fn, case: str | ServingCase = "prefill_mix", *, backend: str = "FLASH_ATTENTION",
                  dtype=torch.float16, rounds: int = 25, warmup: int = 5, seed: int = 0) -> ServingBenchResult:
    """Time ``fn`` (``varlen_attention`` or, on a paged case, ``paged_prefill``) against FlashAttention-2's
    varlen kernel through PyTorch on the same batch (``facourse.bench.time_calls``: the one timing method), in
    TFLOP/s of visible pairs. A paged case's reference reads the same K/V gathered into packed rows. GPU only."""
    from .bench import new_flush_buffer, time_calls

    require_gpu(what="benchmarking")
    if backend != "FLASH_ATTENTION":
        raise ValueError(f"step 15's reference is FlashAttention-2's varlen kernel (FLASH_ATTENTION), not {backend}")
    c = get_serving_case(case, "cuda")
    inp = make_serving_inputs(c, seed, "cuda", dtype)
    ref = varlen_reference(c.causal)
    q = inp.q.contiguous()
    if c.paged:
        k, v, cu_k, max_k = packed_kv(inp)
        student = (lambda: fn(*inp))
    else:
        k, v, cu_k, max_k = inp.k.contiguous(), inp.v.contiguous(), inp.cu_seqlens_k, inp.max_seqlen_k
        student = (lambda: fn(*inp, causal=c.causal))
    rk, rv = ref.prepare(k, v, q.shape[1])
    calls = {"s": student, "r": lambda: ref(q, rk, rv, inp.cu_seqlens_q, cu_k, inp.max_seqlen_q, max_k)}
    gpu, host = time_calls(calls, max(rounds, 20), new_flush_buffer(), warmup)
    ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
    fl = c.flops()
    return ServingBenchResult(config=c.describe(), gpu=gpu_name(), dtype=str(dtype).replace("torch.", ""),
                              backend=ref.backend, t_student_ms=ts, t_ref_ms=tr, tflops_student=fl / ts / 1e9,
                              tflops_ref=fl / tr / 1e9, ratio=tr / ts, host_student_us=statistics.median(host["s"]),
                              host_ref_us=statistics.median(host["r"]),
                              reference_input="packed, gathered from the pages" if c.paged else "packed")


__all__ = ["ServingCase", "SERVING_CASES", "CPU_SERVING_CASES", "PERF_SERVING_CASES", "VARLEN_CASES", "PAGED_CASES",
           "VarlenInputs", "PagedPrefillInputs", "cu_seqlens", "make_serving_inputs", "serving_reference",
           "validate_varlen_inputs", "validate_paged_prefill_inputs", "check_serving_result", "check_varlen",
           "check_paged_prefill", "varlen_reference", "packed_kv", "bench_serving", "get_serving_case", "serving_profile"]
