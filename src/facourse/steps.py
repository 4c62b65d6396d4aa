"""The steps' manifests: ``solutions/NN_*/step.toml``, one per step, read by everything else.

    >>> from facourse.steps import load_step, solution_path
    >>> load_step("05")["ladder"]["solution"]
    'v6_host_tma'

A manifest names the step (``[step]``), its exercise (entry point, the given harness files), its
reference backend (``[reference]``) and its ladder of solution kernels (``[[rungs]]``: name, file,
verdict). Thresholds are not here: ``autograder/thresholds.toml`` is their one place. The
manifests live in ``solutions/``, which the student archive leaves out: this module is for the
repository's own tools (benchmarks/ladder.py, the tests), not for the notebooks.
"""
from __future__ import annotations

import functools
import linecache
import re
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"


def step_dir(step: str | int) -> Path:
    """``solutions/NN_*`` for step ``"05"``, ``5`` or ``"05_triton_flash_attention"``."""
    sid = f"{int(str(step)[:2]):02d}"
    found = sorted(SOLUTIONS.glob(f"{sid}_*/step.toml"))
    if not found:
        raise KeyError(f"no manifest solutions/{sid}_*/step.toml (is solutions/ here? the student archive has none)")
    return found[0].parent


def step_ids() -> list[str]:
    """Every step that has a manifest, in order."""
    return [p.parent.name[:2] for p in sorted(SOLUTIONS.glob("[0-9][0-9]_*/step.toml"))]


def load_step(step: str | int) -> dict:
    """The manifest as a dict, with ``dir`` (the step's folder), ``ladder_dir``, ``rungs`` (a list,
    possibly empty), ``entry_points`` (always a list) and ``ladder`` (``{}`` without rungs)."""
    d = step_dir(step)
    m = tomllib.loads((d / "step.toml").read_text(encoding="utf-8"))
    m["dir"], m["ladder_dir"] = d, d / "ladder"
    m.setdefault("rungs", [])
    m.setdefault("ladder", {})
    m.setdefault("reference", {})
    ep = m["exercise"]["entry_point"]
    m["entry_points"] = [ep] if isinstance(ep, str) else list(ep)
    return m


def rung(step: str | int | dict, name: str) -> dict:
    m = step if isinstance(step, dict) else load_step(step)
    for r in m["rungs"]:
        if r["name"] == name:
            return r
    raise KeyError(f"step {m['step']['id']} has no rung {name!r}; rungs: {[r['name'] for r in m['rungs']]}")


def rung_path(step: str | int | dict, name: str) -> Path:
    m = step if isinstance(step, dict) else load_step(step)
    return m["ladder_dir"] / rung(m, name)["file"]


def solution_path(step: str | int | dict) -> Path:
    """The ladder file of the step's solution (the rung the manifest names)."""
    m = step if isinstance(step, dict) else load_step(step)
    return rung_path(m, m["ladder"]["solution"])


# ----------------------------------------------------------------------------- the exercise's cells
def exercise_source(step: str | int, names: tuple[str, ...], text: str | None = None) -> str:
    """The code of the step's notebook twin's cells named by grade_id, in the twin's order, without
    nbgrader's solution markers (the code between them stays: it is the solution)."""
    twin = step_dir(step) / load_step(step)["step"]["notebook"].replace(".ipynb", ".pct.py")
    text = twin.read_text(encoding="utf-8") if text is None else text
    out, found = [], set()
    for chunk in ("\n" + text).split("\n# %%")[1:]:
        header, _, body = chunk.partition("\n")
        gid = header.partition('"grade_id": "')[2].partition('"')[0]
        if gid in names and "[markdown]" not in header:
            found.add(gid)
            out.append("\n".join(ln for ln in body.splitlines() if "### BEGIN" not in ln and "### END" not in ln))
    if set(names) - found:
        raise LookupError(f"{twin.name} has no code cell {sorted(set(names) - found)}")
    return "\n\n".join(out)


def hidden_entries(step: str | int) -> dict[str, str]:
    """test -> the name of the function its hidden cell hands the judge (``judge("test_x", fn)`` in the twin)."""
    twin = step_dir(step) / load_step(step)["step"]["notebook"].replace(".ipynb", ".pct.py")
    return dict(re.findall(r'judge\("(\w+)", (\w+)\)', twin.read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=None)
def exercise_module(step: str, names: tuple[str, ...]) -> types.ModuleType:
    """The exercise's solution cells ``names`` run as one module, once per process: a ladder rung that
    is the exercise's solution loads it, so that the two are one source.

    Triton reads a kernel's source back (inspect.getsource): the cells go into linecache under a name
    of their own, so that the line numbers it reads are the cells', not the twin's."""
    src = exercise_source(step, names)
    twin = load_step(step)["step"]["notebook"].replace(".ipynb", ".pct.py")
    name = f"<{twin}: cells {', '.join(names)}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    mod = types.ModuleType(f"step{step}_exercise_solution", f"exercise {step}'s solution cells")
    mod.__file__ = name
    # dont_inherit: compiled as a notebook compiles them, without this module's __future__ imports
    # (postponed annotations would turn a TileLang prim_func's tensor annotations into strings)
    exec(compile(src, name, "exec", dont_inherit=True), mod.__dict__)  # noqa: S102
    return mod
