"""tools/gpu_grading_run.py on the CPU: the submissions it builds for the GPU machine (--dry-run)."""
from __future__ import annotations

import json

from conftest import ROOT, load_module

tool = load_module(ROOT / "tools" / "gpu_grading_run.py", "gpu_grading_run_for_tests")


def test_the_sample_steps_grade_the_demos_students(tmp_path, capsys):
    assert tool.main(["--dry-run", "--steps", "01", "09", "12", "--work", str(tmp_path)]) == 0
    assert "built 9 submissions" in capsys.readouterr().out       # no "slow" for a sample step
    sub = tmp_path / "submitted"
    for role, sample in {"correct": "alice", "stub": "bob", "bug": "carol"}.items():   # as the guide says
        for a in ("01_vanilla_attention", "09_decode_paged_kv", "12_ring_attention"):
            (nb,) = (sub / role / a).iterdir()
            want = ROOT / "autograder" / "samples" / sample / a / nb.name
            assert json.loads(nb.read_text()) == json.loads(want.read_text()), (role, a)
    assert not (sub / "slow").exists()


def test_every_step_has_an_estimate_for_each_of_its_students():
    subs_roles = {k: (tool.SAMPLE_OF if k in tool.SAMPLE_STEPS else tool.STUDENTS) for k in tool.STEPS}
    for step, roles in subs_roles.items():
        assert set(tool.EST[step]) == set(roles), step
