# The two commands a fresh machine needs: `make run` and `make test`.
# Everything is installed into .venv from nothing; torch is pinned first so that
# nothing later pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO  := kvstore/wire/proto/kvstore.proto

.PHONY: setup run test bench lint proto clean

$(STAMP): pyproject.toml Makefile kvstore/_rowcopy.c kvstore/_hitrate.c kvstore/_hitrate_stack.c \
          kvstore/_hitrate_split.c kvstore/_hitrate_stack.h
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

# The main job: two coding agents sharing a long context, played through the engine with the
# embedded store behind a pool smaller than their working set; then the same session in a
# fresh process, whose hits come from the store's DRAM and SSD. The small model is made once
# and kept in the engine's cache dir (outside git); each run starts with an empty store. It
# is hybrid (sliding and full layers): store hits replay their last 140 tokens (bounded
# replay), shown in the table's "replayed" column.
ENGINE_CACHE := $(or $(KVENGINE_CACHE_DIR),$(HOME)/.cache/kvengine)
DEMO_MODEL   := $(ENGINE_CACHE)/models/small-qwen3-hybrid
DEMO_FLAGS    = --model $(DEMO_MODEL) --session-file examples/agent_session.jsonl \
                --max-new-tokens 32 --greedy --pool-tokens 6144 --dram 256MiB --ssd-capacity 2GiB

run: setup
	@test -f $(DEMO_MODEL)/config.json || \
	  $(VENV)/bin/kvengine make-model --arch qwen3 --preset small --hybrid --out $(DEMO_MODEL)
	@mkdir -p $(ENGINE_CACHE) && store=$$(mktemp -d $(ENGINE_CACHE)/demo-store.XXXXXX) && \
	  echo "== 1st process, empty store: pool (hbm) hits, and DRAM hits for what the pool evicted" && \
	  $(VENV)/bin/kvengine generate $(DEMO_FLAGS) --kv-store embedded:$$store && \
	  echo "== 2nd process, same store: its DRAM starts empty, so the first hits come from SSD" && \
	  $(VENV)/bin/kvengine generate $(DEMO_FLAGS) --kv-store embedded:$$store; \
	  rc=$$?; rm -rf $$store; exit $$rc

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m bench.run_all

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy kvstore storage_nodes clients engine kernels bounded_replay bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
