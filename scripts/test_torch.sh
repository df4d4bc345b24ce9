#!/usr/bin/env bash
# The engine on another torch than the pinned CPU wheel: by default what a user gets from `pip install torch`
# (the newest default wheel the package index serves; on Linux a CUDA build, which here runs without a GPU).
#
#   bash scripts/test_torch.sh                 # newest default torch
#   bash scripts/test_torch.sh torch==2.11.0   # any other requirement
#   bash scripts/test_torch.sh torch -k attention -x   # pytest arguments after the requirement
#   bash scripts/test_torch.sh torch -x tests/engine/test_torch_contract.py   # test paths: these instead of the set
#   bash scripts/test_torch.sh torch --prepare   # the environment only (.ci/run makes it while the main suite runs)
#
# In its own virtual environment (.venv-torch-<requirement>, git-ignored, kept between runs; pip's cache keeps the
# wheels): installs the requirement, then fakeviz[test] with that torch kept (for the default, both from the package
# index as a user's pip sees it: PIP_CONFIG_FILE=/dev/null sets aside this machine's pip configuration, whose local
# indexes cap torch below the newest release); runs the demo (python -m fakeviz
# demo, on fake cuda:0), then one pytest run of the tutorials' own checks (tests/notebook/test_tutorial_[0-9]*.py,
# in this environment's kernel), tests/engine, tests/analysis and the README's code blocks (tests/docs/test_readme.py:
# on the torch users get; .ci/run's main job leaves them to this one), on pytest-xdist workers as scripts/test.sh
# does (scripts/xdist.sh). .ci/run calls it after the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SPEC="${1:-torch}"
shift || true
PREPARE=0
if [ "${1:-}" = --prepare ]; then PREPARE=1; shift; fi
NAME="$(printf '%s' "$SPEC" | tr -c 'A-Za-z0-9._-' '-')"
[ "$SPEC" = torch ] && NAME=newest
VENV=".venv-torch-$NAME"
# the default tests what `pip install torch` gives users: no pip configuration file (os.devnull: pip reads none)
PIP=("$VENV/bin/python" -m pip)
[ "$SPEC" = torch ] && PIP=(env PIP_CONFIG_FILE=/dev/null "${PIP[@]}")
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "${PIP[@]}" install -q --upgrade pip
fi
# --upgrade: an unpinned requirement follows the index (a new torch release is picked up on the next run)
"${PIP[@]}" install -q --upgrade "$SPEC"
# the distribution's version (2.15.0 for the default wheel, whose torch.__version__ says 2.15.0+cu132): what pip pins
TORCH="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
STAMP="$VENV/.fakeviz-installed"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ "$(cat "$STAMP")" != "$TORCH" ]; then
  "${PIP[@]}" install -q -e ".[test]" "torch==$TORCH"
  printf '%s' "$TORCH" > "$STAMP"
fi
echo "test_torch: $SPEC -> torch $TORCH in $VENV (setup $(( $(date +%s) - start )) s)"
[ "$PREPARE" = 1 ] && exit 0
"$VENV/bin/python" -c 'import fakeviz; s = fakeviz.fake_cuda_status(); print("fake cuda:", s.mode, "-", s.reason)'

start=$(date +%s)
"$VENV/bin/python" -m fakeviz demo
echo "test_torch: demo on torch $TORCH took $(( $(date +%s) - start )) s"

# the tutorials run in this environment's own kernel (nbrun's "dev" kernel), not in the Binder one (the pinned torch),
# each from a process that has run nothing else: a kernel started from one that ran the engine tests inherits its
# peak RSS (Linux keeps ru_maxrss across exec), and tutorial 02 checks its own peak (seen: 1.73 GiB after
# tests/engine, under 1.5 alone). Under xdist tests/conftest.py runs the tutorials first on each worker (Note: [the
# suite under xdist]); serially (-n 0) they run first because they are named first.
# A test path among the pytest arguments (a file or folder that exists, with or without ::test) runs instead of
# that set.
TESTS=(tests/notebook/test_tutorial_[0-9]*.py tests/engine tests/analysis tests/docs/test_readme.py)
for arg in "$@"; do
  [[ "$arg" != -* && -e "${arg%%::*}" ]] && TESTS=() && break
done
source scripts/xdist.sh
xdist_args "$VENV/bin/python" "$@"
FAKEVIZ_NB_KERNEL=dev exec "$VENV/bin/python" -m pytest ${XDIST[@]+"${XDIST[@]}"} ${TESTS[@]+"${TESTS[@]}"} "$@"
