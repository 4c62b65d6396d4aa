"""Bad input gets a clear, one-line error that names the fix, at the entry of the library and of
the exercises (issue 20, "Bad input"): bf16 in Triton's interpreter, stride(-1) != 1, a head dim
a Triton kernel does not support, device="cuda" without CUDA, Hkv = 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from facourse import (AttentionInputError, AttnConfig, HardwareUnavailable, check_entry_point, make_inputs,
                      reference_attention, validate_inputs)
from facourse.softmax_check import check_softmax_fn
from facourse.triton_setup import validate_triton_inputs

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")


def qkv(B=1, Hq=4, Hkv=2, Sq=16, Skv=16, D=64, dtype=torch.float32):
    return (torch.randn(B, Hq, Sq, D, dtype=dtype), torch.randn(B, Hkv, Skv, D, dtype=dtype),
            torch.randn(B, Hkv, Skv, D, dtype=dtype))


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


# ----------------------------------------------------------------------------- Hkv = 0
def test_hkv_zero_has_its_own_message():
    q, k, v = qkv()
    with pytest.raises(AttentionInputError) as err:
        validate_inputs(q, k[:, :0], v[:, :0])
    msg = one_line(err)
    assert "Hkv=0" in msg and "at least one KV head" in msg and "not a multiple" not in msg


def test_config_with_hkv_zero_is_refused():
    with pytest.raises(ValueError, match="at least one KV head"):
        AttnConfig("bad", 1, 4, 0, 16, 16, 64, False)
    with pytest.raises(ValueError, match="not a multiple"):
        AttnConfig("bad", 1, 4, 3, 16, 16, 64, False)


# ----------------------------------------------------------------------------- stride(-1) != 1
def _strided_last_dim(t):
    """The same values with stride(-1) == 2."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def test_last_stride_not_one_is_refused():
    q, k, v = qkv()
    ks = _strided_last_dim(k)
    assert ks.stride(-1) == 2 and torch.equal(ks, k)
    with pytest.raises(AttentionInputError) as err:
        validate_inputs(q, ks, v)
    msg = one_line(err)
    assert "k has stride(-1) = 2" in msg and "k.contiguous()" in msg
    # the references handle any layout: same answer as for contiguous inputs
    assert torch.equal(reference_attention(q, ks, v)[0], reference_attention(q, k, v)[0])


def test_exercise_04_entry_refuses_last_stride_not_one():
    from conftest import solution_code
    ns = {}
    exec("import math\nimport torch\nfrom facourse import validate_inputs\n"
         + solution_code("04_tiled_attention")["tiled_attention"], ns)
    q, k, v = qkv()
    o, _ = ns["tiled_attention"](q, k, v)          # fine
    with pytest.raises(AttentionInputError, match=r"q has stride\(-1\) = 2"):
        ns["tiled_attention"](_strided_last_dim(q), k, v)


# ----------------------------------------------------------------------------- head dims
def test_head_dims_of_a_triton_kernel():
    q, k, v = qkv(D=96)
    validate_inputs(q, k, v)                      # PyTorch steps take any D
    with pytest.raises(AttentionInputError) as err:
        validate_triton_inputs(q, k, v)
    msg = one_line(err)
    assert "D=96" in msg and "64, 128" in msg and "pad" in msg


# ----------------------------------------------------------------------------- bf16 in the interpreter
def test_bf16_refused_in_the_interpreter_only(monkeypatch):
    q, k, v = qkv(dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    validate_triton_inputs(q, k, v)               # compiled Triton handles bf16
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(AttentionInputError) as err:
        validate_triton_inputs(q, k, v)
    msg = one_line(err)
    assert "bf16" in msg and "interpreter" in msg and "float16 or float32" in msg and "GPU" in msg


def test_exercise_05_entry_refuses_bf16_and_d96_in_the_interpreter():
    """The exercise's wrapper, run by the interpreter: clear messages before Triton's own errors."""
    nb = json.loads((ROOT / "solutions" / "05_triton_flash_attention" / "05_triton_flash_attention.ipynb").read_text())
    src = "\n\n".join("\n".join(ln for ln in "".join(c["source"]).splitlines() if "### " not in ln)
                      for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") in ("setup", "kernel", "wrapper"))
    code = src + textwrap.dedent("""
        from facourse import AttentionInputError
        def qkv(D, dtype):
            return (torch.randn(1, 2, 16, D, dtype=dtype), torch.randn(1, 2, 16, D, dtype=dtype),
                    torch.randn(1, 2, 16, D, dtype=dtype))
        for D, dtype in ((64, torch.bfloat16), (96, torch.float32)):
            try:
                flash_attention_triton(*qkv(D, dtype))
                print("ACCEPTED", D, dtype)
            except AttentionInputError as e:
                print("REFUSED", e)
        o, lse = flash_attention_triton(*qkv(64, torch.float32))
        print("OK", tuple(o.shape))
        """)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert any(ln.startswith("REFUSED bf16") and "interpreter" in ln for ln in lines), r.stdout
    assert any(ln.startswith("REFUSED head dimension D=96") for ln in lines), r.stdout
    assert "arange" not in r.stdout and "OK (1, 2, 16, 64)" in lines, r.stdout


# ----------------------------------------------------------------------------- device="cuda" without CUDA
@no_cuda
def test_cuda_without_cuda_names_the_fix():
    cfg = AttnConfig("tiny", 1, 2, 1, 8, 8, 64, False)
    for call in (lambda: make_inputs(cfg, 0, device="cuda"),
                 lambda: check_entry_point(lambda q, k, v, **kw: q, "small", device="cuda"),
                 lambda: check_softmax_fn(lambda x, dim=-1: x, "small", device="cuda")):
        with pytest.raises(HardwareUnavailable) as err:
            call()
        msg = one_line(err)
        assert "device='cuda'" in msg and "device='cpu'" in msg and "not compiled" not in msg


def test_paged_bad_inputs_judges_validation_only():
    """Step 09's test_bad_inputs: a validating decode whose values are wrong keeps the point (its values
    are the other tests' cause: one test, one cause); one that refuses every batch, or never validates,
    loses it."""
    import torch

    from facourse.check import AttentionCheckError
    from facourse.decode import check_paged_bad_inputs, paged_reference, validate_paged_inputs

    def validating(q, k_cache, v_cache, block_table, seq_lens, scale=None):
        validate_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, scale)
        o, lse = paged_reference(q, k_cache, v_cache, block_table, seq_lens, scale, dtype=q.dtype)
        return o.to(q.dtype), lse.float()

    def wrong_values(*args, **kw):
        o, lse = validating(*args, **kw)
        return o * 2, lse

    def refuses_everything(q, *args, **kw):
        from facourse.decode import AttentionInputError
        raise AttentionInputError("no")

    def never_validates(q, k_cache, v_cache, block_table, seq_lens, scale=None):
        return torch.zeros_like(q), torch.zeros(q.shape[:-1], dtype=torch.float32)

    check_paged_bad_inputs(validating, seed=1, device="cpu", verbose=False)
    check_paged_bad_inputs(wrong_values, seed=1, device="cpu", verbose=False)
    for fn in (refuses_everything, never_validates):
        with pytest.raises(AttentionCheckError):
            check_paged_bad_inputs(fn, seed=1, device="cpu", verbose=False)
