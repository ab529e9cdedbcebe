"""What every handler of ``kvengine serve`` shares: the engine loop, the tokenizer, the
served model's name and limits, tenants, metrics and the request options the server was
started with (its own module, so the app and the generation helpers both import it)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults
from engine.model.tokenizer import Tokenizer
from engine.server.engine_loop import EngineLoop
from engine.server.metrics import ServerMetrics
from engine.server.tenants import Tenants
from engine.structured.backend import GrammarBackend


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Tokenizer
    model_name: str
    max_context_tokens: int
    vocab_size: int
    tenants: Tenants
    metrics: ServerMetrics
    max_queue: int
    # What a replay client needs to know to scale a trace and predict its hits.
    block_tokens: int = 64
    pool_tokens: int = 0
    block_bytes: int = 0
    retry_after_s: int = 1
    created: int = 0
    sampling_defaults: SamplingDefaults = NO_DEFAULTS  # generation_config.json's
    tool_parser: str | None = None  # --tool-call-parser
    grammar: GrammarBackend | None = None  # structured outputs (the engine's own)
    # --kv-role (engine.server.kv_transfer.KV_ROLES): the side of a PD hand-off it plays
    kv_role: str = "both"
    kv_transfer_timeout_s: float = 10.0  # --kv-transfer-timeout: a hand-off's longest wait
