# The two commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: help demo test services bench clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

demo: $(BIN)/python  ## create the virtualenv, install, run the demo on the local backend
	$(PIP) install -c constraints.txt -e '.[train]'
	bash scripts/services.sh --swe
	$(BIN)/rockroll envs build-swe --default
	$(BIN)/python examples/swe_demo.py
	$(BIN)/python examples/sandbox_demo.py
	rm -rf runs/demo
	$(BIN)/rockroll train examples/frozenlake_cpu.yaml --steps 50 --set logging.dir=runs/demo --set checkpoint.dir=runs/demo/ckpt
	$(BIN)/python examples/show_curve.py runs/demo

test: $(BIN)/python  ## install what the tests need, start their services, run the whole suite
	$(PIP) install -c constraints.txt -e '.[test,docker,s3,ray,service,train]'
	bash scripts/services.sh
	$(BIN)/rockroll envs build-swe --default
	$(BIN)/python -m pytest

services:  ## install and start the services the tests use (Docker engine)
	bash scripts/services.sh

bench: $(BIN)/python  ## run the benchmarks (tables on stdout, JSON in bench/results/)
	$(PIP) install -c constraints.txt -e '.[test,docker,s3,service]'
	bash scripts/services.sh
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/hub.py

clean:  ## remove the virtualenv and caches (sandboxes are reaped by `rockroll sandbox gc`)
	rm -rf $(VENV) .pytest_cache bench/results
