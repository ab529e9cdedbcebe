"""The OpenAI-compatible HTTP API over the engine loop (FastAPI).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as server-sent
events when ``stream`` is true), ``POST /tokenize`` (vLLM's: the token ids a completion or
chat request's prompt becomes here, which is what a router's ``kv_aware`` policy matches
against the pool's KV events), ``GET /v1/models``, ``GET /health`` and ``GET /metrics``
(these two need no token), and ``POST /reset_prefix_cache`` (vLLM's: the pool forgets its
prefix index, announced as ``AllBlocksCleared``; 409 while requests hold blocks). Handlers
only parse, tokenize and wait on their request's event queue; the engine runs on its own
thread (``engine.server.engine_loop``). A client that goes away (noticed while waiting,
streamed or not) has its sequence aborted at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.connector.handoff import CommitReceipt
from engine.core.llm_engine import LLMEngine
from engine.errors import EngineInputError
from engine.server.chat_request import render_chat
from engine.server.engine_loop import Handle
from engine.server.errors import APIError, bad_request, not_found, overloaded
from engine.server.generation import abort_all, new_choices, response_body, run_choices, sse
from engine.server.kv_transfer import check_role, hand_off, take_over
from engine.server.protocol import GenerationRequest, Kind, parse_request
from engine.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="kvengine", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if exc.status in (503, 429):
            state.metrics.rejected.labels("queue_full").inc()
        elif exc.status == 401:
            state.metrics.rejected.labels("unauthorized").inc()
        elif exc.status == 400:
            state.metrics.rejected.labels("bad_request").inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        state.tenants.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [
            {"id": state.model_name, "object": "model", "created": state.created,
             "owned_by": "kvengine", "max_model_len": state.max_context_tokens,
             "kvengine": {"block_tokens": state.block_tokens, "pool_tokens": state.pool_tokens,
                          "block_bytes": state.block_bytes, "vocab_size": state.vocab_size,
                          "max_context_tokens": state.max_context_tokens}}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _generate(state, request, "completion")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await _generate(state, request, "chat")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        state.tenants.authenticate(request.headers.get("authorization"))
        return _tokenize(state, await _read_json(request))

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        """vLLM's route: forget the pool's prefix index (the store keeps its blocks)."""
        state.tenants.authenticate(request.headers.get("authorization"))
        await _reset_prefix_cache(state)
        return Response(status_code=200)

    return app


async def _reset_prefix_cache(state: ServerState) -> None:
    """On the engine thread, between steps: every cached pool block is forgotten and the KV
    events say so (``AllBlocksCleared``), so a ``kv_aware`` router stops sending sessions
    here for blocks that are gone. As vLLM's, only while no request holds a block: a held
    block's key is still its owner's. That is a 409 here (vLLM only logs it), so the caller
    knows nothing was reset and may retry once the replica is idle."""
    def reset(engine: LLMEngine) -> bool:
        return engine.blocks.pool.reset_prefix_cache()

    if not await asyncio.wrap_future(state.loop.call(reset)):
        raise APIError(409, "requests in flight hold pool blocks: the prefix cache was not "
                       "reset; retry once the replica is idle", type_="invalid_request_error",
                       code="prefix_cache_in_use")


# vLLM's /tokenize fields that shape the prompt; the rest (return_token_strs, ...) change
# nothing here. add_special_tokens is not among them: the ids are those a generation
# request with the same prompt is served from, whatever the caller asks.
_TOKENIZE_FIELDS = ("model", "prompt", "messages", "add_generation_prompt",
                    "continue_final_message", "chat_template_kwargs", "tools")


def _tokenize(state: ServerState, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    kind: Kind = "chat" if "messages" in body else "completion"
    fields = {k: v for k, v in body.items() if k in _TOKENIZE_FIELDS}
    fields.setdefault("model", state.model_name)
    req = parse_request(fields, kind, state.vocab_size, state.sampling_defaults)
    if req.model != state.model_name:
        raise not_found(f"model {req.model!r} is not served here (it serves "
                        f"{state.model_name!r})", param="model")
    ids = _prompt_ids(state, req)
    return {"count": len(ids), "max_model_len": state.max_context_tokens, "tokens": ids,
            "token_strs": None}


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}",
                          code="invalid_json") from None


def _prompt_ids(state: ServerState, req: GenerationRequest) -> list[int]:
    tok = state.tokenizer
    if req.prompt_ids is not None:
        return req.prompt_ids
    if req.prompt_text is not None:
        return tok.encode(req.prompt_text, add_special_tokens=True)
    assert req.chat is not None
    return render_chat(tok, req.chat)


async def _generate(state: ServerState, request: Request, kind: Kind) -> Response:
    arrival = time.perf_counter()
    tenant = state.tenants.authenticate(request.headers.get("authorization"))
    req = parse_request(await _read_json(request), kind, state.vocab_size,
                        state.sampling_defaults)
    if req.model != state.model_name:
        raise not_found(f"model {req.model!r} is not served here (it serves "
                        f"{state.model_name!r})", param="model")
    if (req.chat is not None and req.chat.tools is not None
            and req.chat.tool_choice.mode == "auto" and state.tool_parser is None):
        raise bad_request('tool_choice "auto" needs the server started with '
                          "--tool-call-parser", param="tool_choice")
    if req.params.constraint is not None:
        if state.grammar is None:
            raise bad_request("this server has no grammar backend", param=req.constraint_param)
        try:
            state.grammar.check(req.params.constraint)
        except EngineInputError as e:
            raise bad_request(f"{req.constraint_param}: {e}", param=req.constraint_param
                              ) from None
    ids = _prompt_ids(state, req)
    n = len(ids)
    if n == 0:
        raise bad_request("the prompt is empty", param="prompt")
    if n >= state.max_context_tokens:
        raise APIError(400, f"the prompt has {n} tokens; this model's context is "
                       f"{state.max_context_tokens} tokens, and at least one must be left for "
                       "the answer", type_="invalid_request_error",
                       code="context_length_exceeded", param="messages" if kind == "chat"
                       else "prompt")
    params = req.params
    room = state.max_context_tokens - n
    if params.max_new_tokens > room:
        if params.max_new_tokens < (1 << 30):  # asked for explicitly
            raise bad_request(f"max_tokens {params.max_new_tokens} plus the prompt's {n} tokens "
                              f"exceed the context of {state.max_context_tokens}",
                              param="max_tokens", code="context_length_exceeded")
        req = replace(req, params=replace(params, max_new_tokens=room))
    scope = state.tenants.scope(tenant, req.cache_salt)
    transfer = req.kv_transfer
    check_role(state.kv_role, transfer, req.stream)
    if transfer is not None and transfer.remote_prefill:
        await take_over(state, ids, scope, transfer)
    prefill = transfer is not None and transfer.remote_decode
    events: asyncio.Queue[Any] = asyncio.Queue()
    handles: list[Handle] = []
    for i in range(req.n):
        handles.append(Handle(ids, req.choice_params(i), scope, asyncio.get_running_loop(),
                              arrival_s=arrival, events=events, choice=i,
                              after=handles[0] if i else None,
                              receipt=CommitReceipt() if prefill and not i else None))
    if not state.loop.try_submit_all(handles, state.max_queue):
        raise overloaded(state.retry_after_s)
    choices = new_choices(state, req, handles)
    echo = ""
    if req.echo:
        echo = req.prompt_text if req.prompt_text is not None else state.tokenizer.decode(ids)
    rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex
    if req.stream:
        return StreamingResponse(sse(state, request, req, choices, rid, echo, n),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        async for _ in run_choices(state, request, choices):
            pass
    except BaseException:
        abort_all(state, choices)
        raise
    body = response_body(state, req, choices, rid, echo, n)
    if prefill:
        body["kv_transfer_params"] = await hand_off(state, handles[0])
    return JSONResponse(body)
