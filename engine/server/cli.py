"""``kvengine serve``: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

It binds ``--listen`` (127.0.0.1:8000 by default; port 0 picks a free one) and prints
``listening on HOST:PORT`` on stdout once the socket is bound, so scripts and tests never
race for a port. A non-loopback bind without ``--auth-token-file`` is warned about.
SIGINT/SIGTERM stop it: requests in flight are aborted and pending commits reach the store.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import sys
import time
from pathlib import Path

from engine.connector.stores import StoreOptions, open_store_link
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.entrypoints.generate import add_engine_flags, add_model_flags
from engine.errors import EngineInputError
from engine.kv.namespace import engine_namespace
from engine.model.chat_template import ChatTemplate
from engine.model.loader import load_model
from engine.server.engine_loop import EngineLoop
from engine.server.kv_events import KvEventsConfig, open_kv_event_publisher
from engine.server.kv_transfer import KV_ROLES
from engine.server.metrics import ServerMetrics
from engine.server.prefix_keys import add_prefix_key_flags, http_users, prefix_hash
from engine.server.tenants import Tenants
from engine.server.tool_parsers import PARSERS
from engine.structured.backend import GrammarBackend
from kvstore.flags import flag_type
from kvstore.units import parse_size, parse_timeout

_DEFAULTS = EngineConfig()
log = logging.getLogger("engine.server")


def configure(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                   help="address to bind (port 0: any free port)")
    p.add_argument("--auth-token-file", metavar="F",
                   help="HTTP clients' tokens: 'token tenant' lines; each tenant's requests get "
                        "their own namespace (no shared hits). Without it, no auth")
    p.add_argument("--store-token-file", metavar="F",
                   help="grpc: file holding the daemon's bearer token (else "
                        "$KVSTORE_AUTH_TOKEN); with --auth-token-file it must be a delegating "
                        "token (tenant 'P/*' in the daemon's file)")
    add_prefix_key_flags(p)
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests accepted and not finished; more get 503 with Retry-After")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model's name in the API (default: the name kvengine fetch-model "
                        "installed it under, else config.json's _name_or_path, else the "
                        "checkpoint dir's name)")
    p.add_argument("--pool-tokens", type=int, default=_DEFAULTS.pool_tokens, metavar="N",
                   help="KV pool (the hbm tier) size in tokens of every layer's KV; a "
                        "hybrid model (Gemma 3) keeps its sliding layers to their window in "
                        "those bytes, so it holds more tokens (Gemma 3 270M, bfloat16: "
                        "18,432 B per token in a running request's window, 3,072 B out of "
                        "it; 5.8x the tokens at the default size)")
    p.add_argument("--block-tokens", type=int, default=_DEFAULTS.block_tokens, metavar="N",
                   help="tokens per pool and store block")
    p.add_argument("--max-batched-tokens", type=int, default=_DEFAULTS.max_batched_tokens,
                   metavar="N", help="per-step token budget (prefill chunk size)")
    p.add_argument("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs, metavar="N",
                   help="requests admitted at once")
    p.add_argument("--no-cache-generated", action="store_true",
                   help="keep generated tokens' blocks out of the pool index and the store "
                        "(trace replays: the caches hold exactly the trace's blocks)")
    p.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                   help="how tool calls are read from the model's text (as vLLM's flag); "
                   "without it, tool_choice auto is refused")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM compatibility: --tool-call-parser enables it")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template replacing the checkpoint's (e.g. "
                   "examples/tool_chat_template_hermes.jinja for tools on a template "
                   "without them)")
    p.add_argument("--kv-role", choices=KV_ROLES, default="both",
                   help="prefill/decode disaggregation behind vllm-router's "
                        "--vllm-pd-disaggregation: 'prefill' answers a request carrying "
                        "kv_transfer_params.do_remote_decode once the prompt's blocks are in "
                        "the shared store; 'decode' loads them for a request carrying "
                        "do_remote_prefill; 'both' (default) plays either side. prefill and "
                        "decode need a shared store: --kv-store grpc://HOST:PORT")
    p.add_argument("--kv-transfer-timeout", type=flag_type(parse_timeout), default=10.0,
                   metavar="DURATION",
                   help="longest wait of a hand-off: a prefill for its commit, a decode for "
                        "the prefill's blocks to be visible (then it computes them); and of "
                        "any answer's end for its prompt's commit to the store, so that the "
                        "next turn finds it on another replica (default 10s)")
    p.add_argument("--kv-events-endpoint", metavar="tcp://HOST:PORT", default=None,
                   help="publish the pool's block stored/removed/cleared events in vLLM's "
                        "KV-events format (msgpack over ZMQ PUB, bound here) for a router's "
                        "kv_aware policy (vllm-router --kv-event-source URL=ENDPOINT)")
    p.add_argument("--kv-events-replay-endpoint", metavar="tcp://HOST:PORT", default=None,
                   help="with --kv-events-endpoint: the ROUTER socket that resends missed "
                        "batches by sequence number (vllm-router --kv-event-replay-source)")
    p.add_argument("--kv-events-topic", default="", metavar="TOPIC",
                   help="with --kv-events-endpoint: the topic frame of every batch (vLLM's "
                        "default: empty)")
    add_engine_flags(p)
    p.add_argument("--log-level", default="warning",
                   choices=("debug", "info", "warning", "error"), help="server log level")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise EngineInputError(f"--listen {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from engine.server.app import create_app
    from engine.server.state import ServerState

    logging.basicConfig(format="kvengine serve: %(levelname)s: %(message)s",
                        level=args.log_level.upper())
    host, port = parse_listen(args.listen)
    if args.max_queue < 1:
        raise EngineInputError("--max-queue must be >= 1")
    if args.kv_role != "both" and not args.kv_store.startswith(("grpc://", "grpcs://")):
        raise EngineInputError(f"--kv-role {args.kv_role} needs a store its peer replicas "
                               f"share: --kv-store grpc://HOST:PORT (got {args.kv_store!r})")
    config = EngineConfig(pool_tokens=args.pool_tokens, block_tokens=args.block_tokens,
                          max_batched_tokens=args.max_batched_tokens,
                          max_num_seqs=args.max_num_seqs,
                          attention_backend=args.attention_backend,
                          cache_generated_tokens=not args.no_cache_generated,
                          replay_keep_tokens=args.replay_keep, replay_force=args.force,
                          cache_all_layers=args.cache_all_layers,
                          max_model_len=args.max_model_len, deterministic=args.deterministic,
                          compile_step=args.compile)
    store_opts = StoreOptions(dram_bytes=parse_size(args.dram),
                              ssd_capacity_bytes=parse_size(args.ssd_capacity),
                              auth_token_file=args.store_token_file)
    # Before the model loads: a missing or bad key file, or a bad events flag, is one
    # line at once.
    keyed = prefix_hash(args.prefix_hash, args.prefix_key_file, http_users(args.auth_token_file))
    events = kv_events_config(args, config.block_tokens)
    loaded = load_model(args.model, dtype=args.dtype, device=args.device, progress=False)
    if args.chat_template is not None:
        tok = loaded.tokenizer
        try:
            source = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as e:
            raise EngineInputError(f"--chat-template {args.chat_template}: {e.strerror}"
                                   ) from None
        tok.chat_template = ChatTemplate(source, tok.special_tokens)
    policy = config.replay_policy(loaded.spec.layer_windows)  # refusals before the store opens
    config.context_tokens(loaded.spec.max_context_tokens)
    link = open_store_link(
        args.kv_store,
        lambda tenant: engine_namespace(loaded.spec, config.block_tokens, tenant, policy, keyed),
        store_opts)
    try:
        tenants = Tenants(args.auth_token_file, link.ns.tenant)
    except BaseException:
        link.close()
        raise
    if not is_loopback(host) and not tenants.enabled:
        print(f"kvengine serve: warning: listening on {host} without --auth-token-file: "
              "anyone who can reach it can use the engine", file=sys.stderr, flush=True)
    engine = LLMEngine(loaded.model, config, link)
    try:
        publisher = open_kv_event_publisher(events)
    except BaseException:
        engine.close()  # its threads, then the store link
        raise
    engine.kv.events.add(publisher)
    engine.grammar = GrammarBackend(loaded.tokenizer.backend.to_str(), loaded.spec.vocab_size,
                                    loaded.spec.eos_token_ids[0])
    metrics = ServerMetrics(engine)
    for store_link in (link, engine.sliding_link):
        if store_link is not None:
            store_link.observe = metrics.observe_store_call
    loop = EngineLoop(engine, on_finished=lambda h: metrics.observe_finished(h.seq, h.arrival_s)
                      if h.seq is not None else None)
    spec = loaded.spec
    state = ServerState(loop=loop, tokenizer=loaded.tokenizer,
                        model_name=args.served_model_name or spec.name,
                        max_context_tokens=engine.max_context_tokens,
                        vocab_size=spec.vocab_size, tenants=tenants, metrics=metrics,
                        max_queue=args.max_queue, created=int(time.time()),
                        block_tokens=config.block_tokens,
                        pool_tokens=config.num_blocks * config.block_tokens,
                        block_bytes=link.ns.block_bytes, tool_parser=args.tool_call_parser,
                        grammar=engine.grammar, sampling_defaults=loaded.sampling_defaults,
                        kv_role=args.kv_role,
                        kv_transfer_timeout_s=args.kv_transfer_timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        loop.close()
        publisher.close()
        raise EngineInputError(f"--listen {args.listen}: {e.strerror}") from None
    bound = sock.getsockname()
    if publisher.endpoint is not None:
        print(f"kv events on {publisher.endpoint}"
              + (f", replay on {publisher.replay_endpoint}" if publisher.replay_endpoint
                 else ""), flush=True)
    print(f"listening on {host}:{bound[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(create_app(state), log_level=args.log_level,
                                           access_log=args.log_level in ("debug", "info"),
                                           timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        loop.close()
        publisher.close()
        sock.close()
    return 0


def kv_events_config(args: argparse.Namespace, block_tokens: int) -> KvEventsConfig | None:
    """The --kv-events-* flags, checked before the model loads."""
    if args.kv_events_endpoint is None:
        if args.kv_events_replay_endpoint is not None:
            raise EngineInputError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        return None
    return KvEventsConfig(endpoint=args.kv_events_endpoint,
                          replay_endpoint=args.kv_events_replay_endpoint,
                          block_tokens=block_tokens, topic=args.kv_events_topic)
