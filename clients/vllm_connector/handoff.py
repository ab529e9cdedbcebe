"""Prefill/decode hand-off through the store for vLLM: the ``kv_transfer_params`` protocol
``kvengine serve --kv-role`` speaks (engine/server/kv_transfer.py), so vllm-router's vLLM
PD mode drives a ``kv_producer`` / ``kv_consumer`` pair of vLLM processes, or a mixed pair
with ``kvengine``, through one store. Read without vLLM (the project's tests check it).

- Producer (``request_finished`` of a request whose params say ``do_remote_decode``): the
  response carries ``{"do_remote_prefill": true, "do_remote_decode": false,
  "kvstore_blocks": N, "kvstore_namespace": hex}``, ``N`` the prompt's full blocks, which
  the worker committed after the step that computed them (vLLM answers before that commit
  is over, so the consumer waits for it, not the producer).
- Consumer (``get_num_new_matched_tokens`` of a request with ``do_remote_prefill``): while
  the store serves fewer than ``N`` of the prompt's blocks, and ``kv_transfer_timeout_s``
  has not passed since the request arrived, it answers "not known yet" (vLLM asks again on
  a later step); then it offers what the store holds as any hit, and vLLM computes the
  rest. Another namespace (another checkpoint, dtype or tenant) is nothing to wait for.
- The transfer's budget: the store is the transport of a PD hand-off, and
  ``kv_transfer_timeout_s`` bounds the whole of it, not only the wait for the blocks. The
  consumer's load of them and the producer's commit of a ``do_remote_decode`` request get
  what is left of that budget as their deadline (at least ``call_timeout_s``): one store
  call slower than ``call_timeout_s`` — the first calls of a fresh process on a loaded
  machine take seconds — would otherwise throw the whole prefill away (the consumer
  computes every token; a lost commit leaves it waiting for blocks that never come).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.keys import Namespace

log = logging.getLogger("vllm.kvstore")  # vLLM's handler, when vLLM runs it


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """A consumer's wait for the blocks a producer reported."""

    blocks: int
    deadline_s: float  # time.monotonic() past which the consumer computes what is missing


def prefill_params(params: Mapping[str, Any] | None, prompt_tokens: int, block_tokens: int,
                   ns: Namespace) -> dict[str, Any] | None:
    """The producer's answer for a request with ``params`` (None: not a prefill request)."""
    if not params or params.get("do_remote_decode") is not True:
        return None
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "kvstore_blocks": prompt_tokens // block_tokens,
            "kvstore_namespace": ns.fingerprint.hex()}


def remote_prefill(params: Mapping[str, Any] | None, ns: Namespace, now_s: float,
                   timeout_s: float) -> RemotePrefill | None:
    """What a consumer must wait for before it looks the request up for good (None:
    nothing; the request is looked up as any other)."""
    if not params or params.get("do_remote_prefill") is not True:
        return None
    blocks = params.get("kvstore_blocks")
    if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks <= 0:
        return None  # not ours (e.g. NixlConnector's fields), or nothing committed
    theirs = params.get("kvstore_namespace")
    if theirs is not None and theirs != ns.fingerprint.hex():
        log.warning("KVStoreConnector: the prefill used namespace %s, this consumer %s "
                    "(another checkpoint, dtype, block size or tenant): computing the "
                    "prompt", theirs, ns.fingerprint.hex())
        return None
    return RemotePrefill(blocks=blocks, deadline_s=now_s + timeout_s)


def commit_timeout_s(params: Mapping[str, Any] | None, call_timeout_s: float,
                     transfer_timeout_s: float) -> float:
    """The deadline of a producer's commit for a request with ``params``: the transfer's
    budget for a prefill its consumer waits for, else one store call's."""
    if params and params.get("do_remote_decode") is True:
        return max(call_timeout_s, transfer_timeout_s)
    return call_timeout_s


class ConsumerWaits:
    """The consumer's requests waiting for their producer's blocks, by request id, and the
    transfer deadlines of those whose blocks came (until ``forget``)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._waits: dict[str, RemotePrefill] = {}
        self._came: dict[str, float] = {}  # req_id -> the transfer's deadline (monotonic)

    def waiting(self, req_id: str, params: Mapping[str, Any] | None, ns: Namespace,
                hit: int, chain: int, now_s: float | None = None) -> bool:
        """True while the request must wait: its producer reported more of the prompt's
        ``chain`` blocks than the store serves (``hit``), and its time is not up."""
        now = time.monotonic() if now_s is None else now_s
        known = self._waits.get(req_id)
        wait = known or remote_prefill(params, ns, now, self.timeout_s)
        if wait is None or hit >= min(wait.blocks, chain):
            self._waits.pop(req_id, None)
            if wait is not None:
                self._came[req_id] = wait.deadline_s
                log.info("KVStoreConnector: %s: the store serves %d of the %d blocks its "
                         "prefill reported, after %.2f s", req_id, hit, wait.blocks,
                         now - (wait.deadline_s - self.timeout_s))
            return False
        if now < wait.deadline_s:
            if known is None:
                log.info("KVStoreConnector: %s: waiting for the %d blocks its prefill "
                         "reported (the store serves %d)", req_id, wait.blocks, hit)
            self._waits[req_id] = wait
            return True
        del self._waits[req_id]
        log.warning("KVStoreConnector: the store serves %d of the %d blocks the prefill "
                    "reported for %s after %.1f s; computing the rest", hit, wait.blocks,
                    req_id, self.timeout_s)
        return False

    def load_timeout_s(self, req_id: str, call_timeout_s: float,
                       now_s: float | None = None) -> float:
        """The deadline of the load of ``req_id``'s blocks: what is left of its transfer's
        budget when its producer's blocks came, else (not a hand-off) one store call's."""
        deadline = self._came.get(req_id)
        if deadline is None:
            return call_timeout_s
        now = time.monotonic() if now_s is None else now_s
        return max(call_timeout_s, deadline - now)

    def forget(self, req_id: str) -> None:
        self._waits.pop(req_id, None)
        self._came.pop(req_id, None)

    def __len__(self) -> int:
        return len(self._waits)
