#!/usr/bin/env bash
# One command on a fresh machine: install into ./.venv, then run the main job on its embedded CPU default
# (starts from the toy base shipped in data/toy_base, starts a local sandbox, trains with REINFORCE++ on the CPU).
#   bash scripts/quickstart.sh [extra fit args, e.g. --trainer.max_steps 10]
# Progress: in a terminal, live bars; through a pipe or in a log (`bash scripts/quickstart.sh 2>&1 | tee run.log`),
# a line per install phase, per 100 toy-base steps (and per copy probe) and per RL step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
echo "quickstart: python -m zerotir fit --config configs/toy_cpu.yaml $*"
exec .venv/bin/python -m zerotir fit --config configs/toy_cpu.yaml "$@"
