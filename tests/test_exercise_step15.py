"""Step 15, serving (packed variable-length prefill and chunked prefill on a paged cache): the exercise as
it is graded (CPU tier), and its check, facourse.serving.

The exercise's solution, put into the released notebook, scores every point a CPU can give (bf16 needs a
GPU and scores 0 here, saying why); the untouched stub scores 0 (``GRADING``, graded by
tests/test_exercise_grading.py in one autograde run with the other steps'). Each classic mistake, planted
in the solution's kernel, loses the points of a test whose message names it (the hidden tests run the
same checks through the judge). In process: every case passes the solution, and each classic mistake's
output (computed by the reference with the mistake) is named by the check.
"""
from __future__ import annotations

import pytest
import torch

from conftest import assert_planted_bugs_named, solution_and_stub
from facourse import serving
from facourse.rule import AttentionCheckError

STEP = "15_serving"
GPU_ONLY = {"test_bf16", "test_paged_bf16"}

# A varlen attention in PyTorch alone, sequence by sequence (products as multiply-and-sum: no matmul, no softmax op),
# standing in for the entry point: right, and no Triton kernel.
TORCH_VARLEN = """def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = torch.zeros_like(q), torch.full((q.shape[1], q.shape[0]), float("-inf"))
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qb, kb, vb = q[cq[b]:cq[b + 1]].double(), k[ck[b]:ck[b + 1]].double(), v[ck[b]:ck[b + 1]].double()
        if not len(qb) or not len(kb):
            continue
        g = qb.shape[1] // kb.shape[1]
        s = (qb[:, None] * kb.repeat_interleave(g, 1)[None]).sum(-1) * scale          # [Lq, Lk, Hq]
        if causal:
            i, j = torch.arange(len(qb))[:, None], torch.arange(len(kb))[None, :]
            s = s.masked_fill(~(j <= i + len(kb) - len(qb))[..., None], float("-inf"))
        m = s.amax(1, keepdim=True).nan_to_num(0.0, 0.0, 0.0)
        p = torch.exp(s - m)
        l = p.sum(1)
        ob = (p[..., None] * vb.repeat_interleave(g, 1)[None]).sum(1) / l.clamp(min=1e-300)[..., None]
        o[cq[b]:cq[b + 1]] = ob.to(q.dtype)
        lse[:, cq[b]:cq[b + 1]] = torch.where(l > 0, m[:, 0] + l.log(), float("-inf")).t().float()
    return o, lse


def _triton_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None):"""

# (the cell, the solution's text, the mistake, the test that loses its point, what its message names)
PLANTED = {
    "top_left": ("kernel", "keep = keep & (offs_n[None, :] <= offs_m[:, None] + Lk - Lq)",
                 "keep = keep & (offs_n[None, :] <= offs_m[:, None])", "test_prefix", "aligned top-left"),
    "keys_by_cu_q": ("launch", "serving_kernel[grid](q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,",
                     "serving_kernel[grid](q, k, v, o, lse, cu_seqlens_q, cu_seqlens_q,", "test_prefix",
                     "found through cu_seqlens_q"),
    "table_ignored": ("kv_offsets",
                      "page = tl.load(TABLE + b.to(tl.int64) * stb + offs_n // page_size, mask=inside, other=0)",
                      "page = (offs_n // page_size + 0 * b)", "test_chunks", "the block table is ignored"),
    "empty_rows_nan": ("kernel", "l_safe = tl.where(l_i == 0.0, 1.0, l_i)", "l_safe = l_i", "test_empty_rows",
                       "these rows see no key"),
    "not_scaled": ("kernel", "tl.dot(q, tl.trans(k)) * qk_scale", "tl.dot(q, tl.trans(k)) * 1.4426950408889634",
                   "test_packed", "not scaled"),
    "always_causal": ("launch", "CAUSAL=causal, PAGED=False", "CAUSAL=True, PAGED=False", "test_noncausal",
                      "causal mask is applied with causal=False"),
    # found by reading the grader: each a gap the hidden tests once left open
    "paged_scale_ignored": ("launch", "block_table.stride(0), k_cache.shape[1], total_q, scale * LOG2E,",
                            "block_table.stride(0), k_cache.shape[1], total_q, LOG2E / math.sqrt(D),", "test_chunks",
                            "the scale given (0.05) is ignored"),
    "grid_by_max_k": ("launch", "grid = (triton.cdiv(max(max_seqlen_q, 1), BLOCK_M), B, Hq)\n"
                      "    serving_kernel[grid](q, k, v,",
                      "grid = (triton.cdiv(max(max_seqlen_k, 1), BLOCK_M), B, Hq)\n    serving_kernel[grid](q, k, v,",
                      "test_empty_rows", "no program wrote them"),
    "head_stride_d": ("kernel", "h * sqh + offs_d", "h * D + offs_d", "test_prefix", "o is off"),
    "cache_contiguous": ("launch", "*k_cache.stride()[:3], *v_cache.stride()[:3]",
                         "k_cache.shape[1] * k_cache.shape[2] * D, k_cache.shape[2] * D, D, "
                         "k_cache.shape[1] * k_cache.shape[2] * D, k_cache.shape[2] * D, D", "test_page48", "NaN"),
    "no_triton": ("launch", "def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, "
                  "causal=False, scale=None):", TORCH_VARLEN, "test_packed", "no Triton kernel ran"),
}

# the demo's samples: the solution scores every CPU point, the stub 0, carol's top-left causal mask loses test_prefix
GRADING = solution_and_stub(STEP, 13, GPU_ONLY, 2, PLANTED["top_left"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names it."""
    assert_planted_bugs_named(tmp_path, STEP, ("setup",), PLANTED)


# ----------------------------------------------------------------------------- the check, in process
def _planted(paged: bool, **mistake):
    """A function of the entry point's arguments that returns the reference computed with ``mistake``."""
    def fn(*args, causal=True, scale=None):
        inp = (serving.PagedPrefillInputs if paged else serving.VarlenInputs)(*args)
        o, lse = serving.serving_reference(inp, causal, scale, dtype=torch.float64, **mistake)
        return o.to(args[0].dtype), lse
    return fn


def _says(case: str, fn, text: str):
    c = serving.CPU_SERVING_CASES[case]
    with pytest.raises(AttentionCheckError) as err:
        (serving.check_paged_prefill if c.paged else serving.check_varlen)(fn, case, seed=5, verbose=False)
    assert text in str(err.value), str(err.value)
    return str(err.value)


def test_the_reference_passes_every_case():
    for case, c in serving.CPU_SERVING_CASES.items():
        (serving.check_paged_prefill if c.paged else serving.check_varlen)(_planted(c.paged), case, seed=3,
                                                                            verbose=False)


def test_each_classic_mistake_is_named():
    msg = _says("packed", _planted(False, one_sequence=True), "the sequences see each other")
    assert "q_len/kv_len of each" in msg and "sequences" in msg
    _says("noncausal", _planted(False, one_sequence=True), "the sequences see each other")
    _says("prefix", _planted(False, align="top_left"), "aligned top-left")
    _says("prefix", _planted(False, align=None), "causal mask is missing")
    _says("noncausal", _planted(False, align="bottom_right"), "applied with causal=False")
    _says("packed", _planted(False, head_map=torch.arange(8) % 2), "wrong KV head")
    _says("chunks", _planted(True, chunk_only=True), "see only each other")
    _says("chunks", _planted(True, align="top_left"), "aligned top-left")
    table = serving.make_serving_inputs("page48", 5, "cpu", torch.float32).block_table
    _says("page48", _planted(True, table=torch.arange(table.shape[1], dtype=torch.int32).expand_as(table)),
          "the block table is ignored")
    cu_q = serving.cu_seqlens(serving.CPU_SERVING_CASES["prefix"].q_lens).tolist()
    _says("prefix", _planted(False, k_starts=cu_q[:-1], lens=serving.CPU_SERVING_CASES["prefix"].q_lens),
          "found through cu_seqlens_q")
    lens = serving.make_serving_inputs("chunks", 5, "cpu", torch.float32).seq_lens
    _says("chunks", _planted(True, lens=-(-lens // 16) * 16, keys_to=lens), "read past seq_len")


def test_the_layout_of_lse_and_o_is_checked():
    ok = _planted(False)
    _says("packed", lambda *a, **k: (ok(*a, **k)[0], ok(*a, **k)[1].t().contiguous()), "[Hq, total_q]")
    _says("packed", lambda *a, **k: (ok(*a, **k)[0][:-1], ok(*a, **k)[1]), "shape")
    # a wrong lse names its sequences with their lengths, as a wrong o does
    msg = _says("packed", lambda *a, **k: (ok(*a, **k)[0], ok(*a, **k)[1] / 0.6931471805599453), "natural log")
    assert "q_len/kv_len of each" in msg, msg
    # an input changed in place is reported, whatever the result
    def writes(q, k, v, *rest, **kw):
        out = ok(q, k, v, *rest, **kw)
        v[0, 0, 0] += 1.0
        return out
    _says("packed", writes, "modified")


def test_bad_inputs_are_refused_with_a_message():
    from facourse.reference import AttentionInputError
    inp = serving.make_serving_inputs("packed", 0, "cpu", torch.float32)
    serving.validate_varlen_inputs(*inp)
    bad = [inp._replace(cu_seqlens_q=inp.cu_seqlens_q.long()), inp._replace(max_seqlen_q=1),
           inp._replace(cu_seqlens_k=inp.cu_seqlens_k[:-1]), inp._replace(k=inp.k[:, :, :64])]
    for b in bad:
        with pytest.raises(AttentionInputError):
            serving.validate_varlen_inputs(*b)
    pin = serving.make_serving_inputs("chunks", 0, "cpu", torch.float32)
    serving.validate_paged_prefill_inputs(*pin)
    lens = pin.seq_lens.clone()
    lens[2] = 10                                         # fewer tokens in the cache than new ones
    table = pin.block_table.clone()
    table[1, 0] = pin.k_cache.shape[0]
    for b in (pin._replace(seq_lens=lens), pin._replace(block_table=table)):
        with pytest.raises(AttentionInputError):
            serving.validate_paged_prefill_inputs(*b)


def test_the_perf_cases_count_visible_pairs():
    c = serving.ServingCase("t", (2, 3), (4, 3), 1, 1, 1)
    assert c.pairs() == (3 + 4) + (1 + 2 + 3)           # bottom-right: query i sees i + kv_len - q_len + 1 keys
    assert serving.ServingCase("t", (2, 3), (4, 3), 1, 1, 1, causal=False).pairs() == 8 + 9
    assert serving.PERF_SERVING_CASES["prefill_mix"].flops() == 4 * 32 * 128 * sum(n * (n + 1) // 2 for n in
                                                                                 serving.PERF_SERVING_CASES["prefill_mix"].q_lens)


@pytest.mark.gpu
def test_the_solution_on_a_gpu():
    """Every case at full size in fp16 and bf16, through the rung that is the exercise's solution."""
    from benchmarks.rungs import entry_point
    from facourse.steps import load_step
    m = load_step("15")
    varlen, paged = entry_point(m, "v1_varlen_grid"), entry_point(m, "v1_paged")
    for dt in (torch.float16, torch.bfloat16):
        for case in serving.VARLEN_CASES:
            serving.check_varlen(varlen, case, seed=11, device="cuda", dtype=dt, verbose=False)
        for case in serving.PAGED_CASES:
            serving.check_paged_prefill(paged, case, seed=11, device="cuda", dtype=dt, verbose=False)


# ----------------------------------------------------------------------------- the guard and the scan
def _fa2_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, scale=None):
    """What a student who reads the course's bench might submit: PyTorch's own varlen attention (FlashAttention-2)."""
    from torch.nn.attention.varlen import AuxRequest, varlen_attn
    g = q.shape[1] // k.shape[1]                    # (PyTorch 2.11's takes no GQA)
    return varlen_attn(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), cu_q, cu_k, max_q, max_k, scale=scale,
                       window_size=(-1, 0) if causal else (-1, -1), return_aux=AuxRequest(lse=True))


def _fa2_varlen_swallowed(*args, **kwargs):
    try:
        return _fa2_varlen(*args, **kwargs)
    except Exception:                  # hides the guard's error (and, on a CPU, FlashAttention's) and goes on
        q = args[0]
        return torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0])


@pytest.mark.parametrize("cheat", [_fa2_varlen, _fa2_varlen_swallowed])
def test_the_guard_refuses_pytorchs_varlen_attention(cheat):
    """torch.nn.attention.varlen reaches the dispatcher as its own op (torch_attn::_varlen_attn), FlashAttention-2
    below it: the step's guard refuses it, also when the function catches the refusal and falls back."""
    from autograder.guards import CheatDetected, forbid_framework_attention
    pytest.importorskip("torch.nn.attention.varlen")
    with pytest.raises(CheatDetected, match="varlen_attn") as err:
        serving.check_varlen(forbid_framework_attention(cheat, forbid_matmul=True), "packed", seed=1, verbose=False)
    assert ("caught inside" in str(err.value)) == (cheat is _fa2_varlen_swallowed)


def test_the_scan_flags_pytorchs_varlen_attention():
    from autograder.scan import scan_source
    src = "from torch.nn.attention.varlen import varlen_attn\ndef varlen_attention(*a):\n    return varlen_attn(*a)\n"
    assert any("varlen_attn" in f.line for f in scan_source(src, "cell"))
