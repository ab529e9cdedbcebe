"""One storage node as the cluster client sees it: a channel, deadlines, and the
block encoding on the wire (DESIGN §4, §7).

Transport failures (UNAVAILABLE, DEADLINE_EXCEEDED, a refused token...) raise
``NodeUnavailable``, which the cluster turns into a fail-over; misuse the node
reports is re-raised as the kvstore error it names. Until the node has answered once, calls
wait for its channel to connect within their deadline (``kvstore.wire.contact``, the
daemon clients' rule): a cluster client started just before its nodes uses them as they
come up instead of failing on the channel's reconnect backoff; a node that never answers
costs one deadline, then calls fail fast and the cluster ejects it. Blocks received from a node are
reassembled and verified (fingerprint, key, length, checksum) before they count: a
bad block ends the node's prefix there, so it is a miss, never data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore.block import encode_block
from kvstore.errors import BlockError, InvalidArgument, StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import TierStats
from kvstore.wire import codec
from kvstore.wire.channel import bearer_metadata, open_channel
from kvstore.wire.contact import FirstContact
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from kvstore.wire.stats import tier_stats_from_proto
from kvstore.wire.status import UNAVAILABLE_CODES, error_for
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.errors import NodeUnavailable

SERVICE_NAME = "kvstore.v1.StorageNode"


def encode_blocks(
    ns: Namespace,
    keys: Sequence[Key],
    rows: Sequence[memoryview],
    checksums: Sequence[int] | None = None,
) -> list[bytes]:
    """Each row as its encoded block (DESIGN §4), built once however many replicas get it;
    ``checksums`` (made at commit) go into the headers as given, else they are computed."""
    fp = ns.fingerprint
    if checksums is None:
        return [encode_block(fp, k, row) for k, row in zip(keys, rows, strict=True)]
    return [
        encode_block(fp, k, row, checksum=c)
        for k, row, c in zip(keys, rows, checksums, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class FetchResult:
    copied: int  # verified blocks at the head of the request, written to their rows
    corrupt: int  # 1 if the block after them failed verification
    checksums: tuple[int, ...] = ()  # the stored checksum of each copied block


class NodeClient:
    def __init__(self, address: str, config: ClusterConfig) -> None:
        self.address = address
        self._md = bearer_metadata(config.auth_token)
        self._timeout_s = config.rpc_timeout_s
        self._probe_timeout_s = config.probe_timeout_s
        self._channel = open_channel(address, tls=config.tls, ca_file=config.tls_ca_file)
        self._stub = pb_grpc.StorageNodeStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self.contact = FirstContact(
            address,
            server="storage node",
            hint="is `kvstore node` listening on that address?",
            error=NodeUnavailable,
        )

    def _kw(self, timeout_s: float) -> dict[str, Any]:
        """One call's options; it waits for the channel until the node first answered."""
        return {
            "timeout": timeout_s,
            "metadata": self._md,
            "wait_for_ready": self.contact.wait_for_ready(),
        }

    def _answered(self) -> None:
        self.contact.saw(None)

    def _fail(self, e: grpc.RpcError, kw: dict[str, Any]) -> Exception:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        gave_up = self.contact.failed(
            code, e.details(), waited=kw["wait_for_ready"], timeout_s=kw["timeout"]
        )
        if gave_up is not None:
            return gave_up
        if code in UNAVAILABLE_CODES or code in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.INTERNAL,
        ):
            return NodeUnavailable(f"node {self.address}: {code.name.lower()}: {e.details()}")
        err = error_for(code, e.details())
        if isinstance(err, StoreUnavailable):
            return NodeUnavailable(f"node {self.address}: {err}")
        return err

    @staticmethod
    def _req(ns: Namespace, keys: Sequence[Key]) -> pb.NodeKeysRequest:
        return pb.NodeKeysRequest(ns=codec.ns_to_proto(ns), keys=list(keys))

    def put(self, ns: Namespace, keys: Sequence[Key], blocks: Sequence[bytes]) -> bytes:
        """Store the encoded ``blocks[i]`` (``encode_blocks``) under ``keys[i]``; returns
        one outcome byte per key (0 not stored, 1 inserted, 2 already present)."""

        def messages() -> Iterator[pb.NodePutRequest]:
            yield pb.NodePutRequest(
                open=pb.NodePutOpen(ns=codec.ns_to_proto(ns), keys=list(keys), present_ok=True)
            )
            for i, block in enumerate(blocks):
                for chunk in codec.encoded_chunks(i, block):
                    yield pb.NodePutRequest(chunk=chunk)

        kw = self._kw(self._timeout_s)
        try:
            resp = self._stub.Put(messages(), **kw)
        except grpc.RpcError as e:
            raise self._fail(e, kw) from None
        self._answered()
        out = bytes(resp.outcomes)
        return out if len(out) == len(keys) else bytes(len(keys))  # an old node: trust nothing

    def get(
        self, ns: Namespace, keys: Sequence[Key], rows: memoryview, slots: dict[int, int]
    ) -> FetchResult:
        """Fetch the node's longest present prefix of ``keys``; block ``j`` lands in row
        ``slots[j]`` of ``rows``. Stops at the first block failing verification."""
        asm = codec.BlockAssembler(ns, keys, rows, slots)
        corrupt = 0
        kw = self._kw(self._timeout_s)
        try:
            for msg in self._stub.Get(self._req(ns, keys), **kw):
                if msg.WhichOneof("part") != "chunk":
                    break
                try:
                    asm.add(msg.chunk)
                except (BlockError, InvalidArgument):  # a bad block or a malformed stream
                    corrupt = 1
                    break
        except grpc.RpcError as e:
            raise self._fail(e, kw) from None
        self._answered()
        sums = asm.prefix_checksums()
        return FetchResult(len(sums), corrupt, tuple(sums))

    def _unary(self, method: str, req: Any) -> Any:
        kw = self._kw(self._timeout_s)
        try:
            resp = getattr(self._stub, method)(req, **kw)
        except grpc.RpcError as e:
            raise self._fail(e, kw) from None
        self._answered()
        return resp

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        resp = self._unary("Contains", self._req(ns, keys))
        return min(int(resp.hit_blocks), len(keys))

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        self._unary("Touch", self._req(ns, keys))

    def delete(self, ns: Namespace) -> int:
        resp = self._unary("Delete", pb.NodeDeleteRequest(ns=codec.ns_to_proto(ns)))
        return int(resp.deleted_blocks)

    def stats(self) -> TierStats:
        return tier_stats_from_proto(self._unary("Stats", pb.StatsRequest()))

    def probe(self) -> bool | None:
        """Healthy = grpc health says SERVING *and* an authenticated call succeeds (the
        health service takes no token, so a node refusing ours would look healthy).
        None, no verdict, while a node that never answered did not answer this probe
        either: it may be starting (the calls wait for it; the first that waits its whole
        deadline in vain gives the waiting up, and probes count again from then on).
        Probes never wait for the channel: one prober serves every node."""
        try:
            resp = self._health.Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                timeout=self._probe_timeout_s,
                metadata=self._md,
            )
            self._answered()
            if resp.status != health_pb2.HealthCheckResponse.SERVING:
                return False
            self._stub.Stats(pb.StatsRequest(), timeout=self._probe_timeout_s, metadata=self._md)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            self.contact.saw(code)
            return None if self.contact.state == "waiting" else False
        return True

    def close(self) -> None:
        self._channel.close()
