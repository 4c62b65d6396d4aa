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


def test_09_a_speculative_only_mistake_costs_test_spec_alone(tmp_path):
    """Causal masking dropped among the Sq new tokens: every Sq = 1 row is still right (its one token
    sees the whole sequence), so test_mixed keeps its points and test_spec loses its own."""
    step = "09_decode_paged_kv"
    old = "keep = inside[None, :] & (offs_n[None, :] <= tok[:, None] + L - SQ)"
    assert old in solution_code(step)["split_kernel"]
    bug = {"split_kernel": solution_code(step)["split_kernel"].replace(old, "keep = inside[None, :] & (tok[:, None] >= 0)")}
    got = planted_verdicts(tmp_path, step, ("setup",), {"no_spec_causal": bug},
                           tests=["test_mixed", "test_spec"])["no_spec_causal"]
    assert got["test_spec"]["points"] == 0, got
    assert got["test_mixed"]["points"] == got["test_mixed"]["max"], got


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
