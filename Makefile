# txnkeeper build, test and demo entry points. Everything a fresh machine needs is installed from here:
# the virtualenv (.venv), generated protobuf code, and (for the chart and cluster tests) binaries built
# from the Go module proxy into $(CACHE_DIR), which outlives clones so reruns are fast.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE_DIR ?= $(HOME)/.cache/txnkeeper
export CACHE_DIR

INSTALLED := $(VENV)/.installed
GENERATED := runtime/txnkeeper/pb/.generated
PROTOS := $(wildcard proto/*.proto)
PYTEST_ARGS ?=

.PHONY: all install proto lint typecheck unit test demo soak bench clean

all: test

$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,operator,spark]'
	@touch $@

install: $(INSTALLED) $(GENERATED)

$(GENERATED): $(PROTOS) $(INSTALLED) runtime/txnkeeper/pb/generate.py
	$(BIN)/python -m txnkeeper.pb.generate --proto-dir proto --out-root runtime
	@touch $@

proto: $(GENERATED)

lint: install
	$(BIN)/ruff check runtime operator tests e2e bench
	$(BIN)/ruff format --check runtime operator tests e2e bench

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest $(PYTEST_ARGS)

# The README's test command: lint, strict typing, every test (soak tests run in their bounded form).
test: lint typecheck unit

# Longer soak/crash runs than CI's bounded ones.
soak: install
	SOAK_SCALE=10 $(BIN)/pytest -m soak $(PYTEST_ARGS)

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b; done

demo: install
	$(BIN)/txnkeeper demo

clean:
	rm -rf $(VENV) runtime/txnkeeper/pb/*_pb2.py runtime/txnkeeper/pb/*_pb2.pyi $(GENERATED) .mypy_cache .ruff_cache .pytest_cache
