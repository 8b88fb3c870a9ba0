#!/usr/bin/env bash
# The GPU check (issue 11), for a lent one-GPU machine: <= 8 minutes. Runs benchmarks/gpu_check.py
# (figures in $OUT/gpu_check.json, or ./gpu-check-out) with mazerl from this checkout (src/ on the
# path) and a Python that has CUDA torch and vLLM:
#   1. $GPU_PYTHON when set;
#   2. else the first of python3 / python that imports vllm and sees a GPU (a trainer-image
#      container, or a machine prepared beforehand);
#   3. else a fresh venv built from the trainer image's lock (requirements/trainer.lock) - this
#      needs PyPI; a machine without network stops here with a message naming what to provide.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi fails): this check is for a machine with one" >&2
  exit 2
fi
ready() { "$1" -c "import torch, vllm; assert torch.cuda.is_available()" >/dev/null 2>&1; }

PY="${GPU_PYTHON:-}"
if [ -n "$PY" ] && ! ready "$PY"; then
  echo "GPU_PYTHON=$PY cannot import vllm or sees no GPU" >&2
  exit 2
fi
if [ -z "$PY" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && ready "$candidate"; then PY="$candidate"; break; fi
  done
fi
if [ -z "$PY" ]; then
  if ! python3 -m pip download --quiet --no-deps --timeout 10 --retries 0 --dest /tmp/mazerl-pypi-probe "pip" >/dev/null 2>&1; then
    echo "no Python here has vLLM with a GPU, and PyPI cannot be reached to install the trainer image's" >&2
    echo "lock (requirements/trainer.lock): run this inside the trainer image, or set GPU_PYTHON" >&2
    exit 2
  fi
  python3 -m venv /tmp/mazerl-gpu
  /tmp/mazerl-gpu/bin/pip install -q --upgrade pip
  /tmp/mazerl-gpu/bin/pip install -q -r requirements/trainer.lock
  PY=/tmp/mazerl-gpu/bin/python
fi
nvidia-smi --query-gpu=name,memory.total --format=csv
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout 420 "$PY" benchmarks/gpu_check.py --out "$OUT_DIR"
