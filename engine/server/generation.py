"""A request's choices as they run: their events read off the shared queue, their text
(stop strings, stop token ids), log probabilities and tool calls, and the response built
from them, whole or as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from engine.core.sequence import TokenLogprob
from engine.errors import EngineInputError
from engine.server.engine_loop import DoneEvent, ErrorEvent, Event, Handle, TokensEvent
from engine.server.errors import APIError, bad_request, internal
from engine.server.kv_transfer import prompt_committed
from engine.server.metrics import cached_tokens, replayed_tokens, ttft_parts
from engine.server.protocol import GenerationRequest
from engine.server.responses import chat_logprobs, completion_logprobs
from engine.server.text_stream import TextStream
from engine.server.tool_parsers import HermesStream, parse_hermes

if TYPE_CHECKING:
    from engine.server.state import ServerState

DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


@dataclass
class Choice:
    """What the handler knows of one choice as it runs."""

    handle: Handle
    stream: TextStream
    stop_ids: frozenset[int]
    completion_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tools: HermesStream | None = None  # streamed tool-call parsing
    sent_chars: int = 0  # text sent so far (completions' text_offset)


@dataclass(frozen=True, slots=True)
class Piece:
    choice: int
    text: str
    logprobs: list[TokenLogprob]


def parses_tools(state: ServerState, req: GenerationRequest) -> bool:
    """``auto`` with a parser; ``required`` and named always (their grammar writes hermes
    calls)."""
    if req.chat is None or req.chat.tools is None:
        return False
    mode = req.chat.tool_choice.mode
    return mode in ("required", "named") or (mode == "auto" and state.tool_parser is not None)


def new_choices(state: ServerState, req: GenerationRequest, handles: list[Handle]
                ) -> list[Choice]:
    tools = parses_tools(state, req)
    return [Choice(h, TextStream(state.tokenizer, req.stop),
                   frozenset(req.params.stop_token_ids),
                   tools=HermesStream(None if req.parallel_tool_calls else 1) if tools
                   else None)
            for h in handles]


async def run_choices(state: ServerState, request: Request, choices: list[Choice]
                      ) -> AsyncIterator[Piece]:
    """Yields text pieces until every choice ends; fills ``choices``. Aborts them all when
    the client disconnects (and then stops quietly); a stop string aborts its own."""
    queue: asyncio.Queue[Event] = choices[0].handle.events
    pending = set(range(len(choices)))
    next_check = time.monotonic() + DISCONNECT_POLL_S
    while pending:
        event: Event | None = None
        with contextlib.suppress(TimeoutError):
            event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
        # Checked on a clock, not only when idle: tokens may flow faster than the timeout.
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                abort_all(state, choices)
                return
        if event is None or event.choice not in pending:
            continue  # a choice already ended by a stop string may still report
        c = choices[event.choice]
        if isinstance(event, ErrorEvent):
            err = event.error
            if isinstance(err, (EngineInputError, ValueError)):
                raise bad_request(str(err))
            raise internal(f"the engine failed: {type(err).__name__}: {err}")
        if isinstance(event, TokensEvent):
            c.completion_tokens += len(event.token_ids)
            c.logprobs += event.logprobs
            # A stop token ends the answer and is not part of its text (as vLLM).
            delta = c.stream.add([t for t in event.token_ids if t not in c.stop_ids])
            if c.stream.stopped:
                state.loop.abort(c.handle, reason="stop")
                await prompt_committed(state, c.handle)
                c.finish_reason = "stop"
                pending.discard(event.choice)
            yield Piece(event.choice, delta, list(event.logprobs))
        elif isinstance(event, DoneEvent):
            await prompt_committed(state, c.handle)
            c.finish_reason = "length" if event.seq.finish_reason == "length" else "stop"
            pending.discard(event.choice)
            yield Piece(event.choice, c.stream.finish(), [])


def abort_all(state: ServerState, choices: list[Choice]) -> None:
    for c in choices:
        if c.finish_reason is None:
            state.loop.abort(c.handle)


def usage(choices: list[Choice], prompt_tokens: int) -> dict[str, Any]:
    """Prompt tokens counted once (the choices share the prompt, as OpenAI counts it);
    cached tokens are the first choice's (its siblings hit what it computed)."""
    seq = choices[0].handle.seq
    done = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
            "total_tokens": prompt_tokens + done,
            # replayed_tokens (an extra field, as vLLM adds them): > 0 when bounded replay
            # served the hit, recomputing that many of its tokens; 0 in exact mode.
            "prompt_tokens_details": {
                "cached_tokens": 0 if seq is None else cached_tokens(seq),
                "replayed_tokens": 0 if seq is None else replayed_tokens(seq)}}


def timing(choices: list[Choice]) -> dict[str, Any]:
    """The ``kvengine`` extension of the last chunk: hits per tier, the TTFT split and the
    serving process's id (for replays through a router, which replica served the request;
    OpenAI clients ignore unknown fields)."""
    handle = choices[0].handle
    if handle.seq is None:
        return {}
    return {"hit_tokens": dict(handle.seq.stats.hit_tokens),
            **ttft_parts(handle.seq, handle.arrival_s), "pid": os.getpid()}


def _message(state: ServerState, req: GenerationRequest, c: Choice) -> tuple[dict, str]:
    text = c.stream.text
    finish = c.finish_reason or "stop"
    if c.tools is None or not parses_tools(state, req):
        return {"role": "assistant", "content": text}, finish
    parsed = parse_hermes(text)
    calls = parsed.calls if req.parallel_tool_calls else parsed.calls[:1]
    if not calls:
        return {"role": "assistant", "content": text}, finish
    return ({"role": "assistant", "content": parsed.content,
             "tool_calls": [call.body() for call in calls]}, "tool_calls")


def response_body(state: ServerState, req: GenerationRequest, choices: list[Choice],
                  rid: str, echo: str, prompt_tokens: int) -> dict[str, Any]:
    tok = state.tokenizer
    out = []
    for i, c in enumerate(choices):
        if req.kind == "completion":
            lp = (completion_logprobs(tok, c.logprobs, len(echo))
                  if req.params.logprobs is not None else None)
            out.append({"index": i, "text": echo + c.stream.text, "logprobs": lp,
                        "finish_reason": c.finish_reason})
        else:
            message, finish = _message(state, req, c)
            lp = chat_logprobs(tok, c.logprobs) if req.params.logprobs is not None else None
            out.append({"index": i, "message": message, "logprobs": lp,
                        "finish_reason": finish})
    return {"id": rid, "object": "text_completion" if req.kind == "completion"
            else "chat.completion", "created": int(time.time()), "model": state.model_name,
            "choices": out, "usage": usage(choices, prompt_tokens)}


async def sse(state: ServerState, request: Request, req: GenerationRequest,
              choices: list[Choice], rid: str, echo: str, prompt_tokens: int
              ) -> AsyncIterator[str]:
    created = int(time.time())
    chat = req.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"
    tok = state.tokenizer
    want_lp = req.params.logprobs is not None

    def chunk(i: int, delta: dict[str, Any] | str, finish: str | None = None,
              logprobs: list[TokenLogprob] | None = None) -> str:
        c = choices[i]
        if chat:
            lp = chat_logprobs(tok, logprobs or []) if want_lp and logprobs else None
            choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": lp,
                                      "finish_reason": finish}
        else:
            assert isinstance(delta, str)
            lp = (completion_logprobs(tok, logprobs or [], c.sent_chars)
                  if want_lp and logprobs else None)
            c.sent_chars += len(delta)
            choice = {"index": i, "text": delta, "logprobs": lp, "finish_reason": finish}
        body: dict[str, Any] = {"id": rid, "object": obj, "created": created,
                                "model": state.model_name, "choices": [choice]}
        if req.include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    def pieces(p: Piece, finishing: bool) -> list[str]:
        """The chunks of one piece of text (and, for chat with tools, its calls)."""
        c = choices[p.choice]
        if not chat:
            return [chunk(p.choice, p.text, None, p.logprobs)] if p.text or p.logprobs else []
        if c.tools is None:
            text, calls = p.text, []
        else:
            text, calls = c.tools.feed(p.text)
            if finishing:
                more, more_calls = c.tools.finish()
                text, calls = text + more, calls + more_calls
        out = []
        if text or (p.logprobs and not calls):
            out.append(chunk(p.choice, {"content": text}, None, p.logprobs))
        if calls:
            out.append(chunk(p.choice, {"tool_calls": calls}, None,
                             None if text else p.logprobs))
        return out

    done = False
    try:
        for i in range(len(choices)):
            if chat:
                yield chunk(i, {"role": "assistant", "content": ""})
            elif echo:
                yield chunk(i, echo)
        try:
            async for p in run_choices(state, request, choices):
                c = choices[p.choice]
                for line in pieces(p, finishing=c.finish_reason is not None):
                    yield line
                if c.finish_reason is not None:
                    finish = ("tool_calls" if c.tools is not None and c.tools.calls
                              else c.finish_reason)
                    yield chunk(p.choice, {} if chat else "", finish)
        except APIError as e:  # headers are sent: report it in the stream, as OpenAI does
            yield f"data: {json.dumps(e.body())}\n\n"
            done = True
            return
        if any(c.finish_reason is None for c in choices):
            return  # the client went away: nobody to write to
        if req.include_usage:
            last = {"id": rid, "object": obj, "created": created, "model": state.model_name,
                    "choices": [], "usage": usage(choices, prompt_tokens),
                    "kvengine": timing(choices)}
            yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"
        done = True
    finally:
        if not done:  # cancelled (disconnect) or failed mid-stream: free the sequences
            abort_all(state, choices)
