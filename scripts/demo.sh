#!/usr/bin/env bash
# Set everything up, then build Llama-3-70B under fake tensors on cuda:0, record fwd+bwd,
# print the analysis summary, and write fakeviz-demo.fvz + fakeviz-demo.html (the explorer, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m fakeviz demo "$@"
