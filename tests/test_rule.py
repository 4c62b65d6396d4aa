"""facourse.rule: the one correctness rule (the guarded call, compare, mistakes, the describer)."""
from __future__ import annotations

import warnings

import pytest
import torch

from facourse import rule
from facourse.reference import causal_mask, reference_attention
from facourse.rule import (ABS_SLACK, REL_LIMIT, CheckError, Mistake, check_lse, collecting, compare,
                           describe_rows, diagnose, guarded_call, is_collecting, masked_attention, matches,
                           max_abs, normalise_result, ranges, verifying)


def test_check_error_is_the_attention_check_error():
    from facourse import AttentionCheckError
    assert CheckError is AttentionCheckError and issubclass(CheckError, AssertionError)
    assert ABS_SLACK == 1e-3 and REL_LIMIT == 1e-2


def test_collecting_and_verifying_are_one_switch():
    from facourse import check
    assert check.collecting is collecting and check.is_collecting is is_collecting
    assert not is_collecting()
    with collecting():
        assert is_collecting()
        with verifying():
            assert not is_collecting()
        assert is_collecting()
    assert not is_collecting()


def test_say_is_silent_while_collecting(capsys):
    rule.say("one", "two")
    with collecting():
        rule.say("three")
    assert capsys.readouterr().out == "one\ntwo\n"


def test_ranges_and_describe_rows():
    assert ranges([]) == "none"
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert "more ranges" in ranges(list(range(0, 40, 2)))
    bad = torch.zeros(2, 4, 10, dtype=torch.bool)
    bad[1, :, 3:6] = True
    assert describe_rows(bad) == "query rows 3-5 (3 of 10); heads all 4; batches 1"
    bad2 = torch.zeros(3, 5, dtype=torch.bool)
    bad2[2, 4] = True
    assert describe_rows(bad2, ("ranks", "sequences")) == "sequences 4 (1 of 5); ranks 2"
    assert describe_rows(torch.tensor([False, True, True]), ("rows",)) == "rows 1-2 (2 of 3)"


def test_max_abs():
    assert max_abs(torch.tensor([-3.0, 2.0])) == 3.0 and max_abs(torch.empty(0)) == 0.0


def test_guarded_call_fills_new_allocations_with_nan():
    x = torch.ones(4)
    out = guarded_call(lambda t: torch.empty_like(t), x, tag="[t]")
    assert torch.isnan(out).all()
    assert not torch.isnan(torch.empty(3)).any() or True     # restored afterwards (contents are arbitrary)
    assert torch.empty is not None and torch.empty.__name__ == "empty"


def test_guarded_call_prints_warnings_on_stdout(capsys):
    def fn(x, *, scale):
        warnings.warn("deprecated thing")
        return x * scale
    out = guarded_call(fn, torch.ones(2), tag="[t]", scale=2.0)
    assert torch.equal(out, torch.full((2,), 2.0))
    cap = capsys.readouterr()
    assert "note: the call raised a warning: deprecated thing" in cap.out and cap.err == ""


def test_guarded_call_refuses_a_modified_input():
    x = torch.tensor([1.0, float("-inf"), 3.0])
    guarded_call(lambda t: t.clone(), x, tag="[t]", inputs={"x": x})        # -inf compares equal
    with pytest.raises(CheckError, match=r"\[t\] x was modified by the call: leave it"):
        guarded_call(lambda t: t.mul_(2), x, tag="[t]", inputs={"x": x}, untouched="leave it")

    class Mine(CheckError):
        pass
    with pytest.raises(Mine):
        guarded_call(lambda t: t.add_(1), torch.zeros(2), tag="[t]", error=Mine)


def test_compare_passes_and_fails_by_the_rules():
    ref = torch.linspace(-1, 1, 64, dtype=torch.float64).reshape(2, 32)
    ok = compare(ref.half(), ref, 1e-3, name="o", tag="[t]")
    assert ok.ok and ok.failure is None and ok.allowed == pytest.approx(2e-3 + ABS_SLACK)
    off = ref.clone()
    off[1, 5] += 0.1
    bad = compare(off, ref, 1e-4, name="o", tag="[t]")
    assert not bad.ok and bad.failure == "values" and bad.bad_rows.tolist() == [False, True]
    assert bad.worst[0] == (1, 5)
    msg = str(bad.error("because", labels=("rows",)))
    assert "[t] wrong values in o: max|o - ref| = 0.1" in msg and "rows 1 (1 of 2)" in msg and "because" in msg
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert compare(nan, ref, 1e-4, tag="[t]").failure == "nonfinite"
    # rule 3: the relative limit, independent of the absolute one
    small = ref * 1e-3
    rel = compare(small * 1.05, small, 1.0, tag="[t]")
    assert rel.failure == "values" and rel.rel >= REL_LIMIT and rel.bad.any()
    assert compare(small * 1.05, small, 1.0, tag="[t]", rel_limit=None).ok


def test_rule_3_scales_with_the_dtypes_rounding():
    """Rule 3's limit is REL_LIMIT in fp16 and fp32 and 8x that in bf16 (three significand bits fewer): a bf16
    result 1.5% off passes where rule 2 allows it; the same error in fp16 fails, and so does a bf16 result
    past 8% or past twice PyTorch's own error."""
    assert rule.rel_limit_of(torch.float16) == REL_LIMIT == rule.rel_limit_of(torch.float32)
    assert rule.rel_limit_of(torch.bfloat16) == pytest.approx(8 * REL_LIMIT) and rule.rel_limit_of(None) == REL_LIMIT
    ref = torch.linspace(-10, 10, 64, dtype=torch.float64).reshape(2, 32)
    off = ref.clone()
    off[0, 0] += 0.15                                        # 1.5e-2 of max|ref|
    own = 0.1                                                # PyTorch's own error: rule 2 allows 0.201
    b = compare(off.bfloat16(), ref, own, tag="[t]")
    assert b.ok and b.rel_limit == pytest.approx(8e-2), b.error("x")
    h = compare(off.half(), ref, own, tag="[t]")
    assert h.failure == "values" and h.rel >= REL_LIMIT and "must be < 0.01" in str(h.error("x"))
    far = ref.clone()
    far[0, 0] += 0.9                                         # within rule 2 (own 1.0), past 8%
    assert compare(far.bfloat16(), ref, 1.0, tag="[t]").failure == "values"
    assert compare(off.bfloat16(), ref, 0.01, tag="[t]").failure == "values"   # past twice PyTorch's own


def test_compare_empty_rows_must_hold_the_empty_value():
    ref = torch.randn(3, 4, dtype=torch.float64)
    ref[0] = 0.0
    empty = torch.tensor([True, False, False])[:, None]
    out = ref.clone()
    assert compare(out, ref, 0.0, empty=empty).ok
    out[0, 2] = 1e-5                         # within tolerance, but an empty row must be exactly 0
    c = compare(out, ref, 0.0, empty=empty)
    assert c.failure == "not_empty" and c.not_empty_rows.tolist() == [True, False, False]
    lse_ref = torch.tensor([float("-inf"), 1.0, 2.0], dtype=torch.float64)
    assert compare(lse_ref.float(), lse_ref, 0.0, empty=torch.isneginf(lse_ref), empty_value=float("-inf"),
                   row_dim=None).ok


def test_a_clean_pass_reports_what_the_whole_rule_computes(monkeypatch):
    """compare's short path for passing outputs (nothing empty, all finite, within the limits) gives the
    same figures and the same all-False masks as the whole rule; anything else takes the whole rule."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
    near = ref + 1e-4 * torch.randn(ref.shape, generator=g, dtype=torch.float64)
    cases = [dict(out=near.half()), dict(out=near.bfloat16(), rel_slack=1e-3), dict(out=near.float(), row_dim=None),
             dict(out=near, row_dim=2, rel_limit=None), dict(out=near, empty=torch.zeros(2, 3, 40, 1, dtype=torch.bool)),
             dict(out=ref.half())]
    fields = ("ok", "failure", "max_err", "allowed", "rel", "own", "ref_max", "rel_limit", "dtype", "worst")
    for kw in cases:
        out = kw.pop("out")
        short = compare(out, ref, 1e-2, tag="[t]", **kw)
        with monkeypatch.context() as m:
            m.setattr(rule, "_clean_pass", lambda *a: None)
            whole = compare(out, ref, 1e-2, tag="[t]", **kw)
        assert short.ok and whole.ok
        assert [getattr(short, f) for f in fields] == [getattr(whole, f) for f in fields], kw
        for mask in ("bad", "bad_rows", "nonfinite_rows", "not_empty_rows"):
            assert torch.equal(getattr(short, mask), getattr(whole, mask)), (mask, kw)
    nan, inf_ref, far = near.clone(), ref.clone(), near.clone()
    nan[1, 2, 3, 4] = float("nan")
    inf_ref[0, 0, 0, 0] = float("-inf")
    far[0, 1, 2, 3] += 1.0
    empty = torch.zeros(2, 3, 40, 1, dtype=torch.bool)
    empty[0, 0, 0] = True
    for out, r, kw in ((nan, ref, {}), (near, inf_ref, {}), (far, ref, {}), (ref * 1.05, ref, {"own": 1.0}),
                       (near, ref, {"empty": empty}), (near[:0], ref[:0], {})):
        assert rule._clean_pass(out, r, kw.get("empty"), kw.get("own", 1e-3), ABS_SLACK, 0.0, REL_LIMIT) is None


def test_compare_computes_nothing_while_collecting():
    def boom():
        raise RuntimeError("the reference must not be computed")
    with collecting():
        c = compare(torch.zeros(3), boom, boom, name="o", tag="[t]")
    assert c.ok and c.collected


def test_matches_allows_one_ulp_of_the_dtype():
    alt = torch.full((8,), 1000.0, dtype=torch.float64)
    out = (alt + 0.4).half()                 # fp16's ulp at 1000 is 0.5
    assert matches(out, alt, 0.0)
    assert not matches(out, alt + 2.0, 0.5)                # two ulps away, past tol
    f32 = torch.full((8,), 1.0, dtype=torch.float32)
    assert not matches(f32, f32.double() + 1e-3, 0.0)
    assert matches(f32, f32.double() + 1e-3, 2e-3)
    assert not matches(out, alt[:4], 1.0)                  # shapes differ
    nan = torch.tensor([float("nan"), 1.0])
    assert matches(nan, torch.tensor([float("nan"), 1.0]), 0.0) and not matches(nan, torch.ones(2), 0.0)


def _outs(**kw):
    return {n: torch.full((4,), float(v)) for n, v in kw.items()}


def test_diagnose_names_a_mistake_only_when_it_explains_every_wrong_output():
    student = _outs(dq=2, dk=5, dv=1)                      # dq and dk wrong, dv right
    only_dq = Mistake("dq only", lambda: _outs(dq=2, dk=1, dv=1), frozenset({"dq"}))
    both = Mistake("dq and dk", lambda: _outs(dq=2, dk=5, dv=1), frozenset({"dq", "dk"}))
    assert diagnose(student, {"dq", "dk"}, [only_dq], 1e-6) is None          # explains only part
    # its signature says it breaks dq alone: even outputs that happen to match do not make it the cause
    claims_dq = Mistake("claims dq", lambda: _outs(dq=2, dk=5, dv=1), frozenset({"dq"}))
    assert diagnose(student, {"dq", "dk"}, [claims_dq], 1e-6) is None
    assert diagnose(student, {"dq", "dk"}, [only_dq, both], 1e-6) is both
    too_much = Mistake("all three", lambda: _outs(dq=2, dk=5, dv=1), frozenset({"dq", "dk", "dv"}))
    assert diagnose(student, {"dq", "dk"}, [too_much], 1e-6) is None         # dv is right: not this one
    wrong_values = Mistake("dq and dk, other values", lambda: _outs(dq=3, dk=5, dv=1), frozenset({"dq", "dk"}))
    assert diagnose(student, {"dq", "dk"}, [wrong_values], {"dq": 0.5, "dk": 0.5}) is None
    assert diagnose(student, {"dq", "dk"}, [wrong_values], {"dq": 1.0, "dk": 0.5}) is wrong_values

    def broken():
        raise ValueError("cannot form")
    assert diagnose(student, {"dq"}, [Mistake("x", broken, frozenset({"dq"})), only_dq], 1e-6) is only_dq


def test_check_lse_and_normalise_result():
    q = torch.zeros(1, 2, 3, 4)
    ref = torch.tensor([[[float("-inf"), 1.0, 2.0]] * 2])
    assert check_lse(ref.clone(), ref, q, "[t]") == 0.0
    with pytest.raises(CheckError, match=r"rows that see no key, where it must be -inf \(l = 0\): .*query rows 0\b"):
        check_lse(torch.zeros(1, 2, 3), ref, q, "[t]")                   # an empty row's lse left 0
    with pytest.raises(CheckError, match="rows that see at least one key, where it must be finite: .*query rows 2"):
        check_lse(ref.clone().index_fill_(2, torch.tensor([2]), float("nan")), ref, q, "[t]")
    with pytest.raises(CheckError, match="divided by ln 2"):
        check_lse(ref / 0.6931471805599453, ref, q, "[t]")
    with pytest.raises(CheckError, match="float32"):
        check_lse(ref.double(), ref, q, "[t]")
    o = torch.ones(2)
    assert normalise_result((o, o), False, "[t]")[1] is None
    with pytest.raises(CheckError, match="returns a pair"):
        normalise_result(o, True, "[t]")
    with pytest.raises(CheckError, match="returned 3 values"):
        normalise_result((o, o, o), True, "[t]")


def test_masked_attention_is_the_reference_under_its_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    want = reference_attention(q, k, v, True, 0.3)[0]
    assert torch.allclose(masked_attention(q, k, v, 0.3, causal_mask(5, 5)), want)


def test_expect_tensor_says_what_differs():
    from facourse.rule import expect_tensor
    like = torch.zeros(2, 3)
    expect_tensor(torch.ones(2, 3), like, name="o", like_name="q", tag="[t]")
    with pytest.raises(CheckError, match=r"\[t\] o must be a torch.Tensor, got list"):
        expect_tensor([1], like, name="o", like_name="q", tag="[t]")
    with pytest.raises(CheckError, match=r"o has shape \(3, 2\); it must have q's shape \(2, 3\) = \[B\]"):
        expect_tensor(torch.ones(3, 2), like, name="o", like_name="q", tag="[t]", shape_note=" = [B]")
    with pytest.raises(CheckError, match="dtype torch.float16; it must have q's dtype torch.float32 .cast."):
        expect_tensor(torch.ones(2, 3).half(), like, name="o", like_name="q", tag="[t]", dtype_note=" (cast)")
    with collecting():
        expect_tensor(None, like, name="o", like_name="q", tag="[t]")


def test_nan_filled_allocations_from_two_threads_restore_torch():
    """The judge decides verdicts in threads: two blocks that overlap (A in, B in, A out, B out) leave
    torch's allocators as they found them, and each thread's allocations are NaN while inside."""
    import threading

    from facourse.rule import nan_filled_allocations
    original = torch.empty
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with nan_filled_allocations():
            a_in.set()
            b_in.wait(5)
            seen["a"] = bool(torch.isnan(torch.empty(2)).all())
        a_out.set()

    def b():
        a_in.wait(5)
        with nan_filled_allocations():
            b_in.set()
            a_out.wait(5)
            seen["b"] = bool(torch.isnan(torch.empty(2)).all())

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"a": True, "b": True}
    assert torch.empty is original, "a thread's block left torch.empty patched"
