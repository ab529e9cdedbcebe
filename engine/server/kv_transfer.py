"""Prefill/decode disaggregation through the store (``kvengine serve --kv-role``), speaking
the ``kv_transfer_params`` protocol vllm-router's vLLM PD mode drives.

The router sends each request twice. First to a prefill replica, with ``max_tokens`` 1,
``stream`` false and ``kv_transfer_params: {"do_remote_decode": true, ...}``; that replica
computes the prompt, commits its full blocks to the shared store and, once the commit is
over, answers with a top-level ``kv_transfer_params`` the router forwards, unchanged, in
the second request, to a decode replica. Ours are::

    {"do_remote_prefill": true, "do_remote_decode": false,
     "kvstore_blocks": N,          # leading prompt blocks the store serves (looked up)
     "kvstore_namespace": "hex"}   # the request's namespace fingerprint

The decode replica waits (at most ``--kv-transfer-timeout``) until the store shows those
``N`` blocks of the prompt's chain, then admits the request as any other: it loads what
the store holds and computes the rest (at most the last partial block). A wait that times
out (the prefill died, the store lost the blocks), a namespace that is not this replica's
(another checkpoint or tenant: nothing to wait for) or a load that fails all end the same
way: the decode replica computes what it lacks; the answer is the same, only slower.

vLLM's NixlConnector fields (``remote_engine_id``, ``remote_block_ids``, ``remote_host``,
``remote_port``, ``remote_request_id``, ``tp_size``) are accepted and mean nothing here (the
store is the transport); a field neither vLLM nor we define is ignored with a debug line,
as vLLM's connectors ignore what they do not read. A request the replica's role does not
fit is a 400: ``do_remote_prefill`` to a ``prefill`` replica, ``do_remote_decode`` to a
``decode`` replica, both at once, or ``do_remote_decode`` with ``stream`` (its parameters
come back in the response body).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from engine.connector.handoff import POLL_S, CommitReceipt
from engine.kv.request_scope import RequestScope
from engine.server.errors import APIError, bad_request

if TYPE_CHECKING:
    from engine.server.engine_loop import Handle
    from engine.server.state import ServerState

log = logging.getLogger("engine.server")
KVRole = Literal["prefill", "decode", "both"]
KV_ROLES: tuple[KVRole, ...] = ("prefill", "decode", "both")
PARAM = "kv_transfer_params"
#: Fields vLLM's KV connectors define: accepted, without effect here.
VLLM_FIELDS = frozenset({"remote_engine_id", "remote_block_ids", "remote_host", "remote_port",
                         "remote_request_id", "tp_size"})
OUR_FIELDS = frozenset({"do_remote_decode", "do_remote_prefill", "kvstore_blocks",
                        "kvstore_namespace"})


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """What a request's ``kv_transfer_params`` ask of this replica."""

    remote_decode: bool  # prefill only: another replica decodes (commit, then answer)
    remote_prefill: bool  # another replica prefilled: wait for its blocks, then load
    blocks: int | None = None  # blocks the prefill replica made visible (None: not said)
    namespace: str | None = None  # the prefill's namespace fingerprint, hex


def _flag(params: Mapping[str, Any], name: str) -> bool:
    v = params.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_request(f"{PARAM}.{name} must be a boolean", param=PARAM)
    return v


def parse_kv_transfer(value: Any) -> KVTransfer | None:
    """The request body's ``kv_transfer_params`` (None: absent). Bad types are a 400."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{PARAM} must be an object", param=PARAM)
    unknown = sorted(set(value) - OUR_FIELDS - VLLM_FIELDS)
    if unknown:
        log.debug("%s: ignoring fields this server does not define: %s", PARAM,
                  ", ".join(map(str, unknown)))
    blocks = value.get("kvstore_blocks")
    if blocks is not None and (not isinstance(blocks, int) or isinstance(blocks, bool)
                               or blocks < 0):
        raise bad_request(f"{PARAM}.kvstore_blocks must be an integer >= 0", param=PARAM)
    ns = value.get("kvstore_namespace")
    if ns is not None and not isinstance(ns, str):
        raise bad_request(f"{PARAM}.kvstore_namespace must be a string", param=PARAM)
    return KVTransfer(remote_decode=_flag(value, "do_remote_decode"),
                      remote_prefill=_flag(value, "do_remote_prefill"),
                      blocks=blocks, namespace=ns)


def check_role(role: str, transfer: KVTransfer | None, stream: bool) -> None:
    """A 400 when the request asks this replica for a side of the hand-off it does not
    play (``--kv-role``), or for both sides at once."""
    if transfer is None:
        return
    if transfer.remote_decode and transfer.remote_prefill:
        raise _role_error("do_remote_decode and do_remote_prefill are both true: a replica "
                          "either prefills for another or decodes after one")
    if transfer.remote_decode and role == "decode":
        raise _role_error("this replica is --kv-role decode: it does not prefill for "
                          "another replica (do_remote_decode)")
    if transfer.remote_prefill and role == "prefill":
        raise _role_error("this replica is --kv-role prefill: it does not decode what "
                          "another replica prefilled (do_remote_prefill)")
    if transfer.remote_decode and stream:
        raise _role_error("a prefill request (do_remote_decode) cannot be streamed: its "
                          f"{PARAM} come back in the response body")


def _role_error(message: str) -> APIError:
    return APIError(400, message, type_="invalid_request_error", code="kv_role_mismatch",
                    param=PARAM)


async def _until(done: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    """Poll ``done`` every ``POLL_S`` until it is true (True) or ``timeout_s`` passes
    (False). It sleeps on the event loop, never in a thread: the loop's executor has a
    handful of threads, and many hand-offs may wait at once."""
    deadline = time.monotonic() + timeout_s
    while not await done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def receipt_over(receipt: CommitReceipt, timeout_s: float) -> bool:
    """Wait (at most ``timeout_s``) until ``receipt``'s commits are over; False at the
    timeout. Woken by the committer's thread the moment they are, not by a poll."""
    if receipt.done:
        return True
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def from_any_thread() -> None:
        loop.call_soon_threadsafe(wake)

    receipt.add_done_callback(from_any_thread)
    try:
        await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        return False
    return True


async def prompt_committed(state: ServerState, handle: Handle) -> None:
    """Before a request's answer ends: wait (at most ``--kv-transfer-timeout``) until the
    commit of its prompt, sent when its prefill completed, is over, so that the client's
    next turn finds the prompt in the shared store on whichever replica a router sends it
    to. Nothing to wait for without a store or when the request never computed its
    prompt. The engine never waits: only this answer's last chunk does."""
    seq = handle.seq
    pc = None if seq is None else seq.prefill_commit
    if pc is None:
        return
    if not await receipt_over(pc.receipt, state.kv_transfer_timeout_s):
        log.warning("the commit of a prompt's %d blocks was not over in %.1f s "
                    "(--kv-transfer-timeout): answering without it", pc.blocks,
                    state.kv_transfer_timeout_s)


async def hand_off(state: ServerState, handle: Handle) -> dict[str, Any]:
    """Prefill side, after the request finished: wait (bounded) for its commit to be over,
    then tell the decode replica how many prompt blocks the store serves."""
    engine = state.loop.engine
    start = time.perf_counter()
    over = True
    if handle.receipt is not None:
        over = await receipt_over(handle.receipt, state.kv_transfer_timeout_s)
    blocks = await asyncio.to_thread(engine.visible_prompt_blocks, handle.token_ids,
                                     handle.scope)
    full = len(handle.token_ids) // state.block_tokens
    state.metrics.kv_transfer_wait.labels("prefill").observe(time.perf_counter() - start)
    state.metrics.kv_transfers.labels("prefill",
                                      "complete" if blocks >= full else "partial").inc()
    if blocks < full:
        log.warning("prefill hand-off: the store serves %d of the prompt's %d blocks%s; the "
                    "decode replica computes the rest", blocks, full,
                    "" if over else " (the commit was not over in --kv-transfer-timeout)")
    return {"do_remote_prefill": True, "do_remote_decode": False, "kvstore_blocks": blocks,
            "kvstore_namespace": engine.namespace_of(handle.scope).fingerprint.hex()}


async def take_over(state: ServerState, ids: list[int], scope: RequestScope,
                    transfer: KVTransfer) -> None:
    """Decode side, before admission: wait (bounded) until the store serves the blocks the
    prefill replica reported. Whatever it finds, the request then runs (a miss is
    computed)."""
    engine = state.loop.engine
    if transfer.blocks is None or transfer.blocks == 0 or not engine.link.enabled:
        return  # nothing reported (e.g. a vLLM prefill), or no store: admission decides
    own = engine.namespace_of(scope).fingerprint.hex()
    if transfer.namespace is not None and transfer.namespace != own:
        state.metrics.kv_transfers.labels("decode", "namespace_mismatch").inc()
        log.warning("decode hand-off: the prefill replica used namespace %s, this replica "
                    "uses %s (another checkpoint, block size or tenant): computing the "
                    "prompt", transfer.namespace, own)
        return
    start = time.perf_counter()
    want = min(transfer.blocks, len(ids) // state.block_tokens)
    seen = 0

    async def visible() -> bool:
        nonlocal seen
        seen = await asyncio.to_thread(engine.visible_prompt_blocks, ids, scope)
        return seen >= want

    arrived = await _until(visible, state.kv_transfer_timeout_s)
    state.metrics.kv_transfer_wait.labels("decode").observe(time.perf_counter() - start)
    state.metrics.kv_transfers.labels("decode", "complete" if arrived else "timeout").inc()
    if not arrived:
        log.warning("decode hand-off: the store serves %d of the %d blocks the prefill "
                    "replica reported after %.1f s; computing the rest", seen, want,
                    state.kv_transfer_timeout_s)
