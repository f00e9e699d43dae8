# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lock demo test lint browser promtool proto up migrate bench clean

# Every package at the version requirements.lock names (pyproject.toml and its dev extra, resolved
# by `make lock`), then the project itself without resolving anything again.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Re-resolves after pyproject.toml changed, keeping every pin that still fits (add --upgrade to
# PIP_COMPILE_FLAGS to move them). The lock names no index or find-links: each machine's pip
# configuration says where packages come from.
PIP_COMPILE_FLAGS ?=
lock: $(STAMP)
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --extra dev --strip-extras \
	  --allow-unsafe --no-emit-options $(PIP_COMPILE_FLAGS) --output-file requirements.lock pyproject.toml

demo: $(STAMP)
	$(BIN)/fatura demo

# Two pytest processes, each with its own database, queue prefix and processes; a file's tests stay in
# one process (--dist loadfile), so a module's stack starts once. PYTEST_WORKERS=0 runs them in one.
PYTEST_WORKERS ?= 2
test: $(STAMP) lint browser promtool
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The reviewer page's test (tests/browser) drives Debian's Chromium: installed here when missing. Where
# apt-get cannot (not root, no network), the browser test skips and says so.
FATURA_CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(FATURA_CHROMIUM) || { echo "installing Debian's chromium for the browser test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make: could not install chromium; the browser test will be skipped" >&2; }

# The alert rules' tests and the /metrics checks run promtool, from Debian's prometheus package
# (installed here when missing; its server is not started by these tests). Where apt-get cannot,
# those tests skip and say so.
promtool:
	@command -v promtool >/dev/null || { echo "installing Debian's prometheus for promtool"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } \
	  || echo "make: could not install promtool; the promtool tests will be skipped" >&2; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python -m services.common.protogen

up: $(STAMP)
	$(BIN)/fatura up

migrate: $(STAMP)
	$(BIN)/fatura migrate

bench: $(STAMP)
	$(BIN)/fatura bench accept
	$(BIN)/fatura bench jobs-grpc
	$(BIN)/fatura bench limiter
	$(BIN)/fatura bench pipeline --jobs 1000 --layouts 2x8
	$(BIN)/fatura bench quota --duration 60
	$(BIN)/fatura bench fairness --backlog 3000 --tries 10

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out
