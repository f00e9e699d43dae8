# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint proto up migrate bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fatura demo

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

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
	$(BIN)/fatura bench limiter
	$(BIN)/fatura bench pipeline --jobs 1000 --layouts 2x8
	$(BIN)/fatura bench quota --duration 60
	$(BIN)/fatura bench fairness --backlog 3000 --tries 10

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out
