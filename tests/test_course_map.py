"""README.md's course map says which GPUs each step was run on, and which targets are only compile-checked
(issue 34), as the committed evidence gives them.

Run on: the GPUs of the committed results under ``benchmarks/results/`` for the step. A result's name is
``DATE_DEVICE_WHAT``, and WHAT names its steps (``step05``, ``gpu_selftest_07_10``, ``lectures_00_02``);
its content names the same GPU (a JSON's ``env.gpu``; a text record in its header or its closing
line). Compile-checked only: the targets the CPU tests compile the step's kernels for (Triton's
compiler in tests/test_triton_targets.py, nvcc in the step's CUDA tests) less those of the GPUs it was
run on.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from conftest import load_module
from facourse.steps import step_ids

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = re.compile(r"\d{4}-\d{2}-\d{2}_(?P<device>[a-z]\d+|cpu)_(?P<what>.+?)(?:\.\w+)?$")
STEPS = re.compile(r"(?:step|selftest|lectures)((?:_?\d{2})+)(?!\d)")
GPU = re.compile(r"(?<![\w/])([A-Z]\d{2,4})(?!\d)")      # H100, H200: a model, not "sm_90" or "FA2"
SM = re.compile(r"sm_(\d+)a?\b")


def _gpu_text(path: Path) -> str:
    """Where a result names its GPU: a JSON's env (or top level), a text record's text."""
    if path.is_dir():
        path = path / "README.md"
    if path.suffix == ".json":
        d = json.loads(path.read_text())
        return d.get("env", {}).get("gpu") or d["gpu"]
    return path.read_text()


@lru_cache(maxsize=1)
def results() -> list[tuple[str, str, set[str]]]:
    """(file name, GPU as the README writes it, steps its name carries) for each committed result."""
    out = []
    for p in sorted(RESULTS.iterdir()):
        m = NAME.fullmatch(p.name)
        assert m, f"{p.name}: a result's name is DATE_DEVICE_WHAT"
        if m["device"] == "cpu":                  # measured on a CPU: no GPU ran it
            assert re.search(r"\bCPU\b", _gpu_text(p)), f"{p.name}: its content does not say CPU"
            continue
        gpu = m["device"].upper()
        assert re.search(rf"\b{gpu}\b", _gpu_text(p)), f"{p.name}: its content does not name the {gpu} of its name"
        steps = {s for g in STEPS.findall(m["what"]) for s in re.findall(r"\d{2}", g)}
        out.append((p.name, gpu, steps))
    return out


def run_on() -> dict[str, set[str]]:
    per: dict[str, set[str]] = {}
    for _, gpu, steps in results():
        for s in steps:
            per.setdefault(s, set()).add(gpu)
    return per


def capability() -> dict[str, int]:
    """GPU -> compute capability, from the JSON results' env."""
    out = {}
    for p in RESULTS.glob("*.json"):
        env = json.loads(p.read_text()).get("env", {})
        if "capability" in env:
            out[NAME.fullmatch(p.name)["device"].upper()] = 10 * env["capability"][0] + env["capability"][1]
    return out


def compiled_for() -> dict[str, set[int]]:
    """Step -> the compute capabilities its kernels are compiled for on a CPU by the tests."""
    tt = load_module(ROOT / "tests" / "test_triton_targets.py", "triton_targets_for_course_map")
    per: dict[str, set[int]] = {}
    for case in tt.CASES.values():                  # "05", "lecture11": a step's solution or lecture
        per.setdefault(case["source"][-2:], set()).update(tt.LIMITS)
    for f in sorted((ROOT / "tests").glob("test_*step[0-9][0-9]*.py")):
        text = f.read_text()
        if "nvcc_compile_check(" in text:
            step = re.search(r"step(\d{2})", f.name)[1]
            per.setdefault(step, set()).update(int(x) for x in re.findall(r"[\"']sm_(\d+)a?[\"']", text))
    return per


def course_map() -> dict[str, tuple[str, str]]:
    """Step -> (its "run on" cell, its "compile-checked only" cell) in README.md's course map."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## The course map", 1)[1].split("\n\n", 2)[1].splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    i, j = head.index("run on"), head.index("compile-checked only")
    out = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = (cells[i], cells[j])
    return out


def test_every_result_names_its_gpu_and_one_without_a_step_adds_no_gpu():
    named = {g for gpus in run_on().values() for g in gpus}
    for name, gpu, steps in results():
        assert steps or gpu in named, f"{name}: the only result on the {gpu}, and its name carries no step"


def test_run_on_names_exactly_the_gpus_of_the_steps_results():
    got = course_map()
    assert list(got) == ["00"] + step_ids(), list(got)       # every step with a manifest, in order (and the lecture 00)
    derived = run_on()
    for step, (cell, _) in got.items():
        assert not re.search(r"\bGPU\b|sm_\d", cell), f"step {step}: a GPU it was run on is named by its model: {cell}"
        assert "CPU" in cell, f"step {step}: its tests (or its lecture) run on a CPU too: {cell}"
        assert set(GPU.findall(cell)) == derived.get(step, set()), (
            f"step {step}: README says {cell!r}; benchmarks/results/ has results on "
            f"{sorted(derived.get(step, set())) or 'no GPU'}")


def test_compile_checked_only_are_the_compiled_targets_not_run():
    cc = capability()
    ran = run_on()
    compiled = compiled_for()
    for step, (_, cell) in course_map().items():
        want = compiled.get(step, set()) - {cc[g] for g in ran.get(step, set())}
        got = {int(x) for x in SM.findall(cell)}
        assert got == want, f"step {step}: README says {cell!r}; compiled and never run: {sorted(want)}"
        assert got or cell == "—", (step, cell)


def test_the_strict_xfails_have_their_footnote():
    tt = load_module(ROOT / "tests" / "test_triton_targets.py", "triton_targets_for_course_map")
    text = (ROOT / "README.md").read_text().split("## The course map", 1)[1]
    configs = {case for case, _ in tt.TOO_BIG}
    cut = sorted({c for _, c in tt.TOO_BIG})
    assert all(c.startswith("lecture05 ") for c in configs), configs
    cell = course_map()["05"][1]
    assert all(re.search(rf"sm_{c}\s*¹", cell) for c in cut), cell
    note = re.search(r"^¹ (.+?)(?:\n\n|\Z)", text, re.M | re.S)
    assert note and f"{len(configs)} configs" in note[1] and "xfail" in note[1], note
