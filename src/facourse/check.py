"""The one correctness check of the course (docs/DESIGN.md, "Correctness rule").

A result passes when all hold:
  1. it is finite where the reference is defined, and -inf/0 exactly where a row sees no key;
  2. max|o - ref| <= 2 · max|o_torch - ref| + 1e-3, with o_torch PyTorch's attention in the
     same dtype (no worse than twice the framework's own rounding);
  3. max|o - ref| / max|ref| < 1e-2;
  4. it is not degenerate (not ≈ 0, not ≈ mean of V), and every element was written: new
     allocations made during the call are filled with NaN, so an unwritten element shows.
A failure raises :class:`AttentionCheckError` (an ``AssertionError``) whose message names the
configuration, the wrong rows and heads, and the most likely cause.
"""
from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass, field

import torch

from .configs import AttnConfig, get_config, make_inputs
from .reference import default_scale, reference_attention, torch_attention

from .rule import (ABS_SLACK, REL_LIMIT, AttentionCheckError, CheckError, check_lse, collecting,  # noqa: F401
                   describe_rows, is_collecting, masked_attention, max_abs, nan_filled_allocations,
                   normalise_result, ranges, verifying)


@dataclass
class CheckReport:
    config: str
    max_abs_err: float
    allowed_abs_err: float
    rel_err: float
    torch_abs_err: float
    lse_max_err: float | None = None
    seed: int | None = None
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        lse = "" if self.lse_max_err is None else f", lse err {self.lse_max_err:.2e}"
        return (f"[{self.config}] passed: max|o-ref| {self.max_abs_err:.2e} "
                f"(allowed {self.allowed_abs_err:.2e}), relative {self.rel_err:.2e}{lse}")


# the names other modules imported before facourse.rule held them
_max_abs, _ranges, _masked_attention, _normalise = max_abs, ranges, masked_attention, normalise_result


def _check_lse(lse, ref_lse, q, tag) -> float:
    return check_lse(lse, ref_lse, q, tag)


def _fmt_rows(bad_rows: torch.Tensor, Sq: int) -> str:
    return describe_rows(bad_rows)


# ----------------------------------------------------------------------------- diagnosis
LN2 = 0.6931471805599453

DIAGONAL_CAUSE = ("the diagonal is masked out: every row misses the one key on its own diagonal, "
                  "j = i + (Skv - Sq). The causal mask hides keys with j > i + (Skv - Sq) (strictly "
                  "greater); `>=` hides the diagonal too (and leaves row 0 of a square problem with no key)")


def _variants(q, k, v, causal, scale):
    """Outputs of common mistakes, to name the likely cause of a wrong result."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    s = default_scale(D, scale)
    out = []
    if causal and Sq != Skv:
        out.append(("top-left causal alignment: you masked j > i (PyTorch's is_causal). This course "
                    "aligns causal masks bottom-right: key j is visible to query i iff "
                    "j <= i + (Skv - Sq), as a prefill against a KV cache needs",
                    lambda: reference_attention(q, k, v, True, s, align="top_left")[0]))
    if causal:
        out.append(("the causal mask is missing: every query sees every key",
                    lambda: reference_attention(q, k, v, False, s)[0]))
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        out.append((DIAGONAL_CAUSE, lambda: _masked_attention(q, k, v, s, j < i + (Skv - Sq))))
    else:
        out.append(("a causal mask was applied to a non-causal call",
                    lambda: reference_attention(q, k, v, True, s)[0]))
    if Hkv > 1 and Hq != Hkv:
        out.append((f"query head h reads KV head h % Hkv; with GQA it must read h // (Hq // Hkv) "
                    f"= h // {Hq // Hkv}",
                    lambda: reference_attention(q, k, v, causal, s,
                                                head_map=torch.arange(Hq) % Hkv)[0]))
    out.append(("the softmax scale is missing: multiply Q Kᵀ by scale (default 1/sqrt(D))",
                lambda: reference_attention(q, k, v, causal, 1.0)[0]))
    out.append(("the scale qk_scale is never applied: exp2(s - m) of the raw scores Q Kᵀ is a softmax "
                "with scale ln 2, not scale = 1/sqrt(D). Multiply the scores by qk_scale = scale * log2(e) "
                "both in the row max and in the exponent",
                lambda: reference_attention(q, k, v, causal, LN2)[0]))
    out.append(("the scale is off by ln 2: exp2 is used with scale alone; fold log2(e) into it, "
                "qk_scale = scale * log2(e), so that exp2(s * qk_scale - m) = exp(scale * s - m')",
                lambda: reference_attention(q, k, v, causal, s * LN2)[0]))
    if scale is not None:
        out.append(("the scale argument was ignored: 1/sqrt(D) was used instead",
                    lambda: reference_attention(q, k, v, causal, None)[0]))
    out.append(("the scale is applied twice", lambda: reference_attention(q, k, v, causal, s * s)[0]))
    return out


def _without_alpha(q, k, v, causal, scale, block_n: int):
    """Online softmax over key tiles of ``block_n`` that forgets to rescale the accumulator by
    alpha = exp(m_old - m_new), the classic bug. Returns two outputs: with the running sum l
    rescaled correctly, and with l not rescaled either."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    idx = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    dt = torch.float32 if q.device.type == "cuda" else torch.float64
    S = torch.matmul(q.to(dt), k.to(dt).index_select(1, idx).transpose(-1, -2)) * default_scale(D, scale)
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        S = S.masked_fill(j > i + (Skv - Sq), float("-inf"))
    V = v.to(dt).index_select(1, idx)
    m = torch.full((B, Hq, Sq, 1), float("-inf"), dtype=dt, device=q.device)
    l_good, l_bad = torch.zeros_like(m), torch.zeros_like(m)
    acc = torch.zeros(B, Hq, Sq, D, dtype=dt, device=q.device)
    for j0 in range(0, Skv, block_n):
        s = S[..., j0:j0 + block_n]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        rowsum = p.sum(-1, keepdim=True)
        l_good = torch.exp(m - safe) * l_good + rowsum
        l_bad = l_bad + rowsum
        acc = acc + torch.matmul(p, V[..., j0:j0 + block_n, :])   # the bug: no alpha * acc
        m = m_new
    one = torch.ones_like(m)
    return acc / torch.where(l_good == 0, one, l_good), acc / torch.where(l_bad == 0, one, l_bad)


def _diagnose(o, ref, q, k, v, causal, scale, tol, bad_rows, cfg_name) -> str:
    o64 = o.to(torch.float64)
    # a mistake's output, computed in float32 or float64, matches o to the check's tolerance plus the
    # rounding of o's own dtype (an ulp at each element's size): rows of a mistake that see few keys
    # (top-left causal on Sq < Skv) are values of V, larger than the right answer's averages
    ulp = torch.finfo(o.dtype).eps if o.dtype in (torch.float16, torch.bfloat16) else 0.0

    def matches(alt) -> bool:
        alt = alt.to(torch.float64)
        return _max_abs(((o64 - alt).abs() - ulp * alt.abs()).clamp(min=0)) <= tol
    if _max_abs(o64) <= 1e-6:
        return "the output is all zeros: was the result written back, and normalised by l?"
    Hq, Hkv = q.shape[1], k.shape[1]
    idx = torch.arange(Hq).to(q.device) // (Hq // Hkv)
    mean_v = v.to(torch.float64).index_select(1, idx).mean(dim=2, keepdim=True).expand_as(ref)
    if _max_abs(o64 - mean_v) <= tol:
        return ("the output is the mean of V: every key got the same weight. Are the scores "
                "computed from Q Kᵀ, and is the softmax taken over the key dimension (dim=-1)?")
    for cause, fn in _variants(q, k, v, causal, scale):
        try:
            alt = fn()
        except Exception:  # a variant that cannot be formed says nothing
            continue
        if matches(alt):
            return cause
    Skv = k.shape[2]
    for bn in (16, 32, 64, 128):      # 16: the tiles of the CPU stand-in of TileLang (step 11)
        if bn >= Skv:
            break
        for rescale_l, alt in zip((True, False), _without_alpha(q, k, v, causal, scale, bn)):
            if matches(alt):
                return (f"the output matches online softmax over key tiles of {bn} that does not "
                        f"rescale the accumulator{'' if rescale_l else ' and the running sum'} by "
                        "alpha = exp(m_old - m_new) when the running max grows: acc = alpha * acc + P V")
    rows = torch.nonzero(bad_rows.any(dim=(0, 1))).flatten().tolist()
    Sq = q.shape[2]
    if rows and rows[0] > 0 and rows == list(range(rows[0], rows[-1] + 1)) and rows[-1] == Sq - 1:
        return (f"rows 0-{rows[0] - 1} are right and every row from {rows[0]} on is wrong: a block "
                "boundary? Check that the loop over tiles covers all of them, and that the "
                "accumulator is rescaled by alpha = exp(m_old - m_new) when the running max changes")
    if get_overflow_hint(q, k, scale):
        return ("the logits here are in the hundreds, where fp16 keeps only about 3 significant "
                "digits: compute S = scale * Q K^T and the softmax in float32 (as tensor-core "
                "kernels accumulate), subtracting the row max before exp()")
    good_rows = Sq - len(rows)
    if 0 < good_rows and len(rows) < Sq:
        return ("only some rows are wrong: look at the boundaries of your tiles (masks for the last, "
                "partial tile; the diagonal tile of a causal mask) and at the running max and sum")
    return ("every row is wrong: check the scores (Q Kᵀ times scale), the softmax over keys "
            "(dim=-1), the normalisation by the row sum, and the final P V")


# ----------------------------------------------------------------------------- the check
def check_attention(o, q, k, v, causal: bool = False, scale=None, lse=None, *,
                    config: str = "custom", seed: int | None = None, diagnose=None) -> CheckReport:
    """Check ``o`` (and ``lse`` if given) computed from q, k, v against the reference.

    Raises :class:`AttentionCheckError` with a teaching message; returns a report otherwise.
    ``diagnose(o, bad_rows)`` (a step's own diagnosis: step 12's ranks) is asked for the likely
    cause of wrong values before the course's usual ones; it returns a sentence or None.
    """
    tag = f"[{config}]" + ("" if seed is None else f" (seed {seed})")
    if is_collecting():
        return CheckReport(config, 0.0, 0.0, 0.0, 0.0, seed=seed)
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    if not isinstance(o, torch.Tensor):
        raise AttentionCheckError(f"{tag} the output must be a torch.Tensor, got {type(o).__name__}")
    if tuple(o.shape) != tuple(q.shape):
        raise AttentionCheckError(f"{tag} the output has shape {tuple(o.shape)}; it must have q's shape "
                                  f"{tuple(q.shape)} = [B, Hq, Sq, D]")
    if o.dtype != q.dtype:
        raise AttentionCheckError(f"{tag} the output has dtype {o.dtype}; it must have q's dtype {q.dtype}")
    if o.device != q.device:
        raise AttentionCheckError(f"{tag} the output is on {o.device}; it must stay on {q.device}")

    ref, ref_lse = reference_attention(q, k, v, causal, scale)
    empty = torch.isneginf(ref_lse)                       # [B, Hq, Sq]: rows with no visible key
    o64 = o.detach().to(torch.float64)

    # Rule 1: finite everywhere; rows with no visible key are exactly zero.
    nonfinite = ~torch.isfinite(o64).all(dim=-1)
    if nonfinite.any():
        where = _fmt_rows(nonfinite, Sq)
        one_key = None
        if causal:
            i = torch.arange(Sq)[:, None]
            j = torch.arange(Skv)[None, :]
            one_key = ((j <= i + (Skv - Sq)).sum(dim=-1) == 1).to(nonfinite.device)   # [Sq]
        bad_r, empty_r = nonfinite.any(dim=(0, 1)), empty.any(dim=(0, 1))
        if (one_key is not None and bool((bad_r & one_key).any())
                and not bool((bad_r & ~one_key & ~empty_r).any())):       # rows with one key (and empty ones)
            cause = (DIAGONAL_CAUSE.replace("row 0 of a square problem", "these rows") +
                     "; a row that sees no key must also give 0, not NaN (guard m = -inf)")
        elif empty.any() and bool((nonfinite & ~empty).sum() == 0):
            cause = ("these rows see no key (Sq > Skv with bottom-right causal): their output must be "
                     "0 and their lse -inf. Guard the division by l (l == 0) and the exp(m_old - m_new) "
                     "of a row whose max is still -inf")
        elif get_overflow_hint(q, k, scale):
            cause = ("the logits here are in the hundreds: exp() overflows unless you subtract the "
                     "row max before exponentiating (safe softmax)")
        elif bool(torch.isnan(o64).all(dim=-1)[:, :, nonfinite.any(dim=(0, 1))].all()):
            rows = torch.nonzero(nonfinite.any(dim=(0, 1))).flatten().tolist()
            cause = (f"whole query rows ({_ranges(rows)}) were never written, in every head: NaN is what the "
                     "check fills new allocations with. A query tile is missing: the loop over query tiles "
                     "must include the last, partial one (range(0, Sq, block_m), the tile clipped at Sq), "
                     "and a launch grid needs cdiv(Sq, BLOCK_M) programs along the query axis, not "
                     "Sq // BLOCK_M")
        else:
            cause = ("either these elements were never written (the check fills new allocations with "
                     "NaN: does your grid or loop cover every row and every column of D?) or the "
                     "softmax produced inf/inf or 0/0")
        raise AttentionCheckError(f"{tag} NaN or inf in the output at {where}.\n  likely cause: {cause}")
    if empty.any():
        leak = (o64.abs().amax(dim=-1) > 0) & empty
        if leak.any():
            raise AttentionCheckError(
                f"{tag} rows that see no key must be exactly 0, but {_fmt_rows(leak, Sq)} are not.\n"
                "  likely cause: with Sq > Skv the first Sq - Skv rows are fully masked; write zeros "
                "there (and lse = -inf) instead of a softmax over nothing")

    # Rules 2 and 3: within twice PyTorch's own rounding, and 1% relative.
    o_torch = torch_attention(q, k, v, causal, scale).to(torch.float64)
    torch_err = _max_abs(o_torch - ref)
    allowed = 2.0 * torch_err + ABS_SLACK
    err = o64 - ref
    max_err = _max_abs(err)
    ref_max = max(_max_abs(ref), 1e-30)
    rel = max_err / ref_max
    if max_err > allowed or rel >= REL_LIMIT:
        row_err = err.abs().amax(dim=-1)                  # [B, Hq, Sq]
        bad_rows = row_err > allowed
        flat = int(torch.argmax(err.abs()))
        b, h, i, d = (int(x) for x in torch.unravel_index(torch.tensor(flat), err.shape))
        cause = ((diagnose(o, bad_rows) if diagnose else None)
                 or _diagnose(o, ref, q, k, v, causal, scale, allowed, bad_rows, config))
        raise AttentionCheckError(
            f"{tag} wrong values: max|o - ref| = {max_err:.3g}, allowed {allowed:.3g} "
            f"(twice PyTorch's own {str(q.dtype).replace('torch.', '')} error {torch_err:.2g}, "
            f"plus {ABS_SLACK:g}); relative {rel:.3g} (must be < {REL_LIMIT:g}).\n"
            f"  wrong at {_fmt_rows(bad_rows, Sq)}\n"
            f"  worst element: b={b}, h={h}, row={i}, d={d}: got {float(o64[b, h, i, d]):.4g}, "
            f"expected {float(ref[b, h, i, d]):.4g}\n"
            f"  likely cause: {cause}")

    # Rule 4: not degenerate. With the inputs make_inputs draws, the reference is neither ≈ 0 nor
    # ≈ mean(V); a result within tolerance of the reference is therefore neither. Guard the premise.
    if ref_max < 10 * allowed:
        raise AttentionCheckError(f"{tag} the inputs are degenerate (max|ref| = {ref_max:.3g}); "
                                  "draw them with facourse.make_inputs")

    report = CheckReport(config, max_err, allowed, rel, torch_err, seed=seed)

    if lse is not None:
        report.lse_max_err = _check_lse(lse, ref_lse, q, tag)
    return report


def get_overflow_hint(q, k, scale) -> bool:
    """True when the logits are large (std above 10): exp() of them overflows fp16 and fp32."""
    s = default_scale(q.shape[-1], scale)
    std = float(q.detach().float().std()) * float(k.detach().float().std()) * q.shape[-1] ** 0.5 * s
    return std > 10.0


def check_entry_point(fn, config: str | AttnConfig = "small", *, seed: int | None = None,
                      device=None, dtype=None, layout: str = "bshd", expect_lse: bool = False,
                      scale=None, verbose: bool = True) -> None:
    """Draw inputs for ``config``, call ``fn(q, k, v, causal=..., scale=...)`` and check the result.

    ``config`` is a name (sized for the device: full size on a GPU, the CPU profile otherwise), or
    an :class:`AttnConfig`. A fresh seed is drawn when none is given. Raises
    :class:`AttentionCheckError` on failure, and also when ``fn`` modifies its inputs. Prints a
    one-line summary on success.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = config if isinstance(config, AttnConfig) else get_config(config, device)
    seed = secrets.randbits(31) if seed is None else seed
    q, k, v = make_inputs(cfg, seed, device, dtype, layout)
    tag = f"[{cfg.name}]"
    copies = [t.clone() for t in (q, k, v)]
    kwargs = {"causal": cfg.causal}
    if scale is not None:
        kwargs["scale"] = scale
    with nan_filled_allocations(device), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(q, k, v, **kwargs)
    # nbgrader scores a test cell 0 when anything reaches stderr: report warnings on stdout.
    for w in {str(w.message) for w in caught}:
        print(f"note: the call raised a warning: {w}")
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    for name, t, c in zip("qkv", (q, k, v), copies):
        if not torch.equal(t, c):
            raise AttentionCheckError(f"{tag} {name} was modified by the call: an attention function "
                                      "must leave its inputs untouched")
    o, lse = _normalise(result, expect_lse, tag)
    report = check_attention(o, q, k, v, cfg.causal, scale, lse, config=cfg.describe(), seed=seed)
    if verbose and not is_collecting():
        print(report.summary())
    # Returns nothing on purpose: nbgrader reads a test cell's displayed value as partial credit.


def check_all(fn, *, expect_lse: bool = True, dtypes=None, device=None, verbose: bool = True,
              seed: int | None = None) -> None:
    """``check_entry_point`` on the five configurations and every edge case, in each dtype:
    fp16 and bf16 on a GPU, fp16 on the CPU (where Triton's interpreter mis-multiplies bf16)."""
    from .configs import EDGE_CASES, profile

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtypes is None:
        dtypes = (torch.float16, torch.bfloat16) if torch.device(device).type == "cuda" else (torch.float16,)
    names = [(dt, name) for dt in dtypes for name in [*profile(device), *EDGE_CASES]]
    for i, (dt, name) in enumerate(names):
        check_entry_point(fn, name, device=device, dtype=dt, expect_lse=expect_lse, verbose=verbose,
                          seed=None if seed is None else (seed + i) % 2**31)
