#!/usr/bin/env bash
# The test command (README and CI run exactly this): install into ./.venv if needed, then the whole suite on CPU.
#   bash scripts/test.sh [extra pytest args]
#   bash scripts/test.sh --fast [extra pytest args]   # the fast lane: every test but those marked e2e or slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# As root with apt (CI), Debian's chromium and chromium-driver for the rollout viewer's browser test
# (tests/rollout_log/test_viewer_browser.py; skipped, with the reason, where they are missing): a failed install
# leaves that test skipped, never the suite unrun.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  echo "installing chromium and chromium-driver (apt) for the rollout viewer's browser test"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
    || echo "could not install chromium: the browser test will be skipped"
fi
# Two pytest workers (pytest-xdist), a test file kept whole on one of them (its module fixtures built once): the
# suite's unit tests use one core each, and 2 cores is the machine it is sized for. The files are handed out in the
# suite's order (--no-loadscope-reorder: xdist would sort them by their number of tests), which puts those with a slow
# test first (tests/conftest.py), so that no minute-long file is left to one worker at the end.
# ZEROTIR_TEST_WORKERS=0 runs it in this one process (a debugger, -x, -s), any other number that many workers.
LANE=()
if [ "${1:-}" = "--fast" ]; then
  shift
  LANE=(-m "not e2e and not slow")
fi
exec .venv/bin/python -m pytest -q -n "${ZEROTIR_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "${LANE[@]}" "$@"
