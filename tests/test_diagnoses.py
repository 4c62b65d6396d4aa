"""Diagnoses that name the bug (issue 20): each test plants one bug in a copy of the exercise's
solution and asserts that the check's "likely cause" names it, not a neighbour.

03: an unwritten last block and a merge without alpha are not "no max subtraction"; a block whose
own max is -inf says so. 04: a `>=` causal mask is named as the diagonal. 05: a forgotten qk_scale
is named as the scale, not "a block boundary?".
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, solution_code
from facourse import AttentionCheckError, SoftmaxCheckError, check_entry_point, check_softmax_fn

HEAD = "import math\nimport torch\nfrom facourse import validate_inputs\n"


def mutate(code: str, *subs) -> str:
    for old, new in subs:
        assert old in code, f"planted bug out of date: {old!r} is not in the solution"
        code = code.replace(old, new)
    return code


def functions(assignment: str, **mutations) -> dict:
    """The solution cells of ``assignment`` executed in one namespace, cell ``gid`` mutated by
    ``mutations[gid]`` (a list of (old, new))."""
    ns: dict = {}
    code = solution_code(assignment)
    exec(HEAD, ns)
    for gid, src in code.items():
        exec(mutate(src, *mutations.get(gid, ())), ns)
    return ns


def cause(err) -> str:
    return str(err.value).split("likely cause:")[-1]


# ----------------------------------------------------------------------------- step 03
A3 = "03_online_softmax"


def test_03_solution_passes():
    ns = functions(A3)
    for case, bs in (("overflow", 48), ("small", 32), ("masked", 50)):
        check_softmax_fn(ns["online_softmax"], case, block_size=bs, seed=0, verbose=False)


def test_03_merge_without_alpha_is_not_called_overflow():
    ns = functions(A3, merge_softmax_states=[(
        "l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)", "l = l_a + l_b")])
    for case, bs in (("overflow", 64), ("small", 32)):
        with pytest.raises(SoftmaxCheckError) as err:
            check_softmax_fn(ns["online_softmax"], case, block_size=bs, seed=0, verbose=False)
        c = cause(err)
        assert "alpha rescale missing" in c and "no max subtraction" not in c, c


def test_03_unwritten_last_block_is_not_called_overflow():
    ns = functions(A3, online_softmax=[
        ("y = torch.empty_like(x)", "y = torch.zeros_like(x)"),
        ("for j in range(0, n, block_size):                                  # pass 2",
         "for j in range(0, n - block_size + 1, block_size):                  # pass 2")])
    with pytest.raises(SoftmaxCheckError) as err:
        check_softmax_fn(ns["online_softmax"], "overflow", block_size=48, seed=0, verbose=False)
    c = cause(err)
    assert "the last partial block" in c and "no max subtraction" not in c, c


def test_03_block_whose_own_max_is_minus_inf():
    ns = functions(A3, online_softmax=[(
        "m_j_safe = torch.where(torch.isneginf(m_j), torch.zeros_like(m_j), m_j)", "m_j_safe = m_j")])
    with pytest.raises(SoftmaxCheckError) as err:
        check_softmax_fn(ns["online_softmax"], "small", block_size=32, seed=0, verbose=False)
    c = cause(err)
    assert "a block whose entries are all -inf" in c and "own max is -inf" in c, c
    assert "do not sum to 1" not in c


def test_03_no_max_subtraction_is_still_named():
    ns = functions("02_safe_softmax", safe_softmax=[("torch.exp(xf - m)", "torch.exp(xf)")])
    with pytest.raises(SoftmaxCheckError) as err:
        check_softmax_fn(ns["safe_softmax"], "overflow", seed=0, verbose=False)
    assert "no max subtraction" in cause(err)


# ----------------------------------------------------------------------------- step 04
A4 = "04_tiled_attention"
GE = ("cols > rows + off", "cols >= rows + off")


def test_04_greater_or_equal_mask_is_named_as_the_diagonal():
    ns = functions(A4, tiled_attention=[GE])
    for cfg in ("small", "ragged"):
        with pytest.raises(AttentionCheckError) as err:
            check_entry_point(ns["tiled_attention"], cfg, seed=0, expect_lse=True, verbose=False)
        c = cause(err)
        assert "diagonal" in c and "every row is wrong" not in c, (cfg, c)


def test_04_greater_or_equal_mask_without_guard_is_named_as_the_diagonal():
    """Unguarded, row 0 of a square causal problem (its one key masked) is NaN: the same cause."""
    ns = functions(A4, tiled_attention=[GE, (
        "m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)", "m_safe = m_new")])
    for cfg in ("small", "empty_rows"):       # empty_rows: row Sq - Skv has one key, the rows above none
        with pytest.raises(AttentionCheckError) as err:
            check_entry_point(ns["tiled_attention"], cfg, seed=0, expect_lse=True, verbose=False)
        assert "NaN" in str(err.value) and "diagonal" in cause(err), str(err.value)


def test_04_solution_passes():
    ns = functions(A4)
    for cfg in ("small", "ragged"):
        check_entry_point(ns["tiled_attention"], cfg, seed=0, expect_lse=True, verbose=False)


# ----------------------------------------------------------------------------- step 05
A5 = "05_triton_flash_attention"


def _ex05_source(*subs) -> str:
    nb = json.loads((ROOT / "solutions" / A5 / f"{A5}.ipynb").read_text())
    src = "\n\n".join("\n".join(ln for ln in "".join(c["source"]).splitlines() if "### " not in ln)
                      for c in nb["cells"]
                      if c["metadata"].get("nbgrader", {}).get("grade_id") in ("setup", "kernel", "wrapper"))
    return mutate(src, *subs)


def _run05(src: str, cfg: str) -> str:
    code = src + textwrap.dedent(f"""
        from facourse import AttentionCheckError
        try:
            check_entry_point(flash_attention_triton, {cfg!r}, seed=0, expect_lse=True, verbose=False)
            print("PASSED")
        except AttentionCheckError as e:
            print("FAILED", str(e).split("likely cause:")[-1].replace("\\n", " "))
        """)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_05_forgotten_qk_scale_is_named_as_the_scale():
    src = _ex05_source(("m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)", "m_new = tl.maximum(m_i, tl.max(s, 1))"),
                       ("p = tl.math.exp2(s * qk_scale - m_use[:, None])", "p = tl.math.exp2(s - m_use[:, None])"))
    out = _run05(src, "small")
    assert out.startswith("FAILED") and "qk_scale is never applied" in out and "block boundary" not in out, out


def test_05_exp2_without_log2e_is_named_as_the_scale():
    out = _run05(_ex05_source(("scale * LOG2E, GROUP=", "scale, GROUP=")), "small")
    assert out.startswith("FAILED") and "off by ln 2" in out and "block boundary" not in out, out


def test_top_left_in_fp16_is_named_when_rows_of_few_keys_round_past_the_tolerance():
    """A top-left causal kernel on asymmetric (Sq 128, Skv 2048), fp16: its first rows see one or two keys,
    so their outputs are values of V themselves, a few units large, which fp16 rounds by more than the
    check's tolerance (set by the right answer, whose rows average ~2000 keys). The diagnosis still
    names top-left (on an H100 a TileLang kernel with this bug got "every row is wrong" on one seed)."""
    import torch

    from facourse.check import check_attention
    from facourse.reference import reference_attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 128, 64, generator=g).half()
    k = torch.randn(1, 2, 2048, 64, generator=g).half()
    v = (4 * torch.randn(1, 2, 2048, 64, generator=g)).half()
    top_left = reference_attention(q, k, v, True, None, dtype=torch.float32, align="top_left")[0].half()
    with pytest.raises(AttentionCheckError, match="top-left causal alignment"):
        check_attention(top_left, q, k, v, causal=True, config="asymmetric").raise_if_failed()


# ----------------------------------------------------------------------------- step 08
def _step08_inputs(causal=True, Sq=40, Skv=56):
    import torch

    from facourse.backward import draw_dout
    from facourse.configs import AttnConfig, make_inputs
    cfg = AttnConfig("planted", 1, 4, 2, Sq, Skv, 32, causal)       # GQA, ragged (Sq < Skv unless told)
    q, k, v = make_inputs(cfg, 11, "cpu", torch.float32)
    return cfg, q, k, v, draw_dout(cfg, 11, "cpu", torch.float32)


def _check_grads(grads, q, k, v, do, causal):
    import torch

    from facourse.backward import check_gradients_of
    from facourse.reference import reference_attention
    o = reference_attention(q, k, v, causal)[0].to(q.dtype)
    return check_gradients_of(o, *(grads[n].to(torch.float32) for n in ("dq", "dk", "dv")), q, k, v, do, causal,
                              config="planted")


# Sq < Skv; Sq > Skv (top-left shows keys the forward hid); Sq - Skv >= Skv - 1 (top-left is no mask there)
@pytest.mark.parametrize("Sq, Skv", [(40, 56), (56, 40), (90, 30)])
def test_08_each_mistake_is_named_and_no_other(Sq, Skv):
    """Every step-08 mistake (in the whole backward, or in one of its two passes), given the gradients it
    produces, is named by the check with its own cause, and the pass it sits in."""
    from facourse.backward import backward_mistakes
    _, q, k, v, do = _step08_inputs(Sq=Sq, Skv=Skv)
    mistakes = backward_mistakes(q, k, v, do, True, None)
    causes = [m.cause for m in mistakes]
    assert len(mistakes) > 20 and any("off by one on the diagonal" in c for c in causes)
    assert sum("aligned top-left" in c for c in causes) == 3 and sum("h % Hkv" in c for c in causes) == 3, causes
    for m in mistakes:
        with pytest.raises(AttentionCheckError) as err:
            _check_grads(m.produce(), q, k, v, do, True)
        assert cause(err).strip() == m.cause, (m.cause, str(err.value))
        for name in ("dq", "dk", "dv"):       # the message leads with a gradient the mistake breaks
            if str(err.value).split("] ", 1)[1].startswith(f"{name} is wrong"):
                assert name in m.breaks, (m.cause, str(err.value))


def test_08_a_nearly_right_dq_is_not_blamed_on_a_mistake_that_leaves_dq_right():
    """dQ off by 3 %, dK and dV right: neither "dK misses the softmax scale" (its dQ is the reference's) nor
    "dQ is scaled twice" (another dQ); the message says which gradient is wrong, where, and that the others
    are right."""
    from facourse.backward import attention_grads
    _, q, k, v, do = _step08_inputs()
    dq, dk, dv = attention_grads(q, k, v, do, True)
    dq = dq.clone()
    dq[:, :, 7:] *= 1.03
    with pytest.raises(AttentionCheckError) as err:
        _check_grads({"dq": dq, "dk": dk, "dv": dv}, q, k, v, do, True)
    c = cause(err)
    assert "no classic mistake matches: dq at query rows 7-39" in c and "dk and dv right" in c, c
    assert "scale" not in c.split(".")[0] and "dK misses" not in c and "scaled twice" not in c, c


def test_08_a_mistake_far_larger_than_the_gradients_is_named_through_float32_rounding():
    """On this seed of ``d64``, dQ rebuilt with the next row's lse reaches 5.7e3 (the gradients: 2.8); a
    float32 kernel's sums leave it about 1e-6 off (8 ulps there), past the rule's 2.8e-3 but within the
    tolerance at the mistake's own scale: named, with its pass."""
    import torch

    from facourse.backward import attention_grads, draw_dout
    from facourse.configs import get_config, make_inputs
    cfg, seed = get_config("d64", "cpu"), 978121617
    q, k, v = make_inputs(cfg, seed, "cpu", torch.float32)
    do = draw_dout(cfg, seed, "cpu", torch.float32)
    dq = attention_grads(q, k, v, do, True, variant="lse_next_row_wrap")[0]
    _, dk, dv = attention_grads(q, k, v, do, True)
    assert float(dq.abs().max()) > 1000
    with pytest.raises(AttentionCheckError) as err:
        _check_grads({"dq": dq * (1 + 1e-6), "dk": dk, "dv": dv}, q, k, v, do, True)
    assert "another row's lse" in cause(err) and "(in the pass that computes dQ)" in cause(err), str(err.value)


def test_08_correct_gradients_pass():
    from facourse.backward import attention_grads
    _, q, k, v, do = _step08_inputs()
    lines = _check_grads(dict(zip(("dq", "dk", "dv"), attention_grads(q, k, v, do, True))), q, k, v, do, True)
    assert len(lines) == 4 and all("passed" in ln for ln in lines)


# 09: an unsafe merge's NaN is not the NaN of an ignored block table (a seed once placed sequence 0's only
# page at physical page 0, so "the block table is ignored" broke exactly the sequences the overflow broke)
def test_paged_inputs_put_no_page_at_its_own_index():
    from facourse.decode import CPU_DECODE_CASES, _fixed_pages, make_paged_inputs
    for name, case in CPU_DECODE_CASES.items():
        for seed in [*range(40), 318778538]:
            table = make_paged_inputs(case, seed, "cpu").block_table
            assert not _fixed_pages(table, case.seq_lens, case.page_size), (name, seed)


def test_overflowed_merge_is_named_on_the_seed_that_misnamed_it():
    from dataclasses import replace

    import torch

    from facourse.decode import check_paged_result, get_decode_case, make_paged_inputs, paged_reference
    case = replace(get_decode_case("page64", "cpu"), logit_scale=64.0)
    inp = make_paged_inputs(case, 318778538, "cpu")
    o, lse = paged_reference(*inp)
    o, lse = o.to(inp.q.dtype), lse.float()
    o[1:] = float("nan")                       # an unsafe merge: inf / inf on every sequence longer than a split
    with pytest.raises(AttentionCheckError, match="exponentiates lse without subtracting the max"):
        check_paged_result(o, lse, inp, config="page64")


def _paged_result_error(inp, o, lse, case) -> str:
    from facourse.decode import check_paged_result, get_decode_case
    with pytest.raises(AttentionCheckError) as err:
        check_paged_result(o.to(inp.q.dtype), lse.float(), inp, config=get_decode_case(case, "cpu").describe())
    return str(err.value)


@pytest.mark.parametrize("strides", ["contiguous", "token_stride_D"])
def test_09_q_read_with_wrong_strides_is_named_not_the_merge(strides):
    """q is a view of [B, Sq, Hq, D] storage: a kernel that reads it as contiguous [B, Hq, Sq, D], or takes
    its token stride as D, gets other heads' and tokens' rows. A sequence whose rows see one key is right
    whatever q is: that must not pass for "short sequences right, long ones wrong" (the merge)."""
    import torch

    from facourse.decode import make_paged_inputs, paged_reference
    for case in ("spec", "d64"):
        inp = make_paged_inputs(case, 11, "cpu")
        q = inp.q
        B, Hq, Sq, D = q.shape
        if Sq == 1:
            continue
        wrong = ((Hq * Sq * D, Sq * D, D, 1) if strides == "contiguous" else (q.stride(0), q.stride(1), D, 1))
        o, lse = paged_reference(torch.as_strided(q, q.shape, wrong, q.storage_offset()), *inp[1:])
        msg = _paged_result_error(inp, o, lse, case)
        assert "q is read with the wrong strides" in cause_text(msg) and "merge" not in cause_text(msg), msg
        assert f"Sq={Sq}" in msg and "query rows" in msg, msg


def test_09_a_sequence_of_one_key_proves_nothing_about_the_merge():
    """Every row of the 1-token sequence sees one key, so its o is that key's v whatever the scores: a q
    wrong on every head leaves it right and breaks every longer sequence, which is no merge fault."""
    from facourse.decode import make_paged_inputs, paged_reference
    inp = make_paged_inputs("mixed", 3, "cpu")
    o, lse = paged_reference(inp.q.flip(1), *inp[1:])          # query head h read as head Hq - 1 - h
    msg = _paged_result_error(inp, o, lse, "mixed")
    assert "1: 1" not in msg and "merge of the splits (each partial" not in msg, msg
    assert "q's strides" in cause_text(msg), msg


def test_09_int64_seq_lens_read_as_int32_is_named():
    """int64 seq_lens read through an int32 pointer: sequence b gets 32-bit word b (the low word of
    length b // 2 or a high word, 0)."""
    from dataclasses import replace

    import torch

    from facourse.decode import get_decode_case, make_paged_inputs, paged_reference
    case = replace(get_decode_case("spec", "cpu"), Sq=8, lens_dtype="int64")
    inp = make_paged_inputs(case, 5, "cpu")
    assert inp.seq_lens.dtype == torch.int64
    o, lse = paged_reference(*inp, lens=inp.seq_lens.view(torch.int32)[:case.B])
    msg = _paged_result_error(inp, o, lse, case)
    assert "seq_lens is int64 here and was read as int32" in cause_text(msg), msg
    assert "seq_lens" in msg and "int64" in msg.split("likely cause")[0], msg


def cause_text(msg: str) -> str:
    return msg.split("likely cause:", 1)[-1]


def test_09_rows_never_computed_are_not_blamed_on_unmasked_loads():
    """ROWS fixed at 16 with G * Sq = 32 (Sq = 8): heads 2-3 of each group of 4 are never computed, their o
    is whatever torch.empty held (NaN here) in every sequence alike: no load of a NaN key does that."""
    from dataclasses import replace

    from facourse.decode import get_decode_case, make_paged_inputs, paged_reference
    case = replace(get_decode_case("spec", "cpu"), Sq=8)
    inp = make_paged_inputs(case, 7, "cpu")
    o, lse = paged_reference(*inp)
    o[:, [2, 3, 6, 7]] = float("nan")
    msg = _paged_result_error(inp, o, lse, case)
    assert "query heads 2-3, 6-7" in msg and "Sq=8" in msg, msg
    assert "never computed" in cause_text(msg) and "G * Sq = 32" in cause_text(msg), msg
