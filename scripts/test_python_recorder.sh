#!/usr/bin/env bash
# The recorder's tests again under the Python recorder (FAKEVIZ_PURE_PYTHON=1: what records where no C compiler
# exists, Note: [recorder core in C]), so both recorders stay tested: .ci/run calls it after the main suite, which
# records with the C core. Pytest arguments are passed on (`-k`, `-x`, ...); workers as scripts/test.sh.
#
#   bash scripts/test_python_recorder.sh -q
#
# Which files: the whole of tests/engine (3.3 min with two workers on the idle 2-core machine, 1229 passed); the
# tests of the C core itself (those that take the c_core fixture, and the recorder fixture's "c" parameter) skip,
# since the main suite runs them. An earlier measure of "over 25 minutes" was a serial run on a machine loaded 11 deep.
set -euo pipefail
cd "$(dirname "$0")/.."
FAKEVIZ_PURE_PYTHON=1 exec bash scripts/test.sh tests/engine "$@"
