#!/usr/bin/env bash
# The user's journey: what a new user installs and runs, from the built wheel, on the torch `pip install torch` gives.
#
#   bash scripts/test_journey.sh                   # every step
#   bash scripts/test_journey.sh demo kernel       # the environment and wheel steps, then only these
#   JOURNEY_TORCH=torch==2.14.1 bash scripts/test_journey.sh   # another torch than the newest (same environment)
#   bash scripts/test_journey.sh prepare           # the environment, wheel and install steps only (.ci/run makes
#                                                  # them while the main suite runs; a later run redoes them fast)
#
# Steps, in order; the first that fails stops the run (exit status non-zero, the step, its exit status and time):
#   env     .venv-journey (git-ignored, kept between runs) with the newest torch and pip the index serves
#           (PIP_CONFIG_FILE=/dev/null: not this machine's pip configuration, which caps torch; a CUDA build on
#           Linux, run here without a GPU); pip's cache keeps the download
#   wheel   `pip wheel --no-deps` of a copy of the checkout's files (tracked and untracked, not ignored: a fresh
#           clone, so hatch-jupyter-builder runs `npm install` and `npm run build` in js/); the wheel must carry
#           fakeviz/static/explorer.js
#   install that wheel with its [hf] extra, ipykernel and nbclient, reinstalled on every run (never editable);
#           fakeviz must import from the environment's site-packages
#   demo    `python -m fakeviz demo`; it writes fakeviz-demo.fvz and fakeviz-demo.html
#   kernel  one `%%fake --device cuda:0` cell in a real kernel of the environment (tests/journey/fake_cell.py):
#           no error and nothing on stderr
#   cli     the README's `fakeviz ...` command lines (tests/journey/readme.py reads them at run time), as written;
#           each file they name with --html or --json must be written
#   readme  the README's python blocks, concatenated into one plain script without a `__main__` guard
#           (tests/journey/readme.py) and run with `python readme_examples.py`; it must start once (a pool worker
#           that re-imports the user's script would start it again)
# Every step after `install` runs in its own empty temporary folder (so `import fakeviz` cannot find this
# checkout) with the user's defaults: no FAKEVIZ_* variable, no PYTHONPATH. Each command gets at most
# JOURNEY_TIMEOUT seconds (default 1800). Timings go to stdout per step and as a table at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv-journey"
LIMIT="${JOURNEY_TIMEOUT:-1800}"
TORCH="${JOURNEY_TORCH:-torch}"
ALL=(demo kernel cli readme)
if [ $# -gt 0 ]; then WANT=("$@"); else WANT=("${ALL[@]}"); fi
[ "${WANT[*]}" = prepare ] && WANT=()
for s in ${WANT[@]+"${WANT[@]}"}; do
  case " ${ALL[*]} " in *" $s "*) ;; *) echo "journey: unknown step '$s' (steps after the install: ${ALL[*]})" >&2; exit 2;; esac
done

# what a user has: pip's defaults (no machine-wide configuration, no extra wheel folder), fakeviz's defaults
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PYTHONPATH
while read -r v; do unset "$v"; done < <(compgen -e | grep '^FAKEVIZ_' || true)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fakeviz-journey.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
TIMES=()
t_all=$(date +%s)

# step NAME: runs the function step_NAME in a subshell with `set -e`, times it, stops the run when it fails
step() {
  local name=$1 t rc
  echo "journey: [$name] start ($(date -u +%H:%M:%S) UTC)"
  t=$(date +%s)
  set +e
  (set -euo pipefail; "step_$name")
  rc=$?
  set -e
  t=$(( $(date +%s) - t ))
  TIMES+=("$(printf '  %-8s %5d s' "$name" "$t")")
  if [ $rc -ne 0 ]; then
    local why="exit status $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="over JOURNEY_TIMEOUT=$LIMIT s (exit status $rc)"
    echo "journey: FAILED at step '$name' after $t s: $why (output above)" >&2
    printf '%s\n' "${TIMES[@]}" >&2
    exit 1
  fi
  echo "journey: [$name] ok in $t s"
}

# run CMD...: one command of a step, under the time limit, in the environment (as if activated)
run() { PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV" timeout --kill-after=30 "$LIMIT" "$@"; }

# a fresh empty folder for one step
fresh() { mktemp -d "$WORK/$1.XXXXXX"; }

step_env() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  # --upgrade: the newest release the index serves, as a new user's `pip install torch` would get today
  run "$VENV/bin/python" -m pip install -q --upgrade pip "$TORCH"
  run "$VENV/bin/python" -c 'import sys, torch; print("journey: python", sys.version.split()[0], "torch", torch.__version__, "cuda available:", torch.cuda.is_available())'
}

step_wheel() {
  local src="$WORK/src" n
  mkdir -p "$src" "$WORK/dist"
  # the checkout's own files as a clone has them (no fakeviz/static, no js/node_modules); a file deleted in the
  # work tree but not yet in git is skipped
  git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -cf - -T - 2>/dev/null | tar -xf - -C "$src"
  run "$VENV/bin/python" -m pip wheel -q --no-deps "$src" -w "$WORK/dist"
  n=$(ls "$WORK"/dist/fakeviz-*.whl | wc -l)
  [ "$n" -eq 1 ] || { echo "journey: expected one fakeviz wheel in $WORK/dist, found $n" >&2; exit 1; }
  "$VENV/bin/python" - "$WORK"/dist/fakeviz-*.whl <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
missing = [f for f in ("fakeviz/static/explorer.js", "fakeviz/static/explorer.css") if f not in names]
if missing:
    sys.exit(f"journey: the wheel {sys.argv[1]} lacks {missing}: the explorer would not load (npm run build in js/)")
print(f"journey: {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, explorer bundle included")
EOF
}

step_install() {
  local whl
  whl=$(ls "$WORK"/dist/fakeviz-*.whl)
  # dependencies at their newest (eager), as a fresh environment would have them; then this wheel, reinstalled even
  # when the version is unchanged (the previous run's files must not stay)
  run "$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager "fakeviz[hf] @ file://$whl" ipykernel nbclient \
    "torch==$(run "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
  run "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$whl"
  ( cd "$(fresh install)" && run python - "$VENV" <<'EOF'
import importlib.metadata as md, pathlib, sys
import fakeviz
where = pathlib.Path(fakeviz.__file__).resolve()
venv = pathlib.Path(sys.argv[1]).resolve()
if venv not in where.parents or "site-packages" not in where.parts:
    sys.exit(f"journey: fakeviz imports from {where}, not from {venv}'s site-packages")
if not (where.parent / "static" / "explorer.js").is_file():
    sys.exit("journey: the installed fakeviz has no static/explorer.js")
print(f"journey: fakeviz {md.version('fakeviz')} from {where.parent}; torch {md.version('torch')}, "
      f"transformers {md.version('transformers')}")
EOF
  )
}

step_demo() {
  cd "$(fresh demo)"
  run python -m fakeviz demo
  for f in fakeviz-demo.fvz fakeviz-demo.html; do
    [ -s "$f" ] || { echo "journey: python -m fakeviz demo did not write $f" >&2; exit 1; }
  done
}

step_kernel() {
  local dir
  dir=$(fresh kernel)
  cd "$dir"
  run python "$ROOT/tests/journey/fake_cell.py" "$dir"
}

step_cli() {
  local n=0 cmd f t
  cd "$(fresh cli)"
  while IFS= read -r cmd; do
    n=$((n + 1))
    echo "journey: \$ $cmd"
    t=$(date +%s)
    run bash -c "$cmd"
    echo "journey: (command $n took $(( $(date +%s) - t )) s)"
    for f in $(grep -oE -- '--(html|json) [^ ]+' <<<"$cmd" | cut -d' ' -f2); do
      [ -s "$f" ] || { echo "journey: '$cmd' did not write $f" >&2; exit 1; }
    done
  done < <("$VENV/bin/python" "$ROOT/tests/journey/readme.py" commands)
  [ "$n" -gt 0 ]
}

step_readme() {
  local starts
  cd "$(fresh readme)"
  "$VENV/bin/python" "$ROOT/tests/journey/readme.py" python readme_examples.py
  run python readme_examples.py 2>&1 | tee readme.log
  starts=$(grep -c '^journey: the README script starts in process' readme.log || true)
  if [ "$starts" -ne 1 ]; then
    echo "journey: the README script started $starts times: a worker process ran the user's script again" >&2
    exit 1
  fi
}

step env
step wheel
step install
for s in ${WANT[@]+"${WANT[@]}"}; do step "$s"; done
echo "journey: every step passed in $(( $(date +%s) - t_all )) s:"
printf '%s\n' "${TIMES[@]}"
