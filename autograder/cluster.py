"""Grading across machines: each submission a task on a Ray cluster (``autograde --cluster ADDRESS``).

The machine that runs ``python -m autograder`` (the driver) stays the only writer of the gradebook
and of results/<student>/<assignment>.json. Each submission goes to the cluster as one task; the
task grades it on some node, in a private temporary folder, with the function a local worker uses
(:func:`grader.grade_submission`), so the judge runs there, beside the nbgrader kernel it serves.
What travels: with the task, the submission's files as bytes; once per run (Ray's object store),
the release of its assignment and the template gradebook. What comes back: the Result and, as
bytes, the graded notebooks and the staged copy, which the driver publishes and records as it does a
local worker's.

Every node needs the course checkout at the same commit and its grading environment, as a
grading machine does; a task refuses to grade on a node whose grading sources (``solutions/<a>``,
``thresholds.toml``, the judge's modules) hash differently from the driver's.

A submission whose assignment has a GPU test (``plans.py``: ``needs``) takes one GPU
(``num_gpus=1``: Ray sets its CUDA_VISIBLE_DEVICES, and the task runs in a fresh worker process),
the others one CPU. A task whose worker process or node dies is run again by Ray, up to
``retries`` times; one lost every time comes back ungraded (:data:`grader.UNGRADED`): nothing is
recorded for it, so the same command started again grades it, and no student gets a 0 from it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from . import grader
from .model import SOLUTIONS, GradingError, Result, atomic_write, hash_tree, result_path
from .seeds import seed_key_for

INSTALL = 'pip install "ray[default]"'
#: What one grading task asks of its node. GPU tasks: max_calls=1, a fresh worker process each, so
#: CUDA never starts in a process on another task's GPU.
OPTIONS = {"cpu": {"num_cpus": 1}, "gpu": {"num_cpus": 1, "num_gpus": 1, "max_calls": 1}}


def require_ray():
    """The ``ray`` module, or a GradingError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise GradingError(f"--cluster needs Ray, which is not installed here: {INSTALL} (the same "
                           "version on every node of the cluster)") from None
    return ray


def connect(address: str):
    """Join the Ray cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``) as a driver;
    a process already connected (``ray.init`` done) keeps its connection."""
    ray = require_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="WARNING")
        except Exception as err:          # Ray's own errors: no cluster there, wrong version, ...
            raise GradingError(f"cannot join the Ray cluster at {address!r}: {type(err).__name__}: "
                               f"{str(err).strip()[:500]}") from None
    return ray


def needs_gpu(assignment: str) -> bool:
    """Whether any graded cell of ``assignment`` needs a GPU (``needs`` in plans.py)."""
    from .plans import plan_of

    return any(t.needs for t in plan_of(assignment).values())


def pack(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (checkpoints and caches left out): relative path -> bytes."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not {".ipynb_checkpoints", "__pycache__"} & set(p.relative_to(folder).parts)}


def unpack(files: dict[str, bytes], folder: Path) -> None:
    """Write ``files`` (from :func:`pack`) under ``folder``, replacing what was there."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for rel, data in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            continue
        path = folder.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


# ----------------------------------------------------------------------------- on a node
def grade_task(student: str, a: str, key: str, source_key: str, files: dict[str, bytes],
               release: dict[str, bytes], template: bytes, timeout: float, cell_timeout: float | None,
               trusted: bool, seed_key: bytes, gpu: bool) -> tuple[dict, dict, str]:
    """Grade one submission on this node: (the Result as JSON, the files to keep, the node's name)."""
    node = socket.gethostname()
    if hash_tree(SOLUTIONS / a, *grader.GRADING_SOURCES) != source_key:
        raise GradingError(f"node {node} grades {a} with other sources than the machine that runs "
                           f"the command (solutions/{a}, thresholds.toml, plans.py, checks.py, judge.py, "
                           "scan.py): check out the same commit there")
    if gpu:     # Ray gave this task one GPU and made it the only one this process sees
        import ray

        visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, ray.get_gpu_ids()))
        gpu_id, gpu_index = visible, 0
    else:       # no GPU: nbgrader's kernel sees none either
        gpu_id, gpu_index = "", None
    base = Path(tempfile.gettempdir()) / f"facourse-grading-{os.getuid()}" / f"{student}__{a}"
    shutil.rmtree(base, ignore_errors=True)     # what an attempt killed earlier left here
    try:
        unpack(release, base / "release" / a)
        unpack(files, base / "submission")
        (base / "template.db").write_bytes(template)
        priv = base / "work"
        res = grader.grade_submission(base / "submission", priv, base / "release", base / "template.db",
                                       student, a, timeout=timeout, cell_timeout=cell_timeout, gpu=gpu_id,
                                       key=key, gpu_index=gpu_index, trusted=trusted, seed_key=seed_key)
        keep = {sub: pack(priv / sub / student / a) for sub in ("autograded", "submitted")}
        return res.to_json(), keep, node
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cpu_task(*args):
    return grade_task(*args, gpu=False)


def _gpu_task(*args):
    return grade_task(*args, gpu=True)


# ----------------------------------------------------------------------------- the driver
def grade(todo: list[tuple[str, str, str]], submissions: Path, workspace: Path, source_key: dict[str, str],
          *, limits: dict[str, tuple[float, float | None]], trusted, retries: int = 2, quiet: bool = False,
          stop=None):
    """Send each (student, assignment, key) of ``todo`` to the cluster (:func:`connect` first); yield
    (student, assignment, Result) as tasks finish, a graded one already published in ``workspace``
    (graded notebooks, staged copy, results/…json), a lost one with an ``ungraded: `` status.
    ``limits``: per assignment, the notebook's and a cell's time limits. When ``stop`` (an Event)
    is set, the tasks still running are cancelled and nothing more is yielded."""
    import ray

    UNGRADED = grader.UNGRADED

    has_gpu = ray.cluster_resources().get("GPU", 0) > 0
    gpu_todo = sorted({a for _, a, _ in todo if needs_gpu(a)})
    if gpu_todo and not has_gpu and not quiet:
        print(f"note: the cluster has no GPU: {', '.join(gpu_todo)} graded on CPUs (GPU tests score 0 "
              "and say so)", file=sys.stderr)
    retries = max(0, int(retries))
    cpu_task = ray.remote(**OPTIONS["cpu"], max_retries=retries)(_cpu_task)
    gpu_task = ray.remote(**OPTIONS["gpu"], max_retries=retries)(_gpu_task)
    template = ray.put((workspace / "work" / "template.db").read_bytes())
    release = {a: ray.put(pack(workspace / "release" / a)) for a in sorted({a for _, a, _ in todo})}
    tasks = {}
    for student, a, key in todo:
        task = gpu_task if has_gpu and a in gpu_todo else cpu_task
        ref = task.remote(student, a, key, source_key[a], pack(submissions / student / a), release[a],
                          template, *limits[a], student in trusted,
                          seed_key_for(workspace, student, a))   # the secret stays on this machine
        tasks[ref] = (student, a)
    pending = list(tasks)
    try:
        while pending and not (stop is not None and stop.is_set()):
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in done:
                student, a = tasks[ref]
                try:
                    out, keep, _node = ray.get(ref)
                except ray.exceptions.RayTaskError as err:     # our code raised on the node
                    cause = getattr(err, "cause", None) or err
                    res = Result(student, a, status=f"{UNGRADED}grader error on the cluster: "
                                 f"{type(cause).__name__}: {str(cause).strip()[:300]}")
                except ray.exceptions.RayError as err:         # its worker, node or object was lost
                    res = Result(student, a, status=f"{UNGRADED}the cluster lost its task "
                                 f"{retries + 1} time(s) ({type(err).__name__}); run the command "
                                 "again to grade it")
                else:
                    res = Result.from_json(out)
                if not res.status.startswith(UNGRADED):
                    for sub in ("autograded", "submitted"):
                        unpack(keep[sub], workspace / sub / student / a)
                    atomic_write(result_path(workspace, student, a), json.dumps(res.to_json(), indent=1))
                yield student, a, res
    finally:
        for ref in pending:     # interrupted: nothing of this run goes on running on the cluster
            ray.cancel(ref, force=True)
