"""Every measured figure typed into the course's prose comes from a committed result.

A figure is a number (or a range `a-b`, or a list `a, b and c`) followed by TFLOP/s, GB/s, TB/s, ms,
µs, `x`/`×`/`1.5 times` (a ratio) or `%`, or a rate that takes its unit from the one before it ("367
on long", "FA2's 307"), in the manifests' rung verdicts (`solutions/*/step.toml`), the lectures
(`course/*.pct.py`: prose, comments and literal strings; what a cell computes from
`course/results/measured.json` is not text and is not checked here), the top-level README, the
student README and the prose of `benchmarks/README.md` (its tables, written by `benchmarks/tables.py`
between `<!-- table:NAME -->` markers, are the results themselves and are left out; each of its
`## Step NN` sections may quote that step's results). Each one must match, at the precision it is printed with, a value of the same unit
in the committed results (`benchmarks/results/`: the JSON's numeric fields by name, the text
records' figures), or a ratio of two rates of one configuration there. Where it may come from is
narrowed as far as the text says: the results of the file's step; the files its paragraph cites; a
verdict's own rung (and the rungs it names); the configurations and reference its clause names
("on large", "at 4k-16k", "x FA2"); fp16 unless the clause names another dtype. Numbers that are
not our measurements (data-sheet peaks, papers, the design's thresholds, arithmetic the lecture
derives) are in DATASHEET and ALLOWED below, each with its reason.

An error's order of magnitude in a lecture's prose or comments ($10^{-7}$, `1.7e-5`) has no unit to
match against the results: each one is in MAGNITUDES, either a number that is no measurement (a
threshold, a dtype's property, a paper's) with its reason, or a measurement with the label of the
`print` in that lecture's code that shows it.

    python tests/test_figures.py [FILE ...]   # list every figure with where it was found, or why not
"""
from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

_N = r"\d+(?:\.\d+)?"
# A number not glued to a word, a format spec (`{x:8.1%}`) or a version; then more numbers joined by a
# range dash, a comma or "and"; then the unit.
FIGURE = re.compile(rf"(?<![\w.:/#'\-^$]){_N}(?:\s*(?:-|–|to|,|and|or)\s*{_N})*\s*"
                    r"(?P<unit>TFLOP/s|GB/s|TB/s|ms\b|µs\b|us\b|(?<=\d)x\b|×(?!\s*[\d$])|times\b|%)")
NUMBER = re.compile(_N)
UNITS = {"TFLOP/s": "TFLOP/s", "GB/s": "GB/s", "TB/s": "TB/s", "ms": "ms", "µs": "us", "us": "us",
         "x": "x", "×": "x", "times": "x", "%": "%"}


# ---------------------------------------------------------------- what the results hold

RATE = ("TFLOP/s", "GB/s")      # the timings whose quotients are ratios the prose may state


def _unit_of_key(key: str) -> tuple[str, float] | None:
    """The unit a JSON field is in, and the factor to the printed unit."""
    k = key.lower()
    if "tflops" in k:
        return "TFLOP/s", 1.0
    if "gbps" in k:
        return "GB/s", 1.0
    if k in ("ratio", "speedup"):
        return "x", 1.0
    if k in ("copy_fraction", "efficiency", "rel_err"):
        return "%", 100.0
    if k.endswith("_us") or k == "us":
        return "us", 1.0
    if k == "ms" or k.endswith("_ms") or k.startswith("ms_"):
        return "ms", 1.0
    return None


def _flat(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        yield float(v)
    elif isinstance(v, list):
        for x in v:
            yield from _flat(x)


@dataclass
class Record:
    """One measurement of one results file: a bench row, a variant's configuration, a text line."""
    file: str
    rung: str | None
    config: str | None
    text: str
    values: dict
    backend: str | None = None     # the reference a row's ratio is against
    dtype: str | None = None         # unit -> [values]; rates are the record's own first, then its reference's

    def add(self, unit: str, v: float):
        self.values.setdefault(unit, []).append(v)
        if unit == "GB/s":
            self.values.setdefault("TB/s", []).append(v / 1000)
        if unit == "us":
            self.values.setdefault("ms", []).append(v / 1000)
        if unit == "ms":
            self.values.setdefault("us", []).append(v * 1000)


def _json_records(name: str, d) -> list[Record]:
    out = []

    def walk(obj, key, rung, config):
        if isinstance(obj, list):
            for v in obj:
                walk(v, key, rung, config)
            return
        if not isinstance(obj, dict):
            return
        rung = obj.get("rung", obj.get("solution", rung or "*") if "traces" not in key else rung)
        config = str(obj.get("config") or obj.get("workload") or config or key).split(" ")[0]
        rec = Record(name, rung, config, "", {}, obj.get("ref_backend") or obj.get("backend"), obj.get("dtype"))
        for k, v in obj.items():
            u = _unit_of_key(k)
            if u and not isinstance(v, dict) and list(_flat(v)):
                for x in _flat(v):
                    rec.add(u[0], x * u[1])
            elif u and isinstance(v, dict) and v and all(isinstance(x, (int, float)) for x in v.values()):
                for c, x in v.items():           # {"large": 306.2, ...}: one value per configuration
                    r = Record(name, rung, c, "", {})
                    r.add(u[0], x * u[1])
                    out.append(r)
            elif k == "ratio_methods" and isinstance(v, dict):
                for x in v.values():             # the same row's ratio by do_bench and by events (--methods)
                    rec.add("x", x)
            elif k in ("variants", "rungs") and isinstance(v, dict):
                for n, x in v.items():           # keyed by rung or variant name
                    walk(x, n, n, None)
            elif k != "rungs":                   # the rungs' verdicts are prose, not measurements
                walk(v, k, rung, config if k in ("bench",) else None)
        if rec.values:
            out.append(rec)

    walk(d, "", None, None)
    return out


def _text_records(name: str, text: str) -> list[Record]:
    """A text record: each line's figures by unit (a verdict line names the kernel's rate, then the
    reference's)."""
    out = []
    for line in text.splitlines():
        rec = Record(name, None, None, line, {})
        for m in FIGURE.finditer(line):
            for n in NUMBER.findall(m[0]):
                rec.add(UNITS[m["unit"]], float(n))
        # "461 TFLOP/s against SDPA FLASH_ATTENTION 304": the reference's rate carries no unit
        for m in re.finditer(rf"(TFLOP/s|GB/s) against (?:SDPA )?[\w.-]+ ({_N})", line):
            rec.add(m[1], float(m[2]))
        if rec.values:
            out.append(rec)
    return out


@lru_cache(maxsize=None)
def records(name: str) -> tuple[Record, ...]:
    p = RESULTS / name
    if p.suffix == ".json":
        return tuple(_json_records(name, json.loads(p.read_text())))
    return tuple(_text_records(name, p.read_text()))


def result_files() -> list[str]:
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.suffix in (".json", ".txt"))


def sources_for(steps: tuple[str, ...] | None) -> list[str]:
    """The results of the given steps: their ladder runs, probes and self-tests; None: every result."""
    files = result_files()
    if steps is None:
        return files
    return [f for f in files if any(f"step{s}" in f or re.search(rf"_{s}[_.]", f) for s in steps)
            or ("selftest" in f and not re.search(r"_\d\d(_|\.)", f[10:])) or "gpu_grading" in f
            or ("05" in steps and "timing_probe" in f)]


@dataclass
class Scope:
    """Where a figure may come from: result files, and (a manifest's verdict) the rungs it speaks of."""
    files: list
    rungs: tuple | None = None      # None: any record

    def mine(self, r: Record) -> bool:
        if self.rungs is None:
            return True
        if r.rung is None:              # a text line: one that names the rung
            return any(n in r.text for n in self.rungs)
        if r.rung == "*":               # a file that times one kernel, no ladder
            return True
        return r.rung in self.rungs

    def values(self, unit: str, configs=frozenset(), backend=None, fp16_only=False):
        for f in self.files:
            for r in records(f):
                if self.mine(r) and _config_ok(r, configs, backend if unit == "x" else None, fp16_only):
                    yield from r.values.get(unit, ())

    def ratios(self, configs=frozenset(), backend=None, fp16_only=False):
        """Quotients of two rates of one configuration in one file, one of them in scope."""
        for f in self.files:
            by_config: dict = {}
            for r in records(f):
                if _config_ok(r, configs, None, fp16_only):
                    by_config.setdefault((r.config or r.text), []).append(r)
            for rs in by_config.values():
                for u in RATE:     # against the scope's own rows, or the named reference's rate
                    everyone = [v for r in rs if self.mine(r) for v in r.values.get(u, ())[:1]] + \
                        [v for r in rs if backend and _config_ok(r, configs, backend, fp16_only)
                         for v in r.values.get(u, ())[1:]]
                    for r in rs:
                        if self.mine(r):
                            for a in r.values.get(u, ())[:1 if self.rungs else None]:
                                for b in everyone:
                                    if a and b and a != b:
                                        yield a / b
                                        yield b / a


# ---------------------------------------------------------------- what the prose says

@dataclass
class Figure:
    where: str        # file:line
    text: str         # as printed, with its unit
    unit: str
    number: str       # one number of it
    configs: frozenset = frozenset()   # the configurations its clause names ("on large", "at 4k-16k")
    backend: str | None = None         # the reference a ratio is against ("1.47x FA2")
    compares: bool = False             # a percentage that compares ("14 % less time", "2% faster")
    fp16_only: bool = False            # a line that names no other dtype speaks of fp16 (the course's default)


CITED = re.compile(r"(\d{4}-\d\d-\d\d_\w+\.(?:json|txt))|\.\.\.(_\w+\.(?:json|txt))")


def _paragraphs(lines: list[str]):
    """(first line number, lines) of each run of lines without a blank (or a bare `#`) between them."""
    start, block = 1, []
    for i, line in enumerate(lines, 1):
        if line.strip() in ("", "#"):
            if block:
                yield start, block
            start, block = i + 1, []
        else:
            block.append(line)
    if block:
        yield start, block


CONFIG = re.compile(r"\b(small|medium|large|noncausal|asymmetric|long|(\d+)k(?:\s*-\s*(\d+)k)?)\b")


def _clause_configs(line: str, start: int, end: int) -> frozenset:
    """The configurations a figure speaks of: those named after it before its clause ends (`;`, `,`,
    `(`, `)`), or, inside parentheses, those of the clause the parentheses annotate ("447 TFLOP/s on large
    (1.47x FA2)")."""
    found = list(CONFIG.finditer(re.split(r"[;(),]", line[end:], maxsplit=1)[0]))
    before = line[:start]
    if not found and before.count("(") > before.count(")"):
        head = re.split(r"[;:]", before[:before.rfind("(")])[-1]
        lead = list(FIGURE.finditer(head))
        found = list(CONFIG.finditer(head[lead[-1].end():] if lead else head))
    out = set()
    for m in found:
        if m[2] and m[3]:               # "4k-16k": every power of two between
            lo, hi = int(m[2]), int(m[3])
            while lo <= hi:
                out.add(f"{lo}k")
                lo *= 2
        else:
            out.add(m[1])
    return frozenset(out)


# The names the prose gives the references, and the start of the results' ref_backend.
BACKENDS = {"FA2": "FLASH_ATTENTION", "cuDNN": "CUDNN", "FlexAttention": "FLEX", "compiled FlexAttention": "FLEX",
            "FlashInfer": "FLASHINFER", "one GPU": "ONE_GPU"}
BACKEND = re.compile(r"\s*(?:the\s+)?(compiled FlexAttention|FlexAttention|FA2|cuDNN|FlashInfer|one GPU)\b(?!'s backward)")


def _backend(line: str, end: int) -> str | None:
    m = BACKEND.match(line, end)
    return BACKENDS[m[1]] if m else None


DATE = re.compile(r"\d{4}-\d\d-\d\d")


# A rate without its unit, which it takes from the rate before it on the line: "367 on long",
# "FA2's 307", "582 without the pipelining".
BARE = re.compile(r"(?:(?<='s )|(?<=[,(] )|(?<=and )|(?<=: ))(\d{2,4})(?= (?:on|at|in|without|with)\b|[),;])")


def figures(line: str, where: str) -> list[Figure]:
    line = DATE.sub(lambda m: "D" * len(m[0]), line)     # "2026-11-24, 1.47x" is no range
    return _with_units(line, where) + _bare(line, where)


OTHER_DTYPE = re.compile(r"bf16|bfloat16|fp8|FP8|e4m3|dtype")


def _fp16_only(line: str, start: int, end: int) -> bool:
    """A figure speaks of fp16 (the course's default) unless its clause names another dtype: before it
    since the last `;` or `:`, after it to the end of its comma-separated phrase, parentheses included
    ("1.50-1.74x at 4k-16k (fp16 and bf16)"), and, inside parentheses, the clause they annotate."""
    depth, k = 0, end
    while k < len(line) and line[k] != ";" and not (depth == 0 and line[k] == ",") and depth >= 0:
        depth += {"(": 1, ")": -1}.get(line[k], 0)
        k += 1
    before = line[:start]
    text = line[end:k] + re.split(r"[;:]", before)[-1]
    if before.count("(") > before.count(")"):
        text += re.split(r"[;:]", before[:before.rfind("(")])[-1]
    return not OTHER_DTYPE.search(text)


def _bare(line: str, where: str) -> list[Figure]:
    out, rates = [], [m for m in FIGURE.finditer(line) if UNITS[m["unit"]] in RATE]
    for m in BARE.finditer(line):
        before = [r for r in rates if r.end() <= m.start()]
        if before and not any(r.start() <= m.start() < r.end() for r in FIGURE.finditer(line)):
            out.append(Figure(where, m[0] + " (" + UNITS[before[-1]["unit"]] + ")", UNITS[before[-1]["unit"]],
                              m[1], _clause_configs(line, m.start(), m.end()),
                              fp16_only=_fp16_only(line, m.start(), m.end())))
    return out


def _with_units(line: str, where: str) -> list[Figure]:
    return [Figure(where, m[0].strip(), UNITS[m["unit"]], n, _clause_configs(line, m.start(), m.end()),
                   _backend(line, m.end()) if m["unit"] in ("x", "×") else None,
                   bool(re.match(r"\s*(less|more|faster|slower|over)\b", line[m.end():])),
                   _fp16_only(line, m.start(), m.end()))
            for m in FIGURE.finditer(line) for n in NUMBER.findall(m[0])
            if m["unit"] != "times" or "." in m[0]]     # "5 times" counts; "1.5 times" measures


def _config_ok(r: "Record", configs: frozenset, backend: str | None = None, fp16_only: bool = False) -> bool:
    if backend and r.backend and not r.backend.startswith(backend):
        return False
    if fp16_only and r.dtype not in (None, "float16", "fp16"):
        return False
    if not configs:
        return True
    name = r.config if r.config is not None else r.text
    parts = set(re.split(r"[_\s:(),]+", name))
    return bool(parts & configs)


def _cited(text: str, files: list[str]) -> list[str]:
    """The result files a paragraph names (`2026-11-23_h100_step11_tilelang.json`, `..._layouts.json`)."""
    out = []
    for m in CITED.finditer(text):
        out += [f for f in result_files() if (m[1] and f.endswith(m[1])) or (m[2] and f.endswith(m[2]))]
    return out


GENERATED = re.compile(r"^<!-- table:(\w+) -->$.*?^<!-- /table:\1 -->$", re.M | re.S)
SECTION = re.compile(r"## Step (\d\d)\b")


def prose(text: str) -> str:
    """The text without the blocks benchmarks/tables.py writes, its line numbers kept."""
    return GENERATED.sub(lambda m: "\n" * m[0].count("\n"), text)


def scoped_figures(rel: str, steps, text: str | None = None) -> list[tuple[Figure, Scope]]:
    """Every figure of a checked file with where it may come from: a paragraph that names result
    files, those; a manifest's verdict, the rows of its rung (and of the rungs it names); else the
    results of the file's steps (or of the `## Step NN` section it stands in)."""
    text = prose((ROOT / rel).read_text() if text is None else text)
    lines = text.splitlines()
    step_files = sources_for(steps)
    out = []
    if rel.endswith("step.toml"):
        manifest = tomllib.loads(text)
        names = [r["name"] for r in manifest.get("rungs", [])]
        solution = manifest.get("ladder", {}).get("solution")
        rung = None
        for i, line in enumerate(lines, 1):
            m = re.match(r'\s*name\s*=\s*"(\w+)"', line)
            rung = m[1] if m else rung
            scope = Scope(_cited(line, step_files) or step_files)
            if re.match(r"\s*verdict\s*=", line):
                named = {n for n in names for v in re.findall(r"\bv\d+\b", line.split("=", 1)[1])
                         if n.startswith(v + "_")}
                scope.rungs = (rung, *sorted(named - {rung}), *(("solution",) if rung == solution else ()))
            out += [(f, scope) for f in figures(line, f"{rel}:{i}")]
        return out
    for start, block in _paragraphs(lines):
        if m := SECTION.match(block[0]):
            step_files = sources_for(LECTURE_STEPS.get(m[1], (m[1],)))
        scope = Scope(_cited("\n".join(block), step_files) or step_files)
        for k, line in enumerate(block):
            out += [(f, scope) for f in figures(line, f"{rel}:{start + k}")]
    return out


def _tolerance(number: str) -> float:
    decimals = len(number.split(".")[1]) if "." in number else 0
    return 0.5 * 10 ** -decimals + 1e-9


def found(fig: Figure, scope: Scope) -> str | None:
    """How the figure is backed by its scope's results, or None."""
    v, tol = float(fig.number), _tolerance(fig.number)
    hints = (fig.configs, fig.backend, fig.fp16_only)
    if any(abs(x - v) <= tol for x in scope.values(fig.unit, *hints)):
        return "a value"
    if fig.unit == "x" and any(abs(x - v) <= tol for x in scope.ratios(*hints)):
        return "a ratio of two rates"
    if fig.unit == "%" and fig.compares and any(abs(100 * abs(x - 1) - v) <= tol for x in scope.values("x", *hints)):
        return "the difference a ratio states"
    if fig.unit == "%" and scope.rungs and any(abs(100 * abs(x - 1) - v) <= tol for x in scope.ratios(*hints)):
        return "the difference of two rates"
    return None


# ---------------------------------------------------------------- the files checked

def checked_files() -> list[tuple[str, tuple[str, ...] | None]]:
    """(file, the steps whose results it may quote; None: any)."""
    out = []
    for p in sorted((ROOT / "solutions").glob("*/step.toml")):
        out.append((str(p.relative_to(ROOT)), (p.parent.name[:2],)))
    for p in sorted((ROOT / "course").glob("*.pct.py")):
        out.append((str(p.relative_to(ROOT)), LECTURE_STEPS.get(p.name[:2], (p.name[:2],))))
    out += [("README.md", None), ("docs/STUDENT_README.md", None), ("benchmarks/README.md", None)]
    return out


# A lecture that compares with another step's kernels may quote that step's results too.
LECTURE_STEPS = {"07": ("07", "05", "06"), "10": ("10", "07"), "11": ("11", "07")}

# Data-sheet figures, wherever they appear: (unit, number) -> the source.
_ALLOWED_FILE = tomllib.loads((ROOT / "tests" / "figures_allowed.toml").read_text(encoding="utf-8"))
# Figures that are not our measurements, each with why it may stand: data sheets by (unit, number),
# the rest by (file, figure as printed).
DATASHEET: dict[tuple[str, str], str] = {tuple(k.split(" ", 1)): why for k, why in _ALLOWED_FILE["datasheet"].items()}
ALLOWED: dict[tuple[str, str], str] = {(f, fig): why for f, figs in _ALLOWED_FILE["allowed"].items()
                                       for fig, why in figs.items()}


# An error's order of magnitude: 10^{-7} (optionally a \\cdot 10^{-k}) or 1.7e-5, never a positive exponent.
MAGNITUDE = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?\s*(?:\\cdot|·|\\times)\s*)?10\^\{?-\d+\}?"
                       r"|(?<![\w.])\d+(?:\.\d+)?e-\d+\b")
_RULE = "the correctness rule's absolute term (DESIGN.md)"
_C = "course/"
# Magnitudes in the lectures: (file, as written) -> (why it may stand, the label of the lecture's print
# that shows it when it is a measurement, else None).
MAGNITUDES: dict[tuple[str, str], tuple[str, str | None]] = {
    (_C + "01_vanilla_attention.pct.py", "10^{-3}"): (_RULE, None),
    (_C + "02_safe_softmax.pct.py", "6.1\\cdot10^{-5}"): ("fp16's smallest normal number, 2^-14", None),
    (_C + "02_safe_softmax.pct.py", "1.2\\cdot10^{-38}"): ("bf16's and fp32's smallest normal, 2^-126", None),
    (_C + "06_cuda_flash_attention.pct.py", "10^{-3}"): (_RULE, None),
    (_C + "07_hopper_flash_attention.pct.py", "9.1e-3"): ("FA3 paper §4.3, quoted as the paper's", None),
    (_C + "07_hopper_flash_attention.pct.py", "2.4e-2"): ("FA3 paper §4.3, quoted as the paper's", None),
    (_C + "08_backward.pct.py", "1e-7"): ("fp32's relative rounding, 2^-24 ≈ 6e-8", None),
    (_C + "08_backward.pct.py", "10^{-7}"): ("the gradients' errors the cells print", "max |error| dQ"),
    (_C + "08_backward.pct.py", "10^{-15}"): ("float64's relative rounding, 2^-53 ≈ 1e-16", None),
    (_C + "08_backward.pct.py", "10^{-5}"): ("the assertion's threshold in the cell below", None),
    (_C + "08_backward.pct.py", "10^{-3}"): ("the loss tolerance, TOL in the cell above", None),
    (_C + "09_decode_paged_kv.pct.py", "10^{-7}"): ("the lse's error the cell above prints", "max |lse - ref|"),
    (_C + "10_attention_variants.pct.py", "2 \\cdot 10^{-22}"): ("e^-50, arithmetic", None),
    (_C + "10_attention_variants.pct.py", "2.4 \\times 10^{-2}"): ("FA3's Table 3, plain FP8", None),
    (_C + "10_attention_variants.pct.py", "10^{-3}"): ("FA3's Table 3, 9.1e-3 with its quantisation", None),
    **{(_C + "10_attention_variants.pct.py", m): ("an RMSE of the committed records the sentence names", None)
       for m in ("9.7e-3", "7.6e-3", "5.7e-3", "9.51e-3", "7.36e-3", "6.38e-3", "9.19e-3", "2.01e-3", "6.94e-3")},
    (_C + "11_interchangeable_kernels.pct.py", "10^{-3}"): (_RULE, None),
    (_C + "11_interchangeable_kernels.pct.py", "1e-2"): ("FlashInfer-Bench's default max_atol", None),
    (_C + "11_interchangeable_kernels.pct.py", "1e-5"): ("FlashInfer-Bench's default max_rtol", None),
    (_C + "11_interchangeable_kernels.pct.py", "5 \\cdot 10^{-4}"): ("2^-11, arithmetic", None),
    (_C + "11_interchangeable_kernels.pct.py", "10^{-8}"): ("FlashInfer-Bench's epsilon in its formula", None),
}


def magnitude_problems(rel: str, text: str | None = None) -> list[str]:
    """The magnitudes of a lecture's prose and comments that MAGNITUDES does not explain, and the
    measurements whose print is not in the lecture's code."""
    text = (ROOT / rel).read_text() if text is None else text
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#"):
            continue
        for m in MAGNITUDE.finditer(line):
            why = MAGNITUDES.get((rel, m[0]))
            if why is None:
                out.append(f"{rel}:{i}: {m[0]} is not in MAGNITUDES")
            elif why[1] and not re.search(r"print\((?:[^\n]*\n){0,3}[^\n]*" + re.escape(why[1]), code):
                out.append(f"{rel}:{i}: {m[0]} is a measurement, but no print of {why[1]!r} is in the lecture")
    return out


def check(rel: str, steps, text: str | None = None) -> tuple[list, list]:
    ok, bad = [], []
    for fig, scope in scoped_figures(rel, steps, text):
        if (rel, fig.text) in ALLOWED or (fig.unit, fig.number) in DATASHEET:
            continue
        how = found(fig, scope)
        (ok if how else bad).append((fig, how, scope))
    return ok, bad


def test_every_figure_comes_from_a_committed_result():
    problems = []
    for rel, steps in checked_files():
        _, bad = check(rel, steps)
        problems += [f"{f.where}: {f.number} in {f.text!r}" for f, _, _ in bad]
    assert not problems, ("figures in no committed result (benchmarks/results/) of their step; take them "
                          "from a result, rephrase without a number, or add them to ALLOWED with a reason:\n  "
                          + "\n  ".join(problems))


def test_the_readmes_ci_time_is_the_designs():
    """The suite's time on a fresh clone is measured once, in docs/DESIGN.md's "Budget"; the README
    quotes it."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    budget = design[design.index("* **Budget**"):]
    budget = budget[:budget.index("\n* ")]
    quoted = re.findall(r"(\d+) s\b", (ROOT / "README.md").read_text())
    assert quoted, "README.md quotes no CI time: drop this test or point it at the new wording"
    assert all(re.search(rf"\b{n} s\b", budget) for n in quoted), (quoted, budget)


@pytest.mark.parametrize("rel, right, wrong", [
    ("solutions/05_triton_flash_attention/step.toml", "447 TFLOP/s on large", "457 TFLOP/s on large"),
    ("solutions/05_triton_flash_attention/step.toml", "(1.47x FA2, 0.84x cuDNN)", "(1.57x FA2, 0.84x cuDNN)"),
    ("solutions/05_triton_flash_attention/step.toml", "2.0x v2 on large", "2.3x v2 on large"),
    ("solutions/09_decode_paged_kv/step.toml", "360 GB/s on 1 x 128k (6.6x v1)", "360 GB/s on 1 x 128k (6.7x v1)"),
    ("solutions/12_ring_attention/step.toml", "1.87x one GPU at 64k", "1.95x one GPU at 64k"),
    ("course/06_cuda_flash_attention.pct.py", "328 TFLOP/s on `large`", "338 TFLOP/s on `large`"),
    ("course/11_interchangeable_kernels.pct.py", "1.48x FA2's 307", "1.58x FA2's 307"),
    ("course/02_safe_softmax.pct.py", "three-pass 6.11 ms", "three-pass 6.41 ms"),
    ("benchmarks/README.md", "576-585 TFLOP/s", "576-595 TFLOP/s"),
])
def test_a_wrong_figure_is_caught(rel, right, wrong):
    """The check is tight enough to catch a figure a little off (another run's, a rounding slip)."""
    steps = dict(checked_files())[rel]
    text = (ROOT / rel).read_text()
    assert right in text, f"{rel} no longer says {right!r}: pick another figure for this test"
    assert not check(rel, steps)[1]
    bad = check(rel, steps, text.replace(right, wrong, 1))[1]
    assert [f.number for f, _, _ in bad] and all(f.number in wrong for f, _, _ in bad), bad


if __name__ == "__main__":
    wanted = set(sys.argv[1:])
    for rel, steps in checked_files():
        if wanted and rel not in wanted:
            continue
        ok, bad = check(rel, steps)
        for f, how, scope in ok:
            print(f"ok   {f.where}: {f.number} in {f.text!r} <- {how} of {scope.rungs or 'any rung'}")
        for f, _, _ in bad:
            print(f"MISS {f.where}: {f.number} in {f.text!r}")


def test_the_benchmark_readme_prose_is_checked_and_its_tables_are_not():
    """benchmarks/README.md's prose is checked; the generated tables between its markers are blanked
    (line numbers kept), and a step section's paragraphs take that step's results."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    kept = prose(text)
    assert len(kept.splitlines()) == len(text.splitlines())
    assert "<!-- table:" in text and "<!-- table:" not in kept and "| rung |" not in kept
    where = {f.where for f, _ in scoped_figures("benchmarks/README.md", None)}
    assert any(w.startswith("benchmarks/README.md:") for w in where), "no figure found in the README's prose"
    # a step-10 figure put in a step-05 paragraph is not found in step 05's results
    moved = text.replace("## Step 05 — Triton FlashAttention-2\n", "## Step 05 — Triton FlashAttention-2\n\n"
                         "The FP8 rung read 888 TFLOP/s in FP8 on long.\n", 1)
    assert [f.number for f, _, _ in check("benchmarks/README.md", None, moved)[1]] == ["888"]


def test_every_error_magnitude_in_a_lecture_is_printed_there_or_explained():
    problems = [p for rel, _ in checked_files() if rel.startswith(_C) for p in magnitude_problems(rel)]
    assert not problems, ("a lecture states an error magnitude that no cell of it prints and MAGNITUDES "
                          "does not explain:\n  " + "\n  ".join(problems))


def test_an_unprinted_magnitude_is_caught():
    rel = _C + "08_backward.pct.py"
    text = (ROOT / rel).read_text()
    claim = "# and on this machine stays within a few $10^{-6}$ over the 300 steps.\n"
    assert magnitude_problems(rel, text + claim) == [f"{rel}:{len(text.splitlines()) + 1}: 10^{{-6}} is not "
                                                      "in MAGNITUDES"]
    assert "max |error| dQ" in text
    unprinted = magnitude_problems(rel, text.replace("max |error| dQ", "largest error of dQ"))
    assert unprinted and all("no print of 'max |error| dQ'" in p for p in unprinted), unprinted
