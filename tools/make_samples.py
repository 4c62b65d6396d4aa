"""Write the demo's sample submissions, autograder/samples/<student>/<assignment>/, from the steps' ``GRADING``.

    python tools/make_samples.py            # (re)write them
    python tools/make_samples.py --check    # exit 1, naming the files, when the committed ones are out of date

``python -m autograder demo`` grades every sample (autograder/README.md, "Commands"). For every
CPU-gradable step, three students: ``alice`` (the solution, put into the released notebook, with
written answers where the step has written-answer cells), ``bob`` (the untouched release) and
``carol`` (the solution with one planted bug). They are what the step's test module submits in its
``GRADING`` (tests/conftest.py, ``solution_and_stub``), built from solutions/ and exercises/ and the
planted bugs its tests define (``PLANTED``), so there is one source for each: this script only lays
them out. tests/test_exercise_grading.py grades the same submissions (its one autograde run is the
demo's) and checks them; tests/test_autograder.py fails when a committed sample differs from what
this script writes now. Step 01's three samples are hand-written (a student's own correct version,
the stub, a top-left causal mask) and stay as they are.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "autograder" / "samples"
HAND_WRITTEN = ("01_vanilla_attention",)


def _grading() -> dict:
    """{assignment: (submissions, check)} of every step test module (tests/test_exercise_grading.py)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from test_exercise_grading import grading

    return grading()


def samples() -> dict[str, dict[str, dict]]:
    """{assignment: {student: notebook}}: the demo students of every step whose GRADING submits them."""
    plans = _grading()
    from conftest import SAMPLE_STUDENTS

    out = {}
    for a, (submissions, _) in plans.items():
        subs = submissions()
        if set(SAMPLE_STUDENTS) <= set(subs):
            out[a] = {s: subs[s] for s in SAMPLE_STUDENTS}
    return out


def text(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def write(out: Path) -> list[Path]:
    """Write the generated samples under ``out`` (<student>/<assignment>/<assignment>.ipynb)."""
    written = []
    for a, students in samples().items():
        for s, nb in students.items():
            path = out / s / a / f"{a}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text(nb), encoding="utf-8")
            written.append(path)
    return written


def stale(committed: Path = SAMPLES) -> list[str]:
    """The sample files under ``committed`` that differ from the generated ones, are missing, or are extra."""
    want = {f"{s}/{a}/{a}.ipynb": text(nb) for a, students in samples().items() for s, nb in students.items()}
    have = {str(p.relative_to(committed)) for p in committed.glob("*/*/*") if p.is_file()
            and p.parent.name not in HAND_WRITTEN}
    bad = sorted(have - set(want)) + sorted(p for p in want if p not in have)
    bad += sorted(p for p in set(want) & have if (committed / p).read_text(encoding="utf-8") != want[p])
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only compare with the committed samples")
    args = p.parse_args(argv)
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"out of date: autograder/samples/{rel}")
        if bad:
            print("run: python tools/make_samples.py")
        return 1 if bad else 0
    for old in SAMPLES.glob("*/*"):
        if old.is_dir() and old.name not in HAND_WRITTEN:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    for path in write(SAMPLES):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
