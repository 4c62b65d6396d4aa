"""Exercise 01 in JupyterLab, driven in a real browser as a student works it (issue 19).

JupyterLab is started on loopback in a folder holding a fresh copy of the released exercise 01, and
headless Chromium (Debian's, driven by Playwright's Python package; no browser is downloaded) opens it,
then, as a student would, with the notebook's own menus:

1. Run All on the untouched stub: the visible test's output ends in the stub's NotImplementedError;
2. types a version of the function with the classic GQA mistake into the stub's cell, Run All: the
   failed check shows its teaching message alone, naming the likely cause (the KV head a query head
   reads), with no frame of the library, kernel warning or grading jargon (issue 34);
3. types the solution, Run All: the visible test reports ``passed``.

Each state's screenshot is kept in ``build/test-artifacts/browser/`` (git-ignored). What the test
needs it installs in its own set-up: apt's ``chromium`` (root, as on the course's machines) and pip's
``playwright``; where either cannot be had, the test is skipped with the reason, never silently.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, pip_install, solution_code
from lab_server import running_lab

ASSIGNMENT = "01_vanilla_attention"
ARTIFACTS = ROOT / "build" / "test-artifacts" / "browser"
CHROMIUM = ("chromium", "chromium-browser")
#: The classic GQA mistake (query head h reading KV head h % Hkv), as a student would type it.
GQA_BUG = ("repeat_interleave(group, dim=1)", "repeat(1, group, 1, 1)")
LIKELY_CAUSE = "query head h reads KV head h % Hkv"
#: What a failed check's cell must not show besides its message: kernel warnings, grading jargon.
NOT_FOR_STUDENTS = ("WARNING", "IPKernelApp", "nbgrader", "grade_id", "judge")
#: Traces of a library frame in a rendered error: a file's path, an arrow at a source line, the raise.
FRAME = re.compile(r"facourse/|File \S*\.py|Traceback|^\s*-*>|^\s*\d*\s*raise\b", re.M)


def assert_message_alone(text: str, error: str) -> None:
    """``text``, a failed check's rendered error, is the error's name, then the teaching message (its first
    line names the configuration), and no frame of the library."""
    lines = text.strip().splitlines()
    assert lines[0].strip() == f"{error}:" and lines[1].startswith("["), f"not the check's message first:\n{text}"
    assert not FRAME.search(text), f"a library frame shows with the message:\n{text}"


def _install(cmd: list[str], what: str, timeout: float) -> str | None:
    """Run an install command; None when it worked, else why not (for the skip)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{what}: {err}"
    return None if r.returncode == 0 else f"{what} failed: {(r.stdout + r.stderr).strip()[-300:]}"


def _chromium() -> str:
    for name in CHROMIUM:
        if shutil.which(name):
            return shutil.which(name)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium on PATH and no way to install it here (apt-get as root): the browser test "
                    "needs Debian's chromium package")
    why = (_install(["apt-get", "update", "-qq"], "apt-get update", 300)
           or _install(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                       "apt-get install chromium", 600))
    if why or not shutil.which("chromium"):
        pytest.skip(f"chromium could not be installed: {why or 'not on PATH after apt-get'}")
    return shutil.which("chromium")


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        try:
            r = pip_install("playwright>=1.45", timeout=300)
            why = (r.stdout + r.stderr).strip()[-300:] if r.returncode else None
        except subprocess.TimeoutExpired as err:
            why = str(err)
        if why:
            pytest.skip(f"playwright could not be installed: pip install playwright failed: {why}")
        from playwright.sync_api import sync_playwright
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 serving a copy of the released exercise 01: (base URL, token, folder)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "exercises" / ASSIGNMENT, root / ASSIGNMENT)
    # no "official Jupyter news?" toast over the outputs in the screenshots
    news = root / ".lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}", f"--LabApp.user_settings_dir={root / '.lab-settings'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, OMP_NUM_THREADS="1", JUPYTER_CONFIG_DIR=str(root / ".jupyter-config"))
    env.pop("TRITON_INTERPRET", None)
    with running_lab(cmd, root, env, port, token, root / "lab.log") as base:
        yield base, token, root


class Student:
    """One browser page on the exercise notebook, with what a student does there."""

    def __init__(self, page, shots: Path):
        self.page, self.shots = page, shots

    def open(self, url: str):
        p = self.page
        p.goto(url)
        p.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        # JupyterLab may ask which kernel to start (a fresh server, no kernel preference yet)
        select = p.get_by_role("button", name="Select", exact=True)
        try:
            select.wait_for(timeout=5_000)
            select.click()
        except Exception:   # no dialog: the notebook's own kernelspec was taken
            pass
        p.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=120_000)

    def replace_cell(self, index: int, code: str):
        """Select the whole text of code cell ``index`` (0-based among all cells) and type ``code``."""
        editor = self.page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        self.page.keyboard.insert_text(code)

    def run_all(self):
        p = self.page
        p.locator(".jp-Notebook").click(position={"x": 5, "y": 5})
        p.get_by_role("menuitem", name="Run", exact=True).click()
        p.get_by_role("menuitem", name="Run All Cells", exact=True).click()

    def wait_for_output(self, text: str, shot: str, timeout_ms: int = 180_000) -> str:
        """Wait until an output area shows ``text``; save a screenshot; return that output's text."""
        out = self.page.locator(".jp-OutputArea-output").filter(has_text=text).first
        try:
            out.wait_for(timeout=timeout_ms)
        finally:
            out.scroll_into_view_if_needed(timeout=5_000) if out.count() else None
            self.page.screenshot(path=str(self.shots / f"{shot}.png"), full_page=False)
        return out.inner_text()


@pytest.mark.slow
def test_exercise_01_in_jupyterlab(lab):
    chromium = _chromium()
    sync_playwright = _playwright()
    base, token, root = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    solution = solution_code(ASSIGNMENT)["vanilla_attention"]
    assert GQA_BUG[0] in solution, "the planted GQA bug no longer applies to the solution: update GQA_BUG"
    cell = 3                                      # the stub's cell (after the intro, imports and task)
    url = f"{base}/lab/tree/{ASSIGNMENT}/{ASSIGNMENT}.ipynb?token={token}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            me = Student(page, ARTIFACTS)
            me.open(url)
            stub_text = page.locator(".jp-Notebook .jp-Cell").nth(cell).inner_text()
            assert "raise NotImplementedError" in stub_text, f"cell {cell} is not the stub:\n{stub_text}"

            me.run_all()                                                   # 1. the untouched stub
            me.wait_for_output("NotImplementedError", "1_stub")

            me.replace_cell(cell, solution.replace(*GQA_BUG))              # 2. the classic GQA mistake
            me.run_all()
            text = me.wait_for_output("likely cause", "2_gqa_bug")
            assert LIKELY_CAUSE in text, f"the teaching message does not name the mistake:\n{text}"
            assert_message_alone(text, "AttentionCheckError")
            outputs = page.locator(".jp-Notebook .jp-Cell").nth(cell + 2).locator(".jp-OutputArea")
            whole = outputs.inner_text()
            assert LIKELY_CAUSE in whole and not [w for w in NOT_FOR_STUDENTS if w in whole], \
                f"the failed check's cell shows more than its message:\n{whole}"
            outputs.screenshot(path=str(ARTIFACTS / "2_gqa_bug_output.png"))

            me.replace_cell(cell, solution)                                # 3. the solution
            me.run_all()
            text = me.wait_for_output("passed", "3_solution")
            assert "[small" in text and "passed" in text, text
        finally:
            browser.close()


@pytest.mark.slow
def test_book_formulas_render_offline(tmp_path):
    """The book's formulas typeset in a browser with no network: MathJax comes with the book (a quick
    build without execution; tests/test_book.py builds and checks the executed book)."""
    chromium = _chromium()
    sync_playwright = _playwright()
    sys.path.insert(0, str(ROOT / "tools"))
    import book

    out = tmp_path / "book"
    assert book.main(["--no-execute", "--out", str(out)]) == 0, "the book did not build"
    page_path = out / "_build" / "html" / "course" / "03_online_softmax.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            ctx = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            remote = []
            page.on("request", lambda r: remote.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(page_path.as_uri())
            typeset = page.locator("mjx-container")
            typeset.first.wait_for(timeout=30_000)          # MathJax replaced the TeX with its own markup
            page.screenshot(path=str(ARTIFACTS / "book_03_online_softmax.png"))
            n, raw = typeset.count(), page.locator("#main-content").inner_text().count("\\(")
        finally:
            browser.close()
    assert not remote, f"the book asked the network for {remote[:5]}"
    assert n >= 20 and raw == 0, f"{n} formulas typeset, {raw} left as raw TeX"
