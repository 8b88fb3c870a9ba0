#!/usr/bin/env bash
# The GPU check (issue 11), for a lent one-GPU machine: <= 8 minutes. Installs the trainer image's
# pins (requirements/trainer.txt: CUDA vLLM, its torch pair) and the package in a fresh venv, then
# runs benchmarks/gpu_check.py; figures land in $OUT/gpu_check.json (or ./gpu-check-out).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
python3 -m venv /tmp/mazerl-gpu
/tmp/mazerl-gpu/bin/pip install -q --upgrade pip
/tmp/mazerl-gpu/bin/pip install -q -r requirements/trainer.txt
/tmp/mazerl-gpu/bin/pip install -q .
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 420 /tmp/mazerl-gpu/bin/python benchmarks/gpu_check.py --out "$OUT_DIR"
