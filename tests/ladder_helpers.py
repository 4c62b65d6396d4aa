"""Running a ladder's rungs in Triton's interpreter, in one subprocess per test file.

TRITON_INTERPRET must be set before triton is imported, so the rungs run in a fresh interpreter: the
test's script (``body``) gets ``load(name)`` (a rung of ``ladder`` by path) and ``report(**kw)`` (one
result the tests read back), and ``run_in_interpreter`` returns every reported result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, computed_once, this_run

PRELUDE = """\
import importlib.util, json, math, sys, time, traceback
from pathlib import Path
import torch

LADDER = Path({ladder!r})

def load(name):
    spec = importlib.util.spec_from_file_location({prefix!r} + name, LADDER / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)

"""


def run_in_interpreter(ladder: Path, prefix: str, body: str) -> list[dict]:
    """The results ``body`` reported, run after the prelude (rungs loaded as modules ``prefix + name``); once
    per test run, whichever workers ask (conftest.computed_once)."""
    script = PRELUDE.format(ladder=str(ladder), prefix=prefix) + textwrap.dedent(body)

    def run() -> list[dict]:
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
        out = [json.loads(ln[len("RESULT "):]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        assert r.returncode == 0 and out, r.stdout[-3000:] + r.stderr[-3000:]
        return out
    return computed_once(this_run() + "\0" + script, run)


def one_result(results: list[dict], **key) -> dict:
    """The one result whose fields match ``key``, asserting that it reported no error."""
    (got,) = [r for r in results if all(r.get(k) == v for k, v in key.items())]
    assert got["error"] is None, got["error"]
    return got
