#!/usr/bin/env bash
# Build the documentation site (docs/, mkdocs.yml) in strict mode: a broken link, a reference to a name the
# code no longer has or a docstring griffe cannot read fails the build. .ci/run calls it.
#
#   bash scripts/docs.sh                 # build into site/ (git-ignored)
#   bash scripts/docs.sh --site-dir DIR  # mkdocs build's arguments
#   bash scripts/docs.sh serve           # live preview on http://127.0.0.1:8000
#
# The pages import fakeviz (the CLI reference is read from its argparse parsers, fv.record's signature from the
# imported function), so the docs tools go into .venv (made by scripts/setup.sh, as the test commands do), from
# pyproject's `docs` extra: installed here, on first use and when pyproject.toml changes, never by setup.sh, so
# the main setup stays as fast as it was. The notebooks are rendered from their stored outputs, never executed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
STAMP=.venv/.fakeviz-docs-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  # the extra's requirements only: fakeviz itself is installed already (editable), and reinstalling it would
  # rebuild the explorer's bundle
  .venv/bin/python - <<'PY' >.venv/docs-requirements.txt
import tomllib

print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))
PY
  .venv/bin/python -m pip install -q -r .venv/docs-requirements.txt
  touch "$STAMP"
fi
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's banner about MkDocs 2 (the extra pins mkdocs < 2)
if [ "${1:-}" = serve ]; then
  shift
  exec .venv/bin/mkdocs serve "$@"
fi
exec .venv/bin/mkdocs build --strict "$@"
