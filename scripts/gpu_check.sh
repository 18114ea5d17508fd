#!/usr/bin/env bash
# GPU check of the scale path (docs/scale.md) on one GPU, in this order, so that nothing costs GPU time before the
# cheap checks passed:
#   0. install the carried wheels (WHEELS, default .whl/, made by scripts/fetch_gpu_wheels.sh) with pip --no-index;
#   1. import every module the run needs (jsonargparse[signatures], fastapi, pydantic, uvicorn, httpx, pebble,
#      math-verify, tensorboard, accelerate, deepspeed, ...) and check CUDA: all problems reported at once;
#   2. build a random Qwen2.5-0.5B-shaped model (byte tokenizer, no download);
#   3. gradients on one fixed batch: ZeRO-2 vs plain torch, ZeRO-3 vs ZeRO-2 (two micro-batches inside one
#      engine.forward, as under Lightning; a ZeRO-3 that keeps only the last micro-batch fails here);
#   4. 3 `fit` steps (PPO: actor + critic + reference) with DeepSpeed ZeRO-2 and with ZeRO-3, transformers engine,
#      printing per-step time, peak GPU memory and the time of a bucketed weight sync.
# Target: under 8 minutes on one H200.
#   bash scripts/gpu_check.sh [OUT_DIR]            # default runs/gpu_check; reports: OUT_DIR/{grads,zero2,zero3}.json
#   GPU_CHECK_CPU=1 bash scripts/gpu_check.sh      # the script's own plumbing on CPU: tiny model, DeepSpeed's CPU
#                                                  # accelerator for the gradient check, no DeepSpeed in the fit run
# Exit status: 0 when every stage passed (gradients within tolerance; every step finite, nonzero gradients and
# changing weights).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python3}
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT:-210}   # seconds per ZeRO stage
CPU_FLAG=""
[ "${GPU_CHECK_CPU:-0}" = "1" ] && CPU_FLAG="--cpu"
# The carried wheels are CPython 3.12 builds for the GPU machine: the CPU plumbing run uses this machine's packages
# unless GPU_CHECK_WHEELS names a folder.
DEFAULT_WHEELS=.whl
[ -n "$CPU_FLAG" ] && DEFAULT_WHEELS=""
WHEELS=${GPU_CHECK_WHEELS:-$DEFAULT_WHEELS}
mkdir -p "$OUT"
start=$(date +%s)
status=0

if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE=${GPU_CHECK_SITE:-/tmp/zerotir_gpu_check_site}
  echo "=== installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels from $WHEELS into $SITE ==="
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || { echo "installing the wheels in $WHEELS failed"; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "=== no wheels in ${WHEELS:-(none asked for)}: using what is installed (scripts/fetch_gpu_wheels.sh makes them) ==="
fi
$PY scripts/gpu_check.py env $CPU_FLAG || exit 1
$PY scripts/gpu_check.py build --out "$OUT/model" $CPU_FLAG || exit 1
echo "=== gradients on one batch: ZeRO-2 vs full batch, ZeRO-3 vs ZeRO-2 ($(( $(date +%s) - start )) s elapsed) ==="
rm -f "$OUT/grads.json"
timeout --kill-after=15 "$RUN_TIMEOUT" $PY scripts/gpu_check.py grads --model "$OUT/model" --report "$OUT/grads.json" \
    $CPU_FLAG 2>&1 | tee "$OUT/grads.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "gradient check: FAILED (exit $rc; 124 = timed out after $RUN_TIMEOUT s); log: $OUT/grads.log"
  status=1
fi
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
