#!/usr/bin/env bash
# The GPU check (issue 11), for a lent one-GPU machine: <= 8 minutes. Runs benchmarks/gpu_check.py
# (figures in $OUT/gpu_check.json, or ./gpu-check-out/; models and runs in /tmp/mazerl-gpu-check) with mazerl from this checkout (src/ on the
# path) and a Python that has CUDA torch and transformers:
#   1. $GPU_PYTHON when set;
#   2. else the first of python3 / python that sees a GPU.
# Wheels in ./.whl (e.g. pydantic for a machine that lacks it, fetched beforehand with `pip download`)
# are installed into /tmp/mazerl-site first, for machines that cannot reach PyPI. The vLLM and Ray
# sections run only where vllm and ray import (the trainer image); elsewhere the report says so.
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR="${OUT:-$PWD/gpu-check-out}"  # the JSON report; models and runs stay in WORK_DIR
WORK_DIR="${GPU_CHECK_WORK:-/tmp/mazerl-gpu-check}"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi fails): this check is for a machine with one" >&2
  exit 2
fi
ready() { "$1" -c "import torch, transformers; assert torch.cuda.is_available()" >/dev/null 2>&1; }

PY="${GPU_PYTHON:-}"
if [ -n "$PY" ] && ! ready "$PY"; then
  echo "GPU_PYTHON=$PY cannot import torch and transformers, or sees no GPU" >&2
  exit 2
fi
if [ -z "$PY" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && ready "$candidate"; then PY="$candidate"; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "no Python here has CUDA torch and transformers: run this inside the trainer image, or set GPU_PYTHON" >&2
  exit 2
fi
SITE=""
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mazerl-site .whl/*.whl
  SITE=/tmp/mazerl-site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
export PYTHONPATH="$PWD/src${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
timeout "${GPU_CHECK_TIMEOUT_S:-480}" "$PY" benchmarks/gpu_check.py --out "$WORK_DIR" --report "$REPORT_DIR/gpu_check.json" "$@"
