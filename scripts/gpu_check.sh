#!/usr/bin/env bash
# GPU check of the scale path (docs/scale.md): 3 `fit` steps (PPO: actor + critic + reference) of a random
# Qwen2.5-0.5B-shaped model on one GPU with DeepSpeed ZeRO-2 and with ZeRO-3, transformers engine for the rollouts,
# printing per-step time, peak GPU memory and the time of a bucketed weight sync. Target: under 8 minutes on one H200.
# Needs torch with CUDA, lightning, transformers and deepspeed (a wheel is enough: nothing here compiles an op).
#   bash scripts/gpu_check.sh [OUT_DIR]            # default runs/gpu_check; reports: OUT_DIR/zero{2,3}.json, summary.md
#   GPU_CHECK_CPU=1 bash scripts/gpu_check.sh      # the script's own plumbing on CPU: tiny model, no DeepSpeed
# Exit status: 0 when both runs finished their steps with finite, nonzero gradients and changing weights.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python3}
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT:-210}   # seconds per ZeRO stage
CPU_FLAG=""
[ "${GPU_CHECK_CPU:-0}" = "1" ] && CPU_FLAG="--cpu"
mkdir -p "$OUT"
start=$(date +%s)
status=0

$PY scripts/gpu_check.py env $CPU_FLAG || exit 1
$PY scripts/gpu_check.py build --out "$OUT/model" $CPU_FLAG || exit 1
for zero in 2 3; do
  echo "=== ZeRO-$zero ($(( $(date +%s) - start )) s elapsed) ==="
  $PY scripts/gpu_check.py config --zero "$zero" --model "$OUT/model" --out "$OUT/zero$zero.yaml" $CPU_FLAG || exit 1
  rm -f "$OUT/zero$zero.json"
  timeout --kill-after=15 "$RUN_TIMEOUT" $PY scripts/gpu_check.py run --config "$OUT/zero$zero.yaml" \
      --report "$OUT/zero$zero.json" 2>&1 | tee "$OUT/zero$zero.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "ZeRO-$zero: FAILED (exit $rc; 124 = timed out after $RUN_TIMEOUT s); log: $OUT/zero$zero.log"
    status=1
  fi
  [ -n "$CPU_FLAG" ] && break   # without DeepSpeed the two stages are the same run
done
echo "=== summary ==="
reports=("$OUT/zero2.json")
[ -z "$CPU_FLAG" ] && reports+=("$OUT/zero3.json")
$PY scripts/gpu_check.py summary "${reports[@]}" | tee "$OUT/summary.md"
echo "total $(( $(date +%s) - start )) s; exit $status"
exit $status
