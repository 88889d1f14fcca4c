# qwen-operator: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The one cache of the dev tooling (qwen_devtools/cache.py); exported so that every recipe uses it.
CACHE ?= $(shell python3 operator/qwen_devtools/cache.py)
export QWEN_OPERATOR_CACHE := $(CACHE)
PYTEST_ARGS ?=

.PHONY: help setup setup-demo test test-quick unit e2e lint generate verify demo demo-down bench bench-quick mutants newcomer clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml images/operator/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]' -c images/operator/requirements.txt
	touch $@

setup: $(VENV)/.installed ## venv, system packages, vLLM CPU env, dev cluster and real-node binaries, images, monitoring CRDs (cached)
	bash tools/system-packages.sh
	$(PY) -m qwen_devtools.provision

setup-demo: $(VENV)/.installed ## what `make demo` needs: setup without the monitoring stack and KEDA (the tests build them on first use)
	bash tools/system-packages.sh
	$(PY) -m qwen_devtools.provision --demo

lint: $(VENV)/.installed ## ruff, mypy, import-linter
	$(VENV)/bin/ruff check operator tests e2e tools bench
	$(VENV)/bin/ruff format --check operator
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

generate: $(VENV)/.installed ## write every generated file: CRDs, chart, install.yaml, docs, vLLM flag table, image pins
	$(PY) -m qwen_devtools.generate

verify: $(VENV)/.installed ## fail when a generated file is stale (vLLM venv missing: skipped, or fails under QWEN_REQUIRE_REAL_PARTS)
	$(PY) -m qwen_devtools.generate --check

unit: $(VENV)/.installed ## pure and real-process tests (no cluster)
	QWEN_REQUIRE_REAL_PARTS=1 $(VENV)/bin/pytest tests $(PYTEST_ARGS)

e2e: setup ## operator end to end on the dev cluster
	QWEN_REQUIRE_REAL_PARTS=1 $(VENV)/bin/pytest e2e -m "not bench" $(PYTEST_ARGS)

test: setup lint verify ## everything CI runs: lint, drift checks, unit, real-process and e2e tests (4 lanes)
	QWEN_REQUIRE_REAL_PARTS=1 $(PY) -m qwen_devtools.testlanes $(PYTEST_ARGS)

test-quick: $(VENV)/.installed ## the edit-run loop: tests/ without engines, no cluster (make test before a push)
	QWEN_REQUIRE_REAL_PARTS=1 $(PY) -m qwen_devtools.testlanes --quick $(PYTEST_ARGS)

demo: setup-demo ## dev cluster with GPU pools, operator installed with the chart, an example QwenDeployment
	$(PY) -m qwen_devtools.demo up

demo-down: ## stop the demo cluster and operator
	$(PY) -m qwen_devtools.demo down

bench: setup ## every benchmark scenario (ratios to peers measured in the same run); writes README's Performance
	$(PY) bench/suite.py --readme

bench-quick: setup ## every benchmark scenario's smoke mode (minutes; README untouched)
	$(PY) bench/suite.py --quick

mutants: $(VENV)/.installed ## break each of 17 promised behaviours in a scratch worktree; the suite must catch each (about 2 min)
	$(PY) -m qwen_devtools.mutants

newcomer: ## the README's first two commands in a fresh clone, in order (NEWCOMER_ARGS=--cold: empty caches first)
	bash tools/newcomer.sh $(NEWCOMER_ARGS)

clean: ## remove the venv (the cache, ~/.cache/qwen-operator by default, stays)
	rm -rf $(VENV) .devcluster
