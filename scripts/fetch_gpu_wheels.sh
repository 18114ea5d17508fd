#!/usr/bin/env bash
# Fetch the wheels scripts/gpu_check.sh needs on a GPU machine without network (scripts/gpu_wheels.txt) into
# WHEEL_DIR (default .whl/, git-ignored): CPython 3.12, manylinux x86_64, no dependencies resolved (the list is
# complete for the machine's image). deepspeed has only a source release: it is built here into a pure-Python
# wheel (DS_BUILD_OPS=0, so nothing is compiled; JIT ops are not used by the check).
#   bash scripts/fetch_gpu_wheels.sh [WHEEL_DIR]
# Carry WHEEL_DIR to the GPU machine with the checkout (the device tool's `carry: [".whl"]`); gpu_check.sh installs
# from it with `pip install --no-index`.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
mapfile -t reqs < <(grep -vE '^\s*(#|$)' scripts/gpu_wheels.txt | grep -v '^deepspeed==')
deepspeed=$(grep '^deepspeed==' scripts/gpu_wheels.txt)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DIR" "${reqs[@]}"
# --no-build-isolation: deepspeed's setup.py imports torch; the local torch is enough for a build without ops.
DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$deepspeed"
ls -1 "$DIR"/*.whl
du -sh "$DIR"
