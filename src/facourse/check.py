"""The attention forward's check (steps 01 and 04-07): its reference, its mistakes, on the one rule.

The rule itself (docs/DESIGN.md, "Correctness rule") lives in :mod:`facourse.rule`:
  1. finite where the reference is defined, and 0 (lse -inf) exactly where a row sees no key;
  2. max|o - ref| <= 2 · max|o_torch - ref| + 1e-3, with o_torch PyTorch's attention in the
     same dtype (no worse than twice the framework's own rounding);
  3. max|o - ref| / max|ref| < 1e-2;
  4. not degenerate (not ≈ 0, not ≈ mean of V), and every element written: the guarded call
     fills new allocations with NaN, so an unwritten element shows.
Here are the forward's cases (``check_entry_point``, ``check_all``), its reference
(``reference_attention``, ``torch_attention``) and its classic mistakes (:func:`attention_mistakes`).
A failure raises :class:`AttentionCheckError` (an ``AssertionError``) whose message names the
configuration, the wrong rows and heads, and the most likely cause.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .configs import AttnConfig, get_config, make_inputs
from .reference import default_scale, reference_attention, torch_attention
from .rule import (ABS_SLACK, REL_LIMIT, AttentionCheckError, CheckError, Mistake, check_lse,  # noqa: F401
                   collecting, compare, describe_rows, draw_seed, expect_tensor, guarded_call, is_collecting,
                   make_tag, masked_attention, max_abs, nan_filled_allocations, normalise_result, ranges, say,
                   verifying)
from .rule import diagnose as find_mistake


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


# ----------------------------------------------------------------------------- mistakes
LN2 = 0.6931471805599453

DIAGONAL_CAUSE = ("the diagonal is masked out: every row misses the one key on its own diagonal, "
                  "j = i + (Skv - Sq). The causal mask hides keys with j > i + (Skv - Sq) (strictly "
                  "greater); `>=` hides the diagonal too (and leaves row 0 of a square problem with no key)")


def _o(fn):
    return lambda: {"o": fn()}


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


def attention_mistakes(q, k, v, causal, scale) -> list[Mistake]:
    """The forward's classic mistakes on these inputs, most telling first; each breaks ``o``."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    s = default_scale(D, scale)
    idx = (torch.arange(Hq) // (Hq // Hkv)).to(q.device)
    out = [
        Mistake("the output is all zeros: was the result written back, and normalised by l?",
                _o(lambda: torch.zeros(q.shape, dtype=torch.float64, device=q.device))),
        Mistake("the output is the mean of V: every key got the same weight. Are the scores computed from "
                "Q Kᵀ, and is the softmax taken over the key dimension (dim=-1)?",
                _o(lambda: v.to(torch.float64).index_select(1, idx).mean(dim=2, keepdim=True).expand(q.shape))),
    ]
    if causal and Sq != Skv:
        out.append(Mistake("top-left causal alignment: you masked j > i (PyTorch's is_causal). This course "
                           "aligns causal masks bottom-right: key j is visible to query i iff "
                           "j <= i + (Skv - Sq), as a prefill against a KV cache needs",
                           _o(lambda: reference_attention(q, k, v, True, s, align="top_left")[0])))
    if causal:
        out.append(Mistake("the causal mask is missing: every query sees every key",
                           _o(lambda: reference_attention(q, k, v, False, s)[0])))
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        out.append(Mistake(DIAGONAL_CAUSE, _o(lambda: masked_attention(q, k, v, s, j < i + (Skv - Sq)))))
    else:
        out.append(Mistake("a causal mask was applied to a non-causal call",
                           _o(lambda: reference_attention(q, k, v, True, s)[0])))
    if Hkv > 1 and Hq != Hkv:
        out.append(Mistake(f"query head h reads KV head h % Hkv; with GQA it must read h // (Hq // Hkv) "
                           f"= h // {Hq // Hkv}",
                           _o(lambda: reference_attention(q, k, v, causal, s, head_map=torch.arange(Hq) % Hkv)[0])))
    out.append(Mistake("the softmax scale is missing: multiply Q Kᵀ by scale (default 1/sqrt(D))",
                       _o(lambda: reference_attention(q, k, v, causal, 1.0)[0])))
    out.append(Mistake("the scale qk_scale is never applied: exp2(s - m) of the raw scores Q Kᵀ is a softmax "
                       "with scale ln 2, not scale = 1/sqrt(D). Multiply the scores by qk_scale = scale * log2(e) "
                       "both in the row max and in the exponent",
                       _o(lambda: reference_attention(q, k, v, causal, LN2)[0])))
    out.append(Mistake("the scale is off by ln 2: exp2 is used with scale alone; fold log2(e) into it, "
                       "qk_scale = scale * log2(e), so that exp2(s * qk_scale - m) = exp(scale * s - m')",
                       _o(lambda: reference_attention(q, k, v, causal, s * LN2)[0])))
    if scale is not None:
        out.append(Mistake("the scale argument was ignored: 1/sqrt(D) was used instead",
                           _o(lambda: reference_attention(q, k, v, causal, None)[0])))
    out.append(Mistake("the scale is applied twice", _o(lambda: reference_attention(q, k, v, causal, s * s)[0])))
    for bn in (16, 32, 64, 128):      # 16: the tiles of the CPU stand-in of TileLang (step 11)
        if bn >= Skv:
            break
        pair = functools.cache(lambda bn=bn: _without_alpha(q, k, v, causal, scale, bn))
        for which, also in ((0, ""), (1, " and the running sum")):
            out.append(Mistake(f"the output matches online softmax over key tiles of {bn} that does not rescale "
                               f"the accumulator{also} by alpha = exp(m_old - m_new) when the running max "
                               "grows: acc = alpha * acc + P V",
                               _o(lambda pair=pair, which=which: pair()[which])))
    return out


def _diagnose(o, q, k, v, causal, scale, tol, bad_rows) -> str:
    found = find_mistake({"o": o}, {"o"}, attention_mistakes(q, k, v, causal, scale), tol)
    if found is not None:
        return found.cause
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
    if 0 < len(rows) < Sq:
        return ("only some rows are wrong: look at the boundaries of your tiles (masks for the last, "
                "partial tile; the diagonal tile of a causal mask) and at the running max and sum")
    return ("every row is wrong: check the scores (Q Kᵀ times scale), the softmax over keys "
            "(dim=-1), the normalisation by the row sum, and the final P V")


def _nonfinite_cause(o64, nonfinite, empty, q, k, causal, scale) -> str:
    """Why rows hold NaN or inf: ``nonfinite`` and ``empty`` are [B, Hq, Sq] row masks."""
    Sq, Skv = q.shape[2], k.shape[2]
    bad_r, empty_r = nonfinite.any(dim=(0, 1)), empty.any(dim=(0, 1))
    if causal:
        i = torch.arange(Sq)[:, None]
        j = torch.arange(Skv)[None, :]
        one_key = ((j <= i + (Skv - Sq)).sum(dim=-1) == 1).to(nonfinite.device)   # [Sq]
        if bool((bad_r & one_key).any()) and not bool((bad_r & ~one_key & ~empty_r).any()):
            return (DIAGONAL_CAUSE.replace("row 0 of a square problem", "these rows") +
                    "; a row that sees no key must also give 0, not NaN (guard m = -inf)")
    if empty.any() and not bool((nonfinite & ~empty).any()):
        return ("these rows see no key (Sq > Skv with bottom-right causal): their output must be "
                "0 and their lse -inf. Guard the division by l (l == 0) and the exp(m_old - m_new) "
                "of a row whose max is still -inf")
    if get_overflow_hint(q, k, scale):
        return ("the logits here are in the hundreds: exp() overflows unless you subtract the "
                "row max before exponentiating (safe softmax)")
    if bool(torch.isnan(o64).all(dim=-1)[:, :, bad_r].all()):
        rows = torch.nonzero(bad_r).flatten().tolist()
        return (f"whole query rows ({ranges(rows)}) were never written, in every head: NaN is what the "
                "check fills new allocations with. A query tile is missing: the loop over query tiles "
                "must include the last, partial one (range(0, Sq, block_m), the tile clipped at Sq), "
                "and a launch grid needs cdiv(Sq, BLOCK_M) programs along the query axis, not "
                "Sq // BLOCK_M")
    return ("either these elements were never written (the check fills new allocations with "
            "NaN: does your grid or loop cover every row and every column of D?) or the "
            "softmax produced inf/inf or 0/0")


# ----------------------------------------------------------------------------- the check
def check_attention(o, q, k, v, causal: bool = False, scale=None, lse=None, *,
                    config: str = "custom", seed: int | None = None, diagnose=None) -> CheckReport:
    """Check ``o`` (and ``lse`` if given) computed from q, k, v against the reference.

    Raises :class:`AttentionCheckError` with a teaching message; returns a report otherwise.
    ``diagnose(o, bad_rows)`` (a step's own diagnosis: step 12's ranks) is asked for the likely
    cause of wrong values before the course's usual ones; it returns a sentence or None.
    """
    tag = make_tag(config, seed)
    if is_collecting():     # the judge checks the recorded result; nothing here may fail in the kernel
        return CheckReport(config, 0.0, 0.0, 0.0, 0.0, seed=seed)
    expect_tensor(o, q, name="the output", like_name="q", tag=tag, shape_note=" = [B, Hq, Sq, D]")
    ref, ref_lse = reference_attention(q, k, v, causal, scale)
    empty = torch.isneginf(ref_lse)                       # [B, Hq, Sq]: rows with no visible key
    cmp = compare(o, ref, lambda: max_abs(torch_attention(q, k, v, causal, scale).to(torch.float64) - ref),
                  name="o", tag=tag, empty=empty[..., None])
    if cmp.failure == "nonfinite":
        cause = _nonfinite_cause(o.detach().to(torch.float64), cmp.nonfinite_rows, empty, q, k, causal, scale)
        raise AttentionCheckError(f"{tag} NaN or inf in the output at {describe_rows(cmp.nonfinite_rows)}.\n"
                                  f"  likely cause: {cause}")
    if cmp.failure == "not_empty":
        raise AttentionCheckError(
            f"{tag} rows that see no key must be exactly 0, but {describe_rows(cmp.not_empty_rows)} are not.\n"
            "  likely cause: with Sq > Skv the first Sq - Skv rows are fully masked; write zeros "
            "there (and lse = -inf) instead of a softmax over nothing")
    if cmp.failure == "values":
        cause = ((diagnose(o, cmp.bad_rows) if diagnose else None)
                 or _diagnose(o, q, k, v, causal, scale, cmp.allowed, cmp.bad_rows))
        raise cmp.error(cause, what="wrong values", index_names=("b", "h", "row", "d"))
    # Rule 4: not degenerate. With the inputs make_inputs draws, the reference is neither ≈ 0 nor
    # ≈ mean(V); a result within tolerance of the reference is therefore neither. Guard the premise.
    if cmp.ref_max < 10 * cmp.allowed:
        raise AttentionCheckError(f"{tag} the inputs are degenerate (max|ref| = {cmp.ref_max:.3g}); "
                                  "draw them with facourse.make_inputs")
    report = CheckReport(config, cmp.max_err, cmp.allowed, cmp.rel, cmp.own, seed=seed)
    if lse is not None:
        report.lse_max_err = check_lse(lse, ref_lse, q, tag)
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
    seed = draw_seed(seed)
    q, k, v = make_inputs(cfg, seed, device, dtype, layout)
    tag = f"[{cfg.name}]"
    kwargs = {"causal": cfg.causal}
    if scale is not None:
        kwargs["scale"] = scale
    result = guarded_call(fn, q, k, v, device=device, tag=tag, inputs={"q": q, "k": k, "v": v},
                          untouched="an attention function must leave its inputs untouched", **kwargs)
    o, lse = normalise_result(result, expect_lse, tag)
    report = check_attention(o, q, k, v, cfg.causal, scale, lse, config=cfg.describe(), seed=seed)
    if verbose:
        say(report.summary())
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
