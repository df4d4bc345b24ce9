#!/usr/bin/env bash
# The recorder's tests again under the Python recorder (FAKEVIZ_PURE_PYTHON=1: what records where no C compiler
# exists, Note: [recorder core in C]): .ci/run calls it after the main suite, which records with the C core and
# compares the two recorders column by column on every zoo model (tests/engine/test_native_core.py). Pytest
# arguments are passed on (`-k`, `-x`, ...); a test path among them runs instead of the set; workers as
# scripts/test.sh.
#
#   bash scripts/test_python_recorder.sh -q
#   bash scripts/test_python_recorder.sh -q tests/engine    # the whole engine suite
#
# Which files: those whose subject is what a recording holds (ops, storages, devices, threads, data-dependent
# values, the fake == real and GPU golden comparisons), not the engine's other parts (the hub, checkpoints,
# quantization libraries, patches), whose code is the same under either recorder; the tests of the C core itself
# (the c_core fixture, the recorder fixture's "c" parameter) skip.
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=(tests/engine/test_recorder.py tests/engine/test_oplog.py tests/engine/test_fake_equals_real.py
       tests/engine/test_real_models.py tests/engine/test_devices.py tests/engine/test_gpu_golden.py
       tests/engine/test_h100_holdout.py tests/engine/test_data_dependent.py tests/engine/test_threads.py
       tests/engine/test_foreach.py tests/engine/test_sparse.py tests/engine/test_attention.py
       tests/engine/test_tracing_branches.py tests/engine/test_moe.py tests/engine/test_native_contract.py)
for arg in "$@"; do
  [[ "$arg" != -* && -e "${arg%%::*}" ]] && TESTS=() && break
done
FAKEVIZ_PURE_PYTHON=1 exec bash scripts/test.sh ${TESTS[@]+"${TESTS[@]}"} "$@"
