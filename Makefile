# make serve: set up everything on first run, then serve the embedded model on 127.0.0.1:8000
# make test:  set up everything on first run, then run the test suite
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.enginegate-setup
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup serve test clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh scripts/llamacpp_cmake_args.py
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

serve: setup
	$(VENV)/bin/enginegate serve $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
