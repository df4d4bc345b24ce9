#!/usr/bin/env bash
# The recorder's tests again under the Python recorder (FAKEVIZ_PURE_PYTHON=1: what records where no C compiler
# exists, Note: [recorder core in C]), so both recorders stay tested: .ci/run calls it after the main suite, which
# records with the C core. Pytest arguments are passed on (`-k`, `-x`, ...); workers as scripts/test.sh.
#
#   bash scripts/test_python_recorder.sh -q
#
# Which files: those that exercise the recorder itself (its state, storages, saved tensors and backward, modules,
# threads, op failures, the fake-equals-real truth test). The whole of tests/engine under the Python recorder took
# over 25 minutes serially on the 2-core machine (a third of the suite's budget); the other engine tests (libraries,
# models, attention kernels, quantization, flops, export) record through the same recorder paths these cover.
# test_native_core.py and test_native_contract.py are not here: they choose the recorder per test themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=(
  tests/engine/test_recorder.py tests/engine/test_fake_equals_real.py tests/engine/test_threads.py
  tests/engine/test_checkpoint.py tests/engine/test_foreach.py tests/engine/test_deepcopy.py
  tests/engine/test_foreign_fake.py tests/engine/test_meta_to_fake.py tests/engine/test_oplog.py
  tests/engine/test_data_dependent.py tests/engine/test_sparse.py
)
FAKEVIZ_PURE_PYTHON=1 exec bash scripts/test.sh "${FILES[@]}" "$@"
