"""tools/fast_kernel.py: the suite's notebook kernels, forked from a zygote, behave as Jupyter's own.

``./course.sh test`` puts its kernelspec first on JUPYTER_PATH, so every kernel the suite starts (graded
submissions, lectures, visible cells, JupyterLab) is one of these. A forked kernel must see what the
kernel Jupyter would have started sees (folder, environment, sys.path, the thread settings torch was
loaded with, Triton not yet imported), stop a cell on an interrupt, exit with the code its process
ended with, and go when Jupyter kills the process it started or the process that started it goes; a kernel whose sys.path finds a
preloaded package elsewhere runs that one.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, load_module, running, until

jupyter_client = pytest.importorskip("jupyter_client")
fast_kernel = load_module(ROOT / "tools" / "fast_kernel.py", "fast_kernel")

PROBE = """
import json, os, sys
print(json.dumps({"cwd": os.getcwd(), "probe": os.environ.get("FAST_KERNEL_PROBE"), "path": sys.path[1:],
                  "pid": os.getpid(), "ppid": os.getppid(), "triton": "triton" in sys.modules,
                  "argv0": os.path.basename(sys.argv[0]), "threads": __import__("torch").get_num_threads()}))
"""


def _kernel(spec_root: Path, cwd: Path, **env):
    """A kernel started as nbclient starts one, with ``spec_root`` alone on JUPYTER_PATH."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    full = {**os.environ, "JUPYTER_PATH": str(spec_root), **env}
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_root / "kernels")]))
    km.start_kernel(cwd=str(cwd), env=full)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=90)
    return km, kc


def _run(kc, code: str, timeout: float = 60) -> tuple[str, dict]:
    out = []
    reply = kc.execute_interactive(code, timeout=timeout,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    return "".join(out), reply["content"]


def _probe(kc) -> dict:
    text, reply = _run(kc, PROBE)
    assert reply["status"] == "ok", reply
    return json.loads(text)


def _reply(kc, msg_id: str, timeout: float) -> dict:
    """The shell reply to ``msg_id``: on a slow machine wait_for_ready asks kernel_info more than once, and the
    replies it did not wait for are still queued ahead of it."""
    end = time.time() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(end - time.time(), 0.1))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def _stop(km, kc) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=True)


@pytest.fixture
def specs(tmp_path):
    fast = fast_kernel.write_spec(tmp_path / "fast")
    plain = tmp_path / "plain"
    (plain / "kernels" / "python3").mkdir(parents=True)
    (plain / "kernels" / "python3" / "kernel.json").write_text(json.dumps(
        {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python",
         "display_name": "Python 3 (ipykernel)"}))
    return fast, plain


def test_a_forked_kernel_sees_what_jupyters_own_sees(specs, tmp_path):
    fast, plain = specs
    seen = {}
    for name, root in (("fast", fast), ("plain", plain)):
        km, kc = _kernel(root, tmp_path, FAST_KERNEL_PROBE=name, OMP_NUM_THREADS="1")
        try:
            seen[name] = _probe(kc)
            seen[name]["launched"] = km.provisioner.process.pid
        finally:
            _stop(km, kc)
    fast_seen, plain_seen = seen["fast"], seen["plain"]
    assert fast_seen["pid"] != fast_seen["launched"], "not forked: the process Jupyter started is the kernel"
    assert plain_seen["pid"] == plain_seen["launched"]
    assert fast_seen["probe"] == "fast" and plain_seen["probe"] == "plain"
    for fact in ("cwd", "path", "triton", "argv0", "threads"):
        assert fast_seen[fact] == plain_seen[fact], (fact, fast_seen[fact], plain_seen[fact])
    assert fast_seen["triton"] is False      # the interpreter is chosen before triton is imported


def test_torch_is_loaded_with_the_kernels_thread_settings(specs, tmp_path):
    threads = []
    for n in ("1", "2"):
        km, kc = _kernel(specs[0], tmp_path, OMP_NUM_THREADS=n)
        try:
            threads.append(_probe(kc)["threads"])
        finally:
            _stop(km, kc)
    assert threads == [1, 2]


def test_interrupt_exit_code_and_kill_reach_the_forked_kernel(specs, tmp_path):
    km, kc = _kernel(specs[0], tmp_path)
    try:
        sent = kc.execute("import time; time.sleep(60)", stop_on_error=False)   # else ipykernel may abort the next
        time.sleep(1.0)
        t0 = time.time()
        km.interrupt_kernel()
        reply = _reply(kc, sent, 30)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        assert time.time() - t0 < 20
        kernel = _probe(kc)["pid"]
        kc.execute("import os; os._exit(3)")
        proc = km.provisioner.process
        until(lambda: proc.poll() is not None, "the process Jupyter started to exit", 10)
        assert proc.returncode == 3, proc.returncode
        assert not running(kernel)
    finally:
        _stop(km, kc)

    km, kc = _kernel(specs[0], tmp_path)            # Jupyter's kill: the process group it started
    try:
        kernel = _probe(kc)["pid"]
        os.killpg(os.getpgid(km.provisioner.process.pid), signal.SIGKILL)
        until(lambda: not running(kernel), "the forked kernel to go with the process Jupyter started", 10)
    finally:
        kc.stop_channels()
        km.cleanup_resources()


def test_the_kernel_goes_when_the_process_that_started_it_goes(specs, tmp_path):
    """nbgrader killed (a notebook past its time limit): its kernel goes too, as ipykernel's own would."""
    script = tmp_path / "starter.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from pathlib import Path\n"
        "import test_fast_kernel as t\n"
        "km, kc = t._kernel(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "print(t._probe(kc)['pid'], flush=True)\n"
        "time.sleep(300)\n")
    starter = subprocess.Popen([sys.executable, str(script), str(specs[0]), str(tmp_path)], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        kernel = int(starter.stdout.readline())
        assert running(kernel)
        starter.kill()
        starter.wait()
        until(lambda: not running(kernel), "the kernel to go with the process that started it", 10)
    finally:
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)


def test_a_preloaded_package_found_elsewhere_is_loaded_from_there(specs, tmp_path):
    """A kernel whose sys.path finds IPython elsewhere runs that IPython (its own zygote loaded it)."""
    import IPython

    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "IPython").symlink_to(Path(IPython.__file__).parent)
    km, kc = _kernel(specs[0], tmp_path, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    try:
        text, reply = _run(kc, "import IPython; print(IPython.__file__)")
        assert reply["status"] == "ok", reply
        assert text.strip() == str(shadow / "IPython" / "__init__.py"), text
        assert _probe(kc)["pid"] != km.provisioner.process.pid
    finally:
        _stop(km, kc)
