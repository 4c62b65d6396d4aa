"""One grading run per workspace: a second run waits for the first, or refuses and says who holds it.

The lock is ``flock`` on ``<workspace>/.grading.lock``: the kernel releases it when the holder
exits, however it exits (SIGKILL included), so a crashed run never leaves a stale lock behind.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from .model import GradingError

LOCK_NAME = ".grading.lock"


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "a run that is starting"
    return (f"pid {info.get('pid')}, started {info.get('started')}: "
            f"{info.get('command', '?')}")


@contextlib.contextmanager
def workspace_lock(workspace: Path, wait: bool = False, quiet: bool = False):
    """Hold the workspace for this run; ``wait``: queue behind a run that holds it, else refuse."""
    workspace.mkdir(parents=True, exist_ok=True)
    path = workspace / LOCK_NAME
    f = open(path, "a+", encoding="utf-8")
    held = False
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(path)
            if not wait:
                raise GradingError(f"another grading run is using the workspace {workspace} ({who}); "
                                   "nothing was graded. Wait for it to finish, or add --wait to start "
                                   "when it does") from None
            if not quiet:
                print(f"waiting for the grading run that holds {workspace} ({who}) ...", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        held = True
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "command": " ".join(["python -m autograder", *sys.argv[1:]])
                            if sys.argv and sys.argv[0].endswith("__main__.py") else " ".join(sys.argv)}))
        f.flush()
        yield
    finally:
        if held:        # the holder's line goes with it; a refused run leaves it alone
            with contextlib.suppress(OSError):
                f.seek(0)
                f.truncate()
        f.close()           # releases the lock
