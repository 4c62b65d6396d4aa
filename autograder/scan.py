"""A static scan of what a student submitted: evidence no code in the kernel can switch off.

The grading process reads the submission's own cells (solution cells and cells the student added;
not the given, locked or test cells) and the CUDA source of steps 06-07, before anything runs,
and flags each line that reaches for the grading machinery:

* ``tamper`` (the submission's judged tests score 0 until an instructor waives the flag):
  rebinding a name the test cells use; importing ``autograder``; writing ``sys.modules``,
  ``builtins`` or ``importlib``; touching ``get_ipython()`` or IPython; ``atexit``, threads,
  processes, signals, ``ctypes`` or sockets; ``sys.exit``/``os._exit``/``exit``;
  ``exec``/``eval``/``compile``/``__import__``; assigning attributes of an imported module
  (monkeypatching ``torch``, ``facourse``, ...); ``getattr``/``setattr`` with a computed name on a
  module; reading the judge's address; in CUDA sources, the Python C API, ``dlopen``, ``system``;
* ``review`` (shown to the instructor, no points change): naming PyTorch's attention
  (``scaled_dot_product_attention``, ``MultiheadAttention``, ``torch.ops.aten``, ...), a computed
  ``getattr`` on anything else, writing files, exponentials through NumPy or ``math`` (step 14).

A flag names the cell, the line and the rule. The scan cannot see what a string builds at run
time; that is what the judge's own checks are for (autograder/README.md says what is not defended).
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

#: Names the test cells call or rely on; a student cell that rebinds one is tampering.
PROTECTED = {"judge", "check_entry_point", "check_all", "check_attention", "check_softmax_fn",
             "check_merge_fn", "check_no_caching", "forbid_framework_attention", "check_gradients",
             "gradcheck", "forward_backward", "check_visible", "check_paged_decode", "check_paged_bad_inputs", "check_device_functions",
             "require_gpu", "require_sm90a", "on_hopper", "check_sass", "nvcc_compile_check",
             "KERNEL_DIR", "STUDENT_SOURCE", "facourse", "autograder", "torch", "print"}
MODULES = {"torch", "facourse", "autograder", "builtins", "sys", "os", "importlib", "IPython", "F",
           "nn", "functional", "np", "numpy", "triton", "tl", "math", "warnings", "nbformat", "nbclient",
           "secrets", "random", "socket", "json", "pathlib", "time"}
TAMPER_IMPORTS = {"autograder", "atexit", "threading", "_thread", "multiprocessing", "concurrent", "subprocess",
                  "signal", "ctypes", "socket", "IPython", "ipykernel", "importlib", "builtins", "gc",
                  "inspect", "sysconfig", "code", "codeop", "pty", "asyncio"}
TAMPER_CALLS = {"exec", "eval", "compile", "__import__", "get_ipython", "exit", "quit", "globals", "vars",
                "breakpoint"}
TAMPER_ATTRS = {("sys", "exit"), ("os", "_exit"), ("os", "kill"), ("os", "fork"), ("os", "system"),
                ("os", "execv"), ("os", "execve"), ("os", "popen"), ("sys", "modules"), ("sys", "settrace"),
                ("sys", "setprofile"), ("sys", "meta_path"), ("sys", "path_hooks"), ("sys", "excepthook")}
# (aten's private ops are matched at a word start: "_flash_attention" inside a name such as step 11's
# "mini_flash_attention_prefill" is no call of them)
FRAMEWORK_ATTENTION = re.compile(r"scaled_dot_product_attention|multi_head_attention_forward|MultiheadAttention|"
                                 r"flash_attn|\b_scaled_dot_product|\b_flash_attention|\b_efficient_attention|"
                                 r"cudnn_attention|sdpa_kernel|sdpa_reference|torch_attention|"
                                 r"reference_attention|flex_attention(?!_triton)|varlen_attn")   # (step 10's entry point is ours)
# Attributes that look a name up at run time (a module's __dict__, a frame's globals): for an instructor to look at
LOOKUP_ATTRS = ("__dict__", "_getframe", "f_globals", "f_locals", "f_back", "f_builtins")
# Step 11: what facourse.interchange holds of the exercise's answers (the spec it checks against, the
# grader's own definition and candidates): a submission that uses them instead of writing its own
# definition is for an instructor to look at.
INTERCHANGE_ANSWERS = re.compile(r"\b(?:_?spec_definition|SPEC|AXES|INPUTS|OUTPUTS|_?solution_source|_routing_\w+|"
                                 r"routing_(?:tags|solution|trace|workloads|trace_set)|_?ROUTING_[A-Z]+|"
                                 r"_?TRACE_[A-Z]+|trace_candidates)\b")
# Steps 13-15: the library's own references of the functions a student writes (the check compares with them).
STEP_REFERENCES = re.compile(r"\b(?:occupancy_limits|roofline_reference|lazy_step|serving_reference)\b")
# Step 11's TileLang program: on the CPU it runs on facourse.tilelang_cpu, whose buffers hold NumPy arrays;
# a program that reaches them (or the stand-in's internals) computes outside the language, which only the
# GPU tests (TileLang's compiler) would refuse: for an instructor to look at.
TILELANG_STAND_IN = re.compile(r"\.arr\b|['\"]arr['\"]|\btilelang_cpu\b|\b_(?:Global|Buf|Region|Launch|LAUNCHES)\b")
CUDA_TAMPER = re.compile(r"Python\.h|pybind11|\bPy[A-Z_][A-Za-z_]*\s*\(|\bdlopen\b|\bdlsym\b|\bsystem\s*\(|"
                         r"\bpopen\s*\(|\bfork\s*\(|\bexecv|\bexecl|\bgetenv\s*\(|\bfopen\s*\(")


@dataclass
class Flag:
    severity: str          # "tamper" or "review"
    where: str             # "cell solution_1, line 4" or "student_kernel.cu, line 12"
    rule: str
    line: str

    def text(self) -> str:
        return f"{self.where}: {self.rule}: {self.line.strip()[:160]}"


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        parts.append(node.func.id + "()")
        return ".".join(reversed(parts))
    return ""


class _Visitor(ast.NodeVisitor):
    def __init__(self):
        self.hits: list[tuple[str, int, str]] = []
        self.modules = set(MODULES)

    def hit(self, severity, node, rule):
        self.hits.append((severity, getattr(node, "lineno", 0), rule))

    # imports -------------------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            root = a.name.split(".")[0]
            if root in TAMPER_IMPORTS:
                self.hit("tamper", node, f"imports {a.name}")
            self.modules.add((a.asname or a.name).split(".")[0])
            if a.asname in PROTECTED and a.asname != root:
                self.hit("tamper", node, f"rebinds {a.asname}, which the test cells use")

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        root = mod.split(".")[0]
        if root in TAMPER_IMPORTS or node.level:
            self.hit("tamper", node, f"imports from {mod or '.'}")
        for a in node.names:
            name = a.asname or a.name
            if name in PROTECTED and (a.asname is not None and a.asname != a.name or root not in ("facourse",)):
                self.hit("tamper", node, f"rebinds {name}, which the test cells use")
            if root in ("torch", "facourse", "os", "sys") and a.name in ("exit", "_exit", "modules"):
                self.hit("tamper", node, f"imports {mod}.{a.name}")
            if root in ("torch", "facourse", "triton"):   # a submodule or a class: its attributes are theirs
                self.modules.add(name)

    # bindings ------------------------------------------------------------------------
    def _target(self, t, node):
        if isinstance(t, ast.Name):
            if t.id in PROTECTED:
                self.hit("tamper", node, f"rebinds {t.id}, which the test cells use")
            if t.id in ("__builtins__",):
                self.hit("tamper", node, "rebinds __builtins__")
        elif isinstance(t, ast.Attribute):
            base = _dotted(t.value).split(".")[0]
            full = _dotted(t)
            if base in self.modules or base.endswith("()"):
                severity = "review" if full.startswith("torch.backends.") else "tamper"
                self.hit(severity, node, f"assigns {full}, an attribute of a module (monkeypatching)")
        elif isinstance(t, ast.Subscript):
            base = _dotted(t.value)
            if base in ("sys.modules", "__builtins__", "builtins.__dict__", "os.environ") or base.endswith("__dict__"):
                self.hit("tamper" if base != "os.environ" else "review", node, f"writes {base}[...]")
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._target(e, node)
        elif isinstance(t, ast.Starred):
            self._target(t.value, node)

    def visit_Assign(self, node):
        for t in node.targets:
            self._target(t, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._target(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self._target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            self._target(t, node)

    def _define(self, node):
        if node.name in PROTECTED:
            self.hit("tamper", node, f"redefines {node.name}, which the test cells use")
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    def visit_Global(self, node):
        for n in node.names:
            if n in PROTECTED:
                self.hit("tamper", node, f"declares {n} global, which the test cells use")

    # calls and names -----------------------------------------------------------------
    def visit_Call(self, node):
        self._reference_named(node)
        name = _dotted(node.func)
        last = name.split(".")[-1]
        parts = tuple(name.split(".")[-2:])
        if name in TAMPER_CALLS or (last in ("exec", "eval") and name.startswith("builtins")):
            self.hit("tamper", node, f"calls {name}()")
        elif parts in TAMPER_ATTRS:
            self.hit("tamper", node, f"calls {name}()")
        elif last in ("setattr", "delattr") and name in ("setattr", "delattr"):
            target = _dotted(node.args[0]) if node.args else ""
            if target.split(".")[0] in self.modules:
                self.hit("tamper", node, f"{last} on {target}, a module (monkeypatching)")
            elif node.args[1:] and not isinstance(node.args[1], ast.Constant):
                self.hit("review", node, f"{last} with a computed name")
        elif name == "getattr" and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
            target = _dotted(node.args[0])
            severity = "tamper" if target.split(".")[0] in self.modules else "review"
            self.hit(severity, node, f"getattr with a computed name on {target or 'an object'}")
        elif name in ("vars", "globals", "inspect.currentframe", "inspect.stack"):
            self.hit("review", node, f"calls {name}() (a lookup by name the scan cannot follow)")
        elif name == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax+")
                                    for a in [*node.args[1:2], *[k.value for k in node.keywords if k.arg == "mode"]]):
            self.hit("review", node, "opens a file for writing")
        elif last in ("write_text", "write_bytes"):
            self.hit("review", node, f"writes a file ({name})")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        full = _dotted(node)
        if node.attr in LOOKUP_ATTRS and isinstance(node.ctx, ast.Load):
            self.hit("review", node, f"reads {node.attr} (a lookup by name the scan cannot follow)")
        if full.startswith(("sys.modules", "builtins.", "__builtins__")) or tuple(full.split(".")[:2]) in TAMPER_ATTRS:
            if isinstance(node.ctx, ast.Load) and full not in ("os.environ",):
                self.hit("tamper", node, f"uses {full}")
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in ("__builtins__", "get_ipython", "__import__") and isinstance(node.ctx, ast.Load):
            self.hit("tamper", node, f"uses {node.id}")

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "FACOURSE_JUDGE" in node.value:
            self.hit("tamper", node, "reads the judge's address")
        self._reference_named(node)

    def visit_BinOp(self, node):
        self._reference_named(node)
        self.generic_visit(node)

    def visit_JoinedStr(self, node):
        self._reference_named(node)
        self.generic_visit(node)

    def _reference_named(self, node):
        """A string that spells a step's reference ("occupancy" "_limits", "roofline_" + "reference"), for a
        lookup by name (getattr, a module's __dict__) that the line scan cannot see."""
        m = STEP_REFERENCES.search(_folded(node) or "")
        if m:
            self.hit("review", node, _reference_rule(m.group(0)))


def _reference_rule(name: str) -> str:
    return f"calls the course's own reference ({name}) instead of writing it"


def _folded(node) -> str | None:
    """The text of a string expression made of constants alone ("a" "b", "a" + "b", f"a{'b'}", "".join(["a", "b"]))."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _folded(node.left), _folded(node.right)
        return None if a is None or b is None else a + b
    if isinstance(node, ast.FormattedValue):
        return _folded(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = [_folded(v) for v in node.values]
        return None if None in parts else "".join(parts)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep, parts = _folded(node.func.value), [_folded(e) for e in node.args[0].elts]
        return None if sep is None or None in parts else sep.join(parts)
    return None


def student_cells(nb: dict) -> list[tuple[str, str]]:
    """(label, source) of every code cell the student wrote: solution cells and added cells."""
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if meta and not meta.get("solution"):
            continue                                   # given, locked or test cells: nbgrader restores them
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        out.append((f"cell {meta.get('grade_id') or i}", src))
    return out


# Step 14: exponentials outside PyTorch, which the judge's guard on exp2_poly (PyTorch's dispatcher) cannot see
OTHER_EXPONENTIALS = re.compile(r"(?<![\w.])(?:np|numpy|math|scipy\.special|cmath)\.(?:exp2?|expm1|power|float_power|pow|ldexp|"
                                r"exp10|sigmoid|expit)\b|\.numpy\(\)")


def scan_source(source: str, where: str) -> list[Flag]:
    lines = source.splitlines()
    # IPython syntax (magics, shell escapes) is not Python: a magic is flagged, the rest parsed
    clean = []
    flags = []
    for n, ln in enumerate(lines, 1):
        s = ln.lstrip()
        if s.startswith(("%", "!")):
            flags.append(Flag("tamper", f"{where}, line {n}", "runs an IPython magic or shell command", ln))
            clean.append("")
        else:
            clean.append(ln)
    try:
        tree = ast.parse("\n".join(clean))
    except SyntaxError as err:
        return flags + [Flag("review", f"{where}, line {err.lineno or 0}", "does not parse as Python",
                             (lines[(err.lineno or 1) - 1] if lines else ""))]
    v = _Visitor()
    v.visit(tree)
    seen = set()
    for severity, n, rule in v.hits:
        if (n, rule) in seen:
            continue
        seen.add((n, rule))
        flags.append(Flag(severity, f"{where}, line {n}", rule, lines[n - 1] if 0 < n <= len(lines) else ""))
    for n, ln in enumerate(lines, 1):
        m = FRAMEWORK_ATTENTION.search(ln)
        if m and not ln.lstrip().startswith("#"):
            flags.append(Flag("review", f"{where}, line {n}", f"names PyTorch's or the course's attention ({m.group(0)})", ln))
        m = INTERCHANGE_ANSWERS.search(ln)
        if m and not ln.lstrip().startswith("#"):
            flags.append(Flag("review", f"{where}, line {n}", f"uses facourse.interchange's own spec or grader data "
                                                               f"({m.group(0)}) instead of writing it", ln))
        m = STEP_REFERENCES.search(ln)
        if m and not ln.lstrip().startswith("#") and (n, _reference_rule(m.group(0))) not in seen:
            flags.append(Flag("review", f"{where}, line {n}", _reference_rule(m.group(0)), ln))
        m = OTHER_EXPONENTIALS.search(ln)
        if m and not ln.lstrip().startswith("#"):
            flags.append(Flag("review", f"{where}, line {n}", f"computes with NumPy or math ({m.group(0)}), where the "
                                                               "judge's guard does not look", ln))
        m = TILELANG_STAND_IN.search(ln)
        if m and not ln.lstrip().startswith("#"):
            flags.append(Flag("review", f"{where}, line {n}", f"reaches into the CPU stand-in of TileLang "
                                                               f"({m.group(0)}) instead of using its language", ln))
    return flags


def scan_cuda(source: str, where: str) -> list[Flag]:
    flags = []
    for n, ln in enumerate(source.splitlines(), 1):
        code = ln.split("//")[0]
        m = CUDA_TAMPER.search(code)
        if m:
            flags.append(Flag("tamper", f"{where}, line {n}", f"reaches outside the kernel ({m.group(0).strip()})", ln))
    return flags


def scan_submission(folder: Path, notebooks: list[str]) -> list[Flag]:
    """Every flag of a submission folder (its notebooks and its student_kernel.cu, if any)."""
    flags = []
    for nb_name in notebooks:
        path = folder / f"{nb_name}.ipynb"
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for label, src in student_cells(nb):
            flags += scan_source(src, f"{nb_name}.ipynb {label}")
    cu = folder / "student_kernel.cu"
    if cu.is_file():
        flags += scan_cuda(cu.read_text(encoding="utf-8", errors="replace"), "student_kernel.cu")
    return flags


def as_records(flags: list[Flag]) -> list[dict]:
    return [asdict(f) for f in flags]
