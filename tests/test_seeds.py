"""Reproducible grades (autograder/seeds.py): the judge's seeds from a workspace secret, the student
and the assignment; the secret stays on the grading side."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import ROOT
from autograder.bundle import student_files
from autograder.judge import Judge, points_of
from autograder.seeds import SECRET_NAME, seed_key_for, workspace_secret

A, B = "01_vanilla_attention", "02_safe_softmax"


def seeds(assignment: str, key: bytes | None) -> dict[str, list[int]]:
    j = Judge(assignment, points_of(assignment), seed_key=key)
    try:
        return {t: [j._seed(t, i) for i in range(len(test.checks))] for t, test in j.plan.items()}
    finally:
        j.close()


def opened_seeds(assignment: str, key: bytes | None, test: str) -> list[int]:
    """The seeds the judge hands the kernel when it opens ``test`` (the protocol, not the helper)."""
    j = Judge(assignment, points_of(assignment), seed_key=key)
    try:
        with j._lock:
            reply = j._open(test, j.states[test])
        return [c["seed"] for c in reply["calls"]]
    finally:
        j.close()


def test_the_same_key_gives_the_same_seeds_on_every_regrade(tmp_path):
    key = seed_key_for(tmp_path, "alice", A)
    assert key == seed_key_for(tmp_path, "alice", A)
    first = opened_seeds(A, key, "test_small")
    assert len(first) == 2 and all(0 <= s < 2 ** 31 for s in first)
    assert opened_seeds(A, key, "test_small") == first
    assert seeds(A, key) == seeds(A, key)
    assert len(set(first)) == 2                     # two checks of one test: two seeds


def test_students_assignments_and_workspaces_get_different_seeds(tmp_path):
    alice = seeds(A, seed_key_for(tmp_path / "w", "alice", A))
    bob = seeds(A, seed_key_for(tmp_path / "w", "bob", A))
    other_workspace = seeds(A, seed_key_for(tmp_path / "w2", "alice", A))
    assert alice["test_small"] != bob["test_small"] and alice["test_small"] != other_workspace["test_small"]
    flat = [s for v in alice.values() for s in v]
    assert len(set(flat)) == len(flat)              # every check of every test its own seed
    assert seed_key_for(tmp_path / "w", "alice", A) != seed_key_for(tmp_path / "w", "alice", B)
    # "ab" + "c" and "a" + "bc" are different students and assignments
    assert seed_key_for(tmp_path / "w", "ab", "c") != seed_key_for(tmp_path / "w", "a", "bc")


def test_without_a_key_seeds_are_fresh():
    assert opened_seeds(A, None, "test_small") != opened_seeds(A, None, "test_small")


def test_the_secret_is_made_once_private_and_refused_when_truncated(tmp_path):
    s = workspace_secret(tmp_path)
    path = tmp_path / SECRET_NAME
    assert len(s) == 32 and path.read_bytes() == s and workspace_secret(tmp_path) == s
    assert path.stat().st_mode & 0o077 == 0
    assert [p.name for p in tmp_path.iterdir()] == [SECRET_NAME]   # no temporary file left behind
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="too few"):
        workspace_secret(tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="the archive lists git's files")
def test_the_secret_is_in_neither_the_release_nor_the_student_archive(tmp_path):
    # a copy of the repository's layout: a default workspace (grading/) with its secret and release
    root = tmp_path / "repo"
    for d in ("course", "exercises", "src"):
        (root / d).mkdir(parents=True)
        (root / d / "x.txt").write_text("x")
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    (root / "course.sh").write_text("#!/bin/sh\n")
    workspace = root / "grading"
    (workspace / "release" / A).mkdir(parents=True)
    seed_key_for(workspace, "alice", A)
    assert (workspace / SECRET_NAME).is_file()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    files = student_files(root)
    assert "course/x.txt" in files and not any(SECRET_NAME in f or f.startswith("grading") for f in files)
    assert not list((workspace / "release").rglob(SECRET_NAME))


def test_a_borderline_submission_gets_one_grade_on_every_regrade(tmp_path):
    """Errors near the tolerance that depend on the inputs: fresh seeds give a different verdict each run
    (its figures at least), a workspace's key gives the same one every time."""
    import torch

    from autograder.judge import run_inprocess
    from facourse.reference import reference_attention

    def borderline(q, k, v, causal=False, scale=None):
        o = reference_attention(q, k, v, causal=causal, scale=scale, dtype=torch.float64)[0]
        g = torch.Generator().manual_seed(int(q.double().abs().sum() * 1000) % 2 ** 31)
        return (o + 2e-3 * torch.randn(o.shape, generator=g, dtype=o.dtype)).to(q.dtype)

    def grade(key):
        v = run_inprocess(A, borderline, ["test_small"], seed_key=key)["test_small"]
        return v.points, v.message

    key = seed_key_for(tmp_path, "alice", A)
    assert len({grade(key) for _ in range(4)}) == 1
    assert len({grade(None) for _ in range(4)}) > 1


def test_local_workers_and_cluster_tasks_hand_the_judge_the_workspace_key(tmp_path, monkeypatch):
    """`autograde` (local workers) and `--cluster` tasks grade with the key of the workspace, the student
    and the assignment; the cluster's driver computes it, so the secret never leaves its machine."""
    from autograder import cluster, grader, workers
    from autograder.model import SOLUTIONS, hash_tree

    a, ws, seen = "01_vanilla_attention", tmp_path / "ws", []

    class Stop(Exception):
        pass

    def fake(*args, **kw):
        seen.append(kw["seed_key"])
        raise Stop

    monkeypatch.setattr(workers, "grade_submission", fake)
    with pytest.raises(Stop):
        workers.grade_one(tmp_path / "subs", ws, "alice", a, timeout=1, cell_timeout=None, gpu=None, key="k")
    monkeypatch.setattr(grader, "grade_submission", fake)
    with pytest.raises(Stop):
        cluster.grade_task("alice", a, "k", hash_tree(SOLUTIONS / a, *grader.GRADING_SOURCES), {}, {}, b"", 1.0,
                           None, False, seed_key_for(ws, "alice", a), gpu=False)
    assert seen == [seed_key_for(ws, "alice", a)] * 2
    assert seed_key_for(ws, "bob", a) != seen[0]
