#!/usr/bin/env bash
# The test command (README and CI run exactly this): install into ./.venv if needed, then the whole suite on CPU.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest -q "$@"
