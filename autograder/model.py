"""The grading data model: where things are, what one graded submission is, and small file helpers."""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
SAMPLES = HERE / "samples"
DEFAULT_WORKSPACE = ROOT / "grading"
JUDGE_ENV = "FACOURSE_JUDGE"         # the kernel finds the judge's socket here (judge_client.py)


class GradingError(Exception):
    """A problem with the command's input that the user can fix; printed without a traceback."""


#: What a stub's bare NotImplementedError means, told in the feedback.
NOT_WRITTEN = "the function is not written yet (its stub raises this)"


@dataclass
class Result:
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    auto_max_score: float = 0.0   # points the autograder decides (max_score less written answers)
    manual_pending: float = 0.0   # points of written answers that wait for an instructor
    status: str = "graded"
    failed: list = field(default_factory=list)
    messages: dict = field(default_factory=dict)   # test -> the judge's message for a failed test
    seconds: float = 0.0
    tests: list = field(default_factory=list)   # {name, notebook, score, max_score, auto}
    perf: list = field(default_factory=list)    # perf records the judge accepted or refused (GPU tier)
    flags: list = field(default_factory=list)   # static scan and judge findings: {severity, where, rule, line}
    cell_comments: dict = field(default_factory=dict)   # the formgrader's comments on code cells: cell -> text
    key: str = ""                 # hash of submission + assignment source + thresholds
    gpu: str = ""                 # CUDA_VISIBLE_DEVICES the worker ran with ("" = none set)
    reused: bool = False          # True when a finished result was reused instead of re-grading

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("reused")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Result":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def assignments() -> list[str]:
    """Assignment ids: folders of solutions/ that hold a notebook."""
    if not SOLUTIONS.is_dir():
        raise GradingError(f"no solutions/ folder at {SOLUTIONS}")
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def notebooks_of(assignment: str) -> list[str]:
    return sorted(p.stem for p in (SOLUTIONS / assignment).glob("*.ipynb"))


def result_path(workspace: Path, student: str, a: str) -> Path:
    return workspace / "results" / student / f"{a}.json"


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def hash_tree(*paths: Path) -> str:
    h = hashlib.sha256()
    for base in paths:
        files = sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and ".ipynb_checkpoints" not in p.parts) if base.is_dir() else [base]
        for p in files:
            if p.exists():
                h.update(str(p.relative_to(base.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]
