"""The judge: where a grade is decided, in the grading process, where no student code ever runs.

One :class:`Judge` serves one submission while nbgrader runs it. It listens on a Unix socket in a
private folder (``FACOURSE_JUDGE`` tells the kernel where). A hidden cell (``judge_client``)

1. **opens** its test: the judge answers with the test's checks (``plans.py``), each with a secret
   seed (derived from the judge's ``seed_key`` when it has one, so a regrade draws the same inputs:
   the rule is in ``seeds.py``; fresh random seeds without one); a test opened twice, or one the
   plan does not know, is tampering;
2. sends each **call** of the entry point as the check made it: the outputs as raw tensors (or the
   error it raised), never code; a call for a test that is not open is tampering;
3. may send a **kernel_error** (the check stopped in the kernel: a mutated input) and a **perf**
   record (the kernel's timing);
4. **closes** the test: the judge regenerates the inputs from its seeds, runs the same check with
   a stand-in that hands back the recorded outputs call by call (:class:`Replay`), verifies with
   the course's one rule (same messages, same diagnoses), and answers with the verdict.

After the notebook, :meth:`Judge.finish` gives every graded cell its points: the verdict of a
closed test; 0 for a test whose cell never reached the judge (the cell's own error first), or
that was opened and not closed. The static scan (``scan.py``) and protocol violations can flag a
submission: tampering scores its judged tests 0 until an instructor waives the flag.

Timing (perf tests) can only be observed in the kernel, so the kernel's numbers are evidence:
the judge accepts them only with a correct judged result at the same configuration, recomputes
TFLOP/s from the time, refuses a rate above the GPU's peak, and refuses a reference time that
differs from its own calibration of the reference on this GPU by more than
:data:`CALIBRATION_FACTOR`. What a student could still forge is in autograder/README.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from facourse import AttentionCheckError, AttentionInputError
from facourse import kinds
from facourse.softmax_check import SoftmaxCheckError

from . import wire
from .model import NOT_WRITTEN
from .checks import CHECKS
from .guards import CheatDetected, bandwidth_verdict, roofline_verdict
from .perf import points_for, thresholds
from .plans import Test, plan_of

#: A perf record's reference time must be within this factor of the judge's own calibration.
CALIBRATION_FACTOR = 1.5
#: A measured rate the GPU cannot reach flags the record: a compute-bound kind against the roofline, a
#: memory-bound one against HBM's bandwidth.
PLAUSIBLE = {"compute": roofline_verdict, "memory": bandwidth_verdict}
#: Bytes of outputs one submission may send (the largest plan needs well under a tenth of this):
#: a kernel that floods the judge cannot exhaust the grading machine's memory.
RECEIVE_BUDGET = {"cpu": 1 << 30, "cuda": 16 << 30}
_ERRORS = {c.__name__: c for c in (AttentionCheckError, SoftmaxCheckError, CheatDetected, AttentionInputError)}


class _ThreadStdout(io.TextIOBase):
    """sys.stdout while verdicts are being decided: what a thread that captures writes goes to its own
    buffer, everything else to the stdout it replaced."""

    def __init__(self, fallback):
        self.fallback = fallback
        self.local = threading.local()

    def write(self, text):
        return (getattr(self.local, "buf", None) or self.fallback).write(text)

    def flush(self):
        if getattr(self.local, "buf", None) is None:
            self.fallback.flush()

    # what else code asks of sys.stdout meanwhile (a terminal? its encoding, its descriptor) is the
    # replaced stdout's
    @property
    def encoding(self):
        return getattr(self.fallback, "encoding", None)

    def isatty(self):
        return self.fallback.isatty()

    def fileno(self):
        return self.fallback.fileno()


_CAPTURE = threading.Lock()          # guards installing and removing the proxy, not the verdicts
# One proxy for the process, never freed: Python 3.11's print() holds a borrowed reference to sys.stdout
# while it writes, so a proxy dropped by one thread while another printed through it was used after free
# (a segfault, seen once torch.compile had run in the process; tests/test_judge.py)
_proxy: _ThreadStdout | None = None
_capturing = 0


@contextlib.contextmanager
def _capture_stdout(buf: io.StringIO):
    """The checks print their summary lines; the judge keeps them for the verdict. This thread's
    prints go to ``buf``, other threads' where they went: verdicts of concurrent submissions run side
    by side (contextlib.redirect_stdout swaps sys.stdout for every thread, so they took turns)."""
    global _proxy, _capturing
    with _CAPTURE:
        if _capturing == 0:
            if _proxy is None:
                _proxy = _ThreadStdout(sys.stdout)
            elif sys.stdout is not _proxy:
                _proxy.fallback = sys.stdout
            sys.stdout = _proxy
        _capturing += 1
        proxy = _proxy
    proxy.local.buf = buf
    try:
        yield
    finally:
        proxy.local.buf = None
        with _CAPTURE:
            _capturing -= 1
            if _capturing == 0 and sys.stdout is proxy:
                sys.stdout = proxy.fallback


@dataclass
class Verdict:
    points: float
    max_points: float
    passed: bool
    message: str = ""
    output: list = field(default_factory=list)
    perf: dict | None = None


@dataclass
class _State:
    test: Test
    calls: list = field(default_factory=list)       # per check: its spec sent to the kernel
    records: dict = field(default_factory=dict)     # check index -> [(header, blobs)]
    kernel_errors: dict = field(default_factory=dict)
    perf: dict | None = None
    opened: bool = False
    verdict: Verdict | None = None


class _RecordedError(AssertionError):
    """An exception the entry point raised in the kernel, raised again in the judge."""


class Replay:
    """The entry point, as the judge sees it: each call returns what the kernel recorded."""

    def __init__(self, records: list, device):
        self.records, self.device, self.i = records, device, 0
        self.exhausted = False
        self.last_flops = None

    def __call__(self, *args, **kwargs):
        if self.i >= len(self.records):
            self.exhausted = True
            raise AttentionCheckError("the kernel recorded no result for this call: the test stopped "
                                      "before it (see the error above it in the notebook)")
        header, blobs = self.records[self.i]
        self.i += 1
        if "error" in header:
            err = header["error"] if isinstance(header["error"], dict) else {}
            kind, msg = str(err.get("type", "Error")), str(err.get("message", ""))
            if kind == "NotImplementedError" and not msg.strip():
                msg = NOT_WRITTEN
            cls = _ERRORS.get(kind)
            raise cls(msg) if cls else _RecordedError(f"{kind}: {msg}")
        self.last_flops = header.get("flops")
        return wire.decode(header.get("result", {"v": None}), blobs, self.device)


class Judge:
    """Serves one submission's kernel; decides its grades (see the module doc)."""

    def __init__(self, assignment: str, max_points: dict[str, float], *, device: str = "cpu",
                 student_files: dict[str, bytes] | None = None, release_dir: Path | None = None,
                 seed_key: bytes | None = None):
        self.assignment = assignment
        self.seed_key = seed_key
        self.plan = plan_of(assignment)
        self.max_points = max_points
        self.device = device
        self.student_files = student_files or {}
        self.release_dir = release_dir
        self.violations: list[str] = []
        self.states = {gid: _State(t) for gid, t in self.plan.items()}
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="faj"))      # short: Unix socket paths are limited
        self.address = str(self._dir / "s")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(8)
        # the socket's folder goes with close(), or with the judge when close() is never reached
        self._closed = weakref.finalize(self, _close, self._sock, self._dir)
        self._threads: list[threading.Thread] = []
        self._budget = RECEIVE_BUDGET["cuda" if device.startswith("cuda") else "cpu"]
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    # ------------------------------------------------------------------ serving
    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket):
        with conn:
            while True:
                try:
                    header, blobs = wire.recv(conn, self._budget)
                except EOFError:
                    return
                except (wire.WireError, OSError, ValueError) as err:
                    self._violation(f"a malformed message reached the judge ({err})")
                    return
                self._budget -= sum(len(b) for b in blobs)
                try:
                    reply = self._handle(header, blobs)
                except Exception as err:        # a bug of ours must not hang the kernel
                    reply = {"error": f"judge error: {type(err).__name__}: {err}"}
                try:
                    wire.send(conn, reply)
                except OSError:
                    return

    def _violation(self, what: str):
        with self._lock:
            self.violations.append(what)

    def _handle(self, h: dict, blobs: list[bytes]) -> dict:
        op, test = h.get("op"), h.get("test")
        st = self.states.get(test) if isinstance(test, str) else None
        if st is None:
            self._violation(f"the judge was asked about test {test!r}, which this assignment does not have")
            return {"error": f"unknown test {test!r}"}
        with self._lock:
            if op == "open":
                return self._open(test, st)
            if not st.opened:
                self.violations.append(f"{test}: a record arrived for a test that was not running ({op})")
                return {"error": "test not open"}
            if st.verdict is not None:
                self.violations.append(f"{test}: a record arrived after the test was closed ({op})")
                return {"error": "test already closed"}
            if op in ("call", "kernel_error") and not (isinstance(h.get("check"), int)
                                                       and 0 <= h["check"] < len(st.calls)):
                self.violations.append(f"{test}: a record names a check the test does not have")
                return {"error": "bad check index"}
            if op == "call":
                st.records.setdefault(h["check"], []).append((h, blobs))
                return {"ok": True}
            if op == "kernel_error":
                st.kernel_errors.setdefault(h["check"], str(h.get("message", ""))[:4000])
                return {"ok": True}
            if op == "perf":
                if st.perf is not None or not st.test.perf:
                    self.violations.append(f"{test}: a timing record was sent twice or for a test that times nothing")
                    return {"error": "unexpected perf record"}
                st.perf = h.get("record") if isinstance(h.get("record"), dict) else {"error": "malformed record"}
                return {"ok": True}
            if op == "close":
                try:
                    st.verdict = self._decide(test, st)
                except Exception as err:        # a bug of ours: the test scores 0 and says so
                    st.verdict = Verdict(0.0, self.max_points.get(test, 0.0), False,
                                         f"judge error (not the student's): {type(err).__name__}: {err}")
                v = st.verdict
                return {"points": v.points, "max_points": v.max_points, "passed": v.passed,
                        "message": v.message, "output": v.output}
        self._violation(f"{test}: unknown operation {op!r}")
        return {"error": f"unknown operation {op!r}"}

    def _open(self, test: str, st: _State) -> dict:
        if st.opened:
            self.violations.append(f"{test}: the test was started twice (its record would be written twice)")
            st.verdict = Verdict(0.0, self.max_points.get(test, 0.0), False,
                                 "the test was started twice; only one run of each test is accepted")
            return {"error": "this test was already run"}
        st.opened = True
        skip = self._unavailable(st.test)
        if skip:
            st.verdict = Verdict(0.0, self.max_points.get(test, 0.0), False, skip, [skip])
            return {"error": skip}
        st.calls = [{"check": c.name, "kwargs": c.kwargs, "bind": c.bind, "seed": self._seed(test, i),
                     "guard": st.test.guard, "count_flops": st.test.count_flops,
                     "perf": st.test.perf, "train": st.test.train, "ring": st.test.ring,
                     "interchange": st.test.interchange} for i, c in enumerate(st.test.checks)]
        return {"calls": st.calls, "device": "cuda" if self.device.startswith("cuda") else "cpu"}

    def _seed(self, test: str, index: int) -> int:
        """The seed of check ``index`` of ``test``: HMAC-SHA256(seed_key, assignment, test, index) in
        31 bits with a key (the same on every regrade), a fresh random one without."""
        if self.seed_key is None:
            return secrets.randbits(31)
        msg = "\0".join((self.assignment, test, str(index))).encode()
        return int.from_bytes(hmac.new(self.seed_key, msg, hashlib.sha256).digest()[:4], "big") & 0x7FFFFFFF

    def _unavailable(self, test: Test) -> str | None:
        need = test.needs
        if need is None:
            return None
        if not self.device.startswith("cuda"):
            what = "an H100 or H200 (sm_90a)" if need == "sm90a" else "an NVIDIA GPU (sm_80 or newer)"
            return (f"No GPU here: this test runs on {what}; it is graded on a GPU machine and "
                    "scores 0 on this one.")
        cap = torch.cuda.get_device_capability(self.device)
        if need == "sm90a" and tuple(cap) != (9, 0):
            return (f"This test needs an sm_90a GPU (H100/H200); this one is sm_{cap[0]}{cap[1]}: "
                    "it scores 0 here.")
        if tuple(cap) < (8, 0):
            return f"This test needs sm_80 or newer; this GPU is sm_{cap[0]}{cap[1]}."
        return None

    # ------------------------------------------------------------------ deciding
    def _decide(self, test: str, st: _State) -> Verdict:
        max_points = self.max_points.get(test, 0.0)
        if st.test.sass:
            return self._sass(max_points)
        out = io.StringIO()
        for i, spec in enumerate(st.calls):
            replay = Replay(st.records.get(i, []), self.device)
            try:
                with _capture_stdout(out):
                    CHECKS[spec["check"]](replay, seed=spec["seed"], device=self.device, **spec["kwargs"])
            except Exception as err:
                msg = st.kernel_errors.get(i) if replay.exhausted and i in st.kernel_errors else _text(err)
                return Verdict(0.0, max_points, False, msg, _lines(out) + [msg])
            if i in st.kernel_errors:
                msg = st.kernel_errors[i]
                return Verdict(0.0, max_points, False, msg, _lines(out) + [msg])
        if st.test.perf:
            return self._perf(st, max_points, _lines(out))
        return Verdict(max_points, max_points, True, "", _lines(out))

    def _sass(self, max_points: float) -> Verdict:
        from facourse.cuda_build import SassCheckError, ToolUnavailable, check_sass

        source = self.student_files.get("student_kernel.cu")
        if source is None:
            return Verdict(0.0, max_points, False, "no student_kernel.cu was submitted")
        work = Path(tempfile.mkdtemp(prefix="fajsass"))
        try:
            path = work / "student_kernel.cu"
            path.write_bytes(source)
            out = io.StringIO()
            with _capture_stdout(out):
                check_sass(path, include_dirs=[self.release_dir] if self.release_dir else [])
            return Verdict(max_points, max_points, True, "", _lines(out))
        except (SassCheckError, ToolUnavailable) as err:
            return Verdict(0.0, max_points, False, _text(err), [_text(err)])
        except Exception as err:            # nvcc's own failure: the student's source does not compile
            return Verdict(0.0, max_points, False, f"the kernel does not compile for sm_90a: {_text(err)}"[:4000])
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _perf(self, st: _State, max_points: float, output: list) -> Verdict:
        spec = st.test.perf
        rec = st.perf
        base = {"step": spec["step"], "config": spec["config"], "points_max": max_points, "points": 0.0}
        t = thresholds(spec["step"])
        base.update(min=t["min"], target=t["target"])

        def refuse(status, why, **extra):
            return Verdict(0.0, max_points, False, why, output + [why], {**base, **extra, "status": status,
                                                                         "flag": why})

        if not rec or "error" in rec or not all(k in rec for k in ("t_student_ms", "t_ref_ms")):
            return refuse("no timing", f"no timing reached the judge ({(rec or {}).get('error', 'none sent')})")
        try:
            t_s, t_r = float(rec["t_student_ms"]), float(rec["t_ref_ms"])
        except (TypeError, ValueError):
            return refuse("flagged", "the timing record holds no numbers")
        if not (t_s > 0 and t_r > 0):
            return refuse("flagged", "the timing record holds a time that is not positive")
        gpu = torch.cuda.get_device_name(self.device)
        kind = kinds.get(spec.get("mode"))
        env = rec.get("env") if isinstance(rec.get("env"), dict) else {}
        nums = {"t_student_ms": t_s, "t_ref_ms": t_r, "ratio": t_r / t_s, "backend": t["reference"], "gpu": gpu,
                "env": {**env, "gpu": gpu}, "host_student_us": rec.get("host_student_us"),
                "host_ref_us": rec.get("host_ref_us")}
        work = kind.perf_work(spec["config"], self.device)
        rate_s, rate_r = kind.rate(work, t_s), kind.rate(work, t_r)
        nums.update({f"{kind.rate_key}_student": rate_s, f"{kind.rate_key}_ref": rate_r})
        flag = PLAUSIBLE[kind.bound](rate_s, gpu)
        rates = kind.rates_text(rate_s, rate_r, t["reference"], rec)
        if flag:
            return refuse("flagged", f"Not trusted: {flag}", **nums)
        try:
            cal = calibration(self.device, spec["config"], t["reference"], kind.name)
        except Exception as err:
            return refuse("unverified", f"the judge could not time the reference on this GPU to check the "
                          f"record against ({type(err).__name__}: {err}); no perf points", **nums)
        nums["calibration_ms"] = cal
        if not (1 / CALIBRATION_FACTOR <= t_r / cal <= CALIBRATION_FACTOR):
            return refuse("flagged", f"Not trusted: the reference took {t_r:.3f} ms in the kernel's timing and "
                          f"{cal:.3f} ms when the judge timed it on this GPU (more than "
                          f"{CALIBRATION_FACTOR}x apart): the timing was not measured as the bench measures",
                          **nums)
        got = points_for(t_r / t_s, t, max_points)
        line = (f"{spec['config']}{kind.label}: {rates}: "
                f"{t_r / t_s:.2f}x; thresholds min {t['min']} (half the points), target {t['target']} (all): "
                f"{got:g} of {max_points:g} points")
        return Verdict(got, max_points, got > 0, "" if got > 0 else line, output + [line],
                       {**base, **nums, "status": "measured", "points": got})

    # ------------------------------------------------------------------ the end
    def finish(self, cell_errors: dict[str, str] | None = None) -> dict[str, Verdict]:
        """Stop serving; the verdict of every graded cell (grade_id -> Verdict)."""
        self.close()
        cell_errors = cell_errors or {}
        out = {}
        with self._lock:
            for gid, st in self.states.items():
                mx = self.max_points.get(gid, 0.0)
                if st.verdict is not None:
                    out[gid] = st.verdict
                elif st.opened:
                    out[gid] = Verdict(0.0, mx, False, "the test started but did not finish (no verdict): "
                                       + cell_errors.get(gid, "the kernel stopped or the cell was interrupted"))
                else:       # the cell stopped before its hidden checks: its own error is the cause
                    why = cell_errors.get(gid)
                    out[gid] = Verdict(0.0, mx, False, f"{why} (the cell stopped here, before its hidden tests ran)"
                                       if why else "this test's cell did not run to its hidden tests")
        return out

    def close(self):
        self._closed()


def _close(sock: socket.socket, folder: Path) -> None:
    try:
        sock.close()
    except OSError:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def _text(err: BaseException) -> str:
    """'Name: message', as a notebook shows an error (the report splits it there)."""
    name = "AssertionError" if isinstance(err, _RecordedError) else type(err).__name__
    text = str(err)
    return text if isinstance(err, _RecordedError) else f"{name}: {text}"


def _lines(buf: io.StringIO) -> list[str]:
    return [ln for ln in buf.getvalue().splitlines() if ln.strip()]


# ----------------------------------------------------------------------------- one process
def points_of(assignment: str) -> dict[str, float]:
    """grade_id -> points of every autograded cell, from the assignment's nbgrader source."""
    from .model import SOLUTIONS

    out = {}
    for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade") and cell.get("cell_type") == "code":
                out[meta["grade_id"]] = float(meta.get("points", 0))
    return out


def run_inprocess(assignment: str, fn, tests=None, *, device: str | None = None,
                  student_files: dict[str, bytes] | None = None, release_dir: Path | None = None,
                  quiet: bool = True, seed_key: bytes | None = None) -> dict[str, Verdict]:
    """The kernel's side and the judge in one process, each test run as its hidden cell runs it.

    For the course's tests and the GPU self-test (the GPU machines have no Jupyter): the same
    client, wire, plan, replay and verdicts as ``autograde``, without nbgrader around them.
    """
    from .judge_client import ADDRESS, judge as hidden_cell

    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    j = Judge(assignment, points_of(assignment), device=device, student_files=student_files,
              release_dir=release_dir, seed_key=seed_key)
    token = ADDRESS.set(j.address)          # this thread's judge, not the process environment's
    errors = {}
    try:
        for test in (tests or list(j.plan)):
            try:
                with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
                    hidden_cell(test, fn)
            except Exception as err:        # the verdict says why; keep the kernel-side error too
                errors[test] = f"{type(err).__name__}: {err}"
    finally:
        ADDRESS.reset(token)
    verdicts = j.finish(errors)
    return {t: v for t, v in verdicts.items() if tests is None or t in tests}


# ----------------------------------------------------------------------------- calibration
_CAL: dict = {}
_CAL_LOCK = threading.Lock()


def calibration(device: str, config: str, backend: str, mode: str = "forward") -> float:
    """The reference backend's own time (ms) on ``config`` on this GPU, measured once by the judge.
    Raises when it cannot be measured: a perf record is then not accepted (nothing to check it by)."""
    from .perf import bench

    kind = kinds.get(mode)
    key = (device, torch.cuda.get_device_name(device), config, backend, kind.name)
    with _CAL_LOCK:
        if key not in _CAL:
            # the student's side of this bench: the reference itself (a decode: a call that does nothing)
            with torch.cuda.device(device):
                ref = kind.calibration_fn(config, backend, device)
                res = bench(ref, config, backend, kind.name)
            _CAL[key] = res.t_ref_ms
        return _CAL[key]
