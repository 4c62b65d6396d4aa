"""Turn a CUDA solution file into the student's stub (nbgrader clears solution regions in notebooks
only, and its Python stub text would not compile as CUDA).

Every region between `// BEGIN SOLUTION` and `// END SOLUTION` becomes `// YOUR CODE HERE (about N
lines)` plus a body that compiles and leaves the outputs in a defined state, so that a partly written
kernel fails the tests with wrong values instead of hanging or reading garbage. Grading-only.
"""
from __future__ import annotations

import re
from pathlib import Path

_FUNC = re.compile(r"\b[A-Z]+_DEVICE\s+void\s+(\w+)\s*\(")
#: The first line of every stub body: FA_TODO (defined as nothing by the step's headers) lets the notebook's
#: compile check and CPU check report a function as not implemented while its body carries it.
TODO = "FA_TODO(\"{}\");  // the stub's marker: delete this line when you write the body"


def make_stub(text: str, bodies: dict[str, list[str]]) -> str:
    """``bodies``: function name -> the lines its stub body gets (each function with a region)."""
    out, region, func, indent = [], None, None, ""
    for line in text.splitlines(keepends=True):
        if m := _FUNC.search(line):
            func = m[1]
        if "BEGIN SOLUTION" in line:
            if region is not None:
                raise ValueError("nested BEGIN SOLUTION")
            region, indent = [], line[: len(line) - len(line.lstrip())]
            continue
        if "END SOLUTION" in line:
            if region is None:
                raise ValueError("END SOLUTION without BEGIN SOLUTION")
            if func not in bodies:
                raise ValueError(f"no stub body for function {func!r}")
            n = sum(1 for ln in _counted(region) if ln.strip() and not ln.strip().startswith(("//", "#pragma")))
            out.append(f"{indent}// YOUR CODE HERE (about {n} lines)\n")
            out += [f"{indent}{ln}\n" for ln in bodies[func]]
            region = None
            continue
        if region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise ValueError("BEGIN SOLUTION without END SOLUTION")
    return "".join(out)


def _counted(region: list[str]) -> list[str]:
    """The lines of a solution region a student writes: not the ladder's variants, fenced by `LADDER ONLY {`
    and `} LADDER ONLY` comment lines (the rungs' switches; the exercise's solution builds without them)."""
    out, fenced = [], False
    for ln in region:
        if "LADDER ONLY {" in ln:
            fenced = True
        elif "} LADDER ONLY" in ln:
            fenced = False
        elif not fenced:
            out.append(ln)
    return out


def with_todo(bodies: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each function's stub body opened by its FA_TODO marker."""
    return {func: [TODO.format(func), *lines] for func, lines in bodies.items()}


def write_or_check(ladder: Path, bodies: dict[str, list[str]], argv: list[str]) -> int:
    """The command line of a step's make_stub.py: the step's student_kernel.cu rewritten from
    ``ladder``/student_kernel_solution.cu, or with --check exit 1 when stale."""
    stub = ladder.parent / "student_kernel.cu"
    text = make_stub((ladder / "student_kernel_solution.cu").read_text(), bodies)
    if "--check" in argv:
        ok = stub.exists() and stub.read_text() == text
        print(f"{stub.name} is up to date" if ok else f"{stub.name} is out of date: run make_stub.py")
        return 0 if ok else 1
    stub.write_text(text)
    print(f"wrote {stub}")
    return 0
