#!/usr/bin/env bash
# Set everything up, then run the whole test suite (or what the pytest arguments select) on one pytest-xdist worker
# per core, at most 4 (scripts/xdist.sh: FAKEVIZ_TEST_WORKERS=N for N; `-n 0` or `-p no:xdist` runs serially).
#
#   bash scripts/test.sh                  # everything, what .ci/run runs first
#   bash scripts/test.sh tests/core -q    # one folder
#   bash scripts/test.sh -n 0 -k flops    # serially
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/xdist.sh
xdist_args .venv/bin/python "$@"
exec .venv/bin/python -m pytest ${XDIST[@]+"${XDIST[@]}"} "$@"
