"""The tree's structure: no import circle, no private name used across modules, no oversized module.

Covers the project's own modules in `src/`, `autograder/`, `benchmarks/` and `tools/`, read with `ast`
(nothing is imported or run).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = {ROOT / "src": "", ROOT / "autograder": "autograder", ROOT / "benchmarks": "benchmarks",
         ROOT / "tools": "tools"}
MAX_LINES = 800



def _module_name(path: Path) -> str:
    for tree, prefix in TREES.items():
        if path.is_relative_to(tree):
            parts = list(path.relative_to(tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(([prefix] if prefix else []) + parts)
    raise ValueError(path)


def _project_files() -> dict[str, Path]:
    files = {}
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[_module_name(path)] = path
    return files


FILES = _project_files()
MODULES = set(FILES)


def _package(module: str) -> str:
    """The package a module's relative imports start from."""
    return module if FILES[module].name == "__init__.py" else module.rpartition(".")[0]


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module).split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.AST):
    """(imported project module, imported name or None, node) for every import in the file.

    Imports at module level and inside functions both count: a deferred import still ties the two
    modules together, it only hides the circle until the function runs. An import of `a.b.c` is an
    edge to `a.b.c` only, not to the packages `a` and `a.b` it also runs, so a sibling imported by
    its absolute name does not count as a circle through the package's `__init__`.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in MODULES:
                    name = name.rpartition(".")[0]
                if name:
                    yield name, None, node
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in MODULES:                       # `from pkg import submodule`
                    yield sub, None, node
                elif source in MODULES:
                    yield source, alias.name, node


def _parse(module: str) -> ast.AST:
    return ast.parse(FILES[module].read_text(encoding="utf-8"), filename=str(FILES[module]))


def import_graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module, _parse(module)):
            if target != module:
                graph[module].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete circle inside a component, for the failure message: a -> b -> ... -> a."""
    members, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph[path[-1]] & members):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return component


def private_uses() -> list[tuple[str, str, int]]:
    """(file, module._name, line) where a module reaches for another project module's private name."""
    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    uses = []
    for module in sorted(MODULES):
        tree, rel = _parse(module), FILES[module].relative_to(ROOT).as_posix()
        bound = {}                                       # local name -> project module it stands for
        for target, name, node in _imports(module, tree):
            if target == module:
                continue
            if name is not None and private(name):
                uses.append((rel, f"{target}.{name}", node.lineno))
            for alias in node.names:
                if isinstance(node, ast.Import):
                    if alias.asname:
                        bound[alias.asname] = target
                    else:                                # `import a.b` binds `a`
                        bound.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
                elif name is None and target.endswith("." + alias.name):
                    bound[alias.asname or alias.name] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                chain, value = [], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in bound:
                    target = ".".join([bound[value.id]] + chain[::-1])
                    if target in MODULES and target != module:
                        uses.append((rel, f"{target}.{node.attr}", node.lineno))
    return uses


def test_no_import_circle():
    graph = import_graph()
    circles = strongly_connected(graph)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(one_cycle(graph, c)) for c in circles)


def test_no_private_name_across_modules():
    uses = private_uses()
    assert not uses, "private names used from another module:\n" + "\n".join(
        f"{rel}:{line}: {name}" for rel, name, line in uses)


def test_no_module_in_src_reaches_the_size_limit():
    long = {FILES[m].relative_to(ROOT).as_posix(): n for m in MODULES if FILES[m].is_relative_to(ROOT / "src")
            and (n := len(FILES[m].read_text(encoding="utf-8").splitlines())) >= MAX_LINES}
    assert not long, f"modules of {MAX_LINES} lines or more in src/: {long}"



def unresolved_relative_imports() -> list[str]:
    """Relative imports naming a module the tree does not have. A deferred one (inside a function that
    only a GPU runs) fails nowhere on a CPU, so it is read here, not run."""
    bad = []
    for module in sorted(MODULES):
        for node in ast.walk(_parse(module)):
            if isinstance(node, ast.ImportFrom) and node.level:
                source = _absolute(module, node)
                if source not in MODULES and not all(f"{source}.{a.name}" in MODULES for a in node.names):
                    bad.append(f"{FILES[module].relative_to(ROOT).as_posix()}:{node.lineno}: "
                               f"{'.' * node.level}{node.module or ''} is {source}, which does not exist")
    return bad


def test_every_relative_import_names_a_module_of_the_tree():
    bad = unresolved_relative_imports()
    assert not bad, "relative imports of nothing:\n" + "\n".join(bad)


def test_no_script_folder_on_sys_path_shadows_the_standard_library():
    """tests/test_benchmarks.py puts benchmarks/ on sys.path: a benchmarks/profile.py there once made every later
    `import cProfile` in that process (torch._dynamo's) load it instead of the standard library's."""
    clash = [p.relative_to(ROOT).as_posix() for d in ("benchmarks", "benchmarks/probes", "tools", "diagrams")
             for p in sorted((ROOT / d).glob("*.py")) if p.stem in sys.stdlib_module_names]
    assert not clash, f"named like a standard-library module: {clash}"
