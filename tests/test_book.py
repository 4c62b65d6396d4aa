"""The rendered book (tools/book.py, `./course.sh book`), built from the unpacked student archive.

This is the one place lectures execute in the test suite: the book's build runs every lecture top to
bottom on the CPU, inside the archive and with the library it ships (as tests/test_archive.py runs
the archive's other commands), each under 240 s; then the book is checked: every lecture page shows
its outputs and its figures, the table of contents is the ladder, the exercises show no solution,
no page shows a traceback, and every relative link resolves. One test, so that the lectures execute
once (pytest-xdist would build a shared fixture once per worker).
"""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, solution_code

nbformat = pytest.importorskip("nbformat")  # the GPU machines have no Jupyter stack
pytest.importorskip("nbclient")

sys.path.insert(0, str(ROOT / "tools"))
import book  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

LECTURES = sorted(p.name for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))
LECTURE_LIMIT_S = 240
IMAGE_MD = re.compile(r"!\[[^\]]*\]\(")


def ladder_pages() -> list[str]:
    """The pages in ladder order, from the tree (not from tools/book.py): for each step 00, 01, ...,
    its lecture, then its exercise where it has one."""
    pages = []
    for name in LECTURES:
        pages.append(f"course/{Path(name).stem}.html")
        for ex in sorted((ROOT / "exercises").glob(f"{name[:2]}_*/{name[:2]}_*.ipynb")):
            pages.append(f"exercises/{ex.parent.name}/{ex.stem}.html")
    return pages


def page_text(path: Path) -> str:
    """A page's text as a reader sees it: tags out, entities decoded, lines kept."""
    body = path.read_text(encoding="utf-8")
    body = re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def solution_only_lines(assignment: str) -> set[str]:
    """The lines of the solution cells that the released notebook does not have (stripped, code only)."""
    (release,) = (ROOT / "exercises" / assignment).glob("*.ipynb")
    released = {ln.strip() for c in json.loads(release.read_text(encoding="utf-8"))["cells"]
                for ln in "".join(c["source"]).splitlines()}
    return {s for code in solution_code(assignment).values() for ln in code.splitlines()
            if (s := ln.strip()) and not s.startswith("#") and s not in released}


def leaked(text: str, secret: set[str]) -> list[str]:
    return sorted({ln.strip() for ln in text.splitlines()} & secret)


def nav_pages(index: Path) -> list[str]:
    """The pages of the book's sidebar (the table of contents), in order."""
    nav = index.read_text(encoding="utf-8").split('bd-docs-nav', 1)[1].split("</nav>", 1)[0]
    return list(dict.fromkeys(re.findall(r'href="((?:course|exercises)/[^"#]+\.html)"', nav)))


def test_the_finders_find(tmp_path):
    """The checks below can fail: a broken link, a solution line and a page out of order are found."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "p.html").write_text('<a href="../a/p.html#x">ok</a> <img src="../gone.png"> '
                                           '<a href="https://example.org/">out</a> <a href="#top">top</a> '
                                           '<script src="https://cdn.example.org/tex-chtml.js"></script>')
    broken, external, remote = book.check_links(tmp_path)
    assert broken == ["a/p.html -> ../gone.png"] and external == ["https://example.org/"]
    assert remote == ["a/p.html -> https://cdn.example.org/tex-chtml.js"]
    secret = solution_only_lines("01_vanilla_attention")
    assert secret, "the solution of step 01 has no line of its own?"
    line = sorted(secret)[0]
    assert leaked(f"<span>x</span>\n    {html.escape(line)}\n", secret) == [line]
    (tmp_path / "index.html").write_text('<nav class="bd-links bd-docs-nav"><a href="exercises/01_a/01_a.html">'
                                         '</a><a href="course/01_a.html"></a></nav>')
    assert nav_pages(tmp_path / "index.html") == ["exercises/01_a/01_a.html", "course/01_a.html"]


@pytest.mark.slow
def test_book_builds_from_the_archive(student_archive, tmp_path):
    """`tools/book.py --course-root <archive>`: every lecture executes there (no error, under 240 s
    each), and the book it builds is whole."""
    from test_archive import _env

    out = tmp_path / "book"
    # --jobs 1: in the suite, pytest-xdist's workers already fill the cores; a pool of its own here
    # oversubscribed them (CI, 2026-11-23: a corpus notebook missed its 15-s cell limit at that load)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "book.py"), "--course-root", str(student_archive),
                        "--out", str(out), "--jobs", "1"], env=_env(student_archive), capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"the book failed to build:\n{(r.stdout + r.stderr)[-6000:]}"
    check_book(out)


def check_book(out: Path) -> None:
    """The checks of a built book (``--out`` of tools/book.py), lectures executed."""
    timings = json.loads((out / "timings.json").read_text())["lectures"]
    assert sorted(Path(k).name for k in timings) == LECTURES, timings
    slow = {k: s for k, s in timings.items() if s >= LECTURE_LIMIT_S}
    assert not slow, f"lectures over {LECTURE_LIMIT_S} s on this CPU (they must stay quick): {slow}"

    html_dir = out / "_build" / "html"
    for name in LECTURES:                      # executed, with every output and figure on its page
        nb = nbformat.read(out / "course" / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{name}: {errors}"
        assert all(c.execution_count for c in code if c.source.strip()), f"{name}: a cell did not run"
        page = (html_dir / "course" / name).with_suffix(".html").read_text(encoding="utf-8")
        with_outputs = sum(1 for c in code if c.outputs)
        assert with_outputs and len(re.findall(r'class="cell_output', page)) == with_outputs, name
        figures = sum(len(IMAGE_MD.findall(c.source)) for c in nb.cells if c.cell_type == "markdown") + \
            sum(1 for c in code for o in c.outputs if "image/png" in o.get("data", {}))
        assert len(re.findall(r"<img\b", page)) == figures, f"{name}: {figures} figures, not all on its page"

    toc, ladder = nav_pages(html_dir / "intro.html"), ladder_pages()      # the table of contents: the ladder
    assert toc == ladder, f"the table of contents is not the ladder:\n{toc}\n{ladder}"

    for ex in sorted((ROOT / "exercises").glob("[0-9][0-9]_*")):       # the tasks, without their solutions
        page = html_dir / "exercises" / ex.name / f"{ex.name}.html"
        assert page.is_file(), f"no page for exercise {ex.name}"
        text = page_text(page)
        assert "YOUR CODE HERE" in text or "NotImplementedError" in text, f"{ex.name}: no stub on its page"
        leaks = leaked(text, solution_only_lines(ex.name))
        assert not leaks, f"exercise {ex.name}'s page shows solution code: {leaks[:5]}"

    for page in html_dir.rglob("*.html"):                              # no traceback anywhere
        body = page.read_text(encoding="utf-8")
        assert "Traceback (most recent call last)" not in body and "ipythontb" not in body, page

    broken, external, remote = book.check_links(html_dir)              # every relative link resolves
    assert not broken, broken
    assert not remote, f"the book loads these from the network (offline, they fail): {remote[:5]}"
    page = (html_dir / "course" / LECTURES[1]).with_suffix(".html").read_text(encoding="utf-8")
    assert re.search(r'<script[^>]+src="[./]*_static/mathjax/tex-chtml\.js', page), \
        "the lectures' formulas are not typeset by the book's own MathJax"
    assert all(u.startswith(("http://", "https://")) for u in external)
    assert (out / "external_links.txt").read_text().split() == external
