"""A written answer graded by hand in nbgrader's formgrader, in a real browser (issue 33).

alice's step-02 sample is graded by `python -m autograder autograde` (beside bob's: the grading run of
tests/test_instructor_grading.py, once per test run, copied); then the JupyterLab that
`python -m autograder formgrader` starts (the same command line: `formgrader.lab_command`, in
autograder/, on 127.0.0.1) serves the formgrader, and headless Chromium opens the assignment's list of
submissions (after the printed /lab?token= address logged the browser in), clicks alice's, types points and a comment for her written answer as an instructor
would, and leaves each field (the formgrader saves on change). `python -m autograder report` then
carries the points and the comment into grades.csv and alice's page.

Browser set-up as in tests/test_browser.py (Debian's chromium, pip's playwright; skipped with the
reason where either cannot be had). Screenshots go to build/test-artifacts/browser/.
"""
from __future__ import annotations

import csv
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import ROOT
from lab_server import running_lab
from autograder import cli, formgrader
from test_browser import ARTIFACTS, _chromium, _free_port, _playwright
from test_instructor_grading import graded_samples

A = "02_safe_softmax"
WRITTEN = "written_safe_softmax"
COMMENT = "Right about the three passes; say which result each one needs."


def _submission_id(ws: Path, student: str) -> str:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        return gb.find_submission_notebook(A, A, student).id


def _manual(ws: Path, student: str) -> tuple:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        g = gb.find_grade(WRITTEN, A, A, student)
        c = gb.find_comment(WRITTEN, A, A, student)
        return g.manual_score, g.needs_manual_grade, c.manual_comment


@pytest.fixture(scope="module")
def formgrader_lab(tmp_path_factory):
    """alice's step 02 graded into a workspace, and the formgrader's JupyterLab on it: (chromium, Playwright's
    sync_playwright, base, token, ws). Skips first where the browser cannot be had, before the grading."""
    chromium, sync_playwright = _chromium(), _playwright()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("formgrader")
    ws = root / "ws"
    shutil.copytree(graded_samples(tmp_path_factory)[0], ws, symlinks=True)   # a copy of the shared run's

    port, token = _free_port(), "t" + os.urandom(12).hex()
    cmd, env, cwd = formgrader.lab_command(ws, port, token)
    assert "--ip=127.0.0.1" in cmd and Path(cwd) == ROOT / "autograder"
    env = dict(env, JUPYTER_CONFIG_DIR=str(root / ".jupyter-config"), OMP_NUM_THREADS="1")
    with running_lab(cmd, cwd, env, port, token, root / "lab.log") as base:
        yield chromium, sync_playwright, base, token, ws


@pytest.mark.slow
def test_written_answer_graded_in_the_formgrader(formgrader_lab):
    chromium, sync_playwright, base, token, ws = formgrader_lab
    sid = _submission_id(ws, "alice")
    assert _manual(ws, "alice")[:2] == (None, True), "alice's written answer is already graded"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab?token={token}")       # the address the command prints: logs the browser in
            page.locator(".jp-LabShell").wait_for(timeout=120_000)
            page.goto(f"{base}/formgrader/gradebook/{A}/{A}")
            link = page.locator(f"a[href$='/formgrader/submissions/{sid}']:visible").first
            link.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "formgrader_1_submissions.png"))
            link.click()

            score = page.locator(f"input.score#{WRITTEN}")
            score.wait_for(timeout=60_000)
            # the formgrader binds its save-on-change handlers once it has fetched the grades and the comments:
            # a score typed before that is never saved (CI, 2026-12-01: the comment saved, the score did not)
            page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
                                   " && formgrader.comments && formgrader.comments.loaded", timeout=60_000)
            score.scroll_into_view_if_needed()
            score.fill("1.5")
            score.press("Tab")                      # the formgrader saves a score on change
            comment = page.locator(f"textarea.comment#{WRITTEN}-comment")
            comment.fill(COMMENT)
            comment.press("Tab")
            deadline = time.monotonic() + 30
            while _manual(ws, "alice") != (1.5, False, COMMENT) and time.monotonic() < deadline:
                time.sleep(0.5)
            page.screenshot(path=str(ARTIFACTS / "formgrader_2_graded.png"))
        finally:
            browser.close()
    assert _manual(ws, "alice") == (1.5, False, COMMENT), _manual(ws, "alice")

    assert cli.main(["--workspace", str(ws), "report"]) == 0
    with open(ws / "grades.csv", newline="") as f:
        (row,) = [r for r in csv.DictReader(f) if r["student"] == "alice"]
    assert (row["score"], row["manual_pending"], row["manual_points"]) == ("9.5", "0", "1.5"), row
    assert COMMENT in row["comments"], row
    student_page = (ws / "report" / "students" / "alice.html").read_text(encoding="utf-8")
    assert f"{A}: 9.5 / 10" in student_page and "1.5 / 2" in student_page and COMMENT in student_page
