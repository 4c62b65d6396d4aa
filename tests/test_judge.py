"""The judge, without nbgrader: its wire format, its verdicts by replay, its protocol rules, the scan.

The grading corpus (test_grading_corpus.py) runs forgeries through the real nbgrader pipeline;
these tests pin each rule of the judge on its own, quickly.
"""
from __future__ import annotations

import io
import socket
import struct
import time

import pytest
import torch

from conftest import ROOT, solution_code
from autograder import wire
from autograder.judge import Judge, points_of, run_inprocess
from autograder.judge_client import JudgeFailure, judge as hidden_cell
from autograder.perf import thresholds
from autograder.plans import PLANS, plan_of
from autograder.scan import scan_cuda, scan_source, scan_submission

A = "01_vanilla_attention"


def _solution(assignment: str = A, name: str = "vanilla_attention"):
    ns = {}
    exec("import math, torch\nfrom facourse import *\n" + solution_code(assignment)[name], ns)
    return ns[name]


def zeros(q, k, v, causal=False, scale=None):
    return torch.zeros_like(q)


# ----------------------------------------------------------------------------- wire
def test_wire_round_trip_keeps_values_types_and_devices():
    vals = (torch.randn(3, 5, dtype=torch.float16), torch.randn(2, 2).to(torch.bfloat16), torch.empty(0, 4),
            [torch.tensor([1, 2], dtype=torch.int32), None, 3.5, "x"], object())
    blobs = []
    tree = wire.encode(vals, blobs)
    back = wire.decode(tree, blobs)
    assert isinstance(back, tuple) and len(back) == 5
    for a, b in zip(vals[:3], back[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert isinstance(back[3], list) and back[3][1:] == [None, 3.5, "x"]
    assert type(back[4]).__name__ == "object"          # the check then says "got object"
    with pytest.raises(wire.WireError):
        wire.decode({"t": 0, "dtype": "float32", "shape": [4]}, [b"\0" * 15])   # 15 bytes for 16


def test_a_tensor_subclass_arrives_as_a_plain_tensor():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True
    blobs = []
    back = wire.decode(wire.encode(torch.zeros(4).as_subclass(Liar), blobs), blobs)
    assert type(back) is torch.Tensor


# ----------------------------------------------------------------------------- verdicts
def test_every_graded_cell_has_a_plan_and_every_plan_a_cell():
    for a in PLANS:
        assert set(plan_of(a)) == set(points_of(a)), a


@pytest.mark.slow
def test_solution_passes_and_wrong_answers_fail_with_the_checks_own_message():
    v = run_inprocess(A, _solution())
    assert all(x.passed and x.points == x.max_points for x in v.values()), {t: x.message for t, x in v.items()}
    v = run_inprocess(A, zeros, ["test_small"])["test_small"]
    assert v.points == 0 and "AttentionCheckError" in v.message and "wrong values" in v.message


def test_cache_is_caught_by_the_judge():
    sol, store = _solution(), {}

    def cached(q, k, v, causal=False, scale=None):
        key = tuple(q.shape)
        if key not in store:
            store[key] = sol(q, k, v, causal, scale)
        return store[key]

    v = run_inprocess(A, cached, ["test_medium"])["test_medium"]
    assert v.points == 0 and "cached or precomputed" in v.message, v.message


def test_sdpa_is_caught_by_the_guard_and_the_judge_says_so():
    def sdpa(q, k, v, causal=False, scale=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                                enable_gqa=True)

    v = run_inprocess(A, sdpa, ["test_noncausal"])["test_noncausal"]
    assert v.points == 0 and "scaled_dot_product_attention" in v.message, v.message


def test_mutated_inputs_are_reported_from_the_kernel():
    sol = _solution()

    def mutates(q, k, v, causal=False, scale=None):
        o = sol(q, k, v, causal, scale)
        q.mul_(2)
        return o

    v = run_inprocess(A, mutates, ["test_noncausal"])["test_noncausal"]
    assert v.points == 0 and "was modified by the call" in v.message, v.message


def test_gpu_tests_and_perf_score_zero_on_a_cpu_and_say_why():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    v = run_inprocess("05_triton_flash_attention", zeros, ["perf_large"])["perf_large"]
    assert v.points == 0 and "No GPU here" in v.message
    v = run_inprocess("06_cuda_flash_attention", zeros, ["test_large"])["test_large"]
    assert v.points == 0 and "No GPU here" in v.message and "sm_80" in v.message


def test_a_non_hopper_gpu_scores_step_07_zero_and_names_both_architectures(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    j = Judge("07_hopper_flash_attention", points_of("07_hopper_flash_attention"), device="cuda:0")
    try:
        msg = j._unavailable(j.plan["perf_large"])
    finally:
        j.close()
    assert "sm_90a" in msg and "sm_80" in msg


# ----------------------------------------------------------------------------- protocol
class _Raw:
    """A student's own connection to the judge's socket."""

    def __init__(self, judge: Judge):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(judge.address)

    def ask(self, header, blobs=()):
        wire.send(self.s, header, list(blobs))
        return wire.recv(self.s)[0]


def test_forged_records_are_refused_and_flagged(monkeypatch):
    j = Judge(A, points_of(A))
    raw = _Raw(j)
    # a record for a test that is not running, an unknown test, a bad check index
    assert "error" in raw.ask({"op": "call", "test": "test_large", "check": 0, "result": {"v": None}})
    assert "error" in raw.ask({"op": "open", "test": "test_everything"})
    opened = raw.ask({"op": "open", "test": "test_large"})
    assert opened["calls"] and all(isinstance(c["seed"], int) for c in opened["calls"])
    assert "error" in raw.ask({"op": "call", "test": "test_large", "check": 7, "result": {"v": None}})
    # the hidden cell itself later opens the same test: the record would be written twice
    monkeypatch.setenv("FACOURSE_JUDGE", j.address)
    with pytest.raises(JudgeFailure):
        hidden_cell("test_large", _solution())
    verdicts = j.finish()
    assert verdicts["test_large"].points == 0 and "started twice" in verdicts["test_large"].message
    assert len(j.violations) == 4, j.violations
    assert verdicts["test_small"].points == 0 and "did not run" in verdicts["test_small"].message


def test_a_cell_that_stopped_before_the_judge_shows_its_own_error_first():
    j = Judge(A, points_of(A))
    msg = j.finish({"test_small": "AttentionCheckError: [small] wrong values\n  likely cause: no scale"})["test_small"]
    assert msg.points == 0 and msg.message.startswith("AttentionCheckError: [small] wrong values")
    assert "judge" not in msg.message           # grading jargon a student cannot act on


def test_a_test_started_and_never_closed_scores_zero():
    j = Judge(A, points_of(A))
    _Raw(j).ask({"op": "open", "test": "test_small"})
    v = j.finish({"test_small": "DeadKernelError: the kernel died"})["test_small"]
    assert v.points == 0 and "did not finish" in v.message and "kernel died" in v.message


def test_malformed_bytes_are_a_violation_not_a_crash():
    j = Judge(A, points_of(A))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(j.address)
    s.sendall(struct.pack("!IQ", 5, 0) + b"{nope")
    s.shutdown(socket.SHUT_WR)
    s.recv(10)
    verdicts = j.finish()
    assert any("malformed" in v for v in j.violations), j.violations
    assert all(v.points == 0 for v in verdicts.values())


# ----------------------------------------------------------------------------- static scan
TAMPER = {
    "check_entry_point = lambda *a, **k: None": "rebinds check_entry_point",
    "def judge(*a):\n    pass": "redefines judge",
    "check_gradients = lambda *a, **k: None": "rebinds check_gradients",
    "from facourse import backward\nbackward.forward_backward = lambda fn: fn": "monkeypatching",
    "import builtins\nbuiltins.__import__ = None": "imports builtins",
    "import autograder.judge_client as j": "imports autograder",
    "import facourse\nfacourse.check_entry_point = print": "monkeypatching",
    "torch.allclose = lambda *a, **k: True": "monkeypatching",
    "import sys\nsys.modules['autograder'] = None": "sys.modules",
    "import os\nos._exit(0)": "os._exit",
    "import sys\nsys.exit(0)": "sys.exit",
    "import atexit": "imports atexit",
    "import threading": "imports threading",
    "get_ipython().events.register('pre_run_cell', print)": "get_ipython",
    "exec('x = 1')": "calls exec",
    "getattr(torch, 'scaled_' + 'dot')": "computed name on torch",
    "setattr(torch, 'x', 1)": "setattr on torch",
    "import os\nos.environ.get('FACOURSE_JUDGE')": "judge's address",
    "%load_ext autoreload": "IPython magic",
}


@pytest.mark.parametrize("code", list(TAMPER), ids=list(TAMPER.values()))
def test_scan_flags_each_tampering(code):
    flags = scan_source(code, "cell x")
    assert any(f.severity == "tamper" and TAMPER[code] in f.rule for f in flags), [f.text() for f in flags]


def test_scan_review_flags_and_clean_code():
    flags = scan_source("o = torch.nn.functional.scaled_dot_product_attention(q, k, v)", "cell x")
    assert [f.severity for f in flags] == ["review"]
    ordinary = ("import os, sys, math\nos.environ['TRITON_INTERPRET'] = '1'\nprint('x', file=sys.stderr)\n"
                "sys.path.append('.')\nx = getattr(torch, 'float16')\ntorch.manual_seed(0)\n")
    assert all(f.severity == "review" for f in scan_source(ordinary, "cell x")), scan_source(ordinary, "cell x")
    assert not scan_source("from facourse import check_entry_point, make_inputs\n"
                           "def vanilla_attention(q, k, v, causal=False, scale=None):\n"
                           "    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v", "cell x")
    for answer in ("d = fx._spec_definition()", "d = Definition(**fx.SPEC, reference=src)",
                   "from facourse.interchange import routing_trace_set",      # step 11's answers, from the library
                   "O.arr[...] = 0", "getattr(O, 'arr')[...] = 0",             # or past the TileLang stand-in
                   "import facourse.tilelang_cpu",
                   "y = torch.from_numpy(np.exp2(x.numpy()))", "y = math.pow(2.0, t)"):   # step 14: past the guard
        assert [f.severity for f in scan_source(answer, "cell x")] == ["review"], answer
    assert not scan_source('d = Definition(name="mini_flash_attention_prefill", axes=axes)', "cell x")
    assert not scan_source("c = math.log(2)\np = ((c3 * f + c2) * f + c1) * f + 1.0\np = tl.math.exp2(s)", "cell x")
    assert scan_cuda('#include <Python.h>\nvoid f() { system("ls"); }', "k.cu")
    assert not scan_cuda('asm volatile("mma.sync.aligned.m16n8k16" ::);', "k.cu")


def test_solutions_stubs_and_samples_raise_no_flag():
    for top in ("solutions", "exercises", "autograder/samples/alice", "autograder/samples/bob",
                "autograder/samples/carol"):
        for folder in sorted(p for p in (ROOT / top).iterdir() if p.is_dir()):
            nbs = [p.stem for p in folder.glob("*.ipynb")]
            assert not scan_submission(folder, nbs), folder
    for cu in (ROOT / "solutions").glob("*/ladder/student_kernel_solution.cu"):
        assert not scan_cuda(cu.read_text(), cu.name), cu


# ----------------------------------------------------------------------------- perf verdicts
@pytest.mark.parametrize("t_student,t_ref,calibrated,points,says", [
    (1.0, 1.0, 1.0, 2.0, "2 of 2 points"),          # 1.0x FA2, past the target: all points
    ("between", 1.0, 1.0, 1.0, "1 of 2 points"),    # between min and target: half the points
    ("below", 1.0, 1.0, 0.0, "0 of 2 points"),      # under min: none
    (1e-4, 1.0, 1.0, 0.0, "Not trusted"),           # faster than the GPU can compute (roofline)
    (1.0, 3.0, 1.0, 0.0, "apart"),                  # the kernel's reference time is not this GPU's
])
def test_perf_verdicts_check_the_numbers_against_the_machine(monkeypatch, t_student, t_ref, calibrated,
                                                             points, says):
    from autograder import judge as J
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    j = Judge("06_cuda_flash_attention", points_of("06_cuda_flash_attention"), device="cuda:0")
    st = j.states["perf_large"]
    th = thresholds("06_cuda_flash_attention")
    t_student = {"between": 2 / (th["min"] + th["target"]), "below": 1.05 / th["min"]}.get(t_student, t_student)
    st.perf = {"t_student_ms": t_student * 25.0, "t_ref_ms": t_ref * 25.0, "env": {}}
    monkeypatch.setattr(J, "calibration", lambda *a: calibrated * 25.0)
    v = j._perf(st, 2.0, [])
    j.close()
    assert v.points == points and says in (v.message + " ".join(v.output)), v
    assert v.perf["tflops_student"] == pytest.approx(
        4 * 8 * 32 * 128 * (2048 * 2049 // 2) / (t_student * 25e-3) / 1e12)


def test_perf_without_numbers_earns_nothing():
    j = Judge("06_cuda_flash_attention", points_of("06_cuda_flash_attention"))
    st = j.states["perf_large"]
    st.perf = {"error": "RuntimeError: CUDA error"}
    v = j._perf(st, 2.0, [])
    j.close()
    assert v.points == 0 and "no timing" in v.message


def test_perf_record_the_judge_cannot_check_earns_nothing(monkeypatch):
    from autograder import judge as J

    def no_gpu(*a):
        raise RuntimeError("no CUDA")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(J, "calibration", no_gpu)
    j = Judge("06_cuda_flash_attention", points_of("06_cuda_flash_attention"), device="cuda:0")
    st = j.states["perf_large"]
    st.perf = {"t_student_ms": 30.0, "t_ref_ms": 25.0}
    v = j._perf(st, 2.0, [])
    j.close()
    assert v.points == 0 and "could not time the reference" in v.message


def _side_by_side(rounds: int = 1) -> None:
    """Four threads grading step 02's solution at once, ``rounds`` times: every thread reaches its own judge and
    the solution gets its points in every one. (Step 02: its tests run no guard, whose hooks (class
    attributes) are the kernel's, one thread there.)"""
    import threading

    sol = _solution("02_safe_softmax", "safe_softmax")
    tests = ["test_small", "test_ragged"]
    for _ in range(rounds):
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(run_inprocess("02_safe_softmax", sol, tests,
                                                                             quiet=False)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(set(v) == set(tests) and all(x.passed for x in v.values()) for v in got), got


def test_concurrent_verdicts_leave_stdout_alone():
    """Workers grade submissions in parallel threads, each with its judge: the summary lines a
    verdict collects must not swallow the process's own output, nor leave it redirected; each thread
    reaches its own judge (a context variable, not the process environment: setenv in one thread
    racing getenv in another crashed a test worker) and the solution gets its points in every one."""
    import os
    import sys

    from autograder.judge_client import ENV

    before, env = sys.stdout, os.environ.get(ENV)
    _side_by_side()
    assert sys.stdout is before and os.environ.get(ENV) == env


def test_concurrent_verdicts_survive_a_compiled_process():
    """Python 3.11's print() writes through a borrowed reference to sys.stdout: the judge's capture proxy,
    dropped by one thread while another printed through it, was used after free. Once torch.compile had
    run in the process (dynamo's frame hook changes when threads switch) that crashed a test worker in
    one run of three or so. The proxy now lives as long as the process: the same object every time, and
    concurrent verdicts in a process that has compiled a function, in a subprocess so that a crash is a
    failure with its trace."""
    import subprocess
    import sys

    from autograder import judge

    with judge._capture_stdout(io.StringIO()):
        first = sys.stdout
    with judge._capture_stdout(io.StringIO()):
        assert sys.stdout is first and judge._proxy is first
    assert sys.stdout is not first
    code = """
import faulthandler, sys
faulthandler.enable()
sys.path[:0] = ["src", ".", "tests"]
import torch
torch.compile(lambda x: torch.sin(x) + 1, backend="eager")(torch.randn(8))
from test_judge import _side_by_side
_side_by_side(40)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("ok"), (r.returncode, r.stderr[-3000:])


def test_a_judge_never_closed_leaves_no_folder_behind():
    """A judge's socket folder goes with close(), and at the process's exit when nothing closed it."""
    import subprocess
    import sys
    from pathlib import Path

    j = Judge(A, points_of(A))
    folder = Path(j.address).parent
    assert folder.is_dir()
    j.close()
    assert not folder.exists()
    code = "from autograder.judge import Judge\nprint(Judge('01_vanilla_attention', {}).address)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    left = Path(r.stdout.strip()).parent
    assert left.name.startswith("faj") and not left.exists(), f"{left} is left in the temp folder"


def test_tamper_flags_zero_the_judged_tests_unless_an_instructor_trusts_them():
    from autograder.judge import Verdict
    from autograder.model import Result
    from autograder.grader import apply_verdicts

    class _NoViolations:
        violations: list = []

    def graded(trusted):
        res = Result("s", A, tests=[{"name": "test_small", "notebook": A, "max_score": 1.0, "auto": True, "score": 0.0},
                                    {"name": "written", "notebook": A, "max_score": 2.0, "auto": False, "score": 0.0}],
                     flags=[{"severity": "tamper", "where": "cell x, line 3", "rule": "imports atexit", "line": "import atexit"}])
        apply_verdicts(res, {"test_small": Verdict(1.0, 1.0, True)}, _NoViolations(), trusted)
        return res

    res = graded(False)
    assert res.score == 0 and res.failed == ["test_small"] and res.status.startswith("flagged")
    assert "imports atexit" in res.messages["test_small"] and "own verdict: passed" in res.messages["test_small"]
    res = graded(True)
    assert res.score == 1 and not res.failed and "waived" in res.status and res.flags


def test_a_flood_of_bytes_is_refused_before_it_is_read():
    from autograder import judge as J
    j = Judge(A, points_of(A))
    j._budget = 1000
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(j.address)
    head = b'{"op": "call", "test": "test_small", "blob_sizes": [1000000]}'
    try:
        s.sendall(struct.pack("!IQ", len(head), 1_000_000) + head + b"\0" * 4096)
        s.recv(10)                      # the judge hangs up without reading the bytes
    except OSError:
        pass
    for _ in range(100):
        if j.violations:
            break
        time.sleep(0.05)
    j.finish()
    assert any("too large" in v for v in j.violations), j.violations
    assert J.RECEIVE_BUDGET["cpu"] >= 1 << 28


def test_perf_cells_show_flashinfer_beside_the_graded_ratio(monkeypatch, capsys):
    """thresholds.toml's `also` (step 11: FLASHINFER) is timed after the graded bench and printed, never
    sent to the judge; without flashinfer, or when its bench fails, the line says so."""
    import types

    import facourse.bench as fb
    from autograder import judge_client, perf

    assert perf.thresholds("11_interchangeable_kernels")["also"] == ["FLASHINFER"]
    spec = {"step": "11_interchangeable_kernels", "config": "large"}
    monkeypatch.setattr(fb, "flashinfer_available", lambda: False)
    judge_client._also(None, spec, "FLASHINFER")
    assert "FlashInfer is not installed here" in capsys.readouterr().out
    monkeypatch.setattr(fb, "flashinfer_available", lambda: True)
    seen = []
    monkeypatch.setattr(perf, "bench", lambda fn, config, backend, mode: seen.append((config, backend, mode)) or
                        types.SimpleNamespace(summary=lambda: "large: 0.86x the reference"))
    judge_client._also(None, spec, "FLASHINFER")
    assert capsys.readouterr().out.strip() == "large: 0.86x the reference (not graded)"
    assert seen == [("large", "FLASHINFER", "forward")]

    def broken(*a):
        raise RuntimeError("no module for bfloat16")
    monkeypatch.setattr(perf, "bench", broken)
    judge_client._also(None, spec, "FLASHINFER")
    assert "no comparison with FLASHINFER (RuntimeError: no module for bfloat16; not graded)" in capsys.readouterr().out


def test_concurrent_verdicts_each_keep_their_own_printed_lines(capsys):
    """Two verdicts decided at once (two workers): each keeps what its own check printed, nothing of
    the other's, and the process's stdout is what it was before and after."""
    import io
    import sys
    import threading

    from autograder import judge as J

    before = sys.stdout
    barrier = threading.Barrier(2)
    bufs = {"a": io.StringIO(), "b": io.StringIO()}

    def verdict(name):
        with J._capture_stdout(bufs[name]):
            for i in range(50):
                barrier.wait(timeout=10)          # the two threads print in lockstep
                print(f"{name} line {i}")
    threads = [threading.Thread(target=verdict, args=(n,)) for n in bufs]
    for t in threads:
        t.start()
    print("the grading process's own line")
    for t in threads:
        t.join()
    assert sys.stdout is before
    for name, buf in bufs.items():
        assert buf.getvalue().splitlines() == [f"{name} line {i}" for i in range(50)], name
    assert capsys.readouterr().out == "the grading process's own line\n"
