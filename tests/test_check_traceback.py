"""A failed check shows its teaching message alone in IPython and Jupyter (issue 34).

The course's check errors render through IPython's ``_render_traceback_``: one line naming the error's
class, then every line of the message, and no frame of the library. The error output a kernel sends
keeps ``ename`` and ``evalue`` (grading and ``course.sh check`` read them). tests/test_browser.py shows
the same in JupyterLab.
"""
from __future__ import annotations

import re

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from facourse import SoftmaxCheckError
from facourse.rule import AttentionCheckError, CheckError

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FRAME_MARKS = ("facourse/", "Traceback", "File ", "raise ", "----> ")
MESSAGE = "[small (B=1)] (seed 7) wrong values: max|o - ref| = 2.9\n  likely cause: the scale is applied twice"
ZEROS = "lambda q, k, v, causal=False, scale=None: torch.zeros_like(q)"


def _plain(lines) -> str:
    return ANSI.sub("", "\n".join(lines))


def test_render_traceback_is_the_class_then_every_line_of_the_message():
    err = CheckError(MESSAGE)
    assert _plain(err._render_traceback_()) == "AttentionCheckError:\n" + MESSAGE
    sub = SoftmaxCheckError("[rows] wrong\n  likely cause: max not subtracted")
    sub.add_note("a note")
    assert _plain(sub._render_traceback_()).splitlines() == [
        "SoftmaxCheckError:", "[rows] wrong", "  likely cause: max not subtracted", "a note"]
    assert _plain(CheckError()._render_traceback_()) == "AttentionCheckError:"


@pytest.fixture
def shell():
    cfg = Config()
    cfg.HistoryManager.enabled = False
    sh = InteractiveShell.instance(config=cfg, colors="nocolor")
    try:
        yield sh
    finally:
        InteractiveShell.clear_instance()


def test_ipython_shows_the_message_without_library_frames(shell, capsys):
    result = shell.run_cell("import torch\nfrom facourse import check_entry_point\n"
                            f"check_entry_point({ZEROS}, 'small', seed=1)")
    assert isinstance(result.error_in_exec, AttentionCheckError)
    shown = ANSI.sub("", capsys.readouterr().out)
    message = str(result.error_in_exec)
    assert shown.strip() == "AttentionCheckError:\n" + message, shown
    assert "likely cause: the output is all zeros" in shown
    assert not [m for m in FRAME_MARKS if m in shown], shown


@pytest.mark.slow
def test_a_kernel_sends_the_message_alone_with_ename_and_evalue():
    """nbclient runs a notebook on the course's kernel, as nbgrader does: each failing check's error
    output holds its message and no library frame, and ``ename``/``evalue`` are the class and message."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "import torch\nfrom facourse import check_entry_point, check_softmax_fn",
        f"check_entry_point({ZEROS}, 'small', seed=1)",
        "check_softmax_fn(lambda x, dim=-1: torch.zeros_like(x), seed=1)",
        "assert False, 'a plain assert keeps its traceback'",
    )]
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
    errors = [next((o for o in c.outputs if o.output_type == "error"), None) for c in nb.cells]
    assert errors[0] is None
    for out, ename, cause in ((errors[1], "AttentionCheckError", "likely cause: the output is all zeros"),
                              (errors[2], "SoftmaxCheckError", "likely cause")):
        assert out is not None and out.ename == ename, out
        shown = _plain(out.traceback)
        assert shown == f"{ename}:\n{out.evalue}", shown
        assert out.evalue.startswith("[") and cause in out.evalue, out.evalue
        assert not [m for m in FRAME_MARKS if m in shown], shown
    assert errors[3].ename == "AssertionError" and "Traceback" in _plain(errors[3].traceback)


def test_every_teaching_error_renders_its_message_alone():
    """The library's other feedback errors (a device function on the emulated warp, a missing SASS
    instruction, a rank, a FlashInfer-Bench object) show in JupyterLab as the check's do."""
    from facourse.cuda_build import SassCheckError
    from facourse.cuda_host_check import HostCheckError
    from facourse.interchange.spec import InterchangeCheckError
    from facourse.ring import RingError
    for cls in (SassCheckError, HostCheckError, InterchangeCheckError, RingError):
        lines = cls("a\nb")._render_traceback_()
        assert lines[0].endswith(f"{cls.__name__}:\x1b[0m") and lines[1:] == ["a", "b"], (cls, lines)
