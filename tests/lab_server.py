"""A JupyterLab server for the browser tests: started on loopback, waited for, stopped."""
from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from pathlib import Path


@contextlib.contextmanager
def running_lab(cmd: list[str], cwd, env: dict, port: int, token: str, log_path: Path, start_s: float = 120):
    """Runs ``cmd`` (a JupyterLab on 127.0.0.1:``port``, logging to ``log_path``) until its API answers;
    yields its base URL; stops it on exit."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_s
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"JupyterLab did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
