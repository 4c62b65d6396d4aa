"""The one check accepts results within rounding and rejects each planted fault, naming its cause."""
import math

import pytest
import torch

from facourse import (AttentionCheckError, check_attention, check_entry_point, make_inputs,
                      nan_filled_allocations, reference_attention)
from facourse.configs import EDGE_CASES, AttnConfig


def good(q, k, v, causal=False, scale=None):
    """A correct attention that rounds like a kernel: fp32 math, output in q's dtype, with lse."""
    o, lse = reference_attention(q, k, v, causal, scale, dtype=torch.float32)
    return o.to(q.dtype), lse


def good_o(q, k, v, causal=False, scale=None):
    return good(q, k, v, causal, scale)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("cfg", ["small", "asymmetric", "ragged", "empty_rows", "decode", "mqa", "overflow", "d64"])
def test_accepts_correct_results(cfg, dtype):
    check_entry_point(good, cfg, dtype=dtype, expect_lse=True, verbose=False)


def test_accepts_fp16_result_with_kernel_like_rounding():
    # fp16 inputs, scores in fp32, P rounded to fp16 before P V (what a tensor-core kernel does)
    def kernel_like(q, k, v, causal=False, scale=None):
        B, Hq, Sq, D = q.shape
        g = Hq // k.shape[1]
        s = q.float() @ k.repeat_interleave(g, 1).float().transpose(-1, -2) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.ones(Sq, k.shape[2], dtype=torch.bool).tril(k.shape[2] - Sq).logical_not(), -math.inf)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        o = (p.half().float() @ v.repeat_interleave(g, 1).float()) / l
        return o.half()
    check_entry_point(kernel_like, "medium", dtype=torch.float16, verbose=False)


def run_fault(fault, cfg="small", dtype=torch.float32, **kw):
    with pytest.raises(AttentionCheckError) as e:
        check_entry_point(fault, cfg, dtype=dtype, verbose=False, **kw)
    return str(e.value)


def test_rejects_one_wrong_row_and_names_it():
    def fault(q, k, v, causal=False, scale=None):
        o = good_o(q, k, v, causal, scale).clone()
        o[0, 3, 77] += 0.05
        return o
    msg = run_fault(fault)
    assert "[small" in msg and "query rows 77 (1 of 128)" in msg and "heads 3" in msg


def test_rejects_nan():
    def fault(q, k, v, causal=False, scale=None):
        o = good_o(q, k, v, causal, scale).clone()
        o[0, 0, 5, 5] = float("nan")
        return o
    assert "NaN or inf" in run_fault(fault)


def test_rejects_all_zeros():
    assert "all zeros" in run_fault(lambda q, k, v, causal=False, scale=None: torch.zeros_like(q))


def test_rejects_mean_of_v():
    def fault(q, k, v, causal=False, scale=None):
        g = q.shape[1] // k.shape[1]
        return v.repeat_interleave(g, 1).mean(2, keepdim=True).expand_as(q).contiguous()
    assert "mean of V" in run_fault(fault, "noncausal")


def test_rejects_an_unwritten_element():
    def fault(q, k, v, causal=False, scale=None):
        o = torch.empty_like(q)
        ref = good_o(q, k, v, causal, scale)
        o[:, :, :-1] = ref[:, :, :-1]  # forgets the last row
        return o
    msg = run_fault(fault, "ragged")
    assert "never written" in msg and "query rows 199 (1 of 200)" in msg


def test_nan_filled_allocations_fill_and_restore():
    originals = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    with nan_filled_allocations("cpu"):
        assert torch.isnan(torch.empty(3)).all() and torch.isnan(torch.empty_like(torch.ones(2))).all()
        assert torch.isnan(torch.ones(1).new_empty(4)).all()
        assert torch.empty(3, dtype=torch.int32).dtype == torch.int32
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == originals
    assert not torch.isnan(torch.zeros(3)).any()


def test_names_top_left_causal():
    def fault(q, k, v, causal=False, scale=None):
        return reference_attention(q, k, v, causal, scale, align="top_left")[0].to(q.dtype)
    assert "top-left" in run_fault(fault, "asymmetric")


def test_names_the_modulo_head_mapping():
    def fault(q, k, v, causal=False, scale=None):
        wrong = torch.arange(q.shape[1]) % k.shape[1]
        return reference_attention(q, k, v, causal, scale, head_map=wrong)[0].to(q.dtype)
    assert "h % Hkv" in run_fault(fault, "medium")


def test_names_a_missing_scale_and_a_missing_mask():
    def no_scale(q, k, v, causal=False, scale=None):
        return reference_attention(q, k, v, causal, 1.0)[0].to(q.dtype)

    def no_mask(q, k, v, causal=False, scale=None):
        return reference_attention(q, k, v, False, scale)[0].to(q.dtype)
    assert "scale is missing" in run_fault(no_scale)
    assert "causal mask is missing" in run_fault(no_mask)


def test_names_missing_rescale_from_a_block_boundary():
    # rows from 64 on use the wrong (stale) normaliser, the symptom of a missing alpha rescale
    def fault(q, k, v, causal=False, scale=None):
        o = good_o(q, k, v, causal, scale).clone()
        o[:, :, 64:] *= 0.7
        return o
    assert "alpha" in run_fault(fault, "medium")


def test_empty_rows_must_be_zero_and_lse_minus_inf():
    def nan_rows(q, k, v, causal=False, scale=None):
        o = good_o(q, k, v, causal, scale).clone()
        o[:, :, :200] = float("nan")
        return o
    assert "see no key" in run_fault(nan_rows, "empty_rows")

    def bad_lse(q, k, v, causal=False, scale=None):
        o, lse = good(q, k, v, causal, scale)
        return o, torch.nan_to_num(lse, neginf=0.0)
    assert "lse" in run_fault(bad_lse, "empty_rows", expect_lse=True)


def test_lse_in_base_two_is_named():
    def base2(q, k, v, causal=False, scale=None):
        o, lse = good(q, k, v, causal, scale)
        return o, lse / math.log(2)
    assert "ln 2" in run_fault(base2, "small", expect_lse=True)


def test_contract_errors():
    assert "dtype" in run_fault(lambda q, k, v, causal=False, scale=None: good_o(q, k, v, causal).double())
    assert "shape" in run_fault(lambda q, k, v, causal=False, scale=None: good_o(q, k, v, causal)[:, :, :-1])
    assert "pair (o, lse)" in run_fault(good_o, expect_lse=True)

    def mutates(q, k, v, causal=False, scale=None):
        o = good_o(q, k, v, causal, scale)
        q.mul_(2)
        return o
    assert "modified" in run_fault(mutates)


def test_check_attention_directly_and_scale_argument():
    cfg = AttnConfig("t", 1, 4, 2, 33, 65, 64, True)
    q, k, v = make_inputs(cfg, seed=3)
    o, lse = reference_attention(q, k, v, True, 0.2)
    report = check_attention(o.float(), q, k, v, True, 0.2, lse)
    assert report.max_abs_err < 1e-5 and report.lse_max_err < 1e-5
    with pytest.raises(AttentionCheckError, match="scale argument was ignored"):
        check_attention(reference_attention(q, k, v, True)[0].float(), q, k, v, True, 0.2)


def test_warnings_are_reported_on_stdout(capsys):
    import warnings

    def noisy(q, k, v, causal=False, scale=None):
        warnings.warn("deprecated thing")
        return good_o(q, k, v, causal, scale)
    check_entry_point(noisy, "small")
    out, err = capsys.readouterr()
    assert "deprecated thing" in out and err == ""


def test_overflow_case_names_safe_softmax():
    def unsafe(q, k, v, causal=False, scale=None):
        g = q.shape[1] // k.shape[1]
        s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        p = torch.exp(s)
        return (p / p.sum(-1, keepdim=True)) @ v.repeat_interleave(g, 1)
    assert "subtract the row max" in run_fault(unsafe, EDGE_CASES["overflow"])


@pytest.mark.parametrize("block_n,rescale_l", [(64, True), (32, False)])
def test_names_a_missing_alpha_rescale(block_n, rescale_l):
    from facourse.check import _without_alpha

    def fault(q, k, v, causal=False, scale=None):
        return _without_alpha(q, k, v, causal, scale, block_n)[0 if rescale_l else 1].to(q.dtype)
    msg = run_fault(fault, "medium")
    assert f"key tiles of {block_n}" in msg and "alpha" in msg


def test_check_all_runs_every_case_and_stops_at_a_fault(capsys):
    from facourse import check_all

    check_all(good, dtypes=(torch.float32,))
    out = capsys.readouterr().out
    for name in ("[small", "[asymmetric", "[ragged", "[empty_rows", "[overflow", "[d64"):
        assert name in out

    def wrong_on_ragged_lengths(q, k, v, causal=False, scale=None):
        o, lse = good(q, k, v, causal, scale)
        return (o * 0.5, lse) if q.shape[2] % 64 else (o, lse)
    with pytest.raises(AttentionCheckError, match=r"\[ragged"):
        check_all(wrong_on_ragged_lengths, dtypes=(torch.float32,), verbose=False)


@pytest.mark.parametrize("causal, scale", [(True, None), (True, 0.3), (False, None)])
def test_each_forward_mistake_is_named_and_no_other(causal, scale):
    """Every mistake of attention_mistakes, given the output it produces, is named by the check with its
    own cause (the one match criterion, rule.matches, tells them apart)."""
    from facourse.check import attention_mistakes
    from facourse.configs import AttnConfig
    cfg = AttnConfig("planted", 1, 4, 2, 40, 72, 32, causal)      # GQA, Sq < Skv, several key tiles of 16
    q, k, v = make_inputs(cfg, 5, "cpu", torch.float32)
    mistakes = attention_mistakes(q, k, v, causal, scale)
    assert len(mistakes) >= 10
    for m in mistakes:
        o = m.produce()["o"].to(torch.float32)
        with pytest.raises(AttentionCheckError) as err:
            check_attention(o, q, k, v, causal, scale, config="planted")
        assert str(err.value).split("likely cause: ")[-1] == m.cause, (m.cause, str(err.value))
