"""One test, one cause: a mistake that breaks one case costs the points of one test, not two."""
from __future__ import annotations

import json

from conftest import planted_verdicts, solution_code
from autograder.plans import PLANS, plan_of


def test_no_two_tests_of_a_plan_run_the_same_check():
    """A check with the same arguments in two tests would fail both for one mistake."""
    shared = []
    for a in PLANS:
        owner = {}
        for name, t in plan_of(a).items():
            for c in t.checks:
                key = json.dumps([c.name, c.kwargs, c.bind, t.needs, bool(t.perf)], sort_keys=True)
                if owner.setdefault(key, name) != name:
                    shared.append(f"{a}: {name} and {owner[key]} both run {key}")
    assert not shared, "\n".join(shared)


STEP09_CPU_TESTS = ["test_mixed", "test_page64", "test_page48", "test_prefix", "test_mqa", "test_spec", "test_d64"]


def _step09_bugs(*subs) -> dict:
    """{bug: {cell: the solution's cell with (old, new) replaced}} for (bug, cell, old, new) rows."""
    code = solution_code("09_decode_paged_kv")
    for bug, cell, old, new in subs:
        assert old in code[cell], f"{bug}: the solution no longer holds {old!r}"
    return {bug: {cell: code[cell].replace(old, new)} for bug, cell, old, new in subs}


def _lost(tmp_path, bugs: dict) -> tuple[dict, dict]:
    """({bug: the tests it loses}, {bug: {test: its message}}) over every CPU test of step 09."""
    got = planted_verdicts(tmp_path, "09_decode_paged_kv", ("setup",), bugs, tests=STEP09_CPU_TESTS)
    return ({bug: [t for t, v in verdicts.items() if v["points"] < v["max"]] for bug, verdicts in got.items()},
            {bug: {t: v["message"] for t, v in verdicts.items()} for bug, verdicts in got.items()})


def test_09_a_speculative_only_mistake_costs_test_spec_alone(tmp_path):
    """Mistakes that only rows of Sq > 1 show cost test_spec alone (every other case has Sq = 1), and its
    message names them: causal masking dropped among the new tokens (an Sq = 1 row sees the whole sequence
    anyway), q's token stride ignored, ROWS fixed at 16 (the rows of Sq = 8 past G * 4 never computed);
    and int64 seq_lens read as int32 (test_spec's Sq = 8 check has the one int64 seq_lens)."""
    bugs = _step09_bugs(
        ("no_spec_causal", "split_kernel", "keep = inside[None, :] & (offs_n[None, :] <= tok[:, None] + L - SQ)",
         "keep = inside[None, :] & (tok[:, None] >= 0)"),
        ("q_token_stride_ignored", "launch", "*q.stride()[:3]", "q.stride(0), q.stride(1), D"),
        ("rows_for_sq4_only", "launch", "rows = max(16, triton.next_power_of_2(G * Sq))", "rows = 16"),
        ("seq_lens_read_as_int32", "launch", "block_table, seq_lens, o_part",
         "block_table, seq_lens.view(torch.int32), o_part"))
    lost, said = _lost(tmp_path, bugs)
    assert lost == {bug: ["test_spec"] for bug in bugs}, lost
    names = {"no_spec_causal": "do not mask each other", "q_token_stride_ignored": "q is read with the wrong strides",
             "rows_for_sq4_only": "G * Sq = 32",
             "seq_lens_read_as_int32": "seq_lens is int64 here and was read as int32"}
    for bug, says in names.items():
        assert says in said[bug]["test_spec"], f"{bug}: {said[bug]['test_spec']}"
    assert "Sq=8, D=128, page 16, seq_lens int64" in said["rows_for_sq4_only"]["test_spec"]


def test_09_an_empty_sequence_mistake_costs_test_mixed_alone(tmp_path):
    """test_mixed owns the empty sequence (and every row that sees no key): a merge that divides 0 by 0
    there, or a split that reads an empty sequence's padding page, costs test_mixed and no other test."""
    bugs = _step09_bugs(
        ("empty_sequence_nan", "merge_kernel", "safe = tl.where(total == 0.0, 1.0, total)", "safe = total"),
        ("empty_reads_padding", "split_kernel", "end = tl.minimum(start + split_len, L)",
         "end = tl.minimum(start + split_len, tl.maximum(L, 1))"))
    lost, said = _lost(tmp_path, bugs)
    assert lost == {bug: ["test_mixed"] for bug in bugs}, lost
    assert all("these rows see no key" in said[bug]["test_mixed"] for bug in bugs), said


def test_03_a_merge_mistake_costs_the_merges_test_alone(tmp_path):
    """A merge that exponentiates the maxima themselves overflows on test_merge_large's maxima in the
    thousands; one that takes exp(-inf - -inf) for two empty states is NaN on test_merge_empty's. The
    student's online_softmax calls that merge, but test_overflow and test_masked judge the online loop's
    own handling of large and -inf logits, so they keep their points; an online loop with no running max
    still loses test_overflow."""
    step = "03_online_softmax"
    code = solution_code(step)
    safe_merge = "l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)"
    block_max = "m_j = x_j.amax(dim=-1) "
    assert safe_merge in code["merge_softmax_states"] and block_max in code["online_softmax"]
    empty_guard = "m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)"
    assert empty_guard in code["merge_softmax_states"]
    bugs = {
        "unsafe_merge": {"merge_softmax_states": code["merge_softmax_states"].replace(
            safe_merge, "l = (l_a * torch.exp(m_a) + l_b * torch.exp(m_b)) / torch.exp(m_safe)")},
        "nan_on_empty": {"merge_softmax_states": code["merge_softmax_states"].replace(empty_guard, "m_safe = m")},
        # every block's state taken relative to 0: exp(x) itself, with no running max
        "online_no_max": {"online_softmax": code["online_softmax"].replace(
            block_max, "m_j = torch.zeros_like(x_j.amax(dim=-1)) ")},
    }
    got = planted_verdicts(tmp_path, step, ("imports",), bugs)
    lost = {bug: [t for t, v in verdicts.items() if v["points"] < v["max"]] for bug, verdicts in got.items()}
    assert lost == {"unsafe_merge": ["test_merge_large"], "nan_on_empty": ["test_merge_empty"],
                    "online_no_max": ["test_overflow"]}, lost
    assert "exp of a maximum itself overflowed" in got["unsafe_merge"]["test_merge_large"]["message"]
    assert "no max subtraction" in got["online_no_max"]["test_overflow"]["message"]
