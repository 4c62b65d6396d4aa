"""Step 08, the attention backward: every rung of solutions/08_backward/ladder, and the check's diagnoses.

Each rung's ``flash_attention_train`` (a Triton forward, then the rung's backward) runs through
Triton's interpreter in a subprocess (so that TRITON_INTERPRET is set before triton is imported),
in fp16 on small shapes, through the course's one gradient check (facourse.backward.check_gradients:
o, dq, dk, dv against float64 autograd by the course's rule, zero gradients for rows that see no
key, O(N) state kept by the forward). Cases: ragged lengths, Sq = 1, causal Sq > Skv and Sq < Skv,
D = 64 and 128, MQA, GQA, non-contiguous q, k, v and dO, logits 64x larger than usual.
The check can fail: the classic mistakes, planted in v1's PyTorch backward, are each caught with a
message that names them. A GPU test runs the Triton rungs at full size.
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
    from facourse.backward import check_gradients
    from facourse.configs import AttnConfig

    def config(name):
        B, Hq, Hkv, Sq, Skv, D, causal, ls = {CASES!r}[name]
        return AttnConfig(name, B, Hq, Hkv, Sq, Skv, D, causal, logit_scale=ls)
"""


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("rung", RUNGS)
def test_rung_gradients_in_interpreter(rung):
    """o, dq, dk, dv of the rung's autograd.Function pass the course's check on every case."""
    r = _python(f"""
        import {rung} as rung
        for name in {list(CASES)!r}:
            check_gradients(rung.flash_attention_train, config(name), device="cpu", dtype=torch.float16,
                            seed=3, verbose=False)
            print("ok", name, flush=True)
        if hasattr(rung, "INTERPRET_TILES") and rung.INTERPRET_TILES.get("one_launch"):
            # v3 runs its two kernels in one grid; its separate kernels (the tuning path) too
            rung.FORCE_TILES = dict(rung.INTERPRET_TILES, one_launch=False)
            two = common.make_train_fn(rung.attention_backward, "TwoLaunches")
            for name in ("ragged_gqa_causal_sq_lt_skv", "empty_rows"):
                check_gradients(two, config(name), device="cpu", dtype=torch.float16, seed=4, verbose=False)
                print("ok two launches", name, flush=True)
        """)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("ok ") == len(CASES) + 2 * ("v3" in rung), r.stdout


# The classic mistakes, planted in v1's backward (PyTorch, no interpreter: fast), and what the
# check's message must name. Each wraps v1.attention_backward(q, k, v, o, lse, do, causal, scale).
PLANTED = {
    "no_D": ("o = torch.zeros_like(o)", "ragged_gqa_causal_sq_lt_skv", "the D term is missing"),
    "gqa_not_summed": ("G = q.shape[1] // k.shape[1]; _, dk, dv = v1.attention_backward("
                       "q[:, ::G], k, v, o[:, ::G], lse[:, ::G], do[:, ::G], causal, scale)",
                       "ragged_gqa_causal_sq_lt_skv", "GQA: dK and dV hold only"),
    "dq_scaled_twice": ("dq = dq * (scale or q.shape[-1] ** -0.5)", "mqa", "dQ is scaled twice"),
    "no_causal_mask": ("dq, dk, dv = v1.attention_backward(q, k, v, o, lse, do, False, scale)",
                       "ragged_gqa_causal_sq_lt_skv", "the causal mask is missing in the backward"),
    "lse_wrong_row": ("dq, dk, dv = v1.attention_backward(q, k, v, o, torch.cat([lse[:, :, 1:], lse[:, :, -1:]], 2), "
                      "do, causal, scale)", "d128_gqa", "another row's lse"),
    # Sq < Skv: the backward on the first Sq keys alone masks j <= i (top-left); the later keys get no gradient
    "top_left_backward": ("S = q.shape[2]; dq, dk[:, :, :S], dv[:, :, :S] = v1.attention_backward("
                          "q, k[:, :, :S], v[:, :, :S], o, lse, do, causal, scale); dk[:, :, S:] = 0; dv[:, :, S:] = 0",
                          "ragged_gqa_causal_sq_lt_skv",
                          "the backward's causal mask is aligned top-left, in both passes"),
    "unguarded_lse": ("dq, dk, dv = v1.attention_backward(q, k, v, o, torch.where(torch.isinf(lse), -1e30, lse), "
                      "do, causal, scale)", "empty_rows", "see no key"),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bugs_are_caught_and_named(bug):
    """Each classic mistake fails the check with a message naming it; the unplanted v1 passes."""
    sys.path.insert(0, str(LADDER))
    from conftest import load_module
    from facourse import AttentionCheckError
    from facourse.backward import check_gradients
    from facourse.configs import AttnConfig
    from facourse.reference import reference_attention
    v1 = load_module(LADDER / "v1_pytorch_tiled.py", "v1_pytorch_tiled")
    plant, case, says = PLANTED[bug]
    B, Hq, Hkv, Sq, Skv, D, causal, ls = CASES[case]
    cfg = AttnConfig(case, B, Hq, Hkv, Sq, Skv, D, causal, logit_scale=ls)

    def train_fn(planted: bool):
        def backward(q, k, v, o, lse, do, causal, scale):
            dq, dk, dv = v1.attention_backward(q, k, v, o, lse, do, causal, scale)
            if planted:
                scope = {"v1": v1, "torch": torch, "q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do,
                         "causal": causal, "scale": scale, "dq": dq, "dk": dk, "dv": dv}
                exec(plant, scope)
                if "o" in plant.split("=")[0]:       # a wrong input to the backward: run it again
                    scope["dq"], scope["dk"], scope["dv"] = v1.attention_backward(
                        q, k, v, scope["o"], lse, do, causal, scale)
                dq, dk, dv = scope["dq"], scope["dk"], scope["dv"]
            return dq, dk, dv

        class Fn(torch.autograd.Function):      # the reference forward: no interpreter needed here
            @staticmethod
            def forward(ctx, q, k, v, causal, scale):
                o, lse = reference_attention(q, k, v, causal, scale, dtype=torch.float32)
                o = o.to(q.dtype)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.causal, ctx.scale = causal, scale
                return o

            @staticmethod
            def backward(ctx, do):
                return (*backward(*ctx.saved_tensors, do, ctx.causal, ctx.scale), None, None)

        return lambda q, k, v, causal=False, scale=None: Fn.apply(q, k, v, causal, scale)

    check_gradients(train_fn(False), cfg, device="cpu", dtype=torch.float32, seed=5, verbose=False)
    with pytest.raises(AttentionCheckError) as err:
        check_gradients(train_fn(True), cfg, device="cpu", dtype=torch.float32, seed=5, verbose=False)
    assert says in str(err.value), str(err.value)
    if bug == "no_D":       # the finite-difference check sees it too; it passes the unplanted v1
        from facourse.backward import gradcheck
        gradcheck(train_fn(False), device="cpu", seed=5)
        with pytest.raises(AttentionCheckError, match="not the derivative of the forward"):
            gradcheck(train_fn(True), device="cpu", seed=5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (sm_80+)")
@pytest.mark.parametrize("rung", RUNGS[1:])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rung_full_size_gpu(rung, dtype):
    """`large` with B = 1 (non-contiguous inputs and dO): the course's check at full size."""
    from conftest import load_module
    from facourse.backward import check_gradients
    from facourse.configs import CONFIGS, scaled
    sys.path.insert(0, str(LADDER))
    mod = load_module(LADDER / f"{rung}.py", rung)
    check_gradients(mod.flash_attention_train, scaled(CONFIGS["large"], B=1), device="cuda", dtype=dtype)
