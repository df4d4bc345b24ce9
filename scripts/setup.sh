#!/usr/bin/env bash
# Create .venv and install fakeviz with its test extra. Idempotent.
# torch is pinned to the CPU build 2.13.0 for dev and CI (any other version pulls GBs of CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# Debian's Chromium for the real-browser tests (tests/browser/test_browser.py, benchmarks/explorer.py): the
# playwright package drives it and never downloads a browser of its own. apt-get installs it when it
# is missing and we are root; elsewhere the browser tests are skipped, saying why. CI must have it.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium for the browser tests (apt-get)"
    APT_LOG="$(mktemp)"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
             chromium fonts-liberation fonts-dejavu-core; } >"$APT_LOG" 2>&1; then
      tail -n 20 "$APT_LOG" >&2
      echo "setup: apt-get could not install chromium" >&2
    fi
    rm -f "$APT_LOG"
  else
    echo "setup: note: chromium is not installed and cannot be installed here (that needs root and apt-get):" \
         "the browser tests in tests/browser/test_browser.py will be skipped" >&2
  fi
  if [ ! -x /usr/bin/chromium ] && [ -n "${CI:-}" ] && [ "${CI}" != false ] && [ "${CI}" != 0 ]; then
    echo "setup: CI runs the browser tests, and chromium could not be installed" >&2
    exit 1
  fi
fi
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
