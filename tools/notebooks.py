"""Notebooks are authored as text: every notebook has a jupytext percent-format twin that people edit.

    python tools/notebooks.py build  [PATHS]   # twin -> .ipynb (only the files that change are written)
    python tools/notebooks.py check  [PATHS]   # exit 1 naming every .ipynb that differs from its twin's build
    python tools/notebooks.py import [PATHS]   # fold an edited .ipynb back into its twin, then rebuild it

PATHS are notebooks or twins (either one names the pair); none means every pair. `import` without
PATHS takes the notebooks that are out of sync and newer than their twin (or that have no twin yet).

Naming. The twin of `DIR/NN_name.ipynb` is `DIR/NN_name.pct.py`, next to it: lectures
(`course/*.ipynb`) and exercise sources (`solutions/NN_*/NN_*.ipynb`, nbgrader's source notebooks).
A twin of a solution notebook holds the solutions and the hidden tests, so `*.pct.py` is in
`c.CourseDirectory.ignore` of autograder/nbgrader_config.py and never reaches exercises/; the
dotted name is not an importable module, and pytest collects only tests/. To start a new notebook,
write its twin and run `build`.

The twin is plain jupytext percent format without a header: `# %%` starts a code cell,
`# %% [markdown]` a markdown cell (its lines commented with `# `); cell metadata (the nbgrader dict,
jupytext's own `lines_to_next_cell`) sits on the marker line as `key=JSON`. Notebook metadata is not
in the twin: `build` always writes the python3 kernelspec and nothing else.

Cell ids are derived from names, never from positions, so inserting, removing or moving a cell
changes no other cell's id:
  1. the cell's nbgrader grade_id where there is one;
  2. else an explicit name: the title of the cell marker, `# %% my-name` (`# %% my-name [markdown]`);
  3. else a slug of the cell's first line of substance: a markdown cell's first heading (else its
     first line), a code cell's first comment (else its first line; `def f(...)` gives `def-f`;
     decorators, magics and nbgrader's BEGIN/END markers are skipped);
lower-cased, [a-z0-9-] only, at most 40 characters ("cell" when nothing is left). Equal slugs are
told apart by a suffix, `-2`, `-3`, ... in order of appearance, and only they: a cell inserted
before another one with the same slug renumbers that one, so give such cells a name (2.). grade_ids
and names must be unique within a notebook (build refuses otherwise). Titles are not copied into
the .ipynb's metadata; `import` restores them from the current twin by matching ids.

The .ipynb is what `build` writes and nothing else: no outputs, execution counts None, nbformat
4.5, `nbformat.writes` layout (one-space indent, sorted keys) with a final newline; the same twin
always gives the same bytes. tests/test_notebook_twins.py checks that every committed notebook is
its twin's build. Edited in Jupyter instead? `import` the .ipynb: it drops outputs and editor
metadata (ExecuteTime, scrolled, collapsed, ...) and rewrites the twin, then rebuilds the notebook
so both agree.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import unicodedata
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
TWIN_SUFFIX = ".pct.py"
FORMAT = "py:percent"
NOTEBOOK_GLOBS = ("course/*.ipynb", "solutions/*/*.ipynb")
METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}
# What an editor adds to a cell and the twin does not keep.
EDITOR_METADATA = ("ExecuteTime", "execution", "scrolled", "collapsed", "jp-MarkdownHeadingCollapsed",
                   "trusted", "vscode", "title")
ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SLUG_MAX = 40
# Lines that say nothing about a cell: nbgrader's region markers, magics, shebangs, decorators.
NOISE = re.compile(r"^(#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS|MARK SCHEME)\b|%|!|#!|@)")
DEF = re.compile(r"^(?:async\s+)?(def|class)\s+(\w+)")


# ---------------------------------------------------------------- pairs

def twin_of(path: Path) -> Path:
    """The twin of a notebook, or the twin itself."""
    path = Path(path)
    if path.name.endswith(TWIN_SUFFIX):
        return path
    return path.with_name(path.name.removesuffix(".ipynb") + TWIN_SUFFIX)


def notebook_of(path: Path) -> Path:
    """The notebook of a twin, or the notebook itself."""
    path = Path(path)
    if path.name.endswith(TWIN_SUFFIX):
        return path.with_name(path.name.removesuffix(TWIN_SUFFIX) + ".ipynb")
    return path


def pairs(root: Path = ROOT, paths=None) -> list[tuple[Path, Path]]:
    """(notebook, twin) of every lecture and exercise source, or of the given paths."""
    if paths:
        found = {notebook_of(Path(p).resolve()) for p in paths}
    else:
        found = set()
        for pat in NOTEBOOK_GLOBS:
            found |= {p for p in root.glob(pat) if ".ipynb_checkpoints" not in p.parts}
            found |= {notebook_of(t) for t in root.glob(pat.replace(".ipynb", TWIN_SUFFIX))}
    return [(nb, twin_of(nb)) for nb in sorted(found)]


# ---------------------------------------------------------------- ids

def slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    s = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    if len(s) > SLUG_MAX:
        cut = s[:SLUG_MAX]
        s = cut.rsplit("-", 1)[0] if "-" in cut[SLUG_MAX // 2:] else cut
    return s.strip("-") or "cell"


def name_line(cell) -> str:
    """The line a cell without grade_id or title is named after."""
    lines = [ln.strip() for ln in cell.source.splitlines()]
    lines = [ln for ln in lines if ln and not NOISE.match(ln)]
    if not lines:
        return ""
    if cell.cell_type == "markdown":
        marked = [ln for ln in lines if ln.startswith("#")]
    else:
        marked = [ln for ln in lines if ln.startswith("#") and ln.lstrip("#").strip()]
    first = (marked or lines)[0]
    m = DEF.match(first)
    return f"{m[1]} {m[2]}" if m else first.lstrip("#").strip()


def explicit_name(cell) -> str | None:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    return gid or cell.metadata.get("title") or None


def cell_ids(cells) -> list[str]:
    """One id per cell: grade_id, else the marker's title, else a slug; see the module docstring."""
    ids: list[str | None] = []
    taken: set[str] = set()
    for c in cells:
        name = explicit_name(c)
        if name is None:
            ids.append(None)
            continue
        cid = name if ID_RE.match(name) else slug(name)
        if cid in taken:
            raise ValueError(f"two cells are named {cid!r} (grade_id or title): names must be unique")
        taken.add(cid)
        ids.append(cid)
    seen: dict[str, int] = {}
    for i, c in enumerate(cells):
        if ids[i] is not None:
            continue
        base = slug(name_line(c))
        count = seen.get(base, 0)
        while True:
            count += 1
            cid = base if count == 1 else f"{base}-{count}"
            if cid not in taken:
                break
        seen[base] = count
        taken.add(cid)
        ids[i] = cid
    return ids


# ---------------------------------------------------------------- build

def render(text: str) -> str:
    """The .ipynb text of a twin's text: deterministic, output-free, ids from names."""
    nb = jupytext.reads(text, fmt=FORMAT)
    nb.metadata = copy.deepcopy(METADATA)
    nb.nbformat, nb.nbformat_minor = 4, 5
    for c, cid in zip(nb.cells, cell_ids(nb.cells)):
        c.id = cid
        c.metadata.pop("title", None)
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
    out = nbformat.writes(nb)
    return out if out.endswith("\n") else out + "\n"


def build_one(nb_path: Path, twin: Path) -> bool:
    """Write the notebook of a twin; True if it changed."""
    text = render(twin.read_text(encoding="utf-8"))
    if nb_path.is_file() and nb_path.read_text(encoding="utf-8") == text:
        return False
    nb_path.write_text(text, encoding="utf-8", newline="\n")
    return True


def out_of_sync(root: Path = ROOT, paths=None) -> list[str]:
    """Why each pair is out of sync (empty when all agree)."""
    bad = []
    for nb_path, twin in pairs(root, paths):
        rel = os.path.relpath(nb_path, root)
        if not twin.is_file():
            bad.append(f"{rel}: no twin {twin.name} (run: python tools/notebooks.py import {rel})")
        elif not nb_path.is_file():
            bad.append(f"{rel}: missing (run: python tools/notebooks.py build)")
        elif nb_path.read_text(encoding="utf-8") != render(twin.read_text(encoding="utf-8")):
            bad.append(f"{rel}: differs from the build of {twin.name} "
                       "(edited the twin? run build; edited the notebook? run import)")
    return bad


# ---------------------------------------------------------------- import

def to_text(nb, names: dict[str, str] | None = None) -> str:
    """The twin's text of a notebook. `names`: id or source -> title, the explicit names to keep."""
    nb = copy.deepcopy(nb)
    names = names or {}
    for c in nb.cells:
        for k in EDITOR_METADATA:
            c.metadata.pop(k, None)
        if not c.metadata.get("nbgrader", {}).get("grade_id"):
            title = names.get("id:" + str(c.get("id"))) or names.get("source:" + c.source)
            if title:
                c.metadata["title"] = title
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
    nb.metadata = {"jupytext": {"notebook_metadata_filter": "-all", "cell_metadata_filter": "all"}}
    return jupytext.writes(nb, fmt=FORMAT)


def titles(twin_text: str) -> dict[str, str]:
    """The explicit names of a twin's cells, keyed by the id they give ("id:ID") and by the cell's
    source ("source:TEXT", for a notebook whose ids are not the twin's, e.g. positional ones)."""
    nb = jupytext.reads(twin_text, fmt=FORMAT)
    out = {}
    for c, cid in zip(nb.cells, cell_ids(nb.cells)):
        if c.metadata.get("title") and not c.metadata.get("nbgrader", {}).get("grade_id"):
            out["id:" + cid] = out["source:" + c.source] = c.metadata["title"]
    return out


def import_one(nb_path: Path, twin: Path) -> None:
    """Rewrite the twin from the notebook (keeping the twin's explicit names), then rebuild the notebook."""
    nb = nbformat.read(nb_path, as_version=4)
    names = titles(twin.read_text(encoding="utf-8")) if twin.is_file() else {}
    twin.write_text(to_text(nb, names), encoding="utf-8", newline="\n")
    build_one(nb_path, twin)


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:3]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("build", "check", "import"))
    ap.add_argument("paths", nargs="*", help="notebooks or twins (default: all)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    root = a.root.resolve()
    rel = lambda p: os.path.relpath(p, root)  # noqa: E731

    if a.command == "check":
        bad = out_of_sync(root, a.paths)
        for line in bad:
            print(line)
        if not bad:
            print(f"{len(pairs(root, a.paths))} notebooks agree with their twins")
        return 1 if bad else 0

    if a.command == "build":
        missing = [t for _, t in pairs(root, a.paths) if not t.is_file()]
        for t in missing:
            print(f"{rel(notebook_of(t))}: no twin (run: python tools/notebooks.py import {rel(notebook_of(t))})")
        for nb_path, twin in pairs(root, a.paths):
            if twin.is_file() and build_one(nb_path, twin):
                print(f"built {rel(nb_path)}")
        return 1 if missing else 0

    todo = []
    for nb_path, twin in pairs(root, a.paths):
        if not nb_path.is_file():
            print(f"{rel(nb_path)}: no notebook to import")
            continue
        if a.paths or not twin.is_file():
            todo.append((nb_path, twin))
        elif nb_path.read_text(encoding="utf-8") != render(twin.read_text(encoding="utf-8")):
            if nb_path.stat().st_mtime >= twin.stat().st_mtime:
                todo.append((nb_path, twin))
            else:
                print(f"{rel(nb_path)}: its twin is newer; run build, or import it by name to take the notebook")
    for nb_path, twin in todo:
        import_one(nb_path, twin)
        print(f"imported {rel(nb_path)} -> {rel(twin)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
