# Sourced by scripts/test.sh and scripts/test_torch.sh: `xdist_args PYTHON [pytest args]` sets XDIST, the
# pytest-xdist arguments a run starts with: one worker per core (at most 4; FAKEVIZ_TEST_WORKERS=N sets N),
# `--dist loadfile` (a test file stays on one worker; tests/conftest.py keeps each tutorial's tests together and
# runs them first: Note: [the suite under xdist]). None when the arguments choose for themselves (-n/--numprocesses,
# --dist, --tx, -p no:xdist, --pdb, --trace, --collect-only), with one core, or without pytest-xdist.
xdist_args() {
  XDIST=()
  local py="$1" a n
  shift
  for a in "$@"; do
    case "$a" in
      -n | -n[0-9]* | -nauto | -nlogical | --numprocesses | --numprocesses=* | --dist | --dist=* | --tx | --tx=* | \
        no:xdist | -pno:xdist | --pdb | --trace | --co | --collect-only) return 0 ;;
    esac
  done
  n="${FAKEVIZ_TEST_WORKERS:-}"
  if [ -z "$n" ]; then
    n="$(nproc 2>/dev/null || echo 1)"
    [ "$n" -gt 4 ] && n=4
  fi
  if [ "$n" -ge 2 ] && "$py" -c 'import xdist' 2>/dev/null; then
    XDIST=(-n "$n" --dist loadfile)
  fi
  return 0
}
