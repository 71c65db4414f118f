# prewarm — two commands on a fresh machine:
#   make demo   set everything up and run `prewarm demo` on embedded defaults
#   make test   set everything up, start the local stack, run the whole test suite, stop the stack
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Helm is a Go module: `make tools` builds it into .tools/bin (git-ignored) from the Go module proxy.
HELM_VERSION := v3.22.0
HELM := .tools/bin/helm

.PHONY: help env tools demo test stack-up stack-down stack-status lint

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

env: ## create or update .venv from uv.lock (fast when already up to date)
	@bash deploy/bootstrap.sh

demo: env ## run `prewarm demo` on embedded defaults (no services needed)
	@$(VENV)/bin/prewarm demo

tools: ## install .tools/bin/helm (for the chart's tests); fast when the right version is there
	@# The module version recorded in the binary (`helm version` says only v3.NN without release ldflags).
	@if [[ -x $(HELM) ]] && go version -m $(HELM) 2>/dev/null | grep -qE "^\s+mod\s+helm.sh/helm/v3\s+$(HELM_VERSION)\s"; then \
	  :; \
	else \
	  echo "tools: building helm $(HELM_VERSION) into .tools/bin" >&2; \
	  mkdir -p .tools/bin && GOBIN=$$PWD/.tools/bin go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

test: env tools ## start the local stack, run every test, stop the stack again if this run started it
	@bash deploy/local/with-stack.sh $(PY) -m pytest $(PYTEST_ARGS)

stack-up: env ## start Kafka, the S3 server, PostgreSQL and MLflow on 127.0.0.1; writes .stack/env
	@bash deploy/local/stack.sh up

stack-down: ## stop the processes the stack started (pid files under .stack/)
	@bash deploy/local/stack.sh down

stack-status: ## show each service of the local stack
	@bash deploy/local/stack.sh status

lint: env ## ruff (lint and format check), mypy, and the import contract (the design's import rules)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
