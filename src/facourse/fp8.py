"""FP8 (e4m3) attention's checks and bench (step 10's FP8 rungs, the ``fp8`` kind): the error bound on
the course's configurations, the RMSE of O on FlashAttention-3's outlier inputs, and the timing on inputs
already in FP8; end-to-end timing goes through ``facourse.bench.bench_attention``."""
from __future__ import annotations

import math

import torch

from .configs import get_config, make_inputs, resolve_device
from .rule import AttentionCheckError, compare, describe_rows, draw_seed, is_collecting
from .variants import call_o_lse

#: The error bound of an FP8 (e4m3) forward, relative: ‖o - o_ref‖ / ‖o_ref‖ over the whole output, with
#: o_ref in float64 from the fp16 inputs. Rounding Q, K, V and P to e4m3 (3 mantissa bits, a relative
#: step of up to 6.25%) with one scale per (batch, head) gives about 5% on the course's configurations
#: (measured on an H100: 4.2-5.3%, benchmarks/results/2026-11-23_h100_step10.json); the bound leaves
#: room above that and stays far below what a wrong scale gives (tens of percent).
FP8_REL_BOUND = 0.08
#: Configurations an FP8 forward is not checked on: `overflow`'s logits in the hundreds, where a 6% error
#: in every logit is several units of exp() (FP8 attention needs logits of ordinary size).
FP8_UNFIT = ("overflow",)


#: FlashAttention-3's outlier inputs (Shah et al., 2024, section 4.3, Table 3), non-causal, D 128: name ->
#: (B, H, S, seed) on a GPU (a CPU runs 512 keys, one head). FP8 is judged there by the RMSE of O.
FP8_OUTLIER_CASES = {"fa3_outliers_2k": (1, 4, 2048, 0), "fa3_outliers_8k": (1, 1, 8192, 0)}
#: Their RMSE bound: one scale per tensor reads 1.6-2.4e-2 on them (FA3's Table 3: 2.4e-2 for plain FP8);
#: above 3e-2 a scale is wrong. FA3's own quantisation reaches 9.1e-3: the ladder records each rung's.
FP8_OUTLIER_RMSE = 3e-2


def fa3_outlier_inputs(B, H, S, D, seed, outliers=True, dtype=torch.float16):
    """q, k, v [B, H, S, D] in ``dtype`` (fp32: the draws themselves) on the CPU, entries N(0, 1) plus, with
    outliers, N(0, 100) on a Bernoulli(0.001) draw of them; torch.Generator().manual_seed(seed), q, k, v drawn
    in that order."""
    g = torch.Generator().manual_seed(seed)

    def draw():
        x = torch.randn(B, H, S, D, generator=g)
        if outliers:
            x = x + 10.0 * torch.randn(B, H, S, D, generator=g) * (torch.rand(B, H, S, D, generator=g) < 1e-3)
        return x.to(dtype)
    return draw(), draw(), draw()


def check_fp8_outliers(fn, case: str, *, device=None, dtype=None, verbose: bool = True) -> dict:
    """``fn`` (as ``check_fp8`` calls it) on FA3's outlier inputs ``case``: o finite and its RMSE against
    float64 attention at most ``FP8_OUTLIER_RMSE``. Returns {"rmse": ...}, the figure FA3 reports."""
    from .reference import reference_attention

    device = resolve_device(device)
    B, H, S, seed = FP8_OUTLIER_CASES[case]
    if device.type != "cuda":
        H, S = 1, 512
    q, k, v = (t.to(device=device, dtype=dtype or torch.float16) for t in fa3_outlier_inputs(B, H, S, 128, seed))
    tag = f"[{case}, fp8] (B {B}, H {H}, S {S}, seed {seed})"
    o, _ = call_o_lse(fn, tag, q, k, v, causal=False)
    if is_collecting():
        return {}
    ref, _ = reference_attention(q.double(), k.double(), v.double(), False)
    if not isinstance(o, torch.Tensor) or o.shape != q.shape or not bool(torch.isfinite(o).all()):
        raise AttentionCheckError(f"{tag} o must be a finite tensor of q's shape")
    rmse = float((o.double() - ref).pow(2).mean().sqrt())
    if rmse > FP8_OUTLIER_RMSE:
        raise AttentionCheckError(f"{tag} RMSE of o {rmse:.3g} > {FP8_OUTLIER_RMSE}, more than plain FP8 gives on "
                                  "FA3's outlier inputs: check each block's descale")
    if verbose:
        print(f"[{case}] fp8 passed: RMSE {rmse:.3e} (bound {FP8_OUTLIER_RMSE}; FA3's 9.1e-3)")
    return {"rmse": rmse}


def check_fp8(fn, config: str = "large", *, seed: int | None = None, device=None, dtype=None,
              verbose: bool = True) -> dict:
    """``fn(q, k, v, causal=, scale=None) -> (o, lse)`` with fp16/bf16 inputs that it quantises to e4m3
    itself: o in the inputs' dtype, finite, rows that see no key 0, relative error at most
    ``FP8_REL_BOUND``, lse within 2% of the reference (it is computed from FP8 logits too). Returns the
    errors. On ``FP8_OUTLIER_CASES``: ``check_fp8_outliers``."""
    from .reference import reference_attention

    if config in FP8_OUTLIER_CASES:
        return check_fp8_outliers(fn, config, device=device, dtype=dtype, verbose=verbose)
    device = resolve_device(device)
    cfg = get_config(config, device)
    if cfg.name in FP8_UNFIT:
        raise ValueError(f"{cfg.name} is no configuration for FP8 attention (FP8_UNFIT)")
    seed = draw_seed(seed)
    q, k, v = make_inputs(cfg, seed, device, dtype, layout="bshd")
    tag = f"[{cfg.name}, fp8] (seed {seed})"
    o, lse = call_o_lse(fn, tag, q, k, v, causal=cfg.causal)
    if is_collecting():
        return {}
    if not isinstance(o, torch.Tensor) or o.shape != q.shape or o.dtype != q.dtype:
        raise AttentionCheckError(f"{tag} o must be a tensor of q's shape and dtype, got "
                                  f"{getattr(o, 'shape', type(o).__name__)} {getattr(o, 'dtype', '')}")
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), cfg.causal)
    empty = torch.isneginf(ref_lse)
    # rule 1 as everywhere (finite; rows that see no key exactly 0); FP8's own bound replaces rules 2 and 3
    cmp = compare(o, ref, 0.0, name="o", tag=tag, empty=empty[..., None], slack=math.inf, rel_limit=None)
    if not cmp.ok:
        raise AttentionCheckError(f"{tag} o has NaN/inf, or rows that see no key are not 0: {describe_rows(cmp.bad_rows)}")
    rel = float((o.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
    if rel > FP8_REL_BOUND:
        raise AttentionCheckError(f"{tag} relative error {rel:.3g} > {FP8_REL_BOUND}: more than e4m3's rounding of Q, K, "
                                  "V and P gives. Check the scales: each tensor's descale must multiply back what its "
                                  "quantisation divided (q * descale_q * k * descale_k in the logits, descale_v on O)")
    fin = ~empty
    lse_err = float((lse.double() - ref_lse.double()).abs()[fin].max()) if fin.any() else 0.0
    if lse_err > 0.02 * (1 + float(ref_lse.double().abs()[fin].max())):
        raise AttentionCheckError(f"{tag} lse is off by {lse_err:.3g}")
    if verbose:
        print(f"[{cfg.name}] fp8 passed: relative error {rel:.4f} (bound {FP8_REL_BOUND}), lse err {lse_err:.2e}")
    return {"rel_err": rel, "lse_err": lse_err}


def bench_fp8(fp8_prequantized, quantize, config: str = "long", *, backend: str = "FLASH_ATTENTION", rounds: int = 25,
              warmup: int = 5, seed: int = 0, transpose_v=None):
    """Time an FP8 forward on inputs already in FP8, as a model hands them over (FlashAttention-3's FP8
    path takes e4m3 inputs): ``quantize(x) -> (x8, descale)`` and ``transpose_v(v8)`` (the V^T layout the
    kernel reads, [B, H, D, S]; default a plain transpose) run once, outside the timing, and
    ``fp8_prequantized(q8, k8, v8t, dq, dk, dv, causal=)`` is timed against SDPA's ``backend`` on the fp16
    inputs, with the course's bench. Returns a BenchResult."""
    import statistics

    from .bench import BenchResult, new_flush_buffer, sdpa_reference, time_calls
    from .hw import gpu_name, require_gpu

    require_gpu(what="benchmarking")
    cfg = get_config(config, "cuda")
    q, k, v = make_inputs(cfg, seed, "cuda", torch.float16)
    (q8, dq), (k8, dk), (v8, dv) = (quantize(t) for t in (q, k, v))
    v8t = transpose_v(v8) if transpose_v else v8.transpose(-1, -2).contiguous()
    ref, _ = sdpa_reference(backend)
    calls = {"s": lambda: fp8_prequantized(q8, k8, v8t, dq, dk, dv, causal=cfg.causal),
             "r": lambda: ref(q, k, v, causal=cfg.causal)}
    gpu, host = time_calls(calls, max(rounds, 20), new_flush_buffer(), warmup)
    ts, tr = statistics.median(gpu["s"]), statistics.median(gpu["r"])
    flops = cfg.flops()
    return BenchResult(f"{cfg.describe()}, e4m3 inputs", gpu_name(), "float8_e4m3fn", ref.last_backend, ts, tr,
                       flops / ts / 1e9, flops / tr / 1e9, tr / ts, statistics.median(host["s"]),
                       statistics.median(host["r"]))
