"""Step 09: decode against a paged KV cache — its cases, inputs, reference, check and bench.

The entry point is ``paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None) -> (o, lse)``:

* ``q [B, Hq, Sq, D]``: the last ``Sq`` tokens of each sequence (1 for plain decode, a few for
  speculative decoding), any strides with ``stride(-1) == 1``;
* ``k_cache``, ``v_cache [num_pages, page_size, Hkv, D]``: the pages of every sequence, shared;
* ``block_table [B, max_pages]`` (int32): sequence ``b``'s token ``t`` lives in page
  ``block_table[b, t // page_size]``, row ``t % page_size``; entries past a sequence's last page
  are padding and must not be read;
* ``seq_lens [B]`` (int32 or int64): the tokens of each sequence, ``Sq`` new ones included; 0 is
  an empty sequence (its rows give ``o = 0``, ``lse = -inf``);
* causal is bottom-right per sequence: query ``i`` of sequence ``b`` sees keys
  ``j <= i + seq_lens[b] - Sq`` (docs/DESIGN.md, "Tensor contract").

The check applies the course's correctness rule (``facourse.rule``) to each sequence. The inputs
are built to expose the classic faults: pages are shuffled and some are shared between sequences
(a prefix), the rows of a last page past ``seq_len``, the pages no sequence owns and the padding
entries of the block table all hold NaN, so a load that is not masked shows as NaN. The graded cases
draw every promise above, each in one test: the empty sequence (the only rows that see no key) is
``mixed``'s, Sq > 1 is ``spec``'s (4 new tokens, and 8 with int64 ``seq_lens``: ``check_paged_decode``'s
``Sq`` and ``lens_dtype``), so that one mistake costs one test.

The bench times a paged decode against SDPA on the same K/V stored contiguously, and reports the
rate at which K and V are read (GB/s): decode is bound by memory, not by FLOPs.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .bench import BenchResult
from .configs import default_dtype, resolve_device
from .hw import gpu_name, require_gpu
from .reference import AttentionInputError, default_scale, kv_head_index
from .rule import (ABS_SLACK, AttentionCheckError, Mistake, check_lse, compare, describe_rows, rel_limit_of,
                   diagnose, draw_seed, expect_tensor, guarded_call, is_collecting, make_tag, max_abs, say)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class DecodeCase:
    name: str
    seq_lens: tuple
    Hq: int
    Hkv: int
    D: int
    Sq: int
    page_size: int
    shared_prefix: int = 0       # tokens at the start of sequences 1, 2, ... stored in sequence 0's pages
    graded_perf: bool = False
    logit_scale: float = 1.0     # > 1: q is multiplied by it, logits in the hundreds overflow an unsafe exp
    lens_dtype: str = "int32"    # seq_lens' dtype: the contract takes int32 or int64

    @property
    def B(self) -> int:
        return len(self.seq_lens)

    def kv_bytes(self, dtype=torch.float16) -> int:
        """Bytes of K and V a decode must read: every token of every sequence, once per KV head
        (pages shared by a prefix count once per sequence that reads them)."""
        return 2 * sum(self.seq_lens) * self.Hkv * self.D * torch.finfo(dtype).bits // 8

    def flops(self) -> int:
        return sum(4 * self.Hq * self.D * sum(max(0, min(L, i + L - self.Sq + 1)) for i in range(self.Sq))
                   for L in self.seq_lens)

    def describe(self) -> str:
        lens = self.seq_lens if len(set(self.seq_lens)) > 1 else f"{self.B} x {self.seq_lens[0]}"
        lens = str(lens).replace(" ", "") if isinstance(lens, tuple) else lens
        extra = f", shared prefix {self.shared_prefix}" if self.shared_prefix else ""
        extra += f", logits x{self.logit_scale:g}" if self.logit_scale != 1.0 else ""
        extra += f", seq_lens {self.lens_dtype}" if self.lens_dtype != "int32" else ""
        return (f"{self.name} (seq_lens {lens}, Hq={self.Hq}, Hkv={self.Hkv}, Sq={self.Sq}, D={self.D}, "
                f"page {self.page_size}{extra})")


def _cases(lens: dict, Hq: int, Hkv: int, D: int, prefix: int) -> dict[str, DecodeCase]:
    c = {
        # lengths 0 to 32k in one batch: empty, one token, one page, one past a page, long ones
        "mixed": DecodeCase("mixed", lens["mixed"], Hq, Hkv, D, 1, 16),
        "page64": DecodeCase("page64", lens["page64"], Hq, Hkv, D, 1, 64),
        "page48": DecodeCase("page48", lens["page48"], Hq, Hkv, D, 1, 48),     # no power of two
        "prefix": DecodeCase("prefix", lens["prefix"], Hq, Hkv, D, 1, 16, shared_prefix=prefix),
        "mqa": DecodeCase("mqa", lens["page64"], Hq, 1, D, 1, 64),
        # 4 query tokens, causal (test_spec also draws it with 8 and int64 seq_lens); every length >= 8, so
        # that no row of it sees no key: those rows are mixed's alone (one mistake, one test)
        "spec": DecodeCase("spec", lens["spec"], Hq, Hkv, D, 4, 16),
        "d64": DecodeCase("d64", lens["page48"], Hq, Hkv, 64, 1, 16),       # Sq = 1: Sq > 1 is spec's alone
    }
    return c


#: On a GPU: fp16/bf16, GQA 32/8, D 128 (the contract's shapes).
DECODE_CASES = _cases({"mixed": (0, 1, 15, 16, 17, 1000, 4097, 32768),
                       "page64": (5, 64, 65, 2000, 8191, 300),
                       "page48": (47, 48, 49, 3000),
                       "prefix": (2000, 2100, 1500, 1024),
                       "spec": (8, 9, 17, 33, 1000, 4096)}, 32, 8, 128, prefix=1024)

#: On a CPU (Triton's interpreter): the same character at sizes it gets through in seconds.
CPU_DECODE_CASES = _cases({"mixed": (0, 1, 15, 16, 17, 100, 333, 700),
                           "page64": (5, 64, 65, 300),
                           "page48": (47, 48, 49, 200),
                           "prefix": (200, 230, 150, 128),
                           "spec": (8, 9, 17, 33, 130)}, 8, 2, 128, prefix=128)


def _perf_cases() -> dict[str, DecodeCase]:
    out = {}
    for B, L, tag in ((64, 8192, "b64_8k"), (16, 32768, "b16_32k"), (1, 131072, "b1_128k")):
        for ps in (16, 64):
            name = f"{tag}_p{ps}"
            out[name] = DecodeCase(name, (L,) * B, 32, 8, 128, 1, ps, graded_perf=True)
    return out


#: GPU only: the memory-bandwidth cases (uniform lengths, so that SDPA can run the same decode).
PERF_DECODE_CASES = _perf_cases()
#: The two that perf cells grade (thresholds in autograder/thresholds.toml).
GRADED_DECODE_CASES = ("b64_8k_p16", "b16_32k_p64")


def decode_profile(device=None) -> dict[str, DecodeCase]:
    return DECODE_CASES if resolve_device(device).type == "cuda" else CPU_DECODE_CASES


def get_decode_case(name: str | DecodeCase, device=None) -> DecodeCase:
    """A case by name, sized for ``device`` (full size on a GPU, the CPU profile otherwise)."""
    if isinstance(name, DecodeCase):
        return name
    if name in PERF_DECODE_CASES:
        return PERF_DECODE_CASES[name]
    cases = decode_profile(device)
    if name not in cases:
        raise KeyError(f"no decode case {name!r}; known: {', '.join([*cases, *PERF_DECODE_CASES])}")
    return cases[name]


# ----------------------------------------------------------------------------- inputs
class PagedInputs(NamedTuple):
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor


def pages_needed(L: int, page_size: int) -> int:
    return -(-L // page_size)


def _fixed_pages(table: torch.Tensor, seq_lens, page_size: int) -> list[tuple[int, int]]:
    """(sequence, logical page) pairs whose physical page is the logical page's own index."""
    return [(b, p) for b, L in enumerate(seq_lens) for p in range(pages_needed(L, page_size)) if int(table[b, p]) == p]


def make_paged_inputs(case: str | DecodeCase = "mixed", seed: int = 0, device=None, dtype=None) -> PagedInputs:
    """Seeded inputs of a case: q as a strided view of ``[B, Sq, Hq, D]`` storage; pages in shuffled
    order; with ``shared_prefix``, the first pages of every sequence are sequence 0's; every row no
    sequence owns (a last page's tail, spare pages, physical page 0 among them) and every padding entry's page
    holds NaN."""
    device = resolve_device(device)
    case = get_decode_case(case, device)
    dtype = dtype or default_dtype(device)
    g = torch.Generator().manual_seed(seed)
    ps, B = case.page_size, case.B
    shared = pages_needed(case.shared_prefix, ps) if case.shared_prefix else 0
    if case.shared_prefix and case.shared_prefix % ps:
        raise ValueError("shared_prefix must be a whole number of pages")
    own = [pages_needed(L, ps) - (shared if b > 0 and L >= case.shared_prefix else 0)
           for b, L in enumerate(case.seq_lens)]
    spare = 2                                          # pages nobody owns: NaN, the padding's target
    num_pages = sum(own) + spare
    max_pages = max(1, max(pages_needed(L, ps) for L in case.seq_lens)) + 1   # +1: padding to read past
    for _ in range(64):
        perm = torch.randperm(num_pages, generator=g)  # physical page of each logical page
        # physical page 0 is a spare (NaN): where a masked load of the block table (other=0) points
        zero = int((perm == 0).nonzero())
        perm[zero], perm[num_pages - 1] = perm[num_pages - 1].clone(), 0
        table = torch.empty(B, max_pages, dtype=torch.int32)
        table[:] = perm[num_pages - 1 - torch.randint(0, spare, (B, max_pages), generator=g)].to(torch.int32)
        nxt = 0
        for b, L in enumerate(case.seq_lens):
            n = pages_needed(L, ps)
            start = 0
            if b > 0 and case.shared_prefix and L >= case.shared_prefix:
                table[b, :shared] = table[0, :shared]
                start = shared
            table[b, start:n] = perm[nxt:nxt + n - start].to(torch.int32)
            nxt += n - start
        # no sequence's page p at physical page p: a kernel that ignores the block table is then wrong on every
        # sequence, and its NaN cannot pass for another mistake's on the sequences it happens to break
        if not _fixed_pages(table, case.seq_lens, ps):
            break
    else:
        raise RuntimeError(f"{case.name}: 64 draws of the block table each left a page at its own index")
    kv_shape = (num_pages, ps, case.Hkv, case.D)
    gd = g if device.type == "cpu" else torch.Generator(device).manual_seed(seed)   # big caches: drawn where they live
    k_cache = torch.randn(kv_shape, generator=gd, device=device)
    v_cache = torch.randn(kv_shape, generator=gd, device=device)
    owned = torch.zeros(num_pages, ps, dtype=torch.bool)            # rows that hold a token
    for b, L in enumerate(case.seq_lens):
        n = pages_needed(L, ps)
        if n:
            pages = table[b, :n].long()
            owned[pages[:-1]] = True
            owned[pages[-1], :L - (n - 1) * ps] = True
    owned = owned.to(device)
    k_cache[~owned] = float("nan")
    v_cache[~owned] = float("nan")
    q = (torch.randn(B, case.Sq, case.Hq, case.D, generator=g) * case.logit_scale).to(device=device, dtype=dtype)
    q = q.transpose(1, 2)
    return PagedInputs(q, k_cache.to(dtype), v_cache.to(dtype), table.to(device),
                       torch.tensor(case.seq_lens, dtype=getattr(torch, case.lens_dtype), device=device))


def gather_kv(k_cache, v_cache, block_table, seq_lens, b: int):
    """Sequence ``b``'s keys and values, contiguous: ``k, v [Hkv, L, D]``."""
    L = int(seq_lens[b])
    ps = k_cache.shape[1]
    pages = block_table[b, :pages_needed(L, ps)].long()
    k = k_cache.index_select(0, pages).flatten(0, 1)[:L]          # [L, Hkv, D]
    v = v_cache.index_select(0, pages).flatten(0, 1)[:L]
    return k.transpose(0, 1), v.transpose(0, 1)


def attend_sequence(q, k, v, scale, dtype, head_map=None, align="bottom_right", hi=None, lo=0):
    """One sequence: q [Hq, Sq, D], k, v [Hkv, n, D] -> o [Hq, Sq, D], lse [Hq, Sq] in ``dtype``. Keys
    ``lo <= j < hi`` (hi: n) are visible, the others loaded but masked; ``align`` the causal rule:
    "bottom_right" (j <= i + hi - Sq), "top_left" (j <= i) or None (shared with facourse.serving)."""
    Hq, Sq, _ = q.shape
    Hkv, n, _ = k.shape
    hi = n if hi is None else hi
    idx = (kv_head_index(Hq, Hkv) if head_map is None else head_map).to(q.device)
    qd, kd, vd = q.to(dtype), k.to(dtype).index_select(0, idx), v.to(dtype).index_select(0, idx)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale                       # [Hq, Sq, n]
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    visible = (j < hi) & (j >= lo)
    if align == "bottom_right":
        visible = visible & (j <= i + (hi - Sq))
    elif align == "top_left":
        visible = visible & (j <= i)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1) if n else torch.full((Hq, Sq), float("-inf"), dtype=dtype, device=q.device)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.matmul(p, vd), lse


def paged_reference(q, k_cache, v_cache, block_table, seq_lens, scale=None, *, dtype=None,
                    head_map=None, align="bottom_right", table=None, lens=None, keys_to=None):
    """Paged decode computed plainly, one sequence at a time: ``(o, lse)`` with ``o`` in ``dtype``
    (float64 on a CPU, float32 on a GPU) and ``lse`` float32 ``[B, Hq, Sq]``.

    ``head_map``, ``align`` (``"bottom_right"``, ``"top_left"`` or None), ``table`` and ``lens``
    replace the rule's head mapping, causal alignment, block table and lengths loaded; ``keys_to``
    (lengths) masks the keys loaded past them: the check computes the classic mistakes with them, to
    name the one a wrong result matches."""
    B, Hq, Sq, D = q.shape
    if dtype is None:
        dtype = torch.float32 if q.device.type == "cuda" else torch.float64
    scale = default_scale(D, scale)
    table = block_table if table is None else table
    outs, lses = [], []
    for b in range(B):
        k, v = gather_kv(k_cache, v_cache, table, seq_lens if lens is None else lens, b)
        o, lse = attend_sequence(q[b], k, v, scale, dtype, head_map, align, None if keys_to is None else int(keys_to[b]))
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses).float()


def _torch_rounding(q, k_cache, v_cache, block_table, seq_lens, scale, b: int):
    """PyTorch's SDPA on sequence ``b`` in the inputs' dtype: the rounding yardstick of rule 2."""
    k, v = gather_kv(k_cache, v_cache, block_table, seq_lens, b)
    Hq, Sq, D = q.shape[1:]
    L = k.shape[1]
    if L == 0:
        return torch.zeros(Hq, Sq, D, dtype=q.dtype, device=q.device)
    idx = kv_head_index(Hq, k.shape[0]).to(q.device)
    i = torch.arange(Sq, device=q.device)[:, None]
    mask = torch.arange(L, device=q.device)[None, :] <= i + (L - Sq)
    o = torch.nn.functional.scaled_dot_product_attention(
        q[b], k.index_select(0, idx), v.index_select(0, idx), attn_mask=mask, scale=scale)
    return torch.nan_to_num(o.masked_fill(~mask.any(-1)[None, :, None], 0.0), nan=0.0)


# ----------------------------------------------------------------------------- input errors
_VALIDATED: dict = {}


def validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale=None, *, head_dims=None) -> None:
    """Raise :class:`AttentionInputError` with a one-line explanation when the inputs break the
    contract: shapes, dtypes, devices, a block table too short for ``seq_lens``, page ids out of
    range.

    The checks of values (lengths, page ids) read ``seq_lens`` and ``block_table`` on the host, one
    synchronisation; they are done once for a given pair of tensors as long as neither is changed
    (an engine validates a batch once for all of its layers), so a decode step pays for it once."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise AttentionInputError(f"q must be [B, Hq, Sq, D], got shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must be [num_pages, page_size, Hkv, D], got shape {tuple(t.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise AttentionInputError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} "
                                  f"and {tuple(v_cache.shape)}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in DTYPES:
            raise AttentionInputError(f"{name} has dtype {t.dtype}; supported: fp16, bf16, fp32")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise AttentionInputError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, "
                                  f"{v_cache.dtype}")
    if block_table.dtype != torch.int32:
        raise AttentionInputError(f"block_table must be int32 (page ids), got {block_table.dtype}; "
                                  "pass block_table.to(torch.int32)")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise AttentionInputError(f"seq_lens must be int32 or int64, got {seq_lens.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}
    if len(devices) != 1:
        raise AttentionInputError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    B, Hq, Sq, D = q.shape
    num_pages, page_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise AttentionInputError(f"head dims differ: q has D={D}, the caches D={Dk}")
    if Hkv == 0 or Hq % Hkv:
        raise AttentionInputError(f"Hq={Hq} must be a multiple of the caches' Hkv={Hkv} (grouped-query attention)")
    if page_size < 1 or num_pages < 1:
        raise AttentionInputError(f"the caches hold no page (shape {tuple(k_cache.shape)})")
    if block_table.dim() != 2 or block_table.shape[0] != B:
        raise AttentionInputError(f"block_table must be [B, max_pages] = [{B}, ...], got {tuple(block_table.shape)}")
    if tuple(seq_lens.shape) != (B,):
        raise AttentionInputError(f"seq_lens must be [B] = [{B}], got {tuple(seq_lens.shape)}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale must be a positive finite number or None, got {scale!r}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise AttentionInputError(f"{name} has stride(-1) = {t.stride(-1)}: the head dimension must be "
                                      f"contiguous; pass {name}.contiguous()")
    if head_dims is not None and D not in head_dims:
        raise AttentionInputError(f"head dimension D={D} is not supported: one of {', '.join(map(str, head_dims))}")
    key = (id(block_table), block_table._version, block_table.data_ptr(), id(seq_lens), seq_lens._version,
           seq_lens.data_ptr(), num_pages, page_size, Sq)
    if _VALIDATED.get(key) == (block_table, seq_lens):
        return
    lens = seq_lens.tolist()
    bad = [(b, L) for b, L in enumerate(lens) if L < 0]
    if bad:
        raise AttentionInputError(f"seq_lens must be >= 0; sequence {bad[0][0]} has {bad[0][1]}")
    max_pages = block_table.shape[1]
    need = [pages_needed(L, page_size) for L in lens]
    if max(need, default=0) > max_pages:
        b = need.index(max(need))
        raise AttentionInputError(f"sequence {b} has seq_len {lens[b]}, {need[b]} pages of {page_size}, but the "
                                  f"block table has room for {max_pages} pages per sequence")
    cols = torch.arange(max_pages, device=block_table.device)[None, :]
    used = cols < torch.tensor(need, device=block_table.device)[:, None]
    ids = block_table[used]
    if ids.numel():
        lo, hi = ids.min().item(), ids.max().item()
        if lo < 0 or hi >= num_pages:
            where = torch.nonzero(used & ((block_table < 0) | (block_table >= num_pages)))[0].tolist()
            raise AttentionInputError(
                f"block_table[{where[0]}, {where[1]}] = {int(block_table[where[0], where[1]])} is not a page "
                f"id: the caches hold pages 0..{num_pages - 1}")
    if len(_VALIDATED) > 16:
        _VALIDATED.clear()
    _VALIDATED[key] = (block_table, seq_lens)


# ----------------------------------------------------------------------------- the check
LABELS = ("sequences", "query heads", "query rows")


def _where(bad: torch.Tensor, lens: list) -> str:
    """The one describer of a paged result: where ``bad [B, Hq, Sq]`` holds, and the wrong sequences' lengths."""
    seqs = torch.nonzero(bad.any(dim=(1, 2))).flatten().tolist()
    shown = ", ".join(f"{b}: {lens[b]}" for b in seqs[:6]) + (f" and {len(seqs) - 6} more" if len(seqs) > 6 else "")
    return f"{describe_rows(bad, LABELS)} (seq_len of each: {shown})"


def _mistakes(inp: PagedInputs, scale, ref_dtype) -> list[Mistake]:
    """The classic mistakes of a paged decode, each with the output it gives on these inputs (NaN where
    it reads a row no sequence owns)."""
    q, kc, vc, table, lens = inp
    B, Hq, Sq, D = q.shape
    Hkv, ps = kc.shape[2], kc.shape[1]

    def paged(**kw):
        s, read_q = kw.pop("scale", scale), kw.pop("q", lambda: q)
        return lambda: {"o": paged_reference(read_q(), kc, vc, table, lens, s, dtype=ref_dtype, **kw)[0]}

    out = []
    if lens.dtype == torch.int64:
        # an int32 pointer over int64 lengths: word b is the low half of length b // 2 (b even) or a high half, 0
        out.append(Mistake(
            "seq_lens is int64 here and was read as int32: sequence b got the b-th 32-bit word of its storage "
            "(the length of sequence b // 2, or 0), not its own length. The contract takes int32 or int64 "
            "seq_lens: load them through a pointer of their own dtype (pass the tensor itself, never "
            "seq_lens.view(torch.int32)), or convert them with seq_lens.to(torch.int32)",
            paged(lens=lens.view(torch.int32)[:B])))
    partial = (lens % ps != 0) & (lens > 0)
    if bool(partial.any()):
        whole = -(-lens // ps) * ps
        out.append(Mistake(
            "a last page is read past seq_len: its rows after the sequence's last token hold NaN here (as any "
            "stale data in a real cache), and a key that is loaded unmasked spoils the row even where its "
            "score is masked (0 * NaN in P V). Load K and V with the mask (key index < seq_len) and other=0.0, "
            "not (key index < the end of its page)", paged(lens=whole, keys_to=lens)))
    out.append(Mistake(
        "the block table is ignored: logical page p of a sequence was read from physical page p. Pages are "
        "shuffled and shared: token t of sequence b lives in row t % page_size of page "
        "block_table[b, t // page_size]", paged(table=torch.arange(table.shape[1], dtype=table.dtype,
                                                                   device=table.device).expand_as(table))))
    if Hkv < Hq and Hkv > 1:
        out.append(Mistake("the query heads map to the wrong KV head: query head h reads KV head h // (Hq // Hkv) "
                           "(the heads of a group are consecutive), not h % Hkv",
                           paged(head_map=torch.arange(Hq) % Hkv)))
    short = (lens // ps) * ps
    if bool((short != lens).any()):
        out.append(Mistake("the last, partial page is skipped: a sequence has ceil(seq_len / page_size) pages; "
                           "count the pages with a rounding-up division and mask the rows past seq_len",
                           paged(lens=short)))
    if Sq > 1:
        out.append(Mistake("the new query tokens do not mask each other: with Sq > 1, query i sees keys "
                           "j <= i + seq_len - Sq (bottom-right causal)", paged(align=None)))
        out.append(Mistake("the causal mask is aligned top-left (j <= i): the Sq query tokens are the *last* Sq "
                           "tokens of the sequence, so query i sees keys j <= i + seq_len - Sq",
                           paged(align="top_left")))
    out.append(Mistake("the scores are not scaled: S = scale * q k^T with scale = 1/sqrt(D) by default",
                       paged(scale=1.0)))
    out += _q_stride_mistakes(q, paged)
    return out


def _q_stride_mistakes(q, paged) -> list[Mistake]:
    """q read through strides it does not have: as a contiguous ``[B, Hq, Sq, D]`` tensor, or with D as the
    token stride (``q.stride(2)`` ignored). Neither differs from q's own with Sq = 1 or a contiguous q."""
    B, Hq, Sq, D = q.shape
    has = tuple(q.stride())
    fix = (f"q.stride() is {has} here: q may be any view with stride(-1) == 1. Pass q.stride(0), q.stride(1), "
           "q.stride(2) to the kernel and read q[b, h, i] at b * stride(0) + h * stride(1) + i * stride(2)")
    ways = {(Hq * Sq * D, Sq * D, D, 1): "as if it were a contiguous [B, Hq, Sq, D] tensor",
            (has[0], has[1], D, 1): "with D as the stride between its tokens (q.stride(2) ignored)"}
    out = []
    for strides, how in ways.items():
        if Sq == 1 or strides[:3] == has[:3]:
            continue

        def read(strides=strides):
            return torch.as_strided(q, q.shape, strides, q.storage_offset())  # raises past q's storage

        out.append(Mistake(f"q is read with the wrong strides, {how}: q[b, h, i] is read from another head's or "
                           f"token's row. {fix}", paged(q=read)))
    return out


NAN_CAUSE = ("the K/V rows past seq_len, the padding entries of the block table and the pages no sequence owns "
             "all hold NaN here: a load that is not masked, or a page that is not block_table[b, t // page_size], "
             "reads them. Mask K and V loads with (key index < seq_len) and other=0.0, find token t in row "
             "t % page_size of page block_table[b, t // page_size], and never follow a block-table entry past the "
             "sequence's last page")
#: the largest natural-log lse whose exp float32 holds (exp(88.7) is FLT_MAX)
EXP_LIMIT = math.log(torch.finfo(torch.float32).max)
OVERFLOW_CAUSE = ("the merge exponentiates lse without subtracting the max: these rows' logits reach the hundreds "
                  "(lse up to {top:.0f}) and exp(lse_s) overflows float32 past {limit:.1f}, giving inf / inf = NaN. "
                  "Weigh split s by w_s = exp(lse_s - M) with M = max_s lse_s, and take lse = M + log(sum_s w_s) "
                  "(a split's softmax likewise subtracts its running max before exp)")
EMPTY_CAUSE = ("these rows see no key (an empty sequence, or fewer tokens than Sq - i): o must be 0 and lse -inf. "
               "Guard the division by l when l == 0, and exp(m_old - m_new) while m is -inf; a merge of splits that "
               "all saw no key must give 0, not 0/0")


def _by_length(bad: torch.Tensor, L: list) -> str | None:
    """A merge fault shows only past one split: every short sequence right and every longer one wrong."""
    # a sequence of one token proves nothing: its rows see one key, o = that key's v whatever q and the scores
    ok = [L[b] for b in range(len(L)) if not bool(bad[b].any()) and L[b] > 1]
    wrong = [L[b] for b in range(len(L)) if bool(bad[b].any())]
    if ok and wrong and min(wrong) > max(ok):
        return (f"sequences up to {max(ok)} tokens are right and longer ones wrong: the part that only long "
                "sequences use is at fault, most likely the merge of the splits (each partial O must be rescaled "
                "by exp(m_split - m) before the sum, and divided by the merged l) or the loop over a split's pages")
    return None


def _same_rows(bad: torch.Tensor, L: list, G: int) -> str | None:
    """Some (head, token) rows wrong in every non-empty sequence, the same ones whatever its length: rows
    the kernel never computes (or addresses wrongly), not keys it reads wrongly."""
    seqs = [b for b in range(len(L)) if L[b] > 0]
    if len(seqs) < 2:
        return None
    first = bad[seqs[0]]
    if not bool(first.any()) or bool(first.all()) or any(not torch.equal(bad[b], first) for b in seqs[1:]):
        return None
    Sq = bad.shape[-1]
    return (f"the same query rows are wrong in every sequence, whatever its length: rows that are never computed "
            f"or are addressed wrongly, not keys read wrongly. A KV head's program must cover its G * Sq = {G * Sq} "
            f"rows (G = {G} query heads x Sq = {Sq} tokens; ROWS a power of two >= G * Sq, rows past G * Sq "
            "masked; the exercise's row r is head kvh * G + r // Sq, token r % Sq), and q and o be read and "
            "written through their strides")


def check_paged_result(o, lse, inp: PagedInputs, scale=None, *, config: str = "custom",
                       seed: int | None = None) -> dict:
    """Check ``(o, lse)`` computed from paged inputs against the reference, sequence by sequence, with the
    course's rule (``facourse.rule.compare``: PyTorch's own rounding of each sequence is its yardstick).

    Raises :class:`AttentionCheckError` with a teaching message; returns error figures otherwise."""
    tag = make_tag(config, seed)
    if is_collecting():
        return {}
    q, kc, vc, table, lens = inp
    B, Hq, Sq, D = q.shape
    expect_tensor(o, q, name="o", like_name="q", tag=tag, shape_note=" = [B, Hq, Sq, D]")     # lse: check_lse
    scale_v = default_scale(D, scale)
    ref, ref_lse = paged_reference(q, kc, vc, table, lens, scale)
    L = lens.tolist()
    empty = torch.isneginf(ref_lse)[..., None]                          # [B, Hq, Sq, 1]
    # the rule, sequence by sequence: each within twice PyTorch's own rounding of that sequence
    cmps = [compare(o[b], ref[b], lambda b=b: max_abs(_torch_rounding(q, kc, vc, table, lens, scale_v, b).to(ref.dtype)
                                                      - ref[b]),
                    name="o", tag=tag, empty=empty[b], rel_limit=None) for b in range(B)]
    top = max(max_abs(ref), 1e-30)
    nonfinite = torch.stack([c.nonfinite_rows for c in cmps])
    bad = torch.stack([c.bad_rows for c in cmps])
    allowed = torch.tensor([c.allowed for c in cmps], dtype=torch.float64)
    err = torch.tensor([c.max_err for c in cmps], dtype=torch.float64)
    worst = float(err.max())
    rel_limit = rel_limit_of(o.dtype)             # of the batch's largest reference value (1% in fp16)
    if worst / top >= rel_limit:
        err_rows = (o.detach().to(ref.dtype) - ref).abs().amax(-1).nan_to_num(0.0)
        bad = bad | (err_rows >= rel_limit * top)
    if not bad.any():
        lse_err = check_lse(lse, ref_lse, q, tag, labels=LABELS)
        b = int(torch.argmax(err / allowed))                            # the sequence closest to its limit
        return {"max_abs_err": float(err[b]), "allowed": float(allowed[b]), "seq": b, "lse_err": lse_err}
    found = diagnose({"o": o}, {"o"}, _mistakes(inp, scale, ref.dtype), float(allowed.max()))
    if nonfinite.any():
        only_empty = not bool((nonfinite & ~empty[..., 0]).any())
        # with a margin: an unsafe merge overflows in w_s * O_s a little before exp(lse) itself does
        only_large = not bool((nonfinite & ~(ref_lse.to(nonfinite.device) > EXP_LIMIT - 8.0)).any())
        cause = (found.cause if found else EMPTY_CAUSE if only_empty
                 else OVERFLOW_CAUSE.format(top=float(ref_lse.max()), limit=EXP_LIMIT) if only_large
                 else _same_rows(nonfinite, L, Hq // kc.shape[2]) or NAN_CAUSE)
        raise AttentionCheckError(f"{tag} o has NaN or inf at {_where(nonfinite, L)}.\n  likely cause: {cause}")
    not_empty = torch.stack([c.not_empty_rows for c in cmps])
    if not_empty.any():
        hint = (" With Sq > 1 the new tokens are the last Sq of the sequence (bottom-right causal): query i of a "
                "sequence of seq_len L sees keys j <= i + L - Sq, so rows i < Sq - L see none") if Sq > 1 else ""
        raise AttentionCheckError(f"{tag} rows that see no key must be exactly 0 (lse -inf), at "
                                  f"{_where(not_empty, L)}.{hint}" + (f"\n  likely cause: {found.cause}" if found else ""))
    cause = (found.cause if found else _by_length(bad, L) or _same_rows(bad, L, Hq // kc.shape[2])
             or "compare one wrong sequence with facourse.decode.paged_reference: check the page lookup "
                "(block_table[b, t // page_size], row t % page_size), the GQA head mapping, q's strides (q may be "
                "any view: read q[b, h, i] through q.stride()), the scale and the merge of the splits")
    raise AttentionCheckError(f"{tag} o is off by up to {worst:.3g} (allowed {float(allowed.max()):.3g}: twice "
                              f"PyTorch's own error in each sequence, plus {ABS_SLACK:g}; relative "
                              f"{worst / top:.3g}, must be < {rel_limit:g}) at {_where(bad, L)}.\n"
                              f"  likely cause: {cause}")


def check_paged_decode(fn, case: str | DecodeCase = "mixed", *, seed: int | None = None, device=None,
                       dtype=None, scale=None, logit_scale: float = 1.0, Sq: int | None = None,
                       lens_dtype: str | torch.dtype | None = None, verbose: bool = True) -> None:
    """Draw the inputs of ``case``, call ``fn(q, k_cache, v_cache, block_table, seq_lens[, scale=])`` and
    check ``(o, lse)`` with the course's rule. Raises :class:`AttentionCheckError` on failure (also when
    ``fn`` changes an input); prints one line on success and returns nothing. ``logit_scale`` > 1
    multiplies q: logits in the hundreds, which overflow a merge of splits that does not subtract the max.
    ``Sq`` (new tokens per sequence, 1 to 8) and ``lens_dtype`` (``seq_lens``' dtype, int32 or int64)
    replace the case's."""
    device = resolve_device(device)
    c = get_decode_case(case, device)
    if logit_scale != 1.0:
        c = replace(c, logit_scale=float(logit_scale))
    if Sq is not None:
        if not 1 <= int(Sq) <= 8:
            raise ValueError(f"Sq={Sq}: the contract's Sq is 1 to 8 new tokens")
        c = replace(c, Sq=int(Sq))
    if lens_dtype is not None:
        name = str(lens_dtype).replace("torch.", "")
        if name not in ("int32", "int64"):
            raise ValueError(f"lens_dtype={lens_dtype}: seq_lens are int32 or int64")
        c = replace(c, lens_dtype=name)
    seed = draw_seed(seed)
    inp = make_paged_inputs(c, seed, device, dtype)
    tag = f"[{c.name}]"
    result = guarded_call(fn, *inp, device=device, tag=tag, inputs=inp._asdict(),
                          untouched="a decode must leave its inputs untouched", **({} if scale is None else {"scale": scale}))
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AttentionCheckError(f"{tag} the function must return a pair (o, lse), got {type(result).__name__}")
    rep = check_paged_result(result[0], result[1], inp, scale, config=c.describe(), seed=seed)
    if rep and verbose:
        say(f"[{c.name}] passed: closest to its limit, sequence {rep['seq']} (seq_len {c.seq_lens[rep['seq']]}): "
            f"max|o-ref| {rep['max_abs_err']:.2e}, allowed {rep['allowed']:.2e} (twice PyTorch's own error + 1e-3); "
            f"lse err {rep['lse_err']:.2e}")


def bad_paged_inputs(seed: int = 0, device=None) -> list[tuple[str, tuple]]:
    """(what is wrong, arguments) pairs that break the contract in one way each."""
    device = resolve_device(device)
    base = get_decode_case("mixed", device)
    c = DecodeCase("bad_inputs", (40, 17, 5), base.Hq, base.Hkv, base.D, 1, 16)
    q, kc, vc, table, lens = make_paged_inputs(c, seed, device)
    too_long = lens.clone()
    too_long[0] = table.shape[1] * c.page_size + 1          # one token more than row 0 has pages for
    bad_id = table.clone()
    bad_id[0, 0] = kc.shape[0]                               # one past the last page
    return [("the same batch, valid", (q, kc, vc, table, lens)),
            ("a block table too short for seq_lens", (q, kc, vc, table, too_long)),
            ("a page id out of range", (q, kc, vc, bad_id, lens)),
            ("an int64 block table", (q, kc, vc, table.long(), lens)),
            ("float seq_lens", (q, kc, vc, table, lens.float()))]


def check_paged_bad_inputs(fn, *, seed: int | None = None, device=None, verbose: bool = True) -> None:
    """``fn`` accepts the valid batch of ``bad_paged_inputs`` (returns ``(o, lse)`` of the right shapes),
    and each of its broken variants makes ``fn`` raise :class:`AttentionInputError` (what
    ``validate_paged_inputs`` raises), with a message, before any kernel reads out of bounds. The valid
    batch's values are not judged here: they are the other tests' cause (one test, one cause)."""
    seed = draw_seed(seed)
    (_, valid), *bad = bad_paged_inputs(seed, device)
    try:
        result = guarded_call(fn, *valid, device=valid[0].device, tag="[bad_inputs]", inputs={})
    except AttentionInputError as err:
        raise AttentionCheckError(f"[bad_inputs] a valid batch was refused: {err}\n  likely cause: the "
                                  "validation is stricter than the contract (facourse.decode.validate_paged_inputs "
                                  "accepts this batch)") from None
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AttentionCheckError(f"[bad_inputs] the function must return a pair (o, lse), got {type(result).__name__}")
    q = valid[0]
    tag = "[bad_inputs, the valid batch]"
    expect_tensor(result[0], q, name="o", like_name="q", tag=tag)
    lse_like = torch.empty(0, dtype=torch.float32, device=q.device)
    expect_tensor(result[1], lse_like, name="lse", like_name="[B, Hq, Sq] float32", tag=tag, shape=q.shape[:-1])
    fix = "\n  likely cause: call facourse.decode.validate_paged_inputs(...) first in paged_decode"
    for what, args in bad:
        try:
            fn(*args)
            failure = f"the call returned instead of raising AttentionInputError.{fix}"
        except AttentionInputError as err:
            failure = None if str(err).strip() else "the error says nothing; say what is wrong"
            if verbose and not failure:
                say(f"[bad_inputs] {what}: {err}")
        except Exception as err:               # noqa: BLE001 (any other error is the finding)
            failure = f"the call raised {type(err).__name__} ({str(err)[:200]}), not AttentionInputError.{fix}"
        if failure and not is_collecting():    # the judge replays the calls and decides
            raise AttentionCheckError(f"[bad_inputs] {what}: {failure}") from None


# ----------------------------------------------------------------------------- the bench
def sdpa_decode(backend: str = "CUDNN_ATTENTION"):
    """SDPA decode on contiguous K/V ``[B, Hkv, L, D]`` with one backend: the G query heads of a KV head
    go in as G query rows of that head (``q.view(B, Hkv, G, D)``), so K and V are read once per KV head,
    as a GQA-packed kernel reads them. ``fn(q [B, Hq, 1, D], k, v) -> o``; ``fn.backend`` names what ran."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    used = backend
    if backend == "CUDNN_ATTENTION" and not torch.backends.cudnn.is_available():
        used = "FLASH_ATTENTION"
    kind = getattr(SDPBackend, used)

    def fn(q, k, v, scale=None):
        B, Hq, Sq, D = q.shape
        Hkv = k.shape[1]
        qg = q.reshape(B, Hkv, (Hq // Hkv) * Sq, D)
        with sdpa_kernel([kind]):
            o = torch.nn.functional.scaled_dot_product_attention(qg, k, v, scale=scale)
        return o.reshape(B, Hq, Sq, D)      # (the memory-efficient backend returns another layout)

    fn.backend = used
    return fn


#: SDPA's backends that run a decode; "FASTEST" (the graded reference) is whichever is fastest here.
DECODE_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def fastest_decode_backend(q, k, v, rounds: int = 5) -> str:
    """The SDPA backend that runs this decode fastest on this GPU (the same timing, a few rounds):
    no one backend wins everywhere (on an H100, cuDNN's decode of one 128k sequence is far slower
    than FlashAttention-2's; see benchmarks/README.md, step 09)."""
    from .bench import new_flush_buffer, time_calls

    calls = {}
    for name in DECODE_BACKENDS:
        fn = sdpa_decode(name)
        try:
            fn(q, k, v)
            torch.cuda.synchronize()
        except RuntimeError:                       # this backend does not run this shape here
            continue
        if fn.backend == name:
            calls[name] = (lambda fn=fn: fn(q, k, v))
    gpu, _ = time_calls(calls, rounds, new_flush_buffer(), warmup=2)
    return min(gpu, key=lambda n: statistics.median(gpu[n]))


def contiguous_kv(inp: PagedInputs):
    """The same K/V as ``[B, Hkv, L, D]`` tensors (uniform lengths only)."""
    lens = inp.seq_lens.tolist()
    if len(set(lens)) != 1:
        raise ValueError("contiguous K/V needs one length for every sequence")
    ks, vs = zip(*(gather_kv(inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens, b) for b in range(len(lens))))
    return torch.stack(ks).contiguous(), torch.stack(vs).contiguous()


@dataclass(kw_only=True)
class DecodeBenchResult(BenchResult):
    """facourse.bench's result, with the decode's own figure: the rate K and V are read at."""
    gbps_student: float       # bytes of K and V per second (GB/s)
    gbps_ref: float
    kv_bytes: int

    def summary(self) -> str:
        return (f"{self.config} on {self.gpu}, {self.dtype}: student {self.gbps_student:.0f} GB/s of K/V "
                f"({self.t_student_ms:.3f} ms), SDPA {self.backend} on contiguous K/V {self.gbps_ref:.0f} GB/s "
                f"({self.t_ref_ms:.3f} ms): {self.ratio:.2f}x the reference")


def bench_decode(fn, case: str | DecodeCase = "b64_8k_p16", *, backend: str = "FASTEST",
                 dtype=torch.float16, rounds: int = 25, warmup: int = 5, seed: int = 0) -> DecodeBenchResult:
    """Time the paged decode ``fn`` against SDPA's ``backend`` on the same K/V stored contiguously
    (``facourse.bench.time_calls``: the one timing method). ``backend="FASTEST"``: the fastest of
    ``DECODE_BACKENDS`` on this shape and GPU, named in the result. GPU only."""
    from .bench import new_flush_buffer, time_calls

    require_gpu(what="benchmarking")
    c = get_decode_case(case, "cuda")
    inp = make_paged_inputs(c, seed, "cuda", dtype)
    k, v = contiguous_kv(inp)
    q = inp.q.contiguous()
    if backend == "FASTEST":
        backend = fastest_decode_backend(q, k, v)
    ref = sdpa_decode(backend)
    calls = {"s": lambda: fn(*inp), "r": lambda: ref(q, k, v)}
    gpu, host = time_calls(calls, max(rounds, 20), new_flush_buffer(), warmup)
    ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
    nbytes = c.kv_bytes(dtype)
    return DecodeBenchResult(config=c.describe(), gpu=gpu_name(), dtype=str(dtype).replace("torch.", ""),
                             backend=ref.backend, t_student_ms=ts, t_ref_ms=tr, tflops_student=c.flops() / ts / 1e9,
                             tflops_ref=c.flops() / tr / 1e9, ratio=tr / ts, host_student_us=statistics.median(host["s"]),
                             host_ref_us=statistics.median(host["r"]), gbps_student=nbytes / ts / 1e6,
                             gbps_ref=nbytes / tr / 1e6, kv_bytes=nbytes)


def copy_rate_gbps(nbytes: int = 1 << 30, rounds: int = 20) -> float:
    """A device-to-device copy's rate on this GPU, counting what it reads and what it writes (GB/s)."""
    from .bench import new_flush_buffer, time_calls

    require_gpu(what="measuring the copy rate")
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gpu, _ = time_calls({"copy": lambda: dst.copy_(src)}, rounds, new_flush_buffer())
    return 2 * nbytes / statistics.median(gpu["copy"]) / 1e6


__all__ = ["DecodeCase", "DECODE_CASES", "CPU_DECODE_CASES", "PERF_DECODE_CASES", "GRADED_DECODE_CASES",
           "PagedInputs", "make_paged_inputs", "gather_kv", "paged_reference", "validate_paged_inputs",
           "check_paged_result", "check_paged_decode", "bad_paged_inputs", "check_paged_bad_inputs", "sdpa_decode", "bench_decode", "copy_rate_gbps",
           "get_decode_case", "decode_profile", "pages_needed"]
