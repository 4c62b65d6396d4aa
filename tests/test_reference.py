"""The reference is attention as PyTorch computes it: both causal alignments, GQA, ragged, Sq > Skv."""
import math

import pytest
import torch
import torch.nn.functional as F

from facourse import (AttentionInputError, causal_mask, get_config, make_inputs, reference_attention,
                      validate_inputs, visible_pairs)
from facourse.configs import CONFIGS, CPU_CONFIGS, EDGE_CASES, AttnConfig


def sdpa(q, k, v, **kw):
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(group, 1),
                                          v.double().repeat_interleave(group, 1), **kw)


@pytest.mark.parametrize("Sq,Skv", [(64, 64), (37, 101), (128, 333), (1, 50)])
def test_bottom_right_matches_pytorch_lower_right_bias(Sq, Skv):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = make_inputs(AttnConfig("t", 2, 4, 2, Sq, Skv, 64, True), seed=1)
    o, _ = reference_attention(q, k, v, causal=True)
    want = sdpa(q, k, v, attn_mask=causal_lower_right(Sq, Skv))
    torch.testing.assert_close(o, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("Sq,Skv", [(64, 64), (37, 101)])
def test_top_left_matches_pytorch_is_causal(Sq, Skv):
    q, k, v = make_inputs(AttnConfig("t", 1, 4, 1, Sq, Skv, 32, True), seed=2)
    o, _ = reference_attention(q, k, v, causal=True, align="top_left")
    torch.testing.assert_close(o, sdpa(q, k, v, is_causal=True), rtol=1e-9, atol=1e-9)


def test_alignments_differ_when_lengths_differ_and_agree_when_equal():
    q, k, v = make_inputs(AttnConfig("t", 1, 2, 2, 16, 48, 32, True), seed=3)
    br, _ = reference_attention(q, k, v, causal=True)
    tl, _ = reference_attention(q, k, v, causal=True, align="top_left")
    assert (br - tl).abs().max() > 0.1
    q, k, v = make_inputs(AttnConfig("t", 1, 2, 2, 48, 48, 32, True), seed=3)
    torch.testing.assert_close(reference_attention(q, k, v, causal=True)[0],
                               reference_attention(q, k, v, causal=True, align="top_left")[0])


def test_gqa_noncausal_scale_and_lse():
    q, k, v = make_inputs(AttnConfig("t", 2, 8, 2, 40, 72, 64, False), seed=4)
    o, lse = reference_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(o, sdpa(q, k, v, scale=0.3), rtol=1e-9, atol=1e-9)
    # query head 5 reads KV head 5 // 4 = 1
    s = (q[:, 5].double() @ k[:, 1].double().transpose(-1, -2)) * 0.3
    torch.testing.assert_close(lse[:, 5].double(), torch.logsumexp(s, -1), rtol=1e-6, atol=1e-6)
    assert lse.dtype == torch.float32 and lse.shape == (2, 8, 40)


def test_rows_without_keys_give_zero_and_minus_inf():
    q, k, v = make_inputs(EDGE_CASES["empty_rows"], seed=5)
    o, lse = reference_attention(q, k, v, causal=True)
    empty = 300 - 100
    assert torch.all(o[:, :, :empty] == 0) and torch.isneginf(lse[:, :, :empty]).all()
    assert torch.isfinite(o).all() and torch.isfinite(lse[:, :, empty:]).all()
    # the first row with a key sees exactly key 0
    torch.testing.assert_close(o[:, :, empty], v[:, :, 0].double().expand_as(o[:, :, empty]))


def test_noncontiguous_inputs_give_the_same_result():
    cfg = EDGE_CASES["ragged"]
    a = make_inputs(cfg, seed=6, layout="bshd")
    b = make_inputs(cfg, seed=6, layout="bhsd")
    assert not a[0].is_contiguous() and a[0].stride(-1) == 1 and b[0].is_contiguous()
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    torch.testing.assert_close(reference_attention(*a, causal=True)[0], reference_attention(*b, causal=True)[0])


def test_visible_pairs_counts_the_mask():
    for Sq, Skv in [(128, 128), (128, 2048), (300, 100), (1, 7), (200, 333)]:
        assert visible_pairs(Sq, Skv, True) == int(causal_mask(Sq, Skv).sum())
        assert visible_pairs(Sq, Skv, False) == Sq * Skv


def test_the_five_configurations_follow_the_design():
    assert list(CONFIGS) == list(CPU_CONFIGS) == ["small", "medium", "large", "noncausal", "asymmetric"]
    for c in CONFIGS.values():
        assert (c.Hq, c.Hkv, c.D) == (32, 8, 128)
    shapes = {n: (c.B, c.Sq, c.Skv, c.causal) for n, c in CONFIGS.items()}
    assert shapes == {"small": (1, 128, 128, True), "medium": (4, 512, 512, True),
                      "large": (8, 2048, 2048, True), "noncausal": (4, 512, 512, False),
                      "asymmetric": (4, 128, 2048, True)}
    for n, c in CPU_CONFIGS.items():
        assert c.group == 4 and c.causal == CONFIGS[n].causal and (c.Sq < c.Skv) == (CONFIGS[n].Sq < CONFIGS[n].Skv)
    assert get_config("large", "cpu") is CPU_CONFIGS["large"]
    assert get_config("ragged", "cpu") is EDGE_CASES["ragged"]
    with pytest.raises(KeyError, match="unknown configuration"):
        get_config("huge", "cpu")
    assert CONFIGS["large"].flops() == 4 * 8 * 32 * 128 * visible_pairs(2048, 2048, True)


def test_seeds_are_reproducible_and_distinct():
    cfg = CPU_CONFIGS["small"]
    a, b, c = make_inputs(cfg, 7), make_inputs(cfg, 7), make_inputs(cfg, 8)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_overflow_case_really_overflows_an_unsafe_softmax():
    q, k, v = make_inputs(EDGE_CASES["overflow"], seed=9, dtype=torch.float32)
    s = q[:, 0] @ k[:, 0].transpose(-1, -2) / math.sqrt(q.shape[-1])
    assert torch.isinf(torch.exp(s)).any()


@pytest.mark.parametrize("make,match", [
    (lambda: (torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8)), "4 dimensions"),
    (lambda: (torch.zeros(1, 6, 8, 16), torch.zeros(1, 4, 8, 16), torch.zeros(1, 4, 8, 16)), "multiple of Hkv"),
    (lambda: (torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 32), torch.zeros(1, 2, 8, 32)), "head dims differ"),
    (lambda: (torch.zeros(1, 4, 8, 16, dtype=torch.int32),) * 3, "dtype"),
    (lambda: (torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16, dtype=torch.float16),
              torch.zeros(1, 2, 8, 16)), "share a dtype"),
    (lambda: (torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 9, 16)), "same shape"),
    (lambda: (torch.zeros(2, 4, 8, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16)), "batch sizes"),
])
def test_bad_inputs_get_a_clear_error(make, match):
    with pytest.raises(AttentionInputError, match=match):
        validate_inputs(*make())
    with pytest.raises(AttentionInputError, match=match):
        reference_attention(*make())


def test_bad_scale_is_refused():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(AttentionInputError, match="scale"):
        validate_inputs(q, q, q, scale=-1.0)
