"""Reproducible grades: where the judge's seeds come from.

The rule:

* Every grading workspace holds one secret, ``<workspace>/.seed_secret`` (32 random bytes, made the
  first time a submission of that workspace is graded, readable by its owner only). It never leaves
  the grading side: the release is ``<workspace>/release``, the student archive is built from git's
  tracked files of course/, exercises/, src/ and a few top-level files, and neither holds it.
* A submission's judge gets ``seed_key = HMAC-SHA256(secret, student NUL assignment)``
  (:func:`seed_key_for`).
* Check ``i`` of test ``t`` draws its inputs from seed
  ``HMAC-SHA256(seed_key, assignment NUL t NUL i)``, its first 31 bits (``Judge._seed``).

So the same submission gets the same inputs, and the same grade, on every regrade in that workspace;
two students, or two assignments, get different inputs; and a student cannot compute the seeds
without the secret. A judge made without a key (``run_inprocess``'s default, the course's own tests)
draws fresh random seeds each call. Deleting the secret re-keys every later grade of the workspace.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_NAME = ".seed_secret"
SECRET_BYTES = 32


def workspace_secret(workspace: Path) -> bytes:
    """The workspace's secret, made once. Concurrent graders race safely: the secret is written to a
    private file first and linked into place, so every process reads the one that won."""
    workspace = Path(workspace)
    path = workspace / SECRET_NAME
    if not path.exists():
        workspace.mkdir(parents=True, exist_ok=True)
        tmp = workspace / f"{SECRET_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(SECRET_BYTES))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    secret = path.read_bytes()
    if len(secret) < 16:
        raise ValueError(f"{path} holds {len(secret)} bytes, too few for a secret: delete it to make a new one "
                         "(every later grade of this workspace then draws new inputs)")
    return secret


def seed_key_for(workspace: Path, student: str, assignment: str) -> bytes:
    """The judge's ``seed_key`` for ``student``'s ``assignment`` graded in ``workspace``."""
    msg = f"{student}\0{assignment}".encode()
    return hmac.new(workspace_secret(workspace), msg, hashlib.sha256).digest()
