"""Jupyter kernels forked from a process that has already imported PyTorch and ipykernel (the test suite's).

The suite starts a notebook kernel for every graded submission, lecture and visible-cell run, and each
spent about 3 of its CPU-seconds importing torch, ipykernel and IPython before its first cell (2 cores,
2026-12-03). ``./course.sh test`` puts this kernelspec first on JUPYTER_PATH (``--spec`` writes it), so
that Jupyter's "python3" kernel is this file:

* the **client** (the process Jupyter starts and signals, as it would the kernel) connects to a
  **zygote** for its interpreter and environment, starting one if there is none, and hands over its
  arguments, environment, folder, ``sys.path`` and standard streams (``SCM_RIGHTS``);
* the zygote, which imported :data:`PRELOAD` once, forks; the child takes all of that on and runs
  ``ipykernel_launcher`` as a fresh kernel would, in a session of its own;
* the client forwards the signals Jupyter sends it (an interrupt, a terminate) and exits as the kernel
  exits (its code, or the same signal), or when the process that started it goes; when the client
  goes, however it goes (``SIGKILL`` of its process group included), the zygote kills the kernel's.

A zygote serves one interpreter, one set of the settings read while torch loads (threads, allocator),
one place for each preloaded package as the kernel's ``sys.path`` finds it, and this file's text: a
kernel that differs in any gets a zygote of its own. One that fails to answer within :data:`START_S`
leaves the client to become Jupyter's own kernel (``exec`` of ``ipykernel_launcher``). A zygote leaves
when it has had no kernel for :data:`IDLE_S`.

For the test suite only: a graded kernel that kills its parent would take the zygote's other kernels
with it, so grading keeps Jupyter's kernels, one process tree per submission.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

#: What the zygote imports once (not matplotlib: it reads MPLBACKEND, which the kernel sets, when imported).
PRELOAD = ("torch", "ipykernel.kernelapp", "IPython", "jupyter_client", "zmq")
#: Environment read while those load (threads, allocator, library paths): a zygote per value.
KEYED_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "MALLOC_", "TORCH_", "PYTORCH_", "LD_", "CUDA_",
                  "PYTHON")
IDLE_S = 120.0
START_S = 60.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HERE = Path(__file__).resolve()


def _keyed_env(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(KEYED_PREFIXES) and k != "PYTHONPATH"}


def _origins() -> dict:
    """Where this process's sys.path finds each preloaded package (the zygote must have loaded the same)."""
    out = {}
    for name in PRELOAD:
        spec = importlib.util.find_spec(name.split(".")[0])
        out[name] = spec.origin if spec else None
    return out


def _address() -> bytes:
    key = json.dumps([sys.executable, sorted(_keyed_env(os.environ).items()), _origins(),
                      hashlib.sha1(HERE.read_bytes()).hexdigest(), os.getuid()])
    return b"\0facourse-kernel-" + hashlib.sha1(key.encode()).hexdigest().encode()     # Linux's abstract namespace


def _send(sock, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], list(fds))
    else:
        sock.sendall(msg)


def _recv(sock, with_fds=False):
    head, fds, *_ = socket.recv_fds(sock, 4, 8) if with_fds else (sock.recv(4), [])
    if len(head) < 4:
        head += _exactly(sock, 4 - len(head))
    (n,) = struct.unpack("!I", head)
    return json.loads(_exactly(sock, n)), fds


def _exactly(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("closed")
        buf += part
    return buf


# ----------------------------------------------------------------------------- the client
def _connect(address: bytes) -> socket.socket:
    deadline = time.monotonic() + START_S
    started = False
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(address)
            return s
        except OSError:
            s.close()
            if not started:
                env = {k: v for k, v in os.environ.items()
                       if k in ("PATH", "HOME", "LANG", "PYTHONPATH") or k.startswith(("LC_",) + KEYED_PREFIXES)}
                subprocess.Popen([sys.executable, str(HERE), "--serve", address.hex()], env=env, cwd="/",
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
                started = True
            if time.monotonic() > deadline:
                raise TimeoutError("no zygote")
            time.sleep(0.05)


def client(args: list[str]) -> None:
    try:
        sock = _connect(_address())
        path = [""] + [p for p in sys.path[1:] if Path(p or ".").resolve() != HERE.parent]
        umask = os.umask(0o22)
        os.umask(umask)
        _send(sock, {"args": args, "env": dict(os.environ), "cwd": os.getcwd(), "path": path, "umask": umask},
              fds=(0, 1, 2))
        sock.settimeout(START_S)
        (reply, _) = _recv(sock)
        sock.settimeout(None)
    except Exception:           # the plain kernel, as Jupyter would have started it
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *args])
    pid = reply["pid"]
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(pid, signum))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        (status, _) = _recv(sock)
    except (ConnectionError, OSError, ValueError):
        status = {"code": 1}
    if status.get("signal"):
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    os._exit(status.get("code", 1))


def _exit_with_parent(parent: int) -> None:
    """Exit when the process that started this one goes, as ipykernel's own poller exits the kernel."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _forward(pid: int, signum: int) -> None:
    """To the kernel's process group (its session's: it and what it started), as Jupyter signals a kernel's."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- the zygote
def serve(address: bytes) -> None:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(address)
    except OSError:             # another client started one first
        return
    srv.listen(64)
    for name in PRELOAD:
        __import__(name)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    kids: dict[int, socket.socket] = {}
    idle_since = time.monotonic()
    while kids or time.monotonic() - idle_since < IDLE_S:
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is srv:
                conn, _ = srv.accept()
                pid = _fork(conn, (sel, srv, *kids.values()))
                if pid:
                    kids[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
            else:                   # the client went (its kernel has not exited): the kernel goes too
                _forward(key.data, signal.SIGKILL)
                sel.unregister(key.fileobj)
        while kids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            conn = kids.pop(pid, None)
            if conn is not None:
                try:
                    sel.unregister(conn)
                except KeyError:
                    pass
                try:
                    _send(conn, {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                          else {"code": os.WEXITSTATUS(status)})
                except OSError:
                    pass
                conn.close()
            idle_since = time.monotonic()


def _fork(conn, inherited) -> int:
    try:
        conn.settimeout(10)
        req, fds = _recv(conn, with_fds=True)
        conn.settimeout(None)
    except Exception:
        conn.close()
        return 0
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        _send(conn, {"pid": pid})
        return pid
    code = 1
    try:
        for held in (conn, *inherited):      # the zygote's: a client's end must close when the client goes
            held.close()
        os.setsid()
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(req["cwd"])
        os.umask(req["umask"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = req["path"]
        # the poller watches this zygote, as a plain kernel watches the process that started it
        sys.argv = ["ipykernel_launcher", *req["args"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()      # a fresh process's draw, not the zygote's
        import runpy
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            import atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def write_spec(root: Path) -> Path:
    """The kernelspec folder (a JUPYTER_PATH entry) whose "python3" kernel is this file."""
    folder = root / "kernels" / "python3"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, str(HERE), "-f", "{connection_file}"], "language": "python",
            "display_name": "Python 3 (ipykernel)", "metadata": {"debugger": True}}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return root


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(bytes.fromhex(sys.argv[2]))
    elif sys.argv[1:2] == ["--spec"]:
        print(write_spec(Path(sys.argv[2]).resolve()))
    else:
        client(sys.argv[1:])
