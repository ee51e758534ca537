# make serve: set up everything on first run, then serve the embedded model on 127.0.0.1:8000
# make test:  set up everything on first run, then run the test suite
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.enginegate-setup
ARGS ?=
PYTEST_ARGS ?=

LLAMA_SERVER_STAMP := $(VENV)/.llama-server

.PHONY: setup serve test clean llama-server

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh gateway/llamacpp_flags.py
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

serve: setup
	$(VENV)/bin/enginegate serve $(ARGS)

# llama.cpp's server, built once from the sources in the llama-cpp-python sdist (the tests run it for real).
llama-server: $(LLAMA_SERVER_STAMP)

$(LLAMA_SERVER_STAMP): $(STAMP)
	$(VENV)/bin/enginegate engines install llama-server
	touch $(LLAMA_SERVER_STAMP)

test: setup llama-server
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
