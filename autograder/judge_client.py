"""The kernel's side of the judge: what a hidden cell calls. Grading only; never shipped.

    from autograder.judge_client import judge
    judge("test_large", tiled_attention)

This runs in the student's kernel, where every line can be changed by the student's code, so it
decides nothing. It asks the judge (``FACOURSE_JUDGE``: a Unix socket the grading process owns)
which checks the test runs, with which secret seeds; runs each check exactly as ``facourse``
always does, but only collecting (``facourse.check.collecting``): every call of the entry point
is recorded and its outputs sent, as they are, to the judge; then it asks for the verdict and
prints it. The judge regenerates the inputs, replays the outputs through the same check and
decides the points (``autograder/judge.py``). A cell that fails raises, so the notebook shows
the same message the grade report does.

Without a judge (plain ``nbgrader autograde``, the notebook run by hand), ``judge`` raises and
names the command that grades: nothing in a kernel may award points.
"""
from __future__ import annotations

import functools
import os
import socket
from contextvars import ContextVar

import torch

from facourse.check import collecting

from . import wire
from .checks import CHECKS
from .guards import MatmulFlops
from .model import JUDGE_ENV as ENV

#: judge.run_inprocess's judge, for the thread (context) that set it; else the kernel's environment names it. Threads
#: grading side by side each reach their own judge, and none writes the process environment (setenv racing another
#: thread's getenv crashed a worker)
ADDRESS: ContextVar[str | None] = ContextVar("facourse_judge_address", default=None)


class JudgeFailure(AssertionError):
    """The judge did not award this test its points; the message says why."""


class _Conn:
    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def ask(self, header: dict, blobs=()) -> dict:
        wire.send(self.sock, header, list(blobs))
        reply, _ = wire.recv(self.sock)
        return reply

    def close(self):
        self.sock.close()


class Recorder:
    """The entry point as the check calls it: every call's outputs (or error) go to the judge."""

    def __init__(self, conn, test: str, index: int, fn, count_flops: bool):
        self.conn, self.test, self.index, self.fn, self.count_flops = conn, test, index, fn, count_flops
        self.n = 0
        self.raised = False
        self.kept = []              # (returned tensors, their values when returned)
        self.last_flops = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        n, self.n = self.n, self.n + 1
        header = {"op": "call", "test": self.test, "check": self.index, "n": n}
        try:
            if self.count_flops:
                with MatmulFlops() as counter:
                    result = self.fn(*args, **kwargs)
                self.last_flops = counter.flops
                header["flops"] = int(self.last_flops)
            else:
                result = self.fn(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except BaseException as err:
            self.raised = True
            self.conn.ask({**header, "error": {"type": type(err).__name__, "message": str(err)}})
            raise
        blobs: list[bytes] = []
        header["result"] = wire.encode(result, blobs)
        self.conn.ask(header, blobs)
        tensors = [t for t in (result if isinstance(result, (tuple, list)) else (result,))
                   if isinstance(t, torch.Tensor)]
        self.kept.append([(t, t.detach().clone()) for t in tensors])
        return result

    def changed(self) -> str | None:
        """A returned output that changed after it was returned (one buffer handed out twice)."""
        for i, pairs in enumerate(self.kept):
            for t, snap in pairs:
                if t.shape != snap.shape or not torch.equal(t.detach().nan_to_num(), snap.nan_to_num()):
                    return (f"[anti-cheat] the output returned by call {i + 1} changed during later calls.\n"
                            "  likely cause: the function returns the same output buffer every call; "
                            "allocate a new output tensor per call")
        return None


def _wrap(fn, spec: dict):
    if spec.get("bind"):
        fn = functools.partial(fn, **spec["bind"])
    if spec.get("train"):
        from facourse.backward import forward_backward
        fn = forward_backward(fn)
    if spec.get("ring") is not None:
        from facourse.ring import get_ring_case, on_ring
        kw = spec.get("kwargs", {})
        case = get_ring_case(kw["case"])
        fn = on_ring(fn, case.world, traffic=bool(kw.get("traffic")), groups=case.groups, **spec["ring"])
    if spec.get("interchange"):
        fn = _interchange(fn, spec["interchange"], spec["seed"])
    if spec.get("guard") is not None:
        from .guards import forbid_exponentials, forbid_framework_attention
        guard = dict(spec["guard"])
        fn = forbid_exponentials(fn) if guard.pop("exponentials", False) else forbid_framework_attention(fn, **guard)
    return fn


def _interchange(fn, what: str, seed: int):
    """Step 11: the student's function reduced to what its check calls (plans.Test.interchange)."""
    from facourse import interchange as fx

    if what == "definition":
        return lambda: fx.as_json(fn())
    if what == "reference":
        return lambda q, k, v, causal: fx.definition_reference_run(fn())(q, k, v, causal)
    if what == "traces":
        return lambda *args: [fx.as_json(t) for t in fn(*args)]
    if what == "deploy":
        return fx.deployed(fn, seed=seed)
    if what == "tilelang":
        from facourse.tilelang_kernels import run_attention
        return functools.partial(run_attention, fn)
    raise ValueError(f"unknown interchange wrapper {what!r}")


def _measure(fn, perf: dict, conn, test: str) -> None:
    """Time ``fn`` against the step's reference with the course's bench and report the numbers."""
    from .perf import bench, environment, thresholds

    t = thresholds(perf["step"])
    try:
        res = bench(fn, perf["config"], t["reference"], perf.get("mode", "forward"))
        record = {**res.as_dict(), "env": environment()}
        print(res.summary())
    except Exception as err:            # reported; the judge gives no perf points without numbers
        record = {"error": f"{type(err).__name__}: {err}"}
    conn.ask({"op": "perf", "test": test, "record": record})
    for extra in t.get("also", []):     # named references beside the graded one: shown, not graded
        _also(fn, perf, extra)


def _also(fn, perf: dict, backend: str) -> None:
    """Time ``fn`` against one more reference (FlashInfer's prefill, where installed) and print it."""
    from facourse.bench import FLASHINFER, flashinfer_available

    from .perf import bench

    if backend == FLASHINFER and not flashinfer_available():
        print(f"{perf['config']}: FlashInfer is not installed here: no comparison with its prefill kernel "
              "(not graded)")
        return
    try:
        print(f"{bench(fn, perf['config'], backend, perf.get('mode', 'forward')).summary()} (not graded)")
    except Exception as err:
        print(f"{perf['config']}: no comparison with {backend} ({type(err).__name__}: {err}; not graded)")


def judge(test: str, fn) -> None:
    """Run hidden test ``test`` on entry point ``fn`` through the judge (see module doc)."""
    path = ADDRESS.get() or os.environ.get(ENV)
    if not path:
        return _local(test, fn)
    conn = _Conn(path)
    try:
        opened = conn.ask({"op": "open", "test": test})
        if "error" in opened:
            raise JudgeFailure(opened["error"])
        for i, spec in enumerate(opened.get("calls", [])):
            rec = Recorder(conn, test, i, _wrap(fn, spec), spec.get("count_flops", False))
            try:
                with collecting():
                    CHECKS[spec["check"]](rec, seed=spec["seed"], device=opened["device"], **spec["kwargs"])
            except Exception as err:
                if not rec.raised:      # the check itself stopped (a mutated input, a wrong type)
                    conn.ask({"op": "kernel_error", "test": test, "check": i,
                              "message": f"{type(err).__name__}: {err}"})
                break
            moved = rec.changed()
            if moved:
                conn.ask({"op": "kernel_error", "test": test, "check": i, "message": moved})
                break
            if spec.get("perf"):
                timed = _interchange(fn, spec["interchange"], spec["seed"]) if spec.get("interchange") else fn
                _measure(timed, spec["perf"], conn, test)
        verdict = conn.ask({"op": "close", "test": test})
    finally:
        conn.close()
    for line in verdict.get("output", []):
        print(line)
    print(f"judge: {test}: {verdict.get('points', 0):g} of {verdict.get('max_points', 0):g} point(s)")
    if not verdict.get("passed"):
        raise JudgeFailure(verdict.get("message") or verdict.get("error") or f"{test} failed")


def _local(test: str, fn) -> None:
    """No judge: nothing in a kernel may award points, so the hidden cell fails, naming the command."""
    raise JudgeFailure(
        f"{test}: not graded here. The hidden tests of this course are decided by the judge, outside "
        "this kernel, and none is running: grade with `python -m autograder autograde SUBMITTED` "
        "(autograder/README.md). A plain `nbgrader autograde` gives no points for this cell; to check "
        "your own work, run the visible tests above.")
