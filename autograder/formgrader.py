"""Manual grading: nbgrader's formgrader on the grading workspace, in JupyterLab, on loopback.

    python -m autograder formgrader [--workspace DIR] [--port 8890] [--no-browser]

nbgrader reads its configuration from the folder the server starts in, and the formgrader wants
the course (this repository) inside the server's root: so JupyterLab starts in ``autograder/``
(where ``nbgrader_config.py`` is), serves the repository, and reads the workspace's gradebook
(``FACOURSE_WORKSPACE``). It listens on 127.0.0.1 only, with a token: open the printed ``/lab?token=``
address first (the formgrader's own pages do not take the token; JupyterLab logs the browser in),
then Nbgrader > Formgrader. On a remote grading machine, reach it through an SSH tunnel
(``ssh -L 8890:127.0.0.1:8890 host``). Grades and comments saved
there go to the workspace's ``gradebook.db``; ``report`` and ``export`` show them, and
``autograde`` keeps them.
"""
from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from pathlib import Path

from .model import DEFAULT_WORKSPACE, HERE, ROOT, GradingError


def lab_command(workspace: Path, port: int, token: str, browser: bool = False) -> tuple[list[str], dict, Path]:
    """(argv, environment, folder to start in) of the JupyterLab that serves the formgrader."""
    workspace = workspace.resolve()
    if not (workspace / "gradebook.db").is_file():
        raise GradingError(f"no gradebook at {workspace / 'gradebook.db'}: run `python -m autograder "
                           f"--workspace {workspace} autograde SUBMITTED` first")
    cmd = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
           f"--ServerApp.root_dir={ROOT}", f"--IdentityProvider.token={token}"]
    if not browser:
        cmd.append("--no-browser")
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, FACOURSE_WORKSPACE=str(workspace))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return cmd, env, HERE


def main(argv: list[str] | None = None, workspace: Path | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder formgrader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if workspace is None:
        p.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE)
    p.add_argument("--port", type=int, default=8890)
    p.add_argument("--no-browser", action="store_true", help="print the address only")
    args = p.parse_args(argv)
    ws = (workspace or args.workspace).resolve()
    token = secrets.token_hex(16)
    try:
        cmd, env, cwd = lab_command(ws, args.port, token, browser=not args.no_browser)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"formgrader on {ws / 'gradebook.db'}: open\n  http://127.0.0.1:{args.port}/lab?token={token}\n"
          "then Nbgrader > Formgrader (or, in the same browser, /formgrader). Ctrl-C stops it. Grades and "
          "comments saved there appear in `python -m autograder report` and `export`.", flush=True)
    try:
        return subprocess.call(cmd, env=env, cwd=cwd)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
