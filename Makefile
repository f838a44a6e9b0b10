# fp8rl — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets with what they do
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

.PHONY: setup
setup: $(STAMP) ## Create .venv and install fp8rl with its dev extra (quick when already set up)

.PHONY: test
test: setup ## Run the test suite without tests marked slow
	$(PY) -m pytest -q $(PYTEST_ARGS)

.PHONY: test-all
test-all: setup ## Run every test, slow end-to-end ones included
	$(PY) -m pytest -q -m '' $(PYTEST_ARGS)

.PHONY: lint
lint: setup ## ruff check and format check
	$(VENV)/bin/ruff check fp8rl tests benchmarks scripts analysis sweep.py hydra_plugins
	$(VENV)/bin/ruff format --check fp8rl tests benchmarks scripts analysis sweep.py hydra_plugins

.PHONY: reproduce-table2
reproduce-table2: setup ## Table 2 at tiny scale: run the grids (resumable), export to results/, write docs/reports/, print the table. Default: the six rows on the learning world, 30 steps. QUICK=1 (the pipeline check), SMALL=1 (the default before issue 46: 10 steps, clean base), MEDIUM=1 (50 steps, 9 arms), FULL=1 (the pre-registered study), SEEDS=0,1,2, BACKEND=verl CLUSTER=local_cpu (verl's trainer on this CPU; QUICK=1 only in reasonable time) (times: docs/analysis.md, measured)
	$(PY) analysis/reproduce_table2.py $(if $(QUICK),--size quick,$(if $(FULL),--size full --jobs 2 --threads 1,$(if $(MEDIUM),--size medium,$(if $(SMALL),--size small --jobs 2 --threads 1,--size default --jobs 2 --threads 1)))) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(CLUSTER),--cluster $(CLUSTER)) $(ARGS)

.PHONY: study
study: setup ## A declared study (studies/<NAME>/): make study NAME=table2_world [CMD=plan|status|run|report] [ARGS="--runs-dir runs"]; CMD defaults to status, NAME unset lists the studies
	$(PY) -m fp8rl.study $(if $(NAME),$(or $(CMD),status) $(NAME),list) $(ARGS)

.PHONY: report
report: setup ## Rebuild a report folder from results/: make report ARGS="--experiment table2_default [--export-from runs]"
	$(PY) analysis/report.py $(ARGS)

.PHONY: frontier-pilot-report
frontier-pilot-report: setup ## The frontier pilot's report and regime verdict from results/frontier_pilot into docs/reports/frontier_pilot (docs/study/frontier_protocol.md): ARGS="--export-from runs" exports the pilot's runs first
	$(PY) analysis/frontier_pilot_report.py $(ARGS)

.PHONY: figures
figures: report ## The report's figures (PNG + PDF, in the report folder's figures/): same as make report

.PHONY: base-model
base-model: setup ## Build (or load from cache) the tiny-s SFT base model and print its per-family accuracy
	$(PY) scripts/build_base_model.py

.PHONY: train-tiny
train-tiny: setup ## One short tiny RL run (blockwise FP8 rollout+training, Calibrated Clipping) into runs/
	$(PY) sweep.py experiment_name=quickstart threads=2 granularity=blockwise granularity.block_size=4 \
		clipping=calibrated clipping.period=5 steps=30 eval.every=15 eval.limit=50 $(ARGS)

.PHONY: first-run-transcript
first-run-transcript: ## Record make setup, make reproduce-table2 (twice), make train-tiny and CI's make test on a fresh clone of HEAD; write README's first-run block from it
	$(PY) scripts/first_run.py record
	$(PY) scripts/first_run.py render

.PHONY: first-look
first-look: setup ## The trainer's first look: BF16 RL vs SFT (4 seeds), every recipe, the calibration check
	for s in first_look_improvement first_look_recipes first_look_fp8_rollout first_look_calibration; do \
		$(PY) sweep.py +sweep=$$s $(ARGS) || exit 1; done
	$(PY) scripts/first_look.py $(ARGS)

.PHONY: noise-table
noise-table: setup ## Log-ratio noise per precision recipe on the SFT base (the regime chart's x-axis)
	for s in noise_table noise_table_fp8_rollout; do $(PY) sweep.py +sweep=$$s $(ARGS) || exit 1; done
	$(PY) scripts/noise_table.py $(ARGS)

.PHONY: sweep
sweep: setup ## A run or grid from experiments/conf: make sweep ARGS="-m granularity=rowwise,blockwise seed=0,1"
	$(PY) sweep.py $(ARGS)

.PHONY: dry-run
dry-run: setup ## What a grid would run (run ids, start/resume/skip) and its cost: make dry-run ARGS=+sweep=regime
	$(PY) sweep.py --dry-run $(ARGS)

.PHONY: status
status: setup ## An experiment's runs (done/running/failed/pending/pruned/stale, ETA): make status ARGS=+experiment=table2
	$(PY) sweep.py --status $(ARGS)

.PHONY: sweep-smoke
sweep-smoke: setup ## A 2x2 grid on the test preset: checks the whole sweep path
	$(PY) sweep.py +sweep=smoke

.PHONY: regime
regime: setup ## The regime study grid on every core (tiny-s; see make dry-run ARGS=+sweep=regime)
	$(PY) sweep.py +sweep=regime hydra/launcher=parallel

.PHONY: regime-noise
regime-noise: setup ## The noise probe per precision recipe, for the regime study's x-axis
	$(PY) sweep.py +sweep=regime_noise hydra/launcher=parallel

.PHONY: regime-report
regime-report: setup ## The regime study's tables and verdicts from the run store: make regime-report ARGS="--runs runs"
	$(PY) scripts/regime_report.py $(ARGS)

.PHONY: eval
eval: setup ## lm-eval over a grid's finished runs (exports kept checkpoints first; resumable): make eval ARGS="+experiment=table2 lm_eval.k=4 lm_eval.greedy=false"
	$(PY) sweep.py --eval $(ARGS)

.PHONY: prepare-benchmarks
prepare-benchmarks: setup ## Math benchmarks + DeepScaleR train set into data/benchmarks (schema, MANIFEST): make prepare-benchmarks ARGS="--fetch" or ARGS="--from-local aime24=<file>"
	$(PY) scripts/prepare_benchmarks.py $(if $(ARGS),$(ARGS),--list)

.PHONY: lm-eval-agreement
lm-eval-agreement: setup ## lm-eval vs the in-loop evaluator on the shipped base, FP32: greedy item by item, avg@4 within sampling error
	$(PY) scripts/lm_eval_agreement.py $(ARGS)

.PHONY: bench-lm-eval
bench-lm-eval: setup ## Problems/s of lm-eval (hf) vs the in-loop evaluator on the shipped base, 1200 greedy items
	$(PY) benchmarks/bench_lm_eval.py $(ARGS)

.PHONY: bench-numerics
bench-numerics: setup ## Time fwd+bwd of a small transformer per precision recipe (markdown to stdout)
	$(PY) benchmarks/bench_numerics.py

.PHONY: bench-loss
bench-loss: setup ## Time loss + diagnostics + calibration on a 256x4096-token batch vs verl's loss
	$(PY) benchmarks/bench_loss.py

.PHONY: bench-trainer
bench-trainer: setup ## Time the tiny RL step by phase per recipe and the calibration overhead at K=20; vs an earlier commit, interleaved: make bench-trainer ARGS="--against f1ddd3e"
	$(PY) benchmarks/bench_trainer.py $(ARGS)

.PHONY: table2-compute
table2-compute: setup ## The Table-2 study's compute at today's step rates: bench_trainer --against 7dbb020 at its scale settings (2 invocations, 11 min on a 2-core AMD EPYC), tables into outputs/table2_compute
	$(PY) benchmarks/table2_compute.py --run outputs/table2_compute $(ARGS)

.PHONY: bench-torchao-dequant
bench-torchao-dequant: setup ## TorchAO's emulated-GEMM dequantisation, eager vs compiled, and its compile cost
	$(PY) benchmarks/bench_torchao_dequant.py $(ARGS)

.PHONY: bench-fused-quant
bench-fused-quant: setup ## Fused (torch.compile) vs eager fake quantisation per operand group, interleaved (FP8RL_FUSED_QUANT's evidence)
	$(PY) benchmarks/bench_fused_quant.py $(ARGS)

.PHONY: bench-mx-rounding
bench-mx-rounding: setup ## MX element rounding (FP6/FP4 arithmetic) fast vs reference path per format, interleaved, same bits checked
	$(PY) benchmarks/bench_mx_rounding.py $(ARGS)

.PHONY: bench-cli
bench-cli: setup ## How long sweep.py takes to answer (--help, config errors, --status) vs an earlier commit, interleaved: make bench-cli ARGS="--against 7dbb020"
	$(PY) benchmarks/bench_cli.py $(ARGS)

.PHONY: bench-verl-cpu
bench-verl-cpu: setup ## One run config on the tiny backend and on verl's real trainer on this CPU, side by side: step times and start-up
	$(PY) benchmarks/bench_verl_cpu.py $(ARGS)

.PHONY: bench-scaled-mm
bench-scaled-mm: setup ## CPU FP8 GEMM (torch._scaled_mm, TorchAO's path) vs dequantise + FP32 matmul
	$(PY) benchmarks/bench_scaled_mm.py

.PHONY: bench-fp8-throughput
bench-fp8-throughput: setup ## TorchAO float8 vs BF16 fwd+bwd of Qwen3-8B/14B, Qwen2.5-32B linears (GPU; CPU: reduced, not comparable); ARGS="--json out.json"
	$(PY) benchmarks/bench_fp8_throughput.py $(ARGS)

# make gpu-check runs on the GPU machine's own interpreter (no venv there: Python 3.12)
GPU_PYTHON ?= python3

.PHONY: gpu-check
gpu-check: ## The GPU check (issue 32), no venv: TorchAO wheel from wheels/ via pip --target, repo on PYTHONPATH, bench_fp8_throughput.py under 8 min into OUT_DIR (default outputs/gpu-check); ARGS="--dry-run"
	PYTHON=$(GPU_PYTHON) bash scripts/gpu_check.sh $(if $(OUT_DIR),--out $(OUT_DIR)) $(ARGS)

.PHONY: clean
clean: ## Remove caches (keeps .venv and runs/)
	rm -rf .pytest_cache .ruff_cache build *.egg-info
