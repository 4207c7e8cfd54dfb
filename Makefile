# README's two commands: `make demo` and `make test`. Everything else is a helper target.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Hardware-aware install: CUDA machines get fbgemm-gpu, everything else fbgemm-gpu-cpu (pins in pyproject.toml).
HW := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
STAMP := $(VENV)/.installed-$(HW)
DEMO_DIR ?= .demo
PYTEST_ARGS ?=
# Test processes: one per core up to 4 (each builds the session fixtures once). A test file stays on one process, so its
# module fixtures are built once and its tests share them as they do in one process; TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))

.PHONY: setup demo serve test lint serve-only bench-beauty gpu-test-kit clean

setup: $(STAMP)

# Re-runs only when pyproject.toml changes (or the stamp is missing after a failed install).
$(STAMP): pyproject.toml
	@echo "[setup] creating $(VENV) for $(HW)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[$(HW),all,dev]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $$($(PY) -c \
	  'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["tool"]["recsys"]["install"]["no_deps"]))')
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "[setup] done"

demo: setup
	$(VENV)/bin/recsys demo --out $(DEMO_DIR)

# The champion `make demo` registered, served on http://127.0.0.1:8000 (OpenAPI at /docs) until Ctrl-C.
serve: setup
	$(VENV)/bin/recsys serve --model-name synthetic-sasrec --tracking-uri sqlite:///$(abspath $(DEMO_DIR))/mlflow.db

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)  # the slowest: what to trim when CI runs long

lint: setup
	$(VENV)/bin/ruff check recsys features pipelines serving cli dags benchmarks tests
	$(VENV)/bin/ruff format --check recsys features pipelines serving cli dags benchmarks tests
	$(VENV)/bin/mypy

# CI's serve-only check: a fresh venv with the library and its `serve` extra alone (torch: the CPU wheel pip finds) serves
# the committed bundle over real HTTP (.ci/serve_only.py); its size is printed (docs/install.md).
SERVE_VENV := .venv-serve
serve-only:
	rm -rf $(SERVE_VENV)
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install -q --disable-pip-version-check -e ".[serve]"
	du -sh $(SERVE_VENV)
	$(SERVE_VENV)/bin/python .ci/serve_only.py

# The GPU machine has no package index: pytest and Hypothesis (pinned in pyproject.toml's dev extra) and their
# pure-Python needs as wheels in .whl/t, beside ../shared/tools/gpu-kit.sh's parts; `python -m benchmarks.gpu_tests`
# (its docstring) runs the GPU's tests there.
GPU_TEST_PINS = $(shell $(PYTHON) -c 'import tomllib; dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]; print(" ".join(d for d in dev if d.split("==")[0] in ("pytest", "hypothesis")))')
gpu-test-kit:
	mkdir -p .whl/t
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
	  -d .whl/t $(GPU_TEST_PINS) iniconfig packaging pluggy sortedcontainers
	ls .whl/t

bench-beauty: setup
	$(PY) -m benchmarks.quality --config configs/beauty/sasrec.yaml --data-dir ../shared/data/amazon-beauty

# What the project's commands leave in the repo: the venvs, the demo's directory, the benchmarks' work dirs (.cache/),
# the tools' caches and the egg-info of the editable install; mlruns.db, mlruns/ and mlartifacts/ are what an older
# version's default MLflow store left here (the store lives in the work dir now). The default work dir runs/ holds
# your trained models and is kept: remove it yourself.
clean:
	rm -rf $(VENV) $(SERVE_VENV) $(DEMO_DIR) .cache .hypothesis .pytest_cache .mypy_cache .ruff_cache *.egg-info \
	  mlruns.db mlruns.db.lock mlruns mlartifacts
	find . -name __pycache__ -type d -not -path "./.git/*" -prune -exec rm -rf {} +
