#!/usr/bin/env bash
# Create .venv and install fakeviz with its test extra. Idempotent.
# torch is pinned to the CPU build 2.13.0 for dev and CI (any other version pulls GBs of CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.fakeviz-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]" "torch==2.13.0"
  touch "$STAMP"
fi
