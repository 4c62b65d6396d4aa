"""Step 08, the attention backward: every rung of solutions/08_backward/ladder on the CPU.

Each rung's ``flash_attention_train`` (step 05's Triton forward, then the rung's backward) runs
through Triton's interpreter in a subprocess (so that TRITON_INTERPRET is set before triton is
imported), in fp16 on tiny shapes, and its dq, dk, dv are compared with float64 autograd through
facourse's reference attention, by the course's rule applied to gradients: finite, within twice
the error of the same computation in fp16 + 1e-3, relative error < 1e-2. Cases: ragged lengths,
Sq = 1, causal Sq > Skv (rows that see no key must get exactly zero dq), causal Sq < Skv, D = 64
and 128, MQA, GQA, non-contiguous q, k, v and dO, and logits 64x larger than usual (q, k * 8).
A second test shows the check catches wrong backwards (no GQA sum, no D term, unguarded lse,
no causal mask); a GPU test runs the Triton rungs at full size against SDPA's FLASH backend.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT

LADDER = ROOT / "solutions" / "08_backward" / "ladder"
RUNGS = ["v1_pytorch_tiled", "v2_two_kernel", "v3_tma_causal_split"]

# name: (B, Hq, Hkv, Sq, Skv, D, causal, logit_scale)
CASES = {
    "ragged_gqa_causal_sq_lt_skv": (1, 4, 2, 70, 100, 64, True, 1.0),
    "ragged_noncausal": (1, 2, 2, 50, 77, 64, False, 1.0),
    "decode_mqa": (1, 3, 1, 1, 90, 64, True, 1.0),
    "empty_rows": (1, 2, 1, 100, 40, 64, True, 1.0),
    "d128_gqa": (1, 4, 2, 64, 64, 128, True, 1.0),
    "mqa": (1, 4, 1, 64, 64, 64, False, 1.0),
    "large_logits": (1, 2, 1, 64, 64, 64, False, 64.0),
}

PRELUDE = f"""
    import sys, torch
    sys.path.insert(0, {str(LADDER)!r})
    import common
    from facourse.configs import AttnConfig, make_inputs
    torch.manual_seed(0)

    def case(name, spec):
        B, Hq, Hkv, Sq, Skv, D, causal, ls = spec
        cfg = AttnConfig(name, B, Hq, Hkv, Sq, Skv, D, causal, logit_scale=ls)
        q, k, v = make_inputs(cfg, 3, "cpu", torch.float16, "bshd")       # non-contiguous views
        do = torch.randn(B, Sq, Hq, D, dtype=torch.float16).transpose(1, 2)  # and a non-contiguous dO
        assert Sq == 1 or not (q.is_contiguous() or do.is_contiguous())
        return cfg, q, k, v, do
"""


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_gradients_in_interpreter(rung):
    """dq, dk, dv of the rung's autograd.Function match float64 autograd on every case."""
    r = _python(f"""
        import {rung} as rung
        for name, spec in {CASES!r}.items():
            cfg, q, k, v, do = case(name, spec)
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o = rung.flash_attention_train(qg, kg, vg, causal=cfg.causal)
            # O(N) state: the Function saved q, k, v, o and lse, nothing of size Sq x Skv
            saved = [tuple(t.shape) for t in o.grad_fn.saved_tensors]
            assert saved == [tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(q.shape),
                             tuple(q.shape[:3])], saved
            got = torch.autograd.grad(o, (qg, kg, vg), do)
            assert [g.dtype for g in got] == [torch.float16] * 3
            o_ref, *ref = common.reference_grads(q, k, v, do, cfg.causal)
            assert (o.double() - o_ref).abs().max() < 1e-2
            common.check_grads(got, ref, common.low_precision_grads(q, k, v, do, cfg.causal))
            empty = common.empty_rows(cfg.Sq, cfg.Skv, cfg.causal)
            if empty.any():                      # rows that see no key: exactly zero, never NaN
                assert (got[0][:, :, empty] == 0).all()
                assert empty.sum() == cfg.Sq - cfg.Skv
            print("ok", name, flush=True)
        if hasattr(rung, "INTERPRET_TILES") and rung.INTERPRET_TILES.get("one_launch"):
            # v3 runs its two kernels in one grid; its separate kernels (the tuning path) too
            rung.FORCE_TILES = dict(rung.INTERPRET_TILES, one_launch=False)
            for name in ("ragged_gqa_causal_sq_lt_skv", "empty_rows"):
                cfg, q, k, v, do = case(name, {CASES!r}[name])
                o, lse = common.attention_forward(q, k, v, cfg.causal)
                got = rung.attention_backward(q, k, v, o, lse, do, cfg.causal)
                _, *ref = common.reference_grads(q, k, v, do, cfg.causal)
                common.check_grads(got, ref, common.low_precision_grads(q, k, v, do, cfg.causal))
                print("ok two launches", name, flush=True)
        """)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("ok ") == len(CASES) + 2 * ("v3" in rung), r.stdout


def test_check_catches_wrong_backwards():
    """The checks above can fail: four plausible mistakes in v1's backward are each caught."""
    r = _python(f"""
        import v1_pytorch_tiled as v1
        from facourse.reference import reference_attention

        def no_gqa_sum(q, k, v, o, lse, do, causal=False, scale=None):   # dK, dV of one head only
            G = q.shape[1] // k.shape[1]
            dq, dk, dv = v1.attention_backward(q, k, v, o, lse, do, causal, scale)
            dq1, dk1, dv1 = v1.attention_backward(q[:, ::G], k, v, o[:, ::G], lse[:, ::G], do[:, ::G], causal, scale)
            return dq, dk1, dv1

        def no_delta(q, k, v, o, lse, do, causal=False, scale=None):     # dS = P * dP: D_i forgotten
            return v1.attention_backward(q, k, v, torch.zeros_like(o), lse, do, causal, scale)

        def unguarded_lse(q, k, v, o, lse, do, causal=False, scale=None):  # exp(s - lse) with lse = -inf
            lse = torch.where(torch.isinf(lse), -1e30, lse)                # v1's guard undone
            return v1.attention_backward(q, k, v, o, lse, do, causal, scale)

        def no_causal(q, k, v, o, lse, do, causal=False, scale=None):    # the mask forgotten
            return v1.attention_backward(q, k, v, o, lse, do, False, scale)

        wrong = {{"no_gqa_sum": (no_gqa_sum, "ragged_gqa_causal_sq_lt_skv"),
                 "no_delta": (no_delta, "mqa"),
                 "unguarded_lse": (unguarded_lse, "empty_rows"),
                 "no_causal": (no_causal, "ragged_gqa_causal_sq_lt_skv")}}
        for bug, (fn, name) in wrong.items():
            cfg, q, k, v, do = case(name, {CASES!r}[name])
            o, lse = reference_attention(q, k, v, cfg.causal, dtype=torch.float32)
            o = o.half()
            got = fn(q, k, v, o, lse, do, cfg.causal)
            _, *ref = common.reference_grads(q, k, v, do, cfg.causal)
            try:
                common.check_grads(got, ref, common.low_precision_grads(q, k, v, do, cfg.causal))
            except AssertionError as e:
                print("caught", bug, str(e).splitlines()[0], flush=True)
            else:
                print("MISSED", bug, flush=True)
            good = v1.attention_backward(q, k, v, o, lse, do, cfg.causal)
            common.check_grads(good, ref, common.low_precision_grads(q, k, v, do, cfg.causal))
        """)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("caught ") == 4, r.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (sm_80+)")
@pytest.mark.parametrize("rung", RUNGS[1:])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rung_full_size_gpu(rung, dtype):
    """`large` with B = 1 (non-contiguous inputs and dO): within twice SDPA FLASH's own error."""
    from conftest import load_module
    from facourse.configs import CONFIGS, make_inputs, scaled
    sys.path.insert(0, str(LADDER))
    common = load_module(LADDER / "common.py", "common")
    mod = load_module(LADDER / f"{rung}.py", rung)
    cfg = scaled(CONFIGS["large"], B=1)
    q, k, v = make_inputs(cfg, 1, "cuda", dtype, "bshd")
    do = torch.randn(cfg.B, cfg.Sq, cfg.Hq, cfg.D, device="cuda", dtype=dtype).transpose(1, 2)
    _, *ref = common.reference_grads(q, k, v, do, cfg.causal, dtype=torch.float32)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    low = torch.autograd.grad(o, (qs, ks, vs), do)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    got = torch.autograd.grad(mod.flash_attention_train(qg, kg, vg, causal=True), (qg, kg, vg), do)
    common.check_grads(got, ref, low)
