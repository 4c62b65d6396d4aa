#!/usr/bin/env bash
# One entry point for a fresh machine with Python 3.11+:
#   ./course.sh demo    set up .venv, regenerate the release, autograde the bundled samples (CPU),
#                       print the grade table
#   ./course.sh test    set up .venv and run the CPU test suite
#   ./course.sh setup   only set up .venv
# Environment: PYTHON (interpreter, default python3), VENV (default .venv), TORCH_SPEC (the pip
# requirement used for PyTorch when it is missing, default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

setup() {
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: $PYTHON is not Python 3.11 or newer (set PYTHON=...)" >&2; exit 2
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  local py="$VENV/bin/python"
  local stamp="$VENV/.facourse-installed"
  if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    return
  fi
  echo "installing into $VENV (a few minutes the first time)"
  pip_q() { "$py" -m pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
  "$py" -c 'import torch' 2>/dev/null || pip_q "$TORCH_SPEC"
  pip_q -e ".[dev]"
  "$py" -c 'import torch, nbgrader, facourse' || { echo "error: installation failed" >&2; exit 1; }
  touch "$stamp"
}

cmd=${1:-demo}
need() {  # the student archive ships neither the grading side nor the course's own tests
  [ -e "$1" ] || { echo "'$cmd' needs $1/, which the student archive does not include; './course.sh setup' works" >&2; exit 2; }
}
case "$cmd" in
  setup) setup ;;
  demo) need autograder; setup; exec "$VENV/bin/python" -m autograder demo ;;
  test) need tests; setup; shift || true; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  *) echo "usage: ./course.sh [demo|test|setup] [pytest args]" >&2; exit 2 ;;
esac
