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
# Which files: those that compare what a recording holds with the truth (fake == real op by op and byte by byte, the
# H200 and H100 golden op logs, the op log's text, real models, devices) and the Python recorder's own paths
# (threads, data-dependent values, sparse stand-ins, tracing branches): 312 s on a fresh clone. The rest of tests/engine runs code both recorders share (the C core takes only the common path
# of recording an op and packing saved tensors), and
# tests/engine/test_native_core.py, in the main suite, compares the two recorders' traces column by column on every
# zoo model, fake and real. The tests of the C core itself (the c_core fixture, the recorder fixture's "c"
# parameter) skip.
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=(tests/engine/test_fake_equals_real.py tests/engine/test_oplog.py tests/engine/test_gpu_golden.py
       tests/engine/test_threads.py tests/engine/test_data_dependent.py tests/engine/test_sparse.py
       tests/engine/test_recorder.py tests/engine/test_real_models.py tests/engine/test_devices.py
       tests/engine/test_h100_holdout.py tests/engine/test_foreach.py tests/engine/test_attention.py
       tests/engine/test_tracing_branches.py tests/engine/test_moe.py tests/engine/test_native_contract.py)
for arg in "$@"; do
  [[ "$arg" != -* && -e "${arg%%::*}" ]] && TESTS=() && break
done
FAKEVIZ_PURE_PYTHON=1 exec bash scripts/test.sh ${TESTS[@]+"${TESTS[@]}"} "$@"
