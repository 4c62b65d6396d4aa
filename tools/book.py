"""The course as a rendered book (Jupyter Book 1.0.4): lectures executed, exercises as released.

    python tools/book.py [--jobs N] [--out DIR] [--course-root DIR] [--no-execute]
    ./course.sh book                      # the same, after set-up

1. The lectures (``course/NN_*.ipynb``) execute top to bottom with nbclient, ``--jobs`` at a time (a
   process pool, one kernel each, ``OMP_NUM_THREADS=1``), in ``--course-root`` (default: this
   repository) with that tree's library (its ``src/`` first on the kernels' ``PYTHONPATH``): the
   unpacked student archive builds as well (tests/test_book.py). GPU cells print the committed
   measured results there. A cell that raises, or an output that shows a traceback, fails the build
   with the lecture's name and the error; each lecture's seconds go to ``OUT/timings.json``.
2. ``OUT`` (default ``build/book``) is the book's source: the executed lectures, the exercises'
   released notebooks (``exercises/NN_*/NN_*.ipynb``, unexecuted: task text and stubs), the figures
   they reference, ``intro.md``, ``_config.yml`` (no execution, nothing fetched) and ``_toc.yml`` in
   ladder order: for each step, its lecture then its exercise. The steps are the manifests'
   (``solutions/NN_*/step.toml``, read from this repository: the archive has none), plus any lecture
   without a manifest (step 00), by number.
3. ``jupyter-book build OUT``, then an offline link check of ``OUT/_build/html``: every relative
   href and src names a file of the build; external links are listed (``OUT/external_links.txt``),
   not fetched. A broken link, a script, stylesheet or image loaded from the network (MathJax comes
   with the book: sphinx-mathjax-offline), or any Sphinx warning (a markdown link to a missing file
   is one), fails the build (exit 1).
"""
from __future__ import annotations

import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))     # this repository's manifests, whatever PYTHONPATH says

from facourse.steps import load_step, step_ids  # noqa: E402

IMAGE_RE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img[^>]*\bsrc=[\"']([^\"']+)[\"']")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
TRACEBACK = "Traceback (most recent call last)"
MARKER = ".facourse-book"                 # OUT was made by this tool: safe to empty
MATHJAX_EXTENSION = "sphinx-mathjax-offline"   # the package's module name, hyphens and all


class BookError(Exception):
    pass


# ----------------------------------------------------------------------------- the ladder
def ladder(course_root: Path) -> list[dict]:
    """[{id, title, lecture: rel path or None, exercise: rel path or None}] in step order."""
    steps = {}
    for sid in step_ids():
        m = load_step(sid)
        ex = Path("exercises") / m["dir"].name / m["step"]["notebook"]
        steps[sid] = {"id": sid, "title": m["step"]["title"], "lecture": m["step"].get("lecture"),
                      "exercise": str(ex) if (course_root / ex).is_file() else None}
        if steps[sid]["exercise"] is None:
            raise BookError(f"step {sid}: its released notebook {ex} is not in {course_root}")
    for lec in sorted((course_root / "course").glob("[0-9][0-9]_*.ipynb")):
        sid = lec.name[:2]
        rel = f"course/{lec.name}"
        if sid not in steps:                     # a lecture without an exercise (step 00)
            steps[sid] = {"id": sid, "title": None, "lecture": rel, "exercise": None}
        elif steps[sid]["lecture"] != rel:
            raise BookError(f"{rel} is no step's lecture (step {sid}'s manifest names {steps[sid]['lecture']})")
    for s in steps.values():
        if s["lecture"] and not (course_root / s["lecture"]).is_file():
            raise BookError(f"step {s['id']}: its lecture {s['lecture']} is not in {course_root}")
    return [steps[k] for k in sorted(steps)]


def first_heading(nb: dict) -> str | None:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return None


# ----------------------------------------------------------------------------- execution
def _execute(course_root: str, rel: str, dest: str) -> dict:
    """Run one lecture (in a pool process): {lecture, seconds, error or None}."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(course_root) / rel
    log = Path(dest).parent.parent / "logs" / f"{path.stem}.log"   # the kernel's own stderr (it inherits ours)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 2)
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except CellExecutionError as e:
        tb = ANSI_RE.sub("", str(e)).strip().splitlines()
        error = f"{getattr(e, 'ename', 'error')}: {getattr(e, 'evalue', '')}\n" + "\n".join(tb[-15:])
    except Exception as e:  # noqa: BLE001  (a dead kernel, a timeout: the lecture's failure all the same)
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    if error is None:                               # cells allowed to raise, tracebacks printed by hand
        for i, cell in enumerate(nb.cells):
            for o in cell.get("outputs", []):
                text = o.get("text", "") if o.output_type == "stream" else \
                    "".join(o.get("data", {}).get("text/plain", "")) if "data" in o else ""
                if o.output_type == "error" or TRACEBACK in text:
                    error = f"cell {i} shows an error: " + (f"{o.ename}: {o.evalue}" if o.output_type == "error"
                                                            else text.strip()[-1500:])
                    break
            if error:
                break
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return {"lecture": rel, "seconds": round(seconds, 1), "error": error}


def _worker_init(pythonpath: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"              # each kernel inherits this process's environment
    os.environ["PYTHONPATH"] = pythonpath
    os.environ.pop("TRITON_INTERPRET", None)         # the lectures choose it themselves


def run_lectures(course_root: Path, lectures: list[str], out: Path, jobs: int, previous: dict) -> dict:
    """Execute ``lectures`` into ``out``; the longest of the previous run first (none: the last step first).
    {rel: result}."""
    pythonpath = os.pathsep.join([str(course_root / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    order = sorted(lectures, key=lambda r: (-previous.get(r, 0), -int(Path(r).name[:2])))  # else: later ones are longer
    results = {}
    with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init, initargs=(pythonpath,)) as pool:
        futures = [pool.submit(_execute, str(course_root), rel, str(out / rel)) for rel in order]
        for f in as_completed(futures):
            r = f.result()
            results[r["lecture"]] = r
            print(f"  {'FAILED' if r['error'] else 'ok'}  {r['lecture']} ({r['seconds']:.0f} s)", flush=True)
    return results


# ----------------------------------------------------------------------------- the book's source
def stage(course_root: Path, steps: list[dict], out: Path, execute: bool) -> None:
    """Exercises, unexecuted lectures (``--no-execute``), figures, intro, config and table of contents."""
    import nbformat

    pages = []
    for s in steps:
        for key in ("lecture", "exercise"):
            rel = s[key]
            if rel is None:
                continue
            pages.append(rel)
            if key == "exercise" or not execute:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(course_root / rel, out / rel)
            if s["title"] is None and key == "lecture":
                s["title"] = first_heading(nbformat.read(course_root / rel, as_version=4)) or Path(rel).stem
    for rel in pages:                                 # the figures the notebooks reference
        text = (course_root / rel).read_text(encoding="utf-8")
        for m in IMAGE_RE.finditer(text):
            ref = m.group(1) or m.group(2)
            if "://" in ref or ref.startswith("data:"):
                continue
            fig = (course_root / rel).parent / unquote(ref)
            target = (out / rel).parent / unquote(ref)
            if not fig.is_file():
                raise BookError(f"{rel} shows {ref}, which is not in {course_root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fig, target)

    readme = course_root / "README.md"
    title = next((ln[2:].strip() for ln in readme.read_text(encoding="utf-8").splitlines()
                  if ln.startswith("# ")), "FlashAttention course") if readme.is_file() else "FlashAttention course"
    rows = "\n".join(f"| {s['id']} | {s['title']} | "
                     + " | ".join(f"[{Path(s[k]).stem}]({s[k]})" if s[k] else "" for k in ("lecture", "exercise"))
                     + " |" for s in steps)
    (out / "intro.md").write_text(
        f"# {title}\n\nThe course's ladder, one step at a time: each step's lecture (executed on a CPU; "
        f"its GPU cells show the committed measured results), then its exercise as released (the task "
        f"and the stubs to fill in, without solutions).\n\n"
        f"| step | topic | lecture | exercise |\n|---|---|---|---|\n{rows}\n", encoding="utf-8")
    (out / "_config.yml").write_text(json.dumps({          # JSON is YAML
        "title": title,
        "author": "",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},           # executed above, once
        "html": {"use_repository_button": False, "use_issues_button": False, "use_edit_page_button": False,
                 "use_multitoc_numbering": False, "google_analytics_id": ""},
        "launch_buttons": {"notebook_interface": "", "binderhub_url": "", "jupyterhub_url": "",
                           "thebe": False, "colab_url": ""},
        "repository": {"url": ""},
        "parse": {"myst_enable_extensions": ["dollarmath", "amsmath", "colon_fence"]},
        # MathJax from the book's own _static/mathjax (the extension copies it there), not from a CDN
        "sphinx": {"extra_extensions": [MATHJAX_EXTENSION],
                   "config": {"html_show_copyright": False, "nb_merge_streams": True}},
    }, indent=1) + "\n", encoding="utf-8")
    parts = []
    for s in steps:
        chapters = [{"file": str(Path(s[k]).with_suffix(""))} for k in ("lecture", "exercise") if s[k]]
        parts.append({"caption": f"{s['id']} · {s['title']}", "chapters": chapters})
    (out / "_toc.yml").write_text(json.dumps({"format": "jb-book", "root": "intro", "parts": parts},
                                             indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- links
class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []       # (tag, link)

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("href", "src") and v:
                self.links.append((tag, v))


#: Tags whose href/src the browser loads with the page (a script, a stylesheet, an image): on the
#: network, the book would not render offline. An <a href> to the web is only a link to follow.
ASSET_TAGS = ("script", "link", "img", "source", "iframe")


def check_links(html_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """(broken: "page -> link", external links, remote assets: "page -> url") of every page of
    ``html_dir``."""
    broken, external, remote = [], set(), []
    for page in sorted(html_dir.rglob("*.html")):
        if page.relative_to(html_dir).parts[0] in ("_static", "_sources"):   # theme templates, not pages
            continue
        p = _Links()
        p.feed(page.read_text(encoding="utf-8", errors="replace"))
        for tag, link in p.links:
            u = urlsplit(link)
            if u.scheme in ("http", "https") or (u.netloc and not u.scheme):
                if tag in ASSET_TAGS:
                    remote.append(f"{page.relative_to(html_dir)} -> {link}")
                else:
                    external.add(link)
                continue
            if u.scheme or not u.path:                # mailto:, data:, javascript:, #anchor
                continue
            target = (html_dir / unquote(u.path).lstrip("/")) if u.path.startswith("/") else \
                page.parent / unquote(u.path)
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(html_dir)} -> {link}")
    return broken, sorted(external), remote


# ----------------------------------------------------------------------------- main
def jupyter_book() -> list[str]:
    exe = Path(sys.executable).parent / "jupyter-book"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("jupyter-book")
    if not found:
        raise BookError("jupyter-book is not installed: pip install -e '.[book]' (./course.sh book does)")
    return [found]


def build(course_root: Path, out: Path, jobs: int, execute: bool = True) -> dict:
    """The whole build; returns {"timings", "seconds": {"execute", "sphinx", "total"}, "external"}."""
    t_start = time.perf_counter()
    course_root, out = course_root.resolve(), out.resolve()
    jb = jupyter_book()                       # before minutes of execution, not after
    steps = ladder(course_root)
    previous = {}
    if (out / "timings.json").is_file():
        previous = json.loads((out / "timings.json").read_text()).get("lectures", {})
    if out.exists():
        if not (out / MARKER).exists() and any(out.iterdir()):
            raise BookError(f"{out} exists and was not made by tools/book.py: not emptying it")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by tools/book.py; emptied by its next run\n")

    lectures = [s["lecture"] for s in steps if s["lecture"]]
    timings, t0 = {}, time.perf_counter()
    if execute:
        print(f"executing {len(lectures)} lectures in {course_root}, {jobs} at a time", flush=True)
        results = run_lectures(course_root, lectures, out, jobs, previous)
        timings = {rel: results[rel]["seconds"] for rel in lectures}
        failed = [r for r in (results[rel] for rel in lectures) if r["error"]]
        (out / "timings.json").write_text(json.dumps({"lectures": timings, "failed": [r["lecture"] for r in failed]},
                                                     indent=1) + "\n")
        if failed:
            raise BookError("a lecture failed; no book is built:\n" + "\n\n".join(
                f"{r['lecture']}: {r['error']}" for r in failed))
    t_exec = time.perf_counter() - t0
    stage(course_root, steps, out, execute)

    t0 = time.perf_counter()
    r = subprocess.run(jb + ["build", str(out), "--builder", "html"], capture_output=True, text=True)
    t_sphinx = time.perf_counter() - t0
    log = r.stdout + r.stderr
    (out / "sphinx.log").write_text(log)
    if r.returncode != 0:
        raise BookError(f"jupyter-book build failed (exit {r.returncode}):\n{log[-4000:]}")
    warnings = [ANSI_RE.sub("", ln) for ln in log.splitlines() if "WARNING" in ln]
    if warnings:     # a markdown link to a missing file is one (myst.xref_missing): no href to check after
        raise BookError(f"{len(warnings)} Sphinx warnings (the book builds without any):\n" + "\n".join(warnings[:30]))
    html_dir = out / "_build" / "html"
    broken, external, remote = check_links(html_dir)
    (out / "external_links.txt").write_text("".join(f"{u}\n" for u in external))
    if broken:
        raise BookError(f"{len(broken)} broken links in the book:\n" + "\n".join(broken[:50]))
    if remote:
        raise BookError(f"{len(remote)} scripts, stylesheets or images loaded from the network (the book must "
                        f"render offline):\n" + "\n".join(remote[:50]))
    seconds = {"execute": round(t_exec, 1), "sphinx": round(t_sphinx, 1),
               "total": round(time.perf_counter() - t_start, 1)}
    (out / "timings.json").write_text(json.dumps({"lectures": timings, "failed": [], "seconds": seconds},
                                                 indent=1) + "\n")
    print(f"book: {html_dir / 'index.html'} (Sphinx's log: {out / 'sphinx.log'}; "
          f"{len(external)} external links listed in {out / 'external_links.txt'}, not fetched; "
          f"execute {seconds['execute']:.0f} s, sphinx {seconds['sphinx']:.0f} s, total {seconds['total']:.0f} s)")
    return {"timings": timings, "seconds": seconds, "external": external}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="lectures executed at a time")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="the book's source; HTML in OUT/_build/html")
    ap.add_argument("--course-root", type=Path, default=ROOT,
                    help="the tree whose course/, exercises/, diagrams/ and src/ build the book (e.g. the student archive)")
    ap.add_argument("--no-execute", action="store_true", help="lectures without outputs: a quick structural build")
    a = ap.parse_args(argv)
    try:
        build(a.course_root, a.out, max(1, a.jobs), execute=not a.no_execute)
    except BookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
