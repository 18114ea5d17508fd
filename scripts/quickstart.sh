#!/usr/bin/env bash
# One command on a fresh machine: install into ./.venv, then run the main job on its embedded CPU default
# (builds the toy base model on first use, starts a local sandbox, trains with REINFORCE++ on the CPU).
#   bash scripts/quickstart.sh [extra fit args, e.g. --trainer.max_steps 10]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m zerotir fit --config configs/toy_cpu.yaml "$@"
