"""Step 12, ring attention: the exercise as it is graded (CPU tier: gloo ranks forked by the kernel).

The exercise's solution, put into the released notebook, scores every point through nbgrader
(``GRADING``, graded by tests/test_exercise_grading.py in one autograde run with the other steps':
the ranks are forked from a real Jupyter kernel there); the untouched stub scores 0 and the solution
with one planted mistake loses its test (the demo's samples). Each mistake of the issue, planted in
the solution, loses the points of a test whose message names it: a merge without its weights, zigzag
shards read as contiguous (or given the contiguous layout's skip rule by ranks), the last shard never
used, ranks waiting on each other (a deadlock: the test fails at its time limit), K/V gathered
instead of passed point to point, and ``group`` ignored or its ranks passed as global ones (two rings at
once in a world of 4). The GPU tier (two GPUs, NCCL) is the ladder runner's.
"""
from __future__ import annotations

import torch

from conftest import assert_planted_bugs_named, solution_and_stub

STEP = "12_ring_attention"


_WEIGHTED = "o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b"
_PASS = ('''pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, peer((rank + 1) % P), group),
                                              dist.P2POp(dist.irecv, incoming, peer((rank - 1) % P), group)])''')
_RANK = "    rank, P = dist.get_rank(group), dist.get_world_size(group)\n"

# (the cell, the solution's text, the mistake, the test that loses its points, what its message names)
PLANTED = {
    "merge_without_weights": ("merge", _WEIGHTED, "o = o_a + o_b", "test_merge", "without their weights"),
    # w = exp(lse) without the max subtracted: test_merge's lse in the hundreds overflow; the ring's logits do not
    "merge_unsafe_exp": ("merge", _WEIGHTED, "w_a, w_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]\n"
                         "    o = (w_a * o_a + w_b * o_b) / (w_a + w_b)", "test_merge",
                         "the merge exponentiates lse without subtracting the max"),
    # the same merge inside the ring: the ring's diagnosis names it from the gathered output alone
    "ring_merge_without_weights": ("merge", _WEIGHTED, "o = o_a + o_b", "test_causal", "without their weights"),
    "zigzag_as_contiguous": ("ring", "return [bounds[c] for c in ((r, n - 1 - r) if causal else (r,))]",
                             "return [chunk_bounds(int(total), P)[r]]", "test_causal",
                             "zigzag shards were read as contiguous"),
    # the contiguous layout's skip rule by ranks (a lower rank's shard all visible, a higher one's skipped)
    "zigzag_with_contiguous_skip_rule": ("ring", "(not causal or ke <= qs or diagonal)",
                                         "(not causal or src < rank or (src == rank and (ke <= qs or diagonal)))",
                                         "test_causal", "the contiguous layout's skip rule"),
    "last_shard_missing": ("ring", "for t in range(P):", "for t in range(P - 1):", "test_noncausal",
                           "arrives on the last step is never used"),
    "ranks_wait_on_each_other": ("ring", _PASS, "dist.recv(incoming, peer((rank - 1) % P), group)\n"
                                 "            dist.send(kv, peer((rank + 1) % P), group)\n            pending = []",
                                 "test_noncausal", "waiting on each other"),
    # the same unsafe merge inside the ring: logits in the hundreds make exp(lse) overflow
    "ring_merge_unsafe_exp": ("merge", _WEIGHTED, "w_a, w_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]\n"
                              "    o = (w_a * o_a + w_b * o_b) / (w_a + w_b)", "test_causal", "exp(lse) itself overflows"),
    # K and V also sent to the rank two places on (an all-gather made of sends, on four ranks)
    "kv_sent_past_the_neighbours": ("ring", _PASS, _PASS[:-2] + "] + ([dist.P2POp(dist.isend, kv, "
                                    "peer((rank + 2) % P), group), dist.P2POp(dist.irecv, torch.empty_like(incoming), "
                                    "peer((rank - 2) % P), group)] "
                                    "if P > 3 else []))", "test_noncausal", "not its neighbours"),
    # the world's rank, size and group in place of `group`: w4_two_rings' two rings run as one ring of 4
    "group_ignored": ("ring", _RANK, "    group = None\n" + _RANK, "test_gqa_edges", "`group` was ignored"),
    # the group's ranks handed to P2POp as global ones: on w4_two_rings they name ranks of the other ring
    "group_ranks_as_global_ranks": ("ring", _PASS, _PASS.replace("peer(", "("), "test_gqa_edges",
                                    "take global ranks"),
    "kv_gathered": ("ring", "    dist.all_reduce(total, group=group)\n",
                    "    dist.all_reduce(total, group=group)\n"
                    "    dist.all_gather([torch.empty_like(k) for _ in range(P)], k, group=group)\n",
                    "test_causal", "through collectives"),
}

# the demo's samples, graded by tests/test_exercise_grading.py: the solution scores every CPU point, the
# untouched stub 0, the solution with the planted 'zigzag_as_contiguous' loses its test's points
GRADING = solution_and_stub(STEP, 11, set(), 0, PLANTED["zigzag_as_contiguous"])


def test_planted_bugs_lose_the_points_that_name_them(tmp_path, monkeypatch):
    """Each mistake, planted in the solution, scores 0 in the test named for it, whose message names it;
    the deadlock within its time limit (15 s here, where graded rings get 30: at 5 s a correct rank
    under CI's load missed it, and the zigzag mistake was reported as a deadlock)."""
    monkeypatch.setenv("FACOURSE_RING_TIMEOUT", "15")
    assert_planted_bugs_named(tmp_path, STEP, ("setup",), PLANTED)


def _visible_run(code: dict) -> str:
    """The notebook's set-up, solution cells and visible test cells run as a student's Run All runs
    them (no judge): '' when every visible cell passes, else the first failure's message."""
    import json

    from conftest import ROOT
    nb = json.loads((ROOT / "solutions" / STEP / f"{STEP}.ipynb").read_text(encoding="utf-8"))
    scope = {"__name__": "__main__"}
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if cell["cell_type"] != "code" or (meta.get("grade") and "check_" not in "".join(cell["source"])):
            continue
        src = code.get(meta.get("grade_id")) or "".join(cell["source"]).split("### BEGIN HIDDEN TESTS")[0]
        try:
            exec(src, scope)
        except AssertionError as err:
            return str(err)
    return ""


def test_visible_cells_name_each_planted_mistake():
    """A student's Run All, before any grading: the solution passes the visible cells, and each ring
    mistake fails the first of them with a message that names it (the merge's, then the ring's)."""
    from conftest import solution_code
    solution = solution_code(STEP)
    assert _visible_run(solution) == ""
    for bug in ("merge_without_weights", "zigzag_as_contiguous", "last_shard_missing"):
        cell, old, new, _, says = PLANTED[bug]
        got = _visible_run({**solution, cell: solution[cell].replace(old, new)})
        assert says in got, (bug, got)


def _crashing_rank(q, k, v, causal=False, scale=None, group=None):
    import os
    import signal

    import torch.distributed as dist
    if dist.get_rank(group) == 1:
        os.kill(os.getpid(), signal.SIGKILL)      # a crash: no exception, no result, the process gone
    dist.barrier(group)                           # the other rank waits for it, as a ring would
    return q.clone(), q.new_zeros(q.shape[:3], dtype=torch.float32)


def test_a_crashed_rank_fails_the_call_at_once_and_names_the_rank():
    """A rank whose process dies (a segfault in its kernel, a kill) is named as soon as it is gone,
    the others stopped: the call fails in seconds, not at the time limit."""
    import time

    import pytest

    from facourse.configs import make_inputs
    from facourse.ring import RingError, get_ring_case, run_ring
    q, k, v = make_inputs(get_ring_case("w2_causal").cfg, 0, "cpu")
    t0 = time.perf_counter()
    with pytest.raises(RingError, match="rank 1 died without a result"):
        run_ring(_crashing_rank, 2, q, k, v, causal=True, timeout=60)
    assert time.perf_counter() - t0 < 20
