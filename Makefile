# The two commands a fresh machine needs: `make run` and `make test`.
# Everything is installed into .venv from nothing; torch is pinned first so that
# nothing later pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO  := clients/proto/kvstore.proto

.PHONY: setup run test bench lint proto clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) proto

# Generated stubs are never committed: they are rebuilt from the .proto here.
proto: $(STAMP)
	@if [ -f $(PROTO) ]; then \
	  $(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO); \
	fi

run: setup
	$(PY) -m kvstore demo

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m bench.run_all

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy kvstore storage_nodes clients

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
