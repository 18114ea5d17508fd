#!/usr/bin/env bash
# GPU check of the scale path (docs/scale.md) on one GPU, in this order, so that nothing costs GPU time before the
# cheap checks passed:
#   install  the carried wheels (WHEELS, default .whl/, made by scripts/fetch_gpu_wheels.sh) with pip --no-index;
#   env      import every module the run needs (jsonargparse[signatures], fastapi, pydantic, uvicorn, httpx, pebble,
#            math-verify, tensorboard, accelerate, deepspeed, ...) and check CUDA: all problems reported at once;
#   build    a random Qwen2.5-0.5B-shaped model (byte tokenizer, no download);
#   vllm     the checks that need a vLLM wheel on the device (scripts/gpu_check_vllm.py: the prefix cache after a
#            push, the thread host's device, the push's stream synchronisation): run when vllm imports, else listed
#            as skipped and the output says plainly that vLLM is not checked (no vLLM wheel fits what a device run
#            carries);
#   fleet    the fleet's weight push with CUDA tensors over gloo on one GPU (scripts/gpu_check_fleet.py: bucket
#            views, receive into a transformers engine on the GPU, versions, stop); skipped, saying why, without CUDA
#            (the CPU plumbing run leaves it out: tests/test_gpu_check.py runs it with CPU tensors in-process);
#   nccl     a weight group of one rank over NCCL (scripts/gpu_check_nccl.py: built under the raise-on-error setting,
#            a broadcast, a push, the communicator aborted, a later collective raising, the environment as before);
#            left out of the CPU plumbing run like fleet (the suite runs it over gloo in-process);
#   grads    gradients on one fixed batch: ZeRO-2 vs plain torch, ZeRO-3 vs ZeRO-2 (two micro-batches inside one
#            engine.forward, as under Lightning; a ZeRO-3 that keeps only the last micro-batch fails here), and
#            ZeRO-3's log-probs and gradients through the chunked LM head vs its full logits;
#   zero2, zero3  3 `fit` steps (PPO: actor + critic + reference), transformers engine, printing per-step time, peak
#            GPU memory and the time of a bucketed weight sync; zero2's rollouts come from the engine host in a
#            thread (model.hosts.max_staleness 1: its own copy of the actor on the GPU), zero3's in line;
#   lora     3 `fit` steps of REINFORCE++ with rank-8 adapters (model.base.lora; peft carried as a wheel) under
#            ZeRO-3 in bf16: the adapters' B matrices must change at every step; the CPU plumbing run writes its
#            config only (the suite parses it; LoRA fits run in tests/e2e);
#   summary  OUT_DIR/summary.md.
# Time: each stage has its own limit (GPU_CHECK_LIMIT_<STAGE> seconds) and the whole run a budget (GPU_CHECK_BUDGET,
# default 560 s, under one 600 s device call): a stage never runs past what the budget has left (the summary's share
# kept for it), and one that the budget would cut to less than 10 s is skipped. `GPU_CHECK_PLAN=1 bash scripts/gpu_check.sh` prints the limits and the worst case.
# Every stage writes OUT_DIR/<stage>.log while it runs and appends a line to OUT_DIR/stages.tsv when it ends, so a
# run cut short still leaves what it did in OUT_DIR (with the device tool: bash scripts/gpu_check.sh "$OUT").
# The model (about 1 GB) goes to GPU_CHECK_WORK (default runs/gpu_check_work), not to OUT_DIR.
#   bash scripts/gpu_check.sh [OUT_DIR]            # default runs/gpu_check; reports: OUT_DIR/{grads,zero2,zero3,lora,vllm,fleet,nccl}.json
#   GPU_CHECK_CPU=1 bash scripts/gpu_check.sh      # the script's own plumbing on CPU: tiny model, DeepSpeed's CPU
#                                                  # accelerator for the gradient check, no DeepSpeed in the fit run
# Exit status: 0 when every stage passed (gradients within tolerance; every step finite, nonzero gradients and
# changing weights; the vLLM checks that could run passed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/gpu_check}
WORK=${GPU_CHECK_WORK:-runs/gpu_check_work}
PY=${PYTHON:-python3}
CPU_FLAG=""
[ "${GPU_CHECK_CPU:-0}" = "1" ] && CPU_FLAG="--cpu"
KILL_AFTER=5   # seconds between a stage's SIGTERM and its SIGKILL
STAGES=(install env build vllm fleet nccl grads zero2 zero3 lora summary)
declare -A LIMIT=([install]=30 [env]=40 [build]=40 [vllm]=15 [fleet]=20 [nccl]=15 [grads]=80 [zero2]=85 [zero3]=85
                  [lora]=80 [summary]=15)
DEFAULT_BUDGET=560
if [ -n "$CPU_FLAG" ]; then   # the CPU plumbing run (tests/test_gpu_check.py) on a shared 2-core machine: it checks
  # what the stages do, not how fast; under load any stage (the summary's vllm import too) may take minutes, so each
  # limit is only a hang guard there
  for stage in "${STAGES[@]}"; do LIMIT[$stage]=900; done
  DEFAULT_BUDGET=5400
fi
BUDGET=${GPU_CHECK_BUDGET:-$DEFAULT_BUDGET}
for stage in "${STAGES[@]}"; do
  var="GPU_CHECK_LIMIT_${stage^^}"
  LIMIT[$stage]=${!var:-${LIMIT[$stage]}}
done
if [ "${GPU_CHECK_PLAN:-0}" = "1" ]; then
  worst=0
  for stage in "${STAGES[@]}"; do
    echo "stage $stage ${LIMIT[$stage]} s"
    worst=$(( worst + LIMIT[$stage] + KILL_AFTER ))
  done
  echo "worst case $worst s (each limit + $KILL_AFTER s to kill); budget $BUDGET s"
  exit 0
fi
# The carried wheels are CPython 3.12 builds for the GPU machine: the CPU plumbing run uses this machine's packages
# unless GPU_CHECK_WHEELS names a folder.
DEFAULT_WHEELS=.whl
[ -n "$CPU_FLAG" ] && DEFAULT_WHEELS=""
WHEELS=${GPU_CHECK_WHEELS:-$DEFAULT_WHEELS}
export PYTHONUNBUFFERED=1   # the logs in OUT_DIR follow the run line by line
mkdir -p "$OUT_DIR" "$WORK"
start=$(date +%s)
status=0
printf 'stage\tresult\tseconds\tlimit_s\n' > "$OUT_DIR/stages.tsv"

# run_stage NAME CMD...: CMD under min(its limit, what the budget has left), output to the console and to
# OUT_DIR/NAME.log as it comes, one line to stages.tsv at the end. Returns CMD's exit status (124: timed out).
run_stage() {
  local name=$1; shift
  local now left limit began rc result
  now=$(date +%s)
  left=$(( start + BUDGET - now - KILL_AFTER ))
  [ "$name" != summary ] && left=$(( left - LIMIT[summary] - KILL_AFTER ))   # the summary's share stays
  limit=${LIMIT[$name]}
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt "${LIMIT[$name]}" ] && [ "$limit" -lt 10 ]; then
    echo "=== $name: SKIPPED, the budget of $BUDGET s is spent ($(( now - start )) s elapsed) ===" | tee "$OUT_DIR/$name.log"
    printf '%s\tskipped: budget spent\t0\t0\n' "$name" >> "$OUT_DIR/stages.tsv"
    status=1
    return 125
  fi
  echo "=== $name (limit $limit s; $(( now - start )) s elapsed) ==="
  began=$(date +%s)
  timeout --kill-after=$KILL_AFTER "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  result=passed
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    result="timed out"
  elif [ "$rc" -ne 0 ]; then
    result="failed (exit $rc)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$(( $(date +%s) - began ))" "$limit" >> "$OUT_DIR/stages.tsv"
  if [ "$rc" -ne 0 ]; then
    echo "$name: FAILED ($result after limit $limit s); log: $OUT_DIR/$name.log"
    status=1
  fi
  return "$rc"
}

finish() {
  run_stage summary $PY scripts/gpu_check.py summary "$@"
  [ -f "$OUT_DIR/summary.log" ] && cp "$OUT_DIR/summary.log" "$OUT_DIR/summary.md"
  echo "total $(( $(date +%s) - start )) s; exit $status; stages: $OUT_DIR/stages.tsv"
  exit $status
}

if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE=${GPU_CHECK_SITE:-/tmp/zerotir_gpu_check_site}
  echo "installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels from $WHEELS into $SITE"
  run_stage install $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl || { echo "installing the wheels in $WHEELS failed"; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "=== no wheels in ${WHEELS:-(none asked for)}: using what is installed (scripts/fetch_gpu_wheels.sh makes them) ==="
  printf 'install\tskipped: no wheels\t0\t0\n' >> "$OUT_DIR/stages.tsv"
fi
run_stage env $PY scripts/gpu_check.py env $CPU_FLAG || exit 1
# the model, then the fit configs (small, but each python start counts against the budget too): the CPU plumbing run
# runs zero2's only, and writes LoRA's for the suite to parse
ZEROS="2 3"
[ -n "$CPU_FLAG" ] && ZEROS="2"
run_stage build bash -c '"$1" scripts/gpu_check.py build --out "$2/model" $4 &&
  for zero in $5; do "$1" scripts/gpu_check.py config --zero $zero --model "$2/model" --out "$3/zero$zero.yaml" $4 \
  || exit 1; done &&
  "$1" scripts/gpu_check.py config --zero 3 --variant lora --model "$2/model" --out "$3/lora.yaml" $4' \
  build "$PY" "$WORK" "$OUT_DIR" "$CPU_FLAG" "$ZEROS" || exit 1
rm -f "$OUT_DIR/vllm.json"
run_stage vllm $PY scripts/gpu_check_vllm.py --report "$OUT_DIR/vllm.json" --timeout $(( LIMIT[vllm] - 5 ))
rm -f "$OUT_DIR/fleet.json"
if [ -n "$CPU_FLAG" ]; then   # the suite runs the same push with CPU tensors in its own process, cheaper
  printf 'fleet\tskipped: CPU plumbing run\t0\t0\n' >> "$OUT_DIR/stages.tsv"
else
  run_stage fleet $PY scripts/gpu_check_fleet.py --report "$OUT_DIR/fleet.json"
fi
rm -f "$OUT_DIR/nccl.json"
if [ -n "$CPU_FLAG" ]; then   # the suite runs the same steps over gloo in its own process
  printf 'nccl\tskipped: CPU plumbing run\t0\t0\n' >> "$OUT_DIR/stages.tsv"
else
  run_stage nccl $PY scripts/gpu_check_nccl.py --report "$OUT_DIR/nccl.json"
fi
rm -f "$OUT_DIR/grads.json"
echo "(gradients on one batch: ZeRO-2 vs full batch, ZeRO-3 vs ZeRO-2, ZeRO-3 chunked log-probs vs full logits)"
run_stage grads $PY scripts/gpu_check.py grads --model "$WORK/model" --report "$OUT_DIR/grads.json" $CPU_FLAG
reports=()
for zero in $ZEROS; do
  rm -f "$OUT_DIR/zero$zero.json"
  reports+=("$OUT_DIR/zero$zero.json")
  run_stage "zero$zero" $PY scripts/gpu_check.py run --config "$OUT_DIR/zero$zero.yaml" --report "$OUT_DIR/zero$zero.json"
done   # on CPU zero2 only: without DeepSpeed the two stages are the same run
rm -f "$OUT_DIR/lora.json"
if [ -n "$CPU_FLAG" ]; then   # without DeepSpeed on CPU it would be a plain LoRA fit, which tests/e2e runs
  printf 'lora\tskipped: CPU plumbing run (config written)\t0\t0\n' >> "$OUT_DIR/stages.tsv"
else
  reports+=("$OUT_DIR/lora.json")
  run_stage lora $PY scripts/gpu_check.py run --config "$OUT_DIR/lora.yaml" --report "$OUT_DIR/lora.json"
fi
finish "${reports[@]}"
