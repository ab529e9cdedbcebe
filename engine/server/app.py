"""The OpenAI-compatible HTTP API over the engine loop (FastAPI).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as server-sent
events when ``stream`` is true), ``GET /v1/models``, ``GET /health`` and ``GET /metrics``
(these two need no token). Handlers only parse, tokenize and wait on their request's event
queue; the engine runs on its own thread (``engine.server.engine_loop``). A client that goes
away (noticed while waiting, streamed or not) has its sequence aborted at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.errors import EngineInputError
from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults
from engine.model.tokenizer import Tokenizer
from engine.server.engine_loop import (
    DoneEvent,
    EngineLoop,
    ErrorEvent,
    Event,
    Handle,
    TokensEvent,
)
from engine.server.errors import APIError, bad_request, internal, not_found, overloaded
from engine.server.metrics import ServerMetrics, cached_tokens, replayed_tokens, ttft_parts
from engine.server.protocol import GenerationRequest, Kind, parse_request
from engine.server.tenants import Tenants
from engine.server.text_stream import TextStream

DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


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
    sampling_defaults: SamplingDefaults = NO_DEFAULTS


@dataclass
class _Result:
    """What a handler knows of its request as it ends."""

    stream: TextStream
    completion_tokens: int = 0
    finish_reason: str | None = None
    handle: Handle | None = None

    def timing(self) -> dict[str, Any]:
        """The ``kvengine`` extension of the last chunk: hits per tier and the TTFT split
        (for replays; OpenAI clients ignore unknown fields)."""
        handle = self.handle
        if handle is None or handle.seq is None:
            return {}
        seq = handle.seq
        return {"hit_tokens": dict(seq.stats.hit_tokens),
                **ttft_parts(seq, handle.arrival_s)}

    def usage(self, prompt_tokens: int) -> dict[str, Any]:
        seq = None if self.handle is None else self.handle.seq
        cached = 0 if seq is None else cached_tokens(seq)
        # replayed_tokens (an extra field, as vLLM adds them): > 0 when bounded replay served
        # the hit, recomputing that many of its tokens; 0 in exact mode.
        replayed = 0 if seq is None else replayed_tokens(seq)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached,
                                          "replayed_tokens": replayed}}


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

    return app


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
    assert req.messages is not None
    if not tok.has_chat_template:
        raise bad_request("this model has no chat template: use /v1/completions",
                          param="messages")
    try:
        return tok.encode_chat(req.messages, add_generation_prompt=True)
    except EngineInputError as e:
        raise bad_request(f"the chat template failed: {e}", param="messages") from None


async def _generate(state: ServerState, request: Request, kind: Kind) -> Response:
    arrival = time.perf_counter()
    tenant = state.tenants.authenticate(request.headers.get("authorization"))
    req = parse_request(await _read_json(request), kind, state.vocab_size,
                        state.sampling_defaults)
    if req.model != state.model_name:
        raise not_found(f"model {req.model!r} is not served here (it serves "
                        f"{state.model_name!r})", param="model")
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
        params = replace(params, max_new_tokens=room)
    handle = Handle(ids, params, state.tenants.scope(tenant, req.cache_salt),
                    asyncio.get_running_loop(), arrival_s=arrival)
    if not state.loop.try_submit(handle, state.max_queue):
        raise overloaded(state.retry_after_s)
    rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex
    if req.stream:
        return StreamingResponse(_sse(state, request, req, handle, rid, n),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    result = _Result(TextStream(state.tokenizer, req.stop), handle=handle)
    try:
        async for _ in _events(state, request, handle, result):
            pass
    except asyncio.CancelledError:
        state.loop.abort(handle)
        raise
    text = result.stream.text
    if kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": result.finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": result.finish_reason}
        obj = "chat.completion"
    return JSONResponse({"id": rid, "object": obj, "created": int(time.time()),
                         "model": state.model_name, "choices": [choice],
                         "usage": result.usage(n)})


async def _events(state: ServerState, request: Request, handle: Handle, result: _Result
                  ) -> AsyncIterator[str]:
    """Yields text deltas until the request ends; fills ``result``. Aborts the sequence
    when the client disconnects (and then stops quietly) or a stop string appears."""
    next_check = time.monotonic() + DISCONNECT_POLL_S
    while True:
        event: Event | None = None
        with contextlib.suppress(TimeoutError):
            event = await asyncio.wait_for(handle.events.get(), DISCONNECT_POLL_S)
        # Checked on a clock, not only when idle: tokens may flow faster than the timeout.
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                state.loop.abort(handle)
                return
        if event is None:
            continue
        if isinstance(event, ErrorEvent):
            err = event.error
            if isinstance(err, (EngineInputError, ValueError)):
                raise bad_request(str(err))
            raise internal(f"the engine failed: {type(err).__name__}: {err}")
        if isinstance(event, TokensEvent):
            result.completion_tokens += len(event.token_ids)
            delta = result.stream.add(event.token_ids)
            if result.stream.stopped:
                state.loop.abort(handle, reason="stop")
                result.finish_reason = "stop"
                if delta:
                    yield delta
                return
            if delta:
                yield delta
        elif isinstance(event, DoneEvent):
            result.finish_reason = "length" if event.seq.finish_reason == "length" else "stop"
            tail = result.stream.finish()
            if tail:
                yield tail
            return


async def _sse(state: ServerState, request: Request, req: GenerationRequest, handle: Handle,
               rid: str, prompt_tokens: int) -> AsyncIterator[str]:
    created = int(time.time())
    result = _Result(TextStream(state.tokenizer, req.stop), handle=handle)
    chat = req.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", "content": text or ""}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish}
        body: dict[str, Any] = {"id": rid, "object": obj, "created": created,
                                "model": state.model_name, "choices": [choice]}
        if req.include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    done = False
    try:
        if chat:
            yield chunk(None, None, first=True)
        try:
            async for delta in _events(state, request, handle, result):
                yield chunk(delta, None)
        except APIError as e:  # headers are sent: report it in the stream, as OpenAI does
            yield f"data: {json.dumps(e.body())}\n\n"
            done = True
            return
        if result.finish_reason is None:
            return  # the client went away: nobody to write to
        yield chunk(None, result.finish_reason)
        if req.include_usage:
            usage = {"id": rid, "object": obj, "created": created, "model": state.model_name,
                     "choices": [], "usage": result.usage(prompt_tokens),
                     "kvengine": result.timing()}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
        done = True
    finally:
        if not done:  # cancelled (disconnect) or failed mid-stream: free the sequence
            state.loop.abort(handle)
