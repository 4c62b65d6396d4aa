"""Anti-cheat of the hidden tests (autograder/guards.py): each cheat is caught, honest code is not."""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from autograder import guards
from autograder.guards import CheatDetected, MatmulFlops, check_no_caching, forbid_framework_attention
from conftest import ROOT
from facourse import AttentionCheckError, check_entry_point


def vanilla(q, k, v, causal=False, scale=None):
    """An honest vanilla attention (full S and P, torch.softmax): allowed at step 01 only."""
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    g = Hq // k.shape[1]
    s = (q.float() @ k.repeat_interleave(g, 1).float().transpose(-1, -2)) * (scale or 1 / math.sqrt(D))
    if causal:
        i, j = torch.arange(Sq, device=q.device)[:, None], torch.arange(Skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return (p @ v.repeat_interleave(g, 1).float()).to(q.dtype)


def tiled(q, k, v, causal=False, scale=None, block_n=64):
    """An honest key-tiled attention with an online softmax (no softmax over the whole row)."""
    B, Hq, Sq, D = q.shape
    Skv, g = k.shape[2], Hq // k.shape[1]
    scale = scale or 1 / math.sqrt(D)
    K, V = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    dev = q.device
    m = torch.full((B, Hq, Sq, 1), float("-inf"), device=dev)
    l = torch.zeros(B, Hq, Sq, 1, device=dev)
    acc = torch.zeros(B, Hq, Sq, D, device=dev)
    i = torch.arange(Sq, device=dev)[:, None]
    for j0 in range(0, Skv, block_n):
        s = (q.float() @ K[:, :, j0:j0 + block_n].transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.arange(j0, min(j0 + block_n, Skv), device=dev)[None, :] > i + (Skv - Sq),
                             float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        alpha = torch.exp(torch.where(torch.isinf(m), torch.full_like(m, -math.inf), m - safe))
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p @ V[:, :, j0:j0 + block_n]
        m = m_new
    return torch.nan_to_num(acc / l, nan=0.0).to(q.dtype)


def sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                            enable_gqa=True)


def sdpa_swallowed(q, k, v, causal=False, scale=None):
    try:
        return sdpa(q, k, v, causal, scale)
    except Exception:           # hides the guard's error and falls back
        return vanilla(q, k, v, causal, scale)


def aten_kernel(q, k, v, causal=False, scale=None):
    g = q.shape[1] // k.shape[1]
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal, scale=scale)[0]


def mha(q, k, v, causal=False, scale=None):
    m = torch.nn.MultiheadAttention(q.shape[-1], 1, device=q.device, dtype=q.dtype)
    return m(q[0], q[0], q[0])[0]


def softmax_module(q, k, v, causal=False, scale=None):
    s = q.float() @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).float().transpose(-1, -2)
    torch.nn.Softmax(dim=-1)(s)
    return vanilla(q, k, v, causal, scale)


@pytest.mark.parametrize("cheat", [sdpa, sdpa_swallowed, aten_kernel, mha])
@pytest.mark.parametrize("allow_softmax", [True, False])
def test_framework_attention_is_caught(cheat, allow_softmax):
    with pytest.raises(CheatDetected, match="anti-cheat.*" + cheat.__name__) as err:
        check_entry_point(forbid_framework_attention(cheat, allow_softmax=allow_softmax), "small")
    assert "likely cause:" in str(err.value)


def test_softmax_over_all_keys_is_caught_from_step_04_only():
    for fn in (vanilla, softmax_module):
        with pytest.raises(CheatDetected, match="softmax over all 512 keys"):
            check_entry_point(forbid_framework_attention(fn), "medium")
    check_entry_point(forbid_framework_attention(vanilla, allow_softmax=True), "medium")   # step 01
    check_entry_point(forbid_framework_attention(tiled), "medium")                        # step 04+
    check_entry_point(forbid_framework_attention(tiled), "ragged")


def _per_sequence_softmax(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                          scale=None):
    """Packed varlen attention with one softmax over each sequence's keys (vanilla attention, sequence by
    sequence): the rows' width is a sequence's length, never k.shape[-2] (the KV heads)."""
    o = torch.zeros_like(q)
    G = q.shape[1] // k.shape[1]
    for b in range(len(cu_seqlens_q) - 1):
        qs, ks = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1]), slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
        kb, vb = (x[ks].repeat_interleave(G, 1).transpose(0, 1) for x in (k, v))
        p = torch.softmax(q[qs].transpose(0, 1) @ kb.transpose(1, 2) * (scale or q.shape[-1] ** -0.5), dim=-1)
        o[qs] = (p @ vb).transpose(0, 1)
    return o


def test_a_softmax_over_one_sequences_keys_is_a_whole_row():
    """Packed and paged layouts: the guard reads each sequence's key count from the argument at the contract's
    position (cu_seqlens_k's differences, or seq_lens), whatever the student named it, and a softmax of that
    width is a whole row."""
    cu = torch.tensor([0, 70, 170], dtype=torch.int32)                    # sequences of 70 and 100 tokens
    q, k, v = torch.randn(170, 4, 16), torch.randn(170, 2, 16), torch.randn(170, 2, 16)
    args = (q, k, v, cu, cu, 100, 100)
    forbid_framework_attention(_per_sequence_softmax)(*args)              # k.shape[-2] is 2: nothing to see
    with pytest.raises(CheatDetected, match="softmax over all 70 keys"):
        forbid_framework_attention(_per_sequence_softmax, key_lengths=(4, "offsets"))(*args)

    def paged(q, k_cache, v_cache, block_table, lens, scale=None):      # seq_lens renamed: still seen
        return torch.softmax(torch.randn(4, int(lens.max())), dim=-1)
    lens = torch.tensor([30, 90])
    forbid_framework_attention(paged, key_lengths=(4, "lengths"))(q, k, v, None, lens[:1])    # 30 <= MIN_KEYS
    with pytest.raises(CheatDetected, match="softmax over all 90 keys"):
        forbid_framework_attention(paged, key_lengths=(4, "lengths"))(q, k, v, None, lens)


def test_the_guard_loads_no_compiler_and_still_catches_a_compiled_cheat():
    """torch would wrap the guard's dispatch mode (and the FLOP counter's) in torch._disable_dynamo, whose first
    call imports torch._dynamo (over a CPU-second in each grading kernel); both disable Dynamo only once something
    has loaded it, so an honest call loads nothing, and SDPA behind torch.compile is still caught."""
    code = textwrap.dedent("""
        import sys, torch
        from autograder.guards import CheatDetected, MatmulFlops, forbid_framework_attention
        from facourse import check_entry_point
        from test_grading_guards import sdpa, tiled
        with MatmulFlops():
            check_entry_point(forbid_framework_attention(tiled), "small")
        assert "torch._dynamo" not in sys.modules, "an honest call loaded torch._dynamo"
        try:
            check_entry_point(forbid_framework_attention(torch.compile(sdpa, backend="eager")), "small")
        except CheatDetected as err:
            assert "scaled_dot_product_attention" in str(err), err
        else:
            raise AssertionError("a compiled SDPA was not caught")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (ROOT / "src", ROOT, ROOT / "tests")))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_matmul_flops_counts_as_pytorchs_flop_counter():
    """Step 04's tile-skipping test counts the products with MatmulFlops: every way of writing one (@ on 2-D,
    batched and broadcast operands, einsum, linear with and without a bias, addmm, baddbmm) counts what
    torch.utils.flop_counter counts, inside the guard too, and nothing else counts."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float16) for _ in range(3))
    w, bias, x = torch.randn(24, 16, generator=g), torch.randn(24, generator=g), torch.randn(7, 16, generator=g)
    forms = {
        "2-D @": lambda: q[0, 0] @ k[0, 0].T,
        "4-D @": lambda: (q @ k.transpose(-1, -2)).softmax(-1) @ v,
        "broadcast @": lambda: q @ k[0, 0].T,
        "einsum": lambda: torch.einsum("bhqd,bhkd->bhqk", q, k),
        "linear": lambda: torch.nn.functional.linear(x, w),
        "linear, bias": lambda: torch.nn.functional.linear(x, w, bias),
        "addmm": lambda: torch.addmm(bias, x, w.T),
        "baddbmm": lambda: torch.baddbmm(torch.zeros(3, 40, 40), q[0].float(), k[0].float().transpose(1, 2)),
        "no product": lambda: (q * k).sum(-1).softmax(-1),
    }
    for name, form in forms.items():
        with FlopCounterMode(display=False) as theirs:
            form()
        with MatmulFlops() as ours:
            form()
        assert ours.flops == theirs.get_total_flops(), name
        assert ours.flops > 0 or name == "no product", name

    def product(q, k, v):
        return (q @ k.transpose(-1, -2)) @ v

    with MatmulFlops() as ours:
        forbid_framework_attention(product)(q, k, v)
    assert ours.flops == 2 * 2 * (2 * 3 * 40 * 16 * 40)


def test_guard_is_removed_after_the_call():
    check_entry_point(forbid_framework_attention(tiled), "small")
    assert torch.nn.MultiheadAttention.forward.__name__ == "forward"
    sdpa(*[torch.randn(1, 2, 8, 4) for _ in range(3)])      # no guard left active
    torch.softmax(torch.randn(4, 300), dim=-1)


def test_a_triton_step_needs_a_triton_kernel():
    """Steps 05, 08-10 and 15 grade a Triton kernel: an answer computed by PyTorch alone (here step 04's tiled
    attention, right on every case) scores nothing, and says why; the counting of launches is gone afterwards."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    runs = JITFunction.run, InterpretedFunction.run
    with pytest.raises(CheatDetected, match="no Triton kernel ran"):
        check_entry_point(forbid_framework_attention(tiled, require_triton=3), "small")
    assert (JITFunction.run, InterpretedFunction.run) == runs
    check_entry_point(forbid_framework_attention(tiled), "small")          # step 04's own guard: no kernel asked for


_KERNELS_READ = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from autograder.guards import CheatDetected, forbid_framework_attention

@triton.jit
def scale_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, tl.load(X + i) * 2.0)

def launch(x):                         # the kernel reads x (a flat copy of it: data derived from the input)
    x = x.reshape(-1)[:16].contiguous()
    y = torch.empty_like(x)
    scale_kernel[(1,)](x, y, N=16)
    return y

def fwd(q, k, v, do, reads):
    for name, t in zip("qkvd", (q, k, v, do)):
        if name in reads:
            launch(t)
    return q * 1.0

q, k, v, do = (torch.randn(2, 4, 8, 16) for _ in range(4))
q = q.transpose(1, 2)                  # a strided view: .contiguous() copies it, and the copy still counts
for reads, need, ok in (("qkvd", 4, True), ("qkv", 3, True), ("qkv", 4, False), ("q", 3, False), ("", 3, False)):
    try:
        forbid_framework_attention(lambda q, k, v, do: fwd(q, k, v, do, reads), require_triton=need)(q, k, v, do)
        got = True
    except CheatDetected as err:
        got = False
        print(reads, need, str(err)[:160])
    assert got == ok, (reads, need)
print("done")
"""


def test_a_triton_steps_kernels_must_read_its_inputs():
    """Launching some kernel is not enough: q, k and v (and step 08's dO) must each reach a kernel's arguments, as
    they are or as data derived from them (a .contiguous() copy counts); else the message names the missing."""
    r = subprocess.run([sys.executable, "-c", _KERNELS_READ], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"})
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stdout + r.stderr
    assert "no Triton kernel read dO" in r.stdout and "no Triton kernel read k, v" in r.stdout
    assert "no Triton kernel ran" in r.stdout


def test_a_kernel_compiled_ahead_and_launched_by_grid_counts(monkeypatch):
    """``compiled = kernel.warmup(...); compiled[grid](...)`` (a host-overhead cut on a GPU) skips JITFunction.run:
    its launches are recorded too, with their arguments (the launcher itself needs a GPU: a stand-in here)."""
    from triton.compiler.compiler import CompiledKernel
    monkeypatch.setattr(CompiledKernel, "__getitem__", lambda self, grid: lambda *args, **kw: None)
    q = torch.randn(2, 8)
    with guards.triton_launches() as seen:
        CompiledKernel.__getitem__(type("K", (), {"name": "attn_fwd"})(), (1, 1, 1))(q[:, :4], 3)
    assert seen == [("attn_fwd", {q.untyped_storage().data_ptr()})]


def _cached():
    cache = {}

    def fn(q, k, v, causal=False, scale=None):       # keyed by everything but the values
        key = (tuple(q.shape), causal, scale)
        if key not in cache:
            cache[key] = tiled(q, k, v, causal, scale)
        return cache[key]
    return fn


def _pointer_cached():
    cache = {}

    def fn(q, k, v, causal=False, scale=None):       # keyed by storage address
        if q.data_ptr() not in cache:
            cache[q.data_ptr()] = tiled(q, k, v, causal, scale)
        return cache[q.data_ptr()]
    return fn


def _shared_buffer():
    buf = {}

    def fn(q, k, v, causal=False, scale=None):
        o = tiled(q, k, v, causal, scale)
        buf.setdefault("o", torch.empty_like(o)).copy_(o)
        return buf["o"]
    return fn


@pytest.mark.parametrize("make, what", [(_cached, "second call"), (_pointer_cached, "second call|fourth call"),
                                        (_shared_buffer, "output returned by the first call changed")])
def test_caching_is_caught(make, what):
    fn = make()
    check_entry_point(fn, "medium")                  # the ordinary check cannot see it
    # (a freed address may be reused for the next inputs: the address cache then shows at once)
    with pytest.raises(CheatDetected, match=what):
        check_no_caching(fn, "medium")


def test_honest_function_passes_the_cache_check_and_wrong_one_fails_plainly():
    check_no_caching(forbid_framework_attention(tiled), "medium")
    with pytest.raises(AttentionCheckError) as err:
        check_no_caching(lambda q, k, v, causal=False, scale=None: torch.zeros_like(q), "small")
    assert not isinstance(err.value, CheatDetected)


def test_roofline():
    assert guards.peak_tflops("NVIDIA H100 80GB HBM3") == 989
    assert guards.peak_tflops("NVIDIA H100 PCIe") == 756
    assert guards.peak_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert guards.peak_tflops("Some Future GPU") is None
    assert guards.roofline_verdict(480, "NVIDIA H100 80GB HBM3") is None
    msg = guards.roofline_verdict(1500, "NVIDIA H100 80GB HBM3")
    assert msg and "above what" in msg and "another CUDA stream" in msg
    assert guards.roofline_verdict(400, "NVIDIA A100-SXM4-80GB")
    assert guards.roofline_verdict(50, "x", ceiling=40) and guards.roofline_verdict(41, "x", ceiling=40) is None


# ----------------------------------------------------------------------------- K and V copied per query head
def _gqa_inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 64, 32, generator=g)
    k, v = torch.randn(2, 2, 96, 32, generator=g), torch.randn(2, 2, 96, 32, generator=g)
    return q, k.transpose(1, 2).contiguous().transpose(1, 2), v      # k a strided view, as the checks pass it


def _outputs(q):
    return torch.empty_like(q), torch.empty(q.shape[:3])


KV_COPIES = {
    "repeat_interleave": lambda q, k, v: (k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)),
    "index_select": lambda q, k, v: (k.index_select(1, torch.arange(8) // 4), v.index_select(1, torch.arange(8) // 4)),
    "expand_reshape": lambda q, k, v: tuple(t[:, :, None].expand(2, 2, 4, 96, 32).reshape(2, 8, 96, 32) for t in (k, v)),
    "cat": lambda q, k, v: (torch.cat([k] * 4, dim=1), torch.cat([v] * 4, dim=1)),
    "buffer_filled_head_by_head": lambda q, k, v: tuple(
        torch.stack([t[:, h // 4] for h in range(8)], dim=1) for t in (k, v)),
}


@pytest.mark.parametrize("how", KV_COPIES)
def test_kv_copied_per_query_head_is_caught(how):
    """Step 05's guard: GQA is the kernel's. Every way to hand a multi-head kernel K and V repeated for
    each query head raises, naming the cause."""
    def expanded(q, k, v, causal=False, scale=None):
        KV_COPIES[how](q, k, v)
        return _outputs(q)

    with pytest.raises(CheatDetected, match=r"K and V copied once per query head.*h // \(Hq // Hkv\)"):
        forbid_framework_attention(expanded, forbid_kv_copies=True)(*_gqa_inputs())
    forbid_framework_attention(expanded)(*_gqa_inputs())          # the other steps' guard lets it be


def test_outputs_and_one_copy_of_each_input_are_allowed():
    def contiguous_copies(q, k, v, causal=False, scale=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return _outputs(q)

    o, lse = forbid_framework_attention(contiguous_copies, forbid_kv_copies=True)(*_gqa_inputs())
    assert o.shape == (2, 8, 64, 32) and lse.shape == (2, 8, 64)


def test_a_change_of_dtype_is_not_a_copy_per_head():
    def upcast(q, k, v, causal=False, scale=None):
        k, v = k.double(), v.double()                     # wasteful, not GQA expanded: as many elements
        return _outputs(q)

    forbid_framework_attention(upcast, forbid_kv_copies=True)(*_gqa_inputs())
