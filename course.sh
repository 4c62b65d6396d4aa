#!/usr/bin/env bash
# One entry point for a fresh machine with Python 3.11+.
#
#   ./course.sh setup        create .venv and install PyTorch, Triton, JupyterLab and the course library
#   ./course.sh lab          set up, then open JupyterLab in this folder (extra arguments go to jupyter lab)
#   ./course.sh check        set up, then check this machine: versions, GPU, which steps run here
#   ./course.sh check NN     set up, then run exercise NN's notebook headless and report its visible tests
# In the course repository, besides:
#   ./course.sh demo         autograde the sample submissions of every CPU step (CPU), print the grades
#   ./course.sh test [ARGS]  run the CPU test suite (in parallel; ARGS go to pytest)
#   ./course.sh book [ARGS]  build the course as a book, lectures executed (build/book; ARGS go to tools/book.py)
#
# Environment: PYTHON (interpreter, default python3), VENV (default .venv), TORCH_SPEC (the pip
# requirement used for PyTorch when it is missing, default torch==2.13.0), EXTRAS (what to
# install: `dev` in the repository (`demo` for ./course.sh demo), `student` in the student archive), OFFLINE=1 (install
# nothing: use $VENV as it is, and fail if it lacks something), USE_UV=0 (install with pip alone),
# FAST_KERNELS=0 (`test`: Jupyter's own kernels instead of forked ones).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# FlashInfer-Bench (step 11), installed without its dependencies: they would pull in flashinfer-python
# (about 2 GB with its own), which the course does not use; what it imports is in pyproject.toml.
FIB_SPEC=${FIB_SPEC:-flashinfer-bench==0.1.2}
OFFLINE=${OFFLINE:-0}

# The student archive (python -m autograder bundle) has neither the grading side nor the tests.
if [ -d autograder ] && [ -d tests ]; then REPO=1; else REPO=0; fi
EXTRAS_GIVEN=${EXTRAS:-}
if [ "$REPO" = 1 ]; then EXTRAS=${EXTRAS:-dev}; else EXTRAS=${EXTRAS:-student}; fi
PY="$VENV/bin/python"

setup() {
  if [ "$OFFLINE" = 1 ]; then
    [ -x "$PY" ] || { echo "error: OFFLINE=1 but $PY does not exist" >&2; exit 2; }
    # found, not imported: importing them all cost each command 7 CPU-seconds before it began
    "$PY" -c 'import importlib.util as u, sys
gone = [m for m in ("torch", "facourse", "nbclient", "ipykernel", "flashinfer_bench") if u.find_spec(m) is None]
sys.exit("missing: " + ", ".join(gone) if gone else 0)' \
      || { echo "error: OFFLINE=1 but $VENV lacks a package (see above)" >&2; exit 1; }
    return
  fi
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: $PYTHON is not Python 3.11 or newer (set PYTHON=...)" >&2; exit 2
  fi
  if [ ! -x "$PY" ]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # The stamp records what was installed and from which pyproject.toml: set-up runs pip again
  # only when either changed (`dev` includes everything `student` has).
  local stamp="$VENV/.facourse-installed" want have
  want="$EXTRAS $FIB_SPEC $("$PY" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest()[:16])')"
  have=$(cat "$stamp" 2>/dev/null || true)
  if [ "$have" = "$want" ] || [ "$have" = "dev ${want#* }" ]; then
    return
  fi
  echo "installing into $VENV (a few minutes the first time)"
  # --no-compile, then one compileall on every core: pip byte-compiles on one core, and most of the
  # set-up's time went there (torch alone: 35 s instead of 12 s to install).
  pip_q() { "$PY" -m pip install --disable-pip-version-check --no-compile -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
  "$PY" -c 'import torch' 2>/dev/null || pip_q "$TORCH_SPEC"
  # PyTorch through pip (it reads pip's configuration: the CPU build where that names it); the rest through uv,
  # about a fifth of pip's time, or through pip where uv cannot be installed or fails (USE_UV=0: pip only)
  if [ "${USE_UV:-1}" = 1 ] && { "$PY" -m uv --version >/dev/null 2>&1 || pip_q uv; } \
     && "$PY" -m uv pip install --python "$PY" -q -e ".[$EXTRAS]" \
     && "$PY" -m uv pip install --python "$PY" -q --no-deps "$FIB_SPEC"; then
    :
  else
    pip_q -e ".[$EXTRAS]"
    pip_q --no-deps "$FIB_SPEC"
  fi
  "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null 2>&1 || true
  "$PY" -c 'import torch, facourse, nbclient, ipykernel, flashinfer_bench' || { echo "error: installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
}

check() {  # no argument: this machine; NN: exercise NN's visible tests, run headless
  "$PY" - "$@" <<'EOF'
import glob, os, sys, tempfile, time
import torch

args = sys.argv[1:]
if not args:
    import facourse
    from facourse import check_entry_point, reference_attention
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, facourse from {os.path.dirname(facourse.__file__)}")
    try:
        import triton
        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton: not installed (step 05 needs it: Linux only)")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})")
        steps = "01-05" + (", 06" if cap >= (8, 0) else "") + (", 07" if cap == (9, 0) else "")
    else:
        print("GPU: none; kernels run at CPU sizes, step 05 through Triton's interpreter")
        steps = "01-05 (06 and 07 need an NVIDIA GPU: sm_80+ for 06, sm_90a for 07)"
    print(f"exercises that run here: {steps}")
    ref = lambda q, k, v, causal=False, scale=None: reference_attention(q, k, v, causal=causal, scale=scale, dtype=q.dtype)[0]
    check_entry_point(ref, "small")  # the library checks its own reference: prints one line
    from jupyter_client.kernelspec import find_kernel_specs
    assert "python3" in find_kernel_specs(), "no python3 Jupyter kernel in this environment"
    print("ok: the notebooks can run here (./course.sh lab)")
    sys.exit(0)

import itertools

import nbformat
from nbclient import NotebookClient


def failure(ename, evalue):
    """A failed cell in a few lines, the cause first: the checks end their message with the likely
    cause, which a terminal would otherwise show last, after the figures."""
    lines = [ln.rstrip() for ln in evalue.splitlines() if ln.strip()]
    if ename == "NotImplementedError" and not lines:
        return ["a stub you have not filled in yet"]
    if not lines:
        return [ename]
    head = f"{ename}: {lines[0].strip()}"
    if lines[0].endswith(":") and len(lines) > 1:     # the first line only announces what follows
        head += " " + lines[1].strip()
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("likely cause:"):
            depth = len(ln) - len(ln.lstrip())
            more = itertools.takewhile(lambda c: len(c) - len(c.lstrip()) > depth, lines[i + 1:])
            cause = [ln.strip()] + [c.strip() for c in more]
            return [" ".join(cause), head]
    return [head]


def skipped(cell):
    """The reason a graded cell skipped its test on this machine (it printed "Skipped..."), or None."""
    for o in cell.outputs:
        if o.output_type == "stream" and o.get("name") == "stdout":
            for ln in o.text.splitlines():
                if ln.startswith("Skipped"):
                    return ln.split(":", 1)[-1].strip() if ":" in ln else ln
    return None


status = 0
for step in args:
    paths = sorted(glob.glob(f"exercises/{step}*/*.ipynb"))
    if len(paths) != 1:
        print(f"error: no single exercise notebook matches exercises/{step}*/", file=sys.stderr)
        sys.exit(2)
    path = paths[0]
    nb = nbformat.read(path, as_version=4)
    t0 = time.time()
    print(f"running {path} ...", flush=True)
    # the kernel's own start-up warnings (plain-TCP transport on localhost) say nothing about the exercise, nor
    # does the traceback its shutdown can log (a ZMQ socket already closed): its stderr is shown only if it dies
    with tempfile.TemporaryFile("w+") as kernel_err:
        try:
            NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
                           extra_arguments=["--IPKernelApp.log_level=ERROR"],
                           resources={"metadata": {"path": os.path.dirname(path)}}).execute(stderr=kernel_err)
        except Exception:
            kernel_err.seek(0)
            sys.stderr.write(kernel_err.read())
            raise
    failed = skips = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        name = meta.get("grade_id") or cell.get("id", "?")
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors:
            first, *rest = failure(errors[0].ename, errors[0].evalue)
            print(f"  FAIL  {name}: {first}")
            for ln in rest:
                print(f"        {ln}")
            failed += 1
        elif meta.get("grade") and "".join(cell.source).strip():
            hidden = all(l.lstrip().startswith("#") for l in cell.source.strip().splitlines())
            why = skipped(cell)
            if why is not None:
                print(f"  skip  {name}: {why} (0 points on this machine)")
                skips += 1
            elif not hidden:
                print(f"  pass  {name}")
    status = status or int(failed > 0)
    verdict = "some cells fail (above)" if failed else "visible tests pass"
    if skips:
        verdict += f", {skips} skipped here (they need a GPU this machine lacks)"
    print(f"{path}: {verdict} ({time.time() - t0:.0f} s); the hidden tests check more configurations")
sys.exit(status)
EOF
}

usage() {
  if [ "$REPO" = 1 ]; then
    echo "usage: ./course.sh [setup|lab|check [NN]|demo|test [pytest args]|book [--jobs N]]" >&2
  else
    echo "usage: ./course.sh [setup|lab|check [NN]]" >&2
  fi
  exit 2
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case "$cmd" in
  setup) setup ;;
  lab) setup; exec "$PY" -m jupyter lab "$@" ;;
  check) setup; check "$@" ;;
  demo)
    [ "$REPO" = 1 ] || usage
    EXTRAS=${EXTRAS_GIVEN:-demo}    # the `demo` extra: no book, no test tools (a `dev` .venv has it all)
    setup; exec "$PY" -m autograder demo ;;
  test)
    [ "$REPO" = 1 ] || usage
    setup
    # pytest-xdist: three workers on CI's 2 cores (PYTEST_WORKERS=N to change), each torch on one
    # thread: many tests wait on a subprocess (nbgrader, a kernel, nvcc), so a third worker fills
    # the cores. worksteal: an idle worker takes tests queued for a busy one, so the few long tests
    # (grading runs, lectures, the Triton interpreter) spread out. Shared fixtures are
    # session-scoped and cheap to build once per worker (conftest.student_archive).
    # The course's own modules are byte-compiled once first: the suite starts a few hundred Python
    # processes (nbgrader, kernels, runners), and where PYTHONDONTWRITEBYTECODE is set each would
    # compile facourse and autograder again (about 0.4 CPU-seconds each).
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
    # glibc's malloc gives each freed block over 32 MB back to the kernel, which zeroes the pages of the
    # next one: the tests' CPU tensors spent much of their time in page faults. Freed memory stays in the
    # process instead (no mmap per block; the heap trimmed past 4 GB): 43 -> 34 CPU-s for the 50 seeds
    # of steps 02 and 04, 19 -> 13 for test_planted_bugs_02 (2 cores, 2026-12-01).
    export MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-4294967296}
    "$PY" -m compileall -q -j 0 src autograder tests > /dev/null || true
    # Notebook kernels forked from one that has imported torch and ipykernel (tools/fast_kernel.py):
    # about 3.5 CPU-seconds fewer for each of the suite's kernels. FAST_KERNELS=0: Jupyter's own.
    if [ "${FAST_KERNELS:-1}" = 1 ]; then
      JUPYTER_PATH="$("$PY" tools/fast_kernel.py --spec "$VENV/share/fast_kernel")${JUPYTER_PATH:+:$JUPYTER_PATH}"
      export JUPYTER_PATH
    fi
    exec "$PY" -m pytest -q -n "${PYTEST_WORKERS:-3}" --dist worksteal "$@" ;;
  book)
    [ "$REPO" = 1 ] || usage
    setup
    # `dev` has Jupyter Book; an environment set up with other EXTRAS gets the `book` extra here, once.
    if ! "$PY" -c 'import jupyter_book' 2>/dev/null; then
      [ "$OFFLINE" = 1 ] && { echo "error: OFFLINE=1 but $VENV lacks jupyter-book (the book extra)" >&2; exit 1; }
      echo "installing Jupyter Book into $VENV"
      "$PY" -m pip install --disable-pip-version-check -q -e ".[book]" 2>&1 | grep -v "^WARNING: Location" || true
    fi
    export OMP_NUM_THREADS=1
    exec "$PY" tools/book.py "$@" ;;     # it ends naming the book's index.html (build/book/_build/html)
  *) usage ;;
esac
