#!/usr/bin/env bash
# Set everything up, then build Llama-3-70B under fake tensors on cuda:0, record fwd+bwd,
# print per-device peak and per-phase op counts, and write fakeviz-demo.fvz + fakeviz-demo.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m fakeviz demo "$@"
