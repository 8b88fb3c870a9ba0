# mazerl — the two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MAZERL := $(VENV)/bin/mazerl
# Reinstall when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
DEMO_OUT ?= outputs/demo

.PHONY: install test demo bench clean tiny-base

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch/torchvision are pinned as a pair: both install from this machine's disk (README).
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest -q

# The whole KFP DAG on this machine with kfp.local: mazes -> tiny model -> warm start -> GRPO ->
# evaluations -> comparison -> promotion (if it improved). Last line: `report: PATH`.
demo: install
	$(MAZERL) pipeline run --profile local --config default

# Rebuild the shipped pretrained tiny model (src/mazerl/assets/tiny-base) from its seeds and the step count
# its provenance.json records (steps_run; the first build stopped on its 70-minute cap): ~20 min on 2 idle cores.
tiny-base: install
	$(MAZERL) policy pretrain-tiny --out src/mazerl/assets/tiny-base --overwrite --steps 754

bench: install
	$(PY) benchmarks/bench_mazes.py --json $(DEMO_OUT)/bench_mazes.json
	$(PY) benchmarks/bench_rollout_update.py --json $(DEMO_OUT)/bench_rollout_update.json
	$(PY) benchmarks/bench_distributed.py --out $(DEMO_OUT)/bench-distributed

clean:
	rm -rf outputs .pytest_cache
