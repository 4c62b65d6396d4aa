"""Grading across machines (autograder/cluster.py): the bundled samples through a local Ray cluster
with two fake GPUs, one GPU per GPU task, a grading worker killed mid-run (its task runs again), and
a task lost on every attempt (left ungraded, graded by the next run).

Ray is installed into this interpreter when it is missing (`pip install ray==2.*`); the tests skip,
saying why, only when that install fails (offline). The cluster is a `ray start --head` process of
its own (so the command joins it by address, as on a real cluster), stopped at the end.
"""
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, pip_install
from autograder import cli, cluster, gradebook, model, workers

A = "01_vanilla_attention"


def _install_ray():
    """Ray and its `ray` command in this interpreter's environment: installed when missing; a skip that says
    why when pip cannot install it, or says it did and the command is still not there (pip's own words
    follow in the reason: twice a CI run got that far, the second time with pip's output hidden by -q)."""
    cli = Path(sys.executable).parent / "ray"
    try:
        import ray  # noqa: F401
        if cli.exists():
            return
    except ImportError:
        pass
    t0 = time.time()
    r = pip_install("ray==2.*")
    if r.returncode != 0:
        pytest.skip(f"Ray is not installed and `pip install ray==2.*` failed (offline?): {r.stderr[-800:]}")
    if not cli.exists():
        again = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "ray==2.*"],
                               capture_output=True, text=True, timeout=900)
        pytest.skip(f"`pip install ray==2.*` succeeded but {cli} is missing; pip says: "
                    f"{(again.stdout + again.stderr).strip()[-800:]}")
    print(f"installed ray in {time.time() - t0:.0f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def head():
    """A one-node Ray cluster, 2 CPUs and 2 fake GPUs: (address, raylet pid)."""
    _install_ray()
    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))     # Ray's socket paths must stay short
    # Every Ray process imports jsonschema, whose rfc3987_syntax builds a grammar for ~4 CPU-seconds
    # (autograder/__init__.py skips it in grading processes): skipped here too.
    (tmp / "stub").mkdir()
    (tmp / "stub" / "rfc3987_syntax.py").write_text("raise ImportError('skipped')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "stub"), str(ROOT)]),
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(tmp / "head.log", "w+")
    client = []
    if importlib.util.find_spec("grpc"):    # Ray Client's server starts too: on a free port
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            client = [f"--ray-client-server-port={sock.getsockname()[1]}"]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port=0",
                             "--num-cpus=2", "--num-gpus=2", "--include-dashboard=false", *client,
                             "--disable-usage-stats", f"--temp-dir={tmp / 'ray'}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 180
        text = ""
        while "Ray runtime started" not in text:
            assert proc.poll() is None and time.time() < deadline, f"ray start failed:\n{text[-3000:]}"
            time.sleep(0.3)
            text = (tmp / "head.log").read_text()
        address = text.split("ray start --address='")[1].split("'")[0]
        raylet = int(subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "raylet/raylet"], capture_output=True,
                                    text=True).stdout.split()[0])
        before = os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = "disabled"        # drivers of this process and its children
        try:
            yield address, raylet
        finally:
            if before is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = before
    finally:
        proc.send_signal(signal.SIGINT)                 # `ray start --block` stops what it started
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _samples(subs: Path) -> Path:
    for s in ("alice", "bob", "carol"):
        shutil.copytree(model.SAMPLES / s / A, subs / s / A)
    return subs


def _kill_grading_workers(raylet: int, student: str, times: int, stop: threading.Event) -> list[int]:
    """In a thread: SIGKILL the Ray worker that grades ``student`` (the parent of its nbgrader
    process, a child of this cluster's raylet), ``times`` times, a new one each time; returns the
    list the killed pids go into."""
    killed = []

    def ppid(pid):
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return -1

    def run():
        while len(killed) < times and not stop.is_set():
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    cmd = (d / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"--student" not in cmd or student.encode() not in cmd or A.encode() not in cmd:
                    continue
                worker = ppid(d.name)
                if worker > 0 and worker not in killed and ppid(worker) == raylet:
                    try:
                        os.kill(worker, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    killed.append(worker)
            time.sleep(0.1)

    threading.Thread(target=run, daemon=True).start()
    return killed


def test_without_ray_cluster_is_an_input_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)       # `import ray` fails as if not installed
    subs = _samples(tmp_path / "subs")
    assert cli.main(["--workspace", str(tmp_path / "ws"), "autograde", str(subs), "--cluster", "auto"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and 'pip install "ray[default]"' in err and "Traceback" not in err


def _misnamed(subs: Path, students) -> Path:
    """Submissions with a wrong file name: graded (a 0 the student earned) in a second, no nbgrader."""
    for s in students:
        (subs / s / A).mkdir(parents=True)
        for name in ("my_attempt.ipynb", "my_attempt_v2.ipynb"):     # two: neither is taken as the notebook
            (subs / s / A / name).write_text("{}")
    return subs


def _gpu_tasks_get_one_gpu_each(driver, tmp_path, monkeypatch):
    """A task of an assignment with GPU tests takes one GPU (its own CUDA_VISIBLE_DEVICES)."""
    import ray

    def probe():        # with the grader's task options: never the same GPU twice at once
        t0 = time.time()
        time.sleep(0.5)
        return os.environ.get("CUDA_VISIBLE_DEVICES"), t0, time.time()

    runs = ray.get([ray.remote(**cluster.OPTIONS["gpu"])(probe).remote() for _ in range(4)])
    assert {g for g, _, _ in runs} == {"0", "1"}, runs
    for i, (g1, s1, e1) in enumerate(runs):
        for g2, s2, e2 in runs[i + 1:]:
            assert not (g1 == g2 and s1 < e2 and s2 < e1), f"two tasks ran on GPU {g1} at once: {runs}"
    # the grading tasks themselves; the driver decides the GPU need (forced here: step 01 has none)
    assert not cluster.needs_gpu(A) and cluster.needs_gpu("06_cuda_flash_attention")
    with monkeypatch.context() as m:
        m.setattr(cluster, "needs_gpu", lambda a: True)
        res = workers.autograde(_misnamed(tmp_path / "subs", ("d1", "d2")), tmp_path / "ws", [A], quiet=True,
                                cluster=driver)
    assert [r.gpu in ("0", "1") for r in res] == [True] * 2, [(r.student, r.gpu, r.status) for r in res]
    assert all("missing notebook" in r.status and r.score == 0 for r in res)


def _a_task_lost_every_time_is_left_ungraded_then_graded_by_the_next_run(driver, tmp_path, monkeypatch, capsys):
    """A task whose worker dies on every attempt (os._exit) is tried 1 + retries times, then reported
    ungraded: no record, nothing in the gradebook, no 0. The next run grades it, reusing the rest."""
    attempts = tmp_path / "attempts"
    attempts.mkdir(parents=True)
    real = cluster.grade_task

    def dying_task(*args):          # shipped by value: runs on the worker
        if args[0] == "lost":
            (attempts / str(os.getpid())).write_text("")
            os._exit(1)
        return real(*args, gpu=False)

    subs, ws = _misnamed(tmp_path / "subs", ("kept", "lost")), tmp_path / "ws"
    with monkeypatch.context() as m:
        m.setattr(cluster, "_cpu_task", dying_task)
        rc = cli.main(["--workspace", str(ws), "autograde", str(subs), "--cluster", driver, "--retries", "1"])
    err = capsys.readouterr().err
    assert len(list(attempts.iterdir())) == 2, f"the lost task was not run again (rc {rc}): {err[-2000:]}"
    assert rc == 1 and "1 submission(s) NOT graded" in err, err[-2000:]
    assert f"lost/{A}: {workers.UNGRADED}the cluster lost its task 2 time(s) (WorkerCrashedError)" in err, err[-2000:]
    assert not model.result_path(ws, "lost", A).exists()
    assert [x.student for x in gradebook.export(ws)] == ["kept"]
    assert "lost" not in (ws / "grades.csv").read_text()
    res = {r.student: r for r in workers.autograde(subs, ws, [A], quiet=True, cluster=driver)}
    assert res["kept"].reused and not res["lost"].reused and "missing notebook" in res["lost"].status
    assert [x.student for x in gradebook.export(ws)] == ["kept", "lost"]


def _samples_on_the_cluster_lose_no_grade_to_a_killed_worker(head, tmp_path):
    """The bundled samples of step 01 through `autograde --cluster auto`, with alice's grading worker
    killed (SIGKILL) while her nbgrader runs: Ray runs her task again, and the grades are those of a
    local run; the gradebook has all three."""
    address, raylet = head
    ws, subs = tmp_path / "ws", _samples(tmp_path / "subs")
    stop = threading.Event()
    killed = _kill_grading_workers(raylet, "alice", 1, stop)
    try:
        r = subprocess.run([sys.executable, "-m", "autograder", "--workspace", str(ws), "autograde", str(subs),
                            "--cluster", "auto"], cwd=ROOT, capture_output=True, text=True, timeout=400,
                           env={**os.environ, "RAY_ADDRESS": address})
    finally:
        stop.set()
    assert killed, f"alice's grading worker was never seen: {r.stderr[-2000:]}"
    assert r.returncode == 0, r.stderr[-3000:]
    res = {x.student: x for x in gradebook.load_results(ws)}
    assert res["alice"].score == res["alice"].max_score == 7 and res["alice"].status == "graded", res["alice"]
    assert res["bob"].score == 0 and res["bob"].status == "graded", res["bob"]
    assert res["carol"].score == 4 and set(res["carol"].failed) == {
        "test_asymmetric", "test_edge_ragged", "test_edge_empty_rows"}, res["carol"]
    assert "top-left" in res["carol"].messages["test_asymmetric"]
    assert [x.gpu for x in res.values()] == [""] * 3        # step 01 has no GPU test: CPU tasks
    assert {x.student: x.score for x in gradebook.export(ws)} == {"alice": 7, "bob": 0, "carol": 4}
    # what the driver kept from the nodes: the executed notebooks and the staged copies
    nb = json.loads((ws / "autograded" / "alice" / A / f"{A}.ipynb").read_text())
    assert any(c.get("outputs") for c in nb["cells"])
    assert (ws / "submitted" / "carol" / A / f"{A}.ipynb").is_file()


@pytest.mark.slow
def test_grading_on_a_ray_cluster(head, tmp_path, monkeypatch, capsys):
    """One test, so that one cluster serves every part wherever pytest-xdist runs it."""
    import ray

    ray.init(address=head[0], logging_level="WARNING")      # this process as a driver
    try:
        _gpu_tasks_get_one_gpu_each(head[0], tmp_path / "gpu", monkeypatch)
        _a_task_lost_every_time_is_left_ungraded_then_graded_by_the_next_run(head[0], tmp_path / "lost",
                                                                              monkeypatch, capsys)
    finally:
        ray.shutdown()
    # the command line as a driver of its own, with `--cluster auto`
    _samples_on_the_cluster_lose_no_grade_to_a_killed_worker(head, tmp_path / "samples")
